//! What a `throng bench` found, as one `"bench"` record at the end of its
//! result file (docs/results-format.md): the headline figures the text and
//! HTML reports lead with. `throng-load`'s bench builds it from its own
//! measurements; a report reads it back without knowing how they were made.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// Published (calls that succeeded).
    pub published: u64,
    /// Publish calls that failed.
    pub publish_errors: u64,
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
