//! Every subscriber of one worker, without sockets or clocks of its own:
//! the tables (by slot, by channel), the fan-out hot path, the clock in
//! ticks and what each tick does (heartbeat pings and idle checks spread
//! over the ping interval, overdue closing handshakes, stalled queues).
//!
//! What it needs from around it is the [`Outside`]: readiness registration
//! (the worker's epoll in production) and the report of a channel's first
//! and last subscriber (to the supervisor, for Redis channels mode). Each
//! connection's life is in [`super::conn`]; tests drive both in memory.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use throng_host::process;
use throng_proto::ws::{self, OpCode, close_code};

use super::conn::{CLOSE_GRACE, Conn, State, Wire};
use super::table::{Channels, NONE, Slab};
use crate::auth;
use crate::control::Message;
use crate::metrics::{CloseReason, Counters};
use crate::wheel::{self, Sweep};

/// Size of the one read buffer per worker. Clients only send control
/// frames, so this is far more than one read ever needs.
pub(crate) const SCRATCH: usize = 64 * 1024;

/// What the subscribers need from around them.
pub(crate) trait Outside {
    /// A subscriber's byte stream.
    type Wire: Wire;
    /// Watches a new subscriber's wire for reading, reported as `slot`.
    fn watch(&self, wire: &Self::Wire, slot: u32) -> io::Result<()>;
    /// Watches it for room to write too (while it has a queue), or no longer.
    fn want_write(&self, wire: &Self::Wire, slot: u32, on: bool);
    /// Stops watching it (the connection is gone), and gives back what it
    /// was counted under (`tag`, see [`Conn::tag`]).
    fn forget(&self, wire: &Self::Wire, tag: u32);
    /// A channel got its first subscriber here (`true`) or lost its last.
    fn channel_interest(&self, channel: &str, subscribed: bool);
}

/// The settings a subscriber's life follows, in the worker's ticks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Unsent bytes a connection may queue (`--max-queue`).
    pub(crate) max_queue: usize,
    /// How often every connection is pinged (`--ping-interval`).
    pub(crate) ping_interval: Duration,
    /// Ticks without a word from the client before 1008 (`--idle-timeout`).
    pub(crate) idle: u32,
    /// Ticks a queue may make no progress before 1008 (`--write-timeout`).
    pub(crate) write: u32,
    /// Ticks a closing handshake may take ([`CLOSE_GRACE`]).
    pub(crate) grace: u32,
}

impl Limits {
    /// The limits of `cfg`.
    pub(crate) fn of(cfg: &crate::Config) -> Self {
        Self {
            max_queue: cfg.max_queue,
            ping_interval: cfg.ping_interval,
            idle: wheel::ticks(cfg.idle_timeout),
            write: wheel::ticks(cfg.write_timeout),
            grace: wheel::ticks(CLOSE_GRACE),
        }
    }
}

/// A connection in a closing handshake, and the tick the handshake started.
pub(crate) type Closing<W> = (Rc<Conn<W>>, u32);

/// One worker's subscribers. Nothing here is shared between threads:
/// `Cell`/`RefCell` state, borrowed one operation at a time.
pub(crate) struct Subscribers<O: Outside> {
    pub(crate) limits: Limits,
    pub(crate) outside: O,
    pub(crate) counters: Rc<Counters>,
    pub(crate) conns: RefCell<Slab<O::Wire>>,
    pub(crate) channels: RefCell<Channels<O::Wire>>,
    /// The one read buffer: every subscriber reads into it, in turn (and
    /// the worker's HTTP connections too, between requests).
    pub(crate) scratch: RefCell<Box<[u8]>>,
    /// TLS subscribers: what the records just read decrypt to.
    pub(crate) tls_plain: RefCell<Vec<u8>>,
    /// TLS subscribers: one frame (or control record) encrypted for one
    /// connection, written from here.
    pub(crate) tls_out: RefCell<Vec<u8>>,
    /// Ticks of [`wheel::TICK`] since the worker started.
    pub(crate) now: Cell<u32>,
    /// Unix seconds, set by the worker before each tick: tokens expire on
    /// the wall clock, while ticks stretch with a busy worker.
    pub(crate) wall: Cell<u64>,
    /// Subscribers that have a write queue (checked each tick for `--write-timeout`).
    pub(crate) queued: RefCell<Vec<Rc<Conn<O::Wire>>>>,
    /// Connections in a closing handshake, with the tick it started.
    pub(crate) closing: RefCell<Vec<Closing<O::Wire>>>,
    sweep: RefCell<Sweep>,
    ping: Bytes,
}

impl<O: Outside> Subscribers<O> {
    pub(crate) fn new(limits: Limits, outside: O, counters: Rc<Counters>) -> Self {
        Self {
            limits,
            outside,
            counters,
            conns: RefCell::default(),
            channels: RefCell::default(),
            scratch: RefCell::new(vec![0; SCRATCH].into_boxed_slice()),
            tls_plain: RefCell::default(),
            tls_out: RefCell::default(),
            now: Cell::new(0),
            wall: Cell::new(0),
            queued: RefCell::default(),
            closing: RefCell::default(),
            sweep: RefCell::new(Sweep::new(limits.ping_interval)),
            ping: ws::server_frame(OpCode::Ping, b""),
        }
    }

    /// Subscribers here now.
    pub(crate) fn len(&self) -> usize {
        self.conns.borrow().len()
    }

    /// Registers an upgraded connection: into the tables and the readiness set.
    pub(crate) fn subscribe(&self, channel: &str, c: Conn<O::Wire>) -> io::Result<()> {
        let c = Rc::new(c);
        self.conns.borrow_mut().insert(&c);
        if let Err(e) = self.outside.watch(c.wire(), c.slot.get()) {
            self.conns.borrow_mut().remove(&c);
            return Err(e);
        }
        if self.channels.borrow_mut().subscribe(channel, &c) {
            self.outside.channel_interest(channel, true);
        }
        self.counters.open.set(self.counters.open.get() + 1);
        crate::metrics::inc(&self.counters.upgraded);
        if c.has_rest() {
            // Frames that came in the same packet as the upgrade request.
            self.on_readable(&c, false);
        }
        Ok(())
    }

    /// Takes a subscriber out of its channel, saying so when that was the
    /// channel's last subscriber here.
    pub(crate) fn unsubscribe(&self, c: &Conn<O::Wire>) {
        let gone = self.channels.borrow_mut().unsubscribe(c);
        if let Some(name) = gone {
            self.outside.channel_interest(&name, false);
        }
    }

    /// The subscriber in `slot`, if any.
    pub(crate) fn get(&self, slot: u64) -> Option<Rc<Conn<O::Wire>>> {
        let slot = usize::try_from(slot).ok()?;
        self.conns.borrow().get(slot).cloned()
    }

    /// Writes one message to every subscriber of its channel here: encoded
    /// once, then one write per subscriber; only a subscriber whose socket
    /// is full gets a queue. Returns the number of subscribers.
    pub(crate) fn fanout(&self, m: &Message) -> u64 {
        let start = Instant::now();
        let cpu = process::thread_cpu();
        let frame = ws::server_frame(
            if m.text { OpCode::Text } else { OpCode::Binary },
            &m.payload,
        );
        let mut behind = Vec::new();
        let n = {
            let channels = self.channels.borrow();
            let Some(ch) = channels.get(&m.channel) else {
                return 0;
            };
            let mut delivered = 0u64;
            for c in &ch.subs {
                match self.send(c, &frame) {
                    Ok(()) => delivered += 1,
                    Err(e) => behind.push((c.clone(), e)),
                }
            }
            self.counters
                .frames_delivered
                .set(self.counters.frames_delivered.get() + delivered);
            ch.subs.len() as u64
        };
        self.counters
            .frames_dropped
            .set(self.counters.frames_dropped.get() + behind.len() as u64);
        for (c, e) in behind {
            self.send_failed(&c, e);
        }
        self.counters
            .fanout(start.elapsed(), process::thread_cpu().saturating_sub(cpu));
        n
    }

    /// Advances the clock one tick without visiting anyone (while draining).
    pub(crate) fn advance(&self) -> u32 {
        let now = self.now.get().wrapping_add(1);
        self.now.set(now);
        now
    }

    /// One tick: advances the clock, walks this tick's slice of the table
    /// (a connection whose token expired or that was idle too long is
    /// closed, any other open one pinged), ends closing handshakes past
    /// their grace and queues stalled past `--write-timeout`. So a token is
    /// enforced within one ping interval of its `exp`, with no timer of its own.
    pub(crate) fn tick(&self) {
        let now = self.advance();
        let wall = self.wall.get();
        let mut expired = Vec::new();
        let mut idle_out = Vec::new();
        let mut slow = Vec::new();
        {
            let conns = self.conns.borrow();
            for slot in self.sweep.borrow_mut().step(conns.capacity()) {
                let Some(c) = conns.get(slot) else { continue };
                if !c.is_open() {
                    continue;
                }
                if c.expired(wall) {
                    expired.push(c.clone());
                } else if wheel::expired(now, c.last_seen.get(), self.limits.idle) {
                    idle_out.push(c.clone());
                } else {
                    match self.send(c, &self.ping) {
                        Ok(()) => crate::metrics::inc(&self.counters.pings),
                        Err(e) => slow.push((c.clone(), e)),
                    }
                }
            }
        }
        for c in expired {
            self.close(
                &c,
                auth::CLOSE_TOKEN_EXPIRED,
                "token expired",
                CloseReason::TokenExpired,
            );
        }
        for c in idle_out {
            self.close(
                &c,
                close_code::POLICY,
                "idle timeout",
                CloseReason::IdleTimeout,
            );
        }
        for (c, e) in slow {
            self.send_failed(&c, e);
        }
        let overdue: Vec<_> = {
            let mut closing = self.closing.borrow_mut();
            let mut out = Vec::new();
            closing.retain(|(c, since)| {
                if c.state.get() == State::Gone || c.slot.get() == NONE {
                    return false;
                }
                if wheel::expired(now, *since, self.limits.grace) {
                    out.push(c.clone());
                    return false;
                }
                true
            });
            out
        };
        for c in overdue {
            self.finish(&c);
        }
        let late: Vec<_> = {
            let mut queued = self.queued.borrow_mut();
            let mut late = Vec::new();
            queued.retain(|c| match c.queued_since() {
                Some(since) if c.state.get() != State::Gone => {
                    if wheel::expired(now, since, self.limits.write) {
                        late.push(c.clone());
                        return false;
                    }
                    true
                }
                _ => {
                    c.listed.set(false);
                    false
                }
            });
            late
        };
        for c in late {
            c.listed.set(false);
            self.close_slow(&c, "timeout");
        }
    }

    /// Starts the closing handshake of every subscriber (a drain); returns
    /// how many there were.
    pub(crate) fn close_all(&self, code: u16, reason: &str, why: CloseReason) -> usize {
        let all = self.conns.borrow().all();
        for c in &all {
            self.close(c, code, reason, why);
        }
        all.len()
    }
}

#[cfg(test)]
mod tests {
    //! What the tick does to connections, and the drain, both ends in
    //! memory ([`Pair`]) on the worker's clock.

    use throng_proto::ws::{OpCode, close_code};

    use super::Limits;
    use crate::metrics::CloseReason;
    use crate::wheel::TICK;
    use crate::worker::conn::State;
    use crate::worker::pair::{Got, Pair, limits};

    fn pings(got: &[Got]) -> usize {
        got.iter().filter(|g| matches!(g, Got::Ping(_))).count()
    }

    #[test]
    fn a_silent_client_is_closed_1008_and_dropped_after_the_grace() {
        let mut p = Pair::new(limits(1 << 20, 3, 1000, 2));
        let a = p.connect("news");
        p.tick(2);
        assert_eq!(pings(&p.clients[a].take()), 2, "pinged while silent");
        p.tick(1);
        assert_eq!(
            p.clients[a].take(),
            [Got::Close(Some(close_code::POLICY), "idle timeout".into())]
        );
        assert_eq!(p.conn(a).unwrap().state.get(), State::Closing);
        assert_eq!(p.publish("news", "x"), 0, "no longer delivered to");
        p.tick(1);
        assert!(!p.clients[a].server_closed(), "within the grace");
        p.tick(1);
        assert!(p.clients[a].server_closed(), "grace over: closed");
        assert_eq!(p.counters().closed.borrow()["idle_timeout"], 1);
        assert_eq!(p.counters().open.get(), 0);
    }

    #[test]
    fn a_client_that_answers_pings_stays_and_a_close_answered_ends_at_once() {
        let mut p = Pair::new(limits(1 << 20, 3, 1000, 50));
        let a = p.connect("news");
        for _ in 0..20 {
            p.tick(1);
            for g in p.clients[a].take() {
                assert_eq!(g, Got::Ping(Vec::new()));
                p.clients[a].send(OpCode::Pong, b"");
            }
        }
        assert!(p.conn(a).unwrap().is_open());
        assert_eq!(p.counters().pings.get(), 20);
        // The server closes (a drain), the client answers: gone before the grace.
        p.subs
            .close_all(close_code::GOING_AWAY, "bye", CloseReason::Shutdown);
        p.drive();
        let got = p.clients[a].take();
        assert_eq!(
            got,
            [Got::Close(Some(close_code::GOING_AWAY), "bye".into())]
        );
        p.clients[a].close(close_code::GOING_AWAY);
        p.drive();
        p.tick(1);
        assert!(p.clients[a].server_closed());
    }

    #[test]
    fn pings_are_spread_over_the_interval_one_per_connection() {
        let mut p = Pair::new(Limits {
            ping_interval: TICK * 10,
            ..limits(1 << 20, 1000, 1000, 50)
        });
        let clients: Vec<usize> = (0..20).map(|_| p.connect("c")).collect();
        for _ in 0..10 {
            let before = p.counters().pings.get();
            p.tick(1);
            assert_eq!(p.counters().pings.get() - before, 2, "two per tick");
        }
        for &c in &clients {
            assert_eq!(pings(&p.clients[c].take()), 1);
        }
    }

    #[test]
    fn an_expired_token_closes_its_subscriber_4001_within_one_sweep_and_no_one_else() {
        let mut p = Pair::new(Limits {
            ping_interval: TICK * 10,
            ..limits(1 << 20, 1000, 1000, 50)
        });
        p.subs.wall.set(1_000);
        let short = p.connect_until("news", 1_005);
        let long = p.connect_until("news", 2_000);
        let plain = p.connect("news");
        // A whole sweep just before exp: nobody is closed.
        p.subs.wall.set(1_004);
        p.tick(10);
        assert!(p.conn(short).unwrap().is_open());
        p.subs.wall.set(1_005);
        p.tick(10);
        let got = p.clients[short].take();
        assert_eq!(
            got.last(),
            Some(&Got::Close(Some(4001), "token expired".into())),
            "{got:?}"
        );
        assert_eq!(p.publish("news", "still here"), 2);
        for c in [long, plain] {
            assert!(p.conn(c).unwrap().is_open());
            assert_eq!(
                p.clients[c].take().last(),
                Some(&Got::Text("still here".into()))
            );
        }
        assert_eq!(p.counters().closed.borrow()["token_expired"], 1);
        p.clients[short].close(4001);
        p.drive();
        p.tick(1);
        assert!(p.clients[short].server_closed());
    }

    #[test]
    fn a_queue_without_progress_for_write_timeout_closes_the_client() {
        let mut p = Pair::new(Limits {
            ping_interval: TICK * 1000,
            ..limits(1 << 20, 1000, 3, 50)
        });
        let a = p.connect_with("news", 8, b"");
        p.clients[a].reading = false;
        p.publish("news", &"x".repeat(200));
        // Reading a little each tick is progress: the deadline moves.
        for _ in 0..10 {
            assert!(p.clients[a].read() > 0);
            p.tick(1);
            assert!(p.conn(a).unwrap().has_queue());
        }
        p.tick(2);
        assert!(p.conn(a).unwrap().is_open());
        p.tick(1);
        assert!(p.conn(a).is_none(), "3 ticks without progress");
        assert_eq!(p.counters().slow_consumer.borrow()["timeout"], 1);
        assert_eq!(p.counters().closed.borrow()["slow_consumer"], 1);
        assert_eq!(p.counters().queued.get(), 0);
        p.tick(1);
        assert!(p.clients[a].server_closed());
    }

    #[test]
    fn the_first_and_last_subscriber_of_a_channel_are_reported() {
        let mut p = Pair::defaults();
        let (a, b) = (p.connect("x"), p.connect("x"));
        let c = p.connect("y");
        p.clients[a].close(close_code::NORMAL);
        p.drive();
        assert_eq!(
            *p.subs.outside.interest.borrow(),
            [("x".to_owned(), true), ("y".to_owned(), true)]
        );
        p.clients[b].fin();
        p.reset(c);
        p.drive();
        assert_eq!(
            p.subs.outside.interest.borrow()[2..],
            [("x".to_owned(), false), ("y".to_owned(), false)]
        );
        assert_eq!(p.subs.len(), 0);
    }

    #[test]
    fn a_drain_closes_everyone_with_1001() {
        let mut p = Pair::defaults();
        let all: Vec<usize> = (0..3).map(|i| p.connect(&format!("c{i}"))).collect();
        let n = p.subs.close_all(
            close_code::GOING_AWAY,
            "server shutting down",
            CloseReason::Shutdown,
        );
        assert_eq!(n, 3);
        p.drive();
        for &c in &all {
            assert_eq!(
                p.clients[c].take(),
                [Got::Close(
                    Some(close_code::GOING_AWAY),
                    "server shutting down".into()
                )]
            );
            p.clients[c].close(close_code::GOING_AWAY);
        }
        p.drive();
        assert_eq!(p.subs.len(), 0);
        assert_eq!(p.counters().closed.borrow()["shutdown"], 3);
        assert!(!p.counters().closed.borrow().contains_key("peer_close"));
    }
}
