//! `throng attack`: HTTP/1.1 load at a set request rate (open model), or the
//! most a closed pool of connections can do, measured without coordinated
//! omission.
//!
//! Every request's latency counts from its *intended* start, fixed by the
//! [`crate::pacer`] schedule before the run; the service time counts from the
//! moment the generator actually started it. When the generator falls behind
//! it records its lag and the requests it started late, and still sends every
//! request of the schedule.
//!
//! A role on the harness core ([`crate::harness`]):
//!
//! - [`request`]: what the command asks for, checked and planned ([`prepare`]);
//! - [`targets`]: what to send (Vegeta's target format, or one `--url`);
//! - [`supervisor`]: the role on the supervisor's side; [`summary`]: what
//!   the run did, Vegeta's way, and the thresholds that fail it;
//! - [`worker`]: one worker process: the schedule, the HTTP/1.1 client, the
//!   connection pool;
//! - `aims`: the targets a worker sends, ready on the wire (held, or read
//!   from a large targets file as the run takes them);
//! - [`record`]: what a worker counts per interval, and per-request rows;
//! - `waiting`: requests whose answer is slow, waiting outside tokio;
//! - `response`: one HTTP/1.1 response read as it arrives, sans I/O (both
//!   the worker and the waiting room feed it);
//! - `h2`: the HTTP/2 engine (`--http2`): many streams per connection,
//!   on `throng-proto`'s sans-I/O [`throng_proto::h2::Connection`].
//!
//! The schedule wakes on `throng-host`'s timerfd [`Timer`](throng_host::timer::Timer)
//! (tokio's timers round up to the millisecond).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::pacer::{Pacer, RateSpec};

mod aims;
mod h2;
pub mod record;
pub mod request;
mod response;
pub mod summary;
pub mod supervisor;
pub mod targets;
mod waiting;
pub mod worker;

pub use request::{Prepared, Request, prepare, prepare_on};
pub use summary::{Summary, render};

/// Runs this process as one `attack` worker (plan on stdin, records on stdout).
pub fn run_worker() -> std::io::Result<()> {
    crate::harness::worker::run_process(|plan, orders, out| {
        worker::work(plan, orders, out, h2::engine)
    })
}

/// The shape of the load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Load {
    /// Open model: request `i` starts at the pacer's intended time `i`,
    /// whatever the server does.
    Rate(RateSpec),
    /// Closed model (wrk's): this many connections, each sending its next
    /// request as soon as the previous one ends.
    Max {
        /// Connections in the whole run.
        connections: u64,
    },
}

/// Timeouts and limits; every one is printed at the start of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// A request without a complete response this long after it started
    /// (connect included) fails as `timeout` (ms).
    pub timeout_ms: u64,
    /// Reuse connections (HTTP/1.1 keep-alive); without it every request
    /// opens a connection and asks the server to close it.
    pub keepalive: bool,
    /// Connections open at once in the whole run, idle ones included.
    pub max_connections: u64,
    /// Interval length (ns).
    pub interval_ns: u64,
    /// Size of the one read buffer per worker.
    pub scratch: usize,
    /// HTTP/2 (`--http2`): at most this many streams per connection (the
    /// server's SETTINGS_MAX_CONCURRENT_STREAMS may allow fewer); `None`:
    /// HTTP/1.1.
    #[serde(default)]
    pub http2: Option<u32>,
}

/// The default `--timeout`: long enough for the seeds' slow back ends
/// (Vegeta's hidden 30 s failed half of their `sleep: 60000` calls), and
/// printed at every start so nobody has to guess it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for Settings {
    fn default() -> Self {
        Self {
            timeout_ms: u64::try_from(DEFAULT_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
            keepalive: true,
            max_connections: 10_000,
            interval_ns: 1_000_000_000,
            scratch: 64 * 1024,
            http2: None,
        }
    }
}

/// Everything one worker needs; sent as JSON on its stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerPlan {
    /// This worker's number, `0..workers`. It sends requests `i` with
    /// `i % workers == index` (rate mode), or its share of the connections.
    pub index: u32,
    /// Workers in the run.
    pub workers: u32,
    /// The `source` of this worker's intervals (`host/attack-0`).
    pub label: String,
    /// Rate or closed pool.
    pub load: Load,
    /// Stop starting requests this long after the start (ns).
    pub duration_ns: Option<u64>,
    /// Stop after this many requests in the whole run.
    pub requests: Option<u64>,
    /// What to send, taken in turn; or, with `lazy`, the first target of
    /// each endpoint (the file holds the rest).
    pub targets: Vec<targets::Target>,
    /// A targets file too large to hold, read as the run takes its targets.
    #[serde(default)]
    pub lazy: Option<targets::LazyFile>,
    /// Each target's resolved address.
    pub addrs: Vec<SocketAddr>,
    /// Source addresses new connections bind, in turn (empty: the kernel picks).
    #[serde(default)]
    pub sources: Vec<std::net::IpAddr>,
    /// When request 0 is due, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Timeouts and limits.
    pub settings: Settings,
    /// Append per-request rows here.
    pub per_request: Option<PathBuf>,
    /// How to check and resume TLS (for `https://` targets).
    #[serde(default)]
    pub tls: Option<crate::tls::TlsOptions>,
    /// How per-request rows are written (`None`: by the file's name).
    #[serde(default)]
    pub row_format: Option<record::RowFormat>,
}

/// The pacer of a rate run: a ramp spans the duration (or, without one, the
/// request count).
pub fn pacer(
    spec: RateSpec,
    duration: Option<Duration>,
    requests: Option<u64>,
) -> Result<Pacer, crate::pacer::PacerError> {
    match (duration, requests) {
        (Some(d), _) => Pacer::for_duration(spec, d),
        (None, Some(n)) => Pacer::for_count(spec, n),
        (None, None) => Pacer::for_duration(spec, Duration::from_secs(1)),
    }
}

/// Requests a rate run plans: those due before `duration`, at most `requests`.
pub fn planned(pacer: &Pacer, duration: Option<Duration>, requests: Option<u64>) -> Option<u64> {
    let by_time = duration.map(|d| {
        // The first event due at or after `d`: grow an upper bound, then bisect.
        let mut hi = 1u64;
        while pacer.intended(hi) < d && hi < u64::MAX / 2 {
            hi *= 2;
        }
        let mut lo = 0u64;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pacer.intended(mid) < d {
                lo = mid + 1
            } else {
                hi = mid
            }
        }
        lo
    });
    match (by_time, requests) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_counts_events_before_the_end() {
        let p = Pacer::constant(1000.0).unwrap();
        assert_eq!(planned(&p, Some(Duration::from_secs(2)), None), Some(2000));
        assert_eq!(
            planned(&p, Some(Duration::from_secs(2)), Some(50)),
            Some(50)
        );
        assert_eq!(planned(&p, None, Some(7)), Some(7));
        let ramp = pacer(
            "100/s..300/s".parse().unwrap(),
            Some(Duration::from_secs(10)),
            None,
        )
        .unwrap();
        // The integral of the ramp: (100 + 300) / 2 * 10.
        assert_eq!(
            planned(&ramp, Some(Duration::from_secs(10)), None),
            Some(2000)
        );
    }
}
