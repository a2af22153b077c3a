//! A Redis Cluster as the node's one broker (`--redis-cluster`): one
//! [`super::Session`] link per master (each run by [`super::driver::run`]
//! at that master's address, with sharded pub/sub), and a [`Router`] in
//! front that sends each channel's commands to the master of its slot,
//! follows `MOVED`/`ASK`, moves subscriptions when slots move, and tells
//! the supervisor each shard's health. The router is sans-I/O (its links
//! are made by a function it is given); [`run`] is the task around it:
//! the supervisor's commands, the links' events, and the map read from
//! `CLUSTER SLOTS` at start, on a redirect and while a shard is down.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::cluster::{Addr, ShardState, SlotMap, slot};
use super::envelope;
use super::error::{PublishError, SessionError};
use super::session::{Command, Event};
use super::settings::{CONNECT_TIMEOUT, RedisSettings, Topology};

/// A publish is sent on at most this many times.
const MAX_HOPS: u8 = 5;
/// How often the map is read again while it is stale (a shard down, a
/// redirect seen), and how often anyway.
const REFRESH_STALE: Duration = Duration::from_millis(500);
const REFRESH_ANYWAY: Duration = Duration::from_secs(15);

/// A link to one master: where its commands go, and its health.
struct Shard {
    cmds: mpsc::UnboundedSender<Command>,
    state: ShardState,
}

/// Makes the link to a master and returns where its commands go.
pub(crate) type Spawn = Box<dyn FnMut(&Addr) -> mpsc::UnboundedSender<Command>>;

/// The cluster's routing, without sockets.
pub(crate) struct Router {
    prefix: String,
    map: SlotMap,
    shards: BTreeMap<Addr, Shard>,
    /// Channels with local subscribers, and the master each is subscribed on.
    placed: HashMap<String, Option<Addr>>,
    /// The map needs reading again.
    stale: bool,
    /// Subscriptions each master's link holds (the node's is their sum).
    subs: HashMap<Addr, i64>,
    /// Channels whose slot moved to another master and whose subscription
    /// there is not confirmed yet: this node's publishes to them are
    /// refused meanwhile, since its own subscribers would miss them.
    moving: HashSet<String>,
    spawn: Spawn,
    out: VecDeque<Event>,
}

impl Router {
    /// A router with no map yet.
    pub(crate) fn new(prefix: String, spawn: Spawn) -> Self {
        Self {
            prefix,
            map: SlotMap::default(),
            shards: BTreeMap::new(),
            placed: HashMap::new(),
            stale: true,
            subs: HashMap::new(),
            moving: HashSet::new(),
            spawn,
            out: VecDeque::new(),
        }
    }

    /// The next event for the supervisor.
    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.out.pop_front()
    }

    /// Whether the map should be read again now.
    pub(crate) fn stale(&self) -> bool {
        self.stale || self.shards.values().any(|s| !s.state.up)
    }

    /// The masters to ask for the map: those up first, those down last
    /// (a host that is gone can take the whole connect timeout to say so).
    pub(crate) fn known(&self) -> Vec<Addr> {
        let (up, down): (Vec<_>, Vec<_>) = self.shards.iter().partition(|(_, s)| s.state.up);
        up.into_iter().chain(down).map(|(a, _)| a.clone()).collect()
    }

    /// How many masters' links are up.
    pub(crate) fn up_count(&self) -> usize {
        self.shards.values().filter(|s| s.state.up).count()
    }

    /// The master of `channel`'s slot.
    fn owner(&self, channel: &str) -> Option<Addr> {
        let key = format!("{}{channel}", self.prefix);
        self.map.master(slot(key.as_bytes())).cloned()
    }

    /// The master of the retained store's slot.
    fn store(&self) -> Option<Addr> {
        let key = crate::retained::in_redis::slot_key(&self.prefix);
        self.map.master(slot(key.as_bytes())).cloned()
    }

    /// A new map: links to new masters, none to masters gone, and every
    /// subscription on the master of its slot.
    pub(crate) fn apply(&mut self, map: SlotMap, now: Instant) {
        self.stale = map.unserved() > 0;
        // Read again and again while a shard is down: with nothing changed
        // there is nothing to place (a walk of every local channel).
        if map == self.map {
            return self.place_missing();
        }
        for a in map.masters() {
            self.link(a, now);
        }
        let gone: Vec<Addr> = self
            .shards
            .keys()
            .filter(|a| !map.masters().contains(a))
            .cloned()
            .collect();
        self.map = map;
        for a in &gone {
            // Dropping its sender ends the link's task.
            self.shards.remove(a);
        }
        if !gone.is_empty() {
            self.report();
        }
        self.place_all();
    }

    /// Subscribes each channel on its slot's master when it is elsewhere.
    fn place_all(&mut self) {
        let channels: Vec<String> = self.placed.keys().cloned().collect();
        for c in channels {
            self.place(c);
        }
    }

    /// Places the channels that are subscribed nowhere (their slot moved
    /// away, or no master served it).
    fn place_missing(&mut self) {
        let channels: Vec<String> = self
            .placed
            .iter()
            .filter(|(_, at)| at.is_none())
            .map(|(c, _)| c.clone())
            .collect();
        for c in channels {
            self.place(c);
        }
    }

    /// Subscribes `c` on its slot's master when it is elsewhere (and
    /// unsubscribes it there); until the master confirms, it is moving.
    fn place(&mut self, c: String) {
        let want = self.owner(&c);
        let at = self.placed.get(&c).cloned().flatten();
        if want == at {
            return;
        }
        if let Some(old) = at.and_then(|a| self.shards.get(&a)) {
            let _ = old.cmds.send(Command::Unsubscribe(c.clone()));
        }
        if let Some(new) = want.as_ref().and_then(|a| self.shards.get(a)) {
            let _ = new.cmds.send(Command::Subscribe(c.clone()));
            self.moving.insert(c.clone());
        }
        self.placed.insert(c, want);
    }

    /// The link to master `a`, made when there is none.
    fn link(&mut self, a: &Addr, now: Instant) {
        if !self.shards.contains_key(a) {
            let cmds = (self.spawn)(a);
            let state = ShardState {
                addr: a.to_string(),
                up: false,
                reason: "connecting".into(),
                since: now,
            };
            self.shards.insert(a.clone(), Shard { cmds, state });
            self.report();
        }
    }

    /// Every shard's state, for the supervisor.
    fn report(&mut self) {
        let states = self.shards.values().map(|s| s.state.clone()).collect();
        self.out.push_back(Event::Shards(states));
    }

    /// The supervisor asks for something.
    pub(crate) fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Publish {
                ref channel, to, ..
            }
            | Command::Resend {
                ref channel, to, ..
            } if self.moving.contains(channel) => self.out.push_back(Event::Published {
                to,
                result: Err(PublishError::Moving),
            }),
            // Retained: stored on the store's master first, then published
            // on the channel's (a reader of the store then either finds it
            // or is subscribed in time to receive it live).
            Command::Publish {
                to,
                channel,
                payload,
                retain: Some(qos),
            } => {
                let then = Box::new(Command::Publish {
                    to,
                    channel: channel.clone(),
                    payload: payload.clone(),
                    retain: None,
                });
                let store = Command::Store {
                    to,
                    channel,
                    qos,
                    payload,
                    then,
                };
                let at = self.store();
                self.send(at.as_ref(), store);
            }
            Command::Retained { .. } | Command::Store { .. } => {
                let at = self.store();
                self.send(at.as_ref(), cmd);
            }
            // Said on the master of the control channel's slot, where
            // every node is subscribed to it (the broker's Subscribe at
            // start); lost while that shard is down, as on one Redis.
            Command::Claim { .. } => self.say(envelope::CLAIMS, cmd),
            Command::Announce(_) => self.say(envelope::SHARES, cmd),
            // Sessions in Redis are each node's on a cluster.
            Command::Session { nonce, .. } => self.out.push_back(Event::SessionReply {
                nonce,
                reply: Err("MQTT sessions are not kept on a Redis Cluster".into()),
            }),
            Command::Subscribe(c) => {
                let at = self.owner(&c);
                if let Some(s) = at.as_ref().and_then(|a| self.shards.get(a)) {
                    let _ = s.cmds.send(Command::Subscribe(c.clone()));
                }
                self.placed.insert(c, at);
            }
            Command::Unsubscribe(c) => {
                self.moving.remove(&c);
                if let Some(Some(a)) = self.placed.remove(&c)
                    && let Some(s) = self.shards.get(&a)
                {
                    let _ = s.cmds.send(Command::Unsubscribe(c));
                }
            }
            Command::Publish { ref channel, .. }
            | Command::Resend { ref channel, .. }
            | Command::Recover { ref channel, .. } => {
                let at = self.owner(channel);
                self.send(at.as_ref(), cmd);
            }
        }
    }

    /// Sends control message `cmd` to the master of `channel`'s slot, if up.
    fn say(&mut self, channel: &str, cmd: Command) {
        let at = self.owner(channel);
        if let Some(s) = at.and_then(|a| self.shards.get(&a))
            && s.state.up
        {
            let _ = s.cmds.send(cmd);
        }
    }

    /// Sends `cmd` to the link of `at`; a publish to a shard that is not
    /// up is answered at once (its own link would say "not connected").
    fn send(&mut self, at: Option<&Addr>, cmd: Command) {
        let shard = at.and_then(|a| self.shards.get(a));
        let why = match shard {
            Some(s) if s.state.up => {
                return s.cmds.send(cmd).unwrap_or_else(|_| {
                    log!("throng: a Redis Cluster link stopped");
                });
            }
            Some(s) => (s.state.addr.clone(), s.state.reason.clone()),
            None => (
                at.map_or_else(|| "(none)".to_owned(), ToString::to_string),
                "no master serves the channel's slot yet".to_owned(),
            ),
        };
        match cmd {
            Command::Publish { to, .. } | Command::Resend { to, .. } => {
                self.out.push_back(Event::Published {
                    to,
                    result: Err(PublishError::ShardDown {
                        shard: why.0,
                        why: why.1,
                    }),
                });
            }
            Command::Store { to, .. } => self.out.push_back(Event::Published {
                to,
                result: Err(PublishError::ShardDown {
                    shard: why.0,
                    why: format!("the retained store's master: {}", why.1),
                }),
            }),
            Command::Recover { to, .. } => self.out.push_back(Event::Recovered {
                to,
                complete: false,
                messages: Vec::new(),
            }),
            Command::Retained { to, .. } => self.out.push_back(Event::Retained {
                to,
                messages: Vec::new(),
                cut: 0,
            }),
            _ => {}
        }
    }

    /// News from the link to master `from`.
    pub(crate) fn on_shard_event(&mut self, from: &Addr, ev: Event, now: Instant) {
        match ev {
            Event::Up => self.health(from, None, now),
            Event::Down { reason, .. } => self.health(from, Some(reason.to_string()), now),
            Event::Redirected {
                to,
                channel,
                payload,
                hops,
                redirect,
            } => {
                if hops + 1 >= MAX_HOPS {
                    return self.out.push_back(Event::Published {
                        to,
                        result: Err(PublishError::Redirects(hops + 1)),
                    });
                }
                // ASK: the slot is migrating and its keys (the channel's
                // stream) are partly on the target, while every node's
                // subscription is still on the source until the slot
                // moves. Published on the target it would reach nobody:
                // refused, the publisher tries again.
                if redirect.ask {
                    return self.out.push_back(Event::Published {
                        to,
                        result: Err(PublishError::Moving),
                    });
                }
                self.map.moved(redirect.slot, redirect.to.clone());
                self.stale = true;
                self.link(&redirect.to, now);
                // This node's subscription is still where the slot was:
                // moved with the next map, until then refused (its own
                // subscribers would miss it).
                if let Some(at) = self.placed.get(&channel)
                    && at.as_ref() != Some(&redirect.to)
                {
                    // The map says the new master now: subscribe there.
                    self.place(channel.clone());
                    self.moving.insert(channel);
                    return self.out.push_back(Event::Published {
                        to,
                        result: Err(PublishError::Moving),
                    });
                }
                let cmd = Command::Resend {
                    to,
                    channel,
                    payload,
                    hops: hops + 1,
                };
                self.send(Some(&redirect.to), cmd);
            }
            Event::Subscriptions(n) => {
                self.subs.insert(from.clone(), n);
                let shards = &self.shards;
                self.subs.retain(|a, _| shards.contains_key(a));
                let total = self.subs.values().sum();
                self.out.push_back(Event::Subscriptions(total));
            }
            Event::Lost(c) => {
                // Its slot moved: subscribe where the next map says.
                if let Some(at) = self.placed.get_mut(&c) {
                    *at = None;
                    self.moving.insert(c);
                }
                self.stale = true;
            }
            Event::Placed(c) => {
                self.moving.remove(&c);
            }
            Event::Stored(then) => self.on_command(*then),
            Event::Published {
                to,
                result: Err(PublishError::NotConnected),
            } => {
                let why = self.shards.get(from).map(|s| s.state.reason.clone());
                self.out.push_back(Event::Published {
                    to,
                    result: Err(PublishError::ShardDown {
                        shard: from.to_string(),
                        why: why.unwrap_or_default(),
                    }),
                });
            }
            other => self.out.push_back(other),
        }
    }

    /// Shard `from` came up (`None`) or went down (the reason).
    fn health(&mut self, from: &Addr, down: Option<String>, now: Instant) {
        let Some(s) = self.shards.get_mut(from) else {
            return;
        };
        let up = down.is_none();
        if s.state.up != up {
            s.state.since = now;
        }
        s.state.up = up;
        s.state.reason = down.unwrap_or_default();
        if !up {
            // Its replica may take over: the map says when.
            self.stale = true;
        }
        self.report();
        // Channels that found no master before may have one now.
        if up {
            self.place_all();
        }
    }
}

/// Runs the cluster link until the supervisor drops its command sender.
pub(crate) async fn run(
    settings: RedisSettings,
    max_message: usize,
    mut cmds: mpsc::UnboundedReceiver<Command>,
    mut emit: impl FnMut(Event) + Clone + 'static,
) {
    let Topology::Cluster(seeds) = settings.topology.clone() else {
        return;
    };
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<(Addr, Event)>();
    let base = settings.clone();
    let direct = emit.clone();
    let spawn: Spawn = Box::new(move |a: &Addr| {
        let (tx, rx) = mpsc::unbounded_channel();
        let (events, from, mut direct) = (ev_tx.clone(), a.clone(), direct.clone());
        let link = super::driver::run(base.at(a), max_message, rx, move |ev| {
            // Messages and confirmed publishes are the bulk and the router
            // has nothing to add to them: straight to the supervisor.
            if bypasses(&ev) {
                direct(ev);
            } else {
                let _ = events.send((from.clone(), ev));
            }
        });
        tokio::task::spawn_local(link);
        tx
    });
    let mut router = Router::new(settings.prefix.clone(), spawn);
    let mut tick = tokio::time::interval(REFRESH_STALE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_read: Option<Instant> = None;
    let mut failures = 0u32;
    loop {
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                None => return,
                Some(cmd) => router.on_command(cmd),
            },
            Some((from, ev)) = ev_rx.recv() => router.on_shard_event(&from, ev, Instant::now()),
            _ = tick.tick() => {
                let due = last_read.is_none_or(|t| t.elapsed() > REFRESH_ANYWAY);
                if router.stale() || due {
                    let mut ask = router.known();
                    // Seeds after the masters that are up, before those down.
                    let up = router.up_count();
                    for (i, a) in seeds.iter().enumerate() {
                        ask.insert(up + i, a.clone());
                    }
                    match read_map(&settings, &ask).await {
                        Ok(map) => {
                            failures = 0;
                            last_read = Some(Instant::now());
                            router.apply(map, Instant::now());
                        }
                        Err(reason) => {
                            failures += 1;
                            if last_read.is_none() && failures.is_power_of_two() {
                                emit(Event::Down { reason, retry_in: REFRESH_STALE });
                            }
                        }
                    }
                }
            }
        }
        while let Some(ev) = router.poll_event() {
            emit(ev);
        }
    }
}

/// Whether a link's event goes to the supervisor without the router:
/// nothing about shards, redirects or placement, and no failure the
/// router names the shard in.
fn bypasses(ev: &Event) -> bool {
    matches!(
        ev,
        Event::Message { .. }
            | Event::Dropped(_)
            | Event::Recovered { .. }
            | Event::Published { result: Ok(_), .. }
    )
}

/// Reads the slot map from the first of `ask` that answers `CLUSTER SLOTS`.
async fn read_map(settings: &RedisSettings, ask: &[Addr]) -> Result<SlotMap, SessionError> {
    let mut why = Vec::new();
    for a in ask {
        match slots_of(&settings.at(a), &a.host).await {
            Ok(map) => return Ok(map),
            Err(e) => why.push(format!("{a}: {e}")),
        }
    }
    Err(SessionError::NoMap(format!(
        "no Redis Cluster node gave its slot map ({})",
        why.join("; ")
    )))
}

/// One node's `CLUSTER SLOTS`, read into a map.
async fn slots_of(s: &RedisSettings, host: &str) -> Result<SlotMap, String> {
    let args: [&[u8]; 2] = [b"CLUSTER", b"SLOTS"];
    let v = super::oneshot::ask(&s.url, s.tls.as_ref(), &args, CONNECT_TIMEOUT).await?;
    SlotMap::from_slots(&v, host).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    //! The router alone: links are channels the test reads.

    use std::cell::RefCell;
    use std::rc::Rc;

    use bytes::Bytes;

    use super::*;
    use crate::redis::cluster::Redirect;
    use crate::relay::{Publisher, WorkerId};

    type Links = Rc<RefCell<Vec<(Addr, mpsc::UnboundedReceiver<Command>)>>>;

    fn router() -> (Router, Links) {
        let links: Links = Rc::default();
        let l = links.clone();
        let spawn: Spawn = Box::new(move |a: &Addr| {
            let (tx, rx) = mpsc::unbounded_channel();
            l.borrow_mut().push((a.clone(), rx));
            tx
        });
        (Router::new("t:".into(), spawn), links)
    }

    fn addr(port: u16) -> Addr {
        Addr {
            host: "127.0.0.1".into(),
            port,
        }
    }

    /// Three masters: 7000 has slots 0..=5460, 7001 up to 10922, 7002 the rest.
    fn three() -> SlotMap {
        SlotMap::from_spans(vec![
            (0, 5460, addr(7000)),
            (5461, 10922, addr(7001)),
            (10923, 16383, addr(7002)),
        ])
        .unwrap()
    }

    /// What each link was sent, as text, by port.
    fn sent(links: &Links) -> Vec<(u16, String)> {
        let mut out = Vec::new();
        for (a, rx) in links.borrow_mut().iter_mut() {
            while let Ok(c) = rx.try_recv() {
                let what = match c {
                    Command::Subscribe(c) => format!("+{c}"),
                    Command::Unsubscribe(c) => format!("-{c}"),
                    Command::Publish { channel, .. } => format!("publish {channel}"),
                    Command::Resend { channel, .. } => format!("resend {channel}"),
                    Command::Store { channel, .. } => format!("store {channel}"),
                    Command::Retained { .. } => "retained".into(),
                    Command::Claim { .. } => "claim".into(),
                    Command::Announce(_) => "announce".into(),
                    other => format!("{other:?}"),
                };
                out.push((a.port, what));
            }
        }
        out
    }

    fn publish(channel: &str) -> Command {
        Command::Publish {
            to: who(),
            channel: channel.into(),
            payload: Bytes::from_static(b"x"),
            retain: None,
        }
    }

    fn who() -> Publisher {
        Publisher {
            worker: WorkerId {
                slot: 0,
                generation: 1,
            },
            request: 1,
        }
    }

    /// The next event is a publish refused as moving.
    fn refused_moving(r: &mut Router) {
        let ev = r.poll_event();
        assert!(
            matches!(
                ev,
                Some(Event::Published {
                    result: Err(PublishError::Moving),
                    ..
                })
            ),
            "{ev:?}"
        );
    }

    fn all_up(r: &mut Router, now: Instant) {
        for p in [7000, 7001, 7002] {
            r.on_shard_event(&addr(p), Event::Up, now);
        }
        while r.poll_event().is_some() {}
    }

    #[test]
    fn each_channel_goes_to_the_master_of_its_slot() {
        let (mut r, links) = router();
        let now = Instant::now();
        r.apply(three(), now);
        all_up(&mut r, now);
        // slot("t:c") = 12883 (7002), slot("t:d") = 692 (7000).
        assert_eq!(slot(b"t:c"), 12883);
        assert_eq!(slot(b"t:d"), 692);
        r.on_command(Command::Subscribe("c".into()));
        r.on_command(publish("c"));
        r.on_command(publish("d"));
        assert_eq!(
            sent(&links),
            [
                (7000, "publish d".into()),
                (7002, "+c".into()),
                (7002, "publish c".into())
            ]
        );
        // A retained publish: the store's master (slot 11938 of
        // "{t:#retained}": 7002) first, then the channel's.
        r.on_command(Command::Publish {
            to: who(),
            channel: "d".into(),
            payload: Bytes::from_static(b"r"),
            retain: Some(1),
        });
        assert_eq!(sent(&links), [(7002, "store d".into())]);
        let then = Box::new(publish("d"));
        r.on_shard_event(&addr(7002), Event::Stored(then), now);
        assert_eq!(sent(&links), [(7000, "publish d".into())]);
        // Reads of the store go to its master too.
        r.on_command(Command::Retained {
            to: who(),
            filters: vec!["#".into()],
        });
        assert_eq!(sent(&links), [(7002, "retained".into())]);
    }

    #[test]
    fn claims_and_announcements_go_to_the_master_their_channel_is_subscribed_on() {
        let (mut r, links) = router();
        let now = Instant::now();
        // The broker subscribes to the control channels before any map.
        r.on_command(Command::Subscribe("#claims".into()));
        r.on_command(Command::Subscribe("#shares".into()));
        r.apply(three(), now);
        all_up(&mut r, now);
        let port = |key: &[u8]| match slot(key) {
            0..=5460 => 7000,
            5461..=10922 => 7001,
            _ => 7002,
        };
        let (c, s) = (port(b"t:#claims"), port(b"t:#shares"));
        let mut placed = sent(&links);
        placed.sort();
        let mut want = vec![(c, "+#claims".to_owned()), (s, "+#shares".to_owned())];
        want.sort();
        assert_eq!(placed, want);
        r.on_command(Command::Claim {
            node: 1,
            hash: 2,
            unix_ns: 3,
        });
        r.on_command(Command::Announce(Bytes::from_static(b"x")));
        let mut said = sent(&links);
        said.sort();
        let mut want = vec![(c, "claim".to_owned()), (s, "announce".to_owned())];
        want.sort();
        assert_eq!(said, want);
        // Its shard down: said nowhere (the node tells no one, as with one
        // Redis down), and nothing is answered.
        let down = Event::Down {
            reason: SessionError::Closed(crate::redis::Conn::Publisher),
            retry_in: Duration::from_millis(100),
        };
        r.on_shard_event(&addr(c), down, now);
        while r.poll_event().is_some() {}
        r.on_command(Command::Claim {
            node: 1,
            hash: 2,
            unix_ns: 3,
        });
        assert_eq!(sent(&links), []);
        assert!(r.poll_event().is_none());
    }

    #[test]
    fn a_down_shard_refuses_its_channels_and_the_others_publish() {
        let (mut r, links) = router();
        let now = Instant::now();
        r.apply(three(), now);
        all_up(&mut r, now);
        let down = Event::Down {
            reason: SessionError::Closed(crate::redis::Conn::Publisher),
            retry_in: Duration::from_millis(100),
        };
        r.on_shard_event(&addr(7002), down, now);
        let Some(Event::Shards(states)) = r.poll_event() else {
            panic!("the shards' states");
        };
        assert_eq!(states.iter().filter(|s| s.up).count(), 2);
        assert!(r.stale(), "a shard down: read the map again");
        r.on_command(publish("c"));
        let ev = r.poll_event();
        let Some(Event::Published {
            result: Err(e @ PublishError::ShardDown { .. }),
            ..
        }) = ev
        else {
            panic!("{ev:?}");
        };
        assert!(e.to_string().contains("127.0.0.1:7002"), "{e}");
        r.on_command(publish("d"));
        assert_eq!(sent(&links), [(7000, "publish d".into())]);
        // The replica of 7002 took over at 7005: the subscriptions follow.
        r.on_command(Command::Subscribe("c".into()));
        let promoted = SlotMap::from_spans(vec![
            (0, 5460, addr(7000)),
            (5461, 10922, addr(7001)),
            (10923, 16383, addr(7005)),
        ])
        .unwrap();
        r.apply(promoted, now);
        // The down link keeps it for its reconnect until it is dropped;
        // the new master gets it.
        assert_eq!(sent(&links), [(7002, "+c".into()), (7005, "+c".into())]);
        r.on_shard_event(&addr(7005), Event::Up, now);
        while r.poll_event().is_some() {}
        // Until 7005 confirms the subscription, this node's own
        // subscribers would miss a publish: refused, not lost.
        r.on_command(publish("c"));
        refused_moving(&mut r);
        r.on_shard_event(&addr(7005), Event::Placed("c".into()), now);
        r.on_command(publish("c"));
        assert_eq!(sent(&links), [(7005, "publish c".into())]);
    }

    #[test]
    fn a_redirect_sends_the_publish_on_and_moved_updates_the_map() {
        let (mut r, links) = router();
        let now = Instant::now();
        r.apply(three(), now);
        all_up(&mut r, now);
        let moved = |ask, port| Event::Redirected {
            to: who(),
            channel: "c".into(),
            payload: Bytes::from_static(b"x"),
            hops: 0,
            redirect: Redirect {
                ask,
                slot: 12883,
                to: addr(port),
            },
        };
        // ASK: the slot is migrating; the subscriptions are still on the
        // source, so publishing on the target would reach nobody: refused.
        r.on_shard_event(&addr(7002), moved(true, 7001), now);
        refused_moving(&mut r);
        assert_eq!(sent(&links), []);
        r.on_command(publish("c"));
        assert_eq!(sent(&links), [(7002, "publish c".into())]);
        r.on_shard_event(&addr(7002), moved(false, 7001), now);
        r.on_command(publish("c"));
        assert_eq!(
            sent(&links),
            [(7001, "resend c".into()), (7001, "publish c".into())]
        );
        // A redirect loop ends with a failure.
        let mut looped = moved(false, 7001);
        if let Event::Redirected { hops, .. } = &mut looped {
            *hops = MAX_HOPS;
        }
        r.on_shard_event(&addr(7001), looped, now);
        let ev = r.poll_event();
        assert!(
            matches!(
                ev,
                Some(Event::Published {
                    result: Err(PublishError::Redirects(_)),
                    ..
                })
            ),
            "{ev:?}"
        );
    }

    #[test]
    fn a_moved_subscribed_channel_follows_its_slot_and_publishes_wait_for_the_new_master() {
        let (mut r, links) = router();
        let now = Instant::now();
        r.apply(three(), now);
        all_up(&mut r, now);
        r.on_command(Command::Subscribe("c".into()));
        assert_eq!(sent(&links), [(7002, "+c".into())]);
        let moved = Event::Redirected {
            to: who(),
            channel: "c".into(),
            payload: Bytes::from_static(b"x"),
            hops: 0,
            redirect: Redirect {
                ask: false,
                slot: 12883,
                to: addr(7001),
            },
        };
        r.on_shard_event(&addr(7002), moved, now);
        // Refused (this node's subscribers would miss it), and the
        // subscription moves at once, without waiting for a new map.
        refused_moving(&mut r);
        assert_eq!(sent(&links), [(7001, "+c".into()), (7002, "-c".into())]);
        // A map read that says the same changes nothing.
        let mut patched = three();
        patched.moved(12883, addr(7001));
        r.apply(patched, now);
        assert_eq!(sent(&links), []);
        r.on_command(publish("c"));
        refused_moving(&mut r);
        r.on_shard_event(&addr(7001), Event::Placed("c".into()), now);
        r.on_command(publish("c"));
        assert_eq!(sent(&links), [(7001, "publish c".into())]);
    }
}
