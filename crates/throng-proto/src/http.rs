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
    #[error("HTTP head is larger than {limit} bytes")]
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
/// Bytes after the head (a body, a pipelined request) are not looked at, so
/// `buf` may be longer than `limit` as long as the head itself fits.
pub fn parse_request(buf: &[u8], limit: usize) -> Result<Option<(Request, usize)>, HeadError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(within(buf, limit)).map_err(head_error)? {
        httparse::Status::Partial => partial(buf, limit),
        httparse::Status::Complete(n) => {
            let (Some(method), Some(target), Some(minor_version)) =
                (req.method, req.path, req.version)
            else {
                // httparse fills all three before it reports Complete.
                return Err(HeadError::Malformed("incomplete request line"));
            };
            let req = Request {
                method: method.to_owned(),
                target: target.to_owned(),
                minor_version,
                headers: own_headers(req.headers),
            };
            Ok(Some((req, n)))
        }
    }
}

/// Parses a response head from the start of `buf`; as [`parse_request`].
pub fn parse_response(buf: &[u8], limit: usize) -> Result<Option<(Response, usize)>, HeadError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    match resp.parse(within(buf, limit)).map_err(head_error)? {
        httparse::Status::Partial => partial(buf, limit),
        httparse::Status::Complete(n) => {
            let (Some(status), Some(minor_version)) = (resp.code, resp.version) else {
                // httparse fills both before it reports Complete.
                return Err(HeadError::Malformed("incomplete status line"));
            };
            let resp = Response {
                status,
                reason: resp.reason.unwrap_or("").to_owned(),
                minor_version,
                headers: own_headers(resp.headers),
            };
            Ok(Some((resp, n)))
        }
    }
}

/// The part of `buf` a head of at most `limit` bytes can lie in.
fn within(buf: &[u8], limit: usize) -> &[u8] {
    &buf[..buf.len().min(limit)]
}

/// An incomplete head: wait for more, unless the limit is already reached
/// (then no head within the limit can complete).
fn partial<T>(buf: &[u8], limit: usize) -> Result<Option<T>, HeadError> {
    if buf.len() >= limit {
        Err(HeadError::TooLarge { limit })
    } else {
        Ok(None)
    }
}

fn head_error(e: httparse::Error) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooManyHeaders,
        httparse::Error::HeaderName => HeadError::Malformed("invalid header name"),
        httparse::Error::HeaderValue => HeadError::Malformed("invalid header value"),
        httparse::Error::NewLine => HeadError::Malformed("invalid line ending"),
        httparse::Error::Status => HeadError::Malformed("invalid status code"),
        httparse::Error::Token => HeadError::Malformed("invalid token in the request line"),
        httparse::Error::Version => HeadError::Malformed("invalid HTTP version"),
    }
}

fn own_headers(headers: &[httparse::Header<'_>]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|h| (h.name.to_owned(), h.value.to_vec()))
        .collect()
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
    tokens(headers, name).any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
}

/// Every non-empty comma-separated element of every `name` line, trimmed.
fn tokens<'a>(
    headers: &'a [(String, Vec<u8>)],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether `Transfer-Encoding` says chunked. Any other coding, or chunked
/// twice, cannot be framed by throng.
fn transfer_chunked(headers: &[(String, Vec<u8>)]) -> Result<bool, HeadError> {
    if !headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("Transfer-Encoding"))
    {
        return Ok(false);
    }
    // Present but empty is as unframeable as an unknown coding.
    let mut codings = tokens(headers, "Transfer-Encoding");
    match (codings.next(), codings.next()) {
        (Some(c), None) if c.eq_ignore_ascii_case(b"chunked") => Ok(true),
        _ => Err(HeadError::UnsupportedTransferEncoding),
    }
}

/// The `Content-Length`, if any. Repeats (on several lines or as a list) are
/// accepted when they agree (RFC 9110 section 8.6).
fn content_length(headers: &[(String, Vec<u8>)]) -> Result<Option<u64>, HeadError> {
    let mut found = None;
    for (name, value) in headers {
        if !name.eq_ignore_ascii_case("Content-Length") {
            continue;
        }
        for item in value.split(|&b| b == b',') {
            let n = parse_decimal(item.trim_ascii()).ok_or(HeadError::BadContentLength)?;
            if found.is_some_and(|f| f != n) {
                return Err(HeadError::BadContentLength);
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// Digits only (no sign, no spaces), at least one, within u64.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        let digit = char::from(b).to_digit(10)?;
        acc.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The keep-alive rule shared by requests and responses (RFC 9112 section 9.3).
fn persistent(minor_version: u8, headers: &[(String, Vec<u8>)]) -> bool {
    if header_has_token(headers, "Connection", "close") {
        false
    } else if minor_version >= 1 {
        true
    } else {
        header_has_token(headers, "Connection", "keep-alive")
    }
}

impl Request {
    /// How the request body is delimited (requests never use [`BodyKind::UntilClose`]).
    ///
    /// A request with both `Transfer-Encoding` and `Content-Length` is refused
    /// with [`HeadError::BadContentLength`]: the two framings disagreeing is
    /// how requests are smuggled past proxies, and no honest client sends both.
    pub fn body_kind(&self) -> Result<BodyKind, HeadError> {
        let chunked = transfer_chunked(&self.headers)?;
        let length = content_length(&self.headers)?;
        match (chunked, length) {
            (true, Some(_)) => Err(HeadError::BadContentLength),
            (true, None) => Ok(BodyKind::Chunked),
            (false, Some(n)) => Ok(BodyKind::Length(n)),
            (false, None) => Ok(BodyKind::Empty),
        }
    }

    /// Whether the connection stays open after this request (HTTP/1.1 default yes,
    /// HTTP/1.0 default no, `Connection: close`/`keep-alive` override).
    pub fn keep_alive(&self) -> bool {
        persistent(self.minor_version, &self.headers)
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        header(&self.headers, name)
    }
}

impl Response {
    /// How the response body is delimited, given the request method
    /// (`HEAD` and 1xx/204/304 responses have none; nor has a 2xx answer to
    /// `CONNECT`). `Transfer-Encoding: chunked` wins over a `Content-Length`
    /// (RFC 9112 section 6.3).
    pub fn body_kind(&self, request_method: &str) -> Result<BodyKind, HeadError> {
        let connect_ok =
            request_method.eq_ignore_ascii_case("CONNECT") && (200..300).contains(&self.status);
        if request_method.eq_ignore_ascii_case("HEAD")
            || connect_ok
            || (100..200).contains(&self.status)
            || self.status == 204
            || self.status == 304
        {
            return Ok(BodyKind::Empty);
        }
        if transfer_chunked(&self.headers)? {
            return Ok(BodyKind::Chunked);
        }
        match content_length(&self.headers)? {
            Some(n) => Ok(BodyKind::Length(n)),
            None => Ok(BodyKind::UntilClose),
        }
    }

    /// Whether the connection stays open after this response: the
    /// `Connection` header and version say so, and the body (as for a GET) is
    /// delimited by something other than the close. Conservative for a
    /// length-less answer to HEAD, which could in fact be kept.
    pub fn keep_alive(&self) -> bool {
        persistent(self.minor_version, &self.headers)
            && matches!(
                self.body_kind("GET"),
                Ok(BodyKind::Empty | BodyKind::Length(_) | BodyKind::Chunked)
            )
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        header(&self.headers, name)
    }
}

/// Appends a complete response (head and a Content-Length body) to `out`.
/// `headers` must not contain Content-Length; it is written from `body`.
pub fn write_response(out: &mut Vec<u8>, status: u16, headers: &[(&str, &str)], body: &[u8]) {
    out.reserve(128 + body.len());
    write_status_line(out, status);
    write_headers(out, headers.iter().map(|(n, v)| (*n, v.as_bytes())));
    out.extend_from_slice(b"Content-Length: ");
    push_decimal(out, body.len() as u64);
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body);
}

/// Appends a response head only (for chunked or streamed bodies).
pub fn write_response_head(out: &mut Vec<u8>, status: u16, headers: &[(&str, &str)]) {
    write_status_line(out, status);
    write_headers(out, headers.iter().map(|(n, v)| (*n, v.as_bytes())));
    out.extend_from_slice(b"\r\n");
}

/// Appends one chunk of a chunked body; an empty `data` writes the last chunk (`0\r\n\r\n`).
pub fn write_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        out.extend_from_slice(b"0\r\n\r\n");
        return;
    }
    out.reserve(20 + data.len());
    push_hex(out, data.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends a request head (`Host` included by the caller in `headers`) and body.
/// A Content-Length is written when `body` is non-empty or the method is POST/PUT.
pub fn write_request(
    out: &mut Vec<u8>,
    method: &str,
    target: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) {
    out.reserve(128 + body.len());
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    write_headers(out, headers.iter().copied());
    if !body.is_empty() || method.eq_ignore_ascii_case("POST") || method.eq_ignore_ascii_case("PUT")
    {
        out.extend_from_slice(b"Content-Length: ");
        push_decimal(out, body.len() as u64);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

fn write_status_line(out: &mut Vec<u8>, status: u16) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason_phrase(status).as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn write_headers<'h>(out: &mut Vec<u8>, headers: impl Iterator<Item = (&'h str, &'h [u8])>) {
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

fn push_hex(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[(n & 0xF) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The standard reason phrase for a status code ("Unknown" otherwise).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// Incremental body reader for a [`BodyKind`]: feed it bytes, it says which
/// are body data and when the body ended. Holds a few words of state only.
///
/// ```
/// use throng_proto::http::{BodyDecoder, BodyKind};
///
/// let input = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nHTTP/1.1 200 OK";
/// let mut dec = BodyDecoder::new(BodyKind::Chunked, 1024);
/// let (mut at, mut body) = (0, Vec::new());
/// loop {
///     let step = dec.decode(&input[at..], false)?;
///     body.extend_from_slice(&input[at + step.data.0..at + step.data.1]);
///     at += step.consumed;
///     if step.done {
///         break;
///     }
///     // A reader would read more here when the step consumed everything.
///     assert!(at < input.len());
/// }
/// assert_eq!(body, b"hello world");
/// assert_eq!(&input[at..], b"HTTP/1.1 200 OK"); // the next response
/// # Ok::<(), throng_proto::http::BodyError>(())
/// ```
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    state: BodyState,
    /// Data bytes the caller allows in all.
    limit: u64,
    /// Data bytes announced so far (a chunk counts when its size line ends).
    /// Invariant: `seen <= limit`.
    seen: u64,
    /// Framing bytes in the current chunk extension, or in all trailers;
    /// bounded by [`MAX_HEAD`] so a peer cannot keep the reader busy forever
    /// with framing that carries no data.
    framing: usize,
}

/// Where a [`BodyDecoder`] is in its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyState {
    /// A Content-Length body with this many bytes still to come.
    Length(u64),
    /// Everything until the peer closes.
    UntilClose,
    /// Reading a chunk-size line's hex digits (`digits` of them so far).
    ChunkSize { size: u64, digits: u8 },
    /// After the digits: whitespace and `;name=value` extensions, to the CR.
    ChunkExt { size: u64 },
    /// The CR ending a chunk-size line was read; LF must follow.
    ChunkSizeLf { size: u64 },
    /// Inside a chunk's data, with this many bytes left.
    ChunkData(u64),
    /// A chunk's data ended; its CR must follow.
    ChunkDataCr,
    /// A chunk's data and CR ended; its LF must follow.
    ChunkDataLf,
    /// After the last chunk, at the start of a trailer line or the final CRLF.
    TrailerStart,
    /// Inside a trailer field line, to its LF.
    TrailerLine,
    /// The CR of the final empty line was read; LF must follow.
    TrailerEndLf,
    /// The body ended.
    Done,
    /// A Content-Length over the limit: every call fails.
    Refused,
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
    /// A chunk-size line or CRLF was not where it should be (or chunk
    /// extensions or trailers longer than [`MAX_HEAD`]).
    #[error("malformed chunked body")]
    BadChunk,
    /// The body grew past the limit given to [`BodyDecoder::new`].
    #[error("body larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// The peer closed before a Content-Length or chunked body ended.
    #[error("connection closed before the body ended")]
    Truncated,
}

impl BodyDecoder {
    /// A decoder for a body of `kind`, refusing more than `limit` data bytes.
    pub fn new(kind: BodyKind, limit: u64) -> Self {
        let state = match kind {
            BodyKind::Empty | BodyKind::Length(0) => BodyState::Done,
            BodyKind::Length(n) if n > limit => BodyState::Refused,
            BodyKind::Length(n) => BodyState::Length(n),
            BodyKind::Chunked => BodyState::ChunkSize { size: 0, digits: 0 },
            BodyKind::UntilClose => BodyState::UntilClose,
        };
        Self {
            state,
            limit,
            seen: 0,
            framing: 0,
        }
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        self.state == BodyState::Done
    }

    /// Consumes from `buf`; call again with the unconsumed rest (plus more input)
    /// until `done`. `eof` says the peer has closed (ends an UntilClose body,
    /// and is an error for the others when they are incomplete).
    ///
    /// Each step returns at most one range of data; a step that returns data
    /// may leave input unconsumed even when more data follows it. At `eof`,
    /// a body that `buf` does not complete is [`BodyError::Truncated`]; data
    /// in that last piece is not returned (the body is unusable anyway).
    pub fn decode(&mut self, buf: &[u8], eof: bool) -> Result<BodyStep, BodyError> {
        let mut i = 0;
        loop {
            let data_len = match self.state {
                BodyState::Done => {
                    return Ok(BodyStep {
                        consumed: i,
                        data: (i, i),
                        done: true,
                    });
                }
                BodyState::Refused => return Err(BodyError::TooLarge { limit: self.limit }),
                BodyState::Length(n) | BodyState::ChunkData(n) => n,
                BodyState::UntilClose => {
                    let take = buf.len() - i;
                    // take fits u64; seen <= limit so the subtraction holds.
                    if take as u64 > self.limit - self.seen {
                        return Err(BodyError::TooLarge { limit: self.limit });
                    }
                    self.seen += take as u64;
                    if eof {
                        self.state = BodyState::Done;
                    }
                    return Ok(BodyStep {
                        consumed: buf.len(),
                        data: (i, buf.len()),
                        done: eof,
                    });
                }
                _ => {
                    let Some(&b) = buf.get(i) else { break };
                    i += 1;
                    self.framing_byte(b)?;
                    continue;
                }
            };
            let avail = buf.len() - i;
            if avail == 0 {
                break;
            }
            // The smaller of the two fits usize because avail does.
            let take = data_len.min(avail as u64) as usize;
            let left = data_len - take as u64;
            self.state = match (self.state, left) {
                (BodyState::Length(_), 0) => BodyState::Done,
                (BodyState::Length(_), _) => BodyState::Length(left),
                (_, 0) => BodyState::ChunkDataCr,
                (_, _) => BodyState::ChunkData(left),
            };
            let done = self.state == BodyState::Done;
            if eof && !done && i + take == buf.len() {
                // Nothing more will come: say so now rather than on the
                // next call, so a caller at EOF needs no extra round.
                return Err(BodyError::Truncated);
            }
            return Ok(BodyStep {
                consumed: i + take,
                data: (i, i + take),
                done,
            });
        }
        if eof {
            return Err(BodyError::Truncated);
        }
        Ok(BodyStep {
            consumed: i,
            data: (i, i),
            done: false,
        })
    }

    /// Advances the chunked framing by one byte.
    fn framing_byte(&mut self, b: u8) -> Result<(), BodyError> {
        self.state = match self.state {
            BodyState::ChunkSize { size, digits } => match (char::from(b).to_digit(16), b) {
                (Some(d), _) => {
                    // 15 hex digits is already over any sane limit; 16 would overflow.
                    if digits >= 15 {
                        return Err(BodyError::BadChunk);
                    }
                    BodyState::ChunkSize {
                        size: (size << 4) | u64::from(d),
                        digits: digits + 1,
                    }
                }
                (None, _) if digits == 0 => return Err(BodyError::BadChunk),
                (None, b'\r') => BodyState::ChunkSizeLf { size },
                (None, b' ' | b'\t' | b';') => {
                    self.framing = 1;
                    BodyState::ChunkExt { size }
                }
                (None, _) => return Err(BodyError::BadChunk),
            },
            BodyState::ChunkExt { size } => match b {
                b'\r' => BodyState::ChunkSizeLf { size },
                b'\n' => return Err(BodyError::BadChunk),
                _ => {
                    self.count_framing()?;
                    BodyState::ChunkExt { size }
                }
            },
            BodyState::ChunkSizeLf { size } => {
                if b != b'\n' {
                    return Err(BodyError::BadChunk);
                }
                if size == 0 {
                    self.framing = 0;
                    BodyState::TrailerStart
                } else {
                    if size > self.limit - self.seen {
                        return Err(BodyError::TooLarge { limit: self.limit });
                    }
                    self.seen += size;
                    BodyState::ChunkData(size)
                }
            }
            BodyState::ChunkDataCr if b == b'\r' => BodyState::ChunkDataLf,
            BodyState::ChunkDataLf if b == b'\n' => BodyState::ChunkSize { size: 0, digits: 0 },
            BodyState::TrailerStart if b == b'\r' => BodyState::TrailerEndLf,
            BodyState::TrailerStart | BodyState::TrailerLine if b != b'\n' => {
                self.count_framing()?;
                BodyState::TrailerLine
            }
            BodyState::TrailerLine => BodyState::TrailerStart,
            BodyState::TrailerEndLf if b == b'\n' => BodyState::Done,
            _ => return Err(BodyError::BadChunk),
        };
        Ok(())
    }

    fn count_framing(&mut self) -> Result<(), BodyError> {
        self.framing += 1;
        if self.framing > MAX_HEAD {
            Err(BodyError::BadChunk)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(head: &str) -> Request {
        parse_request(head.as_bytes(), MAX_HEAD).unwrap().unwrap().0
    }

    fn resp(head: &str) -> Response {
        parse_response(head.as_bytes(), MAX_HEAD)
            .unwrap()
            .unwrap()
            .0
    }

    #[test]
    fn parse_request_table() {
        let full = "GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Y:  z \r\n\r\nBODY";
        let (r, n) = parse_request(full.as_bytes(), MAX_HEAD).unwrap().unwrap();
        assert_eq!(n, full.len() - 4);
        assert_eq!(
            (r.method.as_str(), r.target.as_str(), r.minor_version),
            ("GET", "/a?b=1", 1)
        );
        assert_eq!(r.header("x-y"), Some(&b"z"[..]));
        assert_eq!(r.header("missing"), None);

        // Incomplete within the limit: wait; at or over it: too large.
        assert_eq!(parse_request(&full.as_bytes()[..20], MAX_HEAD), Ok(None));
        assert_eq!(
            parse_request(&full.as_bytes()[..20], 20),
            Err(HeadError::TooLarge { limit: 20 })
        );
        assert_eq!(
            parse_request(full.as_bytes(), 30),
            Err(HeadError::TooLarge { limit: 30 })
        );
        // The head fits exactly; the bytes after it do not count.
        assert!(parse_request(full.as_bytes(), n).unwrap().is_some());

        let many: String = (0..=MAX_HEADERS).map(|i| format!("H{i}: v\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(
            parse_request(many.as_bytes(), MAX_HEAD),
            Err(HeadError::TooManyHeaders)
        );
        for bad in [
            "GET / HTTP/2.0\r\n\r\n",
            "GET /\0 HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Name: v\r\n\r\n",
        ] {
            assert!(
                matches!(
                    parse_request(bad.as_bytes(), MAX_HEAD),
                    Err(HeadError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn request_body_kind_table() {
        use BodyKind::*;
        let cases: &[(&str, Result<BodyKind, HeadError>)] = &[
            ("", Ok(Empty)),
            ("Content-Length: 12\r\n", Ok(Length(12))),
            ("Content-Length: 0\r\n", Ok(Length(0))),
            ("Content-Length: 5\r\ncontent-length: 5\r\n", Ok(Length(5))),
            ("Content-Length: 5, 5\r\n", Ok(Length(5))),
            (
                "Content-Length: 5\r\nContent-Length: 6\r\n",
                Err(HeadError::BadContentLength),
            ),
            ("Content-Length: +5\r\n", Err(HeadError::BadContentLength)),
            ("Content-Length: 5 5\r\n", Err(HeadError::BadContentLength)),
            ("Content-Length: \r\n", Err(HeadError::BadContentLength)),
            (
                "Content-Length: 99999999999999999999\r\n",
                Err(HeadError::BadContentLength),
            ),
            ("Transfer-Encoding: chunked\r\n", Ok(Chunked)),
            ("Transfer-Encoding: Chunked\r\n", Ok(Chunked)),
            (
                "Transfer-Encoding: gzip, chunked\r\n",
                Err(HeadError::UnsupportedTransferEncoding),
            ),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                Err(HeadError::UnsupportedTransferEncoding),
            ),
            (
                "Transfer-Encoding: identity\r\n",
                Err(HeadError::UnsupportedTransferEncoding),
            ),
            (
                "Transfer-Encoding: \r\n",
                Err(HeadError::UnsupportedTransferEncoding),
            ),
            (
                "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                Err(HeadError::BadContentLength),
            ),
        ];
        for (headers, want) in cases {
            let r = req(&format!("POST / HTTP/1.1\r\n{headers}\r\n"));
            assert_eq!(r.body_kind(), *want, "{headers:?}");
        }
    }

    #[test]
    fn response_body_kind_table() {
        use BodyKind::*;
        let cases: &[(&str, &str, &str, BodyKind)] = &[
            ("GET", "200 OK", "Content-Length: 3\r\n", Length(3)),
            ("GET", "200 OK", "", UntilClose),
            (
                "GET",
                "200 OK",
                "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                Chunked,
            ),
            ("HEAD", "200 OK", "Content-Length: 3\r\n", Empty),
            ("GET", "101 Switching Protocols", "", Empty),
            ("GET", "204 No Content", "", Empty),
            ("GET", "304 Not Modified", "Content-Length: 3\r\n", Empty),
            ("CONNECT", "200 OK", "", Empty),
        ];
        for (method, status, headers, want) in cases {
            let r = resp(&format!("HTTP/1.1 {status}\r\n{headers}\r\n"));
            assert_eq!(
                r.body_kind(method),
                Ok(*want),
                "{method} {status} {headers:?}"
            );
        }
        let r = resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: br\r\n\r\n");
        assert_eq!(
            r.body_kind("GET"),
            Err(HeadError::UnsupportedTransferEncoding)
        );
    }

    #[test]
    fn keep_alive_table() {
        for (version, connection, want) in [
            ("1.1", "", true),
            ("1.1", "Connection: close\r\n", false),
            ("1.1", "Connection: foo, Close\r\n", false),
            ("1.0", "", false),
            ("1.0", "Connection: keep-alive\r\n", true),
        ] {
            let r = req(&format!("GET / HTTP/{version}\r\n{connection}\r\n"));
            assert_eq!(r.keep_alive(), want, "request {version} {connection:?}");
            let r = resp(&format!(
                "HTTP/{version} 200 OK\r\nContent-Length: 0\r\n{connection}\r\n"
            ));
            assert_eq!(r.keep_alive(), want, "response {version} {connection:?}");
        }
        // A body that ends with the connection cannot be followed by another.
        assert!(!resp("HTTP/1.1 200 OK\r\n\r\n").keep_alive());
    }

    #[test]
    fn writers_produce_what_the_parsers_read() {
        let mut out = Vec::new();
        write_response(&mut out, 413, &[("Content-Type", "text/plain")], b"too big");
        let (r, n) = parse_response(&out, MAX_HEAD).unwrap().unwrap();
        assert_eq!((r.status, r.reason.as_str()), (413, "Content Too Large"));
        assert_eq!(r.body_kind("POST"), Ok(BodyKind::Length(7)));
        assert_eq!(&out[n..], b"too big");

        let mut out = Vec::new();
        write_request(&mut out, "POST", "/publish/x", &[("Host", b"h:1")], b"");
        let (r, n) = parse_request(&out, MAX_HEAD).unwrap().unwrap();
        assert_eq!(n, out.len());
        assert_eq!(r.body_kind(), Ok(BodyKind::Length(0)));
        let mut out = Vec::new();
        write_request(&mut out, "GET", "/", &[("Host", b"h:1")], b"");
        assert_eq!(
            req(std::str::from_utf8(&out).unwrap()).body_kind(),
            Ok(BodyKind::Empty)
        );

        let mut out = Vec::new();
        write_response_head(&mut out, 200, &[("Transfer-Encoding", "chunked")]);
        let head = out.len();
        write_chunk(&mut out, &[b'a'; 300]);
        write_chunk(&mut out, b"bc");
        write_chunk(&mut out, b"");
        assert_eq!(&out[head..head + 5], b"12c\r\n");
        let (r, n) = parse_response(&out, MAX_HEAD).unwrap().unwrap();
        assert_eq!(n, head);
        let mut body = BodyDecoder::new(r.body_kind("GET").unwrap(), 1000);
        let (data, rest) = drain(&mut body, &out[n..], 1).unwrap();
        assert_eq!(data.len(), 302);
        assert_eq!(rest, 0);
    }

    #[test]
    fn reason_phrases() {
        assert_eq!(reason_phrase(101), "Switching Protocols");
        assert_eq!(reason_phrase(426), "Upgrade Required");
        assert_eq!(reason_phrase(431), "Request Header Fields Too Large");
        assert_eq!(reason_phrase(799), "Unknown");
    }

    /// Feeds `input` `piece` bytes at a time (then EOF) until the body ends;
    /// returns the data and how many bytes were left after the body.
    fn drain(
        dec: &mut BodyDecoder,
        input: &[u8],
        piece: usize,
    ) -> Result<(Vec<u8>, usize), BodyError> {
        let mut data = Vec::new();
        let mut start = 0;
        let mut end = 0;
        loop {
            let eof = end == input.len();
            let step = dec.decode(&input[start..end], eof)?;
            assert!(step.data.0 <= step.data.1 && step.data.1 <= step.consumed);
            data.extend_from_slice(&input[start + step.data.0..start + step.data.1]);
            start += step.consumed;
            if step.done {
                return Ok((data, input.len() - start));
            }
            if step.consumed == 0 || start == end {
                end = (end + piece).min(input.len());
            }
        }
    }

    /// Found by the `http_response` fuzz target: a Content-Length body cut
    /// short by EOF handed out its last data as a normal step, and only the
    /// next call said it was truncated; a caller that stopped at EOF never
    /// learnt the body was incomplete.
    #[test]
    fn truncated_body_at_eof_fails_in_the_same_call() {
        for (kind, input) in [
            (BodyKind::Length(9), &b"not here"[..]),
            (BodyKind::Chunked, b"9\r\nnot here"),
        ] {
            let mut dec = BodyDecoder::new(kind, 100);
            let mut seen = 0;
            let err = loop {
                match dec.decode(&input[seen..], true) {
                    Ok(step) => {
                        assert!(!step.done && step.consumed > 0, "{kind:?} stalled at EOF");
                        seen += step.consumed;
                    }
                    Err(e) => break e,
                }
            };
            assert_eq!(err, BodyError::Truncated, "{kind:?}");
            assert!(
                seen < input.len(),
                "{kind:?}: the data step itself must fail"
            );
        }
    }

    #[test]
    fn body_decoder_table() {
        use BodyKind::*;
        type Case = (
            BodyKind,
            &'static [u8],
            Result<(&'static [u8], usize), BodyError>,
        );
        let cases: &[Case] = &[
            (Empty, b"next", Ok((b"", 4))),
            (Length(0), b"", Ok((b"", 0))),
            (Length(3), b"abcd", Ok((b"abc", 1))),
            (Length(3), b"ab", Err(BodyError::Truncated)),
            (Length(11), b"", Err(BodyError::TooLarge { limit: 10 })),
            (UntilClose, b"all of it", Ok((b"all of it", 0))),
            (
                UntilClose,
                b"more than ten",
                Err(BodyError::TooLarge { limit: 10 }),
            ),
            (Chunked, b"3\r\nabc\r\n0\r\n\r\nX", Ok((b"abc", 1))),
            (
                Chunked,
                b"A\r\n0123456789\r\n0\r\n\r\n",
                Ok((b"0123456789", 0)),
            ),
            (
                Chunked,
                b"3;name=\"v\"\r\nabc\r\n0 ; x\r\nTrailer: 1\r\nT2: 2\r\n\r\n",
                Ok((b"abc", 0)),
            ),
            (Chunked, b"0000000003\r\nabc\r\n0\r\n\r\n", Ok((b"abc", 0))),
            (
                Chunked,
                b"b\r\n0123456789a\r\n0\r\n\r\n",
                Err(BodyError::TooLarge { limit: 10 }),
            ),
            (
                Chunked,
                b"6\r\nabcdef\r\n5\r\nabcde\r\n0\r\n\r\n",
                Err(BodyError::TooLarge { limit: 10 }),
            ),
            (Chunked, b"\r\n", Err(BodyError::BadChunk)),
            (Chunked, b"x\r\n", Err(BodyError::BadChunk)),
            (Chunked, b"3\nabc\r\n0\r\n\r\n", Err(BodyError::BadChunk)),
            (Chunked, b"3\r\nabcd\r\n0\r\n\r\n", Err(BodyError::BadChunk)),
            (Chunked, b"3\r\nabc\r\n0\r\n\n", Err(BodyError::BadChunk)),
            (Chunked, b"1000000000000000\r\n", Err(BodyError::BadChunk)),
            (Chunked, b"3\r\nabc\r\n", Err(BodyError::Truncated)),
            (Chunked, b"3\r\nabc\r\n0\r\n\r", Err(BodyError::Truncated)),
        ];
        for (kind, input, want) in cases {
            for piece in [1, 2, 3, 7, 1000] {
                let mut dec = BodyDecoder::new(*kind, 10);
                let got = drain(&mut dec, input, piece);
                let want = want.clone().map(|(d, rest)| (d.to_vec(), rest));
                assert_eq!(
                    got,
                    want,
                    "{kind:?} {:?} piece {piece}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }

    #[test]
    fn endless_chunk_framing_is_refused() {
        let mut dec = BodyDecoder::new(BodyKind::Chunked, 10);
        let mut ext = b"1;".to_vec();
        ext.resize(MAX_HEAD + 10, b'x');
        assert_eq!(dec.decode(&ext, false), Err(BodyError::BadChunk));
        let mut dec = BodyDecoder::new(BodyKind::Chunked, 10);
        let trailers = b"0\r\n"
            .iter()
            .chain(b"A: b\r\n".repeat(MAX_HEAD).iter())
            .copied()
            .collect::<Vec<_>>();
        assert_eq!(dec.decode(&trailers, false), Err(BodyError::BadChunk));
    }
}
