//! Redis Cluster without sockets: which slot a channel is in (CRC16 of
//! the key, or of its `{hash tag}`, mod 16384), which master serves each
//! slot (read from `CLUSTER SLOTS`), and what a `MOVED`/`ASK` refusal
//! says. The router in `super::router` acts on them.

use std::fmt;
use std::time::Instant;

use throng_proto::resp::Value;

/// Slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// CRC16/XMODEM (polynomial 0x1021, no reflection, initial 0): the one
/// Redis Cluster hashes keys and shard channels with.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of `key`: the hash of what is between the first `{` and the
/// next `}` when that is not empty (a hash tag puts keys together), else
/// of the whole key.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// A master's address, as the cluster announces it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl Addr {
    /// Reads `host:port` (the last colon splits, so an IPv6 address works).
    pub fn parse(s: &str) -> Option<Self> {
        let (host, port) = s.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        (!host.is_empty()).then_some(())?;
        Some(Self {
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// Which master serves each slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SlotMap {
    /// Per slot, an index into `masters` (`None`: no master serves it).
    owner: Vec<Option<u16>>,
    /// Every master, sorted.
    masters: Vec<Addr>,
}

/// A `CLUSTER SLOTS` reply that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The reply is not an array of `[start, end, [host, port, ..], ..]`.
    #[error("CLUSTER SLOTS answered something else: {0}")]
    Shape(String),
    /// No slot has a master (the cluster is not set up yet).
    #[error("the cluster serves no slot yet (was `redis-cli --cluster create` run?)")]
    Empty,
}

impl SlotMap {
    /// Reads a `CLUSTER SLOTS` reply. `seed` is the host of the node that
    /// answered: a master announced with an empty host is on it.
    pub(crate) fn from_slots(v: &Value, seed: &str) -> Result<Self, MapError> {
        let bad = || MapError::Shape(format!("{v:?}"));
        let Value::Array(Some(ranges)) = v else {
            return Err(bad());
        };
        let mut spans = Vec::with_capacity(ranges.len());
        for r in ranges {
            let Value::Array(Some(items)) = r else {
                return Err(bad());
            };
            let (Some(Value::Integer(start)), Some(Value::Integer(end)), Some(node)) =
                (items.first(), items.get(1), items.get(2))
            else {
                return Err(bad());
            };
            let addr = node_addr(node, seed).ok_or_else(bad)?;
            let (start, end) = (u16::try_from(*start), u16::try_from(*end));
            let (Ok(start), Ok(end)) = (start, end) else {
                return Err(bad());
            };
            if start > end || end >= SLOTS {
                return Err(bad());
            }
            spans.push((start, end, addr));
        }
        Self::from_spans(spans)
    }

    /// A map from `(first slot, last slot, master)` spans.
    pub(crate) fn from_spans(spans: Vec<(u16, u16, Addr)>) -> Result<Self, MapError> {
        let mut masters: Vec<Addr> = spans.iter().map(|s| s.2.clone()).collect();
        masters.sort();
        masters.dedup();
        if masters.is_empty() {
            return Err(MapError::Empty);
        }
        let mut owner = vec![None; usize::from(SLOTS)];
        for (start, end, addr) in spans {
            let i = masters
                .binary_search(&addr)
                .ok()
                .and_then(|i| u16::try_from(i).ok());
            for s in start..=end {
                owner[usize::from(s)] = i;
            }
        }
        Ok(Self { owner, masters })
    }

    /// Every master, sorted.
    pub(crate) fn masters(&self) -> &[Addr] {
        &self.masters
    }

    /// The master that serves `slot`.
    pub(crate) fn master(&self, slot: u16) -> Option<&Addr> {
        let i = (*self.owner.get(usize::from(slot))?)?;
        self.masters.get(usize::from(i))
    }

    /// A `MOVED` says `slot` is served by `addr` now.
    pub(crate) fn moved(&mut self, slot: u16, addr: Addr) {
        let i = match self.masters.binary_search(&addr) {
            Ok(i) => i,
            Err(i) => {
                self.masters.insert(i, addr);
                // Every index at or past the new one shifts by one.
                for o in self.owner.iter_mut().flatten() {
                    if usize::from(*o) >= i {
                        *o += 1;
                    }
                }
                i
            }
        };
        if let Some(o) = self.owner.get_mut(usize::from(slot)) {
            *o = u16::try_from(i).ok();
        }
    }

    /// Slots no master serves.
    pub(crate) fn unserved(&self) -> usize {
        self.owner.iter().filter(|o| o.is_none()).count()
    }
}

/// The master of a slot range: `[host, port, id, ...]`.
fn node_addr(node: &Value, seed: &str) -> Option<Addr> {
    let Value::Array(Some(items)) = node else {
        return None;
    };
    let host = items.first()?.as_bytes()?;
    let host = std::str::from_utf8(host).ok()?;
    let Value::Integer(port) = items.get(1)? else {
        return None;
    };
    Some(Addr {
        host: if host.is_empty() { seed } else { host }.to_owned(),
        port: u16::try_from(*port).ok()?,
    })
}

/// One shard as `/healthz` and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardState {
    /// The master's address.
    pub(crate) addr: String,
    /// Its link works and its subscriptions are confirmed.
    pub(crate) up: bool,
    /// Why it is down (empty when up).
    pub(crate) reason: String,
    /// Since when it is in this state.
    pub(crate) since: Instant,
}

/// A refusal that names where a slot is served: `MOVED <slot> <host:port>`
/// (for good: update the map) or `ASK <slot> <host:port>` (this one
/// command, after `ASKING`, while the slot migrates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Redirect {
    /// `ASK` rather than `MOVED`.
    pub(crate) ask: bool,
    /// The slot in question.
    pub(crate) slot: u16,
    /// Where to go.
    pub(crate) to: Addr,
}

impl Redirect {
    /// Reads an error reply's text; `None` when it is no redirect.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let mut words = text.split_ascii_whitespace();
        let ask = match words.next()? {
            "MOVED" => false,
            "ASK" => true,
            _ => return None,
        };
        let slot = words.next()?.parse().ok().filter(|s| *s < SLOTS)?;
        let to = Addr::parse(words.next()?)?;
        Some(Self { ask, slot, to })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // Values redis-cli's CLUSTER KEYSLOT gives.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"throng:news"), slot(b"throng:news"));
        // A hash tag: only what is inside counts; an empty one does not.
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"a{news}b"), slot(b"news"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    fn bulk(s: &str) -> Value {
        Value::Bulk(Some(Bytes::copy_from_slice(s.as_bytes())))
    }

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        let node = Value::Array(Some(vec![bulk(host), Value::Integer(port), bulk("id")]));
        Value::Array(Some(vec![Value::Integer(start), Value::Integer(end), node]))
    }

    #[test]
    fn a_slots_reply_maps_every_slot_to_its_master() {
        let v = Value::Array(Some(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "127.0.0.1", 7001),
            range(10923, 16383, "", 7002),
        ]));
        let mut m = SlotMap::from_slots(&v, "10.0.0.9").unwrap();
        assert_eq!(m.masters().len(), 3);
        assert_eq!(m.master(0).unwrap().to_string(), "127.0.0.1:7000");
        assert_eq!(m.master(5461).unwrap().to_string(), "127.0.0.1:7001");
        assert_eq!(m.master(16383).unwrap().to_string(), "10.0.0.9:7002");
        assert_eq!(m.unserved(), 0);
        // A MOVED to a master not seen yet: that slot only.
        m.moved(5461, Addr::parse("127.0.0.1:6999").unwrap());
        assert_eq!(m.master(5461).unwrap().port, 6999);
        assert_eq!(m.master(5462).unwrap().port, 7001);
        assert_eq!(m.master(0).unwrap().port, 7000);
        assert_eq!(m.master(16383).unwrap().port, 7002);
        let part = Value::Array(Some(vec![range(0, 99, "h", 1)]));
        assert_eq!(SlotMap::from_slots(&part, "s").unwrap().unserved(), 16284);
        assert_eq!(
            SlotMap::from_slots(&Value::Array(Some(vec![])), "s"),
            Err(MapError::Empty)
        );
        assert!(SlotMap::from_slots(&bulk("x"), "s").is_err());
        let past = Value::Array(Some(vec![range(0, 16384, "h", 1)]));
        assert!(SlotMap::from_slots(&past, "s").is_err());
    }

    #[test]
    fn redirects_read() {
        assert_eq!(
            Redirect::parse("MOVED 13683 127.0.0.1:7002"),
            Some(Redirect {
                ask: false,
                slot: 13683,
                to: Addr::parse("127.0.0.1:7002").unwrap()
            })
        );
        let ask = Redirect::parse("ASK 1 [::1]:7000").unwrap();
        assert!(ask.ask);
        assert_eq!(ask.to.host, "::1");
        assert_eq!(Redirect::parse("ERR unknown command"), None);
        assert_eq!(Redirect::parse("MOVED 16384 h:1"), None);
        assert_eq!(Redirect::parse("MOVED 1 nowhere"), None);
    }
}
