//! RFC 6455 WebSocket: the opening handshake and the frame codec, for both
//! roles. The server role expects masked frames and sends unmasked ones; the
//! client role the reverse.
//!
//! Frames are encoded once into [`Bytes`] so a server can write the same
//! frame to many subscribers, and decoded in place from the caller's buffer:
//! a [`Decoder`] holds no buffer of its own unless a fragmented message is
//! being assembled.

use bytes::Bytes;
use thiserror::Error;

use crate::http::{Request, Response};

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
        todo!("throng-proto: HandshakeError::status")
    }

    /// A short stable label for metrics (`bad_key`, `version`, ...).
    pub fn label(&self) -> &'static str {
        todo!("throng-proto: HandshakeError::label")
    }
}

/// `base64(sha1(key + GUID))`: the `Sec-WebSocket-Accept` value for `key`.
pub fn accept_key(key: &[u8]) -> String {
    let _ = key;
    todo!("throng-proto: accept_key")
}

/// Checks a request as a server would; on success returns the
/// `Sec-WebSocket-Accept` value to answer with. The caller checks the path.
pub fn server_accept(req: &Request) -> Result<String, HandshakeError> {
    let _ = req;
    todo!("throng-proto: server_accept")
}

/// Appends the `101 Switching Protocols` response for `accept`.
pub fn write_accept(out: &mut Vec<u8>, accept: &str) {
    let _ = (out, accept);
    todo!("throng-proto: write_accept")
}

/// Appends the refusal for `err`: its status, the reason as a text body, and
/// `Sec-WebSocket-Version: 13` on 426. The server closes after writing it.
pub fn write_refusal(out: &mut Vec<u8>, err: &HandshakeError) {
    let _ = (out, err);
    todo!("throng-proto: write_refusal")
}

/// The `Sec-WebSocket-Key` for a 16-byte nonce (the caller supplies randomness).
pub fn client_key(nonce: [u8; 16]) -> String {
    let _ = nonce;
    todo!("throng-proto: client_key")
}

/// Appends a client's upgrade request for `target` (`/chan`) on `host` (`h:port`).
pub fn write_upgrade_request(out: &mut Vec<u8>, host: &str, target: &str, key: &str) {
    let _ = (out, host, target, key);
    todo!("throng-proto: write_upgrade_request")
}

/// Checks a server's answer to the upgrade request made with `key`.
pub fn client_verify(resp: &Response, key: &str) -> Result<(), HandshakeError> {
    let _ = (resp, key);
    todo!("throng-proto: client_verify")
}

/// Length of a frame header for a payload of `len` bytes (2, 4 or 10, plus 4 when masked).
pub fn header_len(len: usize, masked: bool) -> usize {
    let _ = (len, masked);
    todo!("throng-proto: header_len")
}

/// Appends one frame to `out`: `fin` set as given, payload masked with `mask`
/// when given (client role), every length encoding (7-bit, 16-bit, 64-bit).
pub fn encode_into(out: &mut Vec<u8>, fin: bool, opcode: OpCode, payload: &[u8], mask: Option<[u8; 4]>) {
    let _ = (out, fin, opcode, payload, mask);
    todo!("throng-proto: encode_into")
}

/// One complete unmasked frame (server role), encoded once for any number of writes.
pub fn server_frame(opcode: OpCode, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(header_len(payload.len(), false) + payload.len());
    encode_into(&mut out, true, opcode, payload, None);
    Bytes::from(out)
}

/// Appends a close frame with `code` and `reason` (reason cut to fit 123 bytes
/// on a char boundary); masked when `mask` is given.
pub fn encode_close(out: &mut Vec<u8>, code: u16, reason: &str, mask: Option<[u8; 4]>) {
    let _ = (out, code, reason, mask);
    todo!("throng-proto: encode_close")
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
        /// The peer's close code, already checked to be one a peer may send.
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
    /// A 64-bit length with the top bit set, or a non-minimal length is accepted;
    /// only the top-bit case is an error.
    #[error("invalid frame length")]
    BadLength,
}

impl ProtocolError {
    /// The close code to send: 1002 protocol, 1007 invalid data, 1009 too big.
    pub fn close_code(&self) -> u16 {
        todo!("throng-proto: ProtocolError::close_code")
    }

    /// A short stable label for metrics (`unmasked`, `utf8`, `too_big`, ...).
    pub fn label(&self) -> &'static str {
        todo!("throng-proto: ProtocolError::label")
    }
}

/// Incremental frame decoder. Idle, it is a few words with no heap
/// allocation; it allocates only to assemble a fragmented message, and frees
/// that when the message completes.
#[derive(Debug)]
pub struct Decoder {
    _role: Role,
    _max_message: usize,
}

impl Decoder {
    /// A decoder for `role` that refuses messages over `max_message` bytes.
    pub fn new(role: Role, max_message: usize) -> Self {
        Self { _role: role, _max_message: max_message }
    }

    /// Decodes the frame at the front of `buf`, unmasking it in place.
    ///
    /// `Ok(None)`: `buf` holds less than one whole frame; keep the bytes and
    /// call again with more. A frame header announcing more than the limit is
    /// refused at once, before its payload arrives.
    pub fn decode<'a>(&'a mut self, buf: &'a mut [u8]) -> Result<Option<Decoded<'a>>, ProtocolError> {
        let _ = buf;
        todo!("throng-proto: Decoder::decode")
    }

    /// Whether a fragmented message is being assembled.
    pub fn in_message(&self) -> bool {
        todo!("throng-proto: Decoder::in_message")
    }
}
