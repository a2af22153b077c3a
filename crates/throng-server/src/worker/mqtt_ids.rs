//! The MQTT client ids a worker's connections hold, for takeover: a
//! CONNECT with a client id already connected closes the older connection
//! (MQTT-3.1.4-2), on this worker at once and on the node's other workers
//! through the supervisor. Sans I/O: ids by hash to slots, and back.
//!
//! An id is kept as its 64-bit hash (SipHash with fixed keys, the same in
//! every worker process), so a connection costs two table entries and no
//! copy of its id; two ids with one hash would take each other over, at
//! odds of one in 2^64 per pair.
//!
//! Claims are ordered by their [`Claim`]: the time taken just before the
//! CONNACK went out (a client's next CONNECT comes after it), then the
//! worker. The later claim wins wherever the records meet: the supervisor
//! relays a claim some time after it was made, so a record may find a
//! newer connection here (left alone: the other worker closes its own when
//! ours reaches it), or arrive before the older connection it takes over
//! is registered here (kept a while, so that connection is closed as it
//! registers).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::control::Claim;

/// The hash a client id is known by on every worker of a node.
pub(crate) fn hash(client_id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    client_id.hash(&mut h);
    // 0 marks a slot with no id.
    h.finish().max(1)
}

/// What a connection's claim of its client id means for this worker.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// It holds the id; nothing else here did.
    First,
    /// It holds the id; the connection in this slot did and is closed.
    Replaced(u32),
    /// A later claim (on another worker) holds the id already: this
    /// connection is the one taken over.
    Superseded,
}

/// The client ids of one worker's MQTT connections.
pub(crate) struct ClientIds {
    /// A client id's hash: the slot of the connection that holds it, and
    /// when that connection claimed it.
    by_hash: HashMap<u64, (u32, Claim)>,
    /// By slot: the hash of its connection's client id, 0 for none.
    by_slot: Vec<u64>,
    /// Other workers' claims, latest per id, kept for `window_ns` after
    /// they were made: the longest a claim of this worker can take from
    /// its time to its registration here (the CONNACK write's timeout).
    elsewhere: HashMap<u64, Claim>,
    window_ns: u64,
    /// `elsewhere`'s size after its last pruning: pruned again at twice
    /// that, so pruning costs O(1) per record.
    pruned_at: usize,
}

impl ClientIds {
    /// With `window_ns`, the longest a claim may take to register.
    pub(crate) fn new(window_ns: u64) -> Self {
        Self {
            by_hash: HashMap::new(),
            by_slot: Vec::new(),
            elsewhere: HashMap::new(),
            window_ns,
            pruned_at: 0,
        }
    }

    /// The connection in `slot` claimed the id `hash` at `claim`.
    pub(crate) fn claim(&mut self, hash: u64, slot: u32, claim: Claim) -> Claimed {
        if slot == u32::MAX {
            // A connection that ended before it had a slot (NONE) holds
            // nothing: never size the table by it (a 32 GiB resize).
            return Claimed::Superseded;
        }
        if self.elsewhere.get(&hash).is_some_and(|&c| c > claim) {
            return Claimed::Superseded;
        }
        if let Some(&(held, at)) = self.by_hash.get(&hash)
            && held != slot
            && at > claim
        {
            return Claimed::Superseded;
        }
        let at = slot as usize;
        if self.by_slot.len() <= at {
            self.by_slot.resize(at + 1, 0);
        }
        self.by_slot[at] = hash;
        let before = self
            .by_hash
            .insert(hash, (slot, claim))
            .map(|(s, _)| s)
            .filter(|&s| s != slot);
        match before {
            Some(s) => {
                if let Some(h) = self.by_slot.get_mut(s as usize) {
                    *h = 0;
                }
                Claimed::Replaced(s)
            }
            None => Claimed::First,
        }
    }

    /// Another worker's connection claimed id `hash` at `theirs`: the slot
    /// of the one here that held it, to close, if its claim is the older.
    pub(crate) fn take(&mut self, hash: u64, theirs: Claim) -> Option<u32> {
        self.remember(hash, theirs);
        let &(slot, ours) = self.by_hash.get(&hash)?;
        if ours >= theirs {
            // Ours came later: the other worker closes its connection
            // when our claim reaches it.
            return None;
        }
        self.by_hash.remove(&hash);
        if let Some(h) = self.by_slot.get_mut(slot as usize) {
            *h = 0;
        }
        Some(slot)
    }

    fn remember(&mut self, hash: u64, theirs: Claim) {
        let latest = self.elsewhere.entry(hash).or_insert(theirs);
        *latest = (*latest).max(theirs);
        if self.elsewhere.len() >= (2 * self.pruned_at).max(1024) {
            // Claims arrive about in time order: the newest one seen
            // dates the window.
            let newest = self.elsewhere.values().map(|c| c.at_ns).max().unwrap_or(0);
            let since = newest.saturating_sub(self.window_ns);
            self.elsewhere.retain(|_, c| c.at_ns >= since);
            self.pruned_at = self.elsewhere.len();
        }
    }

    /// The connection in `slot` ended.
    pub(crate) fn release(&mut self, slot: u32) {
        let Some(h) = self.by_slot.get_mut(slot as usize) else {
            return;
        };
        let hash = std::mem::take(h);
        if hash != 0 && self.by_hash.get(&hash).map(|&(s, _)| s) == Some(slot) {
            self.by_hash.remove(&hash);
        }
    }

    /// Client ids held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_hash.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{Claim, Claimed, ClientIds, hash};

    fn at(at_ns: u64, worker: u32) -> Claim {
        Claim { at_ns, worker }
    }

    #[test]
    fn a_second_claim_names_the_first_and_an_ended_connection_frees_its_id() {
        let mut ids = ClientIds::new(1_000);
        let (a, b) = (hash("sensor-1"), hash("sensor-2"));
        assert_ne!(a, b);
        assert_eq!(a, hash("sensor-1"), "the same in every process");
        assert_eq!(ids.claim(a, 3, at(10, 0)), Claimed::First);
        assert_eq!(ids.claim(b, 4, at(11, 0)), Claimed::First);
        assert_eq!(ids.claim(a, 7, at(12, 0)), Claimed::Replaced(3));
        ids.release(3);
        assert_eq!(ids.len(), 2, "the old slot no longer holds it");
        assert_eq!(ids.take(a, at(13, 1)), Some(7), "taken over elsewhere");
        assert_eq!(ids.take(a, at(14, 1)), None);
        ids.release(7);
        ids.release(4);
        assert_eq!(ids.len(), 0);
        ids.release(99);
    }

    #[test]
    fn an_older_claim_arriving_late_leaves_the_newer_connection_alone() {
        let mut ids = ClientIds::new(1_000);
        let a = hash("device-7");
        // Worker 1 claimed at 20; here a CONNECT claimed at 30 before
        // worker 1's record arrived: ours stands, theirs is closed there.
        assert_eq!(ids.claim(a, 5, at(30, 0)), Claimed::First);
        assert_eq!(ids.take(a, at(20, 1)), None);
        assert_eq!(ids.len(), 1);
        // A tie goes to the higher worker index.
        assert_eq!(ids.take(a, at(30, 0)), None, "our own claim");
        assert_eq!(ids.take(a, at(30, 1)), Some(5));
    }

    #[test]
    fn a_connection_registering_after_a_later_claim_elsewhere_is_the_one_taken_over() {
        let mut ids = ClientIds::new(1_000);
        let a = hash("device-7");
        // Claimed here at 10, CONNACK sent; worker 1's claim at 20 (a
        // reconnect that saw our CONNACK) arrives before ours registers.
        assert_eq!(ids.take(a, at(20, 1)), None, "nothing here yet");
        assert_eq!(ids.claim(a, 2, at(10, 0)), Claimed::Superseded);
        assert_eq!(ids.len(), 0);
        // A later claim here takes it back.
        assert_eq!(ids.claim(a, 3, at(25, 0)), Claimed::First);
        // An older local claim registering late is superseded too.
        assert_eq!(ids.claim(a, 4, at(24, 0)), Claimed::Superseded);
        // A connection that has no slot claims nothing.
        assert_eq!(ids.claim(a, u32::MAX, at(99, 0)), Claimed::Superseded);
        assert_eq!(ids.by_slot.len(), 4);
    }

    #[test]
    fn claims_from_elsewhere_are_forgotten_after_the_window() {
        let mut ids = ClientIds::new(1_000);
        for i in 0..100_000u64 {
            ids.take(i + 1, at(i * 100, 1));
        }
        // 1,000 ns at 100 ns per claim: about 10 kept, pruned at doubling.
        assert!(ids.elsewhere.len() < 2_048, "{}", ids.elsewhere.len());
        assert_eq!(ids.claim(100_000, 1, at(1, 0)), Claimed::Superseded);
        assert_eq!(ids.claim(5, 2, at(1, 0)), Claimed::First, "forgotten");
    }
}
