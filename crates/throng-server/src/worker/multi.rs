//! What a WebSocket connection of several channels (`throng.v1` opened at
//! `/`, docs/channels.md) may ask in its text frames, and the server's
//! answers: subscribe (after an id, to recover what it missed),
//! unsubscribe, publish, and refresh its token. Parsing and the answers'
//! bytes only; [`super::subscribers`] does what is asked.
//!
//! Every answer is a JSON object in a text frame, so it starts with `{`,
//! which a message frame never does (it starts with its channel's name).

use bytes::Bytes;
use serde_json::{Map, Value, json};
use throng_proto::ws::{self, OpCode};

use crate::channel;
use crate::history::MessageId;

/// One request from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// `{"subscribe":"a"}`, or `{"subscribe":"a","since":"<id>"}` to have
    /// what the channel kept after that id first; `"presence":true` to get
    /// the channel's joins and leaves too (`--presence`).
    Subscribe {
        channel: String,
        since: Option<MessageId>,
        presence: bool,
    },
    /// `{"unsubscribe":"a"}`.
    Unsubscribe { channel: String },
    /// `{"publish":"a","data":...}`: a string is sent as text, any other
    /// JSON value as its JSON text; `"data_base64"` instead is binary.
    Publish {
        channel: String,
        text: bool,
        payload: Vec<u8>,
    },
    /// `{"refresh":"<jwt>"}`: the token's grants and expiry replace the old.
    Refresh { token: String },
}

/// Why a frame is not a request: the text of the error answer, and the
/// op and channel it names when they could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadOp {
    pub(crate) why: String,
    pub(crate) op: Option<&'static str>,
    pub(crate) channel: Option<String>,
}

impl BadOp {
    fn new(why: impl Into<String>, op: Option<&'static str>, channel: Option<&str>) -> Self {
        Self {
            why: why.into(),
            op,
            channel: channel.map(str::to_owned),
        }
    }
}

/// The ops a request may name, and the fields each may carry beside it.
const OPS: [(&str, &[&str]); 4] = [
    ("subscribe", &["since", "presence"]),
    ("unsubscribe", &[]),
    ("publish", &["data", "data_base64"]),
    ("refresh", &[]),
];

/// Reads one text frame's request.
pub(crate) fn parse(frame: &[u8]) -> Result<Op, BadOp> {
    let value: Value = serde_json::from_slice(frame)
        .map_err(|e| BadOp::new(format!("not JSON: {e}"), None, None))?;
    let Value::Object(obj) = value else {
        return Err(BadOp::new(
            "a request is a JSON object such as {\"subscribe\":\"news\"}",
            None,
            None,
        ));
    };
    let named: Vec<_> = OPS.iter().filter(|(op, _)| obj.contains_key(*op)).collect();
    let &[&(op, extra)] = named.as_slice() else {
        return Err(BadOp::new(
            "a request names one of subscribe, unsubscribe, publish, refresh",
            None,
            None,
        ));
    };
    let Some(arg) = obj.get(op).and_then(Value::as_str) else {
        return Err(BadOp::new(format!("{op} takes a string"), Some(op), None));
    };
    let channel = (op != "refresh").then_some(arg);
    if let Some(k) = obj
        .keys()
        .find(|k| *k != op && !extra.contains(&k.as_str()))
    {
        return Err(BadOp::new(
            format!("unknown field {k:?}"),
            Some(op),
            channel,
        ));
    }
    if let Some(name) = channel
        && let Err(e) = channel::validate(name)
    {
        return Err(BadOp::new(e.to_string(), Some(op), channel));
    }
    let name = arg.to_owned();
    match op {
        "subscribe" => Ok(Op::Subscribe {
            since: since(&obj).map_err(|why| BadOp::new(why, Some(op), channel))?,
            presence: match obj.get("presence") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(BadOp::new(
                        "presence takes true or false",
                        Some(op),
                        channel,
                    ));
                }
            },
            channel: name,
        }),
        "unsubscribe" => Ok(Op::Unsubscribe { channel: name }),
        "publish" => {
            let (text, payload) = data(&obj).map_err(|why| BadOp::new(why, Some(op), channel))?;
            Ok(Op::Publish {
                channel: name,
                text,
                payload,
            })
        }
        _ => Ok(Op::Refresh { token: name }),
    }
}

/// A subscribe's `since`, if it has one.
fn since(obj: &Map<String, Value>) -> Result<Option<MessageId>, String> {
    match obj.get("since") {
        None => Ok(None),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|e| format!("since: {e}")),
        Some(_) => Err("since takes an id string such as \"1764043200000-42\"".into()),
    }
}

/// A publish's payload: whether it is text, and its bytes.
fn data(obj: &Map<String, Value>) -> Result<(bool, Vec<u8>), String> {
    match (obj.get("data"), obj.get("data_base64")) {
        (Some(Value::String(s)), None) => Ok((true, s.as_bytes().to_vec())),
        (Some(v), None) => Ok((true, v.to_string().into_bytes())),
        (None, Some(Value::String(b))) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map(|p| (false, p))
                .map_err(|e| format!("data_base64: {e}"))
        }
        (None, Some(_)) => Err("data_base64 takes a base64 string".into()),
        (None, None) => Err("publish needs data (or data_base64)".into()),
        (Some(_), Some(_)) => Err("publish takes data or data_base64, not both".into()),
    }
}

/// A text frame holding `v`.
fn frame(v: &Value) -> Bytes {
    ws::server_frame(OpCode::Text, v.to_string().as_bytes())
}

/// `{"subscribed":"a"}`.
pub(crate) fn subscribed(channel: &str) -> Bytes {
    frame(&json!({ "subscribed": channel }))
}

/// `{"unsubscribed":"a"}`, with the reason when the server ended it.
pub(crate) fn unsubscribed(channel: &str, reason: Option<&str>) -> Bytes {
    let mut v = json!({ "unsubscribed": channel });
    if let Some(r) = reason {
        v["reason"] = r.into();
    }
    frame(&v)
}

/// `{"published":"a","id":"<id>"}` (no id when the node gives none).
pub(crate) fn published(channel: &str, id: MessageId) -> Bytes {
    let mut v = json!({ "published": channel });
    if !id.is_none() {
        v["id"] = id.to_string().into();
    }
    frame(&v)
}

/// `{"refreshed":true,"expires":<unix second>}` (no `expires` without one).
pub(crate) fn refreshed(expires: u32) -> Bytes {
    let mut v = json!({ "refreshed": true });
    if expires != 0 {
        v["expires"] = expires.into();
    }
    frame(&v)
}

/// `{"error":"...","op":"subscribe","channel":"a"}`.
pub(crate) fn error(e: &BadOp) -> Bytes {
    let mut v = json!({ "error": e.why });
    if let Some(op) = e.op {
        v["op"] = op.into();
    }
    if let Some(c) = &e.channel {
        v["channel"] = c.as_str().into();
    }
    frame(&v)
}

/// The error answer to `op` on `channel`.
pub(crate) fn refusal(why: impl Into<String>, op: &'static str, channel: Option<&str>) -> Bytes {
    error(&BadOp::new(why, Some(op), channel))
}

/// The channels a request target names: every `channel=` of its query,
/// percent-decoded (a browser's `encodeURIComponent` escapes `/` and `:`).
pub(crate) fn channels_of(target: &str) -> Vec<String> {
    query_values(target, "channel=")
}

/// The channels whose joins and leaves a request target asks for: every
/// `presence=` of its query, percent-decoded.
pub(crate) fn presence_of(target: &str) -> Vec<String> {
    query_values(target, "presence=")
}

/// Every value of `key` (`name=`) in `target`'s query, percent-decoded.
fn query_values(target: &str, key: &str) -> Vec<String> {
    let Some((_, query)) = target.split_once('?') else {
        return Vec::new();
    };
    query
        .split('&')
        .filter_map(|kv| kv.strip_prefix(key))
        .map(unescape)
        .collect()
}

/// `s` with each `%XX` replaced by its byte; anything else as it is (a
/// name that is then not a channel is refused by its check).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) if b[i] == b'%' => {
                out.push(byte);
                i += 3;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(s: &str) -> BadOp {
        parse(s.as_bytes()).unwrap_err()
    }

    #[test]
    fn each_op_reads() {
        assert_eq!(
            parse(br#"{"subscribe":"a"}"#),
            Ok(Op::Subscribe {
                channel: "a".into(),
                since: None,
                presence: false
            })
        );
        assert_eq!(
            parse(br#"{"since":"5-6","subscribe":"a/b"}"#),
            Ok(Op::Subscribe {
                channel: "a/b".into(),
                since: Some(MessageId { epoch: 5, seq: 6 }),
                presence: false
            })
        );
        assert_eq!(
            parse(br#"{"subscribe":"a","presence":true}"#),
            Ok(Op::Subscribe {
                channel: "a".into(),
                since: None,
                presence: true
            })
        );
        assert_eq!(
            parse(br#"{"unsubscribe":"a"}"#),
            Ok(Op::Unsubscribe {
                channel: "a".into()
            })
        );
        assert_eq!(
            parse(br#"{"publish":"a","data":"hi"}"#),
            Ok(Op::Publish {
                channel: "a".into(),
                text: true,
                payload: b"hi".to_vec()
            })
        );
        assert_eq!(
            parse(br#"{"publish":"a","data":{"x":[1,2]}}"#),
            Ok(Op::Publish {
                channel: "a".into(),
                text: true,
                payload: br#"{"x":[1,2]}"#.to_vec()
            })
        );
        assert_eq!(
            parse(br#"{"publish":"a","data_base64":"AAE="}"#),
            Ok(Op::Publish {
                channel: "a".into(),
                text: false,
                payload: vec![0, 1]
            })
        );
        assert_eq!(
            parse(br#"{"refresh":"x.y.z"}"#),
            Ok(Op::Refresh {
                token: "x.y.z".into()
            })
        );
    }

    #[test]
    fn bad_requests_say_why_and_name_what_they_could_read() {
        assert!(bad("{nope").why.starts_with("not JSON"));
        assert!(bad("[1]").why.contains("JSON object"));
        assert!(bad(r#"{"join":"a"}"#).why.contains("one of subscribe"));
        assert!(
            bad(r#"{"subscribe":"a","unsubscribe":"a"}"#)
                .why
                .contains("one of")
        );
        let e = bad(r#"{"subscribe":"a","foo":1}"#);
        assert_eq!(
            (e.why.as_str(), e.op, e.channel.as_deref()),
            ("unknown field \"foo\"", Some("subscribe"), Some("a"))
        );
        let e = bad(r#"{"subscribe":"a b"}"#);
        assert_eq!(
            (e.op, e.channel.as_deref()),
            (Some("subscribe"), Some("a b"))
        );
        assert!(e.why.contains("may only contain"));
        assert_eq!(bad(r#"{"subscribe":7}"#).why, "subscribe takes a string");
        assert_eq!(
            bad(r#"{"subscribe":"a","presence":1}"#).why,
            "presence takes true or false"
        );
        assert!(
            bad(r#"{"subscribe":"a","since":"x"}"#)
                .why
                .starts_with("since:")
        );
        assert!(bad(r#"{"publish":"a"}"#).why.contains("needs data"));
        assert!(
            bad(r#"{"publish":"a","data":"x","data_base64":"AA=="}"#)
                .why
                .contains("not both")
        );
        assert!(
            bad(r#"{"publish":"a","data_base64":"!!"}"#)
                .why
                .starts_with("data_base64")
        );
        let e = bad(r#"{"refresh":"t","channel":"a"}"#);
        assert_eq!((e.op, e.channel), (Some("refresh"), None));
    }

    #[test]
    fn answers_are_json_text_frames() {
        let e = refusal("not granted", "subscribe", Some("a"));
        assert_eq!(
            e,
            ws::server_frame(
                OpCode::Text,
                br#"{"channel":"a","error":"not granted","op":"subscribe"}"#
            )
        );
        assert_eq!(
            published("a", MessageId::NONE),
            ws::server_frame(OpCode::Text, br#"{"published":"a"}"#)
        );
        assert_eq!(
            unsubscribed("a", Some("gone")),
            ws::server_frame(OpCode::Text, br#"{"reason":"gone","unsubscribed":"a"}"#)
        );
        assert_eq!(channels_of("/?channel=a&x=1&channel=b"), ["a", "b"]);
        assert_eq!(
            channels_of("/sse/?channel=a%2Fb%3Ac&channel=%zz"),
            ["a/b:c", "%zz"]
        );
        assert!(channels_of("/").is_empty());
        assert_eq!(
            presence_of("/?channel=a&presence=a&presence=b%2Fc"),
            ["a", "b/c"]
        );
    }
}
