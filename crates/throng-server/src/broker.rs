//! The broker seam: where the supervisor sends a published message and
//! where messages to relay come from.
//!
//! Two brokers behind one [`Broker`]: the supervisor's local relay (a
//! message published on this machine is relayed to this machine's workers
//! at once), and Redis ([`Remote`], with the connections in
//! [`crate::redis`]): `publish` sends the message out, and what Redis
//! delivers back arrives as [`News::Relay`], so every node, this one
//! included, delivers it once.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::control::{MAX_RECORD, Message, RETAINED_FRAMING, Record};
use crate::history::MessageId;
use crate::metrics::BrokerStats;
use crate::redis::cluster::ShardState;
use crate::redis::{self, Command, PublishError, RedisMode, RedisSettings, envelope};
use crate::relay::Publisher;
use crate::retained::{self, RetainedMessage};

/// Why a publish cannot go to Redis now (the text of the publisher's 503).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// The link is down.
    #[error("Redis at {url} is unreachable (for {secs:.1}s: {reason}); reconnecting")]
    Unreachable {
        /// Where Redis is (password hidden).
        url: String,
        /// How long it has been down.
        secs: f64,
        /// Why.
        reason: String,
    },
    /// The Redis task is gone (the server is stopping).
    #[error("the Redis broker task has stopped")]
    Stopped,
    /// A `serve --takeover` took this serve's embedded history: the new
    /// serve numbers every message from now on.
    #[error("this serve was taken over (serve --takeover): publish again, the new serve answers")]
    TakenOver,
}

/// Keeps the retained messages that fit in one control record.
pub(crate) fn fit_retained(messages: &mut Vec<RetainedMessage>) {
    let mut size = 64;
    let keep = messages
        .iter()
        .take_while(|r| {
            size += RETAINED_FRAMING + r.channel.len() + r.kept.payload.len() + r.properties.len();
            size <= MAX_RECORD
        })
        .count();
    messages.truncate(keep);
}

/// What the supervisor does with a message one of its workers published.
#[derive(Debug)]
pub(crate) enum Routed {
    /// Relay it to every worker now (the local broker).
    Relay(Message),
    /// Redis has it; the publisher's answer comes as [`News::Answer`].
    Sent,
    /// It cannot be published now; the reason, for the publisher's 503.
    Refused(Refusal),
}

/// What the supervisor does after news from the broker.
#[derive(Debug)]
pub(crate) enum News {
    /// Nothing beyond what the broker did itself (count, log).
    Nothing,
    /// A message for this node's subscribers: relay it to every worker,
    /// holding the permit until all delivered. The `u64`: its hash, the
    /// same on every node ([`crate::shares::cluster`] picks a shared
    /// subscription's member by it), while the node has any.
    Relay(Message, OwnedSemaphorePermit, Option<u64>),
    /// A node (maybe this one) said its shared subscriptions' members.
    Announced(Bytes),
    /// Another node has an MQTT client of this client id (its hash)
    /// since a Unix nanosecond: a connection of this node with it made
    /// before then is taken over.
    Claimed(u64, u64),
    /// Redis answered a publish: the record for the worker that asked.
    Answer(Publisher, Bytes),
    /// The broker's state changed: the record every worker gets (for `/healthz`).
    State(Bytes),
    /// A park or take mark of the MQTT sessions in Redis (`p`/`t`, nonce),
    /// in its place among the relayed messages.
    SessionMark(u8, u64),
    /// The reply to a script of the MQTT sessions in Redis, by nonce.
    SessionReply(u64, Result<throng_proto::resp::Value, String>),
}

/// The node's broker: the embedded relay, or Redis shared by many nodes.
pub(crate) enum Broker {
    /// Nothing to install, one machine.
    Local,
    /// Redis pub/sub (`--redis`).
    Redis(Box<Remote>),
}

impl Broker {
    /// A short name for the startup banner, for the local relay.
    pub(crate) const LOCAL: &'static str = "local (embedded relay, one machine)";

    /// Routes a message published through worker `from` (also its
    /// channel's retained message when `retain` holds its QoS).
    pub(crate) fn publish(&mut self, from: Publisher, m: Message, retain: Option<u8>) -> Routed {
        match self {
            Self::Local => Routed::Relay(m),
            Self::Redis(r) => match r.publish(from, m, retain) {
                Ok(()) => Routed::Sent,
                Err(reason) => Routed::Refused(reason),
            },
        }
    }

    /// An MQTT client with this client id (its hash) connected here at
    /// Unix nanosecond `unix_ns`: the other nodes are told (through Redis,
    /// in every mode).
    pub(crate) fn claim(&mut self, hash: u64, unix_ns: u64) {
        if let Self::Redis(r) = self {
            let node = r.node;
            let _ = r.cmds.send(Command::Claim {
                node,
                hash,
                unix_ns,
            });
        }
    }

    /// This node's tag among the nodes of a Redis (none without one).
    pub(crate) fn node(&self) -> Option<u64> {
        match self {
            Self::Local => None,
            Self::Redis(r) => Some(r.node),
        }
    }

    /// Says this node's shared subscriptions' members to the other nodes
    /// ([`crate::shares::cluster::announcement`]). Sent even while the
    /// link is not all up: on a cluster another shard may be down, and the
    /// link drops it when its own connection is.
    pub(crate) fn announce(&mut self, payload: Bytes) {
        if let Self::Redis(r) = self {
            let _ = r.cmds.send(Command::Announce(payload));
        }
    }

    /// Whether the node has shared subscriptions now: each message from
    /// Redis is hashed only then ([`News::Relay`]).
    pub(crate) fn sharing(&mut self, on: bool) {
        if let Self::Redis(r) = self {
            r.sharing = on;
        }
    }

    /// The prefix and per-session queue limit of MQTT sessions kept in
    /// Redis; `None` when they are the node's (no Redis, channels mode, a
    /// cluster).
    pub(crate) fn sessions_in_redis(&self) -> Option<(&str, usize)> {
        match self {
            Self::Redis(r) if r.settings.session_queue > 0 => {
                Some((&r.settings.prefix, r.settings.session_queue))
            }
            _ => None,
        }
    }

    /// Sends a script of the MQTT sessions in Redis; its reply comes as
    /// [`News::SessionReply`] with `nonce`.
    pub(crate) fn session_command(&mut self, nonce: u64, bytes: Bytes) {
        if let Self::Redis(r) = self {
            let _ = r.cmds.send(Command::Session { nonce, bytes });
        }
    }

    /// `m` as this node publishes it to Redis (sealed unless bare says all).
    pub(crate) fn sealed(&self, m: &Message) -> Bytes {
        match self {
            Self::Redis(r) => r.seal(m),
            Self::Local => m.payload.clone(),
        }
    }

    /// A message queued in Redis for an MQTT session
    /// ([`redis::mqtt_sessions::entry`]): it, the QoS it goes at and the
    /// packet id it was sent with; `None` when it does not read or its
    /// Message Expiry Interval ran out (counted as dropped).
    pub(crate) fn unqueue(&mut self, entry: &Bytes) -> Option<(Message, u8, u16)> {
        let Self::Redis(r) = self else {
            return None;
        };
        let (qos, id, channel, raw) = redis::mqtt_sessions::open_entry(entry)?;
        let (meta, payload) = envelope::open(raw).ok()?;
        let m = r.relayed(channel, MessageId::NONE, payload, meta)?;
        Some((
            Message {
                at_most_once: false,
                exactly_once: qos == 2,
                ..m
            },
            qos,
            id,
        ))
    }

    /// Worker slot `i` gained (`on`) or lost its subscribers of `channel`.
    pub(crate) fn interest(&mut self, i: usize, channel: String, on: bool) {
        if let Self::Redis(r) = self {
            r.interest(i, channel, on);
        }
    }

    /// Whether the history is the broker's (Redis Streams), not this node's.
    pub(crate) fn keeps_history(&self) -> bool {
        matches!(self, Self::Redis(r) if r.settings.history.is_some())
    }

    /// Whether the retained messages are the broker's (Redis), not this node's.
    pub(crate) fn keeps_retained(&self) -> bool {
        matches!(self, Self::Redis(_))
    }

    /// Asks the broker's store for the retained messages `filters` match
    /// (only when [`Broker::keeps_retained`]); the answer comes as news.
    pub(crate) fn retained(&mut self, to: Publisher, filters: Vec<String>) {
        if let Self::Redis(r) = self {
            r.retained(to, filters);
        }
    }

    /// The broker's retained store as this node last saw it (Redis only).
    pub(crate) fn retained_stats(&self) -> Option<retained::Stats> {
        match self {
            Self::Redis(r) => Some(r.retained),
            Self::Local => None,
        }
    }

    /// Recoveries the broker's history answered: complete, incomplete.
    pub(crate) fn recoveries(&self) -> (u64, u64) {
        match self {
            Self::Redis(r) => r.recovered,
            Self::Local => (0, 0),
        }
    }

    /// Asks the broker's history for what `channel` kept after `since`
    /// (only when [`Broker::keeps_history`]); the answer comes as news.
    pub(crate) fn recover(&mut self, to: Publisher, channel: String, since: MessageId) {
        if let Self::Redis(r) = self {
            r.recover(to, channel, since);
        }
    }

    /// Worker slot `i` is gone, with its subscribers.
    pub(crate) fn worker_gone(&mut self, i: usize) {
        if let Self::Redis(r) = self {
            r.worker_gone(i);
        }
    }

    /// What a (re)started worker is told first about the broker, if anything.
    pub(crate) fn state_record(&self) -> Option<Bytes> {
        match self {
            Self::Local => None,
            Self::Redis(r) => Some(r.state_record()),
        }
    }

    /// The broker's counters for `/metrics` (none for the local relay).
    pub(crate) fn stats(&self) -> Option<BrokerStats> {
        match self {
            Self::Local => None,
            Self::Redis(r) => Some(r.stats()),
        }
    }

    /// Takes news from the Redis link (the local relay has none).
    pub(crate) fn on_event(&mut self, ev: redis::Event) -> News {
        match self {
            Self::Local => News::Nothing,
            Self::Redis(r) => r.on_event(ev),
        }
    }
}

/// The supervisor's side of the Redis broker: link state, publishes waiting
/// for Redis's answer, and which channels have subscribers on this node.
pub(crate) struct Remote {
    settings: RedisSettings,
    cmds: mpsc::UnboundedSender<Command>,
    /// Both connections work and the subscriptions are confirmed.
    up: bool,
    /// Has been up at least once (the first connection is not a reconnect).
    ever_up: bool,
    /// When the link went down (or the node started, before the first connection).
    down_since: Instant,
    /// Why it is down.
    reason: String,
    /// Recoveries Redis answered: complete, incomplete.
    recovered: (u64, u64),
    /// The shared retained store's figures, as this node last saw them.
    retained: retained::Stats,
    /// Channels mode: per worker slot, the channels it has subscribers of.
    interest: Vec<HashSet<String>>,
    /// Channels mode: per channel, how many workers have subscribers of it.
    nodes: HashMap<String, u32>,
    stats: BrokerStats,
    /// A cluster's shards as last reported (empty otherwise).
    shards: Vec<ShardState>,
    /// This node's tag in the MQTT publishes it seals ([`envelope`]).
    node: u64,
    /// The node has shared subscriptions ([`Broker::sharing`]).
    sharing: bool,
}

impl Remote {
    pub(crate) fn new(
        settings: RedisSettings,
        cmds: mpsc::UnboundedSender<Command>,
        workers: usize,
    ) -> Self {
        // Heard by every node, whatever its subscribers: the pattern takes
        // them in; else each is a subscription of its own, kept for good.
        if settings.mode == RedisMode::Channels {
            for c in envelope::CONTROL {
                let _ = cmds.send(Command::Subscribe(c.to_owned()));
            }
        }
        Self {
            settings,
            cmds,
            up: false,
            ever_up: false,
            down_since: Instant::now(),
            reason: "connecting".into(),
            recovered: (0, 0),
            retained: retained::Stats::default(),
            // Two more than the workers: the channels of MQTT sessions
            // parked in the supervisor (`Supervisor`'s sessions slot), and
            // the filters of the node's shared subscriptions (the next).
            interest: vec![HashSet::new(); workers + 2],
            nodes: HashMap::new(),
            stats: BrokerStats::default(),
            shards: Vec::new(),
            node: envelope::node_tag(),
            sharing: false,
        }
    }

    /// Sends a publish to Redis; `Err` (the reason, for a 503) when the
    /// link is down. Its answer names `origin` ([`redis::Event::Published`]).
    fn publish(
        &mut self,
        origin: Publisher,
        m: Message,
        retain: Option<u8>,
    ) -> Result<(), Refusal> {
        // On a cluster each shard answers for its own channels: one down
        // does not stop the others.
        if !self.up && (!self.settings.sharded() || self.shards.iter().all(|s| !s.up)) {
            self.stats.publish_failures += 1;
            return Err(self.unavailable());
        }
        // An empty retained payload clears the channel's retained
        // message in Redis: it goes bare, as the clear it is.
        let payload = if retain.is_some() && m.payload.is_empty() {
            m.payload.clone()
        } else {
            self.seal(&m)
        };
        let sent = self.cmds.send(Command::Publish {
            to: origin,
            channel: m.channel,
            payload,
            retain,
        });
        sent.map_err(|_| Refusal::Stopped)
    }

    /// What goes to Redis for `m`: bare when a plain publish says all.
    fn seal(&self, m: &Message) -> Bytes {
        let qos = if m.at_most_once {
            0
        } else if m.exactly_once {
            2
        } else {
            1
        };
        let meta = envelope::Meta {
            qos,
            retained: m.retained,
            text: m.text,
            node: self.node,
            origin: m.origin,
            sent_ms: envelope::unix_ms(),
            properties: m.properties.clone(),
        };
        envelope::seal(&meta, &m.payload)
    }

    /// Asks Redis what `channel`'s stream kept after `since`, for rejoin
    /// request `to.request` of worker `to.worker`.
    fn recover(&mut self, to: Publisher, channel: String, since: MessageId) {
        let _ = self.cmds.send(Command::Recover { to, channel, since });
    }

    /// Asks Redis for the retained messages `filters` match, for request
    /// `to.request` of worker `to.worker`.
    fn retained(&mut self, to: Publisher, filters: Vec<String>) {
        let _ = self.cmds.send(Command::Retained { to, filters });
    }

    /// Redis answered a publish of `origin`: the record to answer with.
    fn published(
        &mut self,
        origin: Publisher,
        result: Result<(u64, MessageId), PublishError>,
    ) -> Bytes {
        let id = origin.request;
        let rec = match result {
            // The stream's id with history; without, none: each node
            // numbers the message when it comes back to be relayed.
            Ok((subscribers, message)) => Record::Published {
                id,
                subscribers,
                message,
            },
            Err(reason) => {
                self.stats.publish_failures += 1;
                Record::PublishFailed {
                    id,
                    reason: Bytes::from(reason.to_string()),
                }
            }
        };
        rec.encode()
    }

    fn unavailable(&self) -> Refusal {
        Refusal::Unreachable {
            url: self.settings.url.to_string(),
            secs: self.down_since.elapsed().as_secs_f64(),
            reason: self.reason.clone(),
        }
    }

    /// The link works (again). Returns the outage it ends, if it was a reconnect.
    fn on_up(&mut self) -> Option<Duration> {
        let outage = self.down_since.elapsed();
        self.up = true;
        let reconnect = self.ever_up;
        self.ever_up = true;
        if reconnect {
            self.stats.reconnects += 1;
            self.stats.past_outage_seconds += outage.as_secs_f64();
            Some(outage)
        } else {
            None
        }
    }

    /// The link failed; returns whether it was up until now.
    fn on_down(&mut self, reason: String) -> bool {
        self.stats.connect_failures += 1;
        let was_up = self.up;
        if was_up {
            self.down_since = Instant::now();
        }
        self.up = false;
        self.reason = reason;
        // The subscriptions went with the connection; they are made again
        // (and counted) when it is back.
        self.stats.subscriptions = 0;
        was_up
    }

    /// The state record every worker gets (for `/healthz`).
    fn state_record(&self) -> Bytes {
        let text = if self.up {
            format!(
                "up ({}, mode {})",
                self.settings.place(),
                self.settings.mode
            )
        } else {
            format!("{}: {}; reconnecting", self.settings.place(), self.reason)
        };
        Record::Broker {
            up: self.up,
            down_ms: if self.up {
                0
            } else {
                u64::try_from(self.down_since.elapsed().as_millis()).unwrap_or(u64::MAX)
            },
            text: Bytes::from(text),
        }
        .encode()
    }

    /// Counters for `/metrics`, with the current outage brought up to date.
    fn stats(&self) -> BrokerStats {
        let current = if self.up {
            0.0
        } else {
            self.down_since.elapsed().as_secs_f64()
        };
        BrokerStats {
            up: self.up,
            outage_seconds: current,
            shards: self
                .shards
                .iter()
                .map(|s| (s.addr.clone(), s.up, s.since.elapsed().as_secs_f64()))
                .collect(),
            ..self.stats.clone()
        }
    }

    /// Worker `i` gained (`on`) or lost its subscribers of `channel`.
    fn interest(&mut self, i: usize, channel: String, on: bool) {
        if self.settings.mode != RedisMode::Channels || i >= self.interest.len() {
            return;
        }
        if on {
            if self.interest[i].insert(channel.clone()) {
                let n = self.nodes.entry(channel.clone()).or_default();
                *n += 1;
                if *n == 1 {
                    let _ = self.cmds.send(Command::Subscribe(channel));
                }
            }
        } else if self.interest[i].remove(&channel) {
            self.drop_interest(channel);
        }
    }

    /// Worker `i` is gone: its channels have no subscribers there any more.
    fn worker_gone(&mut self, i: usize) {
        if let Some(set) = self.interest.get_mut(i) {
            for channel in std::mem::take(set) {
                self.drop_interest(channel);
            }
        }
    }

    /// A message from Redis as the relay takes it: a plain publish is
    /// QoS 1 to those who asked, with no properties; a sealed one is as
    /// its publisher sent it (its publishing connection only if it is
    /// this node's), its message expiry less the seconds since it was
    /// sealed. `None`: it expired on the way (counted as dropped).
    fn relayed(
        &mut self,
        channel: String,
        id: MessageId,
        payload: Bytes,
        meta: Option<envelope::Meta>,
    ) -> Option<Message> {
        let Some(meta) = meta else {
            return Some(Message {
                id: 0,
                message: id,
                text: std::str::from_utf8(&payload).is_ok(),
                at_most_once: false,
                exactly_once: false,
                properties: Bytes::new(),
                retained: false,
                origin: 0,
                channel,
                payload,
            });
        };
        let waited = envelope::unix_ms().saturating_sub(meta.sent_ms);
        let Some(properties) = envelope::expiry_left(meta.properties, waited) else {
            self.stats.dropped += 1;
            return None;
        };
        Some(Message {
            id: 0,
            message: id,
            text: meta.text,
            at_most_once: meta.qos == 0,
            exactly_once: meta.qos == 2,
            properties,
            retained: meta.retained,
            origin: if meta.node == self.node {
                meta.origin
            } else {
                0
            },
            channel,
            payload,
        })
    }

    /// Takes news from the Redis link: counts it, says what matters on
    /// stderr, and tells the supervisor what to do.
    fn on_event(&mut self, ev: redis::Event) -> News {
        match ev {
            redis::Event::Up => {
                match self.on_up() {
                    Some(outage) => log!(
                        "throng: Redis at {} is back after {:.1}s; subscriptions restored, publishing again",
                        self.settings.url,
                        outage.as_secs_f64()
                    ),
                    None => log!("throng: connected to Redis at {}", self.settings.url),
                }
                News::State(self.state_record())
            }
            redis::Event::Down { reason, retry_in } => {
                let was_up = self.on_down(reason.to_string());
                if was_up {
                    log!(
                        "throng: lost Redis at {}: {reason}; subscribers stay connected, \
                         POST /publish answers 503 until it is back; reconnecting",
                        self.settings.url
                    );
                } else if self.stats.connect_failures.is_power_of_two() {
                    // Attempt 1, 2, 4, 8, ...: say it, without a line every few seconds.
                    log!(
                        "throng: Redis at {} unreachable: {reason} (attempt {}, next in {:.1}s)",
                        self.settings.url,
                        self.stats.connect_failures,
                        retry_in.as_secs_f64()
                    );
                }
                News::State(self.state_record())
            }
            redis::Event::Message {
                channel,
                id,
                payload,
                meta,
                permit,
            } => {
                self.stats.received += 1;
                let spread = self
                    .sharing
                    .then(|| spread(&channel, id, &payload, meta.as_ref()));
                match self.relayed(channel, id, payload, meta) {
                    Some(m) => News::Relay(m, permit, spread),
                    None => News::Nothing,
                }
            }
            redis::Event::Claimed {
                node,
                hash,
                unix_ns,
            } if node != self.node => News::Claimed(hash, unix_ns),
            // This node's own claim, back from Redis.
            redis::Event::Claimed { .. } => News::Nothing,
            redis::Event::Announced(payload) => News::Announced(payload),
            redis::Event::SessionMark { kind, nonce } => News::SessionMark(kind, nonce),
            redis::Event::SessionReply { nonce, reply } => News::SessionReply(nonce, reply),
            redis::Event::Dropped(why) => {
                self.stats.dropped += 1;
                if self.stats.dropped.is_power_of_two() {
                    log!(
                        "throng: dropped a message from Redis: {why} ({} so far)",
                        self.stats.dropped
                    );
                }
                News::Nothing
            }
            redis::Event::Recovered {
                to,
                complete,
                messages,
            } => {
                if to.request & crate::control::API_READ != 0 {
                    // A server API read, not a subscriber's recovery.
                } else if complete {
                    self.recovered.0 += 1;
                } else {
                    self.recovered.1 += 1;
                }
                let rec = Record::Recovered {
                    id: to.request,
                    complete,
                    messages,
                };
                News::Answer(to, rec.encode())
            }
            redis::Event::Published { to, result } => News::Answer(to, self.published(to, result)),
            redis::Event::Retained {
                to,
                mut messages,
                cut,
            } => {
                self.retained.cut += cut;
                fit_retained(&mut messages);
                let rec = Record::Retained {
                    id: to.request,
                    messages,
                };
                News::Answer(to, rec.encode())
            }
            redis::Event::RetainedStore { topics, dropped } => {
                self.retained.topics = topics;
                self.retained.dropped_count += dropped;
                News::Nothing
            }
            redis::Event::Subscriptions(n) => {
                self.stats.subscriptions = u64::try_from(n).unwrap_or(0);
                News::Nothing
            }
            redis::Event::Shards(states) => self.on_shards(states),
            // The cluster router's own business: they never reach here.
            redis::Event::Redirected { .. }
            | redis::Event::Lost(_)
            | redis::Event::Placed(_)
            | redis::Event::Stored(_) => News::Nothing,
        }
    }

    /// A cluster's shards changed: the link is up when every shard is,
    /// and the reason names the shards that are not.
    fn on_shards(&mut self, states: Vec<ShardState>) -> News {
        for s in &states {
            let before = self.shards.iter().find(|b| b.addr == s.addr);
            match (before.map(|b| b.up), s.up) {
                (Some(false) | None, true) => log!("throng: Redis Cluster shard {} is up", s.addr),
                (Some(true), false) => log!(
                    "throng: lost Redis Cluster shard {}: {}; its channels answer 503, the other shards publish",
                    s.addr,
                    s.reason
                ),
                _ => {}
            }
        }
        let down: Vec<String> = states
            .iter()
            .filter(|s| !s.up)
            .map(|s| {
                format!(
                    "shard {} unreachable for {:.1}s ({})",
                    s.addr,
                    s.since.elapsed().as_secs_f64(),
                    s.reason
                )
            })
            .collect();
        let ups = states.iter().filter(|s| s.up).count();
        self.shards = states;
        if down.is_empty() && ups > 0 {
            if !self.up {
                let _ = self.on_up();
            }
        } else {
            let reason = format!(
                "{}; {ups} of {} shards up",
                down.join(", "),
                self.shards.len()
            );
            if self.up {
                self.on_down(reason);
            } else {
                self.reason = reason;
            }
        }
        News::State(self.state_record())
    }

    fn drop_interest(&mut self, channel: String) {
        if let Some(n) = self.nodes.get_mut(&channel) {
            *n -= 1;
            if *n == 0 {
                self.nodes.remove(&channel);
                let _ = self.cmds.send(Command::Unsubscribe(channel));
            }
        }
    }
}

/// A message's hash as every node computes it alike from what Redis handed
/// it: the channel, the stream id (with history), the payload and the
/// seal's publisher and time (an MQTT publish), so two publishes of one
/// payload differ unless both are bare (an HTTP publish without history:
/// those go to one node, whose members take them in turn).
fn spread(channel: &str, id: MessageId, payload: &[u8], meta: Option<&envelope::Meta>) -> u64 {
    use crate::shares::cluster::{hash, hash_more};
    let mut h = hash_more(hash(channel.as_bytes()), &[0]);
    for word in [id.epoch, id.seq] {
        h = hash_more(h, &word.to_be_bytes());
    }
    if let Some(m) = meta {
        for word in [m.node, m.origin, m.sent_ms] {
            h = hash_more(h, &word.to_be_bytes());
        }
    }
    // Its length and first bytes are enough to tell messages apart, and
    // cost the same for a large one.
    h = hash_more(h, &(payload.len() as u64).to_be_bytes());
    hash_more(h, &payload[..payload.len().min(SPREAD_BYTES)])
}

/// How much of a payload [`spread`] reads.
const SPREAD_BYTES: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::WorkerId;

    fn remote(mode: RedisMode) -> (Remote, mpsc::UnboundedReceiver<Command>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let settings = RedisSettings {
            url: "redis://127.0.0.1".parse().unwrap(),
            prefix: "throng:".into(),
            mode,
            wait: false,
            trust: redis::Trust::default(),
            tls: None,
            history: None,
            max_retained: 10,
            topology: redis::Topology::Single,
            session_queue: 0,
        };
        (Remote::new(settings, tx, 3), rx)
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<Command>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(c) = rx.try_recv() {
            out.push(match c {
                Command::Subscribe(c) => format!("+{c}"),
                Command::Unsubscribe(c) => format!("-{c}"),
                Command::Publish { channel, .. } => format!("publish {channel}"),
                Command::Retained { filters, .. } => format!("retained {filters:?}"),
                Command::Recover { channel, since, .. } => format!("recover {channel} {since}"),
                Command::Resend { channel, .. } => format!("resend {channel}"),
                Command::Store { channel, .. } => format!("store {channel}"),
                Command::Claim { hash, .. } => format!("claim {hash}"),
                Command::Announce(_) => "announce".into(),
                Command::Session { nonce, .. } => format!("session {nonce}"),
            });
        }
        out
    }

    #[test]
    fn claims_go_to_redis_in_every_mode_and_come_back_from_other_nodes_only() {
        let (r, mut rx) = remote(RedisMode::Pattern);
        let me = r.node;
        let mut b = Broker::Redis(Box::new(r));
        b.claim(42, 7);
        assert_eq!(drain(&mut rx), ["claim 42"]);
        let back = |node| redis::Event::Claimed {
            node,
            hash: 42,
            unix_ns: 7,
        };
        assert!(matches!(b.on_event(back(me)), News::Nothing));
        let other = me.wrapping_add(1).max(1);
        assert!(matches!(b.on_event(back(other)), News::Claimed(42, 7)));
        // Channels mode subscribes to the control channels at once.
        let (r, mut rx) = remote(RedisMode::Channels);
        Broker::Redis(Box::new(r)).claim(42, 7);
        assert_eq!(drain(&mut rx), ["+#claims", "+#shares", "claim 42"]);
    }

    #[test]
    fn a_channel_is_subscribed_while_any_worker_has_subscribers() {
        let (mut r, mut rx) = remote(RedisMode::Channels);
        drain(&mut rx);
        r.interest(0, "a".into(), true);
        r.interest(1, "a".into(), true);
        r.interest(1, "a".into(), true); // repeated: harmless
        r.interest(2, "b".into(), true);
        assert_eq!(drain(&mut rx), ["+a", "+b"]);
        r.interest(0, "a".into(), false);
        assert_eq!(drain(&mut rx), Vec::<String>::new());
        r.interest(1, "a".into(), false);
        assert_eq!(drain(&mut rx), ["-a"]);
        r.interest(1, "a".into(), false); // not subscribed: harmless
        r.interest(9, "x".into(), true); // no such worker
        assert_eq!(drain(&mut rx), Vec::<String>::new());
        // A worker that dies takes its channels with it.
        r.interest(2, "c".into(), true);
        r.interest(0, "c".into(), true);
        r.worker_gone(2);
        assert_eq!(drain(&mut rx), ["+c", "-b"]);
        r.worker_gone(0);
        assert_eq!(drain(&mut rx), ["-c"]);
    }

    #[test]
    fn pattern_mode_ignores_interest_and_down_refuses_publishes() {
        let (mut r, mut rx) = remote(RedisMode::Pattern);
        r.interest(0, "a".into(), true);
        let m = Message {
            id: 5,
            message: MessageId::NONE,
            text: true,
            at_most_once: false,
            exactly_once: false,
            properties: Bytes::new(),
            retained: false,
            origin: 0,
            channel: "a".into(),
            payload: Bytes::from_static(b"x"),
        };
        let from = Publisher {
            worker: WorkerId {
                slot: 0,
                generation: 1,
            },
            request: 5,
        };
        let why = r.publish(from, m.clone(), None).unwrap_err().to_string();
        assert!(
            why.contains("unreachable") && why.contains("connecting"),
            "{why}"
        );
        assert_eq!(drain(&mut rx), Vec::<String>::new());
        assert_eq!(r.on_up(), None, "the first connection is not a reconnect");
        r.publish(from, m, None).unwrap();
        assert_eq!(drain(&mut rx), ["publish a"]);
        let rec = r.published(from, Ok((2, MessageId::NONE)));
        let mut buf = bytes::BytesMut::from(&rec[..]);
        assert_eq!(
            Record::decode(&mut buf).unwrap(),
            Some(Record::Published {
                id: 5,
                subscribers: 2,
                message: MessageId::NONE
            })
        );
        assert!(r.on_down("gone".into()));
        assert!(!r.stats().up);
        assert!(r.on_up().is_some());
        assert_eq!(r.stats().reconnects, 1);
    }
}
