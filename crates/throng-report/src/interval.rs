//! The unit of every result: what one worker saw during one interval.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
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

/// The histograms of requests that got no answer, beside `latency` (the
/// answered ones): a timed-out request at the time it was given up (its
/// timeout, from its scheduled start), another failure at the time it
/// failed. Kept apart so that a file written before them still reads as
/// it was: there `latency` held the answered requests only.
pub const UNANSWERED: [&str; 2] = ["latency.timeout", "latency.error"];

/// The latency of every request: `latency` plus [`UNANSWERED`], or `None`
/// when `histograms` holds no unanswered part (an older file, or every
/// request answered: then `latency` is already every request).
pub fn every_request(histograms: &BTreeMap<String, Histogram<u64>>) -> Option<Histogram<u64>> {
    if !UNANSWERED.iter().any(|n| histograms.contains_key(*n)) {
        return None;
    }
    let mut all = new_histogram();
    for name in std::iter::once("latency").chain(UNANSWERED) {
        if let Some(h) = histograms.get(name) {
            // Same shape everywhere: adding is exact and cannot overflow.
            let _ = all.add(h);
        }
    }
    Some(all)
}

/// The statistics of every histogram in `histograms`, with `latency` made
/// the latency of every request ([`every_request`]) and the answered ones
/// alone kept as `latency.answered`, when there were unanswered ones.
pub fn latency_table(histograms: &BTreeMap<String, Histogram<u64>>) -> BTreeMap<String, HistStats> {
    let mut table: BTreeMap<String, HistStats> = histograms
        .iter()
        .map(|(k, h)| (k.clone(), HistStats::of(h)))
        .collect();
    if let Some(all) = every_request(histograms) {
        let answered = table.remove("latency").unwrap_or_default();
        table.insert("latency.answered".to_owned(), answered);
        table.insert("latency".to_owned(), HistStats::of(&all));
    }
    table
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
    /// The highest each level reached during the interval (tracked at every
    /// change, not sampled). A gauge missing here peaked at its end value (an
    /// older file, or a level no one tracks); see [`Interval::peak`]. Summed
    /// across sources, this is an upper bound of the sum's own peak (the
    /// sources need not peak at the same moment); for one source it is exact.
    pub peaks: BTreeMap<String, i64>,
    /// Latencies in µs recorded during this interval, by name
    /// (`connect`, `delivery`, `latency`, `service`).
    pub histograms: BTreeMap<String, Histogram<u64>>,
    /// The host sample taken at the interval's end, written by one process per host.
    pub host: Option<HostSample>,
}

impl Interval {
    /// An interval of `source` with nothing counted yet.
    pub fn empty(start_ns: u64, length_ns: u64, source: String) -> Self {
        Self {
            start_ns,
            length_ns,
            source,
            counters: BTreeMap::new(),
            gauges: BTreeMap::new(),
            peaks: BTreeMap::new(),
            histograms: BTreeMap::new(),
            host: None,
        }
    }

    /// The highest gauge `name` reached during the interval: its tracked
    /// peak, never below its end value (0 when it was not set).
    pub fn peak(&self, name: &str) -> i64 {
        match (self.peaks.get(name), self.gauges.get(name)) {
            (Some(p), Some(g)) => (*p).max(*g),
            (Some(v), None) | (None, Some(v)) => *v,
            (None, None) => 0,
        }
    }

    /// Every gauge's [`Interval::peak`], by name.
    pub fn all_peaks(&self) -> BTreeMap<String, i64> {
        self.gauges
            .keys()
            .chain(self.peaks.keys())
            .map(|k| (k.clone(), self.peak(k)))
            .collect()
    }

    /// Adds `other` into this one, as merging does: counters, gauges,
    /// peaks (each side's [`Interval::peak`]) and histograms add; the time,
    /// source and host sample stay this one's.
    pub fn add(&mut self, other: &Self) {
        let mut peaks = self.all_peaks();
        for (k, v) in other.all_peaks() {
            *peaks.entry(k).or_insert(0) += v;
        }
        self.peaks = peaks;
        for (k, v) in &other.counters {
            *self.counters.entry(k.clone()).or_insert(0) += v;
        }
        for (k, v) in &other.gauges {
            *self.gauges.entry(k.clone()).or_insert(0) += v;
        }
        for (k, h) in &other.histograms {
            let mine = self
                .histograms
                .entry(k.clone())
                .or_insert_with(new_histogram);
            // Every interval histogram has the shared shape, so adding cannot
            // overflow its range; one that does is foreign and is skipped.
            let _ = mine.add(h);
        }
    }

    /// Counter `name`, 0 when it was not counted.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// The sum of every counter whose name starts with `prefix`.
    pub fn counters_under(&self, prefix: &str) -> u64 {
        self.counters
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    }

    /// Gauge `name`, 0 when it was not set.
    pub fn gauge(&self, name: &str) -> i64 {
        self.gauges.get(name).copied().unwrap_or(0)
    }

    /// The latency of every request ([`every_request`]): `latency` with the
    /// timed-out and failed ones.
    pub fn every_request_stats(&self) -> HistStats {
        every_request(&self.histograms).map_or_else(|| self.stats("latency"), |h| HistStats::of(&h))
    }

    /// The latency summary of histogram `name` (all zero when it is missing).
    pub fn stats(&self, name: &str) -> HistStats {
        self.histograms
            .get(name)
            .map(HistStats::of)
            .unwrap_or_default()
    }
}

/// Statistics of one latency histogram, values in µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HistStats {
    /// Values recorded.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stddev: f64,
    /// Percentiles.
    pub p50: u64,
    /// 75th percentile.
    pub p75: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

impl HistStats {
    /// The statistics of `h` (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            min: h.min(),
            mean: h.mean(),
            stddev: h.stdev(),
            p50: h.value_at_quantile(0.50),
            p75: h.value_at_quantile(0.75),
            p90: h.value_at_quantile(0.90),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_sums_counters_gauges_and_histograms() {
        let mut a = Interval::empty(0, 1, "h/hold".into());
        let mut b = Interval::empty(0, 1, "h/hold-0".into());
        b.counters.insert("connect.ok".into(), 3);
        b.gauges.insert("connections.open".into(), 7);
        let mut h = new_histogram();
        h.record(250).unwrap();
        b.histograms.insert("connect".into(), h);
        a.add(&b);
        a.add(&b);
        assert_eq!(a.counter("connect.ok"), 6);
        assert_eq!(a.gauge("connections.open"), 14);
        assert_eq!(a.stats("connect").count, 2);
        assert_eq!(a.stats("missing").count, 0);
        assert_eq!(a.source, "h/hold");
    }

    #[test]
    fn peaks_default_to_the_end_level_and_add() {
        let mut a = Interval::empty(0, 1, "h/attack-0".into());
        a.gauges.insert("requests.in_flight".into(), 0);
        a.peaks.insert("requests.in_flight".into(), 4);
        let mut b = Interval::empty(0, 1, "h/attack-1".into());
        // An older record: no peaks, its end level is all that is known.
        b.gauges.insert("requests.in_flight".into(), 2);
        assert_eq!(a.peak("requests.in_flight"), 4);
        assert_eq!(b.peak("requests.in_flight"), 2);
        a.add(&b);
        assert_eq!(a.gauge("requests.in_flight"), 2);
        assert_eq!(a.peak("requests.in_flight"), 6);
        assert_eq!(a.peak("missing"), 0);
    }

    fn hist(values: &[u64]) -> Histogram<u64> {
        let mut h = new_histogram();
        for v in values {
            h.record(*v).unwrap();
        }
        h
    }

    #[test]
    fn every_request_counts_timeouts_at_their_timeout() {
        let mut iv = Interval::empty(0, 1, "h/attack-0".into());
        iv.histograms.insert("latency".into(), hist(&[500; 50]));
        iv.histograms
            .insert("latency.timeout".into(), hist(&[2_000_000; 50]));
        let all = iv.every_request_stats();
        assert_eq!(all.count, 100);
        assert!(all.p99 >= 1_990_000, "{all:?}");
        let table = latency_table(&iv.histograms);
        assert_eq!(table["latency"].count, 100);
        assert_eq!(table["latency.answered"].count, 50);
        assert_eq!(table["latency.timeout"].count, 50);
    }

    #[test]
    fn an_older_file_reads_as_it_was() {
        let mut iv = Interval::empty(0, 1, "h/attack-0".into());
        iv.histograms.insert("latency".into(), hist(&[500, 700]));
        assert!(every_request(&iv.histograms).is_none());
        assert_eq!(iv.every_request_stats().count, 2);
        let table = latency_table(&iv.histograms);
        assert_eq!(table.len(), 1);
        assert_eq!(table["latency"].count, 2);
    }

    #[test]
    fn nothing_answered_is_every_request_unanswered() {
        let mut iv = Interval::empty(0, 1, "h/attack-0".into());
        iv.histograms
            .insert("latency.timeout".into(), hist(&[500_000; 3]));
        let table = latency_table(&iv.histograms);
        assert_eq!(table["latency"].count, 3);
        assert_eq!(table["latency.answered"].count, 0);
    }
}
