//! The readiness loop that holds established connections.
//!
//! Connections are opened by tokio tasks (connect timeouts, the upgrade),
//! then handed over here: the socket leaves tokio's reactor
//! (`into_std`) and joins one epoll set per worker, and its task ends. What
//! stays per idle connection is one [`Held`] slot in a vector indexed by file
//! descriptor: the socket, a decoder with no buffer, its place in the
//! message [`Sequence`] and the time it opened — well under 100 bytes, against ~1.5 KiB for a
//! tokio task plus its I/O registration (both 128-byte aligned) measured at
//! 18,000 connections. The epoll set is `throng-host`'s [`Poller`], itself
//! registered with tokio, so the loop runs beside the worker's other tasks
//! on the same thread.
//!
//! The loop is level-triggered: a connection with more data than one turn
//! reads is reported again, so one busy connection cannot starve the others.
//! Replies (pongs, the close answer) are written at once; a client that
//! never sends has an empty send buffer, so a reply that does not fit
//! means a broken connection and closes it.
//!
//! A `wss://` connection also owns its TLS record state, [`Records`]: two
//! AEAD keys and their sequence numbers, taken over from rustls after the
//! upgrade (boxed, so plain slots grow by one pointer only). Reads are
//! decrypted in the shared scratch buffer and copied to a second shared
//! buffer; replies are encrypted into a short-lived one. Once our close frame is answered, a TLS
//! connection says close_notify before the socket closes.

use std::cell::{Cell, RefCell};
use std::io::{self, Read as _, Write as _};
use std::net::TcpStream;
use std::os::fd::AsRawFd as _;

use throng_host::poll::{Events, Interest, Poller};
use throng_proto::mqtt::{self, Packet};
use throng_proto::sse;
use throng_proto::ws::{self, Decoder, Frame};

use super::mqtt::{acknowledge, disconnect, handshake_step, ping_due, ping_every, pingreq};
use super::recorder::Closed;
use super::sequence::Sequence;
use super::shared::Shared;
use crate::harness::clock::now_unix_ns;
use crate::tls::{Phase, Records};

/// Events taken from epoll per call.
const EVENTS: usize = 1024;
/// Reads per connection per readiness report (fairness).
const READS_PER_TURN: usize = 4;
/// Rounds of events per wake-up before yielding to the worker's other tasks.
const ROUNDS_PER_WAKE: usize = 8;

/// A 4-byte client mask. RFC 6455 wants it unpredictable to intermediaries;
/// fastrand is enough for a load generator that is not a browser.
fn mask() -> [u8; 4] {
    fastrand::u32(..).to_ne_bytes()
}

/// What a held connection decodes with: WebSocket frames, MQTT packets or
/// Server-Sent Events.
pub(super) enum Codec {
    /// A WebSocket subscriber.
    Ws(Decoder),
    /// An MQTT subscriber.
    Mqtt(MqttConn),
    /// A Server-Sent Events subscriber: no state beyond `Held::rest` (the
    /// start of an event whose empty line has not come), since the parser
    /// reads whole events.
    Sse,
}

impl Codec {
    /// An MQTT subscriber's, from the decoder that read its CONNACK.
    pub(super) fn mqtt(decoder: mqtt::Decoder) -> Self {
        Self::Mqtt(MqttConn {
            decoder,
            ping_out: false,
        })
    }
}

/// An MQTT subscriber's state beside its socket.
pub(super) struct MqttConn {
    decoder: mqtt::Decoder,
    /// A PINGREQ is out and its PINGRESP has not come.
    ping_out: bool,
}

/// One held connection.
struct Held {
    stream: TcpStream,
    /// The TLS state of a `wss://` or `mqtts://` connection.
    tls: Option<Box<Records>>,
    codec: Codec,
    /// Bytes of a frame that arrived split; empty (no allocation) otherwise.
    rest: Vec<u8>,
    /// What it has received of the published sequence (and when it opened).
    seq: Sequence,
    /// Our close frame is out; waiting for the server's.
    closing: bool,
    /// Read-timeout sweeps since anything last arrived (see [`Holder::sweep`]).
    silent: u8,
}

/// What reading found, besides messages (recorded as they come).
enum Seen {
    /// Nothing more to read now.
    Drained,
    /// The server sent a close frame.
    Close(Option<u16>),
    /// The server closed TCP.
    Eof,
    /// A read or write failed.
    Reset,
    /// The server broke the protocol; a close with the right code is in the reply.
    Protocol,
    /// A TLS record failed (decryption, a fatal alert).
    Tls,
}

/// The epoll set and the slots of every held connection of a worker.
pub(super) struct Holder {
    poller: Poller,
    /// Indexed by file descriptor. Invariant: `slots[fd]` is `Some` exactly
    /// when `fd` is in `poller` (with itself as token) and owned by the
    /// slot's stream.
    slots: RefCell<Vec<Option<Held>>>,
    /// Connections held now.
    count: Cell<u64>,
    /// The close deadline has passed: anything still closing was given up on.
    expired: Cell<bool>,
}

impl Holder {
    /// An empty holder. Must be called inside the worker's runtime.
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            poller: Poller::new()?,
            slots: RefCell::new(Vec::new()),
            count: Cell::new(0),
            expired: Cell::new(false),
        })
    }

    /// Takes over an upgraded connection; `rest` is what arrived (decrypted)
    /// after the handshake response.
    pub(super) fn adopt(
        &self,
        ctx: &Shared,
        stream: tokio::net::TcpStream,
        tls: Option<Box<Records>>,
        codec: Codec,
        rest: Vec<u8>,
    ) {
        ctx.live.add();
        let Ok(stream) = stream.into_std() else {
            ctx.rec.borrow_mut().closed(Closed::Reset);
            ctx.live.done();
            return;
        };
        let fd = stream.as_raw_fd();
        let Ok(index) = usize::try_from(fd) else {
            ctx.rec.borrow_mut().closed(Closed::Reset);
            ctx.live.done();
            return;
        };
        if self
            .poller
            .add(&stream, index as u64, Interest::Read)
            .is_err()
        {
            ctx.rec.borrow_mut().closed(Closed::Reset);
            ctx.live.done();
            return;
        }
        let held = Held {
            stream,
            tls,
            codec,
            rest: Vec::new(),
            seq: Sequence::new(now_unix_ns()),
            closing: false,
            silent: 0,
        };
        {
            let mut slots = self.slots.borrow_mut();
            if slots.len() <= index {
                slots.resize_with(index + 1, || None);
            }
            slots[index] = Some(held);
        }
        self.count.set(self.count.get() + 1);
        if !rest.is_empty() {
            let mut rest = rest;
            self.turn(ctx, index, Some(&mut rest));
        }
        if ctx.stop.is_set() {
            self.close_one(ctx, index);
            if self.expired.get() {
                self.finish(ctx, index, Closed::CloseTimeout);
            }
        }
    }

    /// The loop: waits for the epoll set, handles every ready connection.
    pub(super) async fn run(&self, ctx: &Shared) {
        let mut events = Events::with_capacity(EVENTS);
        loop {
            if self.poller.wait(&mut events).await.is_err() {
                return;
            }
            let mut rounds = 1;
            loop {
                for ev in events.iter() {
                    // Tokens are file descriptors (see `adopt`).
                    self.turn(ctx, ev.token as usize, None);
                }
                if rounds == ROUNDS_PER_WAKE {
                    // Level-triggered: what is left is reported again after others ran.
                    tokio::task::yield_now().await;
                    break;
                }
                match self.poller.poll_now(&mut events) {
                    Ok(0) => break,
                    Ok(_) => rounds += 1,
                    Err(_) => return,
                }
            }
        }
    }

    /// Reads and handles what connection `index` has (or `first`, the bytes
    /// that came with the handshake).
    fn turn(&self, ctx: &Shared, index: usize, first: Option<&mut Vec<u8>>) {
        let mut reply = Vec::new();
        let (seen, closing, no_close_frame) = {
            let mut slots = self.slots.borrow_mut();
            let Some(Some(held)) = slots.get_mut(index) else {
                return;
            };
            // Something arrived (data, a ping, the end): not silent.
            held.silent = 0;
            let seen = match first {
                Some(bytes) => process(ctx, held, bytes, &mut reply),
                None => read(ctx, held, &mut reply),
            };
            let mut seen = seen;
            // Once our close is out, nothing more is sent.
            if !reply.is_empty() && !held.closing && send_now(held, &reply).is_err() {
                seen = Seen::Reset;
            }
            (seen, held.closing, !matches!(held.codec, Codec::Ws(_)))
        };
        let how = match seen {
            Seen::Drained => return,
            Seen::Close(_) if closing => Closed::Clean,
            // MQTT and SSE have no close handshake: TCP's close is the end.
            Seen::Eof if closing && no_close_frame => Closed::Clean,
            Seen::Close(code) => Closed::ByServer(code),
            Seen::Eof => Closed::Eof,
            Seen::Reset => Closed::Reset,
            Seen::Protocol => Closed::Protocol,
            Seen::Tls => Closed::Tls,
        };
        self.finish(ctx, index, how);
    }

    /// Ends connection `index`: counts how, and the messages it missed at the
    /// end of the run; closes the socket.
    fn finish(&self, ctx: &Shared, index: usize, how: Closed) {
        let Some(mut held) = self
            .slots
            .borrow_mut()
            .get_mut(index)
            .and_then(Option::take)
        else {
            return;
        };
        if how == Closed::Clean
            && let Some(session) = held.tls.as_mut()
        {
            let mut out = Vec::new();
            // Best effort: the server may already be gone.
            if session.close_notify(&mut out).is_ok() {
                let _ = write_now(&held.stream, &out);
            }
        }
        // Closing the socket would take it out of the set too; this is at once.
        let _ = self.poller.remove(&held.stream);
        let mut rec = ctx.rec.borrow_mut();
        if held.closing {
            // Closed by us at the end of the run: what it never received is lost.
            rec.lost(
                held.seq
                    .missing_at_end(ctx.final_seq.get(), ctx.first_publish_ns.get()),
            );
        }
        rec.closed(how);
        drop(rec);
        drop(held);
        self.count.set(self.count.get() - 1);
        ctx.live.done();
    }

    /// Sends our close frame on connection `index` (an SSE one just closes).
    fn close_one(&self, ctx: &Shared, index: usize) {
        let ended = {
            let mut slots = self.slots.borrow_mut();
            let Some(Some(held)) = slots.get_mut(index) else {
                return;
            };
            if held.closing {
                return;
            }
            let mut frame = Vec::with_capacity(8);
            match &held.codec {
                Codec::Ws(_) => {
                    ws::encode_close(&mut frame, ws::close_code::NORMAL, "", Some(mask()));
                }
                Codec::Mqtt(m) => disconnect(version(&m.decoder), &mut frame),
                // An event stream is ended by its client closing TCP: nothing
                // to say first (close_notify goes out in `finish`).
                Codec::Sse => {}
            }
            held.closing = true;
            if frame.is_empty() {
                Some(Closed::Clean)
            } else {
                send_now(held, &frame).err().map(|_| Closed::Reset)
            }
        };
        if let Some(how) = ended {
            self.finish(ctx, index, how);
        }
    }

    /// The one-second sweep of MQTT keep-alives (`tick` counts seconds):
    /// every connection due sends PINGREQ; one whose last PINGREQ is still
    /// unanswered is closed (`closed.keepalive`).
    pub(super) fn ping(&self, ctx: &Shared, tick: u64, keep_alive_s: u16) {
        let every = ping_every(keep_alive_s);
        if every == 0 {
            return;
        }
        let len = self.slots.borrow().len();
        for index in 0..len {
            if !ping_due(index as u64, tick, every) {
                continue;
            }
            let outcome = {
                let mut slots = self.slots.borrow_mut();
                let Some(Some(held)) = slots.get_mut(index) else {
                    continue;
                };
                let Codec::Mqtt(m) = &mut held.codec else {
                    continue;
                };
                if held.closing {
                    continue;
                }
                if m.ping_out {
                    Some(Closed::KeepAlive)
                } else {
                    m.ping_out = true;
                    let mut packet = Vec::with_capacity(2);
                    pingreq(version(&m.decoder), &mut packet);
                    send_now(held, &packet).err().map(|_| Closed::Reset)
                }
            };
            if let Some(how) = outcome {
                self.finish(ctx, index, how);
            }
        }
    }

    /// One read-timeout sweep, every half `--read-timeout`: a connection
    /// that heard nothing since two sweeps ago (silent at least the
    /// timeout, at most half as long again) fails as `closed.read_timeout`.
    pub(super) fn sweep(&self, ctx: &Shared) {
        let len = self.slots.borrow().len();
        for index in 0..len {
            let timed_out = {
                let mut slots = self.slots.borrow_mut();
                let Some(Some(held)) = slots.get_mut(index) else {
                    continue;
                };
                held.silent = held.silent.saturating_add(1);
                !held.closing && held.silent > 2
            };
            if timed_out {
                self.finish(ctx, index, Closed::ReadTimeout);
            }
        }
    }

    /// The run ends: send every held connection our close frame.
    pub(super) fn close_all(&self, ctx: &Shared) {
        let len = self.slots.borrow().len();
        for index in 0..len {
            self.close_one(ctx, index);
        }
    }

    /// The close timeout has passed: give up on every connection still open.
    pub(super) fn expire(&self, ctx: &Shared) {
        self.expired.set(true);
        let len = self.slots.borrow().len();
        for index in 0..len {
            self.finish(ctx, index, Closed::CloseTimeout);
        }
    }
}

/// Writes all of `buf` without waiting, or fails.
fn write_now(mut stream: &TcpStream, buf: &[u8]) -> io::Result<()> {
    let n = stream.write(buf)?;
    if n == buf.len() {
        Ok(())
    } else {
        Err(io::ErrorKind::WriteZero.into())
    }
}

/// Sends `plain` on `held` at once (encrypted on a TLS connection), or fails.
fn send_now(held: &mut Held, plain: &[u8]) -> io::Result<()> {
    match held.tls.as_mut() {
        None => write_now(&held.stream, plain),
        Some(session) => {
            let mut out = Vec::new();
            session.send(plain, &mut out).map_err(io::Error::other)?;
            write_now(&held.stream, &out)
        }
    }
}

/// What one `read` into the scratch buffer gave.
enum Got {
    /// This many bytes.
    Bytes(usize),
    /// Interrupted: read again.
    Again,
    /// Nothing more for now, or the end of the connection.
    Done(Seen),
}

fn read_into(stream: &TcpStream, buf: &mut [u8]) -> Got {
    let mut stream = stream;
    match stream.read(buf) {
        Ok(0) => Got::Done(Seen::Eof),
        Ok(n) => Got::Bytes(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Got::Done(Seen::Drained),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Got::Again,
        Err(_) => Got::Done(Seen::Reset),
    }
}

/// [`process`] of `data` after what an earlier read left of a split frame.
fn process_more(ctx: &Shared, held: &mut Held, data: &mut [u8], reply: &mut Vec<u8>) -> Seen {
    if held.rest.is_empty() {
        process(ctx, held, data, reply)
    } else {
        let mut joined = std::mem::take(&mut held.rest);
        joined.extend_from_slice(data);
        process(ctx, held, &mut joined, reply)
    }
}

/// Reads what is there (a bounded number of times) and processes it. A
/// TLS connection's records are decrypted from the shared scratch buffer
/// into the second shared buffer first.
fn read(ctx: &Shared, held: &mut Held, reply: &mut Vec<u8>) -> Seen {
    let mut scratch = ctx.scratch.borrow_mut();
    let mut plain = ctx.plain.borrow_mut();
    for _ in 0..READS_PER_TURN {
        let n = match read_into(&held.stream, &mut scratch) {
            Got::Bytes(n) => n,
            Got::Again => continue,
            Got::Done(seen) => return seen,
        };
        ctx.rec.borrow_mut().bytes_in(n);
        let phase = match held.tls.as_mut() {
            None => None,
            Some(session) => {
                plain.clear();
                match session.receive(&mut scratch[..n], &mut plain) {
                    Ok(phase) => Some(phase),
                    Err(_) => return Seen::Tls,
                }
            }
        };
        let seen = match phase {
            None => process_more(ctx, held, &mut scratch[..n], reply),
            Some(_) if plain.is_empty() => Seen::Drained,
            Some(_) => process_more(ctx, held, &mut plain, reply),
        };
        if !matches!(seen, Seen::Drained) {
            return seen;
        }
        if phase == Some(Phase::PeerClosed) {
            return Seen::Eof;
        }
        if n < scratch.len() {
            // A short read: most likely drained; epoll says if not.
            return Seen::Drained;
        }
    }
    Seen::Drained
}

/// Decodes every whole frame or packet in `buf`; keeps a trailing partial
/// one in `held.rest` (copying only that tail when `buf` is the shared scratch).
fn process(ctx: &Shared, held: &mut Held, buf: &mut [u8], reply: &mut Vec<u8>) -> Seen {
    let now_ns = now_unix_ns();
    let (off, seen) = match &mut held.codec {
        Codec::Ws(decoder) => frames(ctx, decoder, &mut held.seq, buf, reply, now_ns),
        Codec::Mqtt(m) => packets(ctx, m, &mut held.seq, buf, reply, now_ns),
        Codec::Sse => events(ctx, &mut held.seq, buf, now_ns),
    };
    let tail = &buf[off..];
    held.rest = if tail.is_empty() {
        Vec::new()
    } else {
        tail.to_vec()
    };
    seen
}

/// WebSocket frames: how far they went, and what was seen.
fn frames(
    ctx: &Shared,
    decoder: &mut Decoder,
    seq: &mut Sequence,
    buf: &mut [u8],
    reply: &mut Vec<u8>,
    now_ns: u64,
) -> (usize, Seen) {
    let mut off = 0;
    let mut seen = Seen::Drained;
    while off < buf.len() {
        let decoded = match decoder.decode(&mut buf[off..]) {
            Ok(Some(d)) => d,
            Ok(None) => break,
            Err(e) => {
                ws::encode_close(reply, e.close_code(), e.label(), Some(mask()));
                seen = Seen::Protocol;
                off = buf.len();
                break;
            }
        };
        off += decoded.consumed;
        match decoded.frame {
            None | Some(Frame::Pong(_)) => {}
            Some(Frame::Text(payload) | Frame::Binary(payload)) => {
                ctx.on_message(seq, payload, now_ns);
            }
            Some(Frame::Ping(payload)) => {
                ws::encode_into(reply, true, ws::OpCode::Pong, payload, Some(mask()));
            }
            Some(Frame::Close { code, .. }) => {
                ws::encode_close(
                    reply,
                    code.unwrap_or(ws::close_code::NORMAL),
                    "",
                    Some(mask()),
                );
                seen = Seen::Close(code);
                off = buf.len();
                break;
            }
        }
    }
    decoder.release();
    (off, seen)
}

/// MQTT packets: a PUBLISH is a message (with its PUBACK at QoS 1), a
/// PINGRESP answers our PINGREQ, a 5.0 DISCONNECT closes with its reason;
/// a packet the codec refuses gets the protocol's answer.
fn packets(
    ctx: &Shared,
    m: &mut MqttConn,
    seq: &mut Sequence,
    buf: &[u8],
    reply: &mut Vec<u8>,
    now_ns: u64,
) -> (usize, Seen) {
    let mut off = 0;
    while off < buf.len() {
        let decoded = match m.decoder.decode(&buf[off..]) {
            Ok(Some(d)) => d,
            Ok(None) => break,
            Err(e) => {
                m.decoder.answer(&e).encode(reply);
                return (buf.len(), Seen::Protocol);
            }
        };
        off += decoded.consumed;
        match decoded.packet {
            Packet::Publish(p) => {
                ctx.on_message(seq, p.payload, now_ns);
                acknowledge(p.delivery, version(&m.decoder), reply);
            }
            // QoS 2's second half: the message was counted at its PUBLISH.
            Packet::Pubrel(a) => handshake_step(false, a.packet_id, version(&m.decoder), reply),
            Packet::Pingresp => m.ping_out = false,
            Packet::Disconnect(d) => return (buf.len(), Seen::Close(Some(u16::from(d.reason.0)))),
            // SUBACK, PUBACK and the like: nothing was asked that they answer.
            _ => {}
        }
    }
    (off, Seen::Drained)
}

/// Server-Sent Events: each event's payload (a `binary` one's decoded from
/// base64) is a message; comments (the keep-alives) and `retry:` are
/// nothing. An event over the message limit, or binary data that is not
/// base64, breaks the stream.
fn events(ctx: &Shared, seq: &mut Sequence, buf: &[u8], now_ns: u64) -> (usize, Seen) {
    // An event is its payload plus field names and line ends (base64 makes
    // a binary one a third longer).
    let limit = ctx.plan.settings.max_message.saturating_mul(2).max(4096);
    let mut off = 0;
    loop {
        match sse::parse(&buf[off..], limit) {
            Ok(None) => return (off, Seen::Drained),
            Ok(Some(parsed)) => {
                off += parsed.consumed;
                if let Some(event) = parsed.event {
                    match event.payload() {
                        Ok(payload) => ctx.on_message(seq, &payload, now_ns),
                        Err(_) => return (buf.len(), Seen::Protocol),
                    }
                }
            }
            Err(_) => return (buf.len(), Seen::Protocol),
        }
    }
}

/// The version a client's decoder was made for.
fn version(decoder: &mqtt::Decoder) -> mqtt::Version {
    // Invariant: a client's decoder knows its version from the start.
    decoder.version().unwrap_or(mqtt::Version::V311)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An MQTT subscriber costs what a WebSocket one does: its codec is no
    /// bigger, so a held connection is the same 88 bytes either way.
    #[test]
    fn an_mqtt_codec_costs_a_held_connection_nothing_more() {
        assert!(size_of::<MqttConn>() <= size_of::<Decoder>());
        assert_eq!(size_of::<Codec>(), size_of::<Decoder>() + 8);
        assert_eq!(size_of::<Held>(), 88);
    }
}
