//! The operator's endpoints: `GET /healthz` (for load balancers: 503 while
//! draining, and the Redis broker's state) and `GET /metrics` (Prometheus
//! text for the whole node, summed by the supervisor).

use throng_proto::http::Request;

use super::reply;
use crate::tls::stream::Io;
use crate::worker::state::Worker;

/// `GET /healthz`. Returns whether the connection stays open.
pub(crate) async fn healthz(w: &Worker, stream: &mut Io, req: &Request) -> bool {
    w.counters.http_request("healthz");
    let draining = w.draining.get();
    let mut body = String::from(if draining { "draining\n" } else { "ok\n" });
    body.push_str(&w.supervisor.broker_health());
    let status = if draining { 503 } else { 200 };
    let keep = req.keep_alive();
    reply(w, stream, status, "text/plain", body.as_bytes(), keep).await
}

/// `GET /metrics`. Returns whether the connection stays open.
pub(crate) async fn metrics(w: &Worker, stream: &mut Io, req: &Request) -> bool {
    w.counters.http_request("metrics");
    match w.supervisor.metrics().await {
        Some(text) => {
            let ctype = "text/plain; version=0.0.4; charset=utf-8";
            reply(w, stream, 200, ctype, &text, req.keep_alive()).await
        }
        None => super::refuse(w, stream, 503, "supervisor unavailable\n").await,
    }
}
