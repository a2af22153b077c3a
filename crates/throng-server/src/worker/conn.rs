//! One subscriber connection and everything that happens on it after the
//! upgrade: reading (control frames only), sending with a queue only when the
//! socket is full, and closing.
//!
//! An idle subscriber is a [`Conn`] (a socket, a few integers, a decoder of a
//! few words, two empty `Option<Box<_>>`s) and one small task parked on read
//! readiness. Bytes are read into the worker's one scratch buffer; a
//! connection keeps a remainder only when a frame arrived split.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::rc::Rc;

use bytes::Bytes;
use throng_proto::ws::{self, Decoder, Frame, OpCode, close_code};
use tokio::net::TcpStream;

use super::Worker;
use super::table::NONE;
use crate::metrics::CloseReason;
use crate::sys;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Subscribed, receiving messages.
    Open,
    /// We sent a close frame and wait for the client's (until a deadline).
    Closing,
    /// The client broke the protocol: we sent a close frame and discard
    /// whatever else it sends until it closes (or the deadline).
    Failed,
    /// Shut down; the task drops the socket when it next wakes.
    Gone,
}

/// One subscriber.
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    /// Index in the worker's slab, or [`NONE`].
    pub(crate) slot: Cell<u32>,
    /// Channel id in the worker's channel table.
    pub(crate) channel: Cell<u32>,
    /// Position in the channel's subscriber list, or [`NONE`] when not subscribed.
    pub(crate) sub_pos: Cell<u32>,
    /// Worker tick at which the client was last heard from.
    pub(crate) last_seen: Cell<u32>,
    pub(crate) state: Cell<State>,
    /// Bytes of a frame that arrived split; `None` almost always.
    rest: RefCell<Option<Box<[u8]>>>,
    /// Frames the socket would not take yet; `None` unless the client is behind.
    queue: RefCell<Option<Box<Queue>>>,
    decoder: RefCell<Decoder>,
}

/// Unsent frames of one connection. Invariant: `bytes` is the sum of the
/// lengths of `frames`; `frames[0]` may be the unsent tail of a frame whose
/// head was already written (`partial`).
struct Queue {
    frames: VecDeque<Bytes>,
    bytes: usize,
    partial: bool,
}

/// Why a frame could not be handed to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendError {
    /// The queue would grow past `--max-queue`.
    QueueFull,
    /// The socket is broken (reset, or the peer is gone).
    Broken,
    /// The connection is being closed or is gone.
    Closed,
}

/// What the read task does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

impl Conn {
    pub(crate) fn new(stream: TcpStream, now: u32, rest: &[u8]) -> Self {
        Self {
            stream,
            slot: Cell::new(NONE),
            channel: Cell::new(NONE),
            sub_pos: Cell::new(NONE),
            last_seen: Cell::new(now),
            state: Cell::new(State::Open),
            rest: RefCell::new((!rest.is_empty()).then(|| rest.into())),
            queue: RefCell::new(None),
            decoder: RefCell::new(Decoder::new(
                ws::Role::Server,
                crate::config::MAX_CLIENT_MESSAGE,
            )),
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.state.get() == State::Open
    }

    pub(crate) fn has_queue(&self) -> bool {
        self.queue.borrow().is_some()
    }

    pub(crate) fn fd(&self) -> i32 {
        self.stream.as_raw_fd()
    }
}

/// The read side of a subscriber, for its whole life: park on readiness,
/// handle what arrived, and leave the tables when the connection ends.
pub(crate) async fn run(w: Rc<Worker>, c: Rc<Conn>) {
    // Bytes that came with the upgrade request are handled before waiting.
    if c.rest.borrow().is_some() && w.on_readable(&c, false) == Flow::Stop {
        w.forget(&c);
        return;
    }
    while c.state.get() != State::Gone {
        if poll_fn(|cx| c.stream.poll_read_ready(cx)).await.is_err() {
            w.lost(&c);
            break;
        }
        if w.on_readable(&c, true) == Flow::Stop {
            break;
        }
    }
    w.forget(&c);
}

impl Worker {
    /// Hands `frame` to `c`: straight to the socket when nothing is queued,
    /// else (or for what the socket did not take) to the queue.
    pub(crate) fn send(self: &Rc<Self>, c: &Rc<Conn>, frame: &Bytes) -> Result<(), SendError> {
        if c.state.get() == State::Gone {
            return Err(SendError::Closed);
        }
        if let Some(q) = c.queue.borrow_mut().as_mut() {
            if q.bytes + frame.len() > self.cfg.max_queue {
                return Err(SendError::QueueFull);
            }
            q.bytes += frame.len();
            q.frames.push_back(frame.clone());
            return Ok(());
        }
        match c.stream.try_write(frame) {
            Ok(n) if n == frame.len() => Ok(()),
            Ok(n) => {
                self.start_queue(c, frame.slice(n..), n > 0);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.start_queue(c, frame.clone(), false);
                Ok(())
            }
            Err(_) => Err(SendError::Broken),
        }
    }

    fn start_queue(self: &Rc<Self>, c: &Rc<Conn>, first: Bytes, partial: bool) {
        let bytes = first.len();
        *c.queue.borrow_mut() = Some(Box::new(Queue {
            frames: VecDeque::from([first]),
            bytes,
            partial,
        }));
        self.counters.queued.set(self.counters.queued.get() + 1);
        tokio::task::spawn_local(flush(self.clone(), c.clone()));
    }

    /// Drops `c`'s queue, counting its frames as dropped.
    fn drop_queue(&self, c: &Conn) -> Option<Box<Queue>> {
        let q = c.queue.borrow_mut().take()?;
        self.counters
            .queued
            .set(self.counters.queued.get().saturating_sub(1));
        let whole = q.frames.len() - usize::from(q.partial);
        self.counters
            .frames_dropped
            .set(self.counters.frames_dropped.get() + whole as u64);
        Some(q)
    }

    /// Starts the closing handshake: stop delivering, send a close frame with
    /// `code`, and wait (up to a deadline kept by the sweep) for the client's.
    pub(crate) fn close(self: &Rc<Self>, c: &Rc<Conn>, code: u16, reason: &str, why: CloseReason) {
        if !c.is_open() {
            return;
        }
        self.counters.closed(why);
        self.channels.borrow_mut().unsubscribe(c);
        c.state.set(if why == CloseReason::ProtocolError {
            State::Failed
        } else {
            State::Closing
        });
        let mut out = Vec::with_capacity(2 + 2 + reason.len());
        ws::encode_close(&mut out, code, reason, None);
        if self.send(c, &Bytes::from(out)).is_err() {
            self.kill(c);
            return;
        }
        if why == CloseReason::ProtocolError && !c.has_queue() {
            // Nothing more will be read from a client that broke the
            // protocol; FIN after the close frame tells it we are done.
            sys::shutdown(c.fd(), true);
        }
        self.closing.borrow_mut().push((c.clone(), self.now.get()));
    }

    /// Closes a client that fell behind with 1008: its queued frames are
    /// dropped, the close frame is sent if the socket takes it, and the
    /// connection is shut down at once (a slow reader gets no grace period).
    pub(crate) fn close_slow(self: &Rc<Self>, c: &Rc<Conn>, cause: &'static str) {
        if !c.is_open() {
            return;
        }
        self.counters.closed(CloseReason::SlowConsumer);
        self.counters.slow_consumer(cause);
        self.channels.borrow_mut().unsubscribe(c);
        let partial = self.drop_queue(c).is_some_and(|q| q.partial);
        if !partial {
            let mut out = Vec::with_capacity(32);
            let reason = if cause == "queue" {
                "slow consumer: queue over --max-queue"
            } else {
                "slow consumer: write timeout"
            };
            ws::encode_close(&mut out, close_code::POLICY, reason, None);
            let _ = c.stream.try_write(&out);
        }
        self.kill(c);
    }

    /// The socket failed under us: count the client as gone and end it.
    pub(crate) fn lost(self: &Rc<Self>, c: &Rc<Conn>) {
        if c.is_open() {
            self.counters.closed(CloseReason::PeerGone);
        }
        self.kill(c);
    }

    /// Ends a connection now: no more writes, and its task wakes to a
    /// shut-down socket and drops it.
    pub(crate) fn kill(&self, c: &Rc<Conn>) {
        if c.state.get() == State::Gone {
            return;
        }
        self.channels.borrow_mut().unsubscribe(c);
        self.drop_queue(c);
        c.state.set(State::Gone);
        sys::shutdown(c.fd(), false);
    }

    /// Takes `c` out of the worker's tables when its task ends.
    pub(crate) fn forget(&self, c: &Rc<Conn>) {
        self.channels.borrow_mut().unsubscribe(c);
        if c.slot.get() != NONE {
            self.conns.borrow_mut().remove(c);
            self.counters
                .open
                .set(self.counters.open.get().saturating_sub(1));
        }
        if c.state.get() != State::Gone && !c.has_queue() {
            c.state.set(State::Gone);
        }
    }

    /// Reads what the socket has into the scratch buffer and handles every
    /// complete frame; keeps a split frame's bytes in `c.rest`.
    fn on_readable(self: &Rc<Self>, c: &Rc<Conn>, read: bool) -> Flow {
        let mut scratch = self.scratch.borrow_mut();
        let mut read = read;
        loop {
            let mut have = 0;
            if let Some(rest) = c.rest.borrow_mut().take() {
                scratch[..rest.len()].copy_from_slice(&rest);
                have = rest.len();
            }
            let mut eof = false;
            if read {
                match c.stream.try_read(&mut scratch[have..]) {
                    Ok(0) => eof = true,
                    Ok(n) => have += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if have > 0 {
                            *c.rest.borrow_mut() = Some(scratch[..have].into());
                        }
                        return Flow::Continue;
                    }
                    Err(_) => {
                        self.lost(c);
                        return Flow::Stop;
                    }
                }
            }
            let full = have == scratch.len();
            if eof {
                // The client closed without (or after) a close handshake.
                self.lost(c);
                return Flow::Stop;
            }
            c.last_seen.set(self.now.get());
            if c.state.get() == State::Failed {
                // Discard: the decoder is not trusted after an error.
                if !full {
                    return Flow::Continue;
                }
                continue;
            }
            let mut pos = 0;
            while pos < have {
                let mut dec = c.decoder.borrow_mut();
                match dec.decode(&mut scratch[pos..have]) {
                    Ok(None) => break,
                    Ok(Some(d)) => {
                        pos += d.consumed;
                        if let Some(frame) = d.frame
                            && self.on_frame(c, frame) == Flow::Stop
                        {
                            return Flow::Stop;
                        }
                    }
                    Err(e) => {
                        drop(dec);
                        self.close(
                            c,
                            e.close_code(),
                            &e.to_string(),
                            CloseReason::ProtocolError,
                        );
                        return if c.state.get() == State::Gone {
                            Flow::Stop
                        } else {
                            Flow::Continue
                        };
                    }
                }
            }
            if pos < have {
                // Bounded: the decoder refuses a header announcing more than
                // MAX_CLIENT_MESSAGE, so a split frame is at most that plus a header.
                *c.rest.borrow_mut() = Some(scratch[pos..have].into());
            }
            if !full {
                return Flow::Continue;
            }
            read = true;
        }
    }

    fn on_frame(self: &Rc<Self>, c: &Rc<Conn>, frame: Frame<'_>) -> Flow {
        match frame {
            Frame::Ping(payload) => {
                if c.is_open() {
                    let pong = ws::server_frame(OpCode::Pong, payload);
                    if self.send(c, &pong).is_err() {
                        self.lost(c);
                        return Flow::Stop;
                    }
                }
                Flow::Continue
            }
            Frame::Pong(_) => Flow::Continue,
            Frame::Text(_) | Frame::Binary(_) => {
                // Subscribers have nothing to say; data is accepted and ignored
                // (it still counts as a sign of life).
                Flow::Continue
            }
            Frame::Close { code, .. } => {
                if c.is_open() {
                    self.counters.closed(CloseReason::PeerClose);
                    self.channels.borrow_mut().unsubscribe(c);
                    let mut out = Vec::with_capacity(4);
                    ws::encode_close(&mut out, code.unwrap_or(close_code::NORMAL), "", None);
                    // The reply follows anything still queued; the flush task
                    // keeps the socket alive until it is written.
                    let _ = self.send(c, &Bytes::from(out));
                    c.state.set(State::Closing);
                }
                // Handshake complete (either side started it): the server
                // closes the TCP connection first (RFC 6455 section 7.1.1).
                if !c.has_queue() {
                    c.state.set(State::Gone);
                }
                Flow::Stop
            }
        }
    }
}

/// How long a closing handshake may take before the socket is shut.
pub(crate) const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Writes `c`'s queue out as the socket drains, several frames per `writev`.
/// Ends when the queue is empty, or closes the client as slow when no byte
/// could be written for `--write-timeout`.
async fn flush(w: Rc<Worker>, c: Rc<Conn>) {
    loop {
        if c.state.get() == State::Gone || !c.has_queue() {
            return;
        }
        match tokio::time::timeout(w.cfg.write_timeout, c.stream.writable()).await {
            Err(_) => {
                if c.is_open() {
                    w.close_slow(&c, "timeout");
                } else {
                    w.kill(&c);
                }
                return;
            }
            Ok(Err(_)) => {
                w.lost(&c);
                return;
            }
            Ok(Ok(())) => {}
        }
        let written = {
            let q = c.queue.borrow();
            let Some(q) = q.as_ref() else { return };
            let iov: Vec<IoSlice<'_>> = q.frames.iter().take(64).map(|b| IoSlice::new(b)).collect();
            c.stream.try_write_vectored(&iov)
        };
        match written {
            Ok(mut n) => {
                let mut guard = c.queue.borrow_mut();
                let Some(q) = guard.as_mut() else { return };
                q.bytes -= n;
                while n > 0 {
                    let Some(front) = q.frames.front_mut() else {
                        break;
                    };
                    if n >= front.len() {
                        n -= front.len();
                        q.frames.pop_front();
                        q.partial = false;
                    } else {
                        *front = front.slice(n..);
                        q.partial = true;
                        n = 0;
                    }
                }
                if q.frames.is_empty() {
                    *guard = None;
                    drop(guard);
                    w.counters
                        .queued
                        .set(w.counters.queued.get().saturating_sub(1));
                    if !c.is_open() && c.slot.get() == NONE {
                        // A close reply was the last thing queued: we are done.
                        c.state.set(State::Gone);
                    }
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => {
                w.lost(&c);
                return;
            }
        }
    }
}
