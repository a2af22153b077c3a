//! RESP2, the Redis protocol: commands out, replies and pub/sub pushes in.
//!
//! Commands are arrays of bulk strings ([`encode_command`]). Replies are
//! decoded incrementally ([`Decoder::decode`]): hand in what has arrived so
//! far, get a whole [`Value`] or "not yet". Every length a peer announces is
//! checked against [`Limits`] before any byte of it is waited for, so a
//! broken or hostile server costs at most the limits in memory, and bad
//! input is an error value, never a panic.
//!
//! Decoding is two passes over a complete value: a scan that finds where it
//! ends (without looking inside bulk payloads), then a build that slices the
//! payloads out of one frozen `Bytes` without copying them. A value that
//! arrives in pieces is rescanned per piece, which costs its headers, not its
//! payload bytes.

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

/// One RESP2 value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `+OK`: a status line.
    Simple(Bytes),
    /// `-ERR ...`: an error reply, as Redis worded it.
    Error(Bytes),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nfoo`; `None` is the null bulk string `$-1`.
    Bulk(Option<Bytes>),
    /// `*2\r\n...`; `None` is the null array `*-1`.
    Array(Option<Vec<Self>>),
}

impl Value {
    /// The bytes of a simple or bulk string.
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            Self::Simple(b) | Self::Bulk(Some(b)) => Some(b),
            _ => None,
        }
    }

    /// Appends the value's encoding to `out` (what a server would send).
    pub fn encode(&self, out: &mut impl BufMut) {
        match self {
            Self::Simple(s) => line(out, b'+', s),
            Self::Error(s) => line(out, b'-', s),
            Self::Integer(n) => line(out, b':', n.to_string().as_bytes()),
            Self::Bulk(None) => out.put_slice(b"$-1\r\n"),
            Self::Bulk(Some(b)) => bulk(out, b),
            Self::Array(None) => out.put_slice(b"*-1\r\n"),
            Self::Array(Some(items)) => {
                line(out, b'*', items.len().to_string().as_bytes());
                for v in items {
                    v.encode(out);
                }
            }
        }
    }
}

fn line(out: &mut impl BufMut, kind: u8, s: &[u8]) {
    out.put_u8(kind);
    out.put_slice(s);
    out.put_slice(b"\r\n");
}

fn bulk(out: &mut impl BufMut, b: &[u8]) {
    line(out, b'$', b.len().to_string().as_bytes());
    out.put_slice(b);
    out.put_slice(b"\r\n");
}

/// Appends a command (`PUBLISH chan payload`) as an array of bulk strings
/// (to a `Vec<u8>` or a `BytesMut`).
pub fn encode_command(out: &mut impl BufMut, args: &[&[u8]]) {
    line(out, b'*', args.len().to_string().as_bytes());
    for a in args {
        bulk(out, a);
    }
}

/// What a decoder accepts before it calls the input broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest bulk string payload.
    pub max_bulk: usize,
    /// Most elements in one array.
    pub max_array: usize,
    /// Deepest nesting of arrays (a pub/sub push is depth 1).
    pub max_depth: usize,
    /// Longest line (status, error, integer or length header), CRLF excluded.
    pub max_line: usize,
}

impl Default for Limits {
    /// Enough for pub/sub pushes and command replies of messages up to 64 MiB.
    fn default() -> Self {
        Self {
            max_bulk: 64 * 1024 * 1024,
            max_array: 1024,
            max_depth: 4,
            max_line: 64 * 1024,
        }
    }
}

/// Why the input is not RESP2 within the limits.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RespError {
    /// A type byte RESP2 does not have (RESP3 types included: we never ask for them).
    #[error("unknown RESP type byte {0:#04x}")]
    UnknownType(u8),
    /// A length or integer that is not a decimal number (or overflows).
    #[error("malformed number in RESP header")]
    BadNumber,
    /// A line with no CRLF within [`Limits::max_line`].
    #[error("RESP line longer than {0} bytes")]
    LineTooLong(usize),
    /// A bulk string that does not end in CRLF where its length says.
    #[error("bulk string not followed by CRLF")]
    MissingCrlf,
    /// A bulk string over [`Limits::max_bulk`].
    #[error("bulk string of {len} bytes is over the limit of {limit}")]
    BulkTooLarge {
        /// Announced length.
        len: i64,
        /// The limit.
        limit: usize,
    },
    /// An array over [`Limits::max_array`].
    #[error("array of {len} elements is over the limit of {limit}")]
    ArrayTooLarge {
        /// Announced length.
        len: i64,
        /// The limit.
        limit: usize,
    },
    /// Arrays nested deeper than [`Limits::max_depth`].
    #[error("arrays nested deeper than {0}")]
    TooDeep(usize),
}

/// An incremental RESP2 reply decoder.
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    limits: Limits,
}

impl Decoder {
    /// A decoder with these limits.
    pub fn new(limits: Limits) -> Self {
        Self { limits }
    }

    /// Takes one whole value off the front of `buf`. `Ok(None)`: not complete
    /// yet (nothing is consumed; call again when more bytes arrived). After
    /// an error the stream is out of step and the connection should go.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Value>, RespError> {
        let Some(end) = self.scan(buf, 0, 0)? else {
            return Ok(None);
        };
        let frame = buf.split_to(end).freeze();
        let (v, _) = build(&frame, 0);
        Ok(Some(v))
    }

    /// Where the value starting at `at` ends, checking limits; `None` if
    /// `buf` does not hold all of it yet.
    fn scan(&self, buf: &[u8], at: usize, depth: usize) -> Result<Option<usize>, RespError> {
        let Some(&kind) = buf.get(at) else {
            return Ok(None);
        };
        let Some((text, next)) = self.line(buf, at + 1)? else {
            return Ok(None);
        };
        match kind {
            b'+' | b'-' => Ok(Some(next)),
            b':' => number(text).map(|_| Some(next)),
            b'$' => {
                let len = number(text)?;
                if len == -1 {
                    return Ok(Some(next));
                }
                let n = usize::try_from(len)
                    .ok()
                    .filter(|&n| n <= self.limits.max_bulk)
                    .ok_or(RespError::BulkTooLarge {
                        len,
                        limit: self.limits.max_bulk,
                    })?;
                let end = next + n + 2;
                if buf.len() < end {
                    return Ok(None);
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return Err(RespError::MissingCrlf);
                }
                Ok(Some(end))
            }
            b'*' => {
                let len = number(text)?;
                if len == -1 {
                    return Ok(Some(next));
                }
                let n = usize::try_from(len)
                    .ok()
                    .filter(|&n| n <= self.limits.max_array)
                    .ok_or(RespError::ArrayTooLarge {
                        len,
                        limit: self.limits.max_array,
                    })?;
                if n > 0 && depth >= self.limits.max_depth {
                    return Err(RespError::TooDeep(self.limits.max_depth));
                }
                let mut pos = next;
                for _ in 0..n {
                    match self.scan(buf, pos, depth + 1)? {
                        Some(end) => pos = end,
                        None => return Ok(None),
                    }
                }
                Ok(Some(pos))
            }
            other => Err(RespError::UnknownType(other)),
        }
    }

    /// The line starting at `at` (without CRLF) and where the next begins.
    fn line<'a>(&self, buf: &'a [u8], at: usize) -> Result<Option<(&'a [u8], usize)>, RespError> {
        let rest = &buf[at.min(buf.len())..];
        let window = &rest[..rest.len().min(self.limits.max_line + 2)];
        match window.windows(2).position(|w| w == b"\r\n") {
            Some(i) => Ok(Some((&rest[..i], at + i + 2))),
            None if rest.len() >= self.limits.max_line + 2 => {
                Err(RespError::LineTooLong(self.limits.max_line))
            }
            None => Ok(None),
        }
    }
}

/// A decimal `i64` (RESP lengths and integers).
fn number(text: &[u8]) -> Result<i64, RespError> {
    let s = std::str::from_utf8(text).map_err(|_| RespError::BadNumber)?;
    // `str::parse` takes a leading '+', which RESP does not.
    if s.starts_with('+') {
        return Err(RespError::BadNumber);
    }
    s.parse().map_err(|_| RespError::BadNumber)
}

/// Builds the value at `at` of a frame that [`Decoder::scan`] accepted
/// whole; returns it and where the next value starts.
fn build(frame: &Bytes, at: usize) -> (Value, usize) {
    // The scan proved every header below is there and well formed, so the
    // fallbacks (an empty line, zero) are never taken.
    let kind = frame[at];
    let rest = &frame[at + 1..];
    let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap_or(0);
    let text = frame.slice(at + 1..at + 1 + eol);
    let next = at + 1 + eol + 2;
    let n = number(&text).unwrap_or(0);
    match kind {
        b'+' => (Value::Simple(text), next),
        b'-' => (Value::Error(text), next),
        b':' => (Value::Integer(n), next),
        b'$' if n < 0 => (Value::Bulk(None), next),
        b'$' => {
            let end = next + n as usize;
            (Value::Bulk(Some(frame.slice(next..end))), end + 2)
        }
        b'*' if n < 0 => (Value::Array(None), next),
        _ => {
            let mut items = Vec::with_capacity(n as usize);
            let mut pos = next;
            for _ in 0..n {
                let (v, end) = build(frame, pos);
                items.push(v);
                pos = end;
            }
            (Value::Array(Some(items)), pos)
        }
    }
}

/// A message a subscribed connection pushed to us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Push {
    /// `message <channel> <payload>` (from `SUBSCRIBE`; `smessage` from
    /// `SSUBSCRIBE`), or `pmessage
    /// <pattern> <channel> <payload>` (from `PSUBSCRIBE`).
    Message {
        /// The channel it was published on, as Redis names it.
        channel: Bytes,
        /// What was published.
        payload: Bytes,
    },
    /// A (un)subscription confirmation: `subscribe`, `psubscribe`,
    /// `unsubscribe`, `punsubscribe` (and `ssubscribe`, `sunsubscribe` of
    /// sharded pub/sub, also sent unasked when a slot moves away), with the channel or pattern and how many
    /// subscriptions this connection now has.
    Subscription {
        /// Which confirmation.
        kind: Bytes,
        /// The channel or pattern (null after unsubscribing from nothing).
        name: Option<Bytes>,
        /// Subscriptions left on this connection.
        count: i64,
    },
    /// The answer to `PING` on a subscribed connection.
    Pong,
}

impl Push {
    /// Reads a value received on a subscribed connection; `None` if it is
    /// not one of the pushes above (an error reply, say).
    pub fn parse(v: &Value) -> Option<Self> {
        let Value::Array(Some(items)) = v else {
            return None;
        };
        let kind = items.first()?.as_bytes()?;
        match (&kind[..], items.len()) {
            (b"message", 3) => Some(Self::Message {
                channel: items[1].as_bytes()?.clone(),
                payload: items[2].as_bytes()?.clone(),
            }),
            (b"pmessage", 4) => Some(Self::Message {
                channel: items[2].as_bytes()?.clone(),
                payload: items[3].as_bytes()?.clone(),
            }),
            // Sharded pub/sub (Redis 7): the same shapes under other names.
            (b"smessage", 3) => Some(Self::Message {
                channel: items[1].as_bytes()?.clone(),
                payload: items[2].as_bytes()?.clone(),
            }),
            (
                b"subscribe" | b"unsubscribe" | b"psubscribe" | b"punsubscribe" | b"ssubscribe"
                | b"sunsubscribe",
                3,
            ) => {
                let Value::Integer(count) = items[2] else {
                    return None;
                };
                Some(Self::Subscription {
                    kind: kind.clone(),
                    name: items[1].as_bytes().cloned(),
                    count,
                })
            }
            (b"pong", 2) => Some(Self::Pong),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> Result<Vec<Value>, RespError> {
        let mut buf = BytesMut::from(input);
        let d = Decoder::default();
        let mut out = Vec::new();
        while let Some(v) = d.decode(&mut buf)? {
            out.push(v);
        }
        assert!(buf.is_empty(), "left over: {buf:?}");
        Ok(out)
    }

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[test]
    fn command_encoding() {
        let mut out = BytesMut::new();
        encode_command(&mut out, &[b"PUBLISH", b"throng:c", b"hi"]);
        assert_eq!(
            &out[..],
            b"*3\r\n$7\r\nPUBLISH\r\n$8\r\nthrong:c\r\n$2\r\nhi\r\n"
        );
        let mut out = BytesMut::new();
        encode_command(&mut out, &[b"PING"]);
        assert_eq!(&out[..], b"*1\r\n$4\r\nPING\r\n");
    }

    #[test]
    fn every_reply_type() {
        let got = decode_all(
            b"+OK\r\n-WRONGPASS invalid\r\n:-12\r\n$-1\r\n$0\r\n\r\n$5\r\na\r\nbc\r\n*-1\r\n*0\r\n",
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                Value::Simple(b("OK")),
                Value::Error(b("WRONGPASS invalid")),
                Value::Integer(-12),
                Value::Bulk(None),
                Value::Bulk(Some(Bytes::new())),
                Value::Bulk(Some(b("a\r\nbc"))),
                Value::Array(None),
                Value::Array(Some(vec![])),
            ]
        );
    }

    #[test]
    fn pubsub_pushes() {
        let got = decode_all(
            b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n\
              *3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$2\r\nhi\r\n\
              *4\r\n$8\r\npmessage\r\n$8\r\nthrong:*\r\n$8\r\nthrong:a\r\n$1\r\nx\r\n\
              *2\r\n$4\r\npong\r\n$0\r\n\r\n\
              *3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n",
        )
        .unwrap();
        let pushes: Vec<_> = got.iter().map(|v| Push::parse(v).unwrap()).collect();
        assert_eq!(
            pushes,
            vec![
                Push::Subscription {
                    kind: b("subscribe"),
                    name: Some(b("news")),
                    count: 1
                },
                Push::Message {
                    channel: b("news"),
                    payload: b("hi")
                },
                Push::Message {
                    channel: b("throng:a"),
                    payload: b("x")
                },
                Push::Pong,
                Push::Subscription {
                    kind: b("unsubscribe"),
                    name: None,
                    count: 0
                },
            ]
        );
        assert_eq!(Push::parse(&Value::Integer(1)), None);
        assert_eq!(Push::parse(&Value::Array(Some(vec![]))), None);
    }

    #[test]
    fn incomplete_is_not_yet_and_consumes_nothing() {
        let whole = b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$2\r\nhi\r\n";
        let d = Decoder::default();
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(d.decode(&mut buf), Ok(None), "cut {cut}");
            assert_eq!(buf.len(), cut);
        }
    }

    #[test]
    fn refuses_bad_input() {
        let small = Decoder::new(Limits {
            max_bulk: 4,
            max_array: 2,
            max_depth: 1,
            max_line: 8,
        });
        let cases: &[(&[u8], RespError)] = &[
            (b"?x\r\n", RespError::UnknownType(b'?')),
            (b"%1\r\n", RespError::UnknownType(b'%')),
            (b":1x\r\n", RespError::BadNumber),
            (b":+1\r\n", RespError::BadNumber),
            (b"$\r\n", RespError::BadNumber),
            (b"$5\r\n", RespError::BulkTooLarge { len: 5, limit: 4 }),
            (b"$-2\r\n", RespError::BulkTooLarge { len: -2, limit: 4 }),
            (b"$2\r\nabcd", RespError::MissingCrlf),
            (b"*3\r\n", RespError::ArrayTooLarge { len: 3, limit: 2 }),
            (b"*1\r\n*1\r\n:1\r\n", RespError::TooDeep(1)),
            (b"+1234567890", RespError::LineTooLong(8)),
        ];
        for (input, want) in cases {
            let mut buf = BytesMut::from(*input);
            assert_eq!(
                small.decode(&mut buf).as_ref(),
                Err(want),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
        let mut buf = BytesMut::from(&b":99999999999999999999\r\n"[..]);
        assert_eq!(
            Decoder::default().decode(&mut buf),
            Err(RespError::BadNumber)
        );
        // A huge announced bulk is refused before any of it arrives.
        let mut buf = BytesMut::from(&b"$99999999999\r\n"[..]);
        assert!(matches!(
            Decoder::default().decode(&mut buf),
            Err(RespError::BulkTooLarge { .. })
        ));
    }
}
