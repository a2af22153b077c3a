//! What a `throng bench` found, as one `"bench"` record at the end of its
//! result file (docs/results-format.md): the headline figures the text and
//! HTML reports lead with. `throng-load`'s bench builds it from its own
//! measurements; a report reads it back without knowing how they were made.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Below this many connections open, memory per connection is not
/// measured: a few hundred connections move RSS and slab by less than their
/// own noise (a page here, a cache there), so a figure would be a guess.
pub const MIN_MEASURED_CONNECTIONS: u64 = 1_000;

/// The headline of one bench. Every part reads as empty when missing, so a
/// record written by a newer throng with more (or fewer) parts still reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchSummary {
    /// When the bench ended, ns since the Unix epoch.
    pub at_ns: u64,
    /// Who wrote it (`box1/bench`).
    pub source: String,
    /// The run in one line: `100000 connections, 10 messages of 64 B every 2s, on box1 (2 cores)`.
    pub title: String,
    /// Connections asked for, held and failed.
    pub connections: Connections,
    /// Memory per connection on each side.
    pub memory: MemoryPerConnection,
    /// Every message's delivery.
    pub messages: Messages,
    /// CPU time of each side.
    pub cpu: CpuSplit,
    /// `PASS`, `FAIL` or `STOPPED` (Ctrl-C before its end), judged by
    /// `criteria`; empty in a record from before bench had a verdict.
    pub verdict: String,
    /// What a PASS needs, as bench stated it at start.
    pub criteria: String,
    /// The criteria missed, one line each (none on a PASS).
    pub failures: Vec<String>,
    /// The first limit the run reached (`CPU at 67.0 s (...)`), empty when
    /// it reached none.
    pub first_limit: String,
}

impl BenchSummary {
    /// Whether the run missed a criterion: by its verdict, or (a record
    /// without one) by its figures.
    pub fn missed(&self) -> bool {
        let (c, m) = (&self.connections, &self.messages);
        match self.verdict.as_str() {
            "" => c.failed > 0 || m.lost > 0 || m.publish_errors > 0 || m.published < m.asked,
            v => v != "PASS",
        }
    }
}

/// Connections asked for, held and failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Connections {
    /// Asked for.
    pub asked: u64,
    /// The most open at once.
    pub held: u64,
    /// Handshakes completed.
    pub opened: u64,
    /// Attempts that failed.
    pub failed: u64,
    /// Failed attempts by kind (`refused`, `timeout`, ...).
    pub failed_by_kind: BTreeMap<String, u64>,
    /// Connections opened per second over the ramp.
    pub opened_per_s: f64,
    /// Seconds the ramp took.
    pub ramp_s: f64,
}

impl Connections {
    /// The failed attempts by kind, `refused 3, timeout 1` (empty when none failed).
    pub fn failed_kinds(&self) -> String {
        let kinds: Vec<String> = self
            .failed_by_kind
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        kinds.join(", ")
    }
}

/// Memory per held connection, bytes, each measured as the growth from
/// before the first connection to the moment every one was open, divided
/// by the connections then open.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryPerConnection {
    /// The connections the growth is divided by.
    pub connections: u64,
    /// The server's user space (its processes' RSS).
    pub server_bytes: f64,
    /// The harness's user space (its workers' RSS).
    pub harness_bytes: f64,
    /// The kernel (slab and TCP buffers), both sockets of a connection.
    pub kernel_bytes: f64,
}

/// Publishing and delivery.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Messages {
    /// Messages asked for.
    pub asked: u64,
    /// Published: sent whole and not refused.
    pub published: u64,
    /// Messages not published (never sent, or refused).
    pub publish_errors: u64,
    /// Published messages whose answer came late or not at all (still
    /// published: their deliveries are expected).
    pub publish_unanswered: u64,
    /// Deliveries expected: every message to every connection.
    pub expected: u64,
    /// Deliveries counted.
    pub received: u64,
    /// Lost.
    pub lost: u64,
    /// Received twice.
    pub duplicated: u64,
    /// Received after a later one.
    pub out_of_order: u64,
    /// Every delivery of every message, publish to arrival.
    pub delivery: Delivery,
    /// Each message, in publish order.
    pub each: Vec<MessageDelivery>,
}

/// Delivery latency, µs: publish to arrival.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Delivery {
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// The last subscriber's.
    pub max_us: u64,
}

/// One message's delivery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MessageDelivery {
    /// 1, 2, ... in publish order.
    pub seq: u64,
    /// Subscribers it reached.
    pub delivered: u64,
    /// Its latency.
    #[serde(flatten)]
    pub latency: Delivery,
}

/// CPU time (user + system), seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CpuSplit {
    /// The server's processes.
    pub server_s: f64,
    /// The harness's workers and the bench process.
    pub harness_s: f64,
    /// The run's wall-clock length.
    pub elapsed_s: f64,
}
