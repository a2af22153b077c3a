//! The supervisor, its broker and the Redis session driven in memory
//! against a fake Redis ([`crate::redis::fake`]) and fake workers that
//! speak the control records: no sockets, no processes, time injected
//! (the model is quinn-proto's `Pair`). Each test states one rule of the
//! path of a published message.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

use super::{Event, Supervisor, WorkerCommand};
use crate::config::Config;
use crate::control::{Message, Record};
use crate::history::MessageId;
use crate::redis::fake::{self, FakeRedis};
use crate::redis::session::{MAX_IN_FLIGHT, Output, Session};
use crate::redis::{Command, Conn, RedisMode, SessionError};

/// A worker as the supervisor sees it: the records it is sent; it answers
/// each `Deliver` with its subscriber count.
struct FakeWorker {
    rx: mpsc::UnboundedReceiver<Bytes>,
    buf: BytesMut,
    subscribers: u64,
    /// Answers no delivery (a worker stuck, about to die).
    silent: bool,
    /// Every record it got but `Config` and `Broker`, in order.
    got: Vec<Record>,
}

/// The whole path of a published message, in memory.
struct Pair {
    sup: Supervisor,
    workers: Vec<FakeWorker>,
    cmds: mpsc::UnboundedReceiver<Command>,
    session: Session,
    redis: FakeRedis,
    now: Instant,
    /// The connection whose bytes from Redis are held back (to hear the
    /// other first, or to lose them with a reconnect).
    held: Option<Conn>,
    /// Events the supervisor's own loop would get (restart timers): kept
    /// so its sends succeed.
    _events: mpsc::UnboundedReceiver<Event>,
}

impl Pair {
    /// A supervisor of workers with these subscriber counts, linked to a
    /// fake Redis in `mode`, `history` messages kept per channel (0: none).
    fn new(subscribers: &[u64], mode: RedisMode, history: usize) -> Self {
        let config = Config {
            workers: subscribers.len(),
            history,
            ..Config::default()
        };
        let (tx, events) = mpsc::unbounded_channel();
        let command = WorkerCommand {
            program: "/bin/false".into(),
            args: Vec::new(),
        };
        let mut sup = Supervisor::new(&config, command, tx).unwrap();
        let settings = fake::settings(mode, history);
        let cmds = sup.use_redis(settings.clone());
        let mut workers = Vec::new();
        for (i, &n) in subscribers.iter().enumerate() {
            let (tx, rx) = mpsc::unbounded_channel();
            let slot = &mut sup.slots[i];
            slot.generation = 1;
            slot.alive = true;
            slot.tx = Some(tx);
            workers.push(FakeWorker {
                rx,
                buf: BytesMut::new(),
                subscribers: n,
                silent: false,
                got: Vec::new(),
            });
        }
        let mut pair = Self {
            sup,
            workers,
            cmds,
            session: Session::new(settings, 1 << 20),
            redis: FakeRedis::default(),
            now: Instant::now(),
            held: None,
            _events: events,
        };
        pair.session.on_connected();
        pair.drive();
        pair
    }

    /// Worker `i` gets a request; returns nothing, its answer comes as a record.
    fn record(&mut self, i: usize, rec: Record) {
        self.sup.on_record(i, 1, rec);
        self.drive();
    }

    /// Worker `i` publishes `payload` on `channel` as request `id`.
    fn publish(&mut self, i: usize, id: u64, channel: &str, payload: &str) {
        self.record(i, Record::Publish(message(id, channel, payload)));
    }

    /// Worker `i` gained (`on`) or lost its subscribers of channel "news".
    fn interest(&mut self, i: usize, on: bool) {
        self.record(i, interest(on));
    }

    /// Worker 0 asks for what channel "news" kept after `since`, as request `id`.
    fn recover(&mut self, id: u64, since: MessageId) {
        let channel = "news".into();
        self.record(0, Record::Recover { id, since, channel });
    }

    /// Moves everything that can move until nothing does.
    fn drive(&mut self) {
        while self.step() {}
    }

    /// One round: commands into the session, its outputs out, Redis's
    /// bytes in, the workers' records handled. Whether anything moved.
    fn step(&mut self) -> bool {
        let mut moved = false;
        while let Ok(cmd) = self.cmds.try_recv() {
            self.session.on_command(cmd, self.now);
            moved = true;
        }
        while let Some(out) = self.session.poll_output() {
            moved = true;
            match out {
                Output::Write(conn, bytes) => self.redis.on_bytes(conn, &bytes),
                Output::Event(ev) => {
                    self.sup.on_event(Event::Broker(ev));
                }
            }
        }
        if self.session.wants_permit()
            && let Ok(p) = self.session.in_flight().try_acquire_owned()
        {
            self.session.on_permit(p, self.now).unwrap();
            moved = true;
        }
        for conn in [Conn::Publisher, Conn::Subscriber] {
            if self.held != Some(conn)
                && let Some(b) = self.redis.take(conn)
            {
                self.session.on_bytes(conn, &b, self.now).unwrap();
                moved = true;
            }
        }
        for i in 0..self.workers.len() {
            moved |= self.worker(i);
        }
        moved
    }

    /// Worker `i` reads what it was sent and answers each delivery.
    fn worker(&mut self, i: usize) -> bool {
        let w = &mut self.workers[i];
        let mut moved = false;
        while let Ok(b) = w.rx.try_recv() {
            w.buf.extend_from_slice(&b);
        }
        let mut answers = Vec::new();
        while let Some(rec) = Record::decode(&mut w.buf).unwrap() {
            moved = true;
            match &rec {
                Record::Config(_) | Record::Broker { .. } => continue,
                Record::Deliver(_) if w.silent => {}
                Record::Deliver(m) => answers.push(Record::Delivered {
                    id: m.id,
                    subscribers: w.subscribers,
                }),
                _ => {}
            }
            w.got.push(rec);
        }
        for a in answers {
            self.sup.on_record(i, 1, a);
        }
        moved
    }

    /// Both connections break and are made again (time moves on).
    fn reconnect(&mut self) {
        self.redis.disconnect();
        self.session
            .on_closed(&SessionError::Closed(Conn::Publisher));
        self.drive();
        self.now += Duration::from_millis(100);
        self.session.on_connected();
        self.drive();
    }

    /// The records worker `i` got, taken.
    fn got(&mut self, i: usize) -> Vec<Record> {
        std::mem::take(&mut self.workers[i].got)
    }
}

/// A worker's news: it gained (`on`) or lost its subscribers of "news".
fn interest(on: bool) -> Record {
    Record::Interest {
        channel: "news".into(),
        subscribed: on,
    }
}

pub(super) fn message(id: u64, channel: &str, payload: &str) -> Message {
    Message::sample(id, channel, Bytes::copy_from_slice(payload.as_bytes()))
}

/// The payloads of the `Deliver` records among `got`.
fn delivered(got: &[Record]) -> Vec<String> {
    got.iter()
        .filter_map(|r| match r {
            Record::Deliver(m) => Some(String::from_utf8_lossy(&m.payload).into_owned()),
            _ => None,
        })
        .collect()
}

/// The answer to recovery request `id` among `got`: complete, and the payloads.
fn recovered(got: &[Record], id: u64) -> Option<(bool, Vec<String>)> {
    got.iter().find_map(|r| match r {
        Record::Recovered {
            id: i,
            complete,
            messages,
        } if *i == id => Some((
            *complete,
            messages
                .iter()
                .map(|k| String::from_utf8_lossy(&k.payload).into_owned())
                .collect(),
        )),
        _ => None,
    })
}

#[test]
fn a_publish_goes_through_redis_to_every_worker_and_is_answered_with_redis_count() {
    let mut p = Pair::new(&[3, 4], RedisMode::Pattern, 0);
    p.publish(1, 7, "news", "hello");
    for i in 0..2 {
        let got = p.got(i);
        assert_eq!(delivered(&got), ["hello"], "worker {i}");
        if i == 1 {
            // Redis's receivers (this node), not the workers' subscribers:
            // the workers' counts go nowhere for a message from Redis.
            assert!(
                got.contains(&Record::Published {
                    id: 7,
                    subscribers: 1,
                    message: MessageId::NONE
                }),
                "{got:?}"
            );
        }
    }
    assert_eq!(p.redis.published.len(), 1);
}

#[test]
fn a_message_from_redis_holds_its_place_until_every_worker_delivered_or_died() {
    let mut p = Pair::new(&[1, 1], RedisMode::Pattern, 0);
    p.workers[1].silent = true;
    let free = |p: &Pair| p.session.in_flight().available_permits();
    // One place is the session's own, in hand for the next message.
    assert_eq!(free(&p), MAX_IN_FLIGHT - 1);
    p.publish(0, 1, "news", "x");
    assert_eq!(delivered(&p.got(1)), ["x"]);
    assert_eq!(free(&p), MAX_IN_FLIGHT - 2, "worker 1 still owes its count");
    p.sup.worker_gone(1, 1);
    p.drive();
    assert_eq!(free(&p), MAX_IN_FLIGHT - 1, "nobody waits for the dead");
}

#[test]
fn a_publish_cut_off_by_a_reconnect_is_answered_with_an_error_never_a_count() {
    let mut p = Pair::new(&[1], RedisMode::Pattern, 0);
    // Redis runs the publish, but its reply is lost with the connection.
    p.held = Some(Conn::Publisher);
    p.publish(0, 1, "news", "lost");
    assert_eq!(p.redis.published.len(), 1, "Redis has it");
    p.reconnect();
    p.held = None;
    let got = p.got(0);
    // Delivered here, yet its publisher hears only that it may have been.
    assert_eq!(delivered(&got), ["lost"]);
    let failed: Vec<&Record> = got
        .iter()
        .filter(|r| matches!(r, Record::PublishFailed { id: 1, .. }))
        .collect();
    assert_eq!(failed.len(), 1, "{got:?}");
    let Record::PublishFailed { reason, .. } = failed[0] else {
        unreachable!()
    };
    let reason = String::from_utf8_lossy(reason);
    assert!(
        reason.contains("may or may not have been delivered"),
        "{reason}"
    );
    assert!(
        !got.iter().any(|r| matches!(r, Record::Published { .. })),
        "{got:?}"
    );
    // Up again: the next publish is answered with a count.
    p.publish(0, 2, "news", "after");
    let got = p.got(0);
    assert_eq!(delivered(&got), ["after"]);
    assert!(got.iter().any(|r| matches!(
        r,
        Record::Published {
            id: 2,
            subscribers: 1,
            ..
        }
    )));
}

#[test]
fn while_redis_is_down_a_publish_is_refused_at_once() {
    let mut p = Pair::new(&[1], RedisMode::Pattern, 0);
    p.redis.disconnect();
    p.session.on_closed(&SessionError::Closed(Conn::Subscriber));
    p.sup.on_event(Event::Broker(crate::redis::Event::Down {
        reason: SessionError::Closed(Conn::Subscriber),
        retry_in: Duration::from_millis(100),
    }));
    p.drive();
    p.publish(0, 3, "news", "nobody");
    let got = p.got(0);
    assert!(
        got.iter()
            .any(|r| matches!(r, Record::PublishFailed { id: 3, reason }
            if String::from_utf8_lossy(reason).contains("unreachable"))),
        "{got:?}"
    );
    assert!(p.redis.published.is_empty());
}

#[test]
fn in_channels_mode_the_node_hears_a_channel_while_any_worker_has_subscribers_of_it() {
    let mut p = Pair::new(&[2, 2], RedisMode::Channels, 0);
    p.publish(0, 1, "news", "unheard");
    p.interest(0, true);
    p.publish(0, 2, "news", "heard");
    p.interest(1, true);
    p.interest(0, false);
    p.publish(0, 3, "news", "still");
    p.interest(1, false);
    p.publish(0, 4, "news", "gone");
    let got = p.got(0);
    assert_eq!(delivered(&got), ["heard", "still"]);
    let answers: Vec<(u64, u64)> = got
        .iter()
        .filter_map(|r| match r {
            Record::Published {
                id, subscribers, ..
            } => Some((*id, *subscribers)),
            _ => None,
        })
        .collect();
    assert_eq!(answers, [(1, 0), (2, 1), (3, 1), (4, 0)]);
}

#[test]
fn a_recovery_since_an_id_gets_what_the_stream_kept_after_it() {
    let mut p = Pair::new(&[1, 1], RedisMode::Channels, 3);
    p.interest(0, true);
    for (id, body) in ["a", "b", "c", "d"].iter().enumerate() {
        p.publish(1, id as u64, "news", body);
    }
    let got = p.got(1);
    let ids: Vec<MessageId> = got
        .iter()
        .filter_map(|r| match r {
            Record::Deliver(m) => Some(m.message),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 4, "{got:?}");
    // Since "b": "c" and "d", complete ("b" itself is still kept).
    p.recover(9, ids[1]);
    assert_eq!(
        recovered(&p.got(0), 9),
        Some((true, vec!["c".into(), "d".into()]))
    );
    // Since "a": "a" itself went with the trim to 3, so nothing shows
    // that no message after it went too: what is kept, not complete.
    p.recover(10, ids[0]);
    assert_eq!(
        recovered(&p.got(0), 10),
        Some((false, vec!["b".into(), "c".into(), "d".into()]))
    );
}

#[test]
fn a_recovery_for_a_channel_not_yet_subscribed_waits_for_the_subscription() {
    let mut p = Pair::new(&[1], RedisMode::Channels, 5);
    p.publish(0, 1, "news", "old");
    // The interest and the recovery arrive together; Redis confirms the
    // subscription only when the subscriber connection is heard.
    p.held = Some(Conn::Subscriber);
    p.sup.on_record(0, 1, interest(true));
    p.recover(4, MessageId { epoch: 1, seq: 0 });
    assert_eq!(
        recovered(&p.got(0), 4),
        None,
        "answered before the subscription"
    );
    p.held = None;
    p.drive();
    assert_eq!(recovered(&p.got(0), 4), Some((true, Vec::new())));
}

#[test]
fn a_retained_answer_comes_after_every_message_published_before_the_store_was_read() {
    let mut p = Pair::new(&[1], RedisMode::Pattern, 0);
    // Redis has published "one" (retained) before it reads the store, but
    // the subscriber connection is heard after the publisher's replies.
    p.held = Some(Conn::Subscriber);
    p.record(
        0,
        Record::PublishRetained {
            qos: 1,
            message: message(1, "news", "one"),
        },
    );
    p.record(
        0,
        Record::RetainedAsk {
            id: 2,
            filters: vec!["news".into()],
        },
    );
    p.held = None;
    p.drive();
    let got = p.got(0);
    let order: Vec<&str> = got
        .iter()
        .filter_map(|r| match r {
            Record::Deliver(_) => Some("deliver"),
            Record::Retained { .. } => Some("retained"),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["deliver", "retained"], "{got:?}");
    let Some(Record::Retained { messages, .. }) =
        got.iter().find(|r| matches!(r, Record::Retained { .. }))
    else {
        unreachable!()
    };
    assert_eq!(&messages[0].kept.payload[..], b"one");
}
