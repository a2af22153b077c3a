//! The bench's one pass over `hold`'s result file: each record is copied
//! to the bench's own file (host samples with the server's processes
//! added), merged by throng-report's merger for the figures (per interval)
//! and for the HTML page, and each worker's message tallies are added up;
//! the bench's summary then ends the file and the page is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use throng_host::sample::HostSample;
use throng_report::bench::BenchSummary;
use throng_report::format::{FileSummary, Header, Reader, Record, Writer};
use throng_report::interval::Interval;
use throng_report::merge::Merger;
use throng_report::summary::Report as Page;

use super::BenchError;
use super::monitor::label;
use crate::hold::recorder::MessageTally;

/// The HTML page plots at most this many points along time.
const PAGE_BUCKETS: usize = 1_000;

/// `hold`'s results, read once and being copied.
pub struct Results {
    /// The bench's result file, every record of hold's written, its summary not yet.
    writer: Writer,
    header: Header,
    /// Records written, the header included.
    records: u64,
    /// Every interval, merged per interval (`None` before the first).
    figures: Option<Merger>,
    /// The page's merger, a second per bucket at first.
    page: Merger,
    tallies: BTreeMap<u64, MessageTally>,
}

impl std::fmt::Debug for Results {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Results")
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

fn results_error(e: &dyn std::fmt::Display) -> BenchError {
    BenchError::Results(e.to_string())
}

impl Results {
    /// Reads `hold_file` and copies it to `to`, adding to each host sample
    /// the server's processes (RSS and CPU) from the nearest of `samples`:
    /// one host sample per interval stays one, so the report plots server
    /// and harness memory together.
    pub fn copy(hold_file: &Path, to: &Path, samples: &[HostSample]) -> Result<Self, BenchError> {
        let reader = Reader::open(hold_file).map_err(|e| results_error(&e))?;
        let header = reader.header().clone();
        let mut results = Self {
            writer: Writer::create(to, &header).map_err(|e| results_error(&e))?,
            header,
            records: 1,
            figures: None,
            page: Merger::new(1_000_000_000).with_max_buckets(PAGE_BUCKETS),
            tallies: BTreeMap::new(),
        };
        for rec in reader {
            match rec {
                Record::Interval(mut iv) => {
                    add_server(&mut iv, samples);
                    results
                        .writer
                        .write_interval(&iv)
                        .map_err(|e| results_error(&e))?;
                    results
                        .figures
                        .get_or_insert_with(|| Merger::new(iv.length_ns))
                        .add_interval(&iv);
                    results.page.add_interval(&iv);
                }
                Record::Event(ev) => {
                    results
                        .writer
                        .write_event(&ev)
                        .map_err(|e| results_error(&e))?;
                    if ev.kind == "worker.messages" {
                        add_tallies(&mut results.tallies, &ev.text);
                    }
                    results.page.add_event(ev);
                }
                _ => continue,
            }
            results.records += 1;
        }
        Ok(results)
    }

    /// Each message's deliveries over every worker, from their
    /// `worker.messages` events, by sequence number.
    pub fn tallies(&self) -> &BTreeMap<u64, MessageTally> {
        &self.tallies
    }

    /// The run's intervals, every source's record of each added into one,
    /// by start (once: the merger is spent).
    pub fn intervals(&mut self) -> BTreeMap<u64, Interval> {
        let Some(figures) = self.figures.take() else {
            return BTreeMap::new();
        };
        figures
            .finish()
            .buckets
            .into_iter()
            .map(|b| {
                let mut iv = Interval::empty(b.start_ns, b.length_ns, String::new());
                iv.counters = b.counters;
                iv.histograms = b
                    .histograms
                    .iter()
                    .map(|(name, h)| (name.clone(), h.to_histogram()))
                    .collect();
                (b.start_ns, iv)
            })
            .collect()
    }

    /// Ends the file with the bench's `summary` and writes the HTML page
    /// of the whole file to `html_file`.
    pub fn finish(mut self, summary: &BenchSummary, html_file: &Path) -> Result<(), BenchError> {
        self.writer
            .write_bench(summary)
            .map_err(|e| results_error(&e))?;
        self.page.add(&Record::Bench(summary.clone()));
        let file = FileSummary {
            path: PathBuf::from(self.writer.path()),
            header: self.header,
            records: self.records + 1,
            skipped: 0,
            damage: None,
        };
        let page = throng_report::html::render(&Page::build(&self.page.finish(), &[file], true));
        std::fs::write(html_file, page)
            .map_err(|e| BenchError::Results(format!("cannot write {}: {e}", html_file.display())))
    }
}

/// Adds to `iv`'s host sample the server's processes from the sample nearest in time.
fn add_server(iv: &mut Interval, samples: &[HostSample]) {
    let Some(h) = iv.host.as_mut() else { return };
    let Some(near) = samples.iter().min_by_key(|s| s.at_ns.abs_diff(h.at_ns)) else {
        return;
    };
    for (l, v) in &near.rss_bytes {
        if l.contains(label::SERVE) {
            h.rss_bytes.push((l.clone(), *v));
        }
    }
    for (l, v) in &near.cpu_ns {
        if l.contains(label::SERVE) {
            h.cpu_ns.push((l.clone(), *v));
        }
    }
}

/// Adds one worker's tallies (a `worker.messages` event's text) to `into`.
fn add_tallies(into: &mut BTreeMap<u64, MessageTally>, text: &str) {
    let Some(tallies) = MessageTally::parse_text(text) else {
        return;
    };
    for t in tallies {
        let m = into.entry(t.seq).or_insert(MessageTally {
            seq: t.seq,
            ..MessageTally::default()
        });
        m.count += t.count;
        m.sum_us = m.sum_us.saturating_add(t.sum_us);
        m.max_us = m.max_us.max(t.max_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use throng_report::interval::new_histogram;

    fn record(source: &str, second: u64, received: u64, delivery_us: &[u64]) -> Interval {
        let mut iv = Interval::empty(second * 1_000_000_000, 1_000_000_000, source.into());
        iv.counters.insert("messages.received".into(), received);
        iv.gauges.insert("connections.open".into(), 10);
        let mut h = new_histogram();
        for v in delivery_us {
            h.record(*v).unwrap();
        }
        iv.histograms.insert("delivery".into(), h);
        iv
    }

    /// The one pass gives what reading the file once per figure gave: every
    /// source's record of a second added into one, the tallies added up,
    /// and a copy ending with the bench's summary.
    #[test]
    fn one_pass_gives_the_intervals_the_tallies_and_the_copy() {
        let dir = std::env::temp_dir().join(format!("throng-bench-results-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (hold, copy, page) = (
            dir.join("hold.jsonl"),
            dir.join("bench.jsonl"),
            dir.join("bench.html"),
        );
        let mut w = Writer::create(
            &hold,
            &Header::new(vec!["hold".into()], serde_json::json!({})),
        )
        .unwrap();
        let records = [
            record("h/hold-0", 5, 2, &[100, 200]),
            record("h/hold-1", 5, 1, &[300]),
            record("h/hold-0", 6, 4, &[1_000; 4]),
            record("h/hold-supervisor", 6, 0, &[]),
        ];
        for r in &records {
            w.write_interval(r).unwrap();
        }
        let tally = |count, sum_us, max_us| {
            MessageTally::to_text(&[MessageTally {
                seq: 1,
                count,
                sum_us,
                max_us,
            }])
        };
        for (worker, text) in [tally(2, 300, 200), tally(1, 300, 300)]
            .into_iter()
            .enumerate()
        {
            w.write_event(&throng_report::format::Event {
                at_ns: 7_000_000_000,
                source: format!("h/hold-{worker}"),
                kind: "worker.messages".into(),
                text,
            })
            .unwrap();
        }
        drop(w);
        let mut results = Results::copy(&hold, &copy, &[]).unwrap();
        let intervals = results.intervals();
        assert_eq!(intervals.len(), 2);
        let five = &intervals[&5_000_000_000];
        assert_eq!(five.counter("messages.received"), 3);
        assert_eq!(five.stats("delivery").count, 3);
        assert_eq!(five.length_ns, 1_000_000_000);
        assert_eq!(intervals[&6_000_000_000].stats("delivery").max, 1_000);
        let tallies = results.tallies();
        assert_eq!(tallies.len(), 1, "{tallies:?}");
        assert_eq!((tallies[&1].count, tallies[&1].sum_us), (3, 600));
        results.finish(&BenchSummary::default(), &page).unwrap();
        let kinds: Vec<&str> = Reader::open(&copy)
            .unwrap()
            .map(|r| match r {
                Record::Interval(_) => "interval",
                Record::Event(_) => "event",
                Record::Bench(_) => "bench",
                _ => "other",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "interval", "interval", "interval", "interval", "event", "event", "bench"
            ]
        );
        assert!(std::fs::read_to_string(&page).unwrap().contains("<svg"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
