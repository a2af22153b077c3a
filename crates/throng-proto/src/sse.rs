//! Server-Sent Events (the WHATWG HTML "server-sent events" section), both
//! sides: the server's writes one event as the bytes of a
//! `text/event-stream`; the client's ([`parse`]) reads the events back out
//! of the bytes received, as a browser's `EventSource` does.
//!
//! An event is `id:` (when it has one), `event:` (when it is not a plain
//! message), one `data:` line per line of the payload (a payload's CR, LF
//! and CRLF each end a line, as a client splits them; the client joins the
//! lines back with LF), and an empty line. A payload that is not UTF-8 is
//! sent base64-encoded (standard alphabet, padded) as an event of type
//! [`BINARY`], since an event stream is UTF-8 text.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use thiserror::Error;

/// The event type of a binary payload sent in base64.
pub const BINARY: &str = "binary";

/// A comment line: what a client ignores, sent to keep the stream alive.
pub const KEEP_ALIVE: &[u8] = b":\n";

/// Appends one event: `id`, `event` type (none: a `message`), and `data`
/// (UTF-8 text, split into `data:` lines).
pub fn event(out: &mut Vec<u8>, id: Option<&str>, event: Option<&str>, data: &str) {
    if let Some(id) = id {
        field(out, "id", id);
    }
    if let Some(event) = event {
        field(out, "event", event);
    }
    let mut rest = data;
    loop {
        match rest.find(['\r', '\n']) {
            None => {
                field(out, "data", rest);
                break;
            }
            Some(i) => {
                field(out, "data", &rest[..i]);
                let crlf = rest[i..].starts_with("\r\n");
                rest = &rest[i + if crlf { 2 } else { 1 }..];
            }
        }
    }
    out.push(b'\n');
}

/// Appends one message: text as it is, anything else in base64 as a
/// [`BINARY`] event.
pub fn message(out: &mut Vec<u8>, id: Option<&str>, payload: &[u8], text: bool) {
    match std::str::from_utf8(payload) {
        Ok(s) if text => event(out, id, None, s),
        _ => event(out, id, Some(BINARY), &BASE64.encode(payload)),
    }
}

/// Appends the `retry:` hint: how long a client waits before reconnecting.
pub fn retry(out: &mut Vec<u8>, millis: u64) {
    out.extend_from_slice(format!("retry: {millis}\n\n").as_bytes());
}

/// Why received bytes are not an event stream a client can go on reading.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ParseError {
    /// An event (the lines up to its empty line) longer than the limit.
    #[error("an event longer than {0} bytes")]
    TooLong(usize),
    /// A [`BINARY`] event whose data is not base64.
    #[error("a binary event whose data is not base64")]
    Base64,
}

/// One event as a client dispatches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<'a> {
    /// The `event:` type; `None` for a plain `message`.
    pub kind: Option<&'a [u8]>,
    /// The `data:` lines joined with LF; borrowed when there was one line.
    pub data: Cow<'a, [u8]>,
}

impl Event<'_> {
    /// The payload: the data, or for a [`BINARY`] event its bytes decoded
    /// from base64.
    pub fn payload(&self) -> Result<Cow<'_, [u8]>, ParseError> {
        if self.kind == Some(BINARY.as_bytes()) {
            BASE64
                .decode(&self.data)
                .map(Cow::Owned)
                .map_err(|_| ParseError::Base64)
        } else {
            Ok(Cow::Borrowed(&self.data))
        }
    }
}

/// What one block of lines (up to an empty line) held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    /// Bytes of the input the block took, its empty line included.
    pub consumed: usize,
    /// The last `id:` of the block (the stream's last event id from now on).
    pub id: Option<&'a [u8]>,
    /// The `retry:` of the block, milliseconds.
    pub retry: Option<u64>,
    /// The event, when the block had `data:` (comments, `retry:` and the
    /// like dispatch nothing).
    pub event: Option<Event<'a>>,
}

/// Reads the first whole block of lines of `buf` (a `data:` is not
/// dispatched before its empty line comes): `Ok(None)` until one is there.
///
/// Lines end with CR, LF or CRLF. A block ended by a lone CR just before
/// an LF that has not arrived yet leaves that LF to be read as an empty
/// block, which dispatches nothing, so no state is kept between calls: the
/// caller keeps the bytes after `consumed`. Comment lines before a block's
/// first field (keep-alives) are taken on their own, so an idle stream of
/// them leaves nothing for the caller to keep. A block longer than `limit`
/// bytes without its end is an error, so a stream that never ends an event
/// cannot take unbounded memory. A byte-order mark at the start of the
/// stream is the caller's to skip.
pub fn parse(buf: &[u8], limit: usize) -> Result<Option<Parsed<'_>>, ParseError> {
    let mut parsed = Parsed {
        consumed: 0,
        id: None,
        retry: None,
        event: None,
    };
    let mut kind = None;
    let mut data: Option<Cow<'_, [u8]>> = None;
    let mut at = 0;
    // Whether the block has had a line other than a comment.
    let mut fields = false;
    loop {
        let Some(len) = buf[at..].iter().position(|&b| b == b'\r' || b == b'\n') else {
            return too_long(buf, limit);
        };
        let line = &buf[at..at + len];
        let mut next = at + len + 1;
        if buf[at + len] == b'\r' && buf.get(next) == Some(&b'\n') {
            next += 1;
        }
        at = next;
        if line.is_empty() {
            break;
        }
        if line.first() == Some(&b':') {
            if !fields {
                // Comments before any field of a block (keep-alives) are
                // taken at once: a stream of them with no event between
                // would otherwise pile up, unread, until the next event.
                parsed.consumed = at;
                return Ok(Some(parsed));
            }
            continue;
        }
        fields = true;
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => {
                data = Some(match data {
                    None => Cow::Borrowed(value),
                    Some(joined) => {
                        let mut joined = joined.into_owned();
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                        Cow::Owned(joined)
                    }
                });
            }
            b"event" => kind = Some(value),
            // The spec ignores an id with NUL in it.
            b"id" if !value.contains(&0) => parsed.id = Some(value),
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                parsed.retry = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            }
            _ => {}
        }
    }
    if at > limit {
        return Err(ParseError::TooLong(limit));
    }
    parsed.consumed = at;
    parsed.event = data.map(|data| Event {
        kind: kind.filter(|k| !k.is_empty() && *k != b"message"),
        data,
    });
    Ok(Some(parsed))
}

/// No whole block in `buf` yet: wait for more, unless it is over `limit`.
fn too_long(buf: &[u8], limit: usize) -> Result<Option<Parsed<'_>>, ParseError> {
    if buf.len() > limit {
        Err(ParseError::TooLong(limit))
    } else {
        Ok(None)
    }
}

/// One `name: value` line. Values never hold CR or LF here: ids and event
/// types are the server's own, data was split at them.
fn field(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(id: Option<&str>, payload: &[u8], text: bool) -> String {
        let mut out = Vec::new();
        message(&mut out, id, payload, text);
        String::from_utf8(out).unwrap()
    }

    /// What the client's parser makes of a stream: (id, type, data) per
    /// dispatched event, the id being the last one seen so far (a trailing
    /// comment with no empty line after it is left unread).
    fn parse(stream: &str) -> Vec<(String, String, String)> {
        let mut got = Vec::new();
        let mut id = String::new();
        let mut rest = stream.as_bytes();
        while let Some(p) = super::parse(rest, 1 << 16).unwrap() {
            if let Some(i) = p.id {
                id = String::from_utf8(i.to_vec()).unwrap();
            }
            if let Some(e) = p.event {
                let kind = e.kind.map(|k| String::from_utf8(k.to_vec()).unwrap());
                let data = String::from_utf8(e.data.into_owned()).unwrap();
                got.push((id.clone(), kind.unwrap_or_default(), data));
            }
            rest = &rest[p.consumed..];
        }
        got
    }

    #[test]
    fn lines_of_every_kind_split_and_join_back_with_lf() {
        let s = one(Some("1-2"), b"a\nb\r\nc\rd", true);
        assert_eq!(s, "id: 1-2\ndata: a\ndata: b\ndata: c\ndata: d\n\n");
        assert_eq!(
            parse(&s),
            [("1-2".into(), String::new(), "a\nb\nc\nd".into())]
        );
        let s = one(None, b"", true);
        assert_eq!(s, "data: \n\n");
        assert_eq!(parse(&s), [(String::new(), String::new(), String::new())]);
        let s = one(None, b"end\n", true);
        assert_eq!(parse(&s)[0].2, "end\n");
        let s = one(None, b" lead: colon", true);
        assert_eq!(parse(&s)[0].2, " lead: colon", "only one space is taken");
    }

    #[test]
    fn binary_and_non_utf8_go_in_base64_as_binary_events() {
        let s = one(Some("1-3"), &[0, 159, 146, 150], false);
        assert_eq!(s, "id: 1-3\nevent: binary\ndata: AJ+Slg==\n\n");
        let s = one(None, &[0xff, b'\n'], true);
        assert_eq!(
            parse(&s)[0].1,
            BINARY,
            "not UTF-8: base64 whatever was asked"
        );
        let s = one(None, b"text", false);
        assert_eq!(
            parse(&s)[0],
            (String::new(), BINARY.into(), "dGV4dA==".into())
        );
    }

    #[test]
    fn retry_and_keep_alive_dispatch_nothing() {
        let mut out = Vec::new();
        retry(&mut out, 1500);
        out.extend_from_slice(KEEP_ALIVE);
        let s = String::from_utf8(out).unwrap();
        assert_eq!(s, "retry: 1500\n\n:\n");
        assert!(parse(&s).is_empty());
    }

    /// Every way of splitting a stream gives the same events: the caller
    /// keeps what `parse` did not take and adds what comes next.
    fn parse_split(stream: &[u8], cut: usize) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
        let mut got = Vec::new();
        let mut held = stream[..cut].to_vec();
        let mut feed = vec![&stream[cut..]];
        loop {
            while let Some(p) = super::parse(&held, 1 << 16).unwrap() {
                if let Some(e) = p.event {
                    got.push((
                        e.kind.map(<[u8]>::to_vec),
                        e.payload().unwrap().into_owned(),
                    ));
                }
                held.drain(..p.consumed);
            }
            match feed.pop() {
                Some(more) => held.extend_from_slice(more),
                None => break,
            }
        }
        got
    }

    #[test]
    fn a_client_reads_the_spec_s_stream_forms() {
        let s =
            ": keep-alive\r\nretry: 2000\r\n\r\nid: 7\rdata:a\rdata\r\revent: message\ndata: b\n\n";
        assert_eq!(
            parse(s),
            [
                ("7".into(), String::new(), "a\n".into()),
                ("7".into(), String::new(), "b".into())
            ],
            "CR, LF, CRLF; no space after the colon; a bare `data`; `message` is no type"
        );
        let p = super::parse(b"retry: 2000\n\n", 64).unwrap().unwrap();
        assert_eq!((p.retry, p.event, p.consumed), (Some(2000), None, 13));
        let p = super::parse(b"retry: 2s\nid: a\0b\nfoo: 1\n\n", 64)
            .unwrap()
            .unwrap();
        assert_eq!((p.retry, p.id), (None, None), "ignored as the spec says");
        assert_eq!(
            super::parse(b"data: a\n", 64),
            Ok(None),
            "not dispatched yet"
        );
        assert_eq!(
            super::parse(b"data: a\n\r", 64).unwrap().unwrap().consumed,
            9
        );
    }

    #[test]
    fn any_split_of_a_stream_gives_the_same_events() {
        let mut stream = Vec::new();
        stream.extend_from_slice(b"retry: 2000\r\n\r\n:\r\n");
        message(&mut stream, Some("1-1"), b"t1 1 5 ..", true);
        message(&mut stream, Some("1-2"), b"two\r\nlines", true);
        message(&mut stream, Some("1-3"), &[0, 255, 10, 13], false);
        let crlf: Vec<u8> = stream
            .iter()
            .flat_map(|&b| {
                if b == b'\n' {
                    vec![b'\r', b'\n']
                } else {
                    vec![b]
                }
            })
            .collect();
        let want = vec![
            (None, b"t1 1 5 ..".to_vec()),
            (None, b"two\nlines".to_vec()),
            (Some(BINARY.as_bytes().to_vec()), vec![0, 255, 10, 13]),
        ];
        for s in [&stream, &crlf] {
            for cut in 0..=s.len() {
                assert_eq!(parse_split(s, cut), want, "cut at {cut}");
            }
        }
    }

    #[test]
    fn keep_alives_with_no_event_after_them_are_taken_at_once() {
        let p = super::parse(b":\n:", 64).unwrap().unwrap();
        assert_eq!((p.consumed, p.event), (2, None), "nothing left to keep");
        assert_eq!(super::parse(b":", 64), Ok(None));
        let p = super::parse(b": ping\r\ndata: a\n\n", 64).unwrap().unwrap();
        assert_eq!((p.consumed, p.event), (8, None));
        let p = super::parse(b"data: a\n: in the block\ndata: b\n\n", 64)
            .unwrap()
            .unwrap();
        assert_eq!(
            p.event.unwrap().data,
            &b"a\nb"[..],
            "a comment inside a block is skipped"
        );
    }

    #[test]
    fn an_endless_event_and_bad_base64_are_errors() {
        let long = format!("data: {}", "x".repeat(100));
        assert_eq!(
            super::parse(long.as_bytes(), 64),
            Err(ParseError::TooLong(64))
        );
        assert_eq!(super::parse(&long.as_bytes()[..60], 64), Ok(None));
        let ended = format!("{long}\n\n");
        assert_eq!(
            super::parse(ended.as_bytes(), 64),
            Err(ParseError::TooLong(64))
        );
        let p = super::parse(b"event: binary\ndata: *\n\n", 64)
            .unwrap()
            .unwrap();
        assert_eq!(p.event.unwrap().payload(), Err(ParseError::Base64));
    }
}
