//! `throng hold`, a role on the harness core: open N WebSocket (or MQTT) connections
//! on an open-model schedule, hold them, publish timestamped messages to
//! them and check every delivery (latency, losses, duplicates, order).
//!
//! - [`request`]: what the command asks for, checked and fitted onto the
//!   machine before anything starts ([`prepare`]), and the lines printed then;
//! - [`plan`]: fitting connections onto workers, source addresses and target ports;
//! - [`target`]: the WebSocket target, the publish endpoint, source addresses;
//! - [`supervisor`]: the role on the supervisor's side: the ramp, the
//!   publisher, the end of the run; [`summary`]: what the run did;
//! - [`publish`], [`message`]: publishing the timestamped messages;
//! - [`mqtt`]: what held MQTT subscribers and the MQTT publisher send;
//!   [`sessions`]: persistent-session MQTT clients that go away and return;
//! - [`worker`] (with `held`, its readiness loop, and `shared`, what the
//!   two share): one worker process;
//! - [`recorder`], [`sequence`]: what a worker counts.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use throng_proto::http;

use crate::pacer::RateSpec;
use crate::tls::TlsOptions;
use target::WsTarget;

pub mod figures;
mod held;
pub mod message;
pub mod mqtt;
pub mod plan;
pub mod publish;
pub mod recorder;
pub mod request;
pub mod sequence;
pub mod sessions;
mod shared;
pub mod stamp;
pub mod summary;
pub mod supervisor;
pub mod target;
pub mod worker;

pub use figures::Thresholds;
pub use request::{Prepared, Request, prepare, prepare_on};
pub use summary::{Summary, render};
pub use supervisor::{HoldRun, PublishPlan, run};

/// Runs this process as one `hold` worker (plan on stdin, records on stdout).
pub fn run_worker() -> std::io::Result<()> {
    crate::harness::worker::run_process(worker::work)
}

/// Timeouts and limits of held connections; every one is printed at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// TCP connect, from the actual start (ms).
    pub connect_timeout_ms: u64,
    /// The upgrade request and response, after TCP connect (ms).
    pub handshake_timeout_ms: u64,
    /// How long to wait for the server's close frame after sending ours (ms).
    pub close_timeout_ms: u64,
    /// The largest message accepted; a bigger one closes the connection with 1009.
    pub max_message: usize,
    /// The largest upgrade response head accepted.
    pub max_head: usize,
    /// Size of the one read buffer per worker.
    pub scratch: usize,
    /// Interval length (ns).
    pub interval_ns: u64,
    /// A held connection that receives nothing (not even a ping) for this
    /// long fails as `closed.read_timeout` (ms; 0: never).
    #[serde(default)]
    pub read_timeout_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 10_000,
            handshake_timeout_ms: 10_000,
            close_timeout_ms: 2_000,
            max_message: 1 << 20,
            max_head: http::MAX_HEAD,
            scratch: 64 * 1024,
            interval_ns: 1_000_000_000,
            read_timeout_ms: 0,
        }
    }
}

/// Everything one worker needs to run its share; sent as JSON on its stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerPlan {
    /// This worker's number, `0..workers`.
    pub index: u32,
    /// Workers in the run.
    pub workers: u32,
    /// Connections in the whole run; this worker opens those with `i % workers == index`.
    pub connections: u64,
    /// The run's connection rate (the whole run's, not this worker's share).
    pub rate: RateSpec,
    /// When event 0 of the schedule is due, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Where to connect.
    pub target: WsTarget,
    /// Source addresses to bind (empty: the kernel picks).
    pub sources: Vec<IpAddr>,
    /// Timeouts and limits.
    pub settings: Settings,
    /// The `source` of this worker's intervals (`host/hold-0`).
    pub label: String,
    /// How to check and resume TLS (`wss://` targets only).
    #[serde(default)]
    pub tls: Option<TlsOptions>,
    /// How to connect and subscribe (`mqtt://` targets only).
    #[serde(default)]
    pub mqtt: Option<mqtt::MqttOptions>,
}

impl WorkerPlan {
    /// Connections this worker opens.
    pub fn share(&self) -> u64 {
        crate::harness::share(self.connections, self.index, self.workers)
    }
}
