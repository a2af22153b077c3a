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

use std::time::Instant;

use throng_proto::http::{self, BodyDecoder, BodyKind, Request};
use tokio::io::AsyncReadExt as _;

use crate::tls::stream::Io;
use crate::worker::ping_answer::{Answer, Wait, parse};
use crate::worker::state::Worker;

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
            return Pinged::Done(reply(w, stream, 400, why.to_string().as_bytes()).await);
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
    let answer = Answer::new(ask, req, deadline);
    // A sleeper keeps no buffer: only one with nothing pipelined behind it leaves.
    go_on(w, stream, answer, may_leave && buf.is_empty()).await
}

/// Writes `a` from where it is, waiting a random 0..=`sleep_ms` before
/// each part; a long wait is handed back (`may_leave`) to be spent with
/// the sleepers.
pub(crate) async fn go_on(w: &Worker, stream: &mut Io, mut a: Answer, may_leave: bool) -> Pinged {
    loop {
        if a.expired() {
            w.counters.handshake_failed("request_timeout");
            return Pinged::Done(false);
        }
        if a.take_due() {
            // Back from the sleepers: its wait is over.
            if !write_part(w, stream, &mut a).await {
                return Pinged::Done(false);
            }
            if let Some(keep) = a.done() {
                return Pinged::Done(keep);
            }
            continue;
        }
        let now = Instant::now();
        let wake = match a.wait(now, may_leave) {
            Wait::Away(wake) => return Pinged::Sleeps(a, wake),
            Wait::Here(wake) => wake,
        };
        if wake > now {
            tokio::time::sleep_until(wake.into()).await;
        }
        if a.expired() {
            continue;
        }
        if !write_part(w, stream, &mut a).await {
            return Pinged::Done(false);
        }
        if let Some(keep) = a.done() {
            return Pinged::Done(keep);
        }
    }
}

/// Writes the part of `a` that is due; whether the connection took it.
async fn write_part(w: &Worker, stream: &mut Io, a: &mut Answer) -> bool {
    let mut out = Vec::with_capacity(128);
    a.part(&mut out);
    write(w, stream, &out).await
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
