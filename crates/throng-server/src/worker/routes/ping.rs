//! The seeds' test back end: `GET`/`POST /ping` answers `pong`.
//!
//! Header `sleep: S` waits a random 0..=S ms before answering; header
//! `times: T` then writes `pong` T more times, each after such a wait, as
//! chunks of one response, and ends it. Long sleeps turn a modest request
//! rate into many concurrent connections (rate × mean duration), which is
//! how the seeds simulated persistent clients with an HTTP tool.
//!
//! A request that sleeps long leaves its connection's task: its socket
//! and what is left of its answer ([`Answer`], 40 bytes) wait with the
//! worker's sleepers (`worker::sleepers`), and a task takes the connection
//! up again when the next part is due. Measured at 5,000 in flight
//! (`scripts/bench-attack.sh`): a sleeping request in its task (the
//! connection's ~1 KB future, its registration with tokio, its parsed
//! request and a timer) cost 1.76 KB of the worker's memory. A short sleep
//! stays in the task. Each answer is encoded only when it is due. Its
//! limits are explicit options printed at start (`--request-timeout`,
//! default 1 h; `--max-sleep`; `--max-times`), never a hidden two-minute
//! timeout.

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

/// A sleep at least this long is spent outside the connection's task.
const LEAVE_TASK: Duration = Duration::from_millis(100);

/// What is left of a `/ping` answer: the parts still to write and the
/// waits before them. Small on purpose: a sleeping request is this, its
/// socket and a place in the sleepers' queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    /// Longest wait before each part, ms.
    sleep_ms: u64,
    /// Pongs after the first still to write.
    left: u64,
    /// The first part (the head, or the whole answer) is still to write.
    first: bool,
    /// More than one pong: parts of a body (chunked for HTTP/1.1).
    parts: bool,
    chunked: bool,
    /// The connection stays open after the answer.
    keep: bool,
    /// The wait ends at `--request-timeout`: the answer is cut off then.
    expired: bool,
    /// The wait before the next part was spent (with the sleepers): write it now.
    due: bool,
    /// `--request-timeout` from the request's start.
    deadline: Instant,
}

#[cfg(test)]
impl Answer {
    /// One pong after a wait of up to a second, cut off at `deadline`.
    pub(crate) fn sleeping(deadline: Instant) -> Self {
        Self {
            sleep_ms: 1000,
            left: 0,
            first: true,
            parts: false,
            chunked: false,
            keep: true,
            expired: false,
            due: false,
            deadline,
        }
    }
}

/// How a `/ping` answer left its task.
pub(crate) enum Pinged {
    /// Answered (or cut off): whether the connection stays open.
    Done(bool),
    /// Waiting until `wake` for its next part: the sleepers hold it.
    Sleeps(Answer, Instant),
}

/// Serves one `/ping` request whose head has been read (`buf` holds what
/// followed it). `may_leave`: a long sleep may be spent outside the task.
pub(crate) async fn serve(
    w: &Worker,
    stream: &mut Io,
    req: &Request,
    buf: &mut Vec<u8>,
    may_leave: bool,
) -> Pinged {
    let ask = match parse(req, w.cfg.max_sleep, w.cfg.max_times) {
        Ok(ask) => ask,
        Err(why) => {
            w.counters.handshake_failed("bad_ping");
            return Pinged::Done(reply(w, stream, 400, why.as_bytes()).await);
        }
    };
    w.counters.http_request("ping");
    let deadline = Instant::now() + w.cfg.request_timeout;
    let body = discard_body(stream, req, buf, w.cfg.max_message);
    let Ok(body) = tokio::time::timeout_at(deadline.into(), body).await else {
        w.counters.handshake_failed("request_timeout");
        return Pinged::Done(false);
    };
    if let Err((status, why)) = body {
        if status == 0 {
            return Pinged::Done(false);
        }
        w.counters.handshake_failed("bad_body");
        return Pinged::Done(reply(w, stream, status, why.as_bytes()).await);
    }
    if buf.is_empty() {
        // Nothing pipelined behind this request: free the read buffer while
        // the request sleeps, so a sleeping connection holds no buffer.
        *buf = Vec::new();
    }
    // Several answers: chunked for HTTP/1.1; an HTTP/1.0 client gets a body
    // that ends when the connection closes.
    let parts = ask.times > 0;
    let chunked = parts && req.minor_version >= 1;
    let answer = Answer {
        sleep_ms: ask.sleep_ms,
        left: ask.times,
        first: true,
        parts,
        chunked,
        keep: req.keep_alive() && (!parts || chunked),
        expired: false,
        due: false,
        deadline,
    };
    // A sleeper keeps no buffer: only one with nothing pipelined behind it leaves.
    go_on(w, stream, answer, may_leave && buf.is_empty()).await
}

/// Writes `a` from where it is, waiting a random 0..=`sleep_ms` before
/// each part; a wait of [`LEAVE_TASK`] or more is handed back
/// (`may_leave`) to be spent with the sleepers.
pub(crate) async fn go_on(w: &Worker, stream: &mut Io, mut a: Answer, may_leave: bool) -> Pinged {
    loop {
        if a.expired {
            w.counters.handshake_failed("request_timeout");
            return Pinged::Done(false);
        }
        if std::mem::take(&mut a.due) {
            // Back from the sleepers: its wait is over.
            if !write_part(w, stream, &mut a).await {
                return Pinged::Done(false);
            }
            if !a.first && a.left == 0 {
                return Pinged::Done(a.keep);
            }
            continue;
        }
        let ms = if a.sleep_ms > 0 {
            fastrand::u64(0..=a.sleep_ms)
        } else {
            0
        };
        let now = Instant::now();
        let mut wake = now + Duration::from_millis(ms);
        if wake >= a.deadline {
            // Cut off at --request-timeout, whether it waits here or there.
            wake = a.deadline;
            a.expired = true;
        }
        if may_leave && wake - now >= LEAVE_TASK {
            a.due = !a.expired;
            return Pinged::Sleeps(a, wake);
        }
        if wake > now {
            tokio::time::sleep_until(wake.into()).await;
        }
        if a.expired {
            continue;
        }
        if !write_part(w, stream, &mut a).await {
            return Pinged::Done(false);
        }
        if !a.first && a.left == 0 {
            return Pinged::Done(a.keep);
        }
    }
}

/// Writes the part of `a` that is due (and the end of the body after the
/// last pong); whether the connection took it.
async fn write_part(w: &Worker, stream: &mut Io, a: &mut Answer) -> bool {
    let mut out = Vec::with_capacity(128);
    let conn = if a.keep { "keep-alive" } else { "close" };
    if a.first {
        a.first = false;
        if !a.parts {
            http::write_response(
                &mut out,
                200,
                &[("Content-Type", "text/plain"), ("Connection", conn)],
                PONG,
            );
        } else {
            let mut headers = vec![("Content-Type", "text/plain"), ("Connection", conn)];
            if a.chunked {
                headers.push(("Transfer-Encoding", "chunked"));
            }
            http::write_response_head(&mut out, 200, &headers);
            push_pong(&mut out, a.chunked);
        }
    } else {
        a.left -= 1;
        push_pong(&mut out, a.chunked);
    }
    if a.parts && a.left == 0 && a.chunked {
        http::write_chunk(&mut out, b"");
    }
    write(w, stream, &out).await
}

fn push_pong(out: &mut Vec<u8>, chunked: bool) {
    if chunked {
        http::write_chunk(out, PONG);
    } else {
        out.extend_from_slice(PONG);
    }
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
