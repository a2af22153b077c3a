//! The MQTT client ids a worker's connections hold, for takeover: a
//! CONNECT with a client id already connected closes the older connection
//! (MQTT-3.1.4-2), on this worker at once and on the node's other workers
//! through the supervisor. Sans I/O: ids by hash to slots, and back.
//!
//! An id is kept as its 64-bit hash (SipHash with fixed keys, the same in
//! every worker process), so a connection costs two table entries and no
//! copy of its id; two ids with one hash would take each other over, at
//! odds of one in 2^64 per pair.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// The hash a client id is known by on every worker of a node.
pub(crate) fn hash(client_id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    client_id.hash(&mut h);
    // 0 marks a slot with no id.
    h.finish().max(1)
}

/// The client ids of one worker's MQTT connections.
#[derive(Default)]
pub(crate) struct ClientIds {
    /// A client id's hash: the slot of the connection that holds it.
    by_hash: HashMap<u64, u32>,
    /// By slot: the hash of its connection's client id, 0 for none.
    by_slot: Vec<u64>,
}

impl ClientIds {
    /// The connection in `slot` holds the id `hash`: returns the slot of
    /// the one that held it before here, to close.
    pub(crate) fn claim(&mut self, hash: u64, slot: u32) -> Option<u32> {
        let at = slot as usize;
        if self.by_slot.len() <= at {
            self.by_slot.resize(at + 1, 0);
        }
        self.by_slot[at] = hash;
        let before = self.by_hash.insert(hash, slot).filter(|&s| s != slot);
        if let Some(s) = before
            && let Some(h) = self.by_slot.get_mut(s as usize)
        {
            *h = 0;
        }
        before
    }

    /// Another worker's connection took id `hash`: the slot of the one
    /// here that held it, to close.
    pub(crate) fn take(&mut self, hash: u64) -> Option<u32> {
        let slot = self.by_hash.remove(&hash)?;
        if let Some(h) = self.by_slot.get_mut(slot as usize) {
            *h = 0;
        }
        Some(slot)
    }

    /// The connection in `slot` ended.
    pub(crate) fn release(&mut self, slot: u32) {
        let Some(h) = self.by_slot.get_mut(slot as usize) else {
            return;
        };
        let hash = std::mem::take(h);
        if hash != 0 && self.by_hash.get(&hash) == Some(&slot) {
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
    use super::{ClientIds, hash};

    #[test]
    fn a_second_claim_names_the_first_and_an_ended_connection_frees_its_id() {
        let mut ids = ClientIds::default();
        let (a, b) = (hash("sensor-1"), hash("sensor-2"));
        assert_ne!(a, b);
        assert_eq!(a, hash("sensor-1"), "the same in every process");
        assert_eq!(ids.claim(a, 3), None);
        assert_eq!(ids.claim(b, 4), None);
        assert_eq!(ids.claim(a, 7), Some(3), "taken over here");
        ids.release(3);
        assert_eq!(ids.len(), 2, "the old slot no longer holds it");
        assert_eq!(ids.take(a), Some(7), "taken over on another worker");
        assert_eq!(ids.take(a), None);
        ids.release(7);
        ids.release(4);
        assert_eq!(ids.len(), 0);
        ids.release(99);
    }
}
