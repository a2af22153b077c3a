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
//! The room is a table and a queue, and its loop only reads: it hands back
//! each request that left it ([`Left`]) with how it ended, and the worker
//! ([`super::worker`]) records that, frees the connection or sends the
//! request again.
//!
//! Timeouts: every request has the same `--timeout` from its start, and
//! requests start in order, so their deadlines come in the order they
//! entered: a queue, checked against the clock, is their timer.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, Read as _};
use std::net::TcpStream;
use std::os::fd::AsRawFd as _;
use std::time::{Duration, Instant};

use throng_host::poll::{Events, Interest, Poller};
use tokio::sync::Notify;

use super::aims::Aims;
use super::record::{Answer, AttackRecorder, Exchange, Io, RequestError};
use super::response::ResponseReader;
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
    /// due at `intended` on a schedule that started at `start`, its figures
    /// so far in `io`; `may_retry` as [`Waiting::may_retry`].
    pub(super) fn new(
        start: Instant,
        stream: TcpStream,
        seq: u64,
        t: usize,
        intended: Instant,
        io: &Io,
        may_retry: bool,
    ) -> Self {
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

    /// It leaves the room (schedule started at `start`), ended as `how`.
    fn leave(self, start: Instant, how: Outcome) -> Left {
        Left {
            seq: self.seq,
            t: self.t as usize,
            intended: start + Duration::from_micros(self.intended_us),
            io: Io {
                bytes_in: self.bytes_in,
                bytes_out: self.bytes_out,
                began: self.sent_at,
                sent_at: Some(self.sent_at),
            },
            stream: self.stream,
            how,
            answer: self.reader.and_then(|mut r| r.take_answer()),
        }
    }
}

/// A request that left the room, and how it ended there.
pub(super) struct Left {
    pub(super) seq: u64,
    /// Its target (an index into the plan's).
    pub(super) t: usize,
    /// When it was due.
    pub(super) intended: Instant,
    /// Its figures; it began (for this try) when it went on the wire.
    pub(super) io: Io,
    /// Its connection, out of tokio's reactor.
    pub(super) stream: TcpStream,
    pub(super) how: Outcome,
    /// Its response's headers and body, when kept (for its row).
    pub(super) answer: Option<Box<Answer>>,
}

/// How a request ended in the waiting room.
pub(super) enum Outcome {
    /// Its answer came: the status, and whether the connection may be kept.
    Answered(u16, bool),
    /// Its reused connection ended before any byte of the answer: it goes
    /// again on a new one (see [`Waiting::may_retry`]).
    Stale,
    /// It failed: timed out, a broken answer, a lost connection, or it
    /// could not enter the room at all.
    Failed(RequestError),
}

/// What woke the room's loop.
pub(super) enum Wake {
    /// Sockets are readable: their file descriptors are in the events.
    Ready,
    /// The first deadline in the queue came (or the first request entered
    /// an empty room): [`WaitingRoom::expire`] what is due.
    Due,
}

/// The waiting requests of one worker.
pub(super) struct WaitingRoom {
    poller: Poller,
    /// Where the schedule starts: requests keep their due time relative to it.
    start: Instant,
    /// Indexed by file descriptor. Invariant: `slots[fd]` is `Some` exactly
    /// when `fd` is in `poller` (with itself as token) and owned by its stream.
    slots: RefCell<Vec<Option<Waiting>>>,
    /// (deadline, fd, ticket) in the order requests entered, so in
    /// deadline order (see the module's notes).
    deadlines: RefCell<VecDeque<(Instant, u32, u64)>>,
    next_ticket: Cell<u64>,
    /// The first request entered an empty room: the loop has a deadline again.
    entered: Notify,
    /// Answers' headers and bodies are kept (for Vegeta's rows).
    keep_answers: bool,
}

impl WaitingRoom {
    /// An empty room for a schedule that starts at `start`. Must be called
    /// inside the worker's runtime.
    pub(super) fn new(start: Instant, keep_answers: bool) -> io::Result<Self> {
        Ok(Self {
            keep_answers,
            poller: Poller::new()?,
            start,
            slots: RefCell::default(),
            deadlines: RefCell::default(),
            next_ticket: Cell::new(1),
            entered: Notify::new(),
        })
    }

    /// Takes `wait` in, to be ended by `deadline`; if its socket cannot be
    /// watched, it leaves at once, failed (its connection to be closed).
    pub(super) fn enter(&self, mut wait: Waiting, deadline: Instant) -> Result<(), Left> {
        let refused =
            |wait: Waiting| wait.leave(self.start, Outcome::Failed(Failure::Net(NetCause::Other)));
        let fd = wait.stream.as_raw_fd();
        let Ok(index) = usize::try_from(fd) else {
            return Err(refused(wait));
        };
        if self
            .poller
            .add(&wait.stream, index as u64, Interest::Read)
            .is_err()
        {
            return Err(refused(wait));
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

    /// Waits until sockets are readable (their events in `events`) or the
    /// first deadline comes.
    pub(super) async fn wait(&self, events: &mut Events) -> io::Result<Wake> {
        let next = self.deadlines.borrow().front().map(|d| d.0);
        let deadline = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => self.entered.notified().await,
            }
        };
        tokio::select! {
            got = self.poller.wait(events) => got.map(|_| Wake::Ready),
            () = deadline => Ok(Wake::Due),
        }
    }

    /// Reads what request `fd` got (into `scratch`, counting the bytes in
    /// `rec`); it leaves when its answer is whole, or its connection ended.
    pub(super) fn read(
        &self,
        fd: usize,
        scratch: &RefCell<Box<[u8]>>,
        aims: &Aims,
        rec: &RefCell<AttackRecorder>,
    ) -> Option<Left> {
        let mut slots = self.slots.borrow_mut();
        let Some(Some(wait)) = slots.get_mut(fd) else {
            return None;
        };
        let aim = aims.get(wait.t as usize);
        let method = aim.as_deref().map_or("", |a| a.method.as_str());
        let outcome = {
            let mut scratch = scratch.borrow_mut();
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
                        rec.borrow_mut().bytes_in(n);
                        let reader = wait.reader.get_or_insert_with(|| {
                            Box::new(if self.keep_answers {
                                ResponseReader::keeping()
                            } else {
                                ResponseReader::new()
                            })
                        });
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
        let outcome = outcome?;
        let wait = slots[fd].take()?;
        drop(slots);
        let _ = self.poller.remove(&wait.stream);
        let how = match outcome {
            Ok((status, keep)) => Outcome::Answered(status, keep),
            Err(_) if wait.may_retry && wait.reader.is_none() => Outcome::Stale,
            Err(why) => Outcome::Failed(why),
        };
        Some(wait.leave(self.start, how))
    }

    /// The next request whose deadline is at or before `now`, timed out;
    /// `None` when no more are due.
    pub(super) fn expire(&self, now: Instant) -> Option<Left> {
        loop {
            let (fd, ticket) = {
                let mut deadlines = self.deadlines.borrow_mut();
                match deadlines.front() {
                    Some(&(at, fd, ticket)) if at <= now => {
                        deadlines.pop_front();
                        (fd as usize, ticket)
                    }
                    _ => return None,
                }
            };
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
            return Some(wait.leave(self.start, Outcome::Failed(Failure::Net(NetCause::Timeout))));
        }
    }
}
