//! One subscriber connection after the upgrade (or the start of its event
//! stream): its socket, its queue (made only when the socket is full) and
//! its TLS session, with the methods that read, write and drain them and
//! say what happened. Its life (below: reading control frames only, an SSE
//! client's bytes dropped; closing, where an SSE stream just ends) is
//! driven by the worker's subscribers ([`super::subscribers`]). Both run
//! over a [`Wire`] (a non-blocking byte stream) and the worker's clock in
//! ticks; they open no socket and read no clock, so tests drive them in
//! memory.
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
use std::time::Duration;

use bytes::Bytes;
use throng_proto::mqtt;
use throng_proto::ws::{self, Decoder};

use super::mqtt::Mqtt;
use super::rejoin::Kind;
use crate::tls::{self, Pumped};

/// An empty place: a connection in no slot, or in no channel's list.
pub(crate) const NONE: u32 = u32::MAX;

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
    slot: Cell<u32>,
    /// Channel id in the worker's channel table.
    channel: Cell<u32>,
    /// Position in the channel's subscriber list, or [`NONE`] when not subscribed.
    sub_pos: Cell<u32>,
    /// Worker tick at which the client was last heard from.
    last_seen: Cell<u32>,
    state: Cell<State>,
    /// Whether it is in the worker's `queued` list.
    listed: Cell<bool>,
    /// How it takes its messages (WebSocket bare or with ids, or SSE).
    kind: Kind,
    /// Rejoining after an id: what is published is held until the
    /// channel's history arrives ([`super::rejoin`]).
    rejoining: Cell<bool>,
    /// The Unix second its token expires at (closed 4001 by the sweep);
    /// 0: no token, or one without `exp`. Four bytes that fit beside the
    /// other small fields, so an authenticated subscriber costs no more.
    /// A `Cell`: an in-band refresh ([`super::multi`]) moves it.
    expires: Cell<u32>,
    /// What the worker counts this connection under (its client address
    /// for the per-address limits, its place under `--max-connections`),
    /// handed back to [`Outside::forget`](super::subscribers::Outside::forget); [`NONE`] when nothing is.
    tag: u32,
    /// Bytes of a frame that arrived split; `None` almost always. A `Cell`
    /// (taken and put back), not a `RefCell`: one word less per connection.
    rest: Cell<Option<Box<[u8]>>>,
    /// Frames the socket would not take yet; `None` unless the client is behind.
    queue: RefCell<Option<Box<Queue>>>,
    /// Its protocol's decoder and state.
    proto: RefCell<Proto>,
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

    /// Runs the session over the records in `buf`: keeps what rustls did
    /// not consume, decrypts into `plain`, puts what the session must send
    /// (a key update, an alert) in `out`. `None` when the session failed
    /// (the alert for the client is in `out`).
    pub(crate) fn pump(
        &mut self,
        buf: &mut [u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Option<Pumped> {
        let have = buf.len();
        match tls::pump(&mut self.conn, buf, plain, out) {
            Ok((used, state)) => {
                self.rest = (used < have).then(|| buf[used..have].into());
                Some(state)
            }
            Err(_) => {
                self.failed = true;
                None
            }
        }
    }

    /// Received bytes rustls has not consumed yet.
    pub(crate) fn rest(&self) -> Option<&[u8]> {
        self.rest.as_deref()
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
pub(crate) enum Got {
    Bytes(usize),
    /// Nothing more to read now.
    Nothing,
    /// The client closed or the socket failed: the connection is gone.
    Ended,
}

/// Where a connection is, and what it is: read and set by the
/// subscribers and their tables, one field at a time.
impl<W> Conn<W> {
    /// Its index in the worker's slab, or [`NONE`].
    pub(crate) fn slot(&self) -> u32 {
        self.slot.get()
    }

    pub(crate) fn set_slot(&self, slot: u32) {
        self.slot.set(slot);
    }

    /// Takes its slot, leaving [`NONE`].
    pub(crate) fn take_slot(&self) -> u32 {
        self.slot.replace(NONE)
    }

    /// Its channel's id in the worker's channel table.
    pub(crate) fn channel(&self) -> u32 {
        self.channel.get()
    }

    pub(crate) fn set_channel(&self, id: u32) {
        self.channel.set(id);
    }

    /// Its position in its channel's subscriber list, or [`NONE`].
    pub(crate) fn sub_pos(&self) -> u32 {
        self.sub_pos.get()
    }

    pub(crate) fn set_sub_pos(&self, pos: u32) {
        self.sub_pos.set(pos);
    }

    /// Takes its position, leaving [`NONE`].
    pub(crate) fn take_sub_pos(&self) -> u32 {
        self.sub_pos.replace(NONE)
    }

    /// The tick it was last heard from at.
    pub(crate) fn last_seen(&self) -> u32 {
        self.last_seen.get()
    }

    pub(crate) fn set_last_seen(&self, now: u32) {
        self.last_seen.set(now);
    }

    pub(crate) fn state(&self) -> State {
        self.state.get()
    }

    pub(crate) fn set_state(&self, state: State) {
        self.state.set(state);
    }

    /// Marks it as in the worker's `queued` list; whether it was already.
    pub(crate) fn list(&self) -> bool {
        self.listed.replace(true)
    }

    /// It left the worker's `queued` list.
    pub(crate) fn unlist(&self) {
        self.listed.set(false);
    }

    /// How it takes its messages.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// Whether it negotiated permessage-deflate ([`Conn::with_deflate`]).
    pub(crate) fn deflates(&self) -> bool {
        matches!(&*self.proto.borrow(), Proto::Ws(d) if d.deflate())
    }

    /// Whether what is published is held for it (a rejoin, or retained
    /// messages on their way).
    pub(crate) fn rejoining(&self) -> bool {
        self.rejoining.get()
    }

    pub(crate) fn set_rejoining(&self, on: bool) {
        self.rejoining.set(on);
    }

    /// It holds nothing any more; whether it did.
    pub(crate) fn stop_rejoining(&self) -> bool {
        self.rejoining.replace(false)
    }

    /// What the worker counts it under ([`Conn::tag`]'s field).
    pub(crate) fn tag(&self) -> u32 {
        self.tag
    }

    /// Its protocol's decoder and state.
    pub(crate) fn proto(&self) -> std::cell::Ref<'_, Proto> {
        self.proto.borrow()
    }

    pub(crate) fn proto_mut(&self) -> std::cell::RefMut<'_, Proto> {
        self.proto.borrow_mut()
    }
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
            expires: Cell::new(0),
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

    /// Closes it (4001) once Unix second `exp` has passed ([`crate::auth::expiry`]).
    pub(crate) fn with_expiry(mut self, exp: u32) -> Self {
        self.expires = Cell::new(exp);
        self
    }

    /// Its token now expires at Unix second `exp` (0: never): a refresh.
    pub(crate) fn set_expires(&self, exp: u32) {
        self.expires.set(exp);
    }

    /// Whether its token has expired at Unix second `now`.
    pub(crate) fn expired(&self, now: u64) -> bool {
        let exp = self.expires.get();
        exp != 0 && u64::from(exp) <= now
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

    /// Lets its client send messages of up to `max` bytes (a connection of
    /// several channels publishes), not only control frames.
    pub(crate) fn with_max_message(mut self, max: usize) -> Self {
        let deflate = self.deflates();
        let mut dec = Decoder::new(ws::Role::Server, max);
        dec.set_deflate(deflate);
        self.proto = RefCell::new(Proto::Ws(dec));
        self
    }

    /// It negotiated permessage-deflate: it may send compressed messages
    /// (inflated within its message limit), and is sent compressed ones.
    /// The flag lives in the decoder's padding: the size does not change.
    pub(crate) fn with_deflate(mut self) -> Self {
        if let Proto::Ws(d) = self.proto.get_mut() {
            d.set_deflate(true);
        }
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
            self.proto.borrow().mqtt().and_then(Mqtt::unacked_since)
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

/// A close frame with `code` and `reason`.
pub(crate) fn close_frame(code: u16, reason: &str) -> Bytes {
    let mut out = Vec::with_capacity(4 + reason.len());
    ws::encode_close(&mut out, code, reason, None);
    Bytes::from(out)
}
/// What the socket did not take of a write to a connection with nothing
/// queued: its queue starts with it ([`Conn::start_queue`]).
pub(crate) struct Unsent {
    bytes: Bytes,
    /// The socket took the head of the frame: this is its tail.
    partial: bool,
}

/// A queue dropped unwritten ([`Conn::drop_queue`]).
pub(crate) struct Dropped {
    /// Whole frames in it (a partly written one is not counted).
    pub(crate) whole: usize,
    /// Its first frame was partly written: the client is mid-frame.
    pub(crate) partial: bool,
}

/// What writing a connection's queue did ([`Conn::write_queue`]).
pub(crate) enum Drained {
    /// No queue, or the socket is full again.
    Waiting,
    /// The queue is written and gone.
    Emptied,
    /// The socket failed.
    Broken,
}

/// The connection's own mechanics: reads, writes and its queue, its TLS
/// session. Each returns what happened; the subscribers keep the books
/// (counters, the lists of queued and closing connections, readiness).
impl<W: Wire> Conn<W> {
    /// One read into `buf`. [`Got::Ended`] at EOF or on an error.
    pub(crate) fn read_some(&self, buf: &mut [u8]) -> Got {
        match self.wire.read(buf) {
            // The client closed (after a close handshake, or not).
            Ok(0) => Got::Ended,
            Ok(n) => Got::Bytes(n),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Got::Nothing
            }
            Err(_) => Got::Ended,
        }
    }

    /// Writes `bytes` to the socket, or appends them (as `keep` of the
    /// range) to the queue, within `max_queue` (with an MQTT subscriber's
    /// deliveries awaiting PUBACK). With nothing queued, returns what the
    /// socket did not take: the caller starts the queue with it.
    pub(crate) fn write_or_queue(
        &self,
        bytes: &[u8],
        keep: impl Fn(Range<usize>) -> Bytes,
        max_queue: usize,
    ) -> Result<Option<Unsent>, SendError> {
        if let Some(q) = self.queue.borrow_mut().as_mut() {
            let inflight = if self.kind.is_mqtt() {
                self.proto.borrow().mqtt().map_or(0, Mqtt::inflight_bytes)
            } else {
                0
            };
            if q.bytes + inflight + bytes.len() > max_queue {
                return Err(SendError::QueueFull);
            }
            q.bytes += bytes.len();
            q.frames.push_back(keep(0..bytes.len()));
            return Ok(None);
        }
        loop {
            return match self.wire.write(bytes) {
                Ok(n) if n == bytes.len() => Ok(None),
                Ok(n) => Ok(Some(Unsent {
                    bytes: keep(n..bytes.len()),
                    partial: n > 0,
                })),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Some(Unsent {
                    bytes: keep(0..bytes.len()),
                    partial: false,
                })),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => Err(SendError::Broken),
            };
        }
    }

    /// Writes the frame made of `parts` with one `writev`; the caller
    /// checked that nothing is queued and that it is not TLS. Returns what
    /// the socket did not take, joined into one buffer.
    pub(crate) fn write_parts(&self, parts: &[&[u8]; 3]) -> Result<Option<Unsent>, SendError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let iov = parts.map(IoSlice::new);
        let rest = |from: usize| Bytes::from(parts.concat().split_off(from));
        loop {
            return match self.wire.write_vectored(&iov) {
                Ok(n) if n == total => Ok(None),
                Ok(n) => Ok(Some(Unsent {
                    bytes: rest(n),
                    partial: n > 0,
                })),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Some(Unsent {
                    bytes: rest(0),
                    partial: false,
                })),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => Err(SendError::Broken),
            };
        }
    }

    /// Starts its queue with what the socket did not take, at tick `now`.
    pub(crate) fn start_queue(&self, unsent: Unsent, now: u32) {
        let bytes = unsent.bytes.len();
        let q = Queue {
            frames: VecDeque::from([unsent.bytes]),
            bytes,
            partial: unsent.partial,
            since: now,
        };
        *self.queue.borrow_mut() = Some(Box::new(q));
    }

    /// Drops its queue unwritten, if it has one.
    pub(crate) fn drop_queue(&self) -> Option<Dropped> {
        let q = self.queue.borrow_mut().take()?;
        Some(Dropped {
            whole: q.frames.len() - usize::from(q.partial),
            partial: q.partial,
        })
    }

    /// Writes its queue as the socket takes it, several frames per
    /// `writev`; progress at tick `now` moves its `--write-timeout`.
    pub(crate) fn write_queue(&self, now: u32) -> Drained {
        loop {
            let written = {
                let q = self.queue.borrow();
                let Some(q) = q.as_ref() else {
                    return Drained::Waiting;
                };
                let iov: Vec<IoSlice<'_>> =
                    q.frames.iter().take(64).map(|b| IoSlice::new(b)).collect();
                self.wire.write_vectored(&iov)
            };
            match written {
                Ok(mut n) => {
                    let mut guard = self.queue.borrow_mut();
                    let Some(q) = guard.as_mut() else {
                        return Drained::Waiting;
                    };
                    q.bytes -= n;
                    q.since = now;
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
                        return Drained::Emptied;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Drained::Waiting,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Drained::Broken,
            }
        }
    }

    /// Encrypts `data` into `out` (cleared first); an error for a plain
    /// connection or a failed session.
    pub(crate) fn seal(&self, data: &[u8], out: &mut Vec<u8>) -> Result<(), tls::SealError> {
        let Some(session) = &self.tls else {
            return Err(tls::SealError::Closed);
        };
        out.clear();
        session.borrow_mut().seal(data, out)
    }

    /// One write of `data` straight to the socket, encrypted (in `out`)
    /// for a TLS subscriber; what the socket does not take is dropped (the
    /// caller closes the connection next).
    pub(crate) fn write_now(&self, data: &[u8], out: &RefCell<Vec<u8>>) {
        if self.tls.is_some() {
            let mut out = out.borrow_mut();
            if self.seal(data, &mut out).is_ok() {
                let _ = self.wire.write(&out);
            }
        } else {
            let _ = self.wire.write(data);
        }
    }

    /// A clean TLS end (best effort: one write, nothing queued), encrypted
    /// in `out`; nothing for a plain connection.
    pub(crate) fn close_notify(&self, out: &RefCell<Vec<u8>>) {
        if let Some(session) = &self.tls {
            let mut out = out.borrow_mut();
            out.clear();
            if session.borrow_mut().close_notify(&mut out).is_ok() {
                let _ = self.wire.write(&out);
            }
        }
    }

    /// Its TLS session, for a TLS subscriber.
    pub(crate) fn tls(&self) -> Option<&RefCell<TlsState>> {
        self.tls.as_deref()
    }

    /// Takes the bytes of a frame that arrived split, if any.
    pub(crate) fn take_rest(&self) -> Option<Box<[u8]>> {
        self.rest.take()
    }

    /// Whether MQTT subscriber `c` said nothing for longer than its
    /// keep-alive allows at tick `now`. The tick's sweep asks, once per
    /// `--ping-interval` for each connection: a silent client is closed up
    /// to one interval late (MQTT servers commonly check on a period; no
    /// timer per connection).
    pub(crate) fn mqtt_overdue(&self, now: u32) -> bool {
        let proto = self.proto.borrow();
        proto
            .mqtt()
            .is_some_and(|m| m.overdue(self.last_seen.get(), now))
    }
}

#[cfg(test)]
mod tests {
    //! One connection's life, both ends in memory ([`Pair`]): what the
    //! client receives, what the server counts, and when the socket closes.

    use std::net::TcpStream;

    use throng_proto::ws::{OpCode, close_code};

    use super::{Conn, Drained, SendError, State};
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

    /// The connection's own mechanics, called directly: what the socket
    /// does not take is handed back to start the queue, later writes go
    /// behind it within `--max-queue`, and room to write drains it in order.
    #[test]
    fn a_partial_write_hands_back_the_tail_and_the_queue_drains_in_order() {
        let mut p = Pair::defaults();
        let a = p.connect_with("news", 4, b"");
        p.clients[a].reading = false;
        let c = p.conn(a).unwrap();
        let frame = bytes::Bytes::from_static(b"0123456789");
        let keep = |r: std::ops::Range<usize>| frame.slice(r);
        let unsent = c.write_or_queue(&frame, keep, 100).unwrap();
        let unsent = unsent.expect("the socket took 4 bytes of 10");
        assert_eq!((&unsent.bytes[..], unsent.partial), (&b"456789"[..], true));
        c.start_queue(unsent, 7);
        assert!(c.write_or_queue(&frame, keep, 100).unwrap().is_none());
        assert_eq!(c.queued_len(), 16);
        assert_eq!(c.stalled_since(9), Some(7));
        assert_eq!(
            c.write_or_queue(&frame, keep, 20).err(),
            Some(SendError::QueueFull)
        );
        assert!(matches!(c.write_queue(8), Drained::Waiting), "no room");
        p.set_room(a, 1 << 20);
        assert!(matches!(c.write_queue(9), Drained::Emptied));
        assert!(!c.has_queue());
        assert_eq!(p.clients[a].take_raw(), b"01234567890123456789");
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
        assert_eq!(c.state(), State::Gone);
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
        assert_eq!(c.state(), State::Finishing);
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
        assert_eq!(p.conn(a).unwrap().state(), State::Failed);
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
