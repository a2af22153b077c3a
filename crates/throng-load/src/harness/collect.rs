//! Merging the workers' records: every record line is appended to the
//! result file as it arrives; intervals are merged per start time, and an
//! interval is flushed once every worker still running has sent it (or it
//! is overdue, when a worker is held up). Flushing adds the supervisor's
//! own record (the role's counts and a host sample, written to the file
//! too) and folds the merged interval into the run's totals.
//!
//! Levels (gauges such as `connections.open`) of a flushed interval are
//! every worker's last known value: a worker whose record for it has not
//! come yet (a busy worker's timer fires seconds late, and then it skips
//! the intervals it slept through) counts with its latest earlier record,
//! never as zero, and the flush says how many were late. Counts of a late
//! record are added to the totals when it comes.
//!
//! The merging itself, carry-forward included, is throng-report's one
//! merger ([`Merger::live`]), the same that merges result files; the
//! collector adds what only a live run has: the file, the supervisor's
//! record, host samples, and when an interval is complete.
//!
//! The collector does not know where the lines come from (a child's
//! stdout today, an agent's stream later: see [`super::pool`]).

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

use throng_host::sample::{HostSample, Sampler};
use throng_report::events::EventGroup;
use throng_report::format::{Event, Header, Record, Writer, decode_record};
use throng_report::interval::Interval;
use throng_report::merge::Merger;
use throng_report::text::Bytes;

use super::progress::Latest;

/// A result file to write: where, and the header that says what ran.
#[derive(Debug, Clone)]
pub struct ResultFile {
    /// The file (created, or truncated).
    pub path: PathBuf,
    /// The command line and settings of the run.
    pub header: Header,
    /// Append a new section (this header and the run's records) to the
    /// file instead of starting it afresh: how `knee` keeps its levels,
    /// run one after the other, in one file.
    pub append: bool,
}

/// What a worker's line was.
#[derive(Debug)]
pub enum Arrival {
    /// An interval, merged.
    Interval,
    /// An event, for the role to read.
    Event(Event),
    /// Another record kind, kept in the file only.
    Other,
    /// Not a record (a worker's stray output).
    Garbage,
}

/// An interval flushed: every worker's record of it and the supervisor's.
#[derive(Debug)]
pub struct Flushed {
    /// The merged interval, with the host sample; its gauges are every
    /// worker's last known level.
    pub merged: Interval,
    /// The interval's first flush, newer than any shown before (a late
    /// record merged on its own is not shown again).
    pub show: bool,
    /// Workers still running whose record of this interval had not come
    /// (their levels are from an earlier one).
    pub late: usize,
}

/// What a run added up to, once every record is in.
#[derive(Debug)]
pub struct Totals {
    /// Every interval of every worker and of the supervisor, added.
    pub total: Interval,
    /// The largest RSS seen per process, bytes.
    pub peak_rss_bytes: BTreeMap<String, u64>,
    /// The last host sample (CPU used per process).
    pub last_host: Option<HostSample>,
    /// The workers' events the role did not take, grouped (one group for
    /// the same thing said by many workers).
    pub events: Vec<EventGroup>,
}

/// Merges the records of one run.
#[derive(Debug)]
pub struct Collector {
    /// `host/hold`: the source of merged intervals; `-supervisor` is appended for its own.
    source: String,
    length_ns: u64,
    writer: Option<Writer>,
    /// The workers' intervals, merged; open ones until flushed.
    merger: Merger,
    latest: Vec<Option<Latest>>,
    /// Each worker's source, once its first record came.
    sources: Vec<Option<String>>,
    /// Workers whose feed ended: nothing more is waited for from them.
    gone: Vec<bool>,
    sampler: Sampler,
    peak_rss_bytes: BTreeMap<String, u64>,
    last_host: Option<HostSample>,
}

impl Collector {
    /// A collector for `workers` workers of role `role`, whose schedule
    /// starts at `start_ns`; creates the result file, if any.
    pub fn new(
        role: &str,
        workers: usize,
        length_ns: u64,
        start_ns: u64,
        file: Option<&ResultFile>,
    ) -> io::Result<Self> {
        let writer = match file {
            Some(f) if f.append => {
                Some(Writer::append(&f.path, &f.header).map_err(io::Error::other)?)
            }
            Some(f) => Some(Writer::create(&f.path, &f.header).map_err(io::Error::other)?),
            None => None,
        };
        let source = format!("{}/{role}", throng_host::sample::hostname());
        Ok(Self {
            merger: Merger::live(source.clone(), start_ns, length_ns),
            source,
            length_ns: length_ns.max(1),
            writer,
            latest: vec![None; workers],
            sources: vec![None; workers],
            gone: vec![false; workers],
            sampler: Sampler::new(),
            peak_rss_bytes: BTreeMap::new(),
            last_host: None,
        })
    }

    /// The supervisor's own label: `host/hold-supervisor`.
    pub fn supervisor_label(&self) -> String {
        format!("{}-supervisor", self.source)
    }

    /// Takes one line from `worker`: writes it to the file if it is a
    /// record, merges it if it is an interval.
    pub fn arrive(&mut self, worker: usize, line: &str) -> io::Result<Arrival> {
        let Ok(record) = decode_record(line) else {
            return Ok(Arrival::Garbage);
        };
        if let Some(w) = self.writer.as_mut() {
            w.write_encoded(line).map_err(io::Error::other)?;
        }
        Ok(match record {
            Record::Interval(iv) => {
                if let Some(slot) = self.latest.get_mut(worker) {
                    let end = iv.start_ns.saturating_add(iv.length_ns);
                    *slot = Some(Latest {
                        start_ns: iv.start_ns,
                        counters: iv.counters.clone(),
                        gauges: iv.gauges.clone(),
                        late_ns: throng_host::sample::now_ns().saturating_sub(end),
                        source: iv.source.clone(),
                    });
                }
                if let Some(slot @ None) = self.sources.get_mut(worker) {
                    *slot = Some(iv.source.clone());
                }
                self.merger.add_interval(&iv);
                Arrival::Interval
            }
            Record::Event(ev) => Arrival::Event(ev),
            _ => Arrival::Other,
        })
    }

    /// The starts of intervals ready to flush at `now_ns`: every worker
    /// still running sent it, or it ended over 1.5 intervals ago.
    pub fn due(&self, now_ns: u64) -> Vec<u64> {
        let late = 2 * self.length_ns + self.length_ns / 2;
        self.merger
            .open()
            .into_iter()
            .filter(|start| {
                *start + late < now_ns
                    || (0..self.gone.len()).all(|w| self.gone[w] || self.reported(w, *start))
            })
            .collect()
    }

    /// Whether `worker`'s record of the interval at `start` came.
    fn reported(&self, worker: usize, start: u64) -> bool {
        self.sources
            .get(worker)
            .and_then(Option::as_deref)
            .is_some_and(|source| self.merger.has(source, start))
    }

    /// Worker `worker`'s feed ended: every record it sent is in. `died`:
    /// without saying it was done, so its connections are gone with it
    /// and its levels count as zero from now on.
    pub fn gone(&mut self, worker: usize, died: bool) {
        if let Some(g) = self.gone.get_mut(worker) {
            *g = true;
        }
        if died && let Some(Some(source)) = self.sources.get(worker) {
            self.merger.forget(source);
        }
    }

    /// Every interval still open (the run is over).
    pub fn open(&self) -> Vec<u64> {
        self.merger.open()
    }

    /// Each worker's last record.
    pub fn latest(&self) -> &[Option<Latest>] {
        &self.latest
    }

    /// Flushes the interval at `start`: adds the supervisor's record (the
    /// role's `own` counts, a host sample of `processes` and this one),
    /// writes that, and folds the whole into the totals. A worker's record
    /// that arrives after its interval was flushed (a worker held up for
    /// seconds) is merged on its own: the supervisor's record for a start
    /// is written once only.
    pub fn flush(
        &mut self,
        start: u64,
        processes: Vec<(String, u32)>,
        own: impl FnOnce(u64, u64) -> Interval,
    ) -> io::Result<Option<Flushed>> {
        if !self.merger.is_open(start) {
            return Ok(None);
        }
        if self.merger.flushed(start) {
            // Levels were counted with the interval already; only the late counts add.
            return Ok(self.merger.flush(start, None).map(|f| Flushed {
                merged: f.interval,
                show: false,
                late: 0,
            }));
        }
        let late = (0..self.gone.len())
            .filter(|&w| !self.gone[w] && !self.reported(w, start))
            .count();
        let sup = self.own_record(start, processes, own)?;
        let Some(f) = self.merger.flush(start, Some(&sup)) else {
            return Ok(None);
        };
        Ok(Some(Flushed {
            merged: f.interval,
            show: true,
            late,
        }))
    }

    /// The supervisor's record of the interval at `start`: the role's
    /// `own` counts and a host sample of `processes` and this one; written
    /// to the file.
    fn own_record(
        &mut self,
        start: u64,
        processes: Vec<(String, u32)>,
        own: impl FnOnce(u64, u64) -> Interval,
    ) -> io::Result<Interval> {
        let mut sup = own(start, self.length_ns);
        sup.source = self.supervisor_label();
        let mut procs = vec![(sup.source.clone(), std::process::id())];
        procs.extend(processes);
        sup.host = self.sampler.sample(&procs).ok();
        if let Some(w) = self.writer.as_mut() {
            w.write_interval(&sup).map_err(io::Error::other)?;
        }
        if let Some(h) = &sup.host {
            // A process that has exited (a zombie until reaped) reads 0 B:
            // no reading, not a peak of 0.
            for (k, v) in h.rss_bytes.iter().filter(|(_, v)| *v > 0) {
                let peak = self.peak_rss_bytes.entry(k.clone()).or_insert(0);
                *peak = (*peak).max(*v);
            }
            self.last_host = Some(h.clone());
        }
        Ok(sup)
    }

    /// Everything flushed so far, added (late records included).
    pub fn total(&self) -> &Interval {
        // Invariant: the merger was made live (in `new`).
        self.merger.total().expect("a live merger")
    }

    /// The run's totals.
    pub fn finish(self) -> Totals {
        Totals {
            // Invariant: as in `total`.
            total: self.merger.into_total().expect("a live merger"),
            peak_rss_bytes: self.peak_rss_bytes,
            last_host: self.last_host,
            events: Vec::new(),
        }
    }
}

/// `refused 3, timeout 1` from counts by kind.
pub fn kinds(counts: &BTreeMap<String, u64>, between: &str, sep: &str) -> String {
    let parts: Vec<String> = counts
        .iter()
        .map(|(k, v)| format!("{k}{between}{v}"))
        .collect();
    parts.join(sep)
}

/// The summary's lines of grouped events: `  connect.error ×51 from
/// h/hold-0, h/hold-1 and 49 more, +12.3s..+40.1s: <text>`.
pub fn event_lines(groups: &[EventGroup], start_ns: u64) -> String {
    let mut out = String::new();
    let t = |ns: u64| ns.saturating_sub(start_ns) as f64 / 1e9;
    for g in groups {
        let when = if g.count == 1 {
            format!("+{:.1}s", t(g.first_ns))
        } else {
            format!("+{:.1}s..+{:.1}s", t(g.first_ns), t(g.last_ns))
        };
        out.push_str(&format!(
            "  {} ×{} from {}, {when}: {}\n",
            g.kind,
            g.count,
            g.sources_text(),
            g.text
        ));
    }
    out
}

/// `hold-0 12.3 MiB, hold-1 12.1 MiB` from peak RSS by process label.
pub fn peak_rss(by_label: &BTreeMap<String, u64>) -> String {
    let parts: Vec<String> = by_label
        .iter()
        .map(|(k, v)| {
            format!(
                "{} {}",
                k.rsplit('/').next().unwrap_or(k),
                Bytes::MIB.format(*v as f64)
            )
        })
        .collect();
    parts.join(", ")
}

/// One latency's line in the summary: its percentiles and count.
pub fn latency_line(l: &throng_report::interval::HistStats) -> String {
    use throng_report::text::micros;
    if l.count == 0 {
        return "none measured".to_owned();
    }
    format!(
        "p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (n={})",
        micros(l.p50),
        micros(l.p90),
        micros(l.p99),
        micros(l.p999),
        micros(l.max),
        l.count
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use throng_report::format::encode_interval;

    fn line(source: &str, start: u64, ok: u64, open: i64) -> String {
        let mut iv = Interval::empty(start, 1_000, source.into());
        iv.counters.insert("connect.ok".into(), ok);
        iv.gauges.insert("connections.open".into(), open);
        encode_interval(&iv)
    }

    fn own(start: u64, length: u64) -> Interval {
        let mut iv = Interval::empty(start, length, String::new());
        iv.counters.insert("publish.ok".into(), 1);
        iv
    }

    /// An attack worker's record: `answered` at 1 ms, `timed_out` at 2 s,
    /// its in-flight level `now` after a peak of `peak`.
    fn attack_line(source: &str, start: u64, answered: u64, timed_out: u64, peak: i64) -> String {
        let mut iv = Interval::empty(start, 1_000, source.into());
        let hist = |n: u64, us: u64| {
            let mut h = throng_report::interval::new_histogram();
            h.record_n(us, n).unwrap();
            h
        };
        iv.histograms
            .insert("latency".into(), hist(answered, 1_000));
        iv.histograms
            .insert("latency.timeout".into(), hist(timed_out, 2_000_000));
        iv.gauges.insert("requests.in_flight".into(), 0);
        iv.peaks.insert("requests.in_flight".into(), peak);
        encode_interval(&iv)
    }

    #[test]
    fn a_late_record_keeps_every_request_in_the_latency_and_its_peak() {
        let mut c = Collector::new("attack", 2, 1_000, 0, None).unwrap();
        c.arrive(0, &attack_line("h/attack-0", 5_000, 50, 0, 3))
            .unwrap();
        // Worker 1 is held up: the interval is flushed without it.
        assert_eq!(c.due(8_600), [5_000]);
        let f = c.flush(5_000, Vec::new(), own).unwrap().unwrap();
        assert_eq!(f.merged.every_request_stats().count, 50);
        assert_eq!(f.merged.peak("requests.in_flight"), 3);
        // Its record comes late, with every timeout of the interval.
        c.arrive(1, &attack_line("h/attack-1", 5_000, 0, 50, 40))
            .unwrap();
        let late = c
            .flush(5_000, Vec::new(), |_, _| panic!("written once"))
            .unwrap()
            .unwrap();
        assert!(!late.show);
        // Its own peak, beside worker 0's last known level (0).
        assert_eq!(late.merged.peak("requests.in_flight"), 40);
        let all = c.total().every_request_stats();
        assert_eq!(all.count, 100, "the late timeouts count");
        assert!(all.p99 >= 1_990_000, "{all:?}");
    }

    #[test]
    fn an_interval_flushes_once_every_worker_sent_it_and_late_ones_add_alone() {
        let mut c = Collector::new("hold", 2, 1_000, 0, None).unwrap();
        assert!(matches!(
            c.arrive(0, &line("h/hold-0", 5_000, 3, 3)).unwrap(),
            Arrival::Interval
        ));
        assert!(c.due(5_500).is_empty());
        c.arrive(1, &line("h/hold-1", 5_000, 2, 2)).unwrap();
        assert_eq!(c.due(5_500), [5_000]);
        let f = c.flush(5_000, Vec::new(), own).unwrap().unwrap();
        assert!(f.show);
        assert_eq!(f.late, 0);
        assert_eq!(f.merged.counter("connect.ok"), 5);
        assert_eq!(f.merged.counter("publish.ok"), 1);
        assert_eq!(f.merged.gauge("connections.open"), 5);
        assert!(f.merged.host.is_some());
        // Worker 1's next record comes late, after its interval was flushed
        // for being overdue; then a duplicate of an old one arrives.
        c.arrive(0, &line("h/hold-0", 6_000, 1, 4)).unwrap();
        assert!(c.due(8_000).is_empty());
        assert_eq!(c.due(8_600), [6_000]);
        let f = c.flush(6_000, Vec::new(), own).unwrap().unwrap();
        assert_eq!(f.late, 1);
        assert_eq!(
            f.merged.gauge("connections.open"),
            4 + 2,
            "the late worker counts with its last known level"
        );
        c.arrive(1, &line("h/hold-1", 6_000, 7, 9)).unwrap();
        let late = c
            .flush(6_000, Vec::new(), |_, _| panic!("written once"))
            .unwrap()
            .unwrap();
        assert!(!late.show);
        assert!(late.merged.gauges.is_empty());
        assert_eq!(c.total().counter("connect.ok"), 13, "late counts add");
        assert!(matches!(
            c.arrive(0, "not a record").unwrap(),
            Arrival::Garbage
        ));
        assert_eq!(c.latest()[1].as_ref().map(|l| l.start_ns), Some(6_000));
        let t = c.finish();
        assert_eq!(t.total.counter("connect.ok"), 13);
        assert_eq!(t.total.counter("publish.ok"), 2);
        assert!(t.last_host.is_some());
    }

    /// A busy machine: three workers, one of them seconds behind. Its
    /// records come after their intervals were shown, and it skips the
    /// intervals its timer slept through. The levels shown never drop to
    /// a partial sum, and the counts all arrive in the totals.
    #[test]
    fn a_late_or_skipping_worker_keeps_its_last_level_until_it_reports() {
        let mut c = Collector::new("hold", 3, 1_000, 0, None).unwrap();
        let mut shown = Vec::new();
        let flush_due = |c: &mut Collector, now: u64, shown: &mut Vec<(i64, usize)>| {
            for start in c.due(now) {
                let f = c.flush(start, Vec::new(), own).unwrap().unwrap();
                if f.show {
                    shown.push((f.merged.gauge("connections.open"), f.late));
                }
            }
        };
        for w in 0..3 {
            c.arrive(w, &line(&format!("h/hold-{w}"), 1_000, 100, 100))
                .unwrap();
        }
        flush_due(&mut c, 1_500, &mut shown);
        // Interval 2: worker 2 is late.
        c.arrive(0, &line("h/hold-0", 2_000, 100, 200)).unwrap();
        c.arrive(1, &line("h/hold-1", 2_000, 100, 200)).unwrap();
        flush_due(&mut c, 4_600, &mut shown);
        // Its record of interval 2 comes now, then it skips interval 3.
        c.arrive(2, &line("h/hold-2", 2_000, 100, 200)).unwrap();
        flush_due(&mut c, 4_700, &mut shown);
        c.arrive(0, &line("h/hold-0", 3_000, 100, 300)).unwrap();
        c.arrive(1, &line("h/hold-1", 3_000, 100, 300)).unwrap();
        flush_due(&mut c, 5_600, &mut shown);
        c.arrive(2, &line("h/hold-2", 4_000, 200, 400)).unwrap();
        c.arrive(0, &line("h/hold-0", 4_000, 100, 400)).unwrap();
        c.arrive(1, &line("h/hold-1", 4_000, 100, 400)).unwrap();
        flush_due(&mut c, 5_700, &mut shown);
        assert_eq!(
            shown,
            [
                (300, 0),
                (200 + 200 + 100, 1),
                (300 + 300 + 200, 1),
                (1200, 0)
            ]
        );
        // A worker that dies takes its connections with it.
        c.gone(2, true);
        c.arrive(0, &line("h/hold-0", 5_000, 0, 400)).unwrap();
        c.arrive(1, &line("h/hold-1", 5_000, 0, 400)).unwrap();
        assert_eq!(c.due(5_800), [5_000], "a gone worker is not waited for");
        let f = c.flush(5_000, Vec::new(), own).unwrap().unwrap();
        assert_eq!((f.merged.gauge("connections.open"), f.late), (800, 0));
        assert_eq!(c.finish().total.counter("connect.ok"), 1_200);
    }
}
