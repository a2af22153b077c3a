//! The fan-out spread of messages the harness did not publish: a server
//! that pushes on its own (the time to every client each minute) sends one
//! message to many subscribers, and how long the last of them waited after
//! the first is its fan-out's spread.
//!
//! Each `hold` worker notes, per message identity ([`MessageId`]: the
//! server's sequence number, else its send-time stamp, else a hash of its
//! bytes), how many of its connections received it and when the first and
//! the last did ([`Arrivals`]). Workers say theirs once, at their end, in a
//! [`KIND`] event; adding them (counts summed, the earliest first, the
//! latest last) is exact whatever process or machine each delivery was seen
//! in, so a message received by workers of three agents has one spread.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::interval::{HistStats, new_histogram};

/// The kind of the event a worker ends with, holding its arrivals.
pub const KIND: &str = "worker.arrivals";

/// The most messages a worker or a merge tells apart; arrivals of further
/// messages are counted as untallied (memory stays bounded: some 50 bytes a message).
pub const MAX_MESSAGES: usize = 100_000;

/// How the event's text starts: what its numbers are.
const HEAD: &str = "arrivals per server message (id count first_ns last_ns), untallied ";

/// What makes two deliveries the same message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MessageId {
    /// The server's own sequence number (a JSON `seq`).
    Seq(u64),
    /// The send time it holds, ns since the epoch (`--stamp`).
    Stamp(u64),
    /// A hash of its bytes ([`hash`]), for a message with neither.
    Hash(u64),
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Seq(n) => write!(f, "s{n}"),
            Self::Stamp(n) => write!(f, "t{n}"),
            Self::Hash(n) => write!(f, "h{n}"),
        }
    }
}

impl std::str::FromStr for MessageId {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        let (tag, n) = text.split_at_checked(1).ok_or(())?;
        let n: u64 = n.parse().map_err(|_| ())?;
        match tag {
            "s" => Ok(Self::Seq(n)),
            "t" => Ok(Self::Stamp(n)),
            "h" => Ok(Self::Hash(n)),
            _ => Err(()),
        }
    }
}

/// FNV-1a of a message's bytes: the same in every process and on every
/// machine (a per-process random hash would make one message many).
pub fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One message's deliveries: how many, and when the first and the last
/// came (wall clock, ns since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrivals {
    /// Deliveries.
    pub count: u64,
    /// The first delivery.
    pub first_ns: u64,
    /// The last delivery.
    pub last_ns: u64,
}

impl Arrivals {
    /// From the first delivery to the last, ns.
    pub fn spread_ns(&self) -> u64 {
        self.last_ns.saturating_sub(self.first_ns)
    }

    fn add(&mut self, other: Self) {
        self.count += other.count;
        self.first_ns = self.first_ns.min(other.first_ns);
        self.last_ns = self.last_ns.max(other.last_ns);
    }
}

/// Arrivals per message, mergeable exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spread {
    messages: BTreeMap<MessageId, Arrivals>,
    /// Deliveries of messages past [`MAX_MESSAGES`].
    untallied: u64,
}

/// The spread of a run's server messages, for summaries.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SpreadStats {
    /// Messages told apart.
    pub messages: u64,
    /// Their deliveries.
    pub deliveries: u64,
    /// The spread (first to last subscriber) over the messages, µs.
    pub spread_us: HistStats,
    /// The message with the widest spread (`s<seq>`, `t<stamp_ns>`, `h<hash>`).
    pub widest: String,
    /// Its deliveries.
    pub widest_deliveries: u64,
    /// Deliveries of messages not told apart (past the limit).
    pub untallied: u64,
}

impl Spread {
    /// Message `id` arrived at one connection at `at_ns`.
    pub fn arrived(&mut self, id: MessageId, at_ns: u64) {
        self.add(
            id,
            Arrivals {
                count: 1,
                first_ns: at_ns,
                last_ns: at_ns,
            },
        );
    }

    /// Adds another count of message `id`'s deliveries.
    pub fn add(&mut self, id: MessageId, a: Arrivals) {
        if let Some(m) = self.messages.get_mut(&id) {
            m.add(a);
        } else if self.messages.len() < MAX_MESSAGES {
            self.messages.insert(id, a);
        } else {
            self.untallied += a.count;
        }
    }

    /// Whether nothing arrived.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.untallied == 0
    }

    /// One message's arrivals.
    pub fn get(&self, id: MessageId) -> Option<Arrivals> {
        self.messages.get(&id).copied()
    }

    /// The text of a [`KIND`] event: plain words and numbers
    /// (`...untallied 0: t1795320185000000000 3 100 250; s2 ...`).
    pub fn to_text(&self) -> String {
        let mut out = format!("{HEAD}{}:", self.untallied);
        for (i, (id, a)) in self.messages.iter().enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            let _ = write!(out, "{sep}{id} {} {} {}", a.count, a.first_ns, a.last_ns);
        }
        out
    }

    /// Adds the arrivals a [`KIND`] event's text holds; `false` (and
    /// nothing added) for any other text.
    pub fn add_text(&mut self, text: &str) -> bool {
        let Some(parsed) = parse(text) else {
            return false;
        };
        self.untallied += parsed.untallied;
        for (id, a) in parsed.messages {
            self.add(id, a);
        }
        true
    }

    /// The run's figures; `None` when nothing arrived.
    pub fn stats(&self) -> Option<SpreadStats> {
        if self.is_empty() {
            return None;
        }
        let mut h = new_histogram();
        for a in self.messages.values() {
            h.saturating_record(a.spread_ns() / 1_000);
        }
        let widest = self
            .messages
            .iter()
            .max_by_key(|(id, a)| (a.spread_ns(), std::cmp::Reverse(**id)));
        Some(SpreadStats {
            messages: self.messages.len() as u64,
            deliveries: self.messages.values().map(|a| a.count).sum(),
            spread_us: HistStats::of(&h),
            widest: widest.map(|(id, _)| id.to_string()).unwrap_or_default(),
            widest_deliveries: widest.map_or(0, |(_, a)| a.count),
            untallied: self.untallied,
        })
    }
}

/// The arrivals of a [`KIND`] event's text, or `None`.
fn parse(text: &str) -> Option<Spread> {
    let rest = text.strip_prefix(HEAD)?;
    let (untallied, list) = rest.split_once(':')?;
    let mut out = Spread {
        messages: BTreeMap::new(),
        untallied: untallied.parse().ok()?,
    };
    for entry in list.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let mut words = entry.split(' ');
        let id: MessageId = words.next()?.parse().ok()?;
        let mut n = || words.next().and_then(|w| w.parse::<u64>().ok());
        let (count, first_ns, last_ns) = (n()?, n()?, n()?);
        if words.next().is_some() || first_ns > last_ns {
            return None;
        }
        out.add(
            id,
            Arrivals {
                count,
                first_ns,
                last_ns,
            },
        );
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One message seen by three workers (two of them on another machine)
    /// has one spread: from the earliest arrival anywhere to the latest.
    #[test]
    fn workers_add_up_to_one_spread_per_message() {
        let tick = MessageId::Stamp(1_795_320_185_000_000_000);
        let mut workers = [Spread::default(), Spread::default(), Spread::default()];
        workers[0].arrived(tick, 1_000);
        workers[0].arrived(tick, 1_500);
        workers[1].arrived(tick, 900);
        workers[2].arrived(tick, 4_000);
        workers[2].arrived(MessageId::Seq(2), 5_000);
        let mut merged = Spread::default();
        for w in &workers {
            assert!(merged.add_text(&w.to_text()));
        }
        assert_eq!(
            merged.get(tick),
            Some(Arrivals {
                count: 4,
                first_ns: 900,
                last_ns: 4_000
            })
        );
        let stats = merged.stats().unwrap();
        assert_eq!(stats.messages, 2);
        assert_eq!(stats.deliveries, 5);
        assert_eq!(stats.widest, tick.to_string());
        assert_eq!(stats.widest_deliveries, 4);
        // Adding in another order gives the same.
        let mut other = Spread::default();
        for w in workers.iter().rev() {
            assert!(other.add_text(&w.to_text()));
        }
        assert_eq!(other, merged);
    }

    #[test]
    fn the_text_reads_back_and_nothing_else_does() {
        let mut s = Spread::default();
        s.arrived(MessageId::Hash(hash(b"tick")), 7);
        s.arrived(MessageId::Seq(3), 9);
        s.untallied = 4;
        let text = s.to_text();
        let mut back = Spread::default();
        assert!(back.add_text(&text), "{text}");
        assert_eq!(back, s);
        let mut empty = Spread::default();
        assert!(empty.add_text(&Spread::default().to_text()));
        assert!(empty.is_empty() && empty.stats().is_none());
        for bad in [
            "150 connections attempted",
            &text.replace("s3", "x3"),
            &text.replace(" 9 9", " 9"),
            &text.replace(" 9 9", " 10 9"),
            &text.replace("untallied 4", "untallied -4"),
        ] {
            let mut m = Spread::default();
            assert!(!m.add_text(bad), "{bad}");
            assert!(m.is_empty());
        }
    }

    #[test]
    fn messages_past_the_limit_are_counted_not_kept() {
        let mut s = Spread::default();
        for n in 0..MAX_MESSAGES as u64 + 3 {
            s.arrived(MessageId::Seq(n), n);
        }
        s.arrived(MessageId::Seq(0), 50);
        let stats = s.stats().unwrap();
        assert_eq!(stats.messages, MAX_MESSAGES as u64);
        assert_eq!(stats.untallied, 3);
        assert_eq!(s.get(MessageId::Seq(0)).unwrap().count, 2);
    }

    #[test]
    fn hashes_are_the_same_everywhere() {
        // FNV-1a's published value for "a": a process-random hash would differ.
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(hash(b"tick 1"), hash(b"tick 2"));
    }
}
