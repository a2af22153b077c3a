//! What every task of a `hold` worker shares with the readiness loop that
//! holds its connections (`held`): the plan, the recorder, the read buffers,
//! the stop flag and the count of live tasks.
//!
//! Kept apart from the worker's own state (`worker::Ctx`, which owns the
//! loop) so that the loop sees only this, and imports run one way:
//! `worker -> held -> shared`.

use std::cell::{Cell, RefCell};

use super::WorkerPlan;
use super::message;
use super::recorder::HoldRecorder;
use super::sequence::Sequence;
use super::stamp::Stamp;
use crate::harness::worker::{Live, Stop};
use throng_report::fanout::{self, MessageId};

/// State shared by every task of the worker (single-threaded: `Cell`, `RefCell`).
pub(super) struct Shared {
    pub(super) plan: WorkerPlan,
    pub(super) rec: RefCell<HoldRecorder>,
    /// The one read buffer of the worker. Borrowed only between awaits.
    pub(super) scratch: RefCell<Box<[u8]>>,
    /// Decrypted bytes of one TLS read, reused by every connection.
    pub(super) plain: RefCell<Vec<u8>>,
    /// Set once, when the run ends; connections check it before waiting.
    pub(super) stop: Stop,
    /// The last sequence number published, from the `stop` order (0: unknown).
    pub(super) final_seq: Cell<u64>,
    /// When the first message was published (0: not yet).
    pub(super) first_publish_ns: Cell<u64>,
    /// Connection tasks still running plus connections held.
    pub(super) live: Live,
}

impl Shared {
    /// Checks one message against its connection's sequence and records its
    /// delivery latency.
    pub(super) fn on_message(&self, seq: &mut Sequence, payload: &[u8], now_ns: u64) {
        let mut rec = self.rec.borrow_mut();
        match message::decode(payload) {
            Some((n, sent_ns)) => {
                let arrival = seq.receive(n, self.first_publish_ns.get());
                rec.delivered(n, now_ns.saturating_sub(sent_ns) / 1000, arrival);
            }
            None => match self.plan.target.stamp.read(payload) {
                // A message the server made, timed by its own stamp; its
                // own sequence (a JSON `seq`) counts losses per connection
                // when hold publishes nothing itself (the numbers would mix).
                Some((sent_ns, server_seq)) => {
                    let own = self.first_publish_ns.get() > 0 || self.final_seq.get() > 0;
                    let arrival = server_seq.filter(|_| !own).map(|n| seq.receive(n, 0));
                    // The same message on every connection: its sequence
                    // number, else its send time.
                    let id = server_seq.map_or(MessageId::Stamp(sent_ns), MessageId::Seq);
                    rec.pushed(id, now_ns, now_ns.saturating_sub(sent_ns) / 1000, arrival);
                }
                // Measured by its bytes alone when the run measures the
                // server's messages (`--stamp`): nothing else tells two apart.
                None => {
                    let measured = self.plan.target.stamp != Stamp::Throng;
                    rec.foreign(
                        measured.then(|| MessageId::Hash(fanout::hash(payload))),
                        now_ns,
                    );
                }
            },
        }
    }
}
