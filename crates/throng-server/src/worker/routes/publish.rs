//! `POST /publish/<channel>`: read the body (`Content-Length` or chunked, at
//! most `--max-message`), decide text or binary, and ask the supervisor to
//! relay it; the answer counts the subscribers it reached.

use bytes::Bytes;
use throng_proto::http::{BodyDecoder, BodyError, BodyKind, HeadError, Request};
use tokio::io::AsyncReadExt as _;

use super::{refuse, reply};
use crate::channel;
use crate::tls::stream::Io;
use crate::worker::gate;
use crate::worker::state::Worker;

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
    let m = match read_message(w, stream, req, buf, "/publish/").await {
        Ok(m) => m,
        Err(keep) => return keep,
    };
    w.counters.http_request("publish");
    match w
        .link
        .publish(&m.channel, m.text, Bytes::from(m.body))
        .await
    {
        Some(Err(reason)) => {
            let msg = format!("cannot publish: {reason}\n");
            let keep = req.keep_alive();
            reply(w, stream, 503, "text/plain", msg.as_bytes(), keep).await
        }
        Some(Ok(p)) => {
            // Redis counts the connections that received the message (the
            // subscribed nodes, plus any other client), not WebSocket subscribers.
            let counted = if w.cfg.redis_mode.is_some() {
                "redis_receivers"
            } else {
                "subscribers"
            };
            let mut json = serde_json::json!({ "channel": m.channel, counted: p.subscribers });
            if !p.message.is_none() {
                json["id"] = p.message.to_string().into();
            }
            let json = json.to_string() + "\n";
            let keep = req.keep_alive();
            reply(w, stream, 200, "application/json", json.as_bytes(), keep).await
        }
        None => refuse(w, stream, 503, "supervisor unavailable\n").await,
    }
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
    use super::text_or_binary;

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
}
