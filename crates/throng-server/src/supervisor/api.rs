//! The supervisor's side of the server API ([`crate::api`]): a worker's
//! question goes to every live worker, their parts are merged by
//! [`crate::api::Gather`], and the merged answer goes back to the worker
//! that asked (if it is still the same process).

use bytes::Bytes;

use super::Supervisor;
use crate::api::{Asker, Done, Part, Query};
use crate::control::{ApiRecord, Leg, Record};

impl Supervisor {
    /// One leg of an API request from worker `i`.
    pub(super) fn on_api(&mut self, i: usize, generation: u64, r: ApiRecord) {
        match r.leg {
            Leg::Ask => {
                let to = Asker {
                    slot: i,
                    generation,
                    request: r.id,
                };
                let Ok(query) = serde_json::from_slice::<Query>(&r.body) else {
                    // The worker wrote it: a query it cannot have meant.
                    log!("throng: worker {i}: malformed API question");
                    return self.api_answer(Done {
                        to,
                        part: Part::default(),
                    });
                };
                self.counts_asked(to, &query);
                self.api_ask(to, &query, r.body);
            }
            Leg::Part => {
                let part = serde_json::from_slice::<Part>(&r.body).unwrap_or_default();
                if let Some(done) = self.api.part(i, r.id, part) {
                    self.api_answer(done);
                }
            }
            Leg::Query | Leg::Answer => {
                log!("throng: worker {i}: unexpected API record {:?}", r.leg);
            }
        }
    }

    /// Puts `query` (`body`, its JSON) to every live worker for `to`.
    pub(super) fn api_ask(&mut self, to: Asker, query: &Query, body: Bytes) {
        let live: Vec<usize> = (0..self.slots.len())
            .filter(|&j| self.slots[j].tx.is_some())
            .collect();
        match self.api.ask(to, query, live.clone()) {
            Ok(id) => {
                let rec = Record::Api(ApiRecord {
                    leg: Leg::Query,
                    id,
                    body,
                })
                .encode();
                for j in live {
                    self.send(j, rec.clone());
                }
            }
            Err(done) => self.api_answer(done),
        }
    }

    /// Worker `i` exited: the questions waiting for its part go on without it.
    pub(super) fn api_worker_gone(&mut self, i: usize) {
        for done in self.api.gone(i) {
            self.api_answer(done);
        }
    }

    pub(super) fn api_answer(&mut self, done: Done) {
        let Some(done) = self.counts_answer(done) else {
            return;
        };
        self.api_reply(done);
    }

    /// Sends the answer to the worker that asked (if it is still the same process).
    pub(super) fn api_reply(&mut self, done: Done) {
        let to = done.to;
        if self.slots[to.slot].generation != to.generation {
            return;
        }
        let body = serde_json::to_vec(&done.part).unwrap_or_default();
        let rec = Record::Api(ApiRecord {
            leg: Leg::Answer,
            id: to.request,
            body: Bytes::from(body),
        });
        self.send(to.slot, rec.encode());
    }
}
