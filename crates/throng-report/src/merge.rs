//! Exact merging of intervals from any number of sources, files and
//! machines, aligned on wall-clock time into buckets of a chosen width: the
//! one merger of results, fed one record at a time, from files (`throng
//! report`, `bench`) or live as workers send them (the harness's collector,
//! which flushes each interval as it completes: [`Merger::flush`]).
//!
//! Counters add; gauges add across sources (each source's latest value in a
//! bucket, so a 10 s bucket does not count a level ten times); histograms add.
//! A source with no record in a bucket between its first and its last one
//! (a worker held up for seconds skips the intervals it slept through)
//! keeps its last level there, so a busy run's levels do not fall to a
//! partial sum ([`Levels`], the one place levels are carried forward; live,
//! where a source's last record is not known yet, a source keeps its level
//! until it is forgotten).
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

use crate::bench::BenchSummary;
use crate::events::{EventGroup, Groups};
use crate::fanout::{self, Spread};
use crate::format::{Event, Record};
use crate::interval::{Interval, new_histogram};

/// Events kept in memory for the report; beyond this they are only counted.
pub const MAX_EVENTS_KEPT: usize = 1_000;

/// A histogram of the v1 shape reduced to its non-empty bins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SparseHistogram {
    /// (lowest value of a bin, its count), sorted by value, counts non-zero.
    /// A sorted vector rather than a map: a long run keeps thousands of these.
    bins: Vec<(u64, u64)>,
}

impl SparseHistogram {
    /// Adds every count of `h` (which must have the v1 shape).
    pub fn add(&mut self, h: &Histogram<u64>) {
        let new = h.iter_recorded().map(|v| {
            (
                h.lowest_equivalent(v.value_iterated_to()),
                v.count_at_value(),
            )
        });
        if self.bins.is_empty() {
            self.bins.extend(new);
            return;
        }
        // Merge two sorted runs.
        let old = std::mem::take(&mut self.bins);
        let mut merged = Vec::with_capacity(old.len() + 16);
        let mut old = old.into_iter().peekable();
        for (value, count) in new {
            while let Some(&(v, c)) = old.peek() {
                if v >= value {
                    break;
                }
                merged.push((v, c));
                old.next();
            }
            match old.peek() {
                Some(&(v, c)) if v == value => {
                    merged.push((v, c.saturating_add(count)));
                    old.next();
                }
                _ => merged.push((value, count)),
            }
        }
        merged.extend(old);
        self.bins = merged;
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Self) {
        let old = std::mem::take(&mut self.bins);
        let mut merged = Vec::with_capacity(old.len().max(other.bins.len()));
        let (mut a, mut b) = (
            old.into_iter().peekable(),
            other.bins.iter().copied().peekable(),
        );
        loop {
            match (a.peek().copied(), b.peek().copied()) {
                (Some(x), Some(y)) if x.0 == y.0 => {
                    merged.push((x.0, x.1.saturating_add(y.1)));
                    a.next();
                    b.next();
                }
                (Some(x), Some(y)) if x.0 < y.0 => {
                    merged.push(x);
                    a.next();
                }
                (_, Some(y)) => {
                    merged.push(y);
                    b.next();
                }
                (Some(x), None) => {
                    merged.push(x);
                    a.next();
                }
                (None, None) => break,
            }
        }
        self.bins = merged;
    }

    /// Total count.
    pub fn len(&self) -> u64 {
        self.bins
            .iter()
            .fold(0u64, |n, (_, c)| n.saturating_add(*c))
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.bins.is_empty()
    }

    /// Writes the counts into `into` (reset first), so hdrhistogram's own
    /// statistics apply.
    pub fn fill(&self, into: &mut Histogram<u64>) {
        into.reset();
        for &(value, count) in &self.bins {
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
    /// Each source's highest peak of each gauge over its intervals in the
    /// bucket (exact per source: its own tracked maximum).
    pub peaks_by_source: BTreeMap<String, BTreeMap<String, i64>>,
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
            peaks_by_source: BTreeMap::new(),
            hosts: BTreeMap::new(),
            intervals: 0,
        }
    }

    /// Keeps `source`'s peaks `peaks` where they are higher than its own so far.
    fn note_peaks(&mut self, source: &str, peaks: BTreeMap<String, i64>) {
        let mine = self.peaks_by_source.entry(source.to_owned()).or_default();
        for (name, v) in peaks {
            let p = mine.entry(name).or_insert(v);
            *p = (*p).max(v);
        }
    }

    /// Adds everything of `other` (a neighbouring bucket) into this one.
    fn absorb(&mut self, other: Self) {
        self.length_ns = self.length_ns.max(other.length_ns);
        self.intervals += other.intervals;
        for (name, v) in other.counters {
            add_to(&mut self.counters, &name, v);
        }
        for (name, h) in other.histograms {
            self.histograms.entry(name).or_default().merge(&h);
        }
        for (source, (at, gauges)) in other.gauges_by_source {
            match self.gauges_by_source.get_mut(&source) {
                Some(slot) if slot.0 >= at => {}
                Some(slot) => *slot = (at, gauges),
                None => {
                    self.gauges_by_source.insert(source, (at, gauges));
                }
            }
        }
        for (source, peaks) in other.peaks_by_source {
            self.note_peaks(&source, peaks);
        }
        for (host, sample) in other.hosts {
            match self.hosts.get_mut(&host) {
                Some(kept) if kept.at_ns >= sample.at_ns => {}
                Some(kept) => *kept = sample,
                None => {
                    self.hosts.insert(host, sample);
                }
            }
        }
    }

    /// The peak of each gauge in the bucket, as honest as the records
    /// allow: each source's own peak (exact: tracked at every change; its
    /// level where it has no record in the bucket), summed over sources.
    /// For one source this is exact; for several it is an upper bound of
    /// the sum's true peak (they need not peak at the same moment), and
    /// never below the summed level at the bucket's end ([`Bucket::gauges`]).
    pub fn peaks(&self) -> BTreeMap<String, i64> {
        let mut sum = BTreeMap::new();
        for (source, (_, gauges)) in &self.gauges_by_source {
            let peaks = self.peaks_by_source.get(source);
            for (name, v) in gauges {
                let p = peaks.and_then(|p| p.get(name)).map_or(*v, |p| (*p).max(*v));
                *sum.entry(name.clone()).or_insert(0i64) += p;
            }
        }
        sum
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
    /// Events grouped (kind and text alike), all of them.
    pub event_groups: Vec<EventGroup>,
    /// What each bench among the files found, in the order read.
    pub benches: Vec<BenchSummary>,
    /// Intervals merged.
    pub intervals: u64,
    /// Intervals skipped because the same source and start were already merged.
    pub duplicates: u64,
    /// Arrivals of each message the server made, from the workers'
    /// [`fanout::KIND`] events (kept out of `events`: one is long).
    pub arrivals: Spread,
}

/// Merges records one at a time; [`Merger::finish`] gives the result of
/// a whole run, and a live merger ([`Merger::live`]) gives each interval
/// as it completes ([`Merger::flush`]) and the run's totals.
#[derive(Debug)]
pub struct Merger {
    width_ns: u64,
    buckets: BTreeMap<u64, Bucket>,
    /// When more buckets than this exist, the width doubles and neighbours merge.
    max_buckets: Option<usize>,
    /// Whether buckets keep histograms (a time series of latency needs them;
    /// whole-run figures do not, and they are most of a long run's memory).
    bucket_histograms: bool,
    seen: HashSet<(String, u64)>,
    groups: Groups,
    merged: Merged,
    /// Live merging: what has been flushed.
    live: Option<Live>,
    /// Every run id seen in headers, in order (empty: a file from before
    /// run ids, which merges by source name as it always did).
    runs: Vec<String>,
    /// What the current run's sources get appended, to keep them apart from
    /// another run's of the same name: empty for the first run.
    run_tag: String,
}

/// What a live merger keeps besides its open buckets.
#[derive(Debug)]
struct Live {
    /// The source flushed intervals carry (`host/hold`).
    source: String,
    /// Each source's last known levels, as of the intervals flushed.
    levels: Levels,
    /// The sources of each open bucket's records, by its start: the
    /// duplicates a live merger skips (instead of `seen`, which would grow
    /// with the run).
    reported: BTreeMap<u64, HashSet<String>>,
    /// The start of the last interval flushed (0: none yet).
    flushed_to: u64,
    /// Every interval flushed, added (late records included).
    total: Interval,
}

/// An interval flushed by a live merger.
#[derive(Debug)]
pub struct Flushed {
    /// Counts and histograms of every record of the interval, and the own
    /// record given; gauges: every source's last known level (none when
    /// `again`).
    pub interval: Interval,
    /// The interval was flushed before: these are late records, whose
    /// counts add to the totals and whose levels only update what is known.
    pub again: bool,
}

impl Merger {
    /// Merges into buckets `width_ns` wide (at least 1 ns), keeping
    /// histograms per bucket, as many buckets as the run needs.
    pub fn new(width_ns: u64) -> Self {
        let width_ns = width_ns.max(1);
        Self {
            width_ns,
            buckets: BTreeMap::new(),
            max_buckets: None,
            bucket_histograms: true,
            seen: HashSet::new(),
            groups: Groups::default(),
            merged: Merged {
                width_ns,
                buckets: Vec::new(),
                counters: BTreeMap::new(),
                histograms: BTreeMap::new(),
                sources: BTreeSet::new(),
                host_span: BTreeMap::new(),
                events: Vec::new(),
                event_kinds: BTreeMap::new(),
                event_groups: Vec::new(),
                benches: Vec::new(),
                intervals: 0,
                duplicates: 0,
                arrivals: Spread::default(),
            },
            live: None,
            runs: Vec::new(),
            run_tag: String::new(),
        }
    }

    /// The records that follow are `run`'s (a header's run id): the first
    /// run's sources keep their names, a later one's get ` (run N)`, so two
    /// runs whose sources share names (two attacks at once on one host)
    /// merge as two: every interval counted, levels summed over both.
    fn start_run(&mut self, run: &str) {
        let n = match self.runs.iter().position(|r| r == run) {
            Some(n) => n,
            None => {
                self.runs.push(run.to_owned());
                self.runs.len() - 1
            }
        };
        self.run_tag = if n == 0 || run.is_empty() {
            String::new()
        } else {
            format!(" (run {})", n + 1)
        };
    }

    /// A live merger: intervals of `length_ns` are flushed one by one as
    /// they complete ([`Merger::flush`]), labelled `source`; its totals
    /// start at `start_ns`. Buckets keep no histograms past their flush.
    pub fn live(source: String, start_ns: u64, length_ns: u64) -> Self {
        let mut m = Self::new(length_ns);
        m.live = Some(Live {
            total: Interval::empty(start_ns, m.width_ns, source.clone()),
            source,
            levels: Levels::default(),
            reported: BTreeMap::new(),
            flushed_to: 0,
        });
        m
    }

    /// The starts of the buckets not flushed yet, in time order.
    pub fn open(&self) -> Vec<u64> {
        self.buckets.keys().copied().collect()
    }

    /// Whether a bucket starts at `start` (open: not flushed since its last record).
    pub fn is_open(&self, start: u64) -> bool {
        self.buckets.contains_key(&start)
    }

    /// Whether `source`'s record of the interval at `start` was merged.
    pub fn has(&self, source: &str, start: u64) -> bool {
        match &self.live {
            Some(live) => live
                .reported
                .get(&start)
                .is_some_and(|r| r.contains(source)),
            None => self.seen.contains(&(source.to_owned(), start)),
        }
    }

    /// Whether the interval at `start` was flushed already (a record of it
    /// now is late).
    pub fn flushed(&self, start: u64) -> bool {
        self.live.as_ref().is_some_and(|l| start <= l.flushed_to)
    }

    /// `source`'s levels count no more (a worker that died took its
    /// connections with it).
    pub fn forget(&mut self, source: &str) {
        if let Some(live) = self.live.as_mut() {
            live.levels.forget(source);
        }
    }

    /// Flushes the bucket at `start` of a live merger: its counts and
    /// histograms, `own` (the supervisor's record: its counts, its levels
    /// as they are, its host sample) added, and every source's last known
    /// level; and adds that to the totals. `None` when no bucket is open
    /// there, or the merger is not live.
    pub fn flush(&mut self, start: u64, own: Option<&Interval>) -> Option<Flushed> {
        let live = self.live.as_mut()?;
        let mut bucket = self.buckets.remove(&start)?;
        live.reported.remove(&start);
        let again = start <= live.flushed_to;
        let mut interval = Interval::empty(start, bucket.length_ns, live.source.clone());
        interval.counters = std::mem::take(&mut bucket.counters);
        interval.histograms = bucket
            .histograms
            .iter()
            .map(|(name, h)| (name.clone(), h.to_histogram()))
            .collect();
        for (source, (at, gauges)) in &bucket.gauges_by_source {
            live.levels.note(source, *at, gauges);
        }
        // Late records (`again`) bring their own peaks, beside every other
        // source's level as last known; their levels only update `levels`.
        live.levels.fill(&mut bucket.gauges_by_source, |_| true);
        interval.peaks = bucket.peaks();
        if !again {
            interval.gauges = bucket.gauges();
            live.flushed_to = start;
        }
        if let Some(own) = own {
            interval.add(own);
            interval.host.clone_from(&own.host);
        }
        live.total.add(&interval);
        Some(Flushed { interval, again })
    }

    /// Every interval flushed so far, added (late records included).
    pub fn total(&self) -> Option<&Interval> {
        self.live.as_ref().map(|l| &l.total)
    }

    /// The totals of a live merger, once everything is flushed.
    pub fn into_total(self) -> Option<Interval> {
        self.live.map(|l| l.total)
    }

    /// Keeps at most `n` buckets (at least 2): past that the width doubles
    /// and neighbouring buckets merge, so a plot of a long run stays small.
    pub fn with_max_buckets(mut self, n: usize) -> Self {
        self.max_buckets = Some(n.max(2));
        self
    }

    /// Keeps no histograms per bucket (only the whole run's).
    pub fn without_bucket_histograms(mut self) -> Self {
        self.bucket_histograms = false;
        self
    }

    /// Merges one record of a result file; a header says whose run follows.
    pub fn add(&mut self, record: &Record) {
        match record {
            Record::Interval(iv) => {
                self.add_interval(iv);
            }
            Record::Event(ev) => self.add_event(ev.clone()),
            // The same file given twice is one bench.
            Record::Bench(b) if !self.merged.benches.contains(b) => {
                self.merged.benches.push(b.clone());
            }
            Record::Header(h) => self.start_run(&h.run),
            Record::Bench(_) | Record::Unknown(_) => {}
        }
    }

    /// Doubles the width until the buckets fit under the maximum.
    fn coarsen(&mut self) {
        let Some(max) = self.max_buckets else { return };
        while self.buckets.len() > max {
            self.width_ns = self.width_ns.saturating_mul(2);
            let old = std::mem::take(&mut self.buckets);
            for (_, mut b) in old {
                let start = b.start_ns - b.start_ns % self.width_ns;
                match self.buckets.get_mut(&start) {
                    Some(kept) => kept.absorb(b),
                    None => {
                        b.start_ns = start;
                        b.length_ns = b.length_ns.max(self.width_ns);
                        self.buckets.insert(start, b);
                    }
                }
            }
        }
        self.merged.width_ns = self.width_ns;
    }

    /// Merges one interval; returns false (and merges nothing) if an interval
    /// of the same source and start was merged already.
    pub fn add_interval(&mut self, iv: &Interval) -> bool {
        let source = if self.run_tag.is_empty() {
            iv.source.clone()
        } else {
            format!("{}{}", iv.source, self.run_tag)
        };
        let start = iv.start_ns - iv.start_ns % self.width_ns;
        let new = match self.live.as_mut() {
            // Live, a bucket is one interval (the width is the interval's
            // length), and what it holds is dropped at its flush.
            Some(live) => live
                .reported
                .entry(start)
                .or_default()
                .insert(source.clone()),
            None => self.seen.insert((source.clone(), iv.start_ns)),
        };
        if !new {
            self.merged.duplicates += 1;
            return false;
        }
        let m = &mut self.merged;
        m.intervals += 1;
        if !m.sources.contains(&source) {
            m.sources.insert(source.clone());
        }
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
            if self.bucket_histograms {
                bucket.histograms.entry(name.clone()).or_default().add(h);
            }
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
            bucket.note_peaks(&source, iv.all_peaks());
            match bucket.gauges_by_source.get_mut(&source) {
                Some((at, _)) if *at > iv.start_ns => {}
                Some(slot) => *slot = (iv.start_ns, iv.gauges.clone()),
                None => {
                    bucket
                        .gauges_by_source
                        .insert(source, (iv.start_ns, iv.gauges.clone()));
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
        if self.max_buckets.is_some_and(|max| self.buckets.len() > max) {
            self.coarsen();
        }
        true
    }

    /// Keeps one event (up to [`MAX_EVENTS_KEPT`]) and counts its kind.
    pub fn add_event(&mut self, ev: Event) {
        add_to(&mut self.merged.event_kinds, &ev.kind, 1);
        if ev.kind == fanout::KIND && self.merged.arrivals.add_text(&ev.text) {
            return;
        }
        self.groups.add(&ev);
        if self.merged.events.len() < MAX_EVENTS_KEPT {
            self.merged.events.push(ev);
        }
    }

    /// The merged run.
    pub fn finish(mut self) -> Merged {
        let mut buckets: Vec<Bucket> = self.buckets.into_values().collect();
        carry_levels(&mut buckets);
        self.merged.buckets = buckets;
        self.merged.event_groups = self.groups.into_groups();
        self.merged
    }
}

/// Reads and merges any number of result files into buckets `width_ns`
/// wide. Damage in a file stops that file only and is in its summary.
pub fn merge_files<P: AsRef<std::path::Path>>(
    paths: &[P],
    width_ns: u64,
) -> Result<(Merged, Vec<crate::format::FileSummary>), crate::format::ReadError> {
    let mut mergers = [Merger::new(width_ns)];
    let files = merge_files_into(paths, &mut mergers)?;
    let [merger] = mergers;
    Ok((merger.finish(), files))
}

/// The files grouped by the kind of run that wrote them (its header's
/// [`Header::kind`](crate::format::Header::kind): `hold`, `attack`,
/// `bench`, `knee`), kinds in the order first seen. Runs of different
/// kinds do not add up (a hold's histograms and an attack's are different
/// things), so a report of more than one group shows each apart.
pub fn group_by_kind<P: AsRef<std::path::Path>>(
    paths: &[P],
) -> Result<Vec<(String, Vec<std::path::PathBuf>)>, crate::format::ReadError> {
    let mut groups: Vec<(String, Vec<std::path::PathBuf>)> = Vec::new();
    for path in paths {
        let kind = match crate::vegeta::sniff(path.as_ref())? {
            // Vegeta's results are an attack's.
            Some(_) => "attack".to_owned(),
            None => crate::format::Reader::open(path)?.header().kind(),
        };
        let path = path.as_ref().to_path_buf();
        match groups.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, files)) => files.push(path),
            None => groups.push((kind, vec![path])),
        }
    }
    // A file that does not say its kind (a header without a command or
    // settings) goes with the others rather than make a kind of its own.
    if groups.len() > 1
        && let Some(i) = groups
            .iter()
            .position(|(k, _)| k == crate::format::UNKNOWN_KIND)
    {
        let (_, files) = groups.remove(i);
        groups[0].1.extend(files);
    }
    Ok(groups)
}

/// Reads the files once, feeding every record to each merger (say, one for
/// a text report and one bounded in buckets for a plot).
pub fn merge_files_into<P: AsRef<std::path::Path>>(
    paths: &[P],
    mergers: &mut [Merger],
) -> Result<Vec<crate::format::FileSummary>, crate::format::ReadError> {
    crate::vegeta::read_files(paths, |_, record| {
        for m in mergers.iter_mut() {
            m.add(&record);
        }
    })
}

/// Gives every bucket between a source's first and last one with its
/// levels, where it has none, its last level before.
fn carry_levels(buckets: &mut [Bucket]) {
    let mut last_at: BTreeMap<String, u64> = BTreeMap::new();
    for b in buckets.iter() {
        for source in b.gauges_by_source.keys() {
            last_at.insert(source.clone(), b.start_ns);
        }
    }
    let mut levels = Levels::default();
    for b in buckets.iter_mut() {
        let start = b.start_ns;
        levels.fill(&mut b.gauges_by_source, |source| {
            last_at.get(source).is_some_and(|&end| end > start)
        });
        for (source, (at, gauges)) in &b.gauges_by_source {
            levels.note(source, *at, gauges);
        }
    }
}

/// Each source's last known levels (gauges), and the interval they are
/// of: what counts for a source in an interval it has no record of.
#[derive(Debug, Default)]
pub struct Levels {
    known: BTreeMap<String, (u64, BTreeMap<String, i64>)>,
}

impl Levels {
    /// `source`'s levels in its record of the interval at `at`; an older
    /// record (a late one) does not replace newer levels.
    pub fn note(&mut self, source: &str, at: u64, gauges: &BTreeMap<String, i64>) {
        match self.known.get_mut(source) {
            Some(known) if known.0 > at => {}
            Some(known) => *known = (at, gauges.clone()),
            None => {
                self.known.insert(source.to_owned(), (at, gauges.clone()));
            }
        }
    }

    /// `source`'s levels count no more.
    pub fn forget(&mut self, source: &str) {
        self.known.remove(source);
    }

    /// Gives each source `carry` accepts that is missing from `by_source`
    /// (levels by source, as a bucket keeps them) its last known levels.
    pub fn fill(
        &self,
        by_source: &mut BTreeMap<String, (u64, BTreeMap<String, i64>)>,
        carry: impl Fn(&str) -> bool,
    ) {
        for (source, levels) in &self.known {
            if carry(source) && !by_source.contains_key(source) {
                by_source.insert(source.clone(), levels.clone());
            }
        }
    }
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
            peaks: BTreeMap::new(),
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
    fn sparse_merges_of_many_histograms_equal_the_full_sum() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut sparse = SparseHistogram::default();
        let mut full = new_histogram();
        for round in 0..20 {
            let mut h = new_histogram();
            for _ in 0..500 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Spread over many orders of magnitude, overlapping between rounds.
                h.record(1 + x % (10u64.pow(1 + round % 9))).unwrap();
            }
            sparse.add(&h);
            full.add(&h).unwrap();
        }
        assert_eq!(sparse.to_histogram(), full);
        assert_eq!(sparse.len(), 10_000);
        assert!(sparse.bins.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn wide_buckets_add_counters_but_take_each_sources_last_gauge() {
        let mut m = Merger::new(10_000_000_000);
        assert!(m.bucket_histograms);
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
    fn a_source_that_skips_intervals_keeps_its_last_level_between_its_records() {
        let mut m = Merger::new(1_000_000_000);
        for s in 1..=5 {
            m.add_interval(&iv("a/hold-0", s, 100 * s as i64, &[]));
        }
        // hold-1 was held up: nothing for seconds 2 and 3.
        m.add_interval(&iv("a/hold-1", 1, 50, &[]));
        m.add_interval(&iv("a/hold-1", 4, 80, &[]));
        // hold-2 ended after second 2: no level after its last record.
        m.add_interval(&iv("a/hold-2", 1, 7, &[]));
        m.add_interval(&iv("a/hold-2", 2, 7, &[]));
        let open: Vec<i64> = m
            .finish()
            .buckets
            .iter()
            .map(|b| b.gauges()["connections.open"])
            .collect();
        assert_eq!(open, [157, 257, 350, 480, 500]);
    }

    #[test]
    fn coarsening_keeps_totals_and_equals_merging_wide_from_the_start() {
        let all: Vec<Interval> = (0..100)
            .flat_map(|s| {
                [
                    iv("a/hold-0", 1_000 + s, s as i64, &[s + 1, 3 * s + 7]),
                    iv("a/hold-1", 1_000 + s, 2, &[s + 50]),
                ]
            })
            .collect();
        let mut bounded = Merger::new(1_000_000_000).with_max_buckets(10);
        let mut wide = Merger::new(16_000_000_000);
        for i in &all {
            bounded.add_interval(i);
            wide.add_interval(i);
        }
        let (bounded, wide) = (bounded.finish(), wide.finish());
        // 100 one-second buckets need width 16 s to fit in 10.
        assert_eq!(bounded.width_ns, 16_000_000_000);
        assert!(bounded.buckets.len() <= 10);
        assert_eq!(bounded, wide);
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

    fn own(second: u64, published: u64) -> Interval {
        let mut i = Interval::empty(
            second * 1_000_000_000,
            1_000_000_000,
            "a/hold-supervisor".into(),
        );
        i.counters.insert("publish.sent".into(), published);
        i.host = Some(HostSample {
            host: "a".into(),
            at_ns: second,
            ..HostSample::default()
        });
        i
    }

    #[test]
    fn live_flushes_merge_each_interval_with_the_supervisors_record() {
        let mut m = Merger::live("a/hold".into(), 0, 1_000_000_000);
        m.add_interval(&iv("a/hold-0", 1, 10, &[100, 200]));
        m.add_interval(&iv("a/hold-1", 1, 5, &[300]));
        assert!(
            !m.add_interval(&iv("a/hold-1", 1, 5, &[300])),
            "a duplicate"
        );
        assert_eq!(m.open(), [1_000_000_000]);
        assert!(m.has("a/hold-1", 1_000_000_000));
        assert!(!m.has("a/hold-1", 2_000_000_000));
        let f = m.flush(1_000_000_000, Some(&own(1, 1))).unwrap();
        assert!(!f.again);
        let i = &f.interval;
        assert_eq!(i.source, "a/hold");
        assert_eq!(i.counter("messages.received"), 3);
        assert_eq!(i.counter("publish.sent"), 1);
        assert_eq!(i.gauge("connections.open"), 15);
        assert_eq!(i.stats("delivery").count, 3);
        assert!(i.host.is_some());
        assert!(m.open().is_empty());
        assert!(m.flush(1_000_000_000, None).is_none(), "nothing open there");
        assert_eq!(m.total().unwrap().counter("messages.received"), 3);
    }

    #[test]
    fn live_a_source_missing_from_an_interval_keeps_its_last_level() {
        let mut m = Merger::live("a/hold".into(), 0, 1_000_000_000);
        m.add_interval(&iv("a/hold-0", 1, 10, &[]));
        m.add_interval(&iv("a/hold-1", 1, 5, &[]));
        m.flush(1_000_000_000, None).unwrap();
        // hold-1 is held up: its level of second 1 counts in second 2.
        m.add_interval(&iv("a/hold-0", 2, 20, &[]));
        let f = m.flush(2_000_000_000, None).unwrap();
        assert_eq!(f.interval.gauge("connections.open"), 20 + 5);
        // Once forgotten (it died), it counts no more.
        m.forget("a/hold-1");
        m.add_interval(&iv("a/hold-0", 3, 30, &[]));
        let f = m.flush(3_000_000_000, None).unwrap();
        assert_eq!(f.interval.gauge("connections.open"), 30);
    }

    #[test]
    fn live_a_record_after_its_interval_was_flushed_adds_its_counts_alone() {
        let mut m = Merger::live("a/hold".into(), 0, 1_000_000_000);
        m.add_interval(&iv("a/hold-0", 1, 10, &[1]));
        m.flush(1_000_000_000, Some(&own(1, 1))).unwrap();
        assert!(m.flushed(1_000_000_000));
        // hold-1's record of second 1 comes late, with a level of its own.
        m.add_interval(&iv("a/hold-1", 1, 7, &[2, 3]));
        assert_eq!(m.open(), [1_000_000_000]);
        let late = m.flush(1_000_000_000, None).unwrap();
        assert!(late.again);
        assert!(late.interval.gauges.is_empty(), "levels were shown already");
        assert_eq!(late.interval.counter("messages.received"), 2);
        let total = m.total().unwrap();
        assert_eq!(total.counter("messages.received"), 3, "late counts add");
        assert_eq!(total.counter("publish.sent"), 1);
        assert_eq!(total.stats("delivery").count, 3);
        // Its level is known now, and carried into the next interval.
        m.add_interval(&iv("a/hold-0", 2, 10, &[]));
        let f = m.flush(2_000_000_000, None).unwrap();
        assert_eq!(f.interval.gauge("connections.open"), 10 + 7);
        assert_eq!(m.into_total().unwrap().counter("messages.received"), 3);
    }

    fn peaked(source: &str, second: u64, open: i64, peak: i64) -> Interval {
        let mut i = iv(source, second, open, &[]);
        i.peaks.insert("connections.open".to_owned(), peak);
        i
    }

    #[test]
    fn peaks_are_each_sources_own_summed_and_never_below_the_level() {
        let mut m = Merger::new(1_000_000_000);
        // One source rose to 40 and fell to 0 within second 1.
        m.add_interval(&peaked("a/attack-0", 1, 0, 40));
        // Another has no peaks (an older file): its level is its peak.
        m.add_interval(&iv("a/attack-1", 1, 5, &[]));
        m.add_interval(&peaked("a/attack-0", 2, 3, 9));
        let merged = m.finish();
        let peaks: Vec<i64> = merged
            .buckets
            .iter()
            .map(|b| b.peaks()["connections.open"])
            .collect();
        // attack-1 ended after second 1: no level of it carried into second 2.
        assert_eq!(peaks, [45, 9]);
        assert_eq!(merged.buckets[0].gauges()["connections.open"], 5);
    }

    #[test]
    fn a_wide_bucket_keeps_each_sources_highest_peak() {
        let mut wide = Merger::new(10_000_000_000);
        for s in 0..10 {
            wide.add_interval(&peaked(
                "a/attack-0",
                100 + s,
                1,
                if s == 3 { 50 } else { 2 },
            ));
        }
        let merged = wide.finish();
        assert_eq!(merged.buckets[0].peaks()["connections.open"], 50);
        assert_eq!(merged.buckets[0].gauges()["connections.open"], 1);
        // Coarsening keeps it too.
        let mut bounded = Merger::new(1_000_000_000).with_max_buckets(2);
        for s in 0..10 {
            bounded.add_interval(&peaked(
                "a/attack-0",
                100 + s,
                1,
                if s == 3 { 50 } else { 2 },
            ));
        }
        let merged = bounded.finish();
        let top = merged
            .buckets
            .iter()
            .map(|b| b.peaks()["connections.open"])
            .max();
        assert_eq!(top, Some(50));
    }

    #[test]
    fn live_peaks_are_flushed_and_a_late_records_peak_still_counts() {
        let mut m = Merger::live("a/attack".into(), 0, 1_000_000_000);
        m.add_interval(&peaked("a/attack-0", 1, 0, 12));
        m.add_interval(&peaked("a/attack-1", 1, 1, 3));
        let f = m.flush(1_000_000_000, None).unwrap();
        assert_eq!(f.interval.gauge("connections.open"), 1);
        assert_eq!(f.interval.peak("connections.open"), 15);
        // attack-0 reports second 2 in time; attack-1's record of it is late.
        m.add_interval(&peaked("a/attack-0", 2, 0, 2));
        let f = m.flush(2_000_000_000, None).unwrap();
        assert_eq!(
            f.interval.peak("connections.open"),
            2 + 1,
            "attack-1 at its level"
        );
        m.add_interval(&peaked("a/attack-1", 2, 0, 30));
        let late = m.flush(2_000_000_000, None).unwrap();
        assert!(late.again);
        assert!(late.interval.gauges.is_empty());
        // Its own peak, beside attack-0's level as last known.
        assert_eq!(late.interval.peak("connections.open"), 30);
    }

    #[test]
    fn two_runs_whose_sources_share_names_merge_as_two() {
        let header = |run: &str| {
            let mut h = crate::format::Header::new(vec![], serde_json::json!({}));
            h.run = run.to_owned();
            Record::Header(h)
        };
        let mut m = Merger::new(1_000_000_000);
        for run in ["a", "b", "a"] {
            m.add(&header(run));
            // The same source and second in both runs; run a's given twice.
            m.add(&Record::Interval(iv("h/attack-0", 1, 3, &[5])));
        }
        let merged = m.finish();
        assert_eq!(merged.counters["messages.received"], 2);
        assert_eq!(merged.duplicates, 1);
        assert_eq!(merged.buckets[0].gauges()["connections.open"], 6);
        let sources: Vec<&String> = merged.sources.iter().collect();
        assert_eq!(sources, ["h/attack-0", "h/attack-0 (run 2)"]);
    }
}
