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

use std::rc::Rc;

use bytes::Bytes;
use throng_proto::mqtt::{Delivery, Packet, Properties, Publish, Version};

use super::conn::{Conn, SendError, Wire};
use super::mqtt::{self, version_of};
use super::mqtt_qos::Qos1;
use super::table::Channels;
use crate::control::Message;
use crate::retained::{self, RetainedMessage};

/// The connections waiting for retained messages, with what was published
/// to them meanwhile (few at a time: a list searched, not a table).
pub(crate) struct Holds<W> {
    list: Vec<Hold<W>>,
    next_request: u64,
}

impl<W> Default for Holds<W> {
    fn default() -> Self {
        Self {
            list: Vec::new(),
            next_request: 1,
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

/// A message for one subscriber, at the QoS it gets it at.
pub(crate) enum Out {
    Qos0(Bytes),
    Qos1(Qos1),
}

/// What the answer to an ask sends its connection ([`Holds::answer`]).
pub(crate) struct Answered<W> {
    pub(crate) conn: Rc<Conn<W>>,
    /// Its retained messages, then (once it waits for no other answer)
    /// what was held, in order.
    pub(crate) out: Vec<Out>,
    /// How many of `out` are retained messages.
    pub(crate) retained: usize,
    /// It waits for no other answer: its live messages flow again.
    pub(crate) done: bool,
}

/// The PUBLISH of retained message `r` for a subscriber of `version`:
/// retain set, QoS 0.
fn publish(version: Version, r: &RetainedMessage) -> Bytes {
    let p = Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::AtMostOnce,
        retain: true,
        topic: &r.channel,
        // Made by `mqtt::forwarded` from a checked packet: they check again.
        properties: Properties::of_publish(&r.properties).unwrap_or(Properties::EMPTY),
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

impl<W: Wire> Holds<W> {
    /// After a SUBSCRIBE of `c` whose filters (already in the tables)
    /// want retained messages: the request to ask them with; `c`'s live
    /// messages are held until they come.
    pub(crate) fn ask(&mut self, c: &Rc<Conn<W>>) -> u64 {
        let request = self.next_request;
        self.next_request += 1;
        match self.list.iter_mut().find(|h| Rc::ptr_eq(&h.conn, c)) {
            Some(h) => h.asks.push(request),
            None => self.list.push(Hold {
                conn: c.clone(),
                asks: vec![request],
                held: Vec::new(),
                bytes: 0,
            }),
        }
        request
    }

    /// A live message for `c` while it waits for retained messages: held
    /// (`Some(Ok)`), or over `max_queue` (`Some(Err)`: a slow consumer);
    /// `None` when `c` waits for nothing.
    pub(crate) fn hold(
        &mut self,
        c: &Rc<Conn<W>>,
        m: &Message,
        max_queue: usize,
    ) -> Option<Result<(), SendError>> {
        let h = self.list.iter_mut().find(|h| Rc::ptr_eq(&h.conn, c))?;
        if h.bytes + m.payload.len() > max_queue {
            return Some(Err(SendError::QueueFull));
        }
        h.bytes += m.payload.len();
        h.held.push(m.clone());
        Some(Ok(()))
    }

    /// The answer to ask `request`: its retained messages (those not held
    /// live already), at the lower of their publish's QoS and the
    /// subscription's (from `channels`), then, once the connection waits
    /// for no other answer, what was held. `None` when no open connection
    /// waits for it.
    pub(crate) fn answer(
        &mut self,
        request: u64,
        messages: &[RetainedMessage],
        channels: &mut Channels<W>,
    ) -> Option<Answered<W>> {
        let k = self.list.iter().position(|h| h.asks.contains(&request))?;
        let h = &mut self.list[k];
        h.asks.retain(|&a| a != request);
        if !h.conn.is_open() {
            self.list.swap_remove(k);
            return None;
        }
        let c = h.conn.clone();
        let version = version_of(c.kind());
        let mut out: Vec<Out> = messages
            .iter()
            .filter(|r| {
                !h.held.iter().any(|m| {
                    m.channel == r.channel && retained::same_message(&r.kept, m.message, &m.payload)
                })
            })
            .map(|r| {
                let qos = r.qos.min(channels.qos_for(&c, &r.channel));
                let m = Message {
                    id: 0,
                    message: r.kept.id,
                    text: r.kept.text,
                    at_most_once: false,
                    exactly_once: false,
                    properties: r.properties.clone(),
                    retained: true,
                    origin: 0,
                    channel: r.channel.clone(),
                    payload: r.kept.payload.clone(),
                };
                match (qos, Qos1::with_retain(version, &m, true)) {
                    (1, Some(q)) => Out::Qos1(q),
                    (2, Some(q)) => Out::Qos1(q.exactly_once()),
                    _ => Out::Qos0(publish(version, r)),
                }
            })
            .collect();
        let retained = out.len();
        let done = h.asks.is_empty();
        if done {
            let held = self.list.swap_remove(k).held;
            out.extend(held.iter().map(|m| {
                let most = if m.at_most_once {
                    0
                } else {
                    1 + u8::from(m.exactly_once)
                };
                let qos = channels.qos_for(&c, &m.channel).min(most);
                match (qos, Qos1::of(version, m)) {
                    (1, Some(q)) => Out::Qos1(q),
                    (2, Some(q)) => Out::Qos1(q.exactly_once()),
                    _ => Out::Qos0(mqtt::publish(version, m)),
                }
            }));
        }
        Some(Answered {
            conn: c,
            out,
            retained,
            done,
        })
    }

    /// `c` is gone: it waits for nothing any more.
    pub(crate) fn forget(&mut self, c: &Conn<W>) {
        self.list.retain(|h| !std::ptr::eq(Rc::as_ptr(&h.conn), c));
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
            let request = p.subs.outside().retained_asks.borrow()[0].0;
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
                store.set("c", 0, kept, Bytes::new());
            }
            p.subs.fanout(&Message {
                id: i as u64 + 1,
                message: id,
                text: true,
                at_most_once: false,
                exactly_once: false,
                properties: Bytes::new(),
                retained: false,
                origin: 0,
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
        p.subs.subscribe_mqtt("c", &c, 0);
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
