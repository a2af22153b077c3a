//! The waiting room: requests whose answer is slow to come (a back end that
//! sleeps) wait here, outside tokio, instead of in a task each.
//!
//! A request that has gone out and has no byte of its answer after a short
//! wait in its task ([`super::worker`]) leaves the task: its socket leaves
//! tokio's reactor for one epoll set per worker (`throng-host`'s
//! [`Poller`]), and what it still needs to know (its target, its times, the
//! answer read so far) is one [`Waiting`] in a table indexed by file
//! descriptor. Measured at 5,000 requests in flight with `sleep: 5000`
//! (`scripts/bench-attack.sh`): a task, its registration and its timer cost
//! about 1,460 bytes per request; a waiting request costs a few hundred.
//!
//! Timeouts: every request has the same `--timeout` from its start, and
//! requests start in order, so their deadlines come in the order they
//! entered: a queue, checked against the clock, is their timer.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, Read as _};
use std::net::TcpStream;
use std::os::fd::AsRawFd as _;
use std::rc::Rc;
use std::time::{Duration, Instant};

use throng_host::poll::{Events, Interest, Poller};
use tokio::sync::Notify;

use super::record::{Exchange, RequestError};
use super::worker::{Ctx, Io, Link, ResponseReader, attempt, finish};
use crate::harness::clock::micros;
use crate::harness::failure::{Failure, NetCause};

/// One request waiting for its answer: 80 bytes, most of a waiting
/// request's cost (its deadline is in the room's queue).
pub(super) struct Waiting {
    stream: TcpStream,
    /// Its target (an index into the plan's).
    t: u32,
    seq: u64,
    /// Its place in the timeout queue, to tell it from a later request on
    /// the same file descriptor.
    ticket: u64,
    /// When it was due, µs after the schedule's start.
    intended_us: u64,
    /// When it went on the wire.
    sent_at: Instant,
    bytes_in: u64,
    bytes_out: u64,
    /// The answer so far, once any of it came (a head in pieces, a body).
    reader: Option<Box<ResponseReader>>,
    /// Its connection was reused and this is its first try: if the
    /// connection ends before any byte of the answer (the server closed it
    /// while idle, just as the request went out), it goes again on a new
    /// one, as it would have in its task.
    may_retry: bool,
}

impl Waiting {
    /// The request `seq` (target `t`) on `stream` (out of tokio's reactor),
    /// its figures so far in `io`; `may_retry` as [`Waiting::may_retry`].
    pub(super) fn new(
        ctx: &Ctx,
        stream: TcpStream,
        seq: u64,
        t: usize,
        intended: Instant,
        io: &Io,
        may_retry: bool,
    ) -> Self {
        let start = ctx.start.instant();
        Self {
            stream,
            t: u32::try_from(t).unwrap_or(u32::MAX),
            seq,
            ticket: 0,
            intended_us: micros(intended.saturating_duration_since(start)),
            sent_at: io.sent_at.unwrap_or(io.began),
            bytes_in: io.bytes_in,
            bytes_out: io.bytes_out,
            reader: None,
            may_retry,
        }
    }

    /// When it was due.
    fn intended(&self, ctx: &Ctx) -> Instant {
        ctx.start.instant() + Duration::from_micros(self.intended_us)
    }

    /// Records how it ended, and that its task's work is done; its
    /// connection goes back to its pool as `keep`, or is closed.
    fn end(self, ctx: &Ctx, result: Result<u16, RequestError>, keep: bool) {
        let intended = self.intended(ctx);
        let Self {
            stream,
            seq,
            t,
            sent_at,
            bytes_in,
            bytes_out,
            ..
        } = self;
        let t = t as usize;
        free_place(ctx, keep.then_some(stream), ctx.pool_of[t]);
        let io = Io {
            bytes_in,
            bytes_out,
            began: sent_at,
            sent_at: Some(sent_at),
        };
        finish(ctx, seq, t, intended, &io, result);
        ctx.live.done();
    }

    /// Its connection was stale: closes it and sends the request again, on
    /// a new connection, by its first try's deadline (counted from when it
    /// first went out).
    fn retry(self, ctx: &Rc<Ctx>) {
        let intended = self.intended(ctx);
        free_place(ctx, None, ctx.pool_of[self.t as usize]);
        ctx.rec.borrow_mut().retried();
        let io = Io {
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            began: self.sent_at,
            sent_at: None,
        };
        let deadline = self.sent_at + ctx.timeout;
        let (c, seq) = (ctx.clone(), self.seq);
        tokio::task::spawn_local(async move {
            if attempt(&c, seq, intended, io, deadline, None, true).await {
                c.live.done();
            }
        });
    }
}

/// The waiting requests of one worker.
pub(super) struct WaitingRoom {
    poller: Poller,
    /// Indexed by file descriptor. Invariant: `slots[fd]` is `Some` exactly
    /// when `fd` is in `poller` (with itself as token) and owned by its stream.
    slots: RefCell<Vec<Option<Waiting>>>,
    /// (deadline, fd, ticket) in the order requests entered, so in
    /// deadline order (see the module's notes).
    deadlines: RefCell<VecDeque<(Instant, u32, u64)>>,
    next_ticket: Cell<u64>,
    /// The first request entered an empty room: the loop has a deadline again.
    entered: Notify,
}

impl WaitingRoom {
    /// An empty room. Must be called inside the worker's runtime.
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            poller: Poller::new()?,
            slots: RefCell::default(),
            deadlines: RefCell::default(),
            next_ticket: Cell::new(1),
            entered: Notify::new(),
        })
    }

    /// Takes `wait` in, to be ended by `deadline`; gives it back if its
    /// socket cannot be watched.
    pub(super) fn enter(&self, mut wait: Waiting, deadline: Instant) -> Result<(), Waiting> {
        let fd = wait.stream.as_raw_fd();
        let Ok(index) = usize::try_from(fd) else {
            return Err(wait);
        };
        if self
            .poller
            .add(&wait.stream, index as u64, Interest::Read)
            .is_err()
        {
            return Err(wait);
        }
        let ticket = self.next_ticket.get();
        self.next_ticket.set(ticket + 1);
        wait.ticket = ticket;
        let mut deadlines = self.deadlines.borrow_mut();
        deadlines.push_back((deadline, fd as u32, ticket));
        if deadlines.len() == 1 {
            self.entered.notify_one();
        }
        let mut slots = self.slots.borrow_mut();
        if slots.len() <= index {
            slots.resize_with(index + 1, || None);
        }
        slots[index] = Some(wait);
        Ok(())
    }

    /// Gives a request that could not wait here back its task's ending:
    /// a failure, its connection closed.
    pub(super) fn refuse(&self, ctx: &Ctx, wait: Waiting) {
        let intended = wait.intended(ctx);
        let Waiting {
            seq,
            t,
            sent_at,
            bytes_in,
            bytes_out,
            ..
        } = wait;
        let t = t as usize;
        free_place(ctx, None, ctx.pool_of[t]);
        let io = Io {
            bytes_in,
            bytes_out,
            began: sent_at,
            sent_at: Some(sent_at),
        };
        finish(
            ctx,
            seq,
            t,
            intended,
            &io,
            Err(Failure::Net(NetCause::Other)),
        );
    }

    /// The loop: reads answers as they come, ends requests at their deadline.
    pub(super) async fn run(&self, ctx: &Rc<Ctx>) {
        let mut events = Events::with_capacity(1024);
        loop {
            let next = self.deadlines.borrow().front().map(|d| d.0);
            let deadline = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => self.entered.notified().await,
                }
            };
            tokio::select! {
                got = self.poller.wait(&mut events) => {
                    if got.is_err() {
                        return;
                    }
                    for ev in events.iter() {
                        self.readable(ctx, ev.token as usize);
                    }
                }
                () = deadline => self.expire(ctx, Instant::now()),
            }
        }
    }

    /// Reads what request `fd` got; ends it when its answer is whole (or
    /// sends it again, when its reused connection ended before any of it).
    fn readable(&self, ctx: &Rc<Ctx>, fd: usize) {
        let mut slots = self.slots.borrow_mut();
        let Some(Some(wait)) = slots.get_mut(fd) else {
            return;
        };
        let method = ctx.plan.targets[wait.t as usize].method.as_str();
        let outcome = {
            let mut scratch = ctx.scratch.borrow_mut();
            loop {
                match (&wait.stream).read(&mut scratch[..]) {
                    Ok(0) => {
                        let status = wait.reader.as_mut().and_then(|r| r.eof());
                        break Some(
                            status
                                .map(|s| (s, false))
                                .ok_or(Failure::Own(Exchange::Closed)),
                        );
                    }
                    Ok(n) => {
                        wait.bytes_in += n as u64;
                        ctx.rec.borrow_mut().bytes_in(n);
                        let reader = wait
                            .reader
                            .get_or_insert_with(|| Box::new(ResponseReader::new()));
                        match reader.feed(&scratch[..n], method) {
                            Ok(Some(done)) => break Some(Ok(done)),
                            Ok(None) => {}
                            Err(why) => break Some(Err(why)),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Some(Err(RequestError::from_io(&e))),
                }
            }
        };
        let Some(outcome) = outcome else { return };
        let Some(wait) = slots[fd].take() else { return };
        drop(slots);
        let _ = self.poller.remove(&wait.stream);
        match outcome {
            Ok((status, keep)) => {
                let back = keep && ctx.plan.settings.keepalive && !ctx.stop.is_set();
                wait.end(ctx, Ok(status), back);
            }
            Err(_) if wait.may_retry && wait.reader.is_none() => wait.retry(ctx),
            Err(why) => wait.end(ctx, Err(why), false),
        }
    }

    /// Ends every request whose deadline is at or before `now` as a timeout.
    fn expire(&self, ctx: &Ctx, now: Instant) {
        loop {
            let due = {
                let mut deadlines = self.deadlines.borrow_mut();
                match deadlines.front() {
                    Some(&(at, fd, ticket)) if at <= now => {
                        deadlines.pop_front();
                        Some((fd as usize, ticket))
                    }
                    _ => None,
                }
            };
            let Some((fd, ticket)) = due else { return };
            let wait = {
                let mut slots = self.slots.borrow_mut();
                match slots.get_mut(fd) {
                    Some(slot) if slot.as_ref().is_some_and(|w| w.ticket == ticket) => slot.take(),
                    _ => None,
                }
            };
            // Gone already: answered before its deadline.
            let Some(wait) = wait else { continue };
            let _ = self.poller.remove(&wait.stream);
            wait.end(ctx, Err(Failure::Net(NetCause::Timeout)), false);
        }
    }
}

/// The connection of an ended request: back to pool `pool` (`keep`), or
/// closed; either way the cap's waiters hear of it.
fn free_place(ctx: &Ctx, keep: Option<TcpStream>, pool: usize) {
    let back = keep.and_then(|s| tokio::net::TcpStream::from_std(s).ok());
    match back {
        Some(stream) => {
            ctx.pools[pool]
                .borrow_mut()
                .push(Link { stream, tls: None });
        }
        None => {
            ctx.open.set(ctx.open.get().saturating_sub(1));
            ctx.rec.borrow_mut().connection_closed();
        }
    }
    ctx.freed.notify_one();
}
