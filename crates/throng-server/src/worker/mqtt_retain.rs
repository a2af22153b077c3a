//! Retained messages on a worker's side: a new MQTT subscription asks the
//! supervisor for the retained messages of the channels its filters match
//! (the embedded relay's store, or Redis's through it), and gets them first,
//! with the retain flag set, before anything newer on those channels.
//!
//! The ask does not block the worker: the subscription is in the tables at
//! once (so nothing published from then on passes it by), and the
//! connection's live messages are held until the answer comes, as a
//! rejoining subscriber's are (the same `rejoining` mark sends them here).
//! The supervisor answers after every message it relayed before it read
//! the store, and the worker applies the answer in that order, behind the
//! fan-outs of those messages ([`super::state::Outgoing`]). So what was
//! held came before the answer: a retained message that is among them was
//! set before the store was read, and comes live, in its place (the
//! retained copy is left out); any other retained message is older than
//! everything held on its channel and goes first. The subscriber never
//! gets a retained message after a newer live one of its channel.
//!
//! Retained messages go out at QoS 0, encoded per subscriber (they are
//! rare, and go once per subscription).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use bytes::Bytes;
use throng_proto::mqtt::{Delivery, Packet, Properties, Publish, Version};

use super::conn::{Conn, SendError};
use super::mqtt::{self, version_of};
use super::subscribers::{Outside, Subscribers};
use crate::control::Message;
use crate::retained::{self, RetainedMessage};

/// The connections waiting for retained messages, with what was published
/// to them meanwhile (few at a time: a list searched, not a table).
pub(crate) struct Holds<W> {
    list: RefCell<Vec<Hold<W>>>,
    next_request: Cell<u64>,
}

impl<W> Default for Holds<W> {
    fn default() -> Self {
        Self {
            list: RefCell::default(),
            next_request: Cell::new(1),
        }
    }
}

/// One connection's asks still unanswered, and its live messages held.
struct Hold<W> {
    conn: Rc<Conn<W>>,
    asks: Vec<u64>,
    held: Vec<Message>,
    /// Payload bytes held, under `--max-queue` like a queue.
    bytes: usize,
}

/// The PUBLISH of retained message `r` for a subscriber of `version`:
/// retain set, QoS 0.
fn publish(version: Version, r: &RetainedMessage) -> Bytes {
    let p = Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::AtMostOnce,
        retain: true,
        topic: &r.channel,
        properties: Properties::EMPTY,
        payload: &r.kept.payload,
    });
    let mut out = Vec::with_capacity(r.kept.payload.len() + r.channel.len() + 8);
    // A channel is at most 128 bytes and a payload at most --max-message:
    // far below the encoder's limits. Should one be reached, nothing is sent.
    match p.encode(version, &mut out) {
        Ok(()) => Bytes::from(out),
        Err(_) => Bytes::new(),
    }
}

impl<O: Outside> Subscribers<O> {
    /// After a SUBSCRIBE whose `filters` (already in the tables) want
    /// retained messages: asks for them, and holds `c`'s live messages
    /// until they come.
    pub(crate) fn ask_retained(&self, c: &Rc<Conn<O::Wire>>, filters: Vec<String>) {
        if filters.is_empty() || !c.is_open() {
            return;
        }
        let holds = &self.retained;
        let request = holds.next_request.get();
        holds.next_request.set(request + 1);
        {
            let mut list = holds.list.borrow_mut();
            match list.iter_mut().find(|h| Rc::ptr_eq(&h.conn, c)) {
                Some(h) => h.asks.push(request),
                None => list.push(Hold {
                    conn: c.clone(),
                    asks: vec![request],
                    held: Vec::new(),
                    bytes: 0,
                }),
            }
        }
        c.rejoining.set(true);
        self.outside.ask_retained(request, filters);
    }

    /// A live message for `c` while it waits for retained messages: held
    /// (`Some(Ok)`), or over `--max-queue` (`Some(Err)`: a slow consumer);
    /// `None` when `c` waits for nothing.
    pub(crate) fn hold_for_retained(
        &self,
        c: &Rc<Conn<O::Wire>>,
        m: &Message,
    ) -> Option<Result<(), SendError>> {
        let mut list = self.retained.list.borrow_mut();
        let h = list.iter_mut().find(|h| Rc::ptr_eq(&h.conn, c))?;
        if h.bytes + m.payload.len() > self.limits.max_queue {
            return Some(Err(SendError::QueueFull));
        }
        h.bytes += m.payload.len();
        h.held.push(m.clone());
        Some(Ok(()))
    }

    /// The answer to ask `request`: its retained messages go out (those
    /// not held live already), then, once the connection waits for no
    /// other answer, what was held, in order.
    pub(crate) fn retained_answer(&self, request: u64, messages: Vec<RetainedMessage>) {
        let (c, first, held) = {
            let mut list = self.retained.list.borrow_mut();
            let Some(k) = list.iter().position(|h| h.asks.contains(&request)) else {
                return;
            };
            let h = &mut list[k];
            h.asks.retain(|&a| a != request);
            if !h.conn.is_open() {
                list.swap_remove(k);
                return;
            }
            let c = h.conn.clone();
            let version = version_of(c.kind);
            let first: Vec<Bytes> = messages
                .iter()
                .filter(|r| {
                    !h.held.iter().any(|m| {
                        m.channel == r.channel
                            && retained::same_message(&r.kept, m.message, &m.payload)
                    })
                })
                .map(|r| publish(version, r))
                .collect();
            let held = if h.asks.is_empty() {
                list.swap_remove(k).held
            } else {
                Vec::new()
            };
            (c, first, held)
        };
        let waiting = self
            .retained
            .list
            .borrow()
            .iter()
            .any(|h| Rc::ptr_eq(&h.conn, &c));
        if !waiting {
            c.rejoining.set(false);
        }
        let version = version_of(c.kind);
        let live = held.iter().map(|m| mqtt::publish(version, m));
        for (i, bytes) in first.iter().cloned().chain(live).enumerate() {
            if let Err(e) = self.send(&c, &bytes) {
                self.forget_retained(&c);
                self.send_failed(&c, e);
                return;
            }
            if i < first.len() {
                crate::metrics::inc(&self.counters.mqtt_retained_sent);
            }
        }
    }

    /// `c` is gone: it waits for nothing any more.
    pub(crate) fn forget_retained(&self, c: &Conn<O::Wire>) {
        self.retained
            .list
            .borrow_mut()
            .retain(|h| !std::ptr::eq(Rc::as_ptr(&h.conn), c));
    }
}

#[cfg(test)]
mod tests {
    //! The ordering rule against a model of the supervisor: messages on
    //! one channel, some retained, some clearing; a subscriber joins after
    //! the worker wrote the `k`th, the store is read after the `j`th was
    //! relayed (`j >= k`), and the answer is applied behind its fan-out,
    //! as the worker's outbox orders it. Every arrangement.

    use bytes::Bytes;
    use throng_proto::mqtt::{Connack, Decoder, Packet, Properties, ReasonCode, Version};

    use crate::control::Message;
    use crate::history::{Kept, MessageId};
    use crate::retained::{Limits, Retained};
    use crate::worker::pair::Pair;

    /// What each message is: 0 plain, 1 retained, 2 a retained clear.
    /// Returns what the subscriber got: payloads and retain flags.
    fn run(kinds: &[u8], k: usize, j: usize) -> Vec<(String, bool)> {
        let mut store = Retained::new(Limits {
            max_topics: 10,
            max_bytes: 1 << 20,
        });
        let mut p = Pair::defaults();
        // The supervisor reads the store after relaying message `j`; the
        // worker applies the answer after writing it, before the next.
        let answer = |p: &mut Pair, store: &mut Retained| {
            let request = p.subs.outside.retained_asks.borrow()[0].0;
            p.subs
                .retained_answer(request, store.matching(&["c".to_owned()]));
        };
        let mut client = None;
        if k == 0 {
            client = Some(join(&mut p));
        }
        if j == 0 {
            answer(&mut p, &mut store);
        }
        for (i, &kind) in kinds.iter().enumerate() {
            let id = MessageId {
                epoch: 1,
                seq: i as u64 + 1,
            };
            let payload = if kind == 2 {
                Bytes::new()
            } else {
                Bytes::from(format!("m{}", i + 1))
            };
            if kind != 0 {
                let kept = Kept {
                    id,
                    text: true,
                    payload: payload.clone(),
                };
                store.set("c", 0, kept);
            }
            p.subs.fanout(&Message {
                id: i as u64 + 1,
                message: id,
                text: true,
                channel: "c".into(),
                payload,
            });
            if i + 1 == k {
                client = Some(join(&mut p));
            }
            if i + 1 == j {
                answer(&mut p, &mut store);
            }
        }
        p.drive();
        let client = client.expect("joined");
        received(&p.clients[client].take_raw())
    }

    /// A subscriber of `c` joins and asks for its retained message.
    fn join(p: &mut Pair) -> usize {
        let (i, c) = p.connect_mqtt(Version::V5);
        p.subs.channels.borrow_mut().subscribe_mqtt("c", &c);
        p.subs.ask_retained(&c, vec!["c".to_owned()]);
        i
    }

    fn received(raw: &[u8]) -> Vec<(String, bool)> {
        let mut dec = Decoder::client(Version::V5, 1 << 16);
        // The handshake's CONNACK was not the pair's: the decoder wants one first.
        let mut connack = Vec::new();
        let ok = Packet::Connack(Connack {
            session_present: false,
            code: ReasonCode::SUCCESS,
            properties: Properties::EMPTY,
        });
        ok.encode(Version::V5, &mut connack).expect("encode");
        dec.decode(&connack).expect("a CONNACK");
        let mut pos = 0;
        let mut out = Vec::new();
        while let Some(d) = dec.decode(&raw[pos..]).expect("MQTT") {
            pos += d.consumed;
            if let Packet::Publish(p) = d.packet {
                out.push((String::from_utf8_lossy(p.payload).into_owned(), p.retain));
            }
        }
        out
    }

    #[test]
    fn the_retained_message_comes_first_once_and_never_after_a_newer_live_one() {
        let mut tried = 0;
        for code in 0..81u32 {
            let kinds: Vec<u8> = (0..4).map(|d| (code / 3u32.pow(d) % 3) as u8).collect();
            for k in 0..=4 {
                for j in k..=4 {
                    tried += 1;
                    let got = run(&kinds, k, j);
                    // Live: everything after it joined, in order, retain 0.
                    let live: Vec<(String, bool)> = (k..4)
                        .map(|i| {
                            let body = if kinds[i] == 2 {
                                String::new()
                            } else {
                                format!("m{}", i + 1)
                            };
                            (body, false)
                        })
                        .collect();
                    // The store after message j: the last set, unless cleared after.
                    let last = kinds[..j]
                        .iter()
                        .rposition(|&x| x != 0)
                        .filter(|&i| kinds[i] == 1);
                    let want: Vec<(String, bool)> = match last {
                        // Set before it joined: sent first, flagged.
                        Some(i) if i < k => std::iter::once((format!("m{}", i + 1), true))
                            .chain(live)
                            .collect(),
                        // Set after it joined: it came live, in its place.
                        _ => live,
                    };
                    assert_eq!(
                        got, want,
                        "kinds {kinds:?}, joined after {k}, read after {j}"
                    );
                }
            }
        }
        assert!(tried > 1000, "{tried}");
    }
}
