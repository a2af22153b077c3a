//! Limits per client address (`--max-connections-per-ip`,
//! `--handshakes-per-ip`), counted by the supervisor over every worker:
//! the kernel spreads one address's connections over all of them, so only
//! the supervisor sees them all. A worker asks before it serves a new
//! connection and says when one ends; `Addresses` is that bookkeeping,
//! without sockets or a clock of its own (the caller passes `now`).
//!
//! An address is an IPv4 address, or the /64 of an IPv6 one (a host is
//! usually given a whole /64, so counting single IPv6 addresses would let
//! one host open as many connections as it likes). An IPv4-mapped IPv6
//! address counts as its IPv4 address.
//!
//! The table holds an address only while it has connections or a bucket
//! still refilling after recent handshakes; [`Addresses::prune`] drops the
//! rest, and it never holds more than [`MAX_ADDRESSES`], so a flood from
//! many addresses costs bounded memory.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::config::PerAddress;

/// The most addresses the table holds (about 64 MiB at worst); past it a
/// new address is refused (`503`) until older ones leave.
pub const MAX_ADDRESSES: usize = 1 << 20;

/// A client address as the limits count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 address.
    V4([u8; 4]),
    /// The first 64 bits of an IPv6 address.
    V6([u8; 8]),
}

impl Source {
    /// The source a peer address counts under.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::V4(v4.octets()),
                None => {
                    let o = v6.octets();
                    Self::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
                }
            },
        }
    }

    /// Appends its record encoding: a tag byte (4 or 6) and the bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::V4(b) => {
                out.push(4);
                out.extend_from_slice(b);
            }
            Self::V6(b) => {
                out.push(6);
                out.extend_from_slice(b);
            }
        }
    }

    /// Reads one [`encode`](Self::encode)d source off the front of `buf`;
    /// returns it and the bytes it took.
    pub fn decode(buf: &[u8]) -> Option<(Self, usize)> {
        match buf.split_first()? {
            (4, rest) => Some((Self::V4(rest.get(..4)?.try_into().ok()?), 5)),
            (6, rest) => Some((Self::V6(rest.get(..8)?.try_into().ok()?), 9)),
            _ => None,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::V4(b) => write!(f, "{}", Ipv4Addr::from(b)),
            Self::V6(b) => {
                let mut all = [0u8; 16];
                all[..8].copy_from_slice(&b);
                write!(f, "{}/64", Ipv6Addr::from(all))
            }
        }
    }
}

/// What the supervisor answers a worker about a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it.
    Admit,
    /// The address holds `--max-connections-per-ip` already (429).
    TooMany,
    /// The address opened connections faster than `--handshakes-per-ip`
    /// allows (429); a token is back after this many seconds.
    TooFast {
        /// Seconds until the next connection would be admitted (at least 1).
        retry_after: u32,
    },
    /// The table is full of other addresses (503).
    Full,
}

impl Verdict {
    /// The `reason` label of `throng_refused_total` (`None`: admitted).
    pub fn label(self) -> Option<&'static str> {
        match self {
            Self::Admit => None,
            Self::TooMany => Some("per_ip_connections"),
            Self::TooFast { .. } => Some("per_ip_rate"),
            Self::Full => Some("address_table_full"),
        }
    }

    /// Its record encoding: a code and the retry-after seconds.
    pub fn code(self) -> (u8, u32) {
        match self {
            Self::Admit => (0, 0),
            Self::TooMany => (1, 0),
            Self::TooFast { retry_after } => (2, retry_after),
            Self::Full => (3, 0),
        }
    }

    /// The verdict of a record's code (an unknown code admits: the
    /// supervisor and its workers are one binary).
    pub fn from_code(code: u8, retry_after: u32) -> Self {
        match code {
            1 => Self::TooMany,
            2 => Self::TooFast { retry_after },
            3 => Self::Full,
            _ => Self::Admit,
        }
    }
}

/// One address in the table.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Its open connections over all workers.
    conns: u32,
    /// Handshake tokens left (at most the burst).
    tokens: f64,
    /// When `tokens` was last brought up to date, in the caller's seconds.
    at: f64,
}

/// Every address with connections or recent handshakes, and what each
/// worker holds (so a dead worker's connections can be given back).
#[derive(Debug)]
pub struct Addresses {
    limits: PerAddress,
    entries: HashMap<Source, Entry>,
    /// Per worker slot: its open connections by address.
    held: Vec<HashMap<Source, u32>>,
    max_entries: usize,
}

impl Addresses {
    /// An empty table for `workers` workers under `limits`.
    pub fn new(limits: PerAddress, workers: usize) -> Self {
        Self {
            limits,
            entries: HashMap::new(),
            held: vec![HashMap::new(); workers],
            max_entries: MAX_ADDRESSES,
        }
    }

    /// Addresses in the table now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn burst(&self) -> f64 {
        f64::from(self.limits.handshake_burst.max(1))
    }

    /// Brings `e`'s bucket up to `now`.
    fn refill(&self, e: &mut Entry, now: f64) {
        if let Some(rate) = self.limits.handshakes_per_sec {
            e.tokens = (e.tokens + (now - e.at).max(0.0) * rate).min(self.burst());
        }
        e.at = now;
    }

    /// A new connection from `source` on `worker` at `now` (seconds): its
    /// handshake takes a token, then it must fit under the connection limit.
    pub fn admit(&mut self, worker: usize, source: Source, now: f64) -> Verdict {
        if !self.entries.contains_key(&source) && self.entries.len() >= self.max_entries {
            self.prune(now);
            if self.entries.len() >= self.max_entries {
                return Verdict::Full;
            }
        }
        let burst = self.burst();
        let mut e = *self.entries.entry(source).or_insert(Entry {
            conns: 0,
            tokens: burst,
            at: now,
        });
        self.refill(&mut e, now);
        let verdict = if let Some(rate) = self.limits.handshakes_per_sec
            && e.tokens < 1.0
        {
            let wait = ((1.0 - e.tokens) / rate).ceil();
            Verdict::TooFast {
                retry_after: (wait as u32).max(1),
            }
        } else {
            if self.limits.handshakes_per_sec.is_some() {
                e.tokens -= 1.0;
            }
            if self
                .limits
                .max_connections
                .is_some_and(|max| e.conns >= max)
            {
                Verdict::TooMany
            } else {
                e.conns += 1;
                if let Some(held) = self.held.get_mut(worker) {
                    *held.entry(source).or_default() += 1;
                }
                Verdict::Admit
            }
        };
        self.entries.insert(source, e);
        if verdict != Verdict::Admit {
            self.forget_if_idle(source, now);
        }
        verdict
    }

    /// A connection `worker` admitted from `source` ended.
    pub fn release(&mut self, worker: usize, source: Source, now: f64) {
        let Some(held) = self.held.get_mut(worker) else {
            return;
        };
        match held.get_mut(&source) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                held.remove(&source);
            }
            // Not this worker's (a record from before a restart): nothing to give back.
            None => return,
        }
        if let Some(e) = self.entries.get_mut(&source) {
            e.conns = e.conns.saturating_sub(1);
        }
        self.forget_if_idle(source, now);
    }

    /// Worker `worker` is gone, and its connections with it.
    pub fn worker_gone(&mut self, worker: usize, now: f64) {
        let Some(held) = self.held.get_mut(worker) else {
            return;
        };
        for (source, n) in std::mem::take(held) {
            if let Some(e) = self.entries.get_mut(&source) {
                e.conns = e.conns.saturating_sub(n);
            }
            self.forget_if_idle(source, now);
        }
    }

    /// Drops `source` if it has no connection and a full bucket.
    fn forget_if_idle(&mut self, source: Source, now: f64) {
        let Some(mut e) = self.entries.get(&source).copied() else {
            return;
        };
        self.refill(&mut e, now);
        if e.conns == 0 && e.tokens >= self.burst() {
            self.entries.remove(&source);
        } else {
            self.entries.insert(source, e);
        }
    }

    /// Drops every address with no connection whose bucket has refilled:
    /// the table holds only live and recent addresses.
    pub fn prune(&mut self, now: f64) {
        let burst = self.burst();
        let rate = self.limits.handshakes_per_sec;
        self.entries.retain(|_, e| {
            let tokens = match rate {
                Some(r) => (e.tokens + (now - e.at).max(0.0) * r).min(burst),
                None => burst,
            };
            e.conns > 0 || tokens < burst
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Source = Source::V4([127, 0, 0, 2]);
    const B: Source = Source::V4([127, 0, 0, 3]);

    fn limits(max: Option<u32>, rate: Option<f64>, burst: u32) -> PerAddress {
        PerAddress {
            max_connections: max,
            handshakes_per_sec: rate,
            handshake_burst: burst,
        }
    }

    #[test]
    fn ipv6_counts_by_64_and_mapped_ipv4_as_ipv4() {
        let a = Source::of("2001:db8:1:2:aaaa::1".parse().unwrap());
        let b = Source::of("2001:db8:1:2:bbbb::9".parse().unwrap());
        let c = Source::of("2001:db8:1:3::1".parse().unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_eq!(
            Source::of("::ffff:10.0.0.1".parse().unwrap()),
            Source::V4([10, 0, 0, 1])
        );
        for s in [a, A] {
            let mut out = vec![];
            s.encode(&mut out);
            out.push(0xee);
            assert_eq!(Source::decode(&out), Some((s, out.len() - 1)));
        }
        assert_eq!(Source::decode(&[4, 1, 2]), None);
        assert_eq!(Source::decode(&[5, 1, 2, 3, 4]), None);
    }

    #[test]
    fn the_n_plus_first_connection_of_an_address_is_refused_over_all_workers() {
        let mut t = Addresses::new(limits(Some(3), None, 0), 2);
        assert_eq!(t.admit(0, A, 0.0), Verdict::Admit);
        assert_eq!(t.admit(1, A, 0.0), Verdict::Admit);
        assert_eq!(t.admit(1, A, 0.0), Verdict::Admit);
        assert_eq!(t.admit(0, A, 0.0), Verdict::TooMany);
        assert_eq!(
            t.admit(0, B, 0.0),
            Verdict::Admit,
            "another address is not affected"
        );
        t.release(1, A, 0.0);
        assert_eq!(t.admit(0, A, 0.0), Verdict::Admit);
        // A release for a connection this worker never had changes nothing.
        t.release(1, B, 0.0);
        assert_eq!(t.admit(0, A, 0.0), Verdict::TooMany);
    }

    #[test]
    fn a_dead_workers_connections_are_given_back() {
        let mut t = Addresses::new(limits(Some(2), None, 0), 2);
        assert_eq!(t.admit(0, A, 0.0), Verdict::Admit);
        assert_eq!(t.admit(1, A, 0.0), Verdict::Admit);
        assert_eq!(t.admit(0, A, 0.0), Verdict::TooMany);
        t.worker_gone(0, 0.0);
        assert_eq!(t.admit(1, A, 0.0), Verdict::Admit);
        t.worker_gone(1, 0.0);
        assert!(t.is_empty());
    }

    #[test]
    fn handshakes_take_tokens_that_come_back_at_the_rate() {
        let mut t = Addresses::new(limits(None, Some(2.0), 3), 1);
        for _ in 0..3 {
            assert_eq!(t.admit(0, A, 10.0), Verdict::Admit);
        }
        assert_eq!(t.admit(0, A, 10.0), Verdict::TooFast { retry_after: 1 });
        assert_eq!(t.admit(0, B, 10.0), Verdict::Admit);
        assert_eq!(
            t.admit(0, A, 10.5),
            Verdict::Admit,
            "one token back after 0.5 s"
        );
        assert_eq!(t.admit(0, A, 10.5), Verdict::TooFast { retry_after: 1 });
        let mut slow = Addresses::new(limits(None, Some(0.1), 1), 1);
        assert_eq!(slow.admit(0, A, 0.0), Verdict::Admit);
        assert_eq!(slow.admit(0, A, 1.0), Verdict::TooFast { retry_after: 9 });
    }

    #[test]
    fn the_table_keeps_only_live_and_recent_addresses_and_has_a_ceiling() {
        let mut t = Addresses::new(limits(Some(5), Some(10.0), 5), 1);
        let many = |i: u32| Source::V4((0x7f00_0000 + i).to_be_bytes());
        for i in 0..5000 {
            assert_eq!(t.admit(0, many(i), 0.0), Verdict::Admit);
            t.release(0, many(i), 0.0);
        }
        assert_eq!(t.len(), 5000, "each bucket is still refilling");
        t.prune(0.05);
        assert_eq!(t.len(), 5000);
        t.prune(0.1);
        assert_eq!(t.len(), 0, "a tenth of a second later every bucket is full");
        // With live connections an address stays.
        assert_eq!(t.admit(0, A, 1.0), Verdict::Admit);
        t.prune(100.0);
        assert_eq!(t.len(), 1);
        // Without a rate an address leaves with its last connection.
        let mut c = Addresses::new(limits(Some(1), None, 0), 1);
        assert_eq!(c.admit(0, A, 0.0), Verdict::Admit);
        assert_eq!(c.admit(0, A, 0.0), Verdict::TooMany);
        c.release(0, A, 0.0);
        assert!(c.is_empty());
        // A full table refuses new addresses, not known ones.
        let mut full = Addresses::new(limits(Some(9), None, 0), 1);
        full.max_entries = 2;
        assert_eq!(full.admit(0, A, 0.0), Verdict::Admit);
        assert_eq!(full.admit(0, B, 0.0), Verdict::Admit);
        assert_eq!(full.admit(0, many(9), 0.0), Verdict::Full);
        assert_eq!(full.admit(0, A, 0.0), Verdict::Admit);
        full.release(0, B, 0.0);
        assert_eq!(full.admit(0, many(9), 0.0), Verdict::Admit);
    }
}
