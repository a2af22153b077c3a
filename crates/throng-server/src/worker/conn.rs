//! One subscriber connection after the upgrade (or the start of its event
//! stream), and its life: reading (control frames only; an SSE client's
//! bytes are dropped), sending with a queue only when the socket is full,
//! and closing (an SSE stream just ends: it has no closing handshake). The life is a state machine over a [`Wire`] (a non-blocking
//! byte stream) and the worker's clock in ticks; it opens no socket and
//! reads no clock, so tests drive it in memory.
//!
//! ```text
//!            short write ──▶ queue (writable drains it)
//!   Open ──┬─ queue over --max-queue, or no write progress in --write-timeout ─▶ 1008, Gone
//!          ├─ idle timeout (1008) / drain (1001) / token expired (4001) ──▶ Closing ─┬─ client's close ─▶ Gone
//!          ├─ protocol error (1002, 1007, 1009) ──────────────────────────▶ Failed ──┴─ CLOSE_GRACE over ▶ Gone
//!          ├─ client's close ──▶ reply ──▶ Finishing (queue written) ──▶ Gone
//!          └─ EOF or a socket error ──▶ Gone
//! ```
//!
//! An idle subscriber is one [`Conn`] (a socket, a few integers, a decoder of
//! a few words, two empty `Option<Box<_>>`s) in the worker's tables and its
//! socket in the worker's epoll: no task, no buffer, no timer. Bytes are
//! read into the worker's one scratch buffer; a connection keeps a
//! remainder only when a frame arrived split.
//!
//! A TLS subscriber adds one boxed [`TlsState`]: rustls's unbuffered
//! connection (keys, sequence numbers, no buffers) and, rarely, a record
//! that arrived split. Received records are decrypted from the scratch
//! buffer; each frame is encrypted into the worker's one output buffer and
//! written from there, so fan-out still encodes the frame once per worker and
//! only encrypts per connection.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::ops::Range;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use throng_proto::mqtt;
use throng_proto::ws::{self, Decoder, Frame, OpCode, close_code};

use super::mqtt::Mqtt;
use super::rejoin::Kind;
use super::subscribers::{Outside, Subscribers};
use super::table::NONE;
use crate::metrics::CloseReason;
use crate::tls::{self, Pumped};

/// How long a closing handshake may take before the socket is closed.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// A subscriber's byte stream as its life needs it: non-blocking reads and
/// writes (`WouldBlock` when there is nothing to read or no room), and a
/// half close. A `TcpStream` in production; an in-memory pipe in tests.
pub(crate) trait Wire {
    /// Reads what has arrived; `Ok(0)` at the peer's end.
    fn read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes what there is room for.
    fn write(&self, buf: &[u8]) -> io::Result<usize>;
    /// Writes what there is room for from several buffers, in order.
    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Sends FIN after what was written: nothing more will follow.
    fn shutdown_write(&self);
}

impl Wire for TcpStream {
    #[inline]
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        Read::read(&mut &*self, buf)
    }

    #[inline]
    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        Write::write(&mut &*self, buf)
    }

    #[inline]
    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Write::write_vectored(&mut &*self, bufs)
    }

    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

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
    /// The close handshake is complete; the socket closes once the queue
    /// (ending with our close reply) is written.
    Finishing,
    /// Out of every table; the socket closes with the last reference.
    Gone,
}

/// One subscriber.
pub(crate) struct Conn<W> {
    /// Non-blocking, registered in the worker's epoll under `slot`.
    wire: W,
    /// Index in the worker's slab, or [`NONE`].
    pub(crate) slot: Cell<u32>,
    /// Channel id in the worker's channel table.
    pub(crate) channel: Cell<u32>,
    /// Position in the channel's subscriber list, or [`NONE`] when not subscribed.
    pub(crate) sub_pos: Cell<u32>,
    /// Worker tick at which the client was last heard from.
    pub(crate) last_seen: Cell<u32>,
    pub(crate) state: Cell<State>,
    /// Whether it is in the worker's `queued` list.
    pub(crate) listed: Cell<bool>,
    /// How it takes its messages (WebSocket bare or with ids, or SSE).
    pub(crate) kind: Kind,
    /// Rejoining after an id: what is published is held until the
    /// channel's history arrives ([`super::rejoin`]).
    pub(crate) rejoining: Cell<bool>,
    /// The Unix second its token expires at (closed 4001 by the sweep);
    /// 0: no token, or one without `exp`. Four bytes that fit beside the
    /// other small fields, so an authenticated subscriber costs no more.
    pub(crate) expires: u32,
    /// What the worker counts this connection under (its client address
    /// for the per-address limits, its place under `--max-connections`),
    /// handed back to [`Outside::forget`]; [`NONE`] when nothing is.
    pub(crate) tag: u32,
    /// Bytes of a frame that arrived split; `None` almost always. A `Cell`
    /// (taken and put back), not a `RefCell`: one word less per connection.
    rest: Cell<Option<Box<[u8]>>>,
    /// Frames the socket would not take yet; `None` unless the client is behind.
    queue: RefCell<Option<Box<Queue>>>,
    /// Its protocol's decoder and state.
    pub(crate) proto: RefCell<Proto>,
    /// The TLS session of a subscriber from a `--tls-listen` listener.
    tls: Option<Box<RefCell<TlsState>>>,
}

/// What a connection's protocol keeps between reads: a WebSocket decoder
/// (an SSE subscriber's is never used), or an MQTT connection's few bytes
/// and box ([`Mqtt`]), which fit beside the decoder's role byte: the enum
/// is no larger than the decoder, so a WebSocket subscriber does not grow.
pub(crate) enum Proto {
    Ws(Decoder),
    Mqtt(Mqtt),
}

impl Proto {
    pub(crate) fn mqtt(&self) -> Option<&Mqtt> {
        match self {
            Self::Mqtt(m) => Some(m),
            Self::Ws(_) => None,
        }
    }

    pub(crate) fn mqtt_mut(&mut self) -> Option<&mut Mqtt> {
        match self {
            Self::Mqtt(m) => Some(m),
            Self::Ws(_) => None,
        }
    }
}

/// What a TLS subscriber keeps between reads.
pub(crate) struct TlsState {
    conn: rustls::server::UnbufferedServerConnection,
    /// Received bytes rustls has not consumed (a record that arrived split);
    /// `None` almost always. Invariant: always what the last
    /// [`tls::pump`] left, so rustls's position in them holds.
    rest: Option<Box<[u8]>>,
    /// The session failed; rustls is not called again.
    failed: bool,
}

impl TlsState {
    pub(crate) fn new(conn: rustls::server::UnbufferedServerConnection, rest: &[u8]) -> Self {
        Self {
            conn,
            rest: (!rest.is_empty()).then(|| rest.into()),
            failed: false,
        }
    }

    /// Encrypts `data` into `out` (after any record the session has pending).
    fn seal(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), tls::SealError> {
        if self.failed {
            return Err(tls::SealError::Closed);
        }
        let incoming: &mut [u8] = match self.rest.as_mut() {
            Some(rest) => rest,
            None => &mut [],
        };
        tls::seal(&mut self.conn, incoming, data, out)
    }

    /// Appends a close_notify alert to `out`.
    fn close_notify(&mut self, out: &mut Vec<u8>) -> Result<(), tls::SealError> {
        if self.failed {
            return Err(tls::SealError::Closed);
        }
        let incoming: &mut [u8] = match self.rest.as_mut() {
            Some(rest) => rest,
            None => &mut [],
        };
        tls::close_notify(&mut self.conn, incoming, out)
    }
}

/// Unsent frames of one connection. Invariant: `bytes` is the sum of the
/// lengths of `frames`; `frames[0]` may be the unsent tail of a frame whose
/// head was already written (`partial`).
struct Queue {
    frames: VecDeque<Bytes>,
    bytes: usize,
    partial: bool,
    /// Tick of the last write progress (for `--write-timeout`).
    since: u32,
}

/// Why a frame could not be handed to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendError {
    /// The queue would grow past `--max-queue`.
    QueueFull,
    /// The socket is broken (reset, or the peer is gone).
    Broken,
    /// The connection is gone.
    Closed,
}

/// What one read from a connection gave.
enum Got {
    Bytes(usize),
    /// Nothing more to read now.
    Nothing,
    /// The client closed or the socket failed: the connection is gone.
    Ended,
}

impl<W: Wire> Conn<W> {
    /// `wire` must be non-blocking; `rest` is what arrived behind the upgrade.
    pub(crate) fn new(wire: W, now: u32, rest: &[u8]) -> Self {
        Self {
            wire,
            slot: Cell::new(NONE),
            channel: Cell::new(NONE),
            sub_pos: Cell::new(NONE),
            last_seen: Cell::new(now),
            state: Cell::new(State::Open),
            listed: Cell::new(false),
            kind: Kind::Ws,
            rejoining: Cell::new(false),
            expires: 0,
            tag: NONE,
            rest: Cell::new((!rest.is_empty()).then(|| rest.into())),
            queue: RefCell::new(None),
            proto: RefCell::new(Proto::Ws(Decoder::new(
                ws::Role::Server,
                crate::config::MAX_CLIENT_MESSAGE,
            ))),
            tls: None,
        }
    }

    /// Closes it (4001) once Unix second `exp` has passed ([`expiry`]).
    pub(crate) fn with_expiry(mut self, exp: u32) -> Self {
        self.expires = exp;
        self
    }

    /// Whether its token has expired at Unix second `now`.
    pub(crate) fn expired(&self, now: u64) -> bool {
        self.expires != 0 && u64::from(self.expires) <= now
    }

    /// Makes this an MQTT subscriber (of `version`) after its CONNACK.
    pub(crate) fn with_mqtt(mut self, version: mqtt::Version, state: Mqtt) -> Self {
        self.kind = match version {
            mqtt::Version::V311 => Kind::Mqtt311,
            mqtt::Version::V5 => Kind::Mqtt5,
        };
        self.proto = RefCell::new(Proto::Mqtt(state));
        self
    }

    /// Makes it take its messages as `kind` does.
    pub(crate) fn with_kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    /// Counts it under `tag` (see [`Conn::tag`]).
    pub(crate) fn with_tag(mut self, tag: u32) -> Self {
        self.tag = tag;
        self
    }

    /// Makes this a TLS subscriber.
    pub(crate) fn with_tls(mut self, tls: TlsState) -> Self {
        self.tls = Some(Box::new(RefCell::new(tls)));
        self
    }

    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub(crate) fn is_open(&self) -> bool {
        self.state.get() == State::Open
    }

    pub(crate) fn has_queue(&self) -> bool {
        self.queue.borrow().is_some()
    }

    pub(crate) fn has_rest(&self) -> bool {
        let rest = self.rest.take();
        let plain = rest.is_some();
        self.rest.set(rest);
        plain || self.tls.as_ref().is_some_and(|t| t.borrow().rest.is_some())
    }

    /// Keeps the bytes of a packet that arrived split (bounded by the
    /// caller's decoder limit).
    pub(crate) fn set_rest(&self, rest: &[u8]) {
        self.rest.set(Some(rest.into()));
    }

    pub(crate) fn wire(&self) -> &W {
        &self.wire
    }

    /// The tick since which it has been stalled at tick `now`: the last
    /// write progress of its queue, or (MQTT) the last PUBACK while
    /// deliveries await one, whichever is older; `None` when neither waits.
    pub(crate) fn stalled_since(&self, now: u32) -> Option<u32> {
        let queued = self.queue.borrow().as_ref().map(|q| q.since);
        let unacked = if self.kind.is_mqtt() {
            super::mqtt_qos::unacked_since(self)
        } else {
            None
        };
        match (queued, unacked) {
            (Some(q), Some(a)) => Some(if now.wrapping_sub(q) >= now.wrapping_sub(a) {
                q
            } else {
                a
            }),
            (q, a) => q.or(a),
        }
    }

    /// Unsent bytes in the queue.
    pub(crate) fn queued_len(&self) -> usize {
        self.queue.borrow().as_ref().map_or(0, |q| q.bytes)
    }

    #[cfg(test)]
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued_len()
    }
}

/// A token's `exp` as a subscriber keeps it: Unix seconds in four bytes, 0
/// for none. An expiry past 2106 is as good as none.
pub(crate) fn expiry(exp: Option<u64>) -> u32 {
    exp.and_then(|e| u32::try_from(e).ok()).unwrap_or(0)
}

/// A close frame with `code` and `reason`.
fn close_frame(code: u16, reason: &str) -> Bytes {
    let mut out = Vec::with_capacity(4 + reason.len());
    ws::encode_close(&mut out, code, reason, None);
    Bytes::from(out)
}

impl<O: Outside> Subscribers<O> {
    /// Hands `frame` to `c`: straight to the socket when nothing is queued,
    /// else (or for what the socket did not take) to the queue.
    pub(crate) fn send(&self, c: &Rc<Conn<O::Wire>>, frame: &Bytes) -> Result<(), SendError> {
        if c.state.get() == State::Gone {
            return Err(SendError::Closed);
        }
        if let Some(tls) = &c.tls {
            let mut out = self.tls_out.borrow_mut();
            out.clear();
            if tls.borrow_mut().seal(frame, &mut out).is_err() {
                return Err(SendError::Broken);
            }
            return self.send_wire(c, &out, |r| Bytes::copy_from_slice(&out[r]));
        }
        self.send_wire(c, frame, |r| frame.slice(r))
    }

    /// Writes `wire` to `c`'s socket, or queues it (as `keep` of the unsent
    /// range) behind what is already queued or what the socket did not take.
    fn send_wire(
        &self,
        c: &Rc<Conn<O::Wire>>,
        wire: &[u8],
        keep: impl Fn(Range<usize>) -> Bytes,
    ) -> Result<(), SendError> {
        if let Some(q) = c.queue.borrow_mut().as_mut() {
            // An MQTT subscriber's deliveries awaiting PUBACK count too.
            let inflight = if c.kind.is_mqtt() {
                super::mqtt_qos::inflight_bytes(c)
            } else {
                0
            };
            if q.bytes + inflight + wire.len() > self.limits.max_queue {
                return Err(SendError::QueueFull);
            }
            q.bytes += wire.len();
            q.frames.push_back(keep(0..wire.len()));
            return Ok(());
        }
        loop {
            return match c.wire.write(wire) {
                Ok(n) if n == wire.len() => Ok(()),
                Ok(n) => {
                    self.start_queue(c, keep(n..wire.len()), n > 0);
                    Ok(())
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.start_queue(c, keep(0..wire.len()), false);
                    Ok(())
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => Err(SendError::Broken),
            };
        }
    }

    /// Hands the frame made of `parts` to `c` (an MQTT delivery whose
    /// packet id is its own): one `writev` of the parts when nothing is
    /// queued; joined into one buffer only for a TLS subscriber, behind a
    /// queue, or for what the socket did not take.
    pub(crate) fn send_parts(
        &self,
        c: &Rc<Conn<O::Wire>>,
        parts: &[&[u8]; 3],
    ) -> Result<(), SendError> {
        if c.state.get() == State::Gone {
            return Err(SendError::Closed);
        }
        if c.tls.is_some() || c.has_queue() {
            return self.send(c, &Bytes::from(parts.concat()));
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let iov = parts.map(IoSlice::new);
        let rest = |from: usize| Bytes::from(parts.concat().split_off(from));
        loop {
            return match c.wire.write_vectored(&iov) {
                Ok(n) if n == total => Ok(()),
                Ok(n) => {
                    self.start_queue(c, rest(n), n > 0);
                    Ok(())
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.start_queue(c, rest(0), false);
                    Ok(())
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => Err(SendError::Broken),
            };
        }
    }

    /// One write of `data` straight to the socket, encrypted for a TLS
    /// subscriber; what the socket does not take is dropped (the caller
    /// closes the connection next).
    pub(crate) fn write_now(&self, c: &Conn<O::Wire>, data: &[u8]) {
        match &c.tls {
            Some(tls) => {
                let mut out = self.tls_out.borrow_mut();
                out.clear();
                if tls.borrow_mut().seal(data, &mut out).is_ok() {
                    let _ = c.wire.write(&out);
                }
            }
            None => {
                let _ = c.wire.write(data);
            }
        }
    }

    fn start_queue(&self, c: &Rc<Conn<O::Wire>>, first: Bytes, partial: bool) {
        let bytes = first.len();
        let q = Queue {
            frames: VecDeque::from([first]),
            bytes,
            partial,
            since: self.now.get(),
        };
        *c.queue.borrow_mut() = Some(Box::new(q));
        self.counters.queued.set(self.counters.queued.get() + 1);
        if !c.listed.replace(true) {
            self.queued.borrow_mut().push(c.clone());
        }
        self.outside.want_write(&c.wire, c.slot.get(), true);
    }

    /// Drops `c`'s queue, counting its whole frames as dropped.
    fn drop_queue(&self, c: &Conn<O::Wire>) -> Option<Box<Queue>> {
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
    /// `code`, and wait (up to [`CLOSE_GRACE`], kept by the tick) for the client's.
    pub(crate) fn close(&self, c: &Rc<Conn<O::Wire>>, code: u16, reason: &str, why: CloseReason) {
        if !c.is_open() {
            return;
        }
        self.counters.closed(why);
        self.unsubscribe(c);
        if c.kind == Kind::Sse || c.kind.is_mqtt() {
            // An event stream has no closing handshake: it ends (after what
            // is queued), and the client reconnects with its last id. An
            // MQTT server sends 5.0 clients a DISCONNECT saying why, then
            // closes (3.1.1 has no word for it).
            if c.kind == Kind::Mqtt5 {
                let _ = self.send(c, &super::mqtt::disconnect(why));
            }
            if c.has_queue() {
                c.state.set(State::Finishing);
            } else {
                self.finish(c);
            }
            return;
        }
        c.state.set(if why == CloseReason::ProtocolError {
            State::Failed
        } else {
            State::Closing
        });
        if self.send(c, &close_frame(code, reason)).is_err() {
            self.finish(c);
            return;
        }
        if why == CloseReason::ProtocolError && !c.has_queue() {
            // Nothing more will be read from a client that broke the
            // protocol; FIN after the close frame tells it we are done.
            c.wire.shutdown_write();
        }
        self.closing.borrow_mut().push((c.clone(), self.now.get()));
    }

    /// Closes a client that fell behind with 1008: its queued frames are
    /// dropped, the close frame is sent if the socket takes it whole, and the
    /// connection is closed at once (a slow reader gets no grace period).
    pub(crate) fn close_slow(&self, c: &Rc<Conn<O::Wire>>, cause: &'static str) {
        if !c.is_open() {
            self.finish(c);
            return;
        }
        self.counters.closed(CloseReason::SlowConsumer);
        self.counters.slow_consumer(cause);
        let partial = self.drop_queue(c).is_some_and(|q| q.partial);
        if !partial && c.kind == Kind::Mqtt5 {
            self.write_now(c, &super::mqtt::disconnect(CloseReason::SlowConsumer));
        } else if !partial && c.kind != Kind::Sse && !c.kind.is_mqtt() {
            let reason = if cause == "queue" {
                "slow consumer: over --max-queue"
            } else {
                "slow consumer: write timeout"
            };
            self.write_now(c, &close_frame(close_code::POLICY, reason));
        }
        self.finish(c);
    }

    /// A send to `c` failed: close it as slow (its queue is full), or as
    /// lost (its socket is broken or it is gone).
    pub(crate) fn send_failed(&self, c: &Rc<Conn<O::Wire>>, e: SendError) {
        match e {
            SendError::QueueFull => self.close_slow(c, "queue"),
            SendError::Broken | SendError::Closed => self.lost(c),
        }
    }

    /// The socket failed under us or the client left: count it and end it.
    pub(crate) fn lost(&self, c: &Rc<Conn<O::Wire>>) {
        if c.is_open() {
            self.counters.closed(CloseReason::PeerGone);
        }
        self.finish(c);
    }

    /// Takes `c` out of every table; its socket closes when the last
    /// reference (perhaps a fan-out in progress) is dropped.
    pub(crate) fn finish(&self, c: &Rc<Conn<O::Wire>>) {
        if c.state.get() == State::Gone {
            return;
        }
        c.state.set(State::Gone);
        self.unsubscribe(c);
        self.forget_rejoin(c);
        if c.kind.is_mqtt() {
            self.publish_will(c);
            self.drop_inflight(c);
        }
        let partial = self.drop_queue(c).is_some_and(|q| q.partial);
        if let Some(tls) = &c.tls
            && !partial
        {
            // A clean TLS end (best effort: one write, nothing queued).
            let mut out = self.tls_out.borrow_mut();
            out.clear();
            if tls.borrow_mut().close_notify(&mut out).is_ok() {
                let _ = c.wire.write(&out);
            }
        }
        self.outside.forget(&c.wire, c.tag);
        if c.slot.get() != NONE {
            self.conns.borrow_mut().remove(c);
            self.counters
                .open
                .set(self.counters.open.get().saturating_sub(1));
            if c.kind.is_mqtt() {
                let mqtt = &self.counters.mqtt_open;
                mqtt.set(mqtt.get().saturating_sub(1));
            }
        }
    }

    /// One read from `c` into `buf`; ends the connection at EOF or on an error.
    fn read_some(&self, c: &Rc<Conn<O::Wire>>, buf: &mut [u8]) -> Got {
        match c.wire.read(buf) {
            // The client closed (after a close handshake, or not).
            Ok(0) => {
                self.lost(c);
                Got::Ended
            }
            Ok(n) => Got::Bytes(n),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Got::Nothing
            }
            Err(_) => {
                self.lost(c);
                Got::Ended
            }
        }
    }

    /// Reads what the socket has into the scratch buffer and handles every
    /// complete frame (decrypting first, for a TLS subscriber); keeps a
    /// split frame's (or record's) bytes. With `read` false, only handles
    /// bytes already kept (those sent with the upgrade).
    pub(crate) fn on_readable(&self, c: &Rc<Conn<O::Wire>>, read: bool) {
        let tls = c.tls.as_deref();
        let mut scratch = self.scratch.borrow_mut();
        let mut read = read;
        loop {
            if c.state.get() == State::Gone {
                return;
            }
            // What was kept goes first. Plain: taken, it is handled now.
            // TLS: copied, so `rest` stays what rustls expects until the
            // next pump replaces it.
            let mut have = 0;
            if let Some(t) = tls {
                if let Some(rest) = &t.borrow().rest {
                    scratch[..rest.len()].copy_from_slice(rest);
                    have = rest.len();
                }
            } else if let Some(rest) = c.rest.take() {
                scratch[..rest.len()].copy_from_slice(&rest);
                have = rest.len();
            }
            if read {
                match self.read_some(c, &mut scratch[have..]) {
                    Got::Bytes(n) => have += n,
                    Got::Nothing => {
                        if tls.is_none() && have > 0 {
                            c.rest.set(Some(scratch[..have].into()));
                        }
                        return;
                    }
                    Got::Ended => return,
                }
            }
            let full = have == scratch.len();
            c.last_seen.set(self.now.get());
            let open = match tls {
                None => self.on_bytes(c, &mut scratch[..have]),
                Some(t) => self.on_records(c, t, &mut scratch[..have]),
            };
            if !open || !full {
                return;
            }
            read = true;
        }
    }

    /// Runs a TLS subscriber's session over the records in `buf`: keeps
    /// what rustls did not consume, sends what the session must send (a key
    /// update, an alert), and handles the frames the records decrypt to (in
    /// the worker's plaintext buffer). False when the connection ended.
    fn on_records(&self, c: &Rc<Conn<O::Wire>>, tls: &RefCell<TlsState>, buf: &mut [u8]) -> bool {
        let have = buf.len();
        let mut plain = self.tls_plain.borrow_mut();
        plain.clear();
        if let Some(rest) = c.rest.take() {
            plain.extend_from_slice(&rest);
        }
        let mut out = self.tls_out.borrow_mut();
        out.clear();
        let pumped = {
            let mut t = tls.borrow_mut();
            let r = tls::pump(&mut t.conn, buf, &mut plain, &mut out);
            match r {
                Ok((used, _)) => t.rest = (used < have).then(|| buf[used..have].into()),
                // The alert for the client is in `out`.
                Err(_) => t.failed = true,
            }
            r
        };
        let sent = out.is_empty()
            || self
                .send_wire(c, &out, |r| Bytes::copy_from_slice(&out[r]))
                .is_ok();
        drop(out);
        let Ok((_, state)) = pumped else {
            if c.is_open() {
                self.counters.closed(CloseReason::TlsError);
            }
            self.finish(c);
            return false;
        };
        if !sent {
            self.lost(c);
            return false;
        }
        if !plain.is_empty() && !self.on_bytes(c, &mut plain) {
            return false;
        }
        drop(plain);
        if state == Pumped::Closed {
            // close_notify: nothing more will come.
            self.lost(c);
            return false;
        }
        true
    }

    /// Handles every complete frame in `buf` (a kept remainder followed by
    /// what was just read); keeps a split frame's bytes in `c.rest`. False
    /// when the connection ended.
    fn on_bytes(&self, c: &Rc<Conn<O::Wire>>, buf: &mut [u8]) -> bool {
        if c.state.get() == State::Failed || c.kind == Kind::Sse {
            // Discard: the decoder is not trusted after an error, and an
            // SSE client has nothing to say after its request (its end,
            // or a reset, still ends it).
            return true;
        }
        if c.kind.is_mqtt() {
            return self.on_mqtt_bytes(c, buf);
        }
        let have = buf.len();
        let mut pos = 0;
        while pos < have {
            let mut proto = c.proto.borrow_mut();
            let Proto::Ws(dec) = &mut *proto else {
                return false;
            };
            match dec.decode(&mut buf[pos..have]) {
                Ok(None) => break,
                Ok(Some(d)) => {
                    pos += d.consumed;
                    if let Some(frame) = d.frame
                        && !self.on_frame(c, frame)
                    {
                        return false;
                    }
                }
                Err(e) => {
                    drop(proto);
                    self.close(
                        c,
                        e.close_code(),
                        &e.to_string(),
                        CloseReason::ProtocolError,
                    );
                    return false;
                }
            }
        }
        if pos < have {
            // Bounded: the decoder refuses a header announcing more than
            // MAX_CLIENT_MESSAGE, so a split frame is at most that plus a header.
            c.rest.set(Some(buf[pos..have].into()));
        }
        true
    }

    /// Handles one frame from the client; false when the connection ended.
    fn on_frame(&self, c: &Rc<Conn<O::Wire>>, frame: Frame<'_>) -> bool {
        match frame {
            Frame::Ping(payload) => {
                if c.is_open() {
                    let pong = ws::server_frame(OpCode::Pong, payload);
                    if let Err(e) = self.send(c, &pong) {
                        self.send_failed(c, e);
                        return false;
                    }
                }
                true
            }
            // Subscribers have nothing to say: data is accepted and ignored,
            // and like a pong it counts as a sign of life.
            Frame::Pong(_) | Frame::Text(_) | Frame::Binary(_) => true,
            Frame::Close { code, .. } => {
                if c.is_open() {
                    self.counters.closed(CloseReason::PeerClose);
                    self.unsubscribe(c);
                    // The reply follows anything still queued.
                    let _ = self.send(c, &close_frame(code.unwrap_or(close_code::NORMAL), ""));
                }
                // Handshake complete (whichever side started it): the server
                // closes the TCP connection first (RFC 6455 section 7.1.1),
                // once the queue is written.
                if c.has_queue() {
                    c.state.set(State::Finishing);
                } else {
                    self.finish(c);
                }
                false
            }
        }
    }

    /// Writes `c`'s queue as the socket drains, several frames per `writev`.
    pub(crate) fn on_writable(&self, c: &Rc<Conn<O::Wire>>) {
        loop {
            let written = {
                let q = c.queue.borrow();
                let Some(q) = q.as_ref() else { return };
                let iov: Vec<IoSlice<'_>> =
                    q.frames.iter().take(64).map(|b| IoSlice::new(b)).collect();
                c.wire.write_vectored(&iov)
            };
            match written {
                Ok(mut n) => {
                    let mut guard = c.queue.borrow_mut();
                    let Some(q) = guard.as_mut() else { return };
                    q.bytes -= n;
                    q.since = self.now.get();
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
                        self.counters
                            .queued
                            .set(self.counters.queued.get().saturating_sub(1));
                        if c.state.get() == State::Finishing {
                            self.finish(c);
                        } else {
                            self.outside.want_write(&c.wire, c.slot.get(), false);
                        }
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.lost(c);
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! One connection's life, both ends in memory ([`Pair`]): what the
    //! client receives, what the server counts, and when the socket closes.

    use std::net::TcpStream;

    use throng_proto::ws::{OpCode, close_code};

    use super::{Conn, State};
    use crate::worker::pair::{Got, Pair, limits};

    fn text(s: &str) -> Got {
        Got::Text(s.to_owned())
    }

    fn closed(p: &Pair, reason: &str) -> u64 {
        p.counters()
            .closed
            .borrow()
            .get(reason)
            .copied()
            .unwrap_or(0)
    }

    #[test]
    fn an_idle_subscriber_holds_no_buffer() {
        // What every idle connection costs in the worker's tables: the
        // figure scripts/bench-serve.sh measures starts here.
        assert!(
            size_of::<Conn<TcpStream>>() <= 104,
            "{}",
            size_of::<Conn<TcpStream>>()
        );
        // MQTT's state is a few bytes and a box in the decoder's place: a
        // WebSocket subscriber pays nothing for it.
        assert_eq!(
            size_of::<super::Proto>(),
            size_of::<throng_proto::ws::Decoder>()
        );
        let mut p = Pair::defaults();
        let a = p.connect("news");
        p.publish("news", "hello");
        let c = p.conn(a).unwrap();
        assert!(!c.has_queue() && !c.has_rest());
    }

    #[test]
    fn a_message_reaches_every_subscriber_of_its_channel_once() {
        let mut p = Pair::defaults();
        let (a, b, other) = (p.connect("news"), p.connect("news"), p.connect("sport"));
        assert_eq!(p.publish("news", "hi"), 2);
        assert_eq!(p.publish("nobody", "hi"), 0);
        assert_eq!(p.clients[a].take(), [text("hi")]);
        assert_eq!(p.clients[b].take(), [text("hi")]);
        assert!(p.clients[other].take().is_empty());
        assert_eq!(p.counters().frames_delivered.get(), 2);
    }

    #[test]
    fn a_short_write_queues_the_rest_and_room_to_write_drains_it_in_order() {
        let mut p = Pair::defaults();
        let a = p.connect_with("news", 10, b"");
        p.clients[a].reading = false;
        for m in ["first message", "second message", "third"] {
            p.publish("news", m);
        }
        let c = p.conn(a).unwrap();
        assert!(c.has_queue(), "the socket took 10 bytes");
        assert_eq!(p.counters().queued.get(), 1);
        assert!(p.clients[a].write_wanted());
        p.clients[a].reading = true;
        p.drive();
        assert_eq!(
            p.clients[a].take(),
            [text("first message"), text("second message"), text("third")]
        );
        assert!(!c.has_queue());
        assert_eq!(p.counters().queued.get(), 0);
        assert!(!p.clients[a].write_wanted(), "no queue, no EPOLLOUT");
        assert_eq!(p.counters().frames_dropped.get(), 0);
    }

    #[test]
    fn a_queue_over_max_queue_closes_1008_and_counts_the_frames_dropped() {
        // Frames of 2 + 8 bytes; room for two on the wire, 30 bytes queued.
        let mut p = Pair::new(limits(30, 1000, 1000, 50));
        let (slow, fine) = (p.connect_with("c", 20, b""), p.connect("c"));
        p.clients[slow].reading = false;
        for i in 0..5 {
            p.fanout("c", &format!("msg-{i:04}"));
        }
        let c = p.conn(slow).unwrap();
        assert_eq!(c.queued_bytes(), 30, "two frames written, three queued");
        assert!(c.is_open());
        // The client reads, but the server has not written since: the next
        // frame is over --max-queue.
        p.clients[slow].read();
        p.set_room(slow, 100);
        p.fanout("c", "msg-0005");
        assert_eq!(c.state.get(), State::Gone);
        assert!(p.conn(slow).is_none(), "out of the tables at once");
        drop(c);
        p.tick(1);
        assert!(p.clients[slow].server_closed(), "the socket is closed");
        p.clients[slow].read();
        let got = p.clients[slow].take();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(
            got[2],
            Got::Close(
                Some(close_code::POLICY),
                "slow consumer: over --max-queue".into()
            )
        );
        assert_eq!(closed(&p, "slow_consumer"), 1);
        assert_eq!(p.counters().slow_consumer.borrow()["queue"], 1);
        // Three whole frames queued, and the one that did not fit.
        assert_eq!(p.counters().frames_dropped.get(), 4);
        assert_eq!(p.counters().queued.get(), 0);
        assert_eq!(p.counters().open.get(), 1);
        let texts = p.clients[fine].take();
        let texts = texts.iter().filter(|g| matches!(g, Got::Text(_)));
        assert_eq!(texts.count(), 6, "the others are not held back");
    }

    #[test]
    fn a_slow_client_with_half_a_frame_on_the_wire_gets_no_close_frame() {
        let mut p = Pair::new(limits(30, 1000, 1000, 50));
        let a = p.connect_with("c", 15, b"");
        p.clients[a].reading = false;
        for i in 0..5 {
            p.fanout("c", &format!("msg-{i:04}"));
        }
        p.clients[a].read();
        p.tick(1);
        assert!(p.clients[a].server_closed());
        // A close frame behind half a frame would read as garbage.
        let got = p.clients[a].take();
        assert!(got.iter().all(|g| matches!(g, Got::Text(_))), "{got:?}");
        assert_eq!(closed(&p, "slow_consumer"), 1);
    }

    #[test]
    fn the_clients_close_is_answered_with_its_code_then_the_socket_closes() {
        let mut p = Pair::defaults();
        let a = p.connect("news");
        p.clients[a].close(close_code::NORMAL);
        p.drive();
        assert_eq!(
            p.clients[a].take(),
            [Got::Close(Some(close_code::NORMAL), String::new())]
        );
        assert!(p.clients[a].server_closed());
        assert_eq!(closed(&p, "peer_close"), 1);
        assert_eq!(p.counters().open.get(), 0);
        assert_eq!(p.publish("news", "late"), 0, "out of its channel");
    }

    #[test]
    fn a_close_behind_a_queue_waits_for_the_queue_to_be_written() {
        let mut p = Pair::defaults();
        let a = p.connect_with("news", 5, b"");
        p.clients[a].reading = false;
        p.publish("news", "queued behind a small window");
        p.clients[a].close(4000);
        p.drive();
        let c = p.conn(a).unwrap();
        assert_eq!(c.state.get(), State::Finishing);
        assert!(!p.clients[a].server_closed());
        drop(c);
        p.clients[a].reading = true;
        p.drive();
        p.tick(1);
        assert_eq!(
            p.clients[a].take(),
            [
                text("queued behind a small window"),
                Got::Close(Some(4000), String::new())
            ]
        );
        assert!(p.clients[a].server_closed());
    }

    #[test]
    fn a_ping_is_answered_with_a_pong_of_its_payload_even_split_in_two() {
        let mut p = Pair::defaults();
        let a = p.connect("news");
        p.clients[a].send(OpCode::Ping, b"are you there");
        p.drive();
        assert_eq!(p.clients[a].take(), [Got::Pong(b"are you there".to_vec())]);
        let mut frame = Vec::new();
        throng_proto::ws::encode_into(&mut frame, true, OpCode::Ping, b"split", Some([1, 2, 3, 4]));
        p.clients[a].send_raw(&frame[..4]);
        p.drive();
        assert!(p.conn(a).unwrap().has_rest(), "half a frame is kept");
        p.clients[a].send_raw(&frame[4..]);
        p.drive();
        assert_eq!(p.clients[a].take(), [Got::Pong(b"split".to_vec())]);
        assert!(!p.conn(a).unwrap().has_rest());
    }

    #[test]
    fn frames_sent_with_the_upgrade_are_handled_at_once() {
        let mut p = Pair::defaults();
        let mut ping = Vec::new();
        throng_proto::ws::encode_into(&mut ping, true, OpCode::Ping, b"early", Some([9, 9, 9, 9]));
        let a = p.connect_with("news", 1 << 16, &ping);
        p.drive();
        assert_eq!(p.clients[a].take(), [Got::Pong(b"early".to_vec())]);
    }

    #[test]
    fn a_protocol_error_closes_1002_sends_fin_and_ignores_the_rest() {
        let mut p = Pair::defaults();
        let a = p.connect("news");
        // An unmasked frame from a client breaks RFC 6455.
        p.clients[a].send_raw(&[0x89, 0x00]);
        p.drive();
        let got = p.clients[a].take();
        assert!(
            matches!(&got[..], [Got::Close(Some(close_code::PROTOCOL), _)]),
            "{got:?}"
        );
        assert!(p.clients[a].server_fin(), "FIN after the close frame");
        assert!(
            !p.clients[a].server_closed(),
            "waits for the client's close"
        );
        assert_eq!(p.conn(a).unwrap().state.get(), State::Failed);
        p.clients[a].send(OpCode::Ping, b"ignored");
        p.clients[a].close(close_code::NORMAL);
        p.drive();
        assert!(p.clients[a].take().is_empty(), "nothing after the close");
        assert_eq!(closed(&p, "protocol_error"), 1);
        // EOF ends it; the socket closes when the tick drops it from the
        // closing list.
        p.clients[a].fin();
        p.drive();
        assert!(p.conn(a).is_none());
        p.tick(1);
        assert!(p.clients[a].server_closed());
    }

    #[test]
    fn eof_and_a_reset_are_a_peer_gone() {
        let mut p = Pair::defaults();
        let (a, b) = (p.connect("news"), p.connect("news"));
        p.clients[a].fin();
        p.drive();
        assert!(p.clients[a].server_closed());
        p.reset(b);
        assert_eq!(p.publish("news", "x"), 1, "counted: it was subscribed");
        assert!(p.clients[b].server_closed());
        assert_eq!(closed(&p, "peer_gone"), 2);
        assert_eq!(p.counters().frames_dropped.get(), 1);
        assert_eq!(p.counters().open.get(), 0);
    }
}
