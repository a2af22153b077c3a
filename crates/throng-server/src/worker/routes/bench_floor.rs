//! BENCHMARK ONLY: `POST /bench/floor/<channel>`, answered only when the
//! server runs with `--bench-floor` (`scripts/bench-serve.sh` starts it so;
//! the route does not exist otherwise).
//!
//! The floor a fan-out is compared with: one bare socket write of the
//! pre-encoded frame to each subscriber of `channel` in this worker (the
//! same `send` a fan-out makes, without its bookkeeping), timed on the
//! thread's CPU clock. Nothing on the publish path passes through here.

use std::time::Instant;

use throng_host::process;
use throng_proto::http::Request;
use throng_proto::ws::{self, OpCode};

use super::publish::read_message;
use super::reply;
use crate::tls::stream::Io;
use crate::worker::conn::Wire as _;
use crate::worker::state::Worker;

/// The route's path prefix (the channel follows).
pub(super) const PREFIX: &str = "/bench/floor/";

/// Answers with the writes made, how many came up short, and the CPU and
/// wall time of the loop, as JSON. Returns whether the connection stays open.
pub(crate) async fn serve(w: &Worker, stream: &mut Io, req: &Request, buf: &mut Vec<u8>) -> bool {
    let m = match read_message(w, stream, req, buf, PREFIX).await {
        Ok(m) => m,
        Err(keep) => return keep,
    };
    let json = floor(w, &m.channel, m.text, &m.body);
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

/// The write loop. Subscribers with a queue are skipped (writing past their
/// queue would reorder their stream); a subscriber whose write came up
/// short is closed, since its stream now holds half a frame.
fn floor(w: &Worker, channel: &str, text: bool, payload: &[u8]) -> String {
    let frame = ws::server_frame(if text { OpCode::Text } else { OpCode::Binary }, payload);
    // A TLS subscriber's stream cannot take a bare frame.
    let conns = w.subs.bare_subscribers_of(channel);
    let start = Instant::now();
    let cpu = process::thread_cpu();
    let mut short = Vec::new();
    for c in &conns {
        if !matches!(c.wire().write(&frame), Ok(n) if n == frame.len()) {
            short.push(c);
        }
    }
    let cpu = process::thread_cpu().saturating_sub(cpu);
    let wall = start.elapsed();
    for c in &short {
        w.subs.finish(c);
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
