//! MQTT persistent sessions while their clients are away, in the
//! supervisor, sans I/O: the node's one place every relayed message passes,
//! so a client that reconnects lands on any worker and finds its session.
//!
//! A worker says when a client with a client id connects
//! ([`SessionOpen`]): with clean start a kept session is dropped; without,
//! the session kept is handed back ([`SessionResumed`]: its subscriptions
//! and what came meanwhile, in order). While a persistent session is
//! connected the supervisor only knows where (its owner); when the
//! connection ends its worker parks it ([`SessionPark`]: subscriptions,
//! unacknowledged deliveries, and the last relayed message its fan-outs
//! had finished). The messages relayed after that one, which the worker
//! may not have written, are matched again from the last
//! [`RECENT`] relayed, kept only while a persistent session is connected.
//!
//! While parked, a relayed message that a subscription matches at QoS 1
//! or 2 is queued for it (at the lower of the two QoS; QoS 0 ones are not
//! kept, as Mosquitto does by default), up to `--mqtt-session-queue`
//! messages per session and `--mqtt-sessions-memory` bytes in all; past
//! either the message is dropped for that session and counted. A session
//! ends after its expiry (5.0's Session Expiry Interval; 3.1.1's clean
//! session 0 keeps it until `--mqtt-session-expiry`, the cap of both).
//!
//! A reconnect while the old connection is still open (a takeover) waits
//! for that connection's park, up to [`WAIT_MS`]; a park from a connection
//! that is no longer its session's owner (a clean start took over) is
//! dropped. A worker that dies loses the sessions of its connections.

use std::collections::{HashMap, VecDeque};

use throng_proto::mqtt::topic::FilterTrie;

use crate::control::{Message, SessionOpen, SessionPark, SessionResumed, SessionSub};

mod shared;
pub(crate) use shared::{Ask, TakeAnswer};

/// Relayed messages kept to close the gap between a connection's end and
/// its park (a few control-socket round trips of traffic), at most.
pub const RECENT: usize = 4096;

/// Bytes those may take, at most (payloads of up to `--max-message`).
pub const RECENT_BYTES: usize = 8 * 1024 * 1024;

/// How long a resume waits for the park of the connection it takes over.
pub const WAIT_MS: u64 = 3000;

/// How long a channel's interest outlives its last parked session's
/// resume: the resuming worker's own interest comes meanwhile, so Redis
/// stays subscribed.
const RELEASE_MS: u64 = 2000;

/// Bytes a queued message is counted for besides its payload, channel and
/// properties.
const OVERHEAD: usize = 96;

/// The flags that bound the sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Messages queued per session.
    pub queue: usize,
    /// Bytes queued in all sessions.
    pub memory: usize,
    /// The longest a session is kept, in seconds.
    pub max_expiry: u32,
}

/// Counts for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionStats {
    /// Sessions kept for clients away now.
    pub parked: u64,
    /// Messages queued in them now.
    pub queued: u64,
    /// Bytes they take now (their subscriptions and queued messages).
    pub bytes: u64,
    /// Resumes that found their session.
    pub resumed: u64,
    /// Sessions that expired.
    pub expired: u64,
    /// Messages dropped over `--mqtt-session-queue`.
    pub dropped_queue: u64,
    /// Messages dropped over `--mqtt-sessions-memory`.
    pub dropped_memory: u64,
    /// Sessions not kept: over `--mqtt-sessions-memory` themselves.
    pub refused: u64,
    /// Parks whose gap was older than the recent messages kept: messages
    /// relayed meanwhile may be missing from the session.
    pub gap_missed: u64,
    /// Sessions written to Redis when their client went (`--redis`).
    #[serde(default)]
    pub stored: u64,
    /// Session writes and reads Redis refused or could not answer (a
    /// resume then starts afresh).
    #[serde(default)]
    pub store_failed: u64,
}

/// Where a connected persistent session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    worker: usize,
    conn: u64,
}

/// A session kept while its client is away.
struct Parked {
    subs: Vec<SessionSub>,
    /// Each message with when it was queued (ms), for its 5.0 Message
    /// Expiry Interval, and the packet id it was sent with (0: never).
    queue: VecDeque<(Message, u64, u16)>,
    /// PUBRELs owed: QoS 2 deliveries received, awaiting PUBCOMP.
    releases: Vec<u16>,
    /// The client's QoS 2 PUBLISHes relayed, awaiting its PUBREL.
    received: Vec<u16>,
    bytes: usize,
    expires_at: u64,
}

/// A resume waiting for the park of the connection it took over.
struct Waiting {
    hash: u64,
    owner: Owner,
    persistent: bool,
    since: u64,
}

/// An answer for a worker's connection.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub worker: usize,
    pub resumed: SessionResumed,
}

/// The sessions of one node.
pub struct Sessions {
    limits: Limits,
    parked: HashMap<u64, Parked>,
    /// Filter: the parked sessions subscribed to it, with their options.
    index: FilterTrie<Vec<(u64, u8)>>,
    owners: HashMap<u64, Owner>,
    waiting: Vec<Waiting>,
    recent: VecDeque<Message>,
    /// Bytes of `recent` ([`cost`]).
    recent_bytes: usize,
    /// The last relayed message.
    last: u64,
    /// The time (ms) of the last call that said it.
    clock: u64,
    /// Channels (exact filters) that gained their first parked session
    /// (`true`) or lost their last (`false`), for the broker's interest
    /// (`--redis-mode channels`), not yet taken ([`Self::take_interest`]).
    interest: Vec<(String, bool)>,
    /// Channels whose last parked session resumed: their interest ends a
    /// little later (at the tick past the time here, ms), once the worker
    /// that took the session has said its own.
    releases: Vec<(String, u64)>,
    bytes: usize,
    stats: SessionStats,
    /// With Redis (pattern mode, one Redis): sessions away live there.
    shared: Option<shared::Shared>,
}

/// The QoS message `m` was published at.
fn qos_of(m: &Message) -> u8 {
    if m.at_most_once {
        0
    } else if m.exactly_once {
        2
    } else {
        1
    }
}

/// `m` to be delivered at `qos` (1 or 2).
fn at_qos(m: &Message, qos: u8) -> Message {
    Message {
        at_most_once: false,
        exactly_once: qos == 2,
        ..m.clone()
    }
}

/// Whether a session's filter is one channel (what Redis's channels mode
/// subscribes to): not a wildcard, not a shared subscription (whose
/// messages go to the group's members that are connected, and are not
/// queued for one away: its filter matches no topic here).
fn is_channel(filter: &str) -> bool {
    !throng_proto::mqtt::topic::is_wildcard(filter) && !filter.starts_with("$share/")
}

fn cost(m: &Message) -> usize {
    OVERHEAD + m.channel.len() + m.properties.len() + m.payload.len()
}

/// `m` as it goes out `waited` ms after it was queued: with its 5.0
/// Message Expiry Interval less the whole seconds it waited, or `None`
/// once that interval is over (MQTT-3.3.2-5 and -6).
fn unexpired(mut m: Message, waited: u64) -> Option<Message> {
    m.properties = crate::redis::envelope::expiry_left(m.properties, waited)?;
    Some(m)
}

impl Sessions {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            parked: HashMap::new(),
            index: FilterTrie::new(),
            owners: HashMap::new(),
            waiting: Vec::new(),
            recent: VecDeque::new(),
            recent_bytes: 0,
            last: 0,
            clock: 0,
            interest: Vec::new(),
            releases: Vec::new(),
            bytes: 0,
            stats: SessionStats::default(),
            shared: None,
        }
    }

    /// A client connected on `worker` at `now` (ms): for a resume, the
    /// answer, unless it waits for the park of the connection it took over.
    pub fn open(&mut self, worker: usize, o: &SessionOpen, now: u64) -> Option<Reply> {
        self.clock = now;
        let owner = Owner {
            worker,
            conn: o.conn,
        };
        if o.clean {
            self.drop_parked(o.hash);
            self.drop_shared(o.hash, o.persistent);
            self.set_owner(o.hash, owner, o.persistent);
            return None;
        }
        if let Some(p) = self.take_parked(o.hash) {
            self.set_owner(o.hash, owner, o.persistent);
            return Some(self.reply(owner, Some(p), now));
        }
        if self.owners.get(&o.hash).is_some_and(|&old| old != owner) {
            self.waiting.push(Waiting {
                hash: o.hash,
                owner,
                persistent: o.persistent,
                since: now,
            });
            return None;
        }
        self.set_owner(o.hash, owner, o.persistent);
        if self.open_shared(owner, o, now) {
            return None;
        }
        Some(self.reply(owner, None, now))
    }

    /// A persistent session's connection on `worker` ended at `now` (ms):
    /// kept, or handed to the resume waiting for it.
    pub fn park(&mut self, worker: usize, p: SessionPark, now: u64) -> Option<Reply> {
        let owner = Owner {
            worker,
            conn: p.conn,
        };
        if self.owners.get(&p.hash) != Some(&owner) {
            // A clean start took the client id over since.
            return None;
        }
        self.owners.remove(&p.hash);
        let expiry = p.expiry.min(self.limits.max_expiry);
        // In Redis, unless a resume on this node waits for it.
        if self.shared.is_some() && !self.waiting.iter().any(|w| w.hash == p.hash) {
            self.park_shared(p, expiry, now);
            return None;
        }
        // The session itself counts under --mqtt-sessions-memory too: past
        // it, it is not kept (counted), whatever it holds.
        let own: usize = OVERHEAD
            + p.subs
                .iter()
                .map(|s| OVERHEAD + s.filter.len())
                .sum::<usize>();
        if self.bytes + own > self.limits.memory {
            self.stats.refused += 1;
            return None;
        }
        self.bytes += own;
        let mut parked = Parked {
            subs: p.subs,
            queue: VecDeque::new(),
            releases: p.releases,
            received: p.received,
            bytes: own,
            expires_at: now.saturating_add(u64::from(expiry) * 1000),
        };
        for (k, m) in p.pending.iter().enumerate() {
            let qos = qos_of(m).max(1);
            let id = p.ids.get(k).copied().unwrap_or(0);
            self.push(&mut parked, m, qos, now, id);
        }
        // What was relayed after the worker's last finished fan-out.
        if self.recent.front().is_some_and(|m| m.id > p.through + 1) {
            self.stats.gap_missed += 1;
        }
        for (m, qos) in self.matched(&parked.subs, p.through, self.last) {
            self.push(&mut parked, &m, qos, now, 0);
        }
        if let Some(k) = self.waiting.iter().position(|w| w.hash == p.hash) {
            let w = self.waiting.swap_remove(k);
            self.set_owner(p.hash, w.owner, w.persistent);
            self.bytes -= parked.bytes;
            return Some(self.reply(w.owner, Some(parked), now));
        }
        if expiry == 0 {
            self.bytes -= parked.bytes;
            return None;
        }
        for s in &parked.subs {
            let first = self.index.get_mut(&s.filter).is_none();
            if let Ok(v) = self.index.get_or_insert_with(&s.filter, Vec::new) {
                v.push((p.hash, s.options));
                if first && is_channel(&s.filter) {
                    self.interest.push((s.filter.clone(), true));
                }
            }
        }
        if let Some(old) = self.parked.insert(p.hash, parked) {
            self.bytes -= old.bytes;
        }
        None
    }

    /// Whether relayed messages are wanted ([`Self::relayed`]): while a
    /// persistent session is connected or parked; else only their ids
    /// ([`Self::passed`]).
    pub fn wants(&self) -> bool {
        !self.owners.is_empty() || !self.parked.is_empty() || self.shared_busy()
    }

    fn shared_busy(&self) -> bool {
        self.shared.as_ref().is_some_and(shared::Shared::busy)
    }

    /// The messages relayed after `after`, up to `upto`, that `subs`
    /// match, each with the QoS it goes at (QoS 0 ones are not kept).
    fn matched(&self, subs: &[SessionSub], after: u64, upto: u64) -> Vec<(Message, u8)> {
        self.recent
            .iter()
            .filter(|m| m.id > after && m.id <= upto)
            .filter_map(|m| {
                let sub = subs
                    .iter()
                    .filter(|s| throng_proto::mqtt::topic::matches(&s.filter, &m.channel))
                    .map(|s| s.options & 3)
                    .max()?;
                let qos = sub.min(qos_of(m));
                (qos > 0).then(|| (m.clone(), qos))
            })
            .collect()
    }

    /// Message `id` was relayed while no session wanted it.
    pub fn passed(&mut self, id: u64) {
        self.last = id;
        self.recent.clear();
        self.recent_bytes = 0;
    }

    /// Message `m` was relayed to the workers: queued for the parked
    /// sessions it matches.
    pub fn relayed(&mut self, m: &Message, now: u64) {
        self.last = m.id;
        if self.owners.is_empty() && !self.shared_busy() {
            self.recent.clear();
            self.recent_bytes = 0;
        } else {
            self.recent_bytes += cost(m);
            self.recent.push_back(m.clone());
            while self.recent.len() > RECENT || self.recent_bytes > RECENT_BYTES {
                let Some(old) = self.recent.pop_front() else {
                    break;
                };
                self.recent_bytes -= cost(&old);
            }
        }
        if self.parked.is_empty() || m.at_most_once {
            return;
        }
        let mut hits: Vec<(u64, u8)> = Vec::new();
        self.index.for_each_match(&m.channel, |subs| {
            hits.extend(subs.iter().map(|&(h, o)| (h, o & 3)));
        });
        // A session two of whose filters match gets it once, at the higher QoS.
        hits.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        hits.dedup_by_key(|h| h.0);
        let published = qos_of(m);
        for (hash, sub) in hits {
            let qos = sub.min(published);
            if qos == 0 {
                continue;
            }
            if let Some(mut p) = self.parked.remove(&hash) {
                self.push(&mut p, m, qos, now, 0);
                self.parked.insert(hash, p);
            }
        }
    }

    /// Expires sessions and gives up waiting for parks at `now` (ms): the
    /// resumes that waited too long are answered without a session.
    pub fn tick(&mut self, now: u64) -> Vec<Reply> {
        self.clock = now;
        let mut k = 0;
        while k < self.releases.len() {
            if self.releases[k].1 > now {
                k += 1;
                continue;
            }
            let (channel, _) = self.releases.swap_remove(k);
            // Parked again meanwhile: still wanted.
            if self.index.get_mut(&channel).is_none() {
                self.interest.push((channel, false));
            }
        }
        let expired: Vec<u64> = self
            .parked
            .iter()
            .filter(|(_, p)| p.expires_at <= now)
            .map(|(&h, _)| h)
            .collect();
        for h in expired {
            self.drop_parked(h);
            self.stats.expired += 1;
        }
        let mut out = Vec::new();
        let mut k = 0;
        while k < self.waiting.len() {
            if now.saturating_sub(self.waiting[k].since) < WAIT_MS {
                k += 1;
                continue;
            }
            let w = self.waiting.swap_remove(k);
            self.set_owner(w.hash, w.owner, w.persistent);
            out.push(self.reply(w.owner, None, now));
        }
        out.extend(self.tick_shared(now));
        out
    }

    /// Worker `worker` died (or was replaced): its connections' sessions
    /// are lost, and its waiting resumes with them.
    pub fn worker_gone(&mut self, worker: usize) {
        let gone: Vec<u64> = self
            .owners
            .iter()
            .filter(|(_, o)| o.worker == worker)
            .map(|(&h, _)| h)
            .collect();
        self.owners.retain(|_, o| o.worker != worker);
        self.waiting.retain(|w| w.owner.worker != worker);
        self.worker_gone_shared(worker, &gone);
    }

    /// The interest changes since the last call, in order.
    pub fn take_interest(&mut self) -> Vec<(String, bool)> {
        std::mem::take(&mut self.interest)
    }

    pub fn stats(&self) -> SessionStats {
        SessionStats {
            parked: self.parked.len() as u64,
            queued: self.parked.values().map(|p| p.queue.len() as u64).sum(),
            bytes: self.bytes as u64,
            ..self.stats
        }
    }

    fn set_owner(&mut self, hash: u64, owner: Owner, persistent: bool) {
        if persistent {
            self.owners.insert(hash, owner);
        } else {
            self.owners.remove(&hash);
        }
    }

    /// Queues `m` at `qos` for `p` at `now` (ms), or drops it (counted).
    /// Queues `m` at `qos` for `p` at `now`, sent before as packet `id`
    /// (0: never), unless a cap is reached (counted).
    fn push(&mut self, p: &mut Parked, m: &Message, qos: u8, now: u64, id: u16) {
        let n = cost(m);
        if p.queue.len() >= self.limits.queue {
            self.stats.dropped_queue += 1;
        } else if self.bytes + n > self.limits.memory {
            self.stats.dropped_memory += 1;
        } else {
            p.queue.push_back((at_qos(m, qos), now, id));
            p.bytes += n;
            self.bytes += n;
        }
    }

    /// Takes the session of `hash` out of the tables.
    fn take_parked(&mut self, hash: u64) -> Option<Parked> {
        let p = self.parked.remove(&hash)?;
        for s in &p.subs {
            let empty = self.index.get_mut(&s.filter).is_some_and(|v| {
                v.retain(|&(h, _)| h != hash);
                v.is_empty()
            });
            if empty {
                self.index.remove(&s.filter);
                if is_channel(&s.filter) {
                    self.releases
                        .push((s.filter.clone(), self.clock + RELEASE_MS));
                }
            }
        }
        self.bytes -= p.bytes;
        Some(p)
    }

    fn drop_parked(&mut self, hash: u64) {
        self.take_parked(hash);
        self.waiting.retain(|w| w.hash != hash);
    }

    fn reply(&mut self, owner: Owner, p: Option<Parked>, now: u64) -> Reply {
        let present = p.is_some();
        if present {
            self.stats.resumed += 1;
        }
        let (mut messages, mut ids) = (Vec::new(), Vec::new());
        let (subs, releases, received) = p.map_or(Default::default(), |p| {
            for (m, at, id) in p.queue {
                if let Some(m) = unexpired(m, now.saturating_sub(at)) {
                    messages.push(m);
                    ids.push(id);
                }
            }
            (p.subs, p.releases, p.received)
        });
        Reply {
            worker: owner.worker,
            resumed: SessionResumed {
                conn: owner.conn,
                present,
                through: self.last,
                subs,
                messages,
                ids,
                releases,
                received,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use throng_proto::mqtt::{Properties, PropertiesBuf, Property};

    use super::*;

    impl Sessions {
        fn relayed_at(&mut self, m: &Message) {
            self.relayed(m, 0);
        }
    }

    fn limits() -> Limits {
        Limits {
            queue: 3,
            memory: 1 << 20,
            max_expiry: 3600,
        }
    }

    fn msg(id: u64, channel: &str, qos: u8) -> Message {
        Message {
            text: false,
            at_most_once: qos == 0,
            exactly_once: qos == 2,
            ..Message::sample(id, channel, format!("m{id}"))
        }
    }

    fn open(hash: u64, conn: u64, clean: bool) -> SessionOpen {
        SessionOpen {
            hash,
            conn,
            clean,
            persistent: true,
        }
    }

    fn park(hash: u64, conn: u64, through: u64, filters: &[(&str, u8)]) -> SessionPark {
        SessionPark {
            hash,
            conn,
            expiry: 60,
            through,
            subs: filters
                .iter()
                .map(|&(f, o)| SessionSub {
                    filter: f.to_owned(),
                    options: o,
                })
                .collect(),
            pending: Vec::new(),
            ids: Vec::new(),
            releases: Vec::new(),
            received: Vec::new(),
        }
    }

    fn payloads(r: &Reply) -> Vec<(String, bool)> {
        r.resumed
            .messages
            .iter()
            .map(|m| {
                (
                    String::from_utf8_lossy(&m.payload).into_owned(),
                    m.exactly_once,
                )
            })
            .collect()
    }

    #[test]
    fn a_parked_session_queues_what_it_matches_and_hands_it_back_in_order() {
        let mut s = Sessions::new(limits());
        let first = s.open(0, &open(7, 1, false), 0).unwrap();
        assert!(!first.resumed.present);
        assert_eq!(s.park(0, park(7, 1, 0, &[("a/+", 1), ("b", 2)]), 10), None);
        s.relayed_at(&msg(1, "a/x", 2));
        s.relayed_at(&msg(2, "c", 1));
        s.relayed_at(&msg(3, "b", 0));
        s.relayed_at(&msg(4, "b", 2));
        assert_eq!(s.stats().queued, 2);
        let r = s.open(1, &open(7, 5, false), 20).unwrap();
        assert_eq!(r.worker, 1);
        assert!(r.resumed.present);
        assert_eq!(r.resumed.through, 4);
        assert_eq!(r.resumed.subs.len(), 2);
        // QoS 2 on a QoS 1 subscription comes at 1; QoS 0 is not kept.
        assert_eq!(
            payloads(&r),
            vec![("m1".to_owned(), false), ("m4".to_owned(), true)]
        );
        assert_eq!(s.stats().parked, 0);
        assert_eq!(s.stats().bytes, 0);
    }

    #[test]
    fn a_message_expiry_interval_counts_down_while_queued_and_ends_it() {
        let mut props = PropertiesBuf::new();
        props.push(Property::MessageExpiryInterval(6)).unwrap();
        props.push(Property::ContentType("text/plain")).unwrap();
        let mut six = msg(1, "t", 1);
        six.properties = Bytes::copy_from_slice(props.properties().as_bytes());
        let left = unexpired(six.clone(), 3_500).unwrap();
        let p = Properties::of_publish(&left.properties).unwrap();
        let got: Vec<_> = p.iter().collect();
        assert_eq!(
            got,
            vec![
                Property::MessageExpiryInterval(3),
                Property::ContentType("text/plain")
            ]
        );
        assert_eq!(unexpired(six, 6_000), None);
        assert!(unexpired(msg(2, "t", 1), u64::MAX).is_some(), "no interval");
    }

    #[test]
    fn a_parked_channel_is_wanted_until_a_while_after_its_resume() {
        let mut s = Sessions::new(limits());
        s.open(0, &open(7, 1, false), 0);
        s.park(0, park(7, 1, 0, &[("t", 1), ("w/+", 1)]), 0);
        assert_eq!(s.take_interest(), vec![("t".to_owned(), true)]);
        s.open(0, &open(7, 2, false), 1000);
        assert!(s.tick(2999).is_empty());
        assert!(s.take_interest().is_empty(), "not yet");
        s.tick(3000);
        assert_eq!(s.take_interest(), vec![("t".to_owned(), false)]);
    }

    #[test]
    fn the_queue_and_memory_caps_drop_and_count() {
        let mut s = Sessions::new(limits());
        s.open(0, &open(7, 1, false), 0);
        s.park(0, park(7, 1, 0, &[("#", 1)]), 0);
        for id in 1..=5 {
            s.relayed_at(&msg(id, "t", 1));
        }
        assert_eq!(s.stats().dropped_queue, 2);
        // Room for the session (two overheads and its filter) and one message.
        let mut small = Sessions::new(Limits {
            memory: 3 * OVERHEAD + 1 + OVERHEAD + 3,
            ..limits()
        });
        small.open(0, &open(7, 1, false), 0);
        small.park(0, park(7, 1, 0, &[("t", 1)]), 0);
        for id in 1..=3 {
            small.relayed_at(&msg(id, "t", 1));
        }
        assert_eq!(small.stats().dropped_memory, 2);
        assert_eq!(small.stats().queued, 1);
        // Full: the next session is not kept at all.
        small.open(0, &open(8, 2, false), 0);
        assert_eq!(small.park(0, park(8, 2, 0, &[("t", 1)]), 0), None);
        assert_eq!(small.stats().refused, 1);
        assert_eq!(small.stats().parked, 1);
    }

    #[test]
    fn messages_relayed_after_the_last_fanout_are_matched_at_the_park() {
        let mut s = Sessions::new(limits());
        s.open(0, &open(7, 1, true), 0);
        for id in 1..=3 {
            s.relayed_at(&msg(id, "t", 1));
        }
        // The worker had finished the fan-out of 1 only.
        s.park(0, park(7, 1, 1, &[("t", 1)]), 0);
        let r = s.open(0, &open(7, 2, false), 0).unwrap();
        assert_eq!(payloads(&r).len(), 2);
        assert_eq!(s.stats().gap_missed, 0);
    }

    #[test]
    fn a_clean_start_drops_the_session_and_a_late_park_of_the_old_connection() {
        let mut s = Sessions::new(limits());
        s.open(0, &open(7, 1, false), 0);
        s.park(0, park(7, 1, 0, &[("t", 1)]), 0);
        s.relayed_at(&msg(1, "t", 1));
        assert_eq!(s.open(0, &open(7, 2, true), 0), None);
        assert_eq!(s.stats().parked, 0);
        // Connection 2 is on; a park from 3 (taken over meanwhile) is stale.
        s.park(0, park(7, 3, 0, &[("t", 1)]), 0);
        assert_eq!(s.stats().parked, 0);
        let r = s.open(1, &open(7, 4, false), 0);
        assert_eq!(r, None, "waits for connection 2's park");
        let r = s.park(0, park(7, 2, 1, &[("t", 1)]), 0).unwrap();
        assert!(r.resumed.present);
        assert_eq!(r.worker, 1);
    }

    #[test]
    fn sessions_expire_a_resume_stops_waiting_and_a_dead_worker_forgets() {
        let mut s = Sessions::new(limits());
        s.open(0, &open(7, 1, false), 0);
        s.park(0, park(7, 1, 0, &[("t", 1)]), 0);
        assert!(s.tick(59_999).is_empty());
        assert_eq!(s.stats().parked, 1);
        s.tick(60_000);
        assert_eq!(s.stats().parked, 0);
        assert_eq!(s.stats().expired, 1);
        s.open(0, &open(8, 1, true), 0);
        assert_eq!(s.open(1, &open(8, 2, false), 100), None);
        let late = s.tick(100 + WAIT_MS);
        assert_eq!(late.len(), 1);
        assert!(!late[0].resumed.present);
        s.worker_gone(1);
        assert!(s.open(0, &open(8, 3, false), 0).is_some(), "no owner left");
    }

    #[test]
    fn in_redis_a_park_puts_what_its_connection_missed_in_front_at_its_mark() {
        let mut s = Sessions::new(limits());
        s.keep_in_redis();
        assert_eq!(s.open(0, &open(7, 1, true), 0), None);
        let drop = s.take_asks();
        let [
            Ask::Drop {
                hash: 7,
                token,
                clean: true,
                ttl_ms: 3_600_000,
            },
        ] = drop[..]
        else {
            panic!("a clean start that owns the session: {drop:?}")
        };
        for id in 1..=3 {
            s.relayed_at(&msg(id, "t", 1));
        }
        // The worker had finished the fan-out of 1; one in flight unacked.
        let mut p = park(7, 1, 1, &[("t", 1), ("$share/g/t", 1)]);
        p.pending = vec![msg(1, "t", 1)];
        p.ids = vec![9];
        assert_eq!(s.park(0, p, 0), None);
        let Some(Ask::Park {
            hash: 7,
            nonce,
            ttl_ms: 60_000,
            owner,
            indexed,
            ..
        }) = s.take_asks().pop()
        else {
            panic!("a park")
        };
        assert_eq!(indexed, vec![("t".to_owned(), 1)], "no shared filter");
        assert_eq!(owner, token, "parked as the connection that owns it");
        assert!(s.settling());
        s.relayed_at(&msg(4, "t", 1));
        assert_eq!(s.on_mark(b'p', nonce, 0), None);
        // After the mark, publishers queue: 5 is theirs.
        s.relayed_at(&msg(5, "t", 1));
        let Some(Ask::Front { entries, .. }) = s.take_asks().pop() else {
            panic!("a front")
        };
        let got: Vec<(u64, u16)> = entries.iter().map(|(m, _, id)| (m.id, *id)).collect();
        assert_eq!(got, vec![(1, 9), (2, 0), (3, 0), (4, 0)]);
        assert!(s.settling(), "until Redis answered");
        // The drop, the park and the front.
        for _ in 0..3 {
            s.answered(true);
        }
        assert!(!s.settling());
    }

    #[test]
    fn in_redis_a_resume_gets_the_queue_then_what_came_after_the_take_once() {
        let mut s = Sessions::new(limits());
        s.keep_in_redis();
        assert_eq!(s.open(1, &open(7, 2, false), 0), None);
        let Some(Ask::Take { nonce, force, .. }) = s.take_asks().pop() else {
            panic!("a take")
        };
        assert!(!force);
        // Published before the take: in the queue, not again.
        s.relayed_at(&msg(10, "t", 1));
        assert_eq!(s.on_mark(b't', nonce, 0), None);
        s.relayed_at(&msg(11, "t", 2));
        s.relayed_at(&msg(12, "other", 1));
        let record = crate::redis::mqtt_sessions::Record {
            subs: vec![("t".into(), 1)],
            releases: vec![3],
            received: Vec::new(),
        };
        let queue = vec![(msg(0, "t", 1), 1, 0)];
        let r = s
            .on_taken(nonce, TakeAnswer::Session(record, queue), 5)
            .expect("answered once both came");
        assert_eq!(r.worker, 1);
        assert!(r.resumed.present);
        assert_eq!(r.resumed.through, 12);
        assert_eq!(r.resumed.releases, vec![3]);
        assert_eq!(
            payloads(&r),
            vec![("m0".to_owned(), false), ("m11".to_owned(), false)],
            "QoS 2 on a QoS 1 subscription comes at 1"
        );
        assert_eq!(s.stats().resumed, 1);
    }

    #[test]
    fn in_redis_a_take_asks_again_forces_after_the_wait_and_none_is_a_fresh_start() {
        let mut s = Sessions::new(limits());
        s.keep_in_redis();
        s.open(0, &open(7, 1, false), 0);
        let Some(Ask::Take { nonce, .. }) = s.take_asks().pop() else {
            panic!("a take")
        };
        assert_eq!(s.on_taken(nonce, TakeAnswer::NotReady, 0), None);
        assert!(s.tick(1000).is_empty());
        let again = s.take_asks();
        assert!(
            matches!(again[..], [Ask::Take { force: false, .. }]),
            "{again:?}"
        );
        s.on_taken(nonce, TakeAnswer::NotReady, 1000);
        s.tick(WAIT_MS);
        let forced = s.take_asks();
        assert!(
            matches!(forced[..], [Ask::Take { force: true, .. }]),
            "{forced:?}"
        );
        let r = s.on_taken(nonce, TakeAnswer::Nothing, WAIT_MS).unwrap();
        assert!(!r.resumed.present);
        // Its worker dies: the session's hold in Redis goes with it.
        s.worker_gone(0);
        let gone = s.take_asks();
        assert!(
            matches!(gone[..], [Ask::Drop { hash: 7, clean: false, token, .. }] if token == nonce),
            "{gone:?}"
        );
        assert_eq!(
            s.on_taken(nonce, TakeAnswer::Nothing, 0),
            None,
            "answered once"
        );
    }
}
