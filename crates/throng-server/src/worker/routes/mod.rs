//! The worker's HTTP routes: what a request that is not a WebSocket
//! upgrade gets. Each route is one module; the HTTP phase of a connection
//! ([`super::http`]) reads the head, asks [`route`] which it is for, and
//! awaits that route's function.
//!
//! - `POST /publish/<channel>` ([`publish`]): relay a message through the supervisor.
//! - `/api/...` ([`api`]): the server API (channels, history, disconnect,
//!   batch publish), served where publishing is.
//! - `GET /healthz`, `GET /metrics` ([`ops`]): for load balancers and Prometheus.
//! - `GET`/`POST /ping` ([`ping`]): the seeds' test back end for HTTP load.
//! - `POST /bench/floor/<channel>` (`bench_floor`): benchmark only: in a
//!   build with the `bench-floor` feature, and then only with `--bench-floor`.

pub(crate) mod api;
#[cfg(feature = "bench-floor")]
pub(crate) mod bench_floor;
pub(crate) mod ops;
pub(crate) mod ping;
pub(crate) mod publish;

use throng_proto::http::{self, Request};

use super::state::{Serves, Worker};
use crate::tls::stream::Io;

/// The route a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// `GET /healthz`: [`ops::healthz`].
    Healthz,
    /// `GET /metrics`: [`ops::metrics`].
    Metrics,
    /// `POST /publish/<channel>`: [`publish::serve`].
    Publish,
    /// `/publish` with another method: [`publish::refuse_method`].
    PublishMethod,
    /// `/api/...`: [`api::serve`].
    Api,
    /// `GET` or `POST /ping`: [`ping::serve`].
    Ping,
    /// `/ping` where the test back end is off: [`test_backend_off`].
    TestBackendOff,
    /// `POST /bench/floor/<channel>` with `--bench-floor`: [`bench_floor::serve`].
    #[cfg(feature = "bench-floor")]
    BenchFloor,
    /// An endpoint this listener does not serve (publishing or `/metrics`
    /// moved to an internal address; an upgrade on one): [`not_here`].
    NotHere(&'static str),
}

/// The route `req` is for; `None` when no route takes it (a WebSocket
/// upgrade, or a path for the upgrade to refuse).
///
/// The caller awaits the route's function in its own loop rather than
/// through one more async function here: each HTTP connection is a task,
/// and a layer of future around the routes made it 160 bytes larger.
#[cfg_attr(not(feature = "bench-floor"), expect(unused_variables))]
pub(crate) fn route(w: &Worker, req: &Request, serves: Serves) -> Option<Route> {
    let path = req
        .target
        .split_once('?')
        .map_or(req.target.as_str(), |(p, _)| p);
    let publish = path == "/publish" || path.starts_with("/publish/");
    let api = path.starts_with(api::PREFIX);
    Some(match (req.method.as_str(), path) {
        ("GET", "/healthz") => Route::Healthz,
        ("GET", "/metrics") if serves.metrics => Route::Metrics,
        ("GET", "/metrics") => Route::NotHere("/metrics"),
        _ if publish && !serves.publish => Route::NotHere("publishing"),
        _ if api && !serves.publish => Route::NotHere("the server API (/api/)"),
        _ if api => Route::Api,
        ("POST", _) if publish => Route::Publish,
        _ if publish => Route::PublishMethod,
        _ if !serves.subscribe => Route::NotHere("this endpoint"),
        ("GET" | "POST", "/ping") if serves.ping => Route::Ping,
        ("GET" | "POST", "/ping") => Route::TestBackendOff,
        #[cfg(feature = "bench-floor")]
        ("POST", p) if w.cfg.bench_floor && p.starts_with(bench_floor::PREFIX) => Route::BenchFloor,
        _ => return None,
    })
}

/// `/ping` on an address that is not loopback, without `--test-backend`:
/// 404, counted, and the connection closes. The test back end holds a
/// connection up to an hour, which is not for anyone on the network.
pub(crate) async fn test_backend_off(w: &Worker, stream: &mut Io) -> bool {
    w.counters.refused("test_backend_off");
    let why = "/ping is the test back end, served on loopback addresses only (--test-backend serves it here)\n";
    refuse(w, stream, 404, why).await
}

/// An endpoint another listener serves: 403, counted, and the connection
/// closes. The answer names the option, not the address.
pub(crate) async fn not_here(w: &Worker, stream: &mut Io, what: &str) -> bool {
    w.counters.refused("not_on_this_address");
    let why =
        format!("{what} is not served on this address (see --publish-listen, --metrics-listen)\n");
    refuse(w, stream, 403, &why).await
}

/// Writes a whole response (within `--handshake-timeout`); returns whether
/// the connection stays open.
pub(crate) async fn reply(
    w: &Worker,
    stream: &mut Io,
    status: u16,
    ctype: &str,
    body: &[u8],
    keep_alive: bool,
) -> bool {
    reply_with(w, stream, status, ctype, &[], body, keep_alive).await
}

/// [`reply`] with more headers (`WWW-Authenticate`, `Retry-After`).
pub(crate) async fn reply_with(
    w: &Worker,
    stream: &mut Io,
    status: u16,
    ctype: &str,
    more: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) -> bool {
    let mut out = Vec::with_capacity(128 + body.len());
    let conn = if keep_alive { "keep-alive" } else { "close" };
    let mut headers = vec![("Content-Type", ctype), ("Connection", conn)];
    headers.extend_from_slice(more);
    http::write_response(&mut out, status, &headers, body);
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

/// Refuses a request with `status` and `why` as plain text, and closes.
pub(crate) async fn refuse(w: &Worker, stream: &mut Io, status: u16, why: &str) -> bool {
    reply(w, stream, status, "text/plain", why.as_bytes(), false).await
}
