//! MQTT shared subscriptions across the nodes of one Redis (`--redis`),
//! sans I/O: which node's members a message goes to, so that it reaches
//! one member of its group in the whole deployment, not one on each node.
//!
//! Each node says on the Redis channel `<prefix>#shares` how many members
//! it has in each of its groups ([`announcement`]): at once when they
//! change (at most every [`ANNOUNCE_GAP_MS`]) and every second while it
//! has any.
//! Every node keeps what each node said (its own too, as it came back
//! through Redis) for [`FORGET_AFTER_MS`] after it last heard from it.
//! A message from Redis has a hash every node computes alike (its
//! channel, payload and seal; see [`crate::broker`]); for each group it
//! matches, the hash, mixed with the group, picks one of the group's
//! members in the whole deployment (each member as likely as another),
//! and only the node holding that member delivers it.
//!
//! Why a node applies its own announcement only when Redis hands it back:
//! without a Redis Cluster every node reads `#shares` and the messages on
//! one connection, in the order Redis took them, so every node changes
//! its view at the same message and all agree on each owner, even while
//! members come and go. On a Redis Cluster `#shares` lives on one shard
//! and the messages on others: for the few milliseconds an announcement
//! takes, two nodes may disagree (a message delivered twice, or not at
//! all). A node that stops answering is forgotten after
//! [`FORGET_AFTER_MS`]; until then its share of the messages is lost.

use std::collections::{BTreeMap, HashMap};

use bytes::{BufMut as _, Bytes, BytesMut};

/// The longest announcement: groups past it are not said (and their
/// messages are delivered by every node with members, as without Redis).
pub(crate) const MAX_ANNOUNCEMENT: usize = 64 * 1024;
/// How many nodes' announcements are kept: a node past it is ignored.
pub(crate) const MAX_NODES: usize = 256;
/// The least time between two announcements made for a change.
pub(crate) const ANNOUNCE_GAP_MS: u64 = 50;
/// A node not heard for this long is forgotten (it announces every
/// second while its link is up).
pub(crate) const FORGET_AFTER_MS: u64 = 5_000;
/// How often a node announces with nothing changed.
const ANNOUNCE_EVERY_MS: u64 = 1_000;

/// What one node said last.
struct Said {
    /// When (the receiver's clock, ms).
    heard_ms: u64,
    /// Its groups and members in each.
    groups: Vec<(String, u32)>,
}

/// Every node's members of the groups, as heard through Redis.
#[derive(Default)]
pub(crate) struct View {
    nodes: HashMap<u64, Said>,
    /// Group key: members by node (ordered, so every node walks them alike).
    by_key: HashMap<String, BTreeMap<u64, u32>>,
    /// This node's groups changed since its last announcement.
    dirty: bool,
    /// When this node last announced (ms).
    announced_ms: Option<u64>,
    /// Its last announcement named no group.
    said_none: bool,
    /// Announcements dropped as malformed or past [`MAX_NODES`].
    refused: u64,
}

impl View {
    /// This node's groups changed: announce soon.
    pub(crate) fn changed(&mut self) {
        self.dirty = true;
    }

    /// Whether an announcement is due at `now_ms` for a node with groups
    /// (`!none`) or none: soon after a change, and every second anyway,
    /// but once only while it has none (a node without shared
    /// subscriptions, most of them, says nothing every second).
    pub(crate) fn due(&mut self, now_ms: u64, none: bool) -> bool {
        let since = self
            .announced_ms
            .map_or(u64::MAX, |t| now_ms.saturating_sub(t));
        let due = (self.dirty && since >= ANNOUNCE_GAP_MS) || since >= ANNOUNCE_EVERY_MS;
        if !due || (none && self.said_none) {
            return false;
        }
        self.dirty = false;
        self.said_none = none;
        self.announced_ms = Some(now_ms);
        true
    }

    /// Node `node` (maybe this one) said `payload` at `now_ms`; false if
    /// it was malformed or one node too many (ignored).
    pub(crate) fn heard(&mut self, payload: &[u8], now_ms: u64) -> bool {
        let Some((node, groups)) = open(payload) else {
            self.refused += 1;
            return false;
        };
        if !self.nodes.contains_key(&node) && self.nodes.len() >= MAX_NODES {
            self.refused += 1;
            return false;
        }
        self.forget(node);
        for (key, n) in &groups {
            self.by_key.entry(key.clone()).or_default().insert(node, *n);
        }
        let heard_ms = now_ms;
        self.nodes.insert(node, Said { heard_ms, groups });
        true
    }

    /// Forgets the nodes not heard for [`FORGET_AFTER_MS`].
    pub(crate) fn expire(&mut self, now_ms: u64) {
        let old: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(_, s)| now_ms.saturating_sub(s.heard_ms) > FORGET_AFTER_MS)
            .map(|(n, _)| *n)
            .collect();
        for n in old {
            self.forget(n);
        }
    }

    fn forget(&mut self, node: u64) {
        let Some(said) = self.nodes.remove(&node) else {
            return;
        };
        for (key, _) in said.groups {
            if let Some(m) = self.by_key.get_mut(&key) {
                m.remove(&node);
                if m.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
    }

    /// Whether node `me` delivers the message of hash `spread` to group
    /// `key`: the member it picks is one of `me`'s. With no node known to
    /// have members (nothing heard yet), every node delivers to its own.
    pub(crate) fn mine(&self, key: &str, spread: u64, me: u64) -> bool {
        let Some(members) = self.by_key.get(key) else {
            return true;
        };
        let total: u64 = members.values().map(|&n| u64::from(n)).sum();
        if total == 0 {
            return true;
        }
        let mut at = mix(spread ^ hash(key.as_bytes())) % total;
        for (&node, &n) in members {
            if at < u64::from(n) {
                return node == me;
            }
            at -= u64::from(n);
        }
        false
    }

    /// Members of these groups on every node heard from (for `/metrics`).
    pub(crate) fn members<'a>(&self, keys: impl Iterator<Item = &'a String>) -> u64 {
        keys.filter_map(|k| self.by_key.get(k))
            .flat_map(|m| m.values())
            .map(|&n| u64::from(n))
            .sum()
    }

    /// Announcements ignored so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused
    }
}

/// What node `node` says of its `groups` (key, members): its tag, then
/// each group's members (4 bytes) and key (2-byte length, bytes), all
/// big-endian; groups past [`MAX_ANNOUNCEMENT`] are left out. The second
/// value: how many were.
pub(crate) fn announcement<'a>(
    node: u64,
    groups: impl Iterator<Item = (&'a str, u32)>,
) -> (Bytes, usize) {
    let mut out = BytesMut::with_capacity(64);
    out.put_u64(node);
    let mut left_out = 0;
    for (key, n) in groups {
        let Ok(len) = u16::try_from(key.len()) else {
            left_out += 1;
            continue;
        };
        if out.len() + 6 + key.len() > MAX_ANNOUNCEMENT {
            left_out += 1;
            continue;
        }
        out.put_u32(n);
        out.put_u16(len);
        out.put_slice(key.as_bytes());
    }
    (out.freeze(), left_out)
}

/// An announcement's node and groups; `None` if malformed.
fn open(payload: &[u8]) -> Option<(u64, Vec<(String, u32)>)> {
    if payload.len() > MAX_ANNOUNCEMENT {
        return None;
    }
    let (node, mut rest) = payload.split_first_chunk::<8>()?;
    let mut groups = Vec::new();
    while !rest.is_empty() {
        let (n, r) = rest.split_first_chunk::<4>()?;
        let (len, r) = r.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_be_bytes(*len));
        if r.len() < len {
            return None;
        }
        let key = std::str::from_utf8(&r[..len]).ok()?;
        groups.push((key.to_owned(), u32::from_be_bytes(*n)));
        rest = &r[len..];
    }
    Some((u64::from_be_bytes(*node), groups))
}

/// FNV-1a over `bytes`: the same on every node and build (std's hasher
/// may change between Rust versions, and nodes must agree).
pub(crate) fn hash(bytes: &[u8]) -> u64 {
    hash_more(0xcbf2_9ce4_8422_2325, bytes)
}

/// [`hash`] continued over more bytes.
pub(crate) fn hash_more(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Spreads a hash's bits (splitmix64's finish), so `% members` is even.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn say(v: &mut View, node: u64, groups: &[(&str, u32)], now: u64) {
        let (p, left_out) = announcement(node, groups.iter().copied());
        assert_eq!(left_out, 0);
        assert!(v.heard(&p, now));
    }

    #[test]
    fn every_node_picks_the_same_one_member_and_members_share_alike() {
        // Two nodes' views, fed the same announcements in the same order.
        let (mut a, mut b) = (View::default(), View::default());
        for v in [&mut a, &mut b] {
            say(v, 1, &[("g/t", 1), ("h/t", 2)], 0);
            say(v, 2, &[("g/t", 3)], 0);
        }
        let mut to = [0u32; 3];
        for spread in 0..4000u64 {
            let h = hash(&spread.to_be_bytes());
            let owners: Vec<u64> = [1, 2]
                .into_iter()
                .filter(|&n| a.mine("g/t", h, n))
                .collect();
            assert_eq!(owners.len(), 1, "exactly one node owns {spread}");
            assert!(b.mine("g/t", h, owners[0]), "and B agrees");
            to[owners[0] as usize] += 1;
            // A group only node 1 has members of: always node 1.
            assert!(a.mine("h/t", h, 1) && !a.mine("h/t", h, 2));
        }
        // One member on node 1, three on node 2: a quarter to node 1.
        assert!((800..1200).contains(&to[1]), "{to:?}");
        // A group nobody announced: every node delivers to its own.
        assert!(a.mine("x/t", 5, 1) && a.mine("x/t", 5, 2));
    }

    #[test]
    fn a_silent_node_is_forgotten_and_a_new_announcement_replaces_the_old() {
        let mut v = View::default();
        say(&mut v, 1, &[("g/t", 1)], 0);
        say(&mut v, 2, &[("g/t", 1)], 4_000);
        assert_eq!(v.members([String::from("g/t")].iter()), 2);
        v.expire(6_000);
        // Node 1 went silent: node 2 owns everything.
        assert!((0..50).all(|s| v.mine("g/t", hash(&[s]), 2)));
        // Node 2 left the group: nothing known, every node its own.
        say(&mut v, 2, &[], 6_000);
        assert_eq!(v.members([String::from("g/t")].iter()), 0);
        assert!(v.mine("g/t", 1, 9));
    }

    #[test]
    fn malformed_or_oversized_announcements_and_too_many_nodes_are_refused() {
        let mut v = View::default();
        for bad in [
            &b"short"[..],
            &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 9, b'x'],
        ] {
            assert!(!v.heard(bad, 0));
        }
        assert!(!v.heard(&vec![0; MAX_ANNOUNCEMENT + 1], 0));
        for n in 0..MAX_NODES as u64 {
            say(&mut v, n, &[("g/t", 1)], 0);
        }
        let (p, _) = announcement(u64::MAX, [("g/t", 1)].into_iter());
        assert!(!v.heard(&p, 0), "one node too many");
        assert_eq!(v.refused(), 4);
        // Groups past the bound are left out of an announcement.
        let big = "k".repeat(60_000);
        let (p, left_out) = announcement(1, [(big.as_str(), 1), (big.as_str(), 1)].into_iter());
        assert_eq!(left_out, 1);
        assert!(p.len() <= MAX_ANNOUNCEMENT);
    }

    #[test]
    fn announcements_are_due_after_a_change_and_every_second() {
        let mut v = View::default();
        assert!(v.due(0, false), "the first at once");
        assert!(!v.due(10, false));
        v.changed();
        assert!(!v.due(20, false), "within the gap: later");
        assert!(v.due(ANNOUNCE_GAP_MS, false));
        assert!(!v.due(ANNOUNCE_GAP_MS + 500, false));
        assert!(v.due(ANNOUNCE_GAP_MS + ANNOUNCE_EVERY_MS, false));
        // The last group gone: said once, then nothing while none.
        v.changed();
        let t = 3 * ANNOUNCE_EVERY_MS;
        assert!(v.due(t, true));
        assert!(!v.due(t + ANNOUNCE_EVERY_MS, true));
        assert!(!v.due(t + 10 * ANNOUNCE_EVERY_MS, true));
        v.changed();
        assert!(v.due(t + 11 * ANNOUNCE_EVERY_MS, false));
    }
}
