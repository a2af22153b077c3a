//! The unit of every result: what one worker saw during one interval.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use throng_host::sample::HostSample;

/// Histograms record microseconds, from 1 µs to this (one hour), with 3
/// significant digits: the same shape in every worker, so merging is exact.
pub const HISTOGRAM_MAX_US: u64 = 3_600_000_000;
/// Significant digits of every histogram.
pub const HISTOGRAM_SIGFIG: u8 = 3;

/// A new empty histogram of the shape every interval uses.
pub fn new_histogram() -> Histogram<u64> {
    // Invariant: the bounds above are valid for hdrhistogram (low 1, high >= 2, sigfig <= 5).
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_US, HISTOGRAM_SIGFIG)
        .expect("valid histogram bounds")
}

/// What one source (a worker process) recorded in one interval.
///
/// Intervals are aligned on wall-clock time (`start_ns` a multiple of
/// `length_ns`), so records from any number of workers and machines line up
/// and merge exactly: counters and gauges add, histograms add.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    /// Start, ns since the Unix epoch, a multiple of `length_ns`.
    pub start_ns: u64,
    /// Length, ns (1 s unless the run says otherwise).
    pub length_ns: u64,
    /// Who recorded it: `"<host>/<role>-<n>"`, e.g. `"box1/hold-0"`.
    pub source: String,
    /// Events counted during this interval only (deltas), by dotted name:
    /// `connect.ok`, `connect.error.refused`, `messages.received`, `messages.lost`,
    /// `bytes.in`, `requests.sent`, `status.200`, ...
    pub counters: BTreeMap<String, u64>,
    /// Levels at the interval's end, by name (`connections.open`); summed across sources.
    pub gauges: BTreeMap<String, i64>,
    /// Latencies in µs recorded during this interval, by name
    /// (`connect`, `delivery`, `latency`, `service`).
    pub histograms: BTreeMap<String, Histogram<u64>>,
    /// The host sample taken at the interval's end, written by one process per host.
    pub host: Option<HostSample>,
}
