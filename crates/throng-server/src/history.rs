//! Channel history, without sockets or clocks of its own: every message the
//! node relays gets its id here, the last `--history` messages of each
//! channel are kept (for `--history-ttl`, within `--history-max-memory`
//! over all channels, oldest dropped first), and a reconnecting subscriber
//! asks what followed the last id it saw.
//!
//! An id is `EPOCH-SEQ`: the Unix millisecond the node started and a
//! sequence over every channel of the node, so a restarted node never
//! gives an id twice (its epoch is later), and ids order the messages of a
//! channel. The answer to "what came after `since`" is complete only when
//! no message of that channel after `since` has been dropped: each channel
//! remembers the last id it dropped, and a channel whose whole history was
//! dropped leaves that id to a node-wide watermark, so the answer errs
//! towards "incomplete", never towards a silent gap.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::rc::Rc;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;

mod handover;
pub use handover::BadHandover;
pub(crate) use handover::Reader as HandoverReader;

/// A message's id: the node's epoch and its place in the node's sequence.
/// Ordered as a pair, so ids of one node order its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MessageId {
    /// The Unix millisecond the node that numbered it started (0: no id).
    pub epoch: u64,
    /// Its place among the node's messages, from 1.
    pub seq: u64,
}

impl MessageId {
    /// No id (a message relayed before ids, or a publish Redis answered).
    pub const NONE: Self = Self { epoch: 0, seq: 0 };

    /// Whether this is [`MessageId::NONE`].
    pub fn is_none(self) -> bool {
        self == Self::NONE
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.epoch, self.seq)
    }
}

/// Why a `since` or `Last-Event-ID` is not a message id.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error(
    "{0:?} is not a message id: ids look like 1764043200000-42 (EPOCH-SEQ, as a message carries it)"
)]
pub struct BadId(pub String);

impl FromStr for MessageId {
    type Err = BadId;

    fn from_str(s: &str) -> Result<Self, BadId> {
        let bad = || BadId(s.chars().take(64).collect());
        let (epoch, seq) = s.split_once('-').ok_or_else(bad)?;
        let number = |t: &str| {
            if t.is_empty() || t.len() > 20 || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            t.parse::<u64>().map_err(|_| bad())
        };
        Ok(Self {
            epoch: number(epoch)?,
            seq: number(seq)?,
        })
    }
}

/// What the history keeps (`--history`, `--history-ttl`, `--history-max-memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Messages kept per channel; 0: none (ids are still given).
    pub keep: usize,
    /// How long a message is kept; `None`: until pushed out.
    pub ttl: Option<Duration>,
    /// Bytes the whole history may hold (payloads and what each entry costs).
    pub max_bytes: usize,
}

/// Bytes a kept message costs beside its payload: its entry in its channel
/// and in the node-wide order, and the payload's allocation header.
pub const MESSAGE_COST: usize = 64;
/// Bytes a channel with history costs beside its name.
pub const CHANNEL_COST: usize = 96;

/// One kept message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub id: MessageId,
    /// Send as text (else binary).
    pub text: bool,
    pub payload: Bytes,
}

/// The answer to a reconnecting subscriber: what its channel kept after the
/// id it gave, and whether that is everything it missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// No message after `since` was dropped (else the subscriber is told).
    pub complete: bool,
    /// The kept messages after `since` (all of them when incomplete), in order.
    pub messages: Vec<Kept>,
}

impl Recovery {
    /// Keeps the newest messages that fit in `max_bytes` (each counted as
    /// its payload and `per_message` bytes), the answer incomplete if any
    /// had to go: an answer is one control record, and a record has a limit.
    pub fn fit(&mut self, max_bytes: usize, per_message: usize) {
        let mut size = 0;
        let mut keep = 0;
        for k in self.messages.iter().rev() {
            size += per_message + k.payload.len();
            if size > max_bytes {
                break;
            }
            keep += 1;
        }
        let cut = self.messages.len() - keep;
        if cut > 0 {
            self.messages.drain(..cut);
            self.complete = false;
        }
    }
}

/// Messages dropped from the history, by why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Pushed out by a newer message of the channel (`--history`).
    pub count: u64,
    /// Older than `--history-ttl`.
    pub ttl: u64,
    /// Over `--history-max-memory`, oldest first.
    pub memory: u64,
}

/// The history's figures for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub messages: u64,
    pub bytes: u64,
    pub channels: u64,
    pub dropped: Dropped,
    /// Recoveries answered complete and incomplete.
    pub complete: u64,
    pub incomplete: u64,
}

/// One channel's kept messages, oldest first.
struct Channel {
    kept: VecDeque<(Kept, u64)>,
    /// The sequence of the last message dropped from this channel (or the
    /// node's watermark when the channel was made): a `since` below it may
    /// have missed something.
    dropped_through: u64,
}

/// Every channel's history on one node.
pub struct History {
    limits: Limits,
    epoch: u64,
    last_seq: u64,
    channels: HashMap<Rc<str>, Channel>,
    /// Every kept message in the order it came (its sequence, channel and
    /// arrival in ms), for the TTL and the memory cap; entries of messages
    /// already dropped by their channel's count are skipped when met, and
    /// compacted away when they outnumber the kept ones.
    order: VecDeque<(u64, Rc<str>, u64)>,
    kept: usize,
    bytes: usize,
    /// The highest `dropped_through` of a channel whose history is gone.
    forgotten: u64,
    stats: Stats,
}

/// Why a message leaves the history.
#[derive(Clone, Copy)]
enum Why {
    Count,
    Ttl,
    Memory,
}

impl History {
    /// An empty history of a node that started at Unix ms `epoch`.
    pub fn new(limits: Limits, epoch: u64) -> Self {
        Self {
            limits,
            epoch,
            last_seq: 0,
            channels: HashMap::new(),
            order: VecDeque::new(),
            kept: 0,
            bytes: 0,
            forgotten: 0,
            stats: Stats::default(),
        }
    }

    /// The node's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The sequence of the last message numbered.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Gives a relayed message its id and keeps it (at `now_ms`, on the
    /// caller's monotonic clock).
    pub fn record(&mut self, channel: &str, text: bool, payload: &Bytes, now_ms: u64) -> MessageId {
        self.last_seq += 1;
        let id = MessageId {
            epoch: self.epoch,
            seq: self.last_seq,
        };
        self.keep(channel, id, text, payload, now_ms);
        id
    }

    /// Keeps message `id` of `channel` (arrived at `now_ms`) within the limits.
    fn keep(&mut self, channel: &str, id: MessageId, text: bool, payload: &Bytes, now_ms: u64) {
        if self.limits.keep == 0 {
            // Nothing is kept: any `since` before this one missed it.
            self.forgotten = id.seq;
            return;
        }
        let cost = MESSAGE_COST + payload.len();
        let name = match self.channels.get_key_value(channel) {
            Some((name, _)) => name.clone(),
            None => {
                let name: Rc<str> = Rc::from(channel);
                self.bytes += CHANNEL_COST + name.len();
                let ch = Channel {
                    kept: VecDeque::new(),
                    dropped_through: self.forgotten,
                };
                self.channels.insert(name.clone(), ch);
                name
            }
        };
        let kept = Kept {
            id,
            text,
            payload: payload.clone(),
        };
        let over = {
            // Invariant: the entry was found or made just above.
            let Some(ch) = self.channels.get_mut(channel) else {
                return;
            };
            ch.kept.push_back((kept, cost as u64));
            ch.kept.len() > self.limits.keep
        };
        self.order.push_back((id.seq, name.clone(), now_ms));
        self.kept += 1;
        self.bytes += cost;
        if over {
            self.drop_front(&name, Why::Count);
        }
        while self.bytes > self.limits.max_bytes && self.kept > 0 {
            self.drop_oldest(Why::Memory);
        }
        if self.order.len() > 2 * self.kept + 64 {
            self.compact();
        }
    }

    /// Drops what is older than the TTL at `now_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        let Some(ttl) = self.limits.ttl else { return };
        let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        while let Some((_, _, at)) = self.order.front() {
            if now_ms.saturating_sub(*at) < ttl {
                break;
            }
            self.drop_oldest(Why::Ttl);
        }
    }

    /// What `channel` kept after `since`, at `now_ms`: a subscriber's
    /// recovery, counted in [`Self::stats`].
    pub fn recover(&mut self, channel: &str, since: MessageId, now_ms: u64) -> Recovery {
        let r = self.read(channel, since, now_ms);
        if r.complete {
            self.stats.complete += 1;
        } else {
            self.stats.incomplete += 1;
        }
        r
    }

    /// What `channel` kept after `since`, at `now_ms`, not counted (the
    /// server API's history read).
    pub fn read(&mut self, channel: &str, since: MessageId, now_ms: u64) -> Recovery {
        self.expire(now_ms);
        let ch = self.channels.get(channel);
        let ours = since.epoch == self.epoch && since.seq <= self.last_seq;
        let through = ch.map_or(self.forgotten, |c| c.dropped_through);
        let complete = ours && since.seq >= through;
        let after = if ours { since.seq } else { 0 };
        let messages = ch.map_or_else(Vec::new, |c| {
            c.kept
                .iter()
                .filter(|(k, _)| k.id.seq > after)
                .map(|(k, _)| k.clone())
                .collect()
        });
        Recovery { complete, messages }
    }

    /// The figures for `/metrics`.
    pub fn stats(&self) -> Stats {
        Stats {
            messages: self.kept as u64,
            bytes: self.bytes as u64,
            channels: self.channels.len() as u64,
            ..self.stats
        }
    }

    /// Drops the oldest kept message of the node (skipping order entries of
    /// messages their channel already dropped).
    fn drop_oldest(&mut self, why: Why) {
        while let Some((seq, name, _)) = self.order.pop_front() {
            let live = self
                .channels
                .get(&name)
                .and_then(|c| c.kept.front())
                .is_some_and(|(k, _)| k.id.seq == seq);
            if live {
                self.drop_front(&name, why);
                return;
            }
        }
    }

    /// Drops channel `name`'s oldest message; the channel goes with its last.
    fn drop_front(&mut self, name: &str, why: Why) {
        let Some(ch) = self.channels.get_mut(name) else {
            return;
        };
        let Some((k, cost)) = ch.kept.pop_front() else {
            return;
        };
        ch.dropped_through = k.id.seq;
        self.kept -= 1;
        self.bytes -= cost as usize;
        match why {
            Why::Count => self.stats.dropped.count += 1,
            Why::Ttl => self.stats.dropped.ttl += 1,
            Why::Memory => self.stats.dropped.memory += 1,
        }
        if ch.kept.is_empty() {
            self.forgotten = self.forgotten.max(ch.dropped_through);
            self.bytes -= CHANNEL_COST + name.len();
            self.channels.remove(name);
        }
    }

    /// Takes the entries of messages already dropped out of the order.
    fn compact(&mut self) {
        let channels = &self.channels;
        self.order.retain(|(seq, name, _)| {
            channels
                .get(name)
                .and_then(|c| c.kept.front())
                .is_some_and(|(k, _)| k.id.seq <= *seq)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPOCH: u64 = 1_764_000_000_000;

    pub(super) fn limits(keep: usize) -> Limits {
        Limits {
            keep,
            ttl: None,
            max_bytes: 1 << 30,
        }
    }

    fn id(seq: u64) -> MessageId {
        MessageId { epoch: EPOCH, seq }
    }

    pub(super) fn put(h: &mut History, channel: &str, body: &str, now: u64) -> MessageId {
        h.record(channel, true, &Bytes::copy_from_slice(body.as_bytes()), now)
    }

    fn bodies(r: &Recovery) -> Vec<String> {
        r.messages
            .iter()
            .map(|k| String::from_utf8_lossy(&k.payload).into_owned())
            .collect()
    }

    #[test]
    fn ids_read_and_print_as_epoch_dash_seq_and_nothing_else_reads() {
        let i: MessageId = "1764000000000-42".parse().unwrap();
        assert_eq!(i, id(42));
        assert_eq!(i.to_string(), "1764000000000-42");
        for bad in [
            "",
            "-",
            "1-",
            "-1",
            "1",
            "1-2-3",
            "a-1",
            "1-x",
            "+1-2",
            "1- 2",
            "1-99999999999999999999",
            "１-2",
        ] {
            assert!(bad.parse::<MessageId>().is_err(), "{bad:?}");
        }
        assert!(id(2) > id(1));
        assert!(
            MessageId {
                epoch: EPOCH + 1,
                seq: 1
            } > id(100)
        );
    }

    #[test]
    fn a_channel_keeps_its_last_n_and_a_recovery_gets_what_followed() {
        let mut h = History::new(limits(3), EPOCH);
        let ids: Vec<_> = (1..=5)
            .map(|i| put(&mut h, "a", &format!("a{i}"), 0))
            .collect();
        put(&mut h, "b", "b1", 0);
        assert_eq!(ids, (1..=5).map(id).collect::<Vec<_>>());
        let r = h.recover("a", ids[2], 0);
        assert!(r.complete);
        assert_eq!(bodies(&r), ["a4", "a5"]);
        assert!(h.recover("a", ids[4], 0).messages.is_empty());
        let r = h.recover("a", ids[1], 0);
        assert!(
            r.complete,
            "a3 is the oldest kept, nothing after a2 is missing"
        );
        assert_eq!(bodies(&r), ["a3", "a4", "a5"]);
        let r = h.recover("a", ids[0], 0);
        assert!(!r.complete, "a2 was pushed out");
        assert_eq!(bodies(&r), ["a3", "a4", "a5"]);
        assert_eq!(h.stats().dropped.count, 2);
        assert_eq!(h.stats().messages, 4);
    }

    #[test]
    fn ids_of_another_epoch_or_from_the_future_are_incomplete() {
        let mut h = History::new(limits(10), EPOCH);
        put(&mut h, "a", "x", 0);
        let earlier = MessageId {
            epoch: EPOCH - 1,
            seq: 7,
        };
        let r = h.recover("a", earlier, 0);
        assert!(!r.complete, "a restarted node lost what came before it");
        assert_eq!(bodies(&r), ["x"]);
        let r = h.recover("a", id(2), 0);
        assert!(!r.complete, "no such message yet");
        assert_eq!(bodies(&r), ["x"]);
        let later = MessageId {
            epoch: EPOCH + 1,
            seq: 0,
        };
        assert!(!h.recover("a", later, 0).complete);
        assert_eq!(h.stats().incomplete, 3);
    }

    #[test]
    fn a_channel_nobody_published_on_is_complete_until_something_was_forgotten() {
        let mut h = History::new(limits(1), EPOCH);
        let last = put(&mut h, "a", "a1", 0);
        assert!(h.recover("quiet", last, 0).complete);
        assert!(h.recover("quiet", id(0), 0).complete);
        let mut h = History::new(
            Limits {
                ttl: Some(Duration::from_secs(1)),
                ..limits(1)
            },
            EPOCH,
        );
        put(&mut h, "a", "a1", 0);
        h.expire(1_000);
        assert_eq!(h.stats().channels, 0);
        // Erring towards incomplete: "quiet" cannot tell a1 was not its own.
        assert!(!h.recover("quiet", id(0), 1_000).complete);
        assert!(h.recover("quiet", id(1), 1_000).complete);
    }

    #[test]
    fn messages_older_than_the_ttl_are_dropped_and_their_channel_with_them() {
        let mut h = History::new(
            Limits {
                ttl: Some(Duration::from_millis(500)),
                ..limits(100)
            },
            EPOCH,
        );
        put(&mut h, "a", "old", 0);
        put(&mut h, "a", "new", 400);
        let r = h.recover("a", id(0), 600);
        assert_eq!(bodies(&r), ["new"]);
        assert!(!r.complete);
        assert!(h.recover("a", id(1), 600).complete);
        h.expire(900);
        assert_eq!(h.stats().messages, 0);
        assert_eq!(h.stats().bytes, 0, "channels cost nothing once gone");
        assert_eq!(h.stats().dropped.ttl, 2);
        assert!(!h.recover("a", id(1), 900).complete, "new is gone");
        assert!(h.recover("a", id(2), 900).complete);
    }

    #[test]
    fn the_memory_cap_drops_the_oldest_message_of_any_channel_first() {
        let body = "x".repeat(100);
        let one = MESSAGE_COST + 100;
        let channel = CHANNEL_COST + 1;
        let mut h = History::new(
            Limits {
                max_bytes: 2 * channel + 3 * one,
                ..limits(100)
            },
            EPOCH,
        );
        put(&mut h, "a", &body, 0); // 1
        put(&mut h, "b", &body, 0); // 2
        put(&mut h, "a", &body, 0); // 3
        assert_eq!(h.stats().dropped.memory, 0);
        put(&mut h, "b", &body, 0); // 4: over, 1 goes
        assert_eq!(h.stats().dropped.memory, 1);
        assert!(h.stats().bytes as usize <= 2 * channel + 3 * one);
        let r = h.recover("a", id(0), 0);
        assert!(!r.complete);
        assert_eq!(r.messages.iter().map(|k| k.id.seq).collect::<Vec<_>>(), [3]);
        assert!(h.recover("b", id(0), 0).complete, "b lost nothing");
        for _ in 0..1000 {
            put(&mut h, "c", &body, 0);
            assert!(h.stats().bytes as usize <= 2 * channel + 3 * one);
        }
    }

    #[test]
    fn with_nothing_kept_ids_still_come_and_only_the_latest_id_recovers() {
        let mut h = History::new(limits(0), EPOCH);
        let a = put(&mut h, "a", "x", 0);
        let b = put(&mut h, "b", "y", 0);
        assert_eq!((a, b), (id(1), id(2)));
        assert!(!h.recover("a", a, 0).complete, "b may have been a's");
        let r = h.recover("a", b, 0);
        assert!(r.complete && r.messages.is_empty());
        assert_eq!(h.stats().bytes, 0);
    }

    #[test]
    fn an_answer_too_big_for_one_record_keeps_its_newest_and_says_incomplete() {
        let mut h = History::new(limits(10), EPOCH);
        for i in 0..5 {
            put(&mut h, "a", &format!("{i}{i}{i}"), 0);
        }
        let mut r = h.recover("a", id(0), 0);
        assert!(r.complete);
        r.fit(5 * 13, 10);
        assert!(r.complete, "all five fit exactly");
        r.fit(2 * 13 + 12, 10);
        assert!(!r.complete);
        assert_eq!(bodies(&r), ["333", "444"]);
    }

    #[test]
    fn the_order_of_dropped_entries_stays_bounded() {
        let mut h = History::new(limits(2), EPOCH);
        for i in 0..10_000 {
            put(&mut h, "a", &i.to_string(), 0);
        }
        assert!(h.order.len() <= 2 * h.kept + 64, "{}", h.order.len());
        let r = h.recover("a", id(9_999), 0);
        assert!(r.complete);
        assert_eq!(bodies(&r), ["9999"]);
    }
}
