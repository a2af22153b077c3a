//! A sans-I/O HTTP/2 client connection (RFC 9113) for a load generator:
//! many requests (streams) at once on one connection, each response read
//! for its status and counted, its body dropped as it arrives.
//!
//! The caller owns the socket (and TLS): it hands [`Connection::recv`] the
//! bytes it read, writes out [`Connection::output`], and takes
//! [`Event`]s. Every stream carries a caller's token `T` (what the request
//! needs to be recorded), so the caller keeps no table of its own.
//!
//! What a stream costs: its token, two windows and a body handle, in one
//! map entry (about a hundred bytes). The connection keeps the bytes of one
//! frame that arrived split across reads (at most 16 KiB + 9, the frame
//! size the client allows) and what it has not written yet. Response bodies
//! are dropped as they come, so receive windows are handed back at once
//! (when half is used), and a large body never waits on the client.
//!
//! The server's header compression is held to no dynamic table
//! (`SETTINGS_HEADER_TABLE_SIZE = 0`, see [`hpack`]). Server push is off.
//!
//! Errors: a connection error (a broken frame, a flow-control violation, a
//! header block HPACK cannot read) is returned by [`Connection::recv`]
//! after a GOAWAY with its code is queued; a stream error ends that stream
//! alone with [`Event::Malformed`] and an RST_STREAM. Nothing the peer
//! sends can make it panic or hold more than the bounds above.

use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use thiserror::Error;

pub mod hpack;

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

/// Error codes (RFC 9113 §7) this client sends or reads.
pub mod code {
    /// Graceful.
    pub const NO_ERROR: u32 = 0x0;
    /// The peer broke the protocol.
    pub const PROTOCOL_ERROR: u32 = 0x1;
    /// A window went wrong.
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    /// A frame of the wrong size.
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    /// The stream was not processed: it may go again.
    pub const REFUSED_STREAM: u32 = 0x7;
    /// The stream is no longer wanted.
    pub const CANCEL: u32 = 0x8;
    /// HPACK state is lost.
    pub const COMPRESSION_ERROR: u32 = 0x9;
}

/// The frame payload the client accepts (the protocol's default).
const MAX_FRAME: usize = 16_384;
/// The largest header block the client reads (HEADERS and CONTINUATIONs).
const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// The largest window the protocol allows.
const MAX_WINDOW: i64 = (1 << 31) - 1;
/// Every window's size at the start.
const DEFAULT_WINDOW: i64 = 65_535;
/// The connection's receive window: bodies are dropped, so it can be large.
const CONNECTION_WINDOW: i64 = 16 << 20;
/// The most streams that may open before the server's SETTINGS say how many.
const STREAMS_BEFORE_SETTINGS: u32 = 100;

/// Why the connection failed (a connection error, RFC 9113 §5.4.1), or why
/// one stream did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum H2Error {
    /// The server broke the protocol.
    #[error("HTTP/2 protocol error: {0}")]
    Protocol(&'static str),
    /// A frame of a size its type does not allow.
    #[error("HTTP/2 frame size error: {0}")]
    FrameSize(&'static str),
    /// The server sent past a window, or grew one past 2^31-1.
    #[error("HTTP/2 flow-control error: {0}")]
    FlowControl(&'static str),
    /// A header block that could not be read.
    #[error("HPACK error: {0}")]
    Compression(&'static str),
}

impl H2Error {
    /// The error code sent for it.
    pub fn code(self) -> u32 {
        match self {
            Self::Protocol(_) => code::PROTOCOL_ERROR,
            Self::FrameSize(_) => code::FRAME_SIZE_ERROR,
            Self::FlowControl(_) => code::FLOW_CONTROL_ERROR,
            Self::Compression(_) => code::COMPRESSION_ERROR,
        }
    }
}

/// How the client sets up a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The most streams open at once (the server's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` may allow fewer).
    pub max_streams: u32,
    /// Each stream's receive window (`SETTINGS_INITIAL_WINDOW_SIZE`).
    pub stream_window: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_streams: 100,
            stream_window: 1 << 20,
        }
    }
}

/// What happened on the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<T> {
    /// A response ended: its final status, and the frame payload bytes
    /// (header blocks and body) that came for it.
    Answered {
        /// The stream's token.
        token: T,
        /// The final status.
        status: u16,
        /// Payload bytes received on the stream.
        bytes_in: u64,
    },
    /// The server reset the stream (RST_STREAM with this code).
    Reset {
        /// The stream's token.
        token: T,
        /// The error code.
        code: u32,
    },
    /// The server did not process the stream (REFUSED_STREAM, or above the
    /// last stream of a GOAWAY): it may go again on another connection.
    Refused {
        /// The stream's token.
        token: T,
    },
    /// The stream broke the protocol and was reset by the client.
    Malformed {
        /// The stream's token.
        token: T,
        /// What was wrong.
        why: H2Error,
    },
    /// The connection ended while the stream was open ([`Connection::closed`]).
    Lost {
        /// The stream's token.
        token: T,
    },
    /// The server is going away: no stream above `last_stream` was
    /// processed, and no new stream may start here.
    GoAway {
        /// The last stream the server may have processed.
        last_stream: u32,
        /// The error code (0: a graceful shutdown).
        code: u32,
    },
}

/// One open stream.
struct Stream<T> {
    token: T,
    /// What the client may still send on it.
    send_window: i64,
    /// What the server may still send on it.
    recv_window: i64,
    /// The request body, while some of it is still to be sent.
    body: Option<Rc<[u8]>>,
    /// Body bytes sent.
    sent: usize,
    /// The final status, once its header block came.
    status: Option<u16>,
    bytes_in: u64,
}

/// The size of one open stream's entry with token `T` (without the map's
/// own overhead), for the callers' tests that pin it.
pub fn stream_size<T>() -> usize {
    size_of::<Stream<T>>()
}

/// A header block waiting for its CONTINUATION frames.
struct Block {
    stream: u32,
    end_stream: bool,
    bytes: Vec<u8>,
}

/// One HTTP/2 client connection, sans I/O.
pub struct Connection<T> {
    config: Config,
    /// By id, so in the order they started.
    streams: BTreeMap<u32, Stream<T>>,
    /// The id the next stream gets (odd, client-initiated).
    next_id: u32,
    peer_max_streams: u32,
    /// The send window new streams start with (the server's setting).
    peer_window: i64,
    peer_max_frame: usize,
    /// What the client may still send on the connection.
    send_window: i64,
    /// What the server may still send on the connection.
    recv_window: i64,
    got_settings: bool,
    /// The last stream of the GOAWAY the server sent.
    goaway: Option<u32>,
    failed: bool,
    out: Vec<u8>,
    /// How much of `out` was written.
    out_at: usize,
    /// A frame not yet whole.
    partial: Vec<u8>,
    block: Option<Block>,
    /// Streams with body bytes waiting for window, in the order they started.
    blocked: VecDeque<u32>,
    events: VecDeque<Event<T>>,
}

impl<T> std::fmt::Debug for Connection<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("streams", &self.streams.len())
            .field("next_id", &self.next_id)
            .field("goaway", &self.goaway)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// Appends a frame header.
fn frame_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = len as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl<T> Connection<T> {
    /// A new connection: its preface, SETTINGS and connection window are
    /// the first output.
    pub fn new(config: Config) -> Self {
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(PREFACE);
        let settings: [(u16, u32); 3] = [
            (0x1, 0), // HEADER_TABLE_SIZE: no dynamic table (see `hpack`)
            (0x2, 0), // ENABLE_PUSH
            (0x4, config.stream_window.min(MAX_WINDOW as u32)),
        ];
        frame_head(&mut out, settings.len() * 6, SETTINGS, 0, 0);
        for (id, v) in settings {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&v.to_be_bytes());
        }
        frame_head(&mut out, 4, WINDOW_UPDATE, 0, 0);
        out.extend_from_slice(&((CONNECTION_WINDOW - DEFAULT_WINDOW) as u32).to_be_bytes());
        Self {
            config,
            streams: BTreeMap::new(),
            next_id: 1,
            peer_max_streams: STREAMS_BEFORE_SETTINGS,
            peer_window: DEFAULT_WINDOW,
            peer_max_frame: MAX_FRAME,
            send_window: DEFAULT_WINDOW,
            recv_window: CONNECTION_WINDOW,
            got_settings: false,
            goaway: None,
            failed: false,
            out,
            out_at: 0,
            partial: Vec::new(),
            block: None,
            blocked: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The most streams open at once: ours, capped by the server's.
    pub fn stream_limit(&self) -> u32 {
        self.config.max_streams.min(self.peer_max_streams)
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// The stream open longest (the lowest id) and its token: with one
    /// timeout for every request, the first to time out.
    pub fn oldest(&self) -> Option<(u32, &T)> {
        self.streams
            .first_key_value()
            .map(|(id, s)| (*id, &s.token))
    }

    /// Whether the server sent GOAWAY (no new stream may start here).
    pub fn going_away(&self) -> bool {
        self.goaway.is_some()
    }

    /// Whether a new stream may start now.
    pub fn can_start(&self) -> bool {
        !self.failed
            && self.goaway.is_none()
            && self.next_id <= MAX_WINDOW as u32
            && self.streams.len() < self.stream_limit() as usize
    }

    /// Whether nothing more can happen here: the connection failed, or the
    /// server is going away (or the ids ran out) and no stream is open.
    pub fn is_done(&self) -> bool {
        self.failed
            || ((self.goaway.is_some() || self.next_id > MAX_WINDOW as u32)
                && self.streams.is_empty())
    }

    /// Starts a request: `head` is its header block ([`hpack::encode_request`]),
    /// `body` its body (sent as windows allow). Gives the token back when no
    /// stream may start ([`Connection::can_start`]).
    pub fn start(&mut self, head: &[u8], body: Option<Rc<[u8]>>, token: T) -> Result<u32, T> {
        if !self.can_start() {
            return Err(token);
        }
        let id = self.next_id;
        self.next_id += 2;
        let body = body.filter(|b| !b.is_empty());
        self.write_headers(id, head, body.is_none());
        let has_body = body.is_some();
        self.streams.insert(
            id,
            Stream {
                token,
                send_window: self.peer_window,
                recv_window: i64::from(self.config.stream_window),
                body,
                sent: 0,
                status: None,
                bytes_in: 0,
            },
        );
        if has_body {
            self.blocked.push_back(id);
            self.send_data();
        }
        Ok(id)
    }

    /// Gives up stream `id` (its timeout came): an RST_STREAM (CANCEL)
    /// goes out, and its token comes back if it was still open.
    pub fn cancel(&mut self, id: u32) -> Option<T> {
        let s = self.streams.remove(&id)?;
        self.rst(id, code::CANCEL);
        Some(s.token)
    }

    /// The connection ended (read end of file, or a socket error): every
    /// open stream is lost ([`Event::Lost`], in the order they started).
    pub fn closed(&mut self) {
        self.failed = true;
        for (_, s) in std::mem::take(&mut self.streams) {
            self.events.push_back(Event::Lost { token: s.token });
        }
        self.blocked.clear();
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event<T>> {
        self.events.pop_front()
    }

    /// Bytes to write to the server.
    pub fn output(&self) -> &[u8] {
        &self.out[self.out_at..]
    }

    /// `n` bytes of [`Connection::output`] were written.
    pub fn written(&mut self, n: usize) {
        self.out_at = (self.out_at + n).min(self.out.len());
        if self.out_at == self.out.len() {
            self.out.clear();
            self.out_at = 0;
            if self.out.capacity() > 64 * 1024 {
                self.out = Vec::new();
            }
        }
    }

    /// Reads bytes from the server. A connection error queues a GOAWAY
    /// with its code (still to be written) and is returned; the caller then
    /// ends the connection ([`Connection::closed`]).
    pub fn recv(&mut self, data: &[u8]) -> Result<(), H2Error> {
        if self.failed {
            return Ok(());
        }
        let result = if !self.got_settings && self.partial.is_empty() && data.starts_with(b"HTTP/")
        {
            // An HTTP/1.x server answering the preface (h2c to a server without it).
            Err(H2Error::Protocol(
                "the server answered in HTTP/1.x: it does not speak HTTP/2 with prior knowledge (h2c)",
            ))
        } else if self.partial.is_empty() {
            self.frames(data).map(|used| {
                self.partial.extend_from_slice(&data[used..]);
            })
        } else {
            let mut buf = std::mem::take(&mut self.partial);
            buf.extend_from_slice(data);
            let r = self.frames(&buf);
            if let Ok(used) = r {
                buf.drain(..used);
                self.partial = buf;
            }
            r.map(|_| ())
        };
        if self.partial.is_empty() && self.partial.capacity() > 4096 {
            self.partial = Vec::new();
        }
        if let Err(e) = result {
            self.failed = true;
            self.partial = Vec::new();
            frame_head(&mut self.out, 8, GOAWAY, 0, 0);
            self.out.extend_from_slice(&0u32.to_be_bytes());
            self.out.extend_from_slice(&e.code().to_be_bytes());
        }
        result
    }

    /// Runs the whole frames at the start of `buf`; returns the bytes used.
    fn frames(&mut self, buf: &[u8]) -> Result<usize, H2Error> {
        let mut at = 0;
        while buf.len() - at >= 9 {
            let h = &buf[at..at + 9];
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            if len > MAX_FRAME {
                return Err(H2Error::FrameSize(
                    "a frame larger than SETTINGS_MAX_FRAME_SIZE",
                ));
            }
            if buf.len() - at - 9 < len {
                break;
            }
            let stream = be32(&h[5..9]) & 0x7fff_ffff;
            self.frame(h[3], h[4], stream, &buf[at + 9..at + 9 + len])?;
            at += 9 + len;
            if self.failed {
                break;
            }
        }
        Ok(at)
    }

    /// One whole frame.
    fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<(), H2Error> {
        if self.block.is_some() && kind != CONTINUATION {
            return Err(H2Error::Protocol(
                "a frame between HEADERS and its CONTINUATION",
            ));
        }
        let first_settings = kind == SETTINGS && flags & ACK == 0;
        if !(self.got_settings || first_settings) {
            return Err(H2Error::Protocol(
                "the server's first frame was not SETTINGS",
            ));
        }
        match kind {
            DATA => self.data(flags, stream, payload),
            HEADERS => self.headers(flags, stream, payload),
            PRIORITY => Ok(()),
            RST_STREAM => self.rst_stream(stream, payload),
            SETTINGS => self.settings(flags, stream, payload),
            PUSH_PROMISE => Err(H2Error::Protocol("PUSH_PROMISE with push disabled")),
            PING => self.ping(flags, stream, payload),
            GOAWAY => self.goaway(stream, payload),
            WINDOW_UPDATE => self.window_update(stream, payload),
            CONTINUATION => self.continuation(flags, stream, payload),
            // Unknown frame types are ignored (RFC 9113 §4.1).
            _ => Ok(()),
        }
    }

    /// Whether `id` names a stream the client never opened.
    fn idle(&self, id: u32) -> bool {
        id % 2 == 0 || id >= self.next_id
    }

    /// A padded payload without its padding.
    fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], H2Error> {
        if flags & PADDED == 0 {
            return Ok(payload);
        }
        let pad = usize::from(
            *payload
                .first()
                .ok_or(H2Error::FrameSize("padded frame without length"))?,
        );
        if pad >= payload.len() {
            return Err(H2Error::Protocol("padding longer than the frame"));
        }
        Ok(&payload[1..payload.len() - pad])
    }

    fn data(&mut self, flags: u8, id: u32, payload: &[u8]) -> Result<(), H2Error> {
        if id == 0 || self.idle(id) {
            return Err(H2Error::Protocol(
                "DATA on a stream the client did not open",
            ));
        }
        // Padding counts against the windows too.
        let len = payload.len() as i64;
        Self::unpad(flags, payload)?;
        self.recv_window -= len;
        if self.recv_window < 0 {
            return Err(H2Error::FlowControl("DATA past the connection window"));
        }
        if self.recv_window < CONNECTION_WINDOW / 2 {
            self.window_update_out(0, CONNECTION_WINDOW - self.recv_window);
            self.recv_window = CONNECTION_WINDOW;
        }
        let window = i64::from(self.config.stream_window);
        let Some(s) = self.streams.get_mut(&id) else {
            // A stream the client ended already (canceled or reset).
            return Ok(());
        };
        s.bytes_in += len as u64;
        s.recv_window -= len;
        if s.status.is_none() {
            self.stream_error(id, H2Error::Protocol("DATA before the response's HEADERS"));
        } else if s.recv_window < 0 {
            self.stream_error(id, H2Error::FlowControl("DATA past the stream window"));
        } else if flags & END_STREAM != 0 {
            self.answered(id);
        } else if s.recv_window < window / 2 {
            let inc = window - s.recv_window;
            s.recv_window = window;
            self.window_update_out(id, inc);
        }
        Ok(())
    }

    fn headers(&mut self, flags: u8, id: u32, payload: &[u8]) -> Result<(), H2Error> {
        if id == 0 || self.idle(id) {
            return Err(H2Error::Protocol(
                "HEADERS on a stream the client did not open",
            ));
        }
        let mut fragment = Self::unpad(flags, payload)?;
        if flags & PRIORITY_FLAG != 0 {
            fragment = fragment
                .get(5..)
                .ok_or(H2Error::FrameSize("HEADERS too short for its priority"))?;
        }
        let end_stream = flags & END_STREAM != 0;
        if flags & END_HEADERS != 0 {
            return self.header_block(id, end_stream, fragment, payload.len());
        }
        self.block = Some(Block {
            stream: id,
            end_stream,
            bytes: fragment.to_vec(),
        });
        Ok(())
    }

    fn continuation(&mut self, flags: u8, id: u32, payload: &[u8]) -> Result<(), H2Error> {
        let Some(mut block) = self.block.take() else {
            return Err(H2Error::Protocol("CONTINUATION without HEADERS"));
        };
        if block.stream != id {
            return Err(H2Error::Protocol("CONTINUATION on another stream"));
        }
        if block.bytes.len() + payload.len() > MAX_HEADER_BLOCK {
            return Err(H2Error::Protocol("a header block over 64 KiB"));
        }
        block.bytes.extend_from_slice(payload);
        if flags & END_HEADERS == 0 {
            self.block = Some(block);
            return Ok(());
        }
        let len = block.bytes.len();
        self.header_block(id, block.end_stream, &block.bytes, len)
    }

    /// A whole header block on stream `id` (`wire`: its bytes on the wire).
    fn header_block(
        &mut self,
        id: u32,
        end_stream: bool,
        block: &[u8],
        wire: usize,
    ) -> Result<(), H2Error> {
        // Decoded even for a stream already ended: HPACK errors end the connection.
        let status = hpack::decode_status(block)?;
        let Some(s) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        s.bytes_in += wire as u64;
        let bad = match (status, s.status) {
            // Informational: the final response is still to come.
            (Some(100..=199), None) if !end_stream => None,
            (Some(100..=199), None) => Some("an informational response ended the stream"),
            (Some(st), None) => {
                s.status = Some(st);
                None
            }
            (Some(_), Some(_)) => Some("a second response on one stream"),
            (None, Some(_)) if end_stream => None,
            (None, _) => Some("a header block without :status"),
        };
        if let Some(why) = bad {
            self.stream_error(id, H2Error::Protocol(why));
        } else if end_stream && self.streams.get(&id).is_some_and(|s| s.status.is_some()) {
            self.answered(id);
        }
        Ok(())
    }

    fn rst_stream(&mut self, id: u32, payload: &[u8]) -> Result<(), H2Error> {
        if payload.len() != 4 {
            return Err(H2Error::FrameSize("RST_STREAM not 4 bytes"));
        }
        if id == 0 || self.idle(id) {
            return Err(H2Error::Protocol(
                "RST_STREAM on a stream the client did not open",
            ));
        }
        let code = be32(payload);
        if let Some(s) = self.streams.remove(&id) {
            self.events.push_back(if code == code::REFUSED_STREAM {
                Event::Refused { token: s.token }
            } else {
                Event::Reset {
                    token: s.token,
                    code,
                }
            });
        }
        Ok(())
    }

    fn settings(&mut self, flags: u8, id: u32, payload: &[u8]) -> Result<(), H2Error> {
        if id != 0 {
            return Err(H2Error::Protocol("SETTINGS on a stream"));
        }
        if flags & ACK != 0 {
            return if payload.is_empty() {
                Ok(())
            } else {
                Err(H2Error::FrameSize("SETTINGS ack with a payload"))
            };
        }
        if payload.len() % 6 != 0 {
            return Err(H2Error::FrameSize("SETTINGS not a multiple of 6 bytes"));
        }
        for s in payload.chunks_exact(6) {
            let v = be32(&s[2..]);
            match u16::from_be_bytes([s[0], s[1]]) {
                0x2 if v > 1 => return Err(H2Error::Protocol("SETTINGS_ENABLE_PUSH above 1")),
                0x3 => self.peer_max_streams = v,
                0x4 => {
                    let v = i64::from(v);
                    if v > MAX_WINDOW {
                        return Err(H2Error::FlowControl(
                            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                        ));
                    }
                    let delta = v - self.peer_window;
                    self.peer_window = v;
                    for s in self.streams.values_mut() {
                        s.send_window += delta;
                        if s.send_window > MAX_WINDOW {
                            return Err(H2Error::FlowControl("a stream window above 2^31-1"));
                        }
                    }
                }
                0x5 if !(16_384..=16_777_215).contains(&v) => {
                    return Err(H2Error::Protocol("SETTINGS_MAX_FRAME_SIZE out of range"));
                }
                0x5 => self.peer_max_frame = v as usize,
                _ => {}
            }
        }
        self.got_settings = true;
        frame_head(&mut self.out, 0, SETTINGS, ACK, 0);
        self.send_data();
        Ok(())
    }

    fn ping(&mut self, flags: u8, id: u32, payload: &[u8]) -> Result<(), H2Error> {
        if payload.len() != 8 {
            return Err(H2Error::FrameSize("PING not 8 bytes"));
        }
        if id != 0 {
            return Err(H2Error::Protocol("PING on a stream"));
        }
        if flags & ACK == 0 {
            frame_head(&mut self.out, 8, PING, ACK, 0);
            self.out.extend_from_slice(payload);
        }
        Ok(())
    }

    fn goaway(&mut self, id: u32, payload: &[u8]) -> Result<(), H2Error> {
        if id != 0 {
            return Err(H2Error::Protocol("GOAWAY on a stream"));
        }
        if payload.len() < 8 {
            return Err(H2Error::FrameSize("GOAWAY shorter than 8 bytes"));
        }
        let last = be32(payload) & 0x7fff_ffff;
        let code = be32(&payload[4..]);
        let last = self.goaway.map_or(last, |l| l.min(last));
        self.goaway = Some(last);
        for (_, s) in self.streams.split_off(&(last + 1)) {
            self.events.push_back(Event::Refused { token: s.token });
        }
        self.blocked.retain(|id| *id <= last);
        self.events.push_back(Event::GoAway {
            last_stream: last,
            code,
        });
        Ok(())
    }

    fn window_update(&mut self, id: u32, payload: &[u8]) -> Result<(), H2Error> {
        if payload.len() != 4 {
            return Err(H2Error::FrameSize("WINDOW_UPDATE not 4 bytes"));
        }
        let inc = i64::from(be32(payload) & 0x7fff_ffff);
        if id == 0 {
            if inc == 0 {
                return Err(H2Error::Protocol("a connection WINDOW_UPDATE of 0"));
            }
            self.send_window += inc;
            if self.send_window > MAX_WINDOW {
                return Err(H2Error::FlowControl("the connection window above 2^31-1"));
            }
        } else if self.idle(id) {
            return Err(H2Error::Protocol(
                "WINDOW_UPDATE on a stream the client did not open",
            ));
        } else if let Some(s) = self.streams.get_mut(&id) {
            s.send_window += inc;
            if inc == 0 {
                self.stream_error(id, H2Error::Protocol("a stream WINDOW_UPDATE of 0"));
            } else if s.send_window > MAX_WINDOW {
                self.stream_error(id, H2Error::FlowControl("a stream window above 2^31-1"));
            }
        }
        self.send_data();
        Ok(())
    }

    /// Stream `id`'s response ended.
    fn answered(&mut self, id: u32) {
        if let Some(s) = self.streams.remove(&id) {
            self.blocked.retain(|b| *b != id);
            self.events.push_back(Event::Answered {
                token: s.token,
                status: s.status.unwrap_or(0),
                bytes_in: s.bytes_in,
            });
        }
    }

    /// Ends stream `id` for breaking the protocol.
    fn stream_error(&mut self, id: u32, why: H2Error) {
        if let Some(s) = self.streams.remove(&id) {
            self.blocked.retain(|b| *b != id);
            self.rst(id, why.code());
            self.events.push_back(Event::Malformed {
                token: s.token,
                why,
            });
        }
    }

    fn rst(&mut self, id: u32, code: u32) {
        self.blocked.retain(|b| *b != id);
        frame_head(&mut self.out, 4, RST_STREAM, 0, id);
        self.out.extend_from_slice(&code.to_be_bytes());
    }

    fn window_update_out(&mut self, id: u32, inc: i64) {
        frame_head(&mut self.out, 4, WINDOW_UPDATE, 0, id);
        self.out.extend_from_slice(&(inc as u32).to_be_bytes());
    }

    /// A header block as HEADERS and, past the server's frame size, CONTINUATIONs.
    fn write_headers(&mut self, id: u32, head: &[u8], end_stream: bool) {
        let max = self.peer_max_frame;
        let mut chunks = head.chunks(max).peekable();
        let mut kind = HEADERS;
        let mut flags = if end_stream { END_STREAM } else { 0 };
        if chunks.peek().is_none() {
            frame_head(&mut self.out, 0, HEADERS, flags | END_HEADERS, id);
        }
        while let Some(chunk) = chunks.next() {
            if chunks.peek().is_none() {
                flags |= END_HEADERS;
            }
            frame_head(&mut self.out, chunk.len(), kind, flags, id);
            self.out.extend_from_slice(chunk);
            kind = CONTINUATION;
            flags = 0;
        }
    }

    /// Sends the bodies waiting, as far as the windows allow, in the order
    /// their streams started.
    fn send_data(&mut self) {
        while let Some(&id) = self.blocked.front() {
            if self.send_window <= 0 {
                return;
            }
            let Some(s) = self.streams.get_mut(&id) else {
                self.blocked.pop_front();
                continue;
            };
            let Some(body) = s.body.clone() else {
                self.blocked.pop_front();
                continue;
            };
            while s.sent < body.len() {
                let room = self
                    .send_window
                    .min(s.send_window)
                    .min(self.peer_max_frame as i64);
                if room <= 0 {
                    break;
                }
                let n = (body.len() - s.sent).min(room as usize);
                let last = s.sent + n == body.len();
                frame_head(
                    &mut self.out,
                    n,
                    DATA,
                    if last { END_STREAM } else { 0 },
                    id,
                );
                self.out.extend_from_slice(&body[s.sent..s.sent + n]);
                s.sent += n;
                s.send_window -= n as i64;
                self.send_window -= n as i64;
            }
            if s.sent < body.len() {
                // This stream's window is shut: the next may have room.
                if s.send_window <= 0 && self.send_window > 0 {
                    self.blocked.rotate_left(1);
                    if self
                        .blocked
                        .iter()
                        .all(|b| self.streams.get(b).is_none_or(|s| s.send_window <= 0))
                    {
                        return;
                    }
                    continue;
                }
                return;
            }
            s.body = None;
            self.blocked.pop_front();
        }
    }
}

#[cfg(test)]
mod tests;
