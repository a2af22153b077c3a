//! The supervisor's bookkeeping of relayed messages, without sockets: a
//! message relayed to N workers waits for each one's count of subscribers
//! (a `Delivered` record), and when the last has answered, or died, the
//! worker that published it gets the sum (a `Published` record).
//!
//! A worker is named by its slot and generation ([`WorkerId`]): a slot's
//! restarted process is another worker, so an answer from the one before
//! counts for nothing, and a publisher that died gets no answer.

use std::collections::HashMap;

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use crate::control::{Message, Record};
use crate::history::MessageId;

/// One worker process: its slot, and which start of that slot it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct WorkerId {
    /// Index among the workers, `0..workers`.
    pub(crate) slot: usize,
    /// Starts of this slot so far (1 for the first process).
    pub(crate) generation: u64,
}

/// Who published a message and waits for its count: a worker and the id of
/// its `Publish` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Publisher {
    pub(crate) worker: WorkerId,
    pub(crate) request: u64,
}

/// The answer a publisher is owed: its request reached this many subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) to: Publisher,
    pub(crate) subscribers: u64,
    /// The message's id, for the publisher's answer.
    pub(crate) message: MessageId,
}

impl Answer {
    /// The `Published` record that carries it.
    pub(crate) fn record(&self) -> Bytes {
        Record::Published {
            id: self.to.request,
            subscribers: self.subscribers,
            message: self.message,
        }
        .encode()
    }
}

/// A message relayed and not yet counted by every worker it went to.
struct Pending {
    /// `None` for a message from Redis, or once the publisher died.
    from: Option<Publisher>,
    /// Holds a place among [`crate::redis::session::MAX_IN_FLIGHT`] (messages from
    /// Redis) until every worker delivered.
    _permit: Option<OwnedSemaphorePermit>,
    /// Workers whose count is still to come. Invariant: never empty while
    /// the message is in [`Relay::pending`].
    waiting: Vec<WorkerId>,
    /// Sum of the counts so far.
    subscribers: u64,
    /// The message's id.
    message: MessageId,
}

/// Every message in flight between the supervisor and its workers.
#[derive(Default)]
pub(crate) struct Relay {
    /// The id of the next `Deliver` record; ids start at 1.
    next_id: u64,
    pending: HashMap<u64, Pending>,
}

impl Relay {
    /// Numbers `m` for relaying and encodes its `Deliver` record once, for
    /// every worker.
    pub(crate) fn deliver(&mut self, m: Message) -> (u64, Bytes) {
        self.next_id += 1;
        let id = self.next_id;
        (id, Record::Deliver(Message { id, ..m }).encode())
    }

    /// Message `id` (with history id `message`) went to the workers `to`;
    /// their counts go to `from` (with `permit` held until then). With
    /// nobody to count, the answer (0 subscribers) is due at once.
    pub(crate) fn wait_for(
        &mut self,
        (id, message): (u64, MessageId),
        from: Option<Publisher>,
        permit: Option<OwnedSemaphorePermit>,
        to: Vec<WorkerId>,
    ) -> Option<Answer> {
        if to.is_empty() {
            return from.map(|to| Answer {
                to,
                subscribers: 0,
                message,
            });
        }
        let pending = Pending {
            from,
            _permit: permit,
            waiting: to,
            subscribers: 0,
            message,
        };
        self.pending.insert(id, pending);
        None
    }

    /// Worker `by` delivered message `id` to `subscribers`; the answer when
    /// that was the last count. A count nobody waits for (an earlier
    /// generation's, a repeat) is ignored.
    pub(crate) fn delivered(&mut self, id: u64, by: WorkerId, subscribers: u64) -> Option<Answer> {
        let p = self.pending.get_mut(&id)?;
        let k = p.waiting.iter().position(|&w| w == by)?;
        p.waiting.swap_remove(k);
        p.subscribers += subscribers;
        self.settle(id)
    }

    /// Worker `w` is gone: nothing waits for its counts any more, and what
    /// it published is answered to nobody. Returns the answers now due.
    pub(crate) fn worker_gone(&mut self, w: WorkerId) -> Vec<Answer> {
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        let mut due = Vec::new();
        for id in ids {
            let Some(p) = self.pending.get_mut(&id) else {
                continue;
            };
            p.waiting.retain(|&x| x != w);
            if p.from.is_some_and(|f| f.worker == w) {
                p.from = None;
            }
            due.extend(self.settle(id));
        }
        due
    }

    /// Messages relayed and not yet counted by all.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Ends message `id` if nobody's count is still to come.
    fn settle(&mut self, id: u64) -> Option<Answer> {
        if !self.pending.get(&id)?.waiting.is_empty() {
            return None;
        }
        let p = self.pending.remove(&id)?;
        p.from.map(|to| Answer {
            to,
            subscribers: p.subscribers,
            message: p.message,
        })
    }
}

#[cfg(test)]
mod tests {
    //! The relay between a supervisor and worker stand-ins that decode each
    //! `Deliver` record and answer with their subscriber counts, driven
    //! message by message: no sockets, no clock.

    use std::sync::Arc;

    use bytes::BytesMut;
    use tokio::sync::Semaphore;

    use super::*;

    /// A worker as the relay sees it: it decodes what it is sent and
    /// answers `Delivered` with its subscriber count.
    struct Stub {
        id: WorkerId,
        subscribers: u64,
        inbox: Vec<Bytes>,
    }

    impl Stub {
        /// The ids of the records it received, in order, decoded from the wire.
        fn deliveries(&mut self) -> Vec<u64> {
            let mut ids = Vec::new();
            for rec in self.inbox.drain(..) {
                let mut buf = BytesMut::from(&rec[..]);
                match Record::decode(&mut buf).unwrap() {
                    Some(Record::Deliver(m)) => ids.push(m.id),
                    other => panic!("a worker got {other:?}"),
                }
            }
            ids
        }
    }

    /// A supervisor's relay and its workers, each with some subscribers.
    struct Pair {
        relay: Relay,
        workers: Vec<Stub>,
        /// Answers sent to publishers, in order.
        answers: Vec<Answer>,
    }

    impl Pair {
        fn new(subscribers: &[u64]) -> Self {
            let workers = subscribers
                .iter()
                .enumerate()
                .map(|(slot, &n)| Stub {
                    id: WorkerId {
                        slot,
                        generation: 1,
                    },
                    subscribers: n,
                    inbox: Vec::new(),
                })
                .collect();
            Self {
                relay: Relay::default(),
                workers,
                answers: Vec::new(),
            }
        }

        /// Relays a message from `from` (a worker slot and request id, or
        /// Redis) to every worker, as the supervisor does.
        fn publish(
            &mut self,
            from: Option<(usize, u64)>,
            permit: Option<OwnedSemaphorePermit>,
        ) -> u64 {
            let m = Message {
                id: from.map_or(0, |f| f.1),
                message: MessageId::NONE,
                text: true,
                at_most_once: false,
                exactly_once: false,
                properties: Bytes::new(),
                retained: false,
                origin: 0,
                channel: "news".into(),
                payload: Bytes::from_static(b"hi"),
            };
            let (id, rec) = self.relay.deliver(m);
            for w in &mut self.workers {
                w.inbox.push(rec.clone());
            }
            let to = self.workers.iter().map(|w| w.id).collect();
            let from = from.map(|(slot, request)| Publisher {
                worker: self.workers[slot].id,
                request,
            });
            self.answers
                .extend(self.relay.wait_for((id, MessageId::NONE), from, permit, to));
            id
        }

        /// Worker `slot` reads its inbox and answers every delivery.
        fn answer(&mut self, slot: usize) {
            let w = &mut self.workers[slot];
            let (by, n) = (w.id, w.subscribers);
            for id in w.deliveries() {
                self.answers.extend(self.relay.delivered(id, by, n));
            }
        }

        /// Worker `slot` dies (and is restarted as its next generation).
        fn die(&mut self, slot: usize) {
            let w = &mut self.workers[slot];
            let dead = w.id;
            w.inbox.clear();
            w.id.generation += 1;
            self.answers.extend(self.relay.worker_gone(dead));
        }
    }

    #[test]
    fn the_publisher_is_answered_once_every_worker_counted() {
        let mut p = Pair::new(&[3, 0, 5]);
        p.publish(Some((1, 42)), None);
        p.answer(2);
        p.answer(0);
        assert!(p.answers.is_empty(), "worker 1 has not counted yet");
        p.answer(1);
        let to = Publisher {
            worker: p.workers[1].id,
            request: 42,
        };
        assert_eq!(
            p.answers,
            [Answer {
                to,
                subscribers: 8,
                message: MessageId::NONE
            }]
        );
        assert_eq!(p.relay.in_flight(), 0);
        let mut buf = BytesMut::from(&p.answers[0].record()[..]);
        assert_eq!(
            Record::decode(&mut buf).unwrap(),
            Some(Record::Published {
                id: 42,
                subscribers: 8,
                message: MessageId::NONE
            })
        );
    }

    #[test]
    fn messages_in_flight_are_counted_apart() {
        let mut p = Pair::new(&[1, 2]);
        let a = p.publish(Some((0, 1)), None);
        let b = p.publish(Some((1, 1)), None);
        assert_ne!(a, b);
        assert_eq!(p.workers[0].deliveries(), [a, b]);
        // Worker 0 counted both (read above); worker 1 answers b, then a.
        p.answers.extend(p.relay.delivered(b, p.workers[0].id, 1));
        p.answers.extend(p.relay.delivered(b, p.workers[1].id, 2));
        p.answers.extend(p.relay.delivered(b, p.workers[1].id, 2));
        assert_eq!(p.answers.len(), 1, "a repeated count changes nothing");
        assert_eq!(
            (p.answers[0].to.worker.slot, p.answers[0].subscribers),
            (1, 3)
        );
        p.answers.extend(p.relay.delivered(a, p.workers[0].id, 1));
        p.answers.extend(p.relay.delivered(a, p.workers[1].id, 2));
        assert_eq!(
            (p.answers[1].to.worker.slot, p.answers[1].subscribers),
            (0, 3)
        );
    }

    #[test]
    fn a_worker_that_dies_mid_relay_is_not_waited_for() {
        let mut p = Pair::new(&[3, 4, 5]);
        p.publish(Some((0, 7)), None);
        p.answer(0);
        p.die(1);
        assert!(p.answers.is_empty(), "worker 2 has not counted yet");
        p.answer(1); // the restarted worker never got it: nothing to answer
        p.answer(2);
        assert_eq!(p.answers.len(), 1);
        assert_eq!(p.answers[0].subscribers, 3 + 5);
        assert_eq!(p.relay.in_flight(), 0);
    }

    #[test]
    fn the_last_count_missing_is_a_death_and_the_answer_follows_it() {
        let mut p = Pair::new(&[3, 4]);
        p.publish(Some((0, 7)), None);
        p.answer(0);
        p.die(1);
        assert_eq!(p.answers.len(), 1);
        assert_eq!(p.answers[0].subscribers, 3);
    }

    #[test]
    fn an_earlier_generation_counts_for_nothing() {
        let mut p = Pair::new(&[3, 4]);
        let id = p.publish(Some((0, 7)), None);
        let old = p.workers[1].id;
        p.workers[1].id.generation += 1; // restarted, its death not yet seen
        assert!(p.relay.delivered(id, p.workers[1].id, 100).is_none());
        p.answer(0);
        assert!(p.answers.is_empty(), "still waiting for generation 1");
        p.answers.extend(p.relay.delivered(id, old, 4));
        assert_eq!(p.answers[0].subscribers, 7);
    }

    #[test]
    fn a_publisher_that_dies_is_answered_to_nobody() {
        let mut p = Pair::new(&[3, 4]);
        p.publish(Some((0, 7)), None);
        p.die(0);
        p.answer(1);
        assert!(p.answers.is_empty());
        assert_eq!(p.relay.in_flight(), 0);
    }

    #[test]
    fn with_no_worker_alive_the_answer_is_zero_at_once() {
        let mut relay = Relay::default();
        let from = Publisher {
            worker: WorkerId {
                slot: 0,
                generation: 1,
            },
            request: 3,
        };
        let (id, _) = relay.deliver(Message {
            id: 3,
            message: MessageId::NONE,
            text: false,
            at_most_once: false,
            exactly_once: false,
            properties: Bytes::new(),
            retained: false,
            origin: 0,
            channel: "c".into(),
            payload: Bytes::new(),
        });
        let message = MessageId { epoch: 1, seq: 1 };
        let answer = relay.wait_for((id, message), Some(from), None, Vec::new());
        assert_eq!(
            answer,
            Some(Answer {
                to: from,
                subscribers: 0,
                message
            })
        );
        assert_eq!(relay.in_flight(), 0);
    }

    #[test]
    fn a_message_from_redis_holds_its_place_until_every_worker_delivered() {
        let places = Arc::new(Semaphore::new(2));
        let mut p = Pair::new(&[1, 1]);
        let permit = places.clone().try_acquire_owned().unwrap();
        p.publish(None, Some(permit));
        assert_eq!(places.available_permits(), 1);
        p.answer(0);
        assert_eq!(places.available_permits(), 1);
        p.answer(1);
        assert_eq!(places.available_permits(), 2, "released");
        assert!(p.answers.is_empty(), "nobody to answer");
    }
}
