//! Server-Sent Events (the WHATWG HTML "server-sent events" section), the
//! server's side: one event as the bytes of a `text/event-stream`.
//!
//! An event is `id:` (when it has one), `event:` (when it is not a plain
//! message), one `data:` line per line of the payload (a payload's CR, LF
//! and CRLF each end a line, as a client splits them; the client joins the
//! lines back with LF), and an empty line. A payload that is not UTF-8 is
//! sent base64-encoded (standard alphabet, padded) as an event of type
//! [`BINARY`], since an event stream is UTF-8 text.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

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

    /// What a client's parser makes of a stream (the spec's steps, cut to
    /// what this server sends): (id, type, data) per dispatched event.
    fn parse(stream: &str) -> Vec<(String, String, String)> {
        let mut got = Vec::new();
        let (mut id, mut kind, mut data) = (String::new(), String::new(), String::new());
        for line in stream.split('\n') {
            if line.is_empty() {
                if !data.is_empty() {
                    data.pop();
                    got.push((
                        id.clone(),
                        std::mem::take(&mut kind),
                        std::mem::take(&mut data),
                    ));
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match name {
                "id" => id = value.to_owned(),
                "event" => kind = value.to_owned(),
                "data" => {
                    data.push_str(value);
                    data.push('\n');
                }
                _ => {}
            }
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
}
