//! `POST /publish/<channel>`: read the body (`Content-Length` or chunked, at
//! most `--max-message`), decide text or binary, and ask the supervisor to
//! relay it. The answer comes once every worker has taken the message and
//! counted its subscribers, before they are written to (the JSON says so:
//! `"counted":"at relay, before delivery"`), so it does not wait for a
//! fan-out to a million subscribers.
//!
//! `?retain=1` also makes the message its channel's retained message (an
//! empty body clears it), which each new MQTT subscription of the channel
//! gets first (docs/mqtt.md); it is delivered live as any publish.

use bytes::Bytes;
use throng_proto::http::{BodyDecoder, BodyError, BodyKind, HeadError, Request};
use tokio::io::AsyncReadExt as _;

use super::{refuse, reply};
use crate::channel;
use crate::tls::stream::Io;
use crate::worker::gate;
use crate::worker::state::Worker;
use crate::worker::supervisor_link::PublishError;

/// A message read from a publish request.
pub(super) struct Published {
    pub(super) channel: String,
    /// Send as a text frame (else binary).
    pub(super) text: bool,
    pub(super) body: Vec<u8>,
}

/// `POST /publish/<channel>`. Returns whether the connection stays open.
pub(crate) async fn serve(w: &Worker, stream: &mut Io, req: &Request, buf: &mut Vec<u8>) -> bool {
    // Who may publish, before the body is read (a bad channel name is
    // read_message's 400).
    if let Ok(channel) = channel::from_target(&req.target, "/publish/")
        && let Err(why) = gate::may_publish(w, req, channel)
    {
        Box::pin(gate::refuse(w, stream, why)).await;
        return false;
    }
    let retain = match retain(&req.target) {
        Ok(retain) => retain,
        Err(why) => {
            w.counters.handshake_failed("bad_retain");
            return refuse(w, stream, 400, why).await;
        }
    };
    let m = match read_message(w, stream, req, buf, "/publish/").await {
        Ok(m) => m,
        Err(keep) => return keep,
    };
    w.counters.http_request("publish");
    // An HTTP publish is QoS 1 to subscribers who ask for it: so is its
    // retained copy.
    let qos = retain.then_some(1);
    let retained = if m.body.is_empty() { "cleared" } else { "set" };
    match w
        .supervisor
        .publish(&m.channel, m.text, Bytes::from(m.body), qos)
        .await
    {
        Err(refused @ PublishError::Refused(_)) => {
            let msg = format!("{refused}\n");
            let keep = req.keep_alive();
            reply(w, stream, 503, "text/plain", msg.as_bytes(), keep).await
        }
        Ok(p) => {
            // Redis counts the connections that received the message (the
            // subscribed nodes, plus any other client), not WebSocket subscribers.
            let mut json = if w.cfg.redis_mode.is_some() {
                serde_json::json!({ "channel": m.channel, "redis_receivers": p.subscribers })
            } else {
                serde_json::json!({
                    "channel": m.channel,
                    "subscribers": p.subscribers,
                    "counted": "at relay, before delivery",
                })
            };
            if !p.message.is_none() {
                json["id"] = p.message.to_string().into();
            }
            if retain {
                json["retained"] = retained.into();
            }
            let json = json.to_string() + "\n";
            let keep = req.keep_alive();
            reply(w, stream, 200, "application/json", json.as_bytes(), keep).await
        }
        Err(PublishError::Gone) => refuse(w, stream, 503, "supervisor unavailable\n").await,
    }
}

/// Whether the target's query asks to retain the message (`retain=1` or
/// `retain=true`; `0`, `false` or no `retain`: not), or why it cannot be read.
fn retain(target: &str) -> Result<bool, &'static str> {
    let Some((_, query)) = target.split_once('?') else {
        return Ok(false);
    };
    let mut retain = false;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "retain" {
            continue;
        }
        retain = match v {
            "1" | "true" => true,
            "0" | "false" => false,
            _ => {
                return Err(
                    "retain takes 1 or 0 (?retain=1 keeps the message as the channel's retained message)\n",
                );
            }
        };
    }
    Ok(retain)
}

/// `/publish` with a method other than `POST`: 405, and the connection closes.
pub(crate) async fn refuse_method(w: &Worker, stream: &mut Io) -> bool {
    w.counters.handshake_failed("method");
    refuse(w, stream, 405, "publish with POST /publish/<channel>\n").await
}

/// Why a publish body could not be read.
enum BodyFail {
    TooLarge,
    Malformed,
    Closed,
}

/// Reads the channel (the path after `prefix`) and the body of a publish
/// request; `Err` when it was refused (answered already: whether the
/// connection stays open).
pub(super) async fn read_message(
    w: &Worker,
    stream: &mut Io,
    req: &Request,
    buf: &mut Vec<u8>,
    prefix: &str,
) -> Result<Published, bool> {
    let name = match channel::from_target(&req.target, prefix) {
        Ok(name) => name.to_owned(),
        Err(e) => {
            w.counters.handshake_failed("bad_channel");
            return Err(refuse(w, stream, 400, &format!("{e}\n")).await);
        }
    };
    let kind = match req.body_kind() {
        Ok(kind) => kind,
        Err(e) => {
            w.counters.handshake_failed("bad_body");
            let status = if matches!(e, HeadError::UnsupportedTransferEncoding) {
                501
            } else {
                400
            };
            return Err(refuse(w, stream, status, &format!("{e}\n")).await);
        }
    };
    let max = w.cfg.max_message;
    if let BodyKind::Length(n) = kind
        && n > max as u64
    {
        w.counters.handshake_failed("too_large");
        let msg = format!("message of {n} bytes is over --max-message ({max} bytes)\n");
        return Err(refuse(w, stream, 413, &msg).await);
    }
    if req
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"))
    {
        let _ = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
    }
    let body =
        tokio::time::timeout(w.cfg.handshake_timeout, read_body(stream, buf, kind, max)).await;
    let body = match body {
        Ok(Ok(body)) => body,
        Ok(Err(BodyFail::TooLarge)) => {
            w.counters.handshake_failed("too_large");
            let msg = format!("message is over --max-message ({max} bytes)\n");
            return Err(refuse(w, stream, 413, &msg).await);
        }
        Ok(Err(BodyFail::Malformed)) => {
            w.counters.handshake_failed("bad_body");
            return Err(refuse(w, stream, 400, "malformed chunked body\n").await);
        }
        Ok(Err(BodyFail::Closed)) => {
            w.counters.handshake_failed("incomplete_body");
            return Err(false);
        }
        Err(_) => {
            w.counters.handshake_failed("timeout");
            return Err(false);
        }
    };
    match text_or_binary(req.header("content-type"), &body) {
        Ok(text) => Ok(Published {
            channel: name,
            text,
            body,
        }),
        Err(why) => {
            w.counters.handshake_failed("bad_body");
            Err(refuse(w, stream, 400, why).await)
        }
    }
}

async fn read_body(
    stream: &mut Io,
    buf: &mut Vec<u8>,
    kind: BodyKind,
    max: usize,
) -> Result<Vec<u8>, BodyFail> {
    let mut dec = BodyDecoder::new(kind, max as u64);
    let mut body = Vec::new();
    let mut eof = false;
    loop {
        let step = dec.decode(buf, eof).map_err(|e| match e {
            BodyError::TooLarge { .. } => BodyFail::TooLarge,
            _ => BodyFail::Malformed,
        })?;
        body.extend_from_slice(&buf[step.data.0..step.data.1]);
        buf.drain(..step.consumed);
        if step.done {
            return Ok(body);
        }
        if eof {
            return Err(BodyFail::Closed);
        }
        if step.consumed == 0 || buf.is_empty() {
            buf.reserve(16 * 1024);
            match stream.read_buf(buf).await {
                Ok(0) => eof = true,
                Ok(_) => {}
                Err(_) => return Err(BodyFail::Closed),
            }
        }
        if body.len() > max {
            return Err(BodyFail::TooLarge);
        }
    }
}

/// Text frame or binary frame: as `Content-Type` says when it names a text
/// type (`text/*`, JSON) or `application/octet-stream`, else by whether the
/// body is valid UTF-8.
fn text_or_binary(ctype: Option<&[u8]>, body: &[u8]) -> Result<bool, &'static str> {
    let utf8 = std::str::from_utf8(body).is_ok();
    let Some(ct) = ctype else { return Ok(utf8) };
    let ct = String::from_utf8_lossy(ct).to_ascii_lowercase();
    if ct.starts_with("text/") || ct.contains("json") {
        return if utf8 {
            Ok(true)
        } else {
            Err("Content-Type says text but the body is not valid UTF-8\n")
        };
    }
    if ct.starts_with("application/octet-stream") {
        return Ok(false);
    }
    Ok(utf8)
}

#[cfg(test)]
mod tests {
    use super::{retain, text_or_binary};

    #[test]
    fn text_or_binary_by_content_type_then_utf8() {
        assert_eq!(text_or_binary(None, b"hi"), Ok(true));
        assert_eq!(text_or_binary(None, &[0xff, 0]), Ok(false));
        assert_eq!(
            text_or_binary(Some(b"application/octet-stream"), b"hi"),
            Ok(false)
        );
        assert_eq!(
            text_or_binary(Some(b"text/plain; charset=utf-8"), b"hi"),
            Ok(true)
        );
        assert_eq!(text_or_binary(Some(b"Application/JSON"), b"{}"), Ok(true));
        assert!(text_or_binary(Some(b"text/plain"), &[0xff]).is_err());
        assert_eq!(
            text_or_binary(Some(b"application/x-www-form-urlencoded"), b"a=1"),
            Ok(true)
        );
    }

    #[test]
    fn retain_is_read_from_the_query_and_anything_else_is_refused() {
        assert_eq!(retain("/publish/a"), Ok(false));
        assert_eq!(retain("/publish/a?retain=1"), Ok(true));
        assert_eq!(retain("/publish/a?x=2&retain=true"), Ok(true));
        assert_eq!(retain("/publish/a?retain=0"), Ok(false));
        assert_eq!(retain("/publish/a?retainer=1"), Ok(false));
        assert!(retain("/publish/a?retain=yes").is_err());
        assert!(retain("/publish/a?retain").is_err());
    }
}
