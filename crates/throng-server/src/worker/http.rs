//! A new connection's first life as HTTP: read the request head (within
//! `--handshake-timeout`), then either upgrade it to a subscriber, answer
//! `POST /publish/<channel>`, `/metrics` and `/healthz`, or refuse it with
//! the status and reason a client can act on.

use std::io::Write as _;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use throng_proto::http::{self, BodyDecoder, BodyError, BodyKind, HeadError, Request};
use throng_proto::ws::{self, OpCode};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::Worker;
use super::conn::{Conn, TlsState};
use crate::channel;
use crate::tls::stream::{Io, TlsStream};
use throng_host::process;

/// What reading a request head gave.
enum Head {
    Request(Request, usize),
    /// The client closed (or the socket failed) before sending a whole head.
    Closed,
    Bad(HeadError),
}

/// Runs the TLS handshake on a connection from a `--tls-listen` listener
/// (within `--handshake-timeout`), then serves it like a plain one.
pub(crate) async fn serve_tls(w: Rc<Worker>, tcp: TcpStream, config: Arc<rustls::ServerConfig>) {
    let accepted =
        tokio::time::timeout(w.cfg.handshake_timeout, TlsStream::accept(tcp, config)).await;
    match accepted {
        Err(_) => w.counters.handshake_failed("tls_timeout"),
        Ok(Err(e)) => w.counters.handshake_failed(e.label()),
        Ok(Ok(s)) => {
            w.counters.tls_handshake(s.handshake_label());
            serve(w, Io::Tls(Box::new(s))).await;
        }
    }
}

/// Serves one accepted connection until it upgrades or closes.
pub(crate) async fn serve(w: Rc<Worker>, mut stream: Io) {
    match requests(&w, &mut stream).await {
        Some((req, rest)) => upgrade(&w, stream, &req, &rest).await,
        None => {
            if let Io::Tls(_) = stream {
                // close_notify, so the client can tell the end from a cut.
                let _ = tokio::time::timeout(
                    w.cfg.handshake_timeout,
                    tokio::io::AsyncWriteExt::shutdown(&mut stream),
                )
                .await;
            }
        }
    }
}

/// Answers requests until the connection ends (`None`) or asks for a
/// WebSocket upgrade: then the request and the bytes read after it.
async fn requests(w: &Rc<Worker>, stream: &mut Io) -> Option<(Request, Vec<u8>)> {
    let mut buf: Vec<u8> = Vec::new();
    let mut first = true;
    loop {
        let read = tokio::time::timeout(w.cfg.handshake_timeout, read_head(w, stream, &mut buf));
        let Ok(head) = read.await else {
            if first || !buf.is_empty() {
                w.counters.handshake_failed("timeout");
            }
            return None;
        };
        let (req, used) = match head {
            Head::Request(req, used) => (req, used),
            Head::Closed => {
                if !buf.is_empty() {
                    w.counters.handshake_failed("incomplete_head");
                }
                return None;
            }
            Head::Bad(e) => {
                let (status, label) = match e {
                    HeadError::TooLarge { .. } | HeadError::TooManyHeaders => {
                        (431, "head_too_large")
                    }
                    _ => (400, "malformed_head"),
                };
                w.counters.handshake_failed(label);
                reply(
                    w,
                    stream,
                    status,
                    "text/plain",
                    format!("{e}\n").as_bytes(),
                    false,
                )
                .await;
                return None;
            }
        };
        first = false;
        buf.drain(..used);
        let path = req
            .target
            .split_once('?')
            .map_or(req.target.as_str(), |(p, _)| p);
        let keep = match (req.method.as_str(), path) {
            ("GET", "/healthz") => {
                w.counters.http_request("healthz");
                let mut body = if w.draining.get() {
                    String::from("draining\n")
                } else {
                    String::from("ok\n")
                };
                body.push_str(&broker_health(w));
                let status = if w.draining.get() { 503 } else { 200 };
                reply(
                    w,
                    stream,
                    status,
                    "text/plain",
                    body.as_bytes(),
                    req.keep_alive(),
                )
                .await
            }
            ("GET", "/metrics") => {
                w.counters.http_request("metrics");
                match w.metrics().await {
                    Some(text) => {
                        reply(
                            w,
                            stream,
                            200,
                            "text/plain; version=0.0.4; charset=utf-8",
                            &text,
                            req.keep_alive(),
                        )
                        .await
                    }
                    None => {
                        reply(
                            w,
                            stream,
                            503,
                            "text/plain",
                            b"supervisor unavailable\n",
                            false,
                        )
                        .await
                    }
                }
            }
            (method, p) if p == "/publish" || p.starts_with("/publish/") => {
                if method == "POST" {
                    publish(w, stream, &req, &mut buf, false).await
                } else {
                    w.counters.handshake_failed("method");
                    reply(
                        w,
                        stream,
                        405,
                        "text/plain",
                        b"publish with POST /publish/<channel>\n",
                        false,
                    )
                    .await
                }
            }
            ("GET" | "POST", "/ping") => crate::ping::serve(w, stream, &req, &mut buf).await,
            ("POST", p) if w.cfg.bench_floor && p.starts_with("/bench/floor/") => {
                publish(w, stream, &req, &mut buf, true).await
            }
            _ => return Some((req, buf)),
        };
        if !keep {
            return None;
        }
    }
}

/// Reads one request head. A connection waiting for a request (a new one,
/// or a keep-alive one between requests) holds no buffer: it waits for
/// readiness and reads into the worker's scratch buffer, and keeps an owned
/// copy only of a head that arrived split, or of bytes after a whole head
/// (a pipelined request, a body). Measured with `scripts/bench-attack.sh`:
/// reserving 4 KiB per connection up front was most of what each of 5,000
/// sleeping `/ping` requests cost the server. A TLS connection reads through
/// its stream, which owns the decrypted bytes.
async fn read_head(w: &Worker, stream: &mut Io, buf: &mut Vec<u8>) -> Head {
    loop {
        if !buf.is_empty() {
            match http::parse_request(buf, http::MAX_HEAD) {
                Ok(Some((req, used))) => return Head::Request(req, used),
                Ok(None) => {}
                Err(e) => return Head::Bad(e),
            }
            if buf.len() > http::MAX_HEAD {
                return Head::Bad(HeadError::TooLarge {
                    limit: http::MAX_HEAD,
                });
            }
            // The rest of a split head goes where its start is.
            buf.reserve(4096);
            match stream.read_buf(buf).await {
                Ok(0) | Err(_) => return Head::Closed,
                Ok(_) => continue,
            }
        }
        let tcp = match stream {
            Io::Plain(tcp) => tcp,
            Io::Tls(tls) => {
                // TLS: wait holding no buffer here (nor in the stream), as
                // the plain path does; then take what was decrypted.
                crate::tls::stream::give_buffer(std::mem::take(buf));
                if std::future::poll_fn(|cx| tls.poll_plain_ready(cx))
                    .await
                    .is_err()
                {
                    return Head::Closed;
                }
                *buf = crate::tls::stream::take_buffer();
                match stream.read_buf(buf).await {
                    Ok(0) | Err(_) => return Head::Closed,
                    Ok(_) => continue,
                }
            }
        };
        if tcp.readable().await.is_err() {
            return Head::Closed;
        }
        let mut scratch = w.scratch.borrow_mut();
        let n = match tcp.try_read(&mut scratch) {
            Ok(0) => return Head::Closed,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return Head::Closed,
        };
        match http::parse_request(&scratch[..n], http::MAX_HEAD) {
            Ok(Some((req, used))) => {
                buf.extend_from_slice(&scratch[used..n]);
                return Head::Request(req, 0);
            }
            Ok(None) if n > http::MAX_HEAD => {
                return Head::Bad(HeadError::TooLarge {
                    limit: http::MAX_HEAD,
                });
            }
            Ok(None) => buf.extend_from_slice(&scratch[..n]),
            Err(e) => return Head::Bad(e),
        }
    }
}

/// Writes a whole response; returns whether the connection stays open.
async fn reply(
    w: &Worker,
    stream: &mut Io,
    status: u16,
    ctype: &str,
    body: &[u8],
    keep_alive: bool,
) -> bool {
    let mut out = Vec::with_capacity(128 + body.len());
    let conn = if keep_alive { "keep-alive" } else { "close" };
    http::write_response(
        &mut out,
        status,
        &[("Content-Type", ctype), ("Connection", conn)],
        body,
    );
    let write = async {
        if keep_alive {
            stream.write_all(&out).await
        } else {
            stream.write_last(&out).await
        }
    };
    let sent = tokio::time::timeout(w.cfg.handshake_timeout, write).await;
    keep_alive && matches!(sent, Ok(Ok(())))
}

/// Completes (or refuses) a WebSocket upgrade and hands the socket to the
/// subscriber task.
async fn upgrade(w: &Rc<Worker>, mut stream: Io, req: &Request, rest: &[u8]) {
    let accept = match ws::server_accept(req) {
        Ok(accept) => accept,
        Err(e) => {
            w.counters.handshake_failed(e.label());
            let mut out = Vec::new();
            ws::write_refusal(&mut out, &e);
            let _ = tokio::time::timeout(w.cfg.handshake_timeout, stream.write_all(&out)).await;
            return;
        }
    };
    let name = match channel::from_target(&req.target, "/") {
        Ok(name) => name,
        Err(e) => {
            w.counters.handshake_failed("bad_channel");
            reply(
                w,
                &mut stream,
                400,
                "text/plain",
                format!("{e}\n").as_bytes(),
                false,
            )
            .await;
            return;
        }
    };
    if w.draining.get() {
        w.counters.handshake_failed("draining");
        reply(
            w,
            &mut stream,
            503,
            "text/plain",
            b"server is shutting down\n",
            false,
        )
        .await;
        return;
    }
    let mut out = Vec::with_capacity(160);
    ws::write_accept(&mut out, &accept);
    match tokio::time::timeout(w.cfg.handshake_timeout, stream.write_all(&out)).await {
        Ok(Ok(())) => {}
        _ => {
            w.counters.handshake_failed("write_failed");
            return;
        }
    }
    // From here on the socket lives in the worker's own epoll, not tokio's.
    let c = match stream {
        Io::Plain(tcp) => {
            let Ok(sock) = tcp.into_std() else {
                w.counters.handshake_failed("write_failed");
                return;
            };
            Conn::new(sock, w.now.get(), rest)
        }
        Io::Tls(tls) => {
            let parts = tls.into_parts();
            let Ok(sock) = parts.tcp.into_std() else {
                w.counters.handshake_failed("write_failed");
                return;
            };
            // Frames the client sent right behind its request: first what
            // the HTTP phase had read, then what it had decrypted but not read.
            let mut plain = rest.to_vec();
            plain.extend_from_slice(&parts.plain_rest);
            Conn::new(sock, w.now.get(), &plain)
                .with_tls(TlsState::new(parts.conn, &parts.cipher_rest))
        }
    };
    w.subscribe(name, c);
}

/// Why a publish body could not be read.
enum BodyFail {
    TooLarge,
    Malformed,
    Closed,
}

/// `POST /publish/<channel>` (or, with `floor`, the benchmark's bare write
/// loop). Returns whether the connection stays open.
async fn publish(
    w: &Rc<Worker>,
    stream: &mut Io,
    req: &Request,
    buf: &mut Vec<u8>,
    floor: bool,
) -> bool {
    let prefix = if floor { "/bench/floor/" } else { "/publish/" };
    let name = match channel::from_target(&req.target, prefix) {
        Ok(name) => name.to_owned(),
        Err(e) => {
            w.counters.handshake_failed("bad_channel");
            return reply(
                w,
                stream,
                400,
                "text/plain",
                format!("{e}\n").as_bytes(),
                false,
            )
            .await;
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
            return reply(
                w,
                stream,
                status,
                "text/plain",
                format!("{e}\n").as_bytes(),
                false,
            )
            .await;
        }
    };
    let max = w.cfg.max_message;
    if let BodyKind::Length(n) = kind
        && n > max as u64
    {
        w.counters.handshake_failed("too_large");
        let msg = format!("message of {n} bytes is over --max-message ({max} bytes)\n");
        return reply(w, stream, 413, "text/plain", msg.as_bytes(), false).await;
    }
    if req
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"))
    {
        let _ = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
    }
    let body = match tokio::time::timeout(
        w.cfg.handshake_timeout,
        read_body(stream, buf, kind, max),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(BodyFail::TooLarge)) => {
            w.counters.handshake_failed("too_large");
            let msg = format!("message is over --max-message ({max} bytes)\n");
            return reply(w, stream, 413, "text/plain", msg.as_bytes(), false).await;
        }
        Ok(Err(BodyFail::Malformed)) => {
            w.counters.handshake_failed("bad_body");
            return reply(
                w,
                stream,
                400,
                "text/plain",
                b"malformed chunked body\n",
                false,
            )
            .await;
        }
        Ok(Err(BodyFail::Closed)) => {
            w.counters.handshake_failed("incomplete_body");
            return false;
        }
        Err(_) => {
            w.counters.handshake_failed("timeout");
            return false;
        }
    };
    let text = match text_or_binary(req.header("content-type"), &body) {
        Ok(text) => text,
        Err(why) => {
            w.counters.handshake_failed("bad_body");
            return reply(w, stream, 400, "text/plain", why.as_bytes(), false).await;
        }
    };
    if floor {
        let json = bench_floor(w, &name, text, &body);
        return reply(
            w,
            stream,
            200,
            "application/json",
            json.as_bytes(),
            req.keep_alive(),
        )
        .await;
    }
    w.counters.http_request("publish");
    match w.publish(&name, text, Bytes::from(body)).await {
        Some(Err(reason)) => {
            let msg = format!("cannot publish: {reason}\n");
            reply(
                w,
                stream,
                503,
                "text/plain",
                msg.as_bytes(),
                req.keep_alive(),
            )
            .await
        }
        Some(Ok(n)) => {
            // Redis counts the connections that received the message (the
            // subscribed nodes, plus any other client), not WebSocket subscribers.
            let counted = if w.cfg.redis_mode.is_some() {
                "redis_receivers"
            } else {
                "subscribers"
            };
            let json = serde_json::json!({ "channel": name, counted: n }).to_string() + "\n";
            reply(
                w,
                stream,
                200,
                "application/json",
                json.as_bytes(),
                req.keep_alive(),
            )
            .await
        }
        None => {
            reply(
                w,
                stream,
                503,
                "text/plain",
                b"supervisor unavailable\n",
                false,
            )
            .await
        }
    }
}

/// The `/healthz` line about the Redis broker (empty with the local relay).
/// The node stays healthy while Redis is away: its subscribers are kept and
/// get messages again once it is back; a load balancer that should steer new
/// subscribers away can check for `broker: up` (docs/deploy.md).
fn broker_health(w: &Worker) -> String {
    match &*w.broker.borrow() {
        None => String::new(),
        Some((b, _)) if b.up => format!("broker: {}\n", b.text),
        Some((b, at)) => format!(
            "broker: down for {:.1}s ({})\n",
            (b.down + at.elapsed()).as_secs_f64(),
            b.text
        ),
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

/// The benchmark's floor: one bare socket write of the pre-encoded frame
/// to each subscriber of `channel` in this worker (the same `send` a
/// fan-out makes, without its bookkeeping), timed on the thread's CPU
/// clock. Subscribers with a queue are skipped (writing past their queue
/// would reorder their stream); a subscriber whose write came up short is
/// closed, since its stream now holds half a frame.
fn bench_floor(w: &Rc<Worker>, channel: &str, text: bool, payload: &[u8]) -> String {
    let frame = ws::server_frame(if text { OpCode::Text } else { OpCode::Binary }, payload);
    let conns: Vec<Rc<Conn>> = match w.channels.borrow().get(channel) {
        Some(ch) => ch
            .subs
            .iter()
            // A TLS subscriber's stream cannot take a bare frame.
            .filter(|c| !c.has_queue() && c.is_open() && !c.is_tls())
            .cloned()
            .collect(),
        None => Vec::new(),
    };
    let start = Instant::now();
    let cpu = process::thread_cpu();
    let mut short = Vec::new();
    for c in &conns {
        let mut sock = c.socket();
        if !matches!(sock.write(&frame), Ok(n) if n == frame.len()) {
            short.push(c);
        }
    }
    let cpu = process::thread_cpu().saturating_sub(cpu);
    let wall = start.elapsed();
    for c in &short {
        w.finish(c);
    }
    serde_json::json!({
        "writes": conns.len(),
        "short": short.len(),
        "cpu_ns": cpu.as_nanos() as u64,
        "wall_ns": wall.as_nanos() as u64,
    })
    .to_string()
        + "\n"
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
