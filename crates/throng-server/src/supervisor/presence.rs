//! The supervisor's part in presence events (`--presence`,
//! [`crate::presence`]): an event a worker tells is handed to every
//! worker (the watchers of its channel may be on any) and, with `--redis`,
//! to the other nodes through the counts link; one another node relays is
//! handed to every worker. It keeps this node's tally for the API's
//! presence lists across nodes, and a worker that dies leaves on behalf of
//! its connections.

use super::Supervisor;
use crate::control::{PresenceEvent, Record};
use crate::redis::counts::CountsCmd;

/// Events waiting for the counts link to publish them, at most: past it
/// (Redis slower than a flood of joins) an event is not relayed to the
/// other nodes (this node's watchers still get it), so memory stays
/// bounded. Counted in the log.
pub(super) const MAX_RELAYING: usize = 10_000;

impl Supervisor {
    /// Worker `i` told event `e`: kept, and handed to every worker and node.
    pub(super) fn presence_told(&mut self, i: usize, e: PresenceEvent) {
        self.presence.told(i, &e);
        self.presence_relay(&e);
        self.presence_deliver(&e);
    }

    /// Worker `i` died: every connection it had leaves.
    pub(super) fn presence_worker_gone(&mut self, i: usize) {
        for e in self.presence.worker_gone(i) {
            self.presence_relay(&e);
            self.presence_deliver(&e);
        }
    }

    /// Hands `e` to every live worker (one record, encoded once).
    pub(super) fn presence_deliver(&mut self, e: &PresenceEvent) {
        let rec = Record::Presence(e.clone()).encode();
        for j in 0..self.slots.len() {
            self.send(j, rec.clone());
        }
    }

    /// Hands `e` to the counts link for the other nodes (`--redis`).
    fn presence_relay(&mut self, e: &PresenceEvent) {
        let Some(c) = &mut self.counts else {
            return;
        };
        if c.relaying >= MAX_RELAYING {
            c.presence_dropped += 1;
            if c.presence_dropped.is_power_of_two() {
                log!(
                    "throng: Redis counts link: {} presence events not relayed to the other nodes \
                     (more than {MAX_RELAYING} waiting)",
                    c.presence_dropped
                );
            }
            return;
        }
        c.relaying += 1;
        let _ = c.tx.send(CountsCmd::Presence(e.clone()));
    }
}
