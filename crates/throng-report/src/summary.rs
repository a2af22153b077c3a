//! The report of a merged run as plain data: whole-run figures and, when asked,
//! a time series. Text, JSON and HTML output are all drawn from it.

use std::collections::BTreeMap;

use serde::Serialize;
use throng_host::sample::HostSample;

use crate::bench::BenchSummary;
use crate::format::{Event, FileSummary, rfc3339};
// Re-exported: a report's figures are read with it (`throng_report::summary::HistStats`).
pub use crate::interval::HistStats;
use crate::interval::{latency_table, new_histogram};
use crate::merge::{Bucket, Merged};
use hdrhistogram::Histogram;

/// A counter over the whole run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CounterSummary {
    /// Sum over every interval of every source.
    pub total: u64,
    /// `total` over the run's duration (the mean: a burst a minute reads low).
    pub per_second: f64,
    /// The busiest bucket's count over its length ([`Report::bucket_s`]).
    pub peak_per_second: f64,
}

/// A gauge (summed across sources) over the run's buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GaugeSummary {
    /// In the last bucket.
    pub last: i64,
    /// Highest at any bucket's end.
    pub max: i64,
    /// Lowest at any bucket's end.
    pub min: i64,
    /// Highest reached at any moment ([`Bucket::peaks`]): tracked at every
    /// change by each source, so a level that rose and fell between two
    /// bucket ends counts. Exact for one source; over several, the highest
    /// bucket's sum of each source's own peak, an upper bound of the
    /// sum's true peak (never below `max`).
    pub peak: i64,
}

/// Host figures at one bucket, summed over hosts (each host once).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HostPoint {
    /// Hosts that contributed.
    pub hosts: u64,
    /// Established TCP sockets.
    pub tcp_established: u64,
    /// TCP sockets in use.
    pub tcp_inuse: u64,
    /// TCP sockets in TIME-WAIT.
    pub tcp_time_wait: u64,
    /// Kernel memory held by TCP, bytes.
    pub tcp_mem_bytes: u64,
    /// Rates since each host's previous sample; `None` for a host's first bucket.
    pub packets_in_per_s: Option<f64>,
    /// See `packets_in_per_s`.
    pub packets_out_per_s: Option<f64>,
    /// See `packets_in_per_s`.
    pub bytes_in_per_s: Option<f64>,
    /// See `packets_in_per_s`.
    pub bytes_out_per_s: Option<f64>,
    /// CPU cores busy with the run's processes (CPU seconds per second).
    pub cpu_cores: Option<f64>,
    /// Memory, bytes.
    pub mem_total_bytes: u64,
    /// Memory available, bytes.
    pub mem_available_bytes: u64,
    /// Kernel slab, bytes.
    pub mem_slab_bytes: u64,
    /// RSS of the run's processes, bytes.
    pub rss_bytes: u64,
}

/// One point of the time series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// Bucket start, ns since the epoch.
    pub start_ns: u64,
    /// Seconds since the run's first bucket.
    pub t_s: f64,
    /// Bucket length, s.
    pub length_s: f64,
    /// Counters in the bucket.
    pub counters: BTreeMap<String, u64>,
    /// Gauges summed across sources.
    pub gauges: BTreeMap<String, i64>,
    /// Latency statistics of the bucket.
    pub histograms: BTreeMap<String, HistStats>,
    /// Host figures, when samples were recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostPoint>,
}

/// Host figures over the whole run, summed over hosts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HostSummary {
    /// Host names.
    pub hosts: Vec<String>,
    /// Established TCP sockets: last bucket and highest.
    pub tcp_established_last: u64,
    /// See `tcp_established_last`.
    pub tcp_established_max: u64,
    /// Mean rates over the run (each host's last sample less its first), and highest bucket.
    pub packets_in_per_s: f64,
    /// See `packets_in_per_s`.
    pub packets_out_per_s: f64,
    /// See `packets_in_per_s`.
    pub bytes_in_per_s: f64,
    /// See `packets_in_per_s`.
    pub bytes_out_per_s: f64,
    /// Highest bucket rates.
    pub packets_in_per_s_max: f64,
    /// See `packets_in_per_s_max`.
    pub packets_out_per_s_max: f64,
    /// See `packets_in_per_s_max`.
    pub bytes_in_per_s_max: f64,
    /// See `packets_in_per_s_max`.
    pub bytes_out_per_s_max: f64,
    /// Mean CPU cores used by the run's processes.
    pub cpu_cores: f64,
    /// Memory of the hosts, bytes.
    pub mem_total_bytes: u64,
    /// Lowest memory available in any bucket, bytes.
    pub mem_available_min_bytes: u64,
    /// Highest slab in any bucket, bytes.
    pub mem_slab_max_bytes: u64,
    /// Highest TCP kernel memory in any bucket, bytes.
    pub tcp_mem_max_bytes: u64,
    /// Highest total RSS of the run's processes in any bucket, bytes.
    pub rss_max_bytes: u64,
    /// Highest RSS of each process (by host and label), bytes.
    pub rss_by_process_max: BTreeMap<String, u64>,
}

/// One file read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileInfo {
    /// The path as given.
    pub path: String,
    /// Host that wrote it.
    pub host: String,
    /// Its run's start.
    pub started: String,
    /// Its command line.
    pub command: Vec<String>,
    /// Records read.
    pub records: u64,
    /// The run's settings, as its header holds them.
    pub settings: serde_json::Value,
    /// Where it was damaged, as a warning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damage: Option<String>,
}

/// Everything a report shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// What each bench among the files found: the headline, shown first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub benches: Vec<BenchSummary>,
    /// Files read (empty when built from intervals directly).
    pub files: Vec<FileInfo>,
    /// Sources merged.
    pub sources: Vec<String>,
    /// First bucket start and last bucket end, ns (0 when empty).
    pub start_ns: u64,
    /// See `start_ns`.
    pub end_ns: u64,
    /// `start_ns` as RFC 3339.
    pub start: String,
    /// Seconds covered.
    pub duration_s: f64,
    /// Width of the buckets merged into (the run's interval, or `--every`),
    /// seconds: what a peak figure is the peak of.
    pub bucket_s: f64,
    /// Intervals merged.
    pub intervals: u64,
    /// Intervals seen twice and counted once.
    pub duplicates: u64,
    /// Every counter.
    pub counters: BTreeMap<String, CounterSummary>,
    /// Counters whose name contains `error`.
    pub errors: BTreeMap<String, u64>,
    /// Sum of `errors`.
    pub errors_total: u64,
    /// Counters whose name ends in `.lost` (and other losses: `duplicated`, `out_of_order`).
    pub losses: BTreeMap<String, u64>,
    /// Every gauge.
    pub gauges: BTreeMap<String, GaugeSummary>,
    /// Every latency histogram, µs.
    pub latency_us: BTreeMap<String, HistStats>,
    /// Host figures, when samples were recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostSummary>,
    /// Events by kind.
    pub event_kinds: BTreeMap<String, u64>,
    /// The first events, in order.
    pub events: Vec<Event>,
    /// Every event, grouped: one line for the same thing said by many sources.
    pub event_groups: Vec<crate::events::EventGroup>,
    /// The time series, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series: Option<Vec<SeriesPoint>>,
    /// The fan-out spread of the messages the server made (`hold --stamp`),
    /// over every worker of every machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_spread: Option<crate::fanout::SpreadStats>,
}

/// What a latency histogram measures, in one line, for the names the
/// harness records (`None` for another name).
pub fn explain(name: &str) -> Option<&'static str> {
    Some(match name {
        "connect" => {
            "from the connection's scheduled start to the end of its WebSocket upgrade: the harness's lag included, so a stall cannot hide"
        }
        "connect.lag" => {
            "how late the harness started a connection after its scheduled time: the harness falling behind, not the server"
        }
        "connect.service" => {
            "from the connect's actual start to the end of the upgrade: the server's and the network's time"
        }
        "connect.tcp" => "the TCP connect alone",
        "connect.tls" => "the TLS handshake alone",
        "connect.upgrade" => "the WebSocket upgrade alone: request sent to 101 received",
        "delivery" => {
            "from the publish call's start (stamped in the message) to its arrival at a subscriber"
        }
        "publish" => {
            "a publish call, from its start to the server's answer (throng serve answers once every worker has counted its subscribers, before the writes)"
        }
        "publish.lag" => "how late the publisher sent a message after its scheduled time",
        "session.delivery" => {
            "a persistent-session client's message (hold --mqtt-sessions), publish to arrival: a message kept while its client was away includes the time away"
        }
        "session.resume" => {
            "a message kept while its persistent-session client was away, from the return's CONNACK to its arrival"
        }
        "delivery.pushed" => {
            "a message the server made on its own, from the send time it holds (hold --stamp) to its arrival"
        }
        "latency" => {
            "a request, from its scheduled start to the end of its response: the generator's lag included; where latency.timeout or latency.error appear, every request (a timed-out one at its timeout, a failed one when it failed)"
        }
        "latency.answered" => "latency of the requests that got a whole response, alone",
        "latency.timeout" => {
            "a request that got no answer within --timeout, counted at the time it was given up"
        }
        "latency.error" => {
            "a request that failed (refused, reset, ...), counted at the time it failed"
        }
        "service" => "a request, from its actual start to the end of its response",
        "lag" => "how late the generator started a request after its scheduled time",
        _ => return None,
    })
}

/// Whether a counter counts an error.
pub fn is_error(name: &str) -> bool {
    name.contains("error")
}

/// Whether a counter counts a loss (or other delivery fault).
pub fn is_loss(name: &str) -> bool {
    name.ends_with(".lost") || name.ends_with(".duplicated") || name.ends_with(".out_of_order")
}

impl Report {
    /// Builds the report of `merged`, with the time series if `series`.
    pub fn build(merged: &Merged, files: &[FileSummary], series: bool) -> Self {
        let start_ns = merged.buckets.first().map_or(0, |b| b.start_ns);
        let end_ns = merged
            .buckets
            .iter()
            .map(|b| b.start_ns.saturating_add(b.length_ns))
            .max()
            .unwrap_or(0);
        let duration_s = end_ns.saturating_sub(start_ns) as f64 / 1e9;
        let counters = counter_summaries(merged, duration_s);
        let errors: BTreeMap<String, u64> = merged
            .counters
            .iter()
            .filter(|(k, _)| is_error(k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let losses = merged
            .counters
            .iter()
            .filter(|(k, _)| is_loss(k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();

        let gauges = gauge_summaries(&merged.buckets);

        let host_points = host_points(&merged.buckets);
        let host = host_summary(merged, &host_points);

        let series = series.then(|| series_points(&merged.buckets, &host_points, start_ns));

        Self {
            benches: merged.benches.clone(),
            files: files.iter().map(FileInfo::of).collect(),
            sources: merged.sources.iter().cloned().collect(),
            start_ns,
            end_ns,
            start: if start_ns > 0 {
                rfc3339(start_ns)
            } else {
                String::new()
            },
            duration_s,
            bucket_s: merged.width_ns as f64 / 1e9,
            intervals: merged.intervals,
            duplicates: merged.duplicates,
            counters,
            errors_total: errors.values().sum(),
            errors,
            losses,
            gauges,
            latency_us: latency_table(&merged.histograms),
            host,
            event_kinds: merged.event_kinds.clone(),
            events: merged.events.clone(),
            event_groups: merged.event_groups.clone(),
            series,
            server_spread: merged.arrivals.stats(),
        }
    }
}

/// Each counter's total, its mean rate over `duration_s` and its busiest bucket.
fn counter_summaries(merged: &Merged, duration_s: f64) -> BTreeMap<String, CounterSummary> {
    let per_s = |n: u64| {
        if duration_s > 0.0 {
            n as f64 / duration_s
        } else {
            0.0
        }
    };
    let peak = |name: &str| {
        merged
            .buckets
            .iter()
            .filter(|b| b.length_ns > 0)
            .map(|b| b.counters.get(name).copied().unwrap_or(0) as f64 * 1e9 / b.length_ns as f64)
            .fold(0.0, f64::max)
    };
    merged
        .counters
        .iter()
        .map(|(k, &v)| {
            (
                k.clone(),
                CounterSummary {
                    total: v,
                    per_second: per_s(v),
                    peak_per_second: peak(k),
                },
            )
        })
        .collect()
}

/// Each gauge's last, highest and lowest level over the buckets.
fn gauge_summaries(buckets: &[Bucket]) -> BTreeMap<String, GaugeSummary> {
    let mut gauges: BTreeMap<String, GaugeSummary> = BTreeMap::new();
    for b in buckets {
        let peaks = b.peaks();
        for (name, v) in b.gauges() {
            let peak = peaks.get(&name).copied().unwrap_or(v).max(v);
            gauges
                .entry(name)
                .and_modify(|g| {
                    g.last = v;
                    g.max = g.max.max(v);
                    g.min = g.min.min(v);
                    g.peak = g.peak.max(peak);
                })
                .or_insert(GaugeSummary {
                    last: v,
                    max: v,
                    min: v,
                    peak,
                });
        }
    }
    gauges
}

/// The time series: one point per bucket, `t_s` from `start_ns`.
fn series_points(
    buckets: &[Bucket],
    host_points: &[Option<HostPoint>],
    start_ns: u64,
) -> Vec<SeriesPoint> {
    buckets
        .iter()
        .zip(host_points)
        .map(|(b, hp)| {
            let filled: BTreeMap<String, Histogram<u64>> = b
                .histograms
                .iter()
                .map(|(name, s)| {
                    let mut h = new_histogram();
                    s.fill(&mut h);
                    (name.clone(), h)
                })
                .collect();
            SeriesPoint {
                start_ns: b.start_ns,
                t_s: (b.start_ns - start_ns) as f64 / 1e9,
                length_s: b.length_ns as f64 / 1e9,
                counters: b.counters.clone(),
                gauges: b.gauges(),
                histograms: latency_table(&filled),
                host: hp.clone(),
            }
        })
        .collect()
}

impl FileInfo {
    fn of(f: &FileSummary) -> Self {
        Self {
            path: f.path.display().to_string(),
            host: f.header.host.clone(),
            started: f.header.started.clone(),
            command: f.header.command.clone(),
            records: f.records,
            settings: f.header.settings.clone(),
            damage: f.damage.as_ref().map(ToString::to_string),
        }
    }
}

/// Host figures of each bucket (`None` where no host sample was taken).
pub fn host_points(buckets: &[Bucket]) -> Vec<Option<HostPoint>> {
    // Each host's last sample, and the one before it: a sample that comes
    // less than half a bucket after the last (a run's final sample, taken
    // as it ends) is not a span of its own, whose rate over a few ms would
    // read as a busiest second: its tail is merged into the span before,
    // and the rate taken over both.
    let mut previous: BTreeMap<&str, (Option<&HostSample>, &HostSample)> = BTreeMap::new();
    let mut points = Vec::with_capacity(buckets.len());
    for b in buckets {
        if b.hosts.is_empty() {
            points.push(None);
            continue;
        }
        let mut p = HostPoint::default();
        for (name, s) in &b.hosts {
            p.hosts += 1;
            p.tcp_established += s.tcp_established;
            p.tcp_inuse += s.tcp_inuse;
            p.tcp_time_wait += s.tcp_time_wait;
            p.tcp_mem_bytes += s.tcp_mem_bytes;
            p.mem_total_bytes += s.mem_total_bytes;
            p.mem_available_bytes += s.mem_available_bytes;
            p.mem_slab_bytes += s.mem_slab_bytes;
            p.rss_bytes += s.rss_total();
            let mut before = None;
            if let Some(&(prior, last)) = previous.get(name.as_str()) {
                let short = s.at_ns.saturating_sub(last.at_ns) < b.length_ns / 2;
                let from = if short { prior } else { Some(last) };
                before = if short { prior } else { Some(last) };
                if let Some(from) = from {
                    let r = rates(from, s);
                    add_opt(&mut p.packets_in_per_s, r.packets_in);
                    add_opt(&mut p.packets_out_per_s, r.packets_out);
                    add_opt(&mut p.bytes_in_per_s, r.bytes_in);
                    add_opt(&mut p.bytes_out_per_s, r.bytes_out);
                    add_opt(&mut p.cpu_cores, r.cpu_cores);
                }
            }
            previous.insert(name, (before, s));
        }
        points.push(Some(p));
    }
    points
}

struct Rates {
    packets_in: Option<f64>,
    packets_out: Option<f64>,
    bytes_in: Option<f64>,
    bytes_out: Option<f64>,
    cpu_cores: Option<f64>,
}

/// Per-second rates between two samples of one host (`None` if no time passed).
fn rates(a: &HostSample, b: &HostSample) -> Rates {
    let dt = b.at_ns.saturating_sub(a.at_ns) as f64 / 1e9;
    let rate = |x: u64, y: u64| (dt > 0.0).then(|| y.saturating_sub(x) as f64 / dt);
    // CPU only of the processes present in both samples: a restarted worker
    // starts again from zero and must not read as negative time.
    let cpu: u64 = b
        .cpu_ns
        .iter()
        .filter_map(|(label, ns)| {
            a.cpu_ns
                .iter()
                .find(|(l, _)| l == label)
                .map(|(_, before)| ns.saturating_sub(*before))
        })
        .sum();
    Rates {
        packets_in: rate(a.packets_in_total, b.packets_in_total),
        packets_out: rate(a.packets_out_total, b.packets_out_total),
        bytes_in: rate(a.bytes_in_total, b.bytes_in_total),
        bytes_out: rate(a.bytes_out_total, b.bytes_out_total),
        cpu_cores: (dt > 0.0 && !b.cpu_ns.is_empty()).then(|| cpu as f64 / 1e9 / dt),
    }
}

fn add_opt(slot: &mut Option<f64>, v: Option<f64>) {
    if let Some(v) = v {
        *slot = Some(slot.unwrap_or(0.0) + v);
    }
}

fn host_summary(merged: &Merged, points: &[Option<HostPoint>]) -> Option<HostSummary> {
    if merged.host_span.is_empty() {
        return None;
    }
    let mut s = HostSummary {
        hosts: merged.host_span.keys().cloned().collect(),
        mem_available_min_bytes: u64::MAX,
        ..HostSummary::default()
    };
    for (first, last) in merged.host_span.values() {
        let r = rates(first, last);
        s.packets_in_per_s += r.packets_in.unwrap_or(0.0);
        s.packets_out_per_s += r.packets_out.unwrap_or(0.0);
        s.bytes_in_per_s += r.bytes_in.unwrap_or(0.0);
        s.bytes_out_per_s += r.bytes_out.unwrap_or(0.0);
        s.cpu_cores += r.cpu_cores.unwrap_or(0.0);
        s.mem_total_bytes += last.mem_total_bytes;
    }
    let max = |a: &mut f64, b: Option<f64>| *a = a.max(b.unwrap_or(0.0));
    for p in points.iter().flatten() {
        s.tcp_established_last = p.tcp_established;
        s.tcp_established_max = s.tcp_established_max.max(p.tcp_established);
        max(&mut s.packets_in_per_s_max, p.packets_in_per_s);
        max(&mut s.packets_out_per_s_max, p.packets_out_per_s);
        max(&mut s.bytes_in_per_s_max, p.bytes_in_per_s);
        max(&mut s.bytes_out_per_s_max, p.bytes_out_per_s);
        s.mem_available_min_bytes = s.mem_available_min_bytes.min(p.mem_available_bytes);
        s.mem_slab_max_bytes = s.mem_slab_max_bytes.max(p.mem_slab_bytes);
        s.tcp_mem_max_bytes = s.tcp_mem_max_bytes.max(p.tcp_mem_bytes);
        s.rss_max_bytes = s.rss_max_bytes.max(p.rss_bytes);
    }
    if s.mem_available_min_bytes == u64::MAX {
        s.mem_available_min_bytes = 0;
    }
    for b in &merged.buckets {
        for (host, sample) in &b.hosts {
            for (label, rss) in &sample.rss_bytes {
                // Labels usually name their host already (`box1/hold-0`).
                let key = if label.starts_with(&format!("{host}/")) {
                    label.clone()
                } else {
                    format!("{host}/{label}")
                };
                let slot = s.rss_by_process_max.entry(key).or_insert(0);
                *slot = (*slot).max(*rss);
            }
        }
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interval::Interval;
    use crate::merge::Merger;

    fn sampled(second: u64, at_ms: u64, packets: u64) -> Interval {
        let mut iv = Interval::empty(second * 1_000_000_000, 1_000_000_000, "h/attack".into());
        iv.host = Some(HostSample {
            host: "h".into(),
            at_ns: at_ms * 1_000_000,
            packets_in_total: packets,
            ..HostSample::default()
        });
        iv
    }

    #[test]
    fn a_short_last_sample_is_not_a_busiest_second() {
        let mut m = Merger::new(1_000_000_000);
        m.add_interval(&sampled(1, 1_000, 0));
        m.add_interval(&sampled(2, 2_000, 28_000));
        m.add_interval(&sampled(3, 3_000, 56_000));
        // The run's last sample, 15 ms after the one before, 2,400 packets on.
        m.add_interval(&sampled(4, 3_015, 58_400));
        let r = Report::build(&m.finish(), &[], true);
        let series = r.series.unwrap();
        let rates: Vec<Option<f64>> = series
            .iter()
            .map(|p| p.host.as_ref().unwrap().packets_in_per_s)
            .collect();
        // The tail is merged into the span before: 30,400 over 1.015 s.
        let tail = 30_400.0 / 1.015;
        assert_eq!(rates[..3], [None, Some(28_000.0), Some(28_000.0)]);
        assert!((rates[3].unwrap() - tail).abs() < 1.0, "{rates:?}");
        let host = r.host.unwrap();
        assert!(host.packets_in_per_s_max < 30_000.0, "{host:?}");
    }
}
