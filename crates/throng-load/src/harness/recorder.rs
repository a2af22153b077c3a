//! The recorder interface: what a worker counts during an interval, handed
//! over as one [`Interval`] record when the interval ends.
//!
//! Recording is on the hot path (every delivered message, every request),
//! so a role's recorder keeps plain integers and a few histograms and
//! builds the named maps of an [`Interval`] only once per interval, with
//! [`Take`]. The worker core calls [`Recorder::take`] at every interval
//! boundary, whatever the role.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use throng_report::interval::{HISTOGRAM_MAX_US, Interval};

/// What a role's worker counts, one interval at a time.
pub trait Recorder {
    /// The interval starting at `start_ns`: everything counted since the
    /// last call. Counters and histograms start again from zero; levels
    /// (gauges) carry on.
    fn take(&mut self, start_ns: u64) -> Interval;
}

/// Records `us` in `h`, clamped to the shared histogram range (a value
/// outside it would be an error, and every value must be counted).
pub fn record(h: &mut Histogram<u64>, us: u64) {
    h.saturating_record(us.clamp(1, HISTOGRAM_MAX_US));
}

/// Builds an interval's named maps, moving each count out of the
/// recorder as it goes (so a recorder needs no separate reset).
#[derive(Debug, Default)]
pub struct Take {
    counters: BTreeMap<String, u64>,
    gauges: BTreeMap<String, i64>,
    peaks: BTreeMap<String, i64>,
    histograms: BTreeMap<String, Histogram<u64>>,
}

/// A level (connections open, requests in flight) and the highest it
/// reached since the last interval: a peak is tracked at every change, so
/// a level that rises and falls within an interval is not missed by the
/// sample at its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Level {
    now: i64,
    peak: i64,
}

impl Level {
    /// The level now.
    pub fn get(self) -> i64 {
        self.now
    }

    /// One more.
    pub fn up(&mut self) {
        self.add(1);
    }

    /// One less.
    pub fn down(&mut self) {
        self.add(-1);
    }

    /// `n` more (or less).
    pub fn add(&mut self, n: i64) {
        self.now += n;
        self.peak = self.peak.max(self.now);
    }

    /// Sets the level.
    pub fn set(&mut self, v: i64) {
        self.now = v;
        self.peak = self.peak.max(v);
    }

    /// The highest since the last call; the next interval's peak starts at
    /// the level now.
    fn take_peak(&mut self) -> i64 {
        std::mem::replace(&mut self.peak, self.now)
    }
}

impl Take {
    /// Moves counter `n` out under `name` (left at zero); a zero is not written.
    pub fn count(&mut self, name: &str, n: &mut u64) -> &mut Self {
        let v = std::mem::take(n);
        if v > 0 {
            *self.counters.entry(name.to_owned()).or_insert(0) += v;
        }
        self
    }

    /// Moves every counter of `named` out (leaving it empty).
    pub fn counts(&mut self, named: &mut BTreeMap<String, u64>) -> &mut Self {
        for (name, v) in std::mem::take(named) {
            *self.counters.entry(name).or_insert(0) += v;
        }
        self
    }

    /// Copies histogram `h` out under `name` and empties it; an empty one is not written.
    pub fn histogram(&mut self, name: &str, h: &mut Histogram<u64>) -> &mut Self {
        if !h.is_empty() {
            self.histograms.insert(name.to_owned(), h.clone());
            h.reset();
        }
        self
    }

    /// Gauge `name` at the interval's end (levels are always written).
    pub fn gauge(&mut self, name: &str, v: i64) -> &mut Self {
        self.gauges.insert(name.to_owned(), v);
        self
    }

    /// Level `name`: its value now as the gauge, and its peak since the
    /// last interval (then started again from the value now).
    pub fn level(&mut self, name: &str, l: &mut Level) -> &mut Self {
        self.gauges.insert(name.to_owned(), l.get());
        self.peaks.insert(name.to_owned(), l.take_peak());
        self
    }

    /// The interval of `source` starting at `start_ns`.
    pub fn into_interval(self, start_ns: u64, length_ns: u64, source: String) -> Interval {
        Interval {
            counters: self.counters,
            gauges: self.gauges,
            peaks: self.peaks,
            histograms: self.histograms,
            ..Interval::empty(start_ns, length_ns, source)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use throng_report::interval::new_histogram;

    #[test]
    fn a_level_keeps_its_peak_between_interval_ends() {
        let mut l = Level::default();
        for _ in 0..5 {
            l.up();
        }
        for _ in 0..5 {
            l.down();
        }
        let mut take = Take::default();
        take.level("requests.in_flight", &mut l);
        let iv = take.into_interval(0, 1, "h/x-0".into());
        assert_eq!(iv.gauge("requests.in_flight"), 0);
        assert_eq!(iv.peak("requests.in_flight"), 5);
        // The next interval's peak starts at the level now.
        l.up();
        let mut take = Take::default();
        take.level("requests.in_flight", &mut l);
        let iv = take.into_interval(1, 1, "h/x-0".into());
        assert_eq!(iv.peak("requests.in_flight"), 1);
    }

    #[test]
    fn take_moves_counts_out_and_skips_zeroes() {
        let (mut sent, mut zero) = (3u64, 0u64);
        let mut h = new_histogram();
        record(&mut h, 0);
        record(&mut h, u64::MAX);
        let mut take = Take::default();
        take.count("sent", &mut sent)
            .count("none", &mut zero)
            .histogram("latency", &mut h)
            .gauge("open", 0);
        let iv = take.into_interval(5, 1, "h/x-0".into());
        assert_eq!(sent, 0);
        assert_eq!(iv.counter("sent"), 3);
        assert!(!iv.counters.contains_key("none"));
        assert_eq!(iv.stats("latency").count, 2);
        assert_eq!(iv.stats("latency").min, 1);
        assert!(h.is_empty());
        assert_eq!(iv.gauges["open"], 0);
        assert_eq!((iv.start_ns, iv.source.as_str()), (5, "h/x-0"));
    }
}
