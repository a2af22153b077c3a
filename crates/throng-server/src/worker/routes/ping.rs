//! The seeds' test back end: `GET`/`POST /ping` answers `pong`.
//!
//! Header `sleep: S` waits a random 0..=S ms before answering; header
//! `times: T` then writes `pong` T more times, each after such a wait, as
//! chunks of one response, and ends it. Long sleeps turn a modest request
//! rate into many concurrent connections (rate × mean duration), which is
//! how the seeds simulated persistent clients with an HTTP tool.
//!
//! A sleeping request holds its socket and one entry in the runtime's timer
//! wheel, nothing else: the connection's read buffer is released while it
//! waits, and each answer is encoded only when it is due. Its limits are
//! explicit options printed at start (`--request-timeout`, default 1 h;
//! `--max-sleep`; `--max-times`), never a hidden two-minute timeout.

use std::time::{Duration, Instant};

use throng_proto::http::{self, BodyDecoder, BodyKind, Request};
use tokio::io::AsyncReadExt as _;

use crate::tls::stream::Io;
use crate::worker::state::Worker;

/// The answer's body, once and `times` more.
const PONG: &[u8] = b"pong";

/// What one `/ping` request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ask {
    /// Longest wait before each `pong`, ms (0: none).
    pub(crate) sleep_ms: u64,
    /// `pong`s after the first.
    pub(crate) times: u64,
}

/// Reads `sleep` and `times`; the reason (for a 400) when either is bad.
pub(crate) fn parse(req: &Request, max_sleep: Duration, max_times: u64) -> Result<Ask, String> {
    let max_sleep_ms = u64::try_from(max_sleep.as_millis()).unwrap_or(u64::MAX);
    let number = |name: &str, max: u64, unit: &str| -> Result<u64, String> {
        let Some(raw) = req.header(name) else {
            return Ok(0);
        };
        let text = String::from_utf8_lossy(raw);
        let text = text.trim();
        let value = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            text.parse::<u64>().ok()
        } else {
            None
        };
        match value {
            Some(v) if v <= max => Ok(v),
            Some(_) => Err(format!(
                "header '{name}: {text}' is over this server's limit of {max}{unit}\n"
            )),
            None => Err(format!(
                "header '{name}: {text}' is not a whole number{unit}\n"
            )),
        }
    };
    Ok(Ask {
        sleep_ms: number("sleep", max_sleep_ms, " ms")?,
        times: number("times", max_times, "")?,
    })
}

/// Serves one `/ping` request whose head has been read (`buf` holds what
/// followed it). Returns whether the connection stays open.
pub(crate) async fn serve(w: &Worker, stream: &mut Io, req: &Request, buf: &mut Vec<u8>) -> bool {
    let ask = match parse(req, w.cfg.max_sleep, w.cfg.max_times) {
        Ok(ask) => ask,
        Err(why) => {
            w.counters.handshake_failed("bad_ping");
            return reply(w, stream, 400, why.as_bytes()).await;
        }
    };
    w.counters.http_request("ping");
    let deadline = Instant::now() + w.cfg.request_timeout;
    let keep = answer(w, stream, req, buf, ask, deadline).await;
    if Instant::now() >= deadline {
        w.counters.handshake_failed("request_timeout");
        return false;
    }
    keep
}

async fn answer(
    w: &Worker,
    stream: &mut Io,
    req: &Request,
    buf: &mut Vec<u8>,
    ask: Ask,
    deadline: Instant,
) -> bool {
    let body = discard_body(stream, req, buf, w.cfg.max_message);
    let Ok(body) = tokio::time::timeout_at(deadline.into(), body).await else {
        return false;
    };
    if let Err((status, why)) = body {
        if status == 0 {
            return false;
        }
        w.counters.handshake_failed("bad_body");
        return reply(w, stream, status, why.as_bytes()).await;
    }
    if buf.is_empty() {
        // Nothing pipelined behind this request: free the read buffer while
        // the request sleeps, so a sleeping connection holds no buffer.
        *buf = Vec::new();
    }
    let keep = req.keep_alive();
    if !pause(ask.sleep_ms, deadline).await {
        return false;
    }
    if ask.times == 0 {
        let mut out = Vec::with_capacity(128);
        let conn = if keep { "keep-alive" } else { "close" };
        http::write_response(
            &mut out,
            200,
            &[("Content-Type", "text/plain"), ("Connection", conn)],
            PONG,
        );
        return write(w, stream, &out).await && keep;
    }
    // Several answers: chunked for HTTP/1.1; an HTTP/1.0 client gets a body
    // that ends when the connection closes.
    let chunked = req.minor_version >= 1;
    let keep = keep && chunked;
    let mut out = Vec::with_capacity(128);
    let conn = if keep { "keep-alive" } else { "close" };
    let mut headers = vec![("Content-Type", "text/plain"), ("Connection", conn)];
    if chunked {
        headers.push(("Transfer-Encoding", "chunked"));
    }
    http::write_response_head(&mut out, 200, &headers);
    push_pong(&mut out, chunked);
    if !write(w, stream, &out).await {
        return false;
    }
    for _ in 0..ask.times {
        if !pause(ask.sleep_ms, deadline).await {
            return false;
        }
        let mut out = Vec::with_capacity(16);
        push_pong(&mut out, chunked);
        if !write(w, stream, &out).await {
            return false;
        }
    }
    if chunked {
        let mut out = Vec::with_capacity(8);
        http::write_chunk(&mut out, b"");
        if !write(w, stream, &out).await {
            return false;
        }
    }
    keep
}

fn push_pong(out: &mut Vec<u8>, chunked: bool) {
    if chunked {
        http::write_chunk(out, PONG);
    } else {
        out.extend_from_slice(PONG);
    }
}

/// Waits a random 0..=`max_ms` ms, but not past `deadline` (then false):
/// the request's one timer-wheel entry while it sleeps, no thread.
async fn pause(max_ms: u64, deadline: Instant) -> bool {
    let ms = if max_ms > 0 {
        fastrand::u64(0..=max_ms)
    } else {
        0
    };
    let wake = Instant::now() + Duration::from_millis(ms);
    if wake >= deadline {
        tokio::time::sleep_until(deadline.into()).await;
        return false;
    }
    if ms > 0 {
        tokio::time::sleep_until(wake.into()).await;
    }
    true
}

/// Reads the request body and drops it. `Err((status, reason))` for a bad
/// one (status 0: the client went away).
async fn discard_body(
    stream: &mut Io,
    req: &Request,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<(), (u16, &'static str)> {
    let kind = req.body_kind().map_err(|_| {
        (
            400,
            "bad body framing (Content-Length or Transfer-Encoding)\n",
        )
    })?;
    if kind == BodyKind::Empty {
        return Ok(());
    }
    let mut dec = BodyDecoder::new(kind, max as u64);
    let mut eof = false;
    loop {
        let step = dec.decode(buf, eof).map_err(|e| match e {
            http::BodyError::TooLarge { .. } => (413, "body is over --max-message\n"),
            http::BodyError::Truncated => (0, ""),
            _ => (400, "malformed chunked body\n"),
        })?;
        buf.drain(..step.consumed);
        if step.done {
            return Ok(());
        }
        if eof {
            return Err((0, ""));
        }
        if buf.is_empty() || step.consumed == 0 {
            buf.reserve(4096);
            match stream.read_buf(buf).await {
                Ok(0) => eof = true,
                Ok(_) => {}
                Err(_) => return Err((0, "")),
            }
        }
    }
}

async fn write(w: &Worker, stream: &mut Io, bytes: &[u8]) -> bool {
    matches!(
        tokio::time::timeout(w.cfg.write_timeout, stream.write_all(bytes)).await,
        Ok(Ok(()))
    )
}

/// A short plain-text answer that closes the connection.
async fn reply(w: &Worker, stream: &mut Io, status: u16, body: &[u8]) -> bool {
    let mut out = Vec::with_capacity(128 + body.len());
    http::write_response(
        &mut out,
        status,
        &[("Content-Type", "text/plain"), ("Connection", "close")],
        body,
    );
    let _ = write(w, stream, &out).await;
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> Request {
        Request {
            method: "POST".into(),
            target: "/ping".into(),
            minor_version: 1,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    #[test]
    fn sleep_and_times() {
        let max = Duration::from_secs(3600);
        assert_eq!(
            parse(&req(&[]), max, 1000),
            Ok(Ask {
                sleep_ms: 0,
                times: 0
            })
        );
        assert_eq!(
            parse(&req(&[("Sleep", "5000"), ("times", " 2 ")]), max, 1000),
            Ok(Ask {
                sleep_ms: 5000,
                times: 2
            })
        );
        for bad in [
            ("sleep", "-1"),
            ("sleep", "1.5"),
            ("sleep", "soon"),
            ("sleep", ""),
            ("times", "1001"),
            ("sleep", "3600001"),
        ] {
            let e = parse(&req(&[bad]), max, 1000).unwrap_err();
            assert!(e.contains(bad.0), "{bad:?}: {e}");
        }
        assert!(parse(&req(&[("sleep", "99999999999999999999999")]), max, 1000).is_err());
    }
}
