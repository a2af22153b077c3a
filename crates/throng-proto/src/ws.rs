//! RFC 6455 WebSocket: the opening handshake and the frame codec, for both
//! roles. The server role expects masked frames and sends unmasked ones; the
//! client role the reverse.
//!
//! Frames are encoded once into [`Bytes`] so a server can write the same
//! frame to many subscribers, and decoded in place from the caller's buffer:
//! a [`Decoder`] holds no buffer of its own unless a fragmented message is
//! being assembled.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use thiserror::Error;

use crate::http::{Request, Response, header_has_token, write_response};

/// The GUID of RFC 6455 section 1.3, appended to the key before hashing.
pub const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Which end of the connection this codec serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Receives masked frames, sends unmasked ones.
    Server,
    /// Receives unmasked frames, sends masked ones.
    Client,
}

/// Frame opcodes (RFC 6455 section 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum OpCode {
    /// Continues a fragmented message.
    Continuation = 0x0,
    /// UTF-8 text.
    Text = 0x1,
    /// Binary data.
    Binary = 0x2,
    /// Close (control).
    Close = 0x8,
    /// Ping (control).
    Ping = 0x9,
    /// Pong (control).
    Pong = 0xA,
}

/// Close codes throng sends (RFC 6455 section 7.4.1).
pub mod close_code {
    /// Normal closure.
    pub const NORMAL: u16 = 1000;
    /// The server is shutting down.
    pub const GOING_AWAY: u16 = 1001;
    /// The peer broke the protocol.
    pub const PROTOCOL: u16 = 1002;
    /// A text frame or close reason was not valid UTF-8.
    pub const INVALID_DATA: u16 = 1007;
    /// Policy violation: throng uses it for slow consumers (queue over its limit,
    /// or no write progress within the write timeout) and idle timeouts.
    pub const POLICY: u16 = 1008;
    /// A message larger than the limit.
    pub const TOO_BIG: u16 = 1009;
    /// An unexpected condition in the server.
    pub const INTERNAL: u16 = 1011;
    /// The service is restarting (a takeover): reconnect.
    pub const SERVICE_RESTART: u16 = 1012;
}

/// Why an opening handshake was refused. [`HandshakeError::status`] gives the
/// HTTP status a server answers with.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The method is not GET.
    #[error("WebSocket upgrade must use GET, not {0}")]
    NotGet(String),
    /// HTTP/1.0 or older.
    #[error("WebSocket upgrade needs HTTP/1.1")]
    OldHttp,
    /// No `Upgrade: websocket`.
    #[error("missing 'Upgrade: websocket' header")]
    NoUpgrade,
    /// No `Connection: Upgrade`.
    #[error("missing 'Connection: Upgrade' header")]
    NoConnectionUpgrade,
    /// `Sec-WebSocket-Key` missing, or not 16 bytes in base64.
    #[error("missing or invalid Sec-WebSocket-Key")]
    BadKey,
    /// `Sec-WebSocket-Version` is not 13: answered with 426 and `Sec-WebSocket-Version: 13`.
    #[error("unsupported Sec-WebSocket-Version (only 13 is supported)")]
    UnsupportedVersion,
    /// Client side: the server did not answer 101.
    #[error("server answered {0} instead of 101 Switching Protocols")]
    NotSwitching(u16),
    /// Client side: `Sec-WebSocket-Accept` missing or wrong.
    #[error("server's Sec-WebSocket-Accept does not match the key")]
    BadAccept,
}

impl HandshakeError {
    /// The HTTP status a server answers this refusal with (400 or 426).
    pub fn status(&self) -> u16 {
        match self {
            Self::UnsupportedVersion => 426,
            _ => 400,
        }
    }

    /// A short stable label for metrics (`bad_key`, `version`, ...).
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotGet(_) => "not_get",
            Self::OldHttp => "old_http",
            Self::NoUpgrade => "no_upgrade",
            Self::NoConnectionUpgrade => "no_connection_upgrade",
            Self::BadKey => "bad_key",
            Self::UnsupportedVersion => "version",
            Self::NotSwitching(_) => "not_switching",
            Self::BadAccept => "bad_accept",
        }
    }
}

/// `base64(sha1(key + GUID))`: the `Sec-WebSocket-Accept` value for `key`.
pub fn accept_key(key: &[u8]) -> String {
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key);
    sha.update(GUID.as_bytes());
    BASE64.encode(sha.digest().bytes())
}

/// Checks a request as a server would; on success returns the
/// `Sec-WebSocket-Accept` value to answer with. The caller checks the path.
///
/// Checks run in this order, so the first failing one is reported: method,
/// HTTP version, `Upgrade`, `Connection`, `Sec-WebSocket-Version` (426 wins
/// over a bad key: a client speaking another version should learn which one
/// to use), `Sec-WebSocket-Key`.
pub fn server_accept(req: &Request) -> Result<String, HandshakeError> {
    if req.method != "GET" {
        return Err(HandshakeError::NotGet(req.method.clone()));
    }
    if req.minor_version < 1 {
        return Err(HandshakeError::OldHttp);
    }
    if !header_has_token(&req.headers, "Upgrade", "websocket") {
        return Err(HandshakeError::NoUpgrade);
    }
    if !header_has_token(&req.headers, "Connection", "upgrade") {
        return Err(HandshakeError::NoConnectionUpgrade);
    }
    match req.header("Sec-WebSocket-Version") {
        Some(v) if v.trim_ascii() == b"13" => {}
        _ => return Err(HandshakeError::UnsupportedVersion),
    }
    let key = req
        .header("Sec-WebSocket-Key")
        .ok_or(HandshakeError::BadKey)?
        .trim_ascii();
    // A 16-byte nonce is exactly 24 base64 characters with padding; checking
    // the length first keeps a huge header from being decoded at all.
    if key.len() != 24 {
        return Err(HandshakeError::BadKey);
    }
    match BASE64.decode(key) {
        Ok(nonce) if nonce.len() == 16 => Ok(accept_key(key)),
        _ => Err(HandshakeError::BadKey),
    }
}

/// Appends the `101 Switching Protocols` response for `accept`.
pub fn write_accept(out: &mut Vec<u8>, accept: &str) {
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    );
    out.extend_from_slice(accept.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
}

/// Appends the refusal for `err`: its status, the reason as a text body
/// (the error's message and a newline), `Connection: close`, and
/// `Sec-WebSocket-Version: 13` on 426. The server closes after writing it.
pub fn write_refusal(out: &mut Vec<u8>, err: &HandshakeError) {
    let status = err.status();
    let body = format!("{err}\n");
    let mut headers: Vec<(&str, &str)> =
        vec![("Content-Type", "text/plain"), ("Connection", "close")];
    if status == 426 {
        headers.push(("Sec-WebSocket-Version", "13"));
    }
    write_response(out, status, &headers, body.as_bytes());
}

/// The `Sec-WebSocket-Key` for a 16-byte nonce (the caller supplies randomness).
pub fn client_key(nonce: [u8; 16]) -> String {
    BASE64.encode(nonce)
}

/// Appends a client's upgrade request for `target` (`/chan`) on `host` (`h:port`).
pub fn write_upgrade_request(out: &mut Vec<u8>, host: &str, target: &str, key: &str) {
    out.extend_from_slice(b"GET ");
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\r\nSec-WebSocket-Version: 13\r\n\r\n");
}

/// Checks a server's answer to the upgrade request made with `key`.
pub fn client_verify(resp: &Response, key: &str) -> Result<(), HandshakeError> {
    if resp.status != 101 {
        return Err(HandshakeError::NotSwitching(resp.status));
    }
    if !header_has_token(&resp.headers, "Upgrade", "websocket") {
        return Err(HandshakeError::NoUpgrade);
    }
    if !header_has_token(&resp.headers, "Connection", "upgrade") {
        return Err(HandshakeError::NoConnectionUpgrade);
    }
    match resp.header("Sec-WebSocket-Accept") {
        Some(v) if v.trim_ascii() == accept_key(key.as_bytes()).as_bytes() => Ok(()),
        _ => Err(HandshakeError::BadAccept),
    }
}

/// Length of a frame header for a payload of `len` bytes (2, 4 or 10, plus 4 when masked).
pub fn header_len(len: usize, masked: bool) -> usize {
    let base = match len {
        0..=125 => 2,
        126..=0xFFFF => 4,
        _ => 10,
    };
    if masked { base + 4 } else { base }
}

/// Appends one frame to `out`: `fin` set as given, payload masked with `mask`
/// when given (client role), every length encoding (7-bit, 16-bit, 64-bit).
pub fn encode_into(
    out: &mut Vec<u8>,
    fin: bool,
    opcode: OpCode,
    payload: &[u8],
    mask: Option<[u8; 4]>,
) {
    let len = payload.len();
    out.reserve(header_len(len, mask.is_some()) + len);
    out.push(if fin { 0x80 } else { 0 } | opcode as u8);
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    match len {
        0..=125 => out.push(mask_bit | len as u8),
        126..=0xFFFF => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    let start = match mask {
        Some(m) => {
            out.extend_from_slice(&m);
            out.len()
        }
        None => out.len(),
    };
    out.extend_from_slice(payload);
    if let Some(m) = mask {
        apply_mask(&mut out[start..], m);
    }
}

/// One complete unmasked frame (server role), encoded once for any number of writes.
pub fn server_frame(opcode: OpCode, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(header_len(payload.len(), false) + payload.len());
    encode_into(&mut out, true, opcode, payload, None);
    Bytes::from(out)
}

/// The longest close reason that fits a control frame beside the 2-byte code.
pub const MAX_CLOSE_REASON: usize = 123;

/// Appends a close frame with `code` and `reason` (reason cut to fit 123 bytes
/// on a char boundary); masked when `mask` is given.
pub fn encode_close(out: &mut Vec<u8>, code: u16, reason: &str, mask: Option<[u8; 4]>) {
    let mut cut = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut payload = [0u8; 2 + MAX_CLOSE_REASON];
    payload[..2].copy_from_slice(&code.to_be_bytes());
    payload[2..2 + cut].copy_from_slice(&reason.as_bytes()[..cut]);
    encode_into(out, true, OpCode::Close, &payload[..2 + cut], mask);
}

/// XORs `buf` with the 4-byte `mask`, starting at mask byte 0. Applying it
/// twice restores the input. Works 8 bytes at a time: unmasking is the one
/// per-byte pass over every client payload.
pub fn apply_mask(buf: &mut [u8], mask: [u8; 4]) {
    let wide = u64::from_ne_bytes([
        mask[0], mask[1], mask[2], mask[3], mask[0], mask[1], mask[2], mask[3],
    ]);
    let mut chunks = buf.chunks_exact_mut(8);
    for chunk in &mut chunks {
        // Both arrays are 8 bytes: chunks_exact_mut(8) yields only full chunks.
        let word = u64::from_ne_bytes([
            chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7],
        ]);
        chunk.copy_from_slice(&(word ^ wide).to_ne_bytes());
    }
    // Each chunk is a multiple of 4 long, so the tail starts at mask byte 0.
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

/// Whether a peer may send `code` in a close frame.
///
/// Valid: 1000–1003, 1007–1014 (1012 service restart, 1013 try again later
/// and 1014 bad gateway are registered with IANA and sent by real servers;
/// throng itself may close slow consumers with 1013), and 3000–4999
/// (libraries and applications). Invalid: below 1000, 1004 (reserved),
/// 1005/1006/1015 (must never be sent on the wire), 1016–2999 (reserved for
/// future protocol use), and 5000 and above.
pub fn close_code_valid(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// A frame or complete message decoded by [`Decoder::decode`]. Payloads borrow
/// from the caller's buffer (unmasked in place) or from the decoder's
/// assembly buffer for a message that arrived fragmented.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A complete text message, already checked to be UTF-8.
    Text(&'a [u8]),
    /// A complete binary message.
    Binary(&'a [u8]),
    /// A ping with its payload (answer with a pong carrying the same payload).
    Ping(&'a [u8]),
    /// A pong.
    Pong(&'a [u8]),
    /// A close; `code` is `None` for an empty close payload.
    Close {
        /// The peer's close code, already checked to be one a peer may send
        /// ([`close_code_valid`]).
        code: Option<u16>,
        /// The peer's reason, checked UTF-8.
        reason: &'a str,
    },
}

/// What one call to [`Decoder::decode`] consumed and produced.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// Bytes consumed from the front of the buffer.
    pub consumed: usize,
    /// The frame, or `None` when the consumed frame was a non-final fragment
    /// of a message still being assembled.
    pub frame: Option<Frame<'a>>,
}

/// A peer broke RFC 6455; [`ProtocolError::close_code`] is the code to close with.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A client frame without a mask (server role).
    #[error("client frame is not masked")]
    Unmasked,
    /// A server frame with a mask (client role).
    #[error("server frame is masked")]
    Masked,
    /// RSV1-3 set without a negotiated extension.
    #[error("reserved bits set")]
    ReservedBits,
    /// An opcode RFC 6455 does not define.
    #[error("unknown opcode {0:#x}")]
    UnknownOpcode(u8),
    /// A control frame with more than 125 bytes of payload.
    #[error("control frame longer than 125 bytes")]
    ControlTooLong,
    /// A control frame without FIN.
    #[error("fragmented control frame")]
    ControlFragmented,
    /// A continuation frame with no message in progress.
    #[error("continuation frame without a message to continue")]
    UnexpectedContinuation,
    /// A new data frame while a fragmented message is still in progress.
    #[error("new message before the fragmented one finished")]
    ExpectedContinuation,
    /// Invalid UTF-8 in a text message or close reason.
    #[error("invalid UTF-8 in text message or close reason")]
    InvalidUtf8,
    /// A message (or the frames of one) larger than the limit.
    #[error("message larger than {limit} bytes")]
    TooBig {
        /// The limit given to [`Decoder::new`].
        limit: usize,
    },
    /// A close payload of 1 byte, or a close code a peer may not send.
    #[error("invalid close frame payload")]
    BadClose,
    /// A 64-bit payload length with its most significant bit set (RFC 6455
    /// section 5.2). Lengths in a longer encoding than needed are accepted.
    #[error("invalid frame length")]
    BadLength,
    /// A compressed message (permessage-deflate) that does not inflate.
    #[error("compressed message is not valid deflate data")]
    BadDeflate,
}

impl ProtocolError {
    /// The close code to send: 1002 protocol, 1007 invalid data, 1009 too big.
    pub fn close_code(&self) -> u16 {
        match self {
            Self::InvalidUtf8 | Self::BadDeflate => close_code::INVALID_DATA,
            Self::TooBig { .. } => close_code::TOO_BIG,
            _ => close_code::PROTOCOL,
        }
    }

    /// A short stable label for metrics (`unmasked`, `utf8`, `too_big`, ...).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unmasked => "unmasked",
            Self::Masked => "masked",
            Self::ReservedBits => "reserved_bits",
            Self::UnknownOpcode(_) => "unknown_opcode",
            Self::ControlTooLong => "control_too_long",
            Self::ControlFragmented => "control_fragmented",
            Self::UnexpectedContinuation => "unexpected_continuation",
            Self::ExpectedContinuation => "expected_continuation",
            Self::InvalidUtf8 => "utf8",
            Self::TooBig { .. } => "too_big",
            Self::BadClose => "bad_close",
            Self::BadLength => "bad_length",
            Self::BadDeflate => "bad_deflate",
        }
    }
}

/// Incremental frame decoder. Idle, it is a few words with no heap
/// allocation; it allocates only to assemble a fragmented message (never
/// more than the message limit), and frees that when the message completes.
///
/// A read loop that calls [`Decoder::decode`] until it returns `Ok(None)`
/// leaves the decoder with no heap memory unless a message is still
/// arriving: the buffer of a just-completed fragmented message is freed by
/// that last call.
///
/// Every [`ProtocolError`] is fatal: close the connection with its
/// [`close_code`](ProtocolError::close_code) and drop the decoder.
///
/// A server's read loop over what one read returned:
///
/// ```
/// use throng_proto::ws::{Decoder, Frame, OpCode, Role, encode_into};
///
/// // What a client sent: a masked text frame and the start of another.
/// let mut read = Vec::new();
/// encode_into(&mut read, true, OpCode::Text, b"hi", Some([1, 2, 3, 4]));
/// read.extend_from_slice(&[0x81, 0x85]);
///
/// let mut dec = Decoder::new(Role::Server, 64 * 1024);
/// let mut at = 0;
/// while let Some(d) = dec.decode(&mut read[at..])? {
///     at += d.consumed;
///     if let Some(Frame::Text(text)) = d.frame {
///         assert_eq!(text, b"hi");
///     }
/// }
/// // Keep the incomplete frame for the next read.
/// assert_eq!(&read[at..], &[0x81, 0x85]);
/// # Ok::<(), throng_proto::ws::ProtocolError>(())
/// ```
#[derive(Debug)]
pub struct Decoder {
    /// The fragmented message being assembled, or (with `done` set) the one
    /// just completed, whose bytes the last returned [`Frame`] borrowed. A
    /// completed one is dropped at the start of the next [`Decoder::decode`]
    /// call or by [`Decoder::release`]. Boxed so an idle decoder stays small.
    assembly: Option<Box<Assembly>>,
    /// Largest message, in payload bytes summed over its fragments (and,
    /// for a compressed one, both before and after inflating).
    max_message: usize,
    role: Role,
    /// permessage-deflate was negotiated: RSV1 on a message's first frame
    /// says it is compressed ([`crate::deflate`]). In what was padding.
    deflate: bool,
}

/// A message arriving in fragments.
#[derive(Debug)]
struct Assembly {
    /// Text (checked UTF-8) or binary.
    text: bool,
    /// The final fragment arrived; `buf` is only kept for the returned borrow.
    done: bool,
    /// Compressed (RSV1): `buf` holds deflated bytes, inflated and checked
    /// when the last fragment arrives.
    compressed: bool,
    /// Invariant: `buf[..checked]` is valid UTF-8 (text only). Bytes after it
    /// are at most an incomplete trailing sequence (fewer than 4 bytes), so an
    /// invalid message is refused at the fragment that breaks it.
    checked: usize,
    buf: Vec<u8>,
}

/// What [`Decoder::step`] found: where the frame ends and what to hand out.
struct Step {
    consumed: usize,
    payload_start: usize,
    out: Out,
}

/// The kind of [`Frame`] a [`Step`] yields; payloads are `buf[payload_start..consumed]`.
enum Out {
    /// A non-final fragment, now in the assembly.
    Fragment,
    Ping,
    Pong,
    Text,
    Binary,
    Close(Option<u16>),
    /// The assembly completed; its buffer is the message.
    Assembled,
}

/// A parsed frame header.
struct Head {
    fin: bool,
    opcode: OpCode,
    mask: Option<[u8; 4]>,
    /// Header bytes, including the mask.
    header_len: usize,
    /// Payload bytes; within the message limit for data frames.
    payload_len: usize,
    /// RSV1 on a message's first frame, with permessage-deflate negotiated.
    compressed: bool,
}

impl Decoder {
    /// A decoder for `role` that refuses messages over `max_message` bytes.
    pub fn new(role: Role, max_message: usize) -> Self {
        Self {
            assembly: None,
            max_message,
            role,
            deflate: false,
        }
    }

    /// Accepts compressed messages (RSV1), as permessage-deflate with
    /// `client_no_context_takeover` sends them: each inflated on its own,
    /// to at most the message limit ([`ProtocolError::TooBig`] beyond).
    pub fn set_deflate(&mut self, on: bool) {
        self.deflate = on;
    }

    /// Whether permessage-deflate was negotiated ([`Decoder::set_deflate`]).
    pub fn deflate(&self) -> bool {
        self.deflate
    }

    /// Decodes the frame at the front of `buf`, unmasking it in place.
    ///
    /// `Ok(None)`: `buf` holds less than one whole frame; keep the bytes and
    /// call again with more. A frame header announcing more than the limit is
    /// refused at once, before its payload arrives. `buf` is changed only
    /// when a whole frame is consumed.
    pub fn decode<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> Result<Option<Decoded<'a>>, ProtocolError> {
        if self.assembly.as_ref().is_some_and(|a| a.done) {
            self.assembly = None;
        }
        let step = match self.step(buf) {
            Ok(Some(step)) => step,
            Ok(None) => return Ok(None),
            Err(e) => {
                // Errors are fatal; free the assembly at once rather than
                // when the caller gets round to dropping the decoder.
                self.assembly = None;
                return Err(e);
            }
        };
        let buf: &'a [u8] = buf;
        let payload = &buf[step.payload_start..step.consumed];
        let frame = match step.out {
            Out::Fragment => None,
            Out::Ping => Some(Frame::Ping(payload)),
            Out::Pong => Some(Frame::Pong(payload)),
            Out::Text => Some(Frame::Text(payload)),
            Out::Binary => Some(Frame::Binary(payload)),
            Out::Close(code) => {
                // step() checked the reason already; this cannot fail.
                let reason = std::str::from_utf8(payload.get(2..).unwrap_or_default())
                    .map_err(|_| ProtocolError::InvalidUtf8)?;
                Some(Frame::Close { code, reason })
            }
            Out::Assembled => {
                // step() returns Assembled only with a completed assembly.
                let asm = self
                    .assembly
                    .as_deref()
                    .ok_or(ProtocolError::UnexpectedContinuation)?;
                Some(if asm.text {
                    Frame::Text(&asm.buf)
                } else {
                    Frame::Binary(&asm.buf)
                })
            }
        };
        Ok(Some(Decoded {
            consumed: step.consumed,
            frame,
        }))
    }

    /// Whether a fragmented message is being assembled.
    pub fn in_message(&self) -> bool {
        self.assembly.as_ref().is_some_and(|a| !a.done)
    }

    /// Frees the buffer of a message that arrived fragmented and was returned
    /// by the last [`Decoder::decode`] call. The next `decode` call does this
    /// anyway; call it when the connection may now stay idle for long.
    pub fn release(&mut self) {
        if !self.in_message() {
            self.assembly = None;
        }
    }

    /// Checks, unmasks and (for fragments) assembles the frame at the front
    /// of `buf`, and says what to hand out; split from [`Decoder::decode`] so
    /// that an error can free the assembly before any borrow is returned.
    fn step(&mut self, buf: &mut [u8]) -> Result<Option<Step>, ProtocolError> {
        let Some(head) = self.parse_head(buf)? else {
            return Ok(None);
        };
        // Cannot overflow: parse_head checked the sum.
        let consumed = head.header_len + head.payload_len;
        if buf.len() < consumed {
            return Ok(None);
        }
        let payload = &mut buf[head.header_len..consumed];
        if let Some(mask) = head.mask {
            apply_mask(payload, mask);
        }
        let out = match head.opcode {
            OpCode::Ping => Out::Ping,
            OpCode::Pong => Out::Pong,
            OpCode::Close => Out::Close(parse_close(payload)?),
            OpCode::Text if head.fin && !head.compressed => {
                std::str::from_utf8(payload).map_err(|_| ProtocolError::InvalidUtf8)?;
                Out::Text
            }
            OpCode::Binary if head.fin && !head.compressed => Out::Binary,
            OpCode::Text | OpCode::Binary => {
                let mut asm = Assembly {
                    text: head.opcode == OpCode::Text,
                    done: false,
                    compressed: head.compressed,
                    checked: 0,
                    buf: Vec::with_capacity(payload.len()),
                };
                asm.push(payload, self.max_message)?;
                let out = if head.fin {
                    asm.finish(self.max_message)?;
                    Out::Assembled
                } else {
                    Out::Fragment
                };
                self.assembly = Some(Box::new(asm));
                out
            }
            OpCode::Continuation => {
                // parse_head refused a continuation without a message.
                let asm = self
                    .assembly
                    .as_deref_mut()
                    .ok_or(ProtocolError::UnexpectedContinuation)?;
                asm.push(payload, self.max_message)?;
                if head.fin {
                    asm.finish(self.max_message)?;
                    Out::Assembled
                } else {
                    Out::Fragment
                }
            }
        };
        Ok(Some(Step {
            consumed,
            payload_start: head.header_len,
            out,
        }))
    }

    /// Reads and checks the header at the front of `buf`; `None` when it is
    /// not all there yet. Every check that the header alone allows is made
    /// here, before any payload is waited for.
    fn parse_head(&self, buf: &[u8]) -> Result<Option<Head>, ProtocolError> {
        let [b0, b1, ..] = *buf else {
            return Ok(None);
        };
        let fin = b0 & 0x80 != 0;
        let opcode = match b0 & 0x0F {
            0x0 => OpCode::Continuation,
            0x1 => OpCode::Text,
            0x2 => OpCode::Binary,
            0x8 => OpCode::Close,
            0x9 => OpCode::Ping,
            0xA => OpCode::Pong,
            other => return Err(ProtocolError::UnknownOpcode(other)),
        };
        // RSV1 may start a compressed message, and only that (RFC 7692
        // section 6): never on a continuation or a control frame.
        let compressed =
            self.deflate && b0 & 0x40 != 0 && matches!(opcode, OpCode::Text | OpCode::Binary);
        if b0 & 0x70 != 0 && !(compressed && b0 & 0x30 == 0) {
            return Err(ProtocolError::ReservedBits);
        }
        let masked = b1 & 0x80 != 0;
        match (self.role, masked) {
            (Role::Server, false) => return Err(ProtocolError::Unmasked),
            (Role::Client, true) => return Err(ProtocolError::Masked),
            _ => {}
        }
        let len7 = b1 & 0x7F;
        let control = matches!(opcode, OpCode::Close | OpCode::Ping | OpCode::Pong);
        if control {
            if !fin {
                return Err(ProtocolError::ControlFragmented);
            }
            if len7 > 125 {
                return Err(ProtocolError::ControlTooLong);
            }
        } else {
            match (opcode, self.in_message()) {
                (OpCode::Continuation, false) => return Err(ProtocolError::UnexpectedContinuation),
                (OpCode::Text | OpCode::Binary, true) => {
                    return Err(ProtocolError::ExpectedContinuation);
                }
                _ => {}
            }
        }
        let (len, mut header_len) = match len7 {
            126 => {
                let [_, _, a, b, ..] = *buf else {
                    return Ok(None);
                };
                (u64::from(u16::from_be_bytes([a, b])), 4)
            }
            127 => {
                let Some(ext) = buf.get(2..10) else {
                    return Ok(None);
                };
                let mut be = [0u8; 8];
                be.copy_from_slice(ext);
                let len = u64::from_be_bytes(be);
                if len >> 63 != 0 {
                    return Err(ProtocolError::BadLength);
                }
                (len, 10)
            }
            n => (u64::from(n), 2),
        };
        if !control {
            let already = self.assembly.as_ref().map_or(0, |a| a.buf.len());
            // already <= max_message: every accepted fragment passed this check.
            let room = self.max_message - already;
            if len > room as u64 {
                return Err(ProtocolError::TooBig {
                    limit: self.max_message,
                });
            }
        }
        // Fits usize: at most 125 for control frames, within max_message otherwise.
        let payload_len = len as usize;
        let mask = if masked {
            let Some(m) = buf.get(header_len..header_len + 4) else {
                return Ok(None);
            };
            header_len += 4;
            Some([m[0], m[1], m[2], m[3]])
        } else {
            None
        };
        if header_len.checked_add(payload_len).is_none() {
            return Err(ProtocolError::TooBig {
                limit: self.max_message,
            });
        }
        Ok(Some(Head {
            fin,
            opcode,
            mask,
            header_len,
            payload_len,
            compressed,
        }))
    }
}

impl Assembly {
    /// Appends one fragment's payload, checking text as it arrives.
    /// The caller checked that the message stays within `max_message`.
    fn push(&mut self, payload: &[u8], max_message: usize) -> Result<(), ProtocolError> {
        let need = self.buf.len() + payload.len();
        if need > self.buf.capacity() {
            // Grow by doubling, as Vec would, but never past the limit: a
            // message near the limit must not cost twice the limit.
            let cap = need.max(self.buf.capacity().saturating_mul(2).min(max_message));
            self.buf.reserve_exact(cap - self.buf.len());
        }
        self.buf.extend_from_slice(payload);
        if self.text && !self.compressed {
            match std::str::from_utf8(&self.buf[self.checked..]) {
                Ok(_) => self.checked = self.buf.len(),
                // An incomplete sequence at the end may be finished by the
                // next fragment; anything else is invalid for good.
                Err(e) if e.error_len().is_none() => self.checked += e.valid_up_to(),
                Err(_) => return Err(ProtocolError::InvalidUtf8),
            }
        }
        Ok(())
    }
}

impl Assembly {
    /// The last fragment arrived: inflates a compressed message (to at
    /// most `max_message` bytes), and checks that a text one is all UTF-8.
    fn finish(&mut self, max_message: usize) -> Result<(), ProtocolError> {
        if self.compressed {
            self.buf = crate::inflate::inflate(&self.buf, max_message).map_err(|e| match e {
                crate::inflate::InflateError::TooBig => {
                    ProtocolError::TooBig { limit: max_message }
                }
                crate::inflate::InflateError::Corrupt => ProtocolError::BadDeflate,
            })?;
            if self.text {
                std::str::from_utf8(&self.buf).map_err(|_| ProtocolError::InvalidUtf8)?;
                self.checked = self.buf.len();
            }
        }
        if self.text && self.checked != self.buf.len() {
            return Err(ProtocolError::InvalidUtf8);
        }
        self.done = true;
        Ok(())
    }
}

/// Checks a close frame's payload: empty, or a valid code and a UTF-8
/// reason. Returns the code.
fn parse_close(payload: &[u8]) -> Result<Option<u16>, ProtocolError> {
    match payload {
        [] => Ok(None),
        [_] => Err(ProtocolError::BadClose),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            if !close_code_valid(code) {
                return Err(ProtocolError::BadClose);
            }
            std::str::from_utf8(reason).map_err(|_| ProtocolError::InvalidUtf8)?;
            Ok(Some(code))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{parse_request, parse_response};

    /// An owned copy of a [`Frame`], so tests can collect several.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Msg {
        Text(Vec<u8>),
        Binary(Vec<u8>),
        Ping(Vec<u8>),
        Pong(Vec<u8>),
        Close(Option<u16>, String),
    }

    fn own(frame: Frame<'_>) -> Msg {
        match frame {
            Frame::Text(p) => Msg::Text(p.to_vec()),
            Frame::Binary(p) => Msg::Binary(p.to_vec()),
            Frame::Ping(p) => Msg::Ping(p.to_vec()),
            Frame::Pong(p) => Msg::Pong(p.to_vec()),
            Frame::Close { code, reason } => Msg::Close(code, reason.to_owned()),
        }
    }

    /// Decodes every whole frame in `bytes`; also returns the bytes left over.
    fn decode_all(
        role: Role,
        limit: usize,
        bytes: &[u8],
    ) -> Result<(Vec<Msg>, usize), ProtocolError> {
        let mut dec = Decoder::new(role, limit);
        let mut buf = bytes.to_vec();
        let mut at = 0;
        let mut out = Vec::new();
        while let Some(d) = dec.decode(&mut buf[at..])? {
            at += d.consumed;
            out.extend(d.frame.map(own));
        }
        Ok((out, buf.len() - at))
    }

    fn request(head: &str) -> Request {
        let (req, n) = parse_request(head.as_bytes(), 8192).unwrap().unwrap();
        assert_eq!(n, head.len());
        req
    }

    const GOOD: &str = "GET /chan HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn accept_key_matches_rfc_example() {
        assert_eq!(
            accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn server_accept_table() {
        let key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
        let cases: &[(&str, Result<&str, HandshakeError>)] = &[
            (GOOD, Ok("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")),
            (
                // Tokens in any case, spread over several lines and lists.
                "GET / HTTP/1.1\r\nupgrade: WebSocket\r\nconnection: keep-alive\r\nCONNECTION: foo, UPGRADE \r\n\
                 sec-websocket-key:   dGhlIHNhbXBsZSBub25jZQ==  \r\nsec-websocket-version: 13\r\n\r\n",
                Ok("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            ),
            (
                &GOOD.replacen("GET", "POST", 1),
                Err(HandshakeError::NotGet("POST".into())),
            ),
            (
                &GOOD.replacen("HTTP/1.1", "HTTP/1.0", 1),
                Err(HandshakeError::OldHttp),
            ),
            (
                &GOOD.replacen("Upgrade: websocket", "Upgrade: h2c", 1),
                Err(HandshakeError::NoUpgrade),
            ),
            (
                &GOOD.replacen("Connection: Upgrade", "Connection: close", 1),
                Err(HandshakeError::NoConnectionUpgrade),
            ),
            (&GOOD.replacen(key, "", 1), Err(HandshakeError::BadKey)),
            (
                &GOOD.replacen("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZQ", 1),
                Err(HandshakeError::BadKey),
            ),
            (
                &GOOD.replacen("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZSE=", 1),
                Err(HandshakeError::BadKey),
            ),
            (
                &GOOD.replacen("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25j*Q==", 1),
                Err(HandshakeError::BadKey),
            ),
            (
                &GOOD.replacen("Version: 13", "Version: 8", 1),
                Err(HandshakeError::UnsupportedVersion),
            ),
            (
                &GOOD.replacen("Sec-WebSocket-Version: 13\r\n", "", 1),
                Err(HandshakeError::UnsupportedVersion),
            ),
        ];
        for (head, want) in cases {
            let got = server_accept(&request(head));
            assert_eq!(
                got.as_deref().map_err(Clone::clone),
                want.clone(),
                "{head:?}"
            );
        }
    }

    #[test]
    fn refusal_is_a_complete_response() {
        for (err, status) in [
            (HandshakeError::UnsupportedVersion, 426),
            (HandshakeError::BadKey, 400),
        ] {
            assert_eq!(err.status(), status);
            let mut out = Vec::new();
            write_refusal(&mut out, &err);
            let (resp, n) = parse_response(&out, 8192).unwrap().unwrap();
            assert_eq!(resp.status, status);
            assert_eq!(resp.header("Content-Type"), Some(&b"text/plain"[..]));
            assert_eq!(resp.header("Connection"), Some(&b"close"[..]));
            assert_eq!(
                resp.header("Sec-WebSocket-Version").is_some(),
                status == 426
            );
            assert_eq!(
                resp.body_kind("GET"),
                Ok(crate::http::BodyKind::Length((out.len() - n) as u64))
            );
            assert_eq!(&out[n..], format!("{err}\n").as_bytes());
        }
    }

    #[test]
    fn client_and_server_handshake_agree() {
        let key = client_key(*b"0123456789abcdef");
        let mut out = Vec::new();
        write_upgrade_request(&mut out, "127.0.0.1:80", "/news", &key);
        let (req, _) = parse_request(&out, 8192).unwrap().unwrap();
        assert_eq!(req.target, "/news");
        let accept = server_accept(&req).unwrap();
        let mut resp = Vec::new();
        write_accept(&mut resp, &accept);
        let (resp, n) = parse_response(&resp, 8192).unwrap().unwrap();
        assert_eq!(n, 129 - 28 + accept.len());
        assert_eq!(client_verify(&resp, &key), Ok(()));
        assert_eq!(
            client_verify(&resp, &client_key([7; 16])),
            Err(HandshakeError::BadAccept)
        );
        let mut not = resp;
        not.status = 200;
        assert_eq!(
            client_verify(&not, &key),
            Err(HandshakeError::NotSwitching(200))
        );
    }

    #[test]
    fn header_len_table() {
        for (len, masked, want) in [
            (0, false, 2),
            (125, false, 2),
            (126, false, 4),
            (65535, false, 4),
            (65536, false, 10),
            (0, true, 6),
            (126, true, 8),
            (1 << 20, true, 14),
        ] {
            assert_eq!(header_len(len, masked), want, "{len} {masked}");
            let mut out = Vec::new();
            encode_into(
                &mut out,
                true,
                OpCode::Binary,
                &vec![0; len],
                masked.then_some([1, 2, 3, 4]),
            );
            assert_eq!(out.len(), want + len);
        }
    }

    #[test]
    fn rfc_6455_examples_decode() {
        let hello = Msg::Text(b"Hello".to_vec());
        let cases: &[(Role, &[u8], Vec<Msg>)] = &[
            (Role::Client, b"\x81\x05Hello", vec![hello.clone()]),
            (
                Role::Server,
                b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58",
                vec![hello.clone()],
            ),
            (Role::Client, b"\x01\x03Hel\x80\x02lo", vec![hello.clone()]),
            (
                Role::Client,
                b"\x89\x05Hello",
                vec![Msg::Ping(b"Hello".to_vec())],
            ),
            (
                Role::Server,
                b"\x8a\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58",
                vec![Msg::Pong(b"Hello".to_vec())],
            ),
            // A ping between the fragments of a message.
            (
                Role::Client,
                b"\x01\x03Hel\x89\x00\x80\x02lo",
                vec![Msg::Ping(vec![]), hello],
            ),
            (
                Role::Client,
                b"\x88\x00",
                vec![Msg::Close(None, String::new())],
            ),
            (
                Role::Client,
                b"\x88\x04\x03\xe8ok",
                vec![Msg::Close(Some(1000), "ok".into())],
            ),
            // Zero-length fragments and a non-minimal length encoding.
            (
                Role::Client,
                b"\x02\x00\x00\x00\x80\x7e\x00\x01!",
                vec![Msg::Binary(b"!".to_vec())],
            ),
        ];
        for (role, bytes, want) in cases {
            assert_eq!(
                decode_all(*role, 1 << 20, bytes),
                Ok((want.clone(), 0)),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn long_lengths_decode() {
        for len in [126, 65535, 65536, 100_000] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut out = Vec::new();
            encode_into(&mut out, true, OpCode::Binary, &payload, Some([9, 8, 7, 6]));
            assert_eq!(
                decode_all(Role::Server, len, &out),
                Ok((vec![Msg::Binary(payload.clone())], 0))
            );
            // One byte short: not yet a frame, nothing consumed.
            assert_eq!(
                decode_all(Role::Server, len, &out[..out.len() - 1]),
                Ok((vec![], out.len() - 1))
            );
        }
    }

    #[test]
    fn protocol_errors_table() {
        use ProtocolError as E;
        let cases: &[(Role, &[u8], ProtocolError)] = &[
            (Role::Server, b"\x81\x05Hello", E::Unmasked),
            (Role::Client, b"\x81\x80\0\0\0\0", E::Masked),
            (Role::Client, b"\xc1\x00", E::ReservedBits),
            (Role::Client, b"\xa1\x00", E::ReservedBits),
            (Role::Client, b"\x91\x00", E::ReservedBits),
            (Role::Client, b"\x83\x00", E::UnknownOpcode(3)),
            (Role::Client, b"\x8b\x00", E::UnknownOpcode(0xb)),
            (Role::Client, b"\x89\x7e\x00\x7e", E::ControlTooLong),
            (Role::Client, b"\x09\x00", E::ControlFragmented),
            (Role::Client, b"\x80\x00", E::UnexpectedContinuation),
            (Role::Client, b"\x01\x01a\x01\x01b", E::ExpectedContinuation),
            (Role::Client, b"\x81\x02\xc3\x28", E::InvalidUtf8),
            (Role::Client, b"\x01\x02\xc3\x28", E::InvalidUtf8),
            // A split code point left incomplete at the end of the message.
            (Role::Client, b"\x01\x01a\x80\x01\xc3", E::InvalidUtf8),
            (Role::Client, b"\x88\x01\x03", E::BadClose),
            (Role::Client, b"\x88\x02\x03\xed", E::BadClose),
            (Role::Client, b"\x88\x03\x03\xe8\xff", E::InvalidUtf8),
            (Role::Client, b"\x82\x7f\x80\0\0\0\0\0\0\0", E::BadLength),
            // Refused from the header alone, before the payload arrives.
            (Role::Client, b"\x82\x7e\x01\x00", E::TooBig { limit: 255 }),
            (Role::Client, b"\x02\x7e\x00\xf0", E::TooBig { limit: 255 }),
        ];
        for (role, bytes, want) in cases {
            let mut buf = bytes.to_vec();
            if let E::TooBig { .. } = want {
                buf.extend(vec![0; 0xf0]);
                buf.extend_from_slice(b"\x00\x10");
            }
            assert_eq!(decode_all(*role, 255, &buf), Err(want.clone()), "{bytes:?}");
        }
        assert_eq!(E::InvalidUtf8.close_code(), 1007);
        assert_eq!(E::TooBig { limit: 1 }.close_code(), 1009);
        assert_eq!(E::Unmasked.close_code(), 1002);
    }

    #[test]
    fn assembly_never_holds_more_than_the_limit() {
        let limit = 1000;
        let mut dec = Decoder::new(Role::Client, limit);
        let mut wire = Vec::new();
        encode_into(&mut wire, false, OpCode::Binary, &[1; 10], None);
        for _ in 0..98 {
            encode_into(&mut wire, false, OpCode::Continuation, &[2; 10], None);
        }
        encode_into(&mut wire, true, OpCode::Continuation, &[3; 10], None);
        let mut at = 0;
        while let Some(d) = dec.decode(&mut wire[at..]).unwrap() {
            at += d.consumed;
            let done = d.frame.is_some();
            let asm = dec.assembly.as_ref().unwrap();
            assert!(asm.buf.capacity() <= limit, "{}", asm.buf.capacity());
            if done {
                break;
            }
        }
        assert_eq!(at, wire.len());
    }

    #[test]
    fn fragments_over_the_limit_are_refused() {
        // 200 + 100 > 255, refused at the second header.
        let mut bytes = vec![0x02, 126, 0, 200];
        bytes.extend([b'x'; 200]);
        bytes.extend([0x80, 100]);
        assert_eq!(
            decode_all(Role::Client, 255, &bytes),
            Err(ProtocolError::TooBig { limit: 255 })
        );
        assert_eq!(decode_all(Role::Client, 300, &bytes), Ok((vec![], 2)));
    }

    #[test]
    fn close_code_validity_table() {
        for (code, valid) in [
            (0, false),
            (999, false),
            (1000, true),
            (1001, true),
            (1002, true),
            (1003, true),
            (1004, false),
            (1005, false),
            (1006, false),
            (1007, true),
            (1011, true),
            (1012, true),
            (1013, true),
            (1014, true),
            (1015, false),
            (1016, false),
            (2000, false),
            (2999, false),
            (3000, true),
            (4999, true),
            (5000, false),
            (65535, false),
        ] {
            assert_eq!(close_code_valid(code), valid, "{code}");
        }
    }

    #[test]
    fn close_reason_is_cut_on_a_char_boundary() {
        let reason = "é".repeat(100); // 200 bytes, 2 per char
        let mut out = Vec::new();
        encode_close(&mut out, 1001, &reason, None);
        assert_eq!(out.len(), 2 + 2 + 122);
        let (msgs, _) = decode_all(Role::Client, 0, &out).unwrap();
        assert_eq!(msgs, vec![Msg::Close(Some(1001), "é".repeat(61))]);
    }

    #[test]
    fn unmask_matches_bytewise_xor() {
        let mask = [0xde, 0xad, 0xbe, 0xef];
        for len in 0..70 {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut fast = data.clone();
            apply_mask(&mut fast, mask);
            let slow: Vec<u8> = data
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ mask[i % 4])
                .collect();
            assert_eq!(fast, slow, "{len}");
        }
    }

    #[test]
    fn decoder_stays_small_and_frees_its_assembly() {
        assert!(size_of::<Decoder>() <= 24, "{}", size_of::<Decoder>());
        let mut dec = Decoder::new(Role::Client, 1024);
        let mut first = b"\x01\x03Hel".to_vec();
        assert_eq!(dec.decode(&mut first).unwrap().unwrap().frame, None);
        assert!(dec.in_message());
        let mut last = b"\x80\x02lo".to_vec();
        assert_eq!(
            dec.decode(&mut last).unwrap().unwrap().frame,
            Some(Frame::Text(b"Hello"))
        );
        assert!(!dec.in_message());
        assert!(dec.assembly.is_some(), "kept for the returned borrow");
        // The read loop's last call, on an empty buffer, frees it.
        assert_eq!(dec.decode(&mut []), Ok(None));
        assert!(dec.assembly.is_none());
        let mut again = b"\x02\x01a\x80\x01b".to_vec();
        let first = dec.decode(&mut again).unwrap().unwrap().consumed;
        assert!(
            dec.decode(&mut again[first..])
                .unwrap()
                .unwrap()
                .frame
                .is_some()
        );
        dec.release();
        assert!(dec.assembly.is_none());
        // An error mid-message frees it too.
        let mut bad = b"\x01\x01a\x02\x00".to_vec();
        assert!(dec.decode(&mut bad).unwrap().is_some());
        assert!(dec.assembly.is_some());
        assert_eq!(
            dec.decode(&mut bad[3..]),
            Err(ProtocolError::ExpectedContinuation)
        );
        assert!(dec.assembly.is_none());
    }

    #[test]
    fn labels_are_distinct() {
        use ProtocolError as E;
        let errs = [
            E::Unmasked,
            E::Masked,
            E::ReservedBits,
            E::UnknownOpcode(3),
            E::ControlTooLong,
            E::ControlFragmented,
            E::UnexpectedContinuation,
            E::ExpectedContinuation,
            E::InvalidUtf8,
            E::TooBig { limit: 0 },
            E::BadClose,
            E::BadLength,
        ];
        let labels: std::collections::HashSet<_> = errs.iter().map(E::label).collect();
        assert_eq!(labels.len(), errs.len());

        use HandshakeError as H;
        let errs = [
            H::NotGet("PUT".into()),
            H::OldHttp,
            H::NoUpgrade,
            H::NoConnectionUpgrade,
            H::BadKey,
            H::UnsupportedVersion,
            H::NotSwitching(200),
            H::BadAccept,
        ];
        let labels: std::collections::HashSet<_> = errs.iter().map(H::label).collect();
        assert_eq!(labels.len(), errs.len());
    }
}
