//! A small HTTP/1.1 head parser and writer on `httparse`, and the body
//! framings throng needs (Content-Length, chunked, until-close).
//!
//! Heads are parsed from a borrowed buffer; only what callers keep is copied.

use thiserror::Error;

/// The largest request or response head throng accepts (answered with 431).
pub const MAX_HEAD: usize = 8 * 1024;
/// The most header lines parsed from one head.
pub const MAX_HEADERS: usize = 32;

/// Why a head could not be parsed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeadError {
    /// The head is longer than [`MAX_HEAD`] (or the caller's limit): 431.
    #[error("request head is larger than {limit} bytes")]
    TooLarge {
        /// The limit that was passed.
        limit: usize,
    },
    /// More than [`MAX_HEADERS`] header lines: 431.
    #[error("more than {MAX_HEADERS} header lines")]
    TooManyHeaders,
    /// Not HTTP/1.x syntax: 400, with the parser's reason.
    #[error("malformed HTTP head: {0}")]
    Malformed(&'static str),
    /// A Content-Length that is not a number, or two that disagree: 400.
    #[error("invalid Content-Length")]
    BadContentLength,
    /// Transfer-Encoding other than `chunked`: 501.
    #[error("unsupported Transfer-Encoding")]
    UnsupportedTransferEncoding,
}

/// A parsed request head. Header names keep their spelling; look-ups ignore case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target as sent (`/chan?x=1`).
    pub target: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Header lines in order.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// A parsed response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Reason phrase as sent.
    pub reason: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Header lines in order.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// How the body after a head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the peer closes (responses only).
    UntilClose,
}

/// Parses a request head from the start of `buf`.
///
/// `Ok(None)`: the head is not complete yet (and `buf` is within `limit`).
/// `Ok(Some((req, n)))`: the head took the first `n` bytes of `buf`.
pub fn parse_request(buf: &[u8], limit: usize) -> Result<Option<(Request, usize)>, HeadError> {
    let _ = (buf, limit);
    todo!("throng-proto: parse_request")
}

/// Parses a response head from the start of `buf`; as [`parse_request`].
pub fn parse_response(buf: &[u8], limit: usize) -> Result<Option<(Response, usize)>, HeadError> {
    let _ = (buf, limit);
    todo!("throng-proto: parse_response")
}

/// The first value of header `name` (case-insensitive), if any.
pub fn header<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// Whether a comma-separated header (`Connection`, `Upgrade`) contains `token`,
/// ignoring case and spaces, over every line with that name.
pub fn header_has_token(headers: &[(String, Vec<u8>)], name: &str, token: &str) -> bool {
    let _ = (headers, name, token);
    todo!("throng-proto: header_has_token")
}

impl Request {
    /// How the request body is delimited (requests never use [`BodyKind::UntilClose`]).
    pub fn body_kind(&self) -> Result<BodyKind, HeadError> {
        todo!("throng-proto: Request::body_kind")
    }

    /// Whether the connection stays open after this request (HTTP/1.1 default yes,
    /// HTTP/1.0 default no, `Connection: close`/`keep-alive` override).
    pub fn keep_alive(&self) -> bool {
        todo!("throng-proto: Request::keep_alive")
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        header(&self.headers, name)
    }
}

impl Response {
    /// How the response body is delimited, given the request method
    /// (`HEAD` and 1xx/204/304 responses have none).
    pub fn body_kind(&self, request_method: &str) -> Result<BodyKind, HeadError> {
        let _ = request_method;
        todo!("throng-proto: Response::body_kind")
    }

    /// Whether the connection stays open after this response.
    pub fn keep_alive(&self) -> bool {
        todo!("throng-proto: Response::keep_alive")
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        header(&self.headers, name)
    }
}

/// Appends a complete response (head and a Content-Length body) to `out`.
/// `headers` must not contain Content-Length; it is written from `body`.
pub fn write_response(out: &mut Vec<u8>, status: u16, headers: &[(&str, &str)], body: &[u8]) {
    let _ = (out, status, headers, body);
    todo!("throng-proto: write_response")
}

/// Appends a response head only (for chunked or streamed bodies).
pub fn write_response_head(out: &mut Vec<u8>, status: u16, headers: &[(&str, &str)]) {
    let _ = (out, status, headers);
    todo!("throng-proto: write_response_head")
}

/// Appends one chunk of a chunked body; an empty `data` writes the last chunk (`0\r\n\r\n`).
pub fn write_chunk(out: &mut Vec<u8>, data: &[u8]) {
    let _ = (out, data);
    todo!("throng-proto: write_chunk")
}

/// Appends a request head (`Host` included by the caller in `headers`) and body.
/// A Content-Length is written when `body` is non-empty or the method is POST/PUT.
pub fn write_request(out: &mut Vec<u8>, method: &str, target: &str, headers: &[(&str, &[u8])], body: &[u8]) {
    let _ = (out, method, target, headers, body);
    todo!("throng-proto: write_request")
}

/// The standard reason phrase for a status code ("Unknown" otherwise).
pub fn reason_phrase(status: u16) -> &'static str {
    let _ = status;
    todo!("throng-proto: reason_phrase")
}

/// Incremental body reader for a [`BodyKind`]: feed it bytes, it says which
/// are body data and when the body ended. Holds a few words of state only.
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    _state: (),
}

/// One step of [`BodyDecoder::decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyStep {
    /// Bytes of the input consumed (data plus framing).
    pub consumed: usize,
    /// Range of the input (within `consumed`) that is body data.
    pub data: (usize, usize),
    /// The body is complete after this step.
    pub done: bool,
}

/// Malformed chunked framing, or a body larger than the caller's limit.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyError {
    /// A chunk-size line or CRLF was not where it should be.
    #[error("malformed chunked body")]
    BadChunk,
    /// The body grew past the limit given to [`BodyDecoder::new`].
    #[error("body larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
}

impl BodyDecoder {
    /// A decoder for a body of `kind`, refusing more than `limit` data bytes.
    pub fn new(kind: BodyKind, limit: u64) -> Self {
        let _ = (kind, limit);
        todo!("throng-proto: BodyDecoder::new")
    }

    /// Consumes from `buf`; call again with the unconsumed rest (plus more input)
    /// until `done`. `eof` says the peer has closed (ends an UntilClose body,
    /// and is an error for the others when they are incomplete).
    pub fn decode(&mut self, buf: &[u8], eof: bool) -> Result<BodyStep, BodyError> {
        let _ = (buf, eof);
        todo!("throng-proto: BodyDecoder::decode")
    }
}
