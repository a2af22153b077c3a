//! Exact merging of intervals from any number of sources, files and
//! machines, aligned on wall-clock time into buckets of a chosen width.
//!
//! Counters add; gauges add across sources (each source's latest value in a
//! bucket, so a 10 s bucket does not count a level ten times); histograms add.
//! Host samples are kept per host (the latest in each bucket), so one host is
//! never counted twice, and host-wide figures sum different hosts.
//!
//! Bucket histograms are kept sparse (only the bins that hold counts), since
//! a full histogram of the v1 shape is ~190 KB and a long run has thousands of
//! buckets; every bin of the shared shape maps to one value, so the sparse
//! form is as exact as the full one.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use hdrhistogram::Histogram;
use throng_host::sample::HostSample;

use crate::format::{Event, Record};
use crate::interval::{Interval, new_histogram};

/// Events kept in memory for the report; beyond this they are only counted.
pub const MAX_EVENTS_KEPT: usize = 1_000;

/// A histogram of the v1 shape reduced to its non-empty bins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SparseHistogram {
    /// Lowest value of each non-empty bin → its count.
    bins: BTreeMap<u64, u64>,
}

impl SparseHistogram {
    /// Adds every count of `h` (which must have the v1 shape).
    pub fn add(&mut self, h: &Histogram<u64>) {
        for v in h.iter_recorded() {
            let bin = h.lowest_equivalent(v.value_iterated_to());
            *self.bins.entry(bin).or_insert(0) += v.count_at_value();
        }
    }

    /// Total count.
    pub fn len(&self) -> u64 {
        self.bins.values().sum()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.bins.is_empty()
    }

    /// Writes the counts into `into` (reset first), so hdrhistogram's own
    /// statistics apply.
    pub fn fill(&self, into: &mut Histogram<u64>) {
        into.reset();
        for (&value, &count) in &self.bins {
            // Invariant: `value` is the lowest value of a bin of the v1 shape,
            // which `into` (also v1) can hold.
            into.record_n(value, count)
                .expect("bin of the shared shape");
        }
    }

    /// A full histogram with these counts.
    pub fn to_histogram(&self) -> Histogram<u64> {
        let mut h = new_histogram();
        self.fill(&mut h);
        h
    }
}

/// Everything merged into one time bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// Start, ns since the epoch, a multiple of the merge width.
    pub start_ns: u64,
    /// Length: the merge width, or the longest interval in it if longer.
    pub length_ns: u64,
    /// Counters summed over every interval in the bucket.
    pub counters: BTreeMap<String, u64>,
    /// Histograms summed over every interval in the bucket.
    pub histograms: BTreeMap<String, SparseHistogram>,
    /// Each source's latest gauges in the bucket: source → (interval start, gauges).
    pub gauges_by_source: BTreeMap<String, (u64, BTreeMap<String, i64>)>,
    /// Each host's latest sample in the bucket.
    pub hosts: BTreeMap<String, HostSample>,
    /// Intervals merged into it.
    pub intervals: u64,
}

impl Bucket {
    fn new(start_ns: u64, length_ns: u64) -> Self {
        Self {
            start_ns,
            length_ns,
            counters: BTreeMap::new(),
            histograms: BTreeMap::new(),
            gauges_by_source: BTreeMap::new(),
            hosts: BTreeMap::new(),
            intervals: 0,
        }
    }

    /// Gauges summed across sources.
    pub fn gauges(&self) -> BTreeMap<String, i64> {
        let mut sum = BTreeMap::new();
        for (_, gauges) in self.gauges_by_source.values() {
            for (name, v) in gauges {
                *sum.entry(name.clone()).or_insert(0i64) += *v;
            }
        }
        sum
    }
}

/// The result of merging: buckets in time order and whole-run totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    /// Bucket width, ns.
    pub width_ns: u64,
    /// Non-empty buckets in time order.
    pub buckets: Vec<Bucket>,
    /// Counters summed over the whole run.
    pub counters: BTreeMap<String, u64>,
    /// Histograms summed over the whole run.
    pub histograms: BTreeMap<String, Histogram<u64>>,
    /// Every source seen.
    pub sources: BTreeSet<String>,
    /// Each host's first and last sample of the run.
    pub host_span: BTreeMap<String, (HostSample, HostSample)>,
    /// Events, in the order read, at most [`MAX_EVENTS_KEPT`].
    pub events: Vec<Event>,
    /// Events by kind, all of them.
    pub event_kinds: BTreeMap<String, u64>,
    /// Intervals merged.
    pub intervals: u64,
    /// Intervals skipped because the same source and start were already merged.
    pub duplicates: u64,
}

/// Merges records one at a time; [`Merger::finish`] gives the result.
#[derive(Debug)]
pub struct Merger {
    width_ns: u64,
    buckets: BTreeMap<u64, Bucket>,
    seen: HashSet<(String, u64)>,
    merged: Merged,
}

impl Merger {
    /// Merges into buckets `width_ns` wide (at least 1 ns).
    pub fn new(width_ns: u64) -> Self {
        let width_ns = width_ns.max(1);
        Self {
            width_ns,
            buckets: BTreeMap::new(),
            seen: HashSet::new(),
            merged: Merged {
                width_ns,
                buckets: Vec::new(),
                counters: BTreeMap::new(),
                histograms: BTreeMap::new(),
                sources: BTreeSet::new(),
                host_span: BTreeMap::new(),
                events: Vec::new(),
                event_kinds: BTreeMap::new(),
                intervals: 0,
                duplicates: 0,
            },
        }
    }

    /// Merges one record of a result file; headers are ignored here.
    pub fn add(&mut self, record: Record) {
        match record {
            Record::Interval(iv) => {
                self.add_interval(&iv);
            }
            Record::Event(ev) => self.add_event(ev),
            Record::Header(_) | Record::Unknown(_) => {}
        }
    }

    /// Merges one interval; returns false (and merges nothing) if an interval
    /// of the same source and start was merged already.
    pub fn add_interval(&mut self, iv: &Interval) -> bool {
        if !self.seen.insert((iv.source.clone(), iv.start_ns)) {
            self.merged.duplicates += 1;
            return false;
        }
        let m = &mut self.merged;
        m.intervals += 1;
        if !m.sources.contains(&iv.source) {
            m.sources.insert(iv.source.clone());
        }
        let start = iv.start_ns - iv.start_ns % self.width_ns;
        let bucket = self
            .buckets
            .entry(start)
            .or_insert_with(|| Bucket::new(start, self.width_ns));
        bucket.length_ns = bucket.length_ns.max(iv.length_ns);
        bucket.intervals += 1;
        for (name, v) in &iv.counters {
            add_to(&mut bucket.counters, name, *v);
            add_to(&mut m.counters, name, *v);
        }
        for (name, h) in &iv.histograms {
            bucket.histograms.entry(name.clone()).or_default().add(h);
            match m.histograms.get_mut(name) {
                // Invariant: decoded histograms all have the v1 shape, so
                // adding never needs to grow the total.
                Some(total) => total.add(h).expect("histograms of the shared shape add"),
                None => {
                    m.histograms.insert(name.clone(), h.clone());
                }
            }
        }
        if !iv.gauges.is_empty() {
            match bucket.gauges_by_source.get_mut(&iv.source) {
                Some((at, _)) if *at > iv.start_ns => {}
                Some(slot) => *slot = (iv.start_ns, iv.gauges.clone()),
                None => {
                    bucket
                        .gauges_by_source
                        .insert(iv.source.clone(), (iv.start_ns, iv.gauges.clone()));
                }
            }
        }
        if let Some(sample) = &iv.host {
            match bucket.hosts.get_mut(&sample.host) {
                Some(kept) if kept.at_ns >= sample.at_ns => {}
                Some(kept) => *kept = sample.clone(),
                None => {
                    bucket.hosts.insert(sample.host.clone(), sample.clone());
                }
            }
            match m.host_span.get_mut(&sample.host) {
                Some((first, last)) => {
                    if sample.at_ns < first.at_ns {
                        *first = sample.clone();
                    }
                    if sample.at_ns > last.at_ns {
                        *last = sample.clone();
                    }
                }
                None => {
                    m.host_span
                        .insert(sample.host.clone(), (sample.clone(), sample.clone()));
                }
            }
        }
        true
    }

    /// Keeps one event (up to [`MAX_EVENTS_KEPT`]) and counts its kind.
    pub fn add_event(&mut self, ev: Event) {
        add_to(&mut self.merged.event_kinds, &ev.kind, 1);
        if self.merged.events.len() < MAX_EVENTS_KEPT {
            self.merged.events.push(ev);
        }
    }

    /// The merged run.
    pub fn finish(mut self) -> Merged {
        self.merged.buckets = self.buckets.into_values().collect();
        self.merged
    }
}

/// Reads and merges any number of result files into buckets `width_ns`
/// wide. Damage in a file stops that file only and is in its summary.
pub fn merge_files<P: AsRef<std::path::Path>>(
    paths: &[P],
    width_ns: u64,
) -> Result<(Merged, Vec<crate::format::FileSummary>), crate::format::ReadError> {
    let mut merger = Merger::new(width_ns);
    let files = crate::format::read_files(paths, |_, record| merger.add(record))?;
    Ok((merger.finish(), files))
}

fn add_to(map: &mut BTreeMap<String, u64>, name: &str, v: u64) {
    match map.get_mut(name) {
        Some(total) => *total = total.saturating_add(v),
        None => {
            map.insert(name.to_owned(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(source: &str, second: u64, open: i64, values: &[u64]) -> Interval {
        let mut h = new_histogram();
        for v in values {
            h.record(*v).unwrap();
        }
        Interval {
            start_ns: second * 1_000_000_000,
            length_ns: 1_000_000_000,
            source: source.to_owned(),
            counters: BTreeMap::from([("messages.received".to_owned(), values.len() as u64)]),
            gauges: BTreeMap::from([("connections.open".to_owned(), open)]),
            histograms: BTreeMap::from([("delivery".to_owned(), h)]),
            host: None,
        }
    }

    #[test]
    fn sparse_histograms_are_exact() {
        let mut h = new_histogram();
        for v in [1, 2, 1_000, 1_001, 99_999, 3_599_999_999] {
            h.record(v).unwrap();
        }
        let mut s = SparseHistogram::default();
        s.add(&h);
        s.add(&h);
        let mut twice = h.clone();
        twice.add(&h).unwrap();
        assert_eq!(s.to_histogram(), twice);
        assert_eq!(s.len(), 12);
    }

    #[test]
    fn wide_buckets_add_counters_but_take_each_sources_last_gauge() {
        let mut m = Merger::new(10_000_000_000);
        for s in 0..10 {
            m.add_interval(&iv("a/hold-0", 100 + s, 10 * s as i64, &[s + 1]));
            m.add_interval(&iv("a/hold-1", 100 + s, 1, &[s + 100]));
        }
        assert!(!m.add_interval(&iv("a/hold-1", 105, 1, &[5])));
        let merged = m.finish();
        assert_eq!(merged.buckets.len(), 1);
        let b = &merged.buckets[0];
        assert_eq!(b.counters["messages.received"], 20);
        assert_eq!(b.gauges()["connections.open"], 90 + 1);
        assert_eq!(b.histograms["delivery"].len(), 20);
        assert_eq!(merged.duplicates, 1);
        assert_eq!(merged.intervals, 20);
        assert_eq!(merged.histograms["delivery"].len(), 20);
    }

    #[test]
    fn one_host_is_never_counted_twice() {
        let mut m = Merger::new(1_000_000_000);
        for (source, at, estab) in [
            ("a/hold-0", 5, 10),
            ("a/hold-1", 7, 12),
            ("b/hold-0", 6, 100),
        ] {
            let mut i = iv(source, 1, 0, &[]);
            i.host = Some(HostSample {
                host: source[..1].to_owned(),
                at_ns: at,
                tcp_established: estab,
                ..HostSample::default()
            });
            m.add_interval(&i);
        }
        let merged = m.finish();
        let hosts = &merged.buckets[0].hosts;
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts["a"].tcp_established, 12);
        assert_eq!(hosts["b"].tcp_established, 100);
    }
}
