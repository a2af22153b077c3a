//! The human report: aligned plain text, latencies in readable units, one
//! section per kind of figure, and the time series as a table when asked.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::bench::BenchSummary;
use crate::interval::HistStats;
use crate::summary::{HostPoint, HostSummary, Report, SeriesPoint, explain, is_error};

/// The widest a table of the time series gets: wider ones are split into
/// several, each with the time column, so they fit a 100-column terminal.
const SERIES_WIDTH: usize = 100;
/// An event's line is cut to this many characters (the JSON report has its text whole).
const EVENT_LINE: usize = 100;

/// A latency (or any duration) in µs, to 3 significant figures: `850µs`,
/// `1.23ms`, `12.3ms`, `123ms`, `1.23s`, `12.3s`. Every command prints
/// latencies with it, so one figure reads the same in `hold`, `attack`,
/// `bench` and `report`.
pub fn latency(us: f64) -> String {
    let (v, unit) = if us < 999.5 {
        return format!("{us:.0}µs");
    } else if us < 999_500.0 {
        (us / 1e3, "ms")
    } else {
        (us / 1e6, "s")
    };
    let decimals = if v < 9.995 {
        2
    } else if v < 99.95 {
        1
    } else {
        0
    };
    format!("{v:.decimals$}{unit}")
}

/// [`latency`] of a whole number of µs (a histogram value).
pub fn micros(us: u64) -> String {
    latency(us as f64)
}

/// Bytes with a binary unit: `512 B`, `3.2 KiB`, `1.5 GiB` ([`Bytes::SIZE`]).
pub fn bytes(n: f64) -> String {
    Bytes::SIZE.format(n)
}

/// The one way sizes are written: bytes below 1 KiB, else in the largest
/// binary unit (up to `largest`) that keeps the figure at 1 or more; or
/// always in one unit, so that figures line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes {
    /// The unit it starts from: 0 bytes, 2 MiB.
    from: usize,
    /// The unit it climbs to at most: 1 KiB, 4 TiB.
    largest: usize,
    /// Decimals past KiB (bytes are whole).
    decimals: usize,
    /// Whether a negative figure climbs by its magnitude (a delta that
    /// shrank), or stays in bytes.
    signed: bool,
}

impl Bytes {
    /// Every report's sizes: `512 B`, `3.2 KiB`, `1.5 GiB`.
    pub const SIZE: Self = Self {
        from: 0,
        largest: 4,
        decimals: 1,
        signed: false,
    };
    /// A bench's memory per connection, finer and never past KiB, so
    /// sides compare at a glance: `512 B`, `9.87 KiB`, `-1.50 KiB`.
    pub const PER_CONNECTION: Self = Self {
        from: 0,
        largest: 1,
        decimals: 2,
        signed: true,
    };
    /// A process's memory, in MiB whatever its size: `12.3 MiB`.
    pub const MIB: Self = Self {
        from: 2,
        largest: 2,
        decimals: 1,
        signed: false,
    };
    /// A machine's memory grown, in whole MiB: `245 MiB`.
    pub const WHOLE_MIB: Self = Self {
        from: 2,
        largest: 2,
        decimals: 0,
        signed: false,
    };

    /// `n` bytes, written this way.
    pub fn format(self, n: f64) -> String {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let largest = self.largest.min(UNITS.len() - 1);
        let climbs = |v: f64| if self.signed { v.abs() } else { v } >= 1024.0;
        let mut v = n;
        let mut unit = 0;
        // Dividing by 1024 is exact in binary floating point, so starting
        // in MiB gives what dividing by 1,048,576 once did.
        while unit < self.from.min(largest) || (climbs(v) && unit < largest) {
            v /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            format!("{v:.0} {}", UNITS[unit])
        } else {
            format!("{v:.prec$} {}", UNITS[unit], prec = self.decimals)
        }
    }
}

/// A count or rate: `1234`, `12.5k`, `3.40M`.
pub fn count(n: f64) -> String {
    if n.abs() < 10_000.0 {
        if n.fract() == 0.0 {
            format!("{n:.0}")
        } else {
            format!("{n:.1}")
        }
    } else if n.abs() < 10_000_000.0 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{:.2}M", n / 1e6)
    }
}

/// Renders the whole report as text.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let o = &mut out;
    render_head(o, r);
    // One width for every name column, so long names do not break the tables.
    let nw = r
        .latency_us
        .keys()
        .chain(r.counters.keys())
        .chain(r.gauges.keys())
        .map(|k| k.chars().count())
        .max()
        .unwrap_or(0)
        .max(12);
    render_latency(o, r, nw);
    render_counters(o, r, nw);
    render_errors(o, r, nw);
    render_gauges(o, r, nw);
    if let Some(spread) = &r.server_spread {
        let _ = writeln!(o, "\n{}", server_spread(spread));
    }
    if let Some(h) = &r.host {
        render_host(o, r, h, nw);
    }
    render_events(o, r);
    if let Some(series) = &r.series {
        render_series(o, r, series);
    }

    let damaged: Vec<&String> = r.files.iter().filter_map(|f| f.damage.as_ref()).collect();
    if !damaged.is_empty() {
        let _ = writeln!(o);
        for d in damaged {
            let _ = writeln!(o, "warning: {d}");
        }
    }
    out
}

/// What was merged: the files, their runs, any benches among them.
fn render_head(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "throng report: {} file(s), {} source(s), {} interval(s) merged",
        r.files.len(),
        r.sources.len(),
        r.intervals
    );
    if r.intervals == 0 {
        let _ = writeln!(
            o,
            "  no intervals in these files: the run recorded nothing (yet)"
        );
    } else {
        let _ = writeln!(o, "  from {} for {:.1} s", r.start, r.duration_s);
    }
    for f in &r.files {
        let _ = writeln!(
            o,
            "  {}: host {}, started {}, {} records: {}",
            f.path,
            f.host,
            f.started,
            f.records,
            f.command.join(" ")
        );
    }
    for b in &r.benches {
        render_bench(o, b);
    }
    if r.duplicates > 0 {
        let _ = writeln!(
            o,
            "  note: {} interval(s) appeared twice (same source and start) and were counted once",
            r.duplicates
        );
    }
}

/// The latency table, with what each latency measures.
fn render_latency(o: &mut String, r: &Report, nw: usize) {
    if !r.latency_us.is_empty() {
        let _ = writeln!(o, "\nlatency");
        let _ = writeln!(
            o,
            "  {:<nw$} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
            "", "count", "min", "mean", "stddev", "p50", "p75", "p90", "p95", "p99", "p99.9", "max"
        );
        for (name, h) in &r.latency_us {
            if h.count == 0 {
                // Not a figure of 0 µs: there was nothing to measure.
                let _ = writeln!(o, "  {:<nw$} {:>9}   no answers", name, 0);
            } else {
                let _ = writeln!(o, "  {:<nw$} {}", name, stats_row(h));
            }
        }
        if let Some(note) = unanswered_note(&r.latency_us) {
            let _ = writeln!(o, "  {note}");
        }
        for name in r.latency_us.keys() {
            if let Some(what) = explain(name) {
                wrap(o, &format!("{name}: {what}"), SERIES_WIDTH);
            }
        }
    }
}

/// How many of `latency`'s requests are timeouts and failures, when a run
/// recorded them apart (`None` for an older file or a run without any).
pub fn unanswered_note(table: &BTreeMap<String, HistStats>) -> Option<String> {
    let of = |n: &str| table.get(n).map_or(0, |h| h.count);
    let (timeouts, errors) = (of("latency.timeout"), of("latency.error"));
    if !table.contains_key("latency.answered") {
        return None;
    }
    Some(format!(
        "latency counts every request: {} of {} are timeouts (at their timeout), {} failed (at the time they failed)",
        timeouts,
        of("latency"),
        errors
    ))
}

/// The counters: totals, means and the busiest interval.
fn render_counters(o: &mut String, r: &Report, nw: usize) {
    if !r.counters.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<w$} {:>9} {:>12} {:>12}",
            "counters",
            "total",
            "mean/s",
            "busiest/s",
            w = nw + 2
        );
        for (name, c) in &r.counters {
            let (total, rate, peak) = if name.starts_with("bytes") {
                (
                    bytes(c.total as f64),
                    format!("{}/s", bytes(c.per_second)),
                    format!("{}/s", bytes(c.peak_per_second)),
                )
            } else {
                (
                    count(c.total as f64),
                    count(c.per_second),
                    count(c.peak_per_second),
                )
            };
            let _ = writeln!(o, "  {name:<nw$} {total:>9} {rate:>12} {peak:>12}");
        }
        let _ = writeln!(
            o,
            "  (mean/s: over the run's {:.1} s; busiest/s: its busiest {} s interval)",
            r.duration_s,
            count(r.bucket_s)
        );
    }
}

/// Errors by name and their share of everything counted; losses.
fn render_errors(o: &mut String, r: &Report, nw: usize) {
    let _ = write!(o, "\nerrors: {}", r.errors_total);
    if r.errors_total == 0 {
        let _ = writeln!(o);
    } else {
        let _ = writeln!(o, " ({:.3}% of all counted)", error_share(r));
        for (name, n) in r.errors.iter().filter(|(_, n)| **n > 0) {
            let _ = writeln!(o, "  {name:<nw$} {n:>9}");
        }
    }
    if !r.losses.is_empty() {
        let parts: Vec<String> = r.losses.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(o, "losses: {}", parts.join(", "));
    }
}

/// The fan-out spread of the server's own messages, in one line: the words
/// `hold`'s summary and `throng report` share.
pub fn server_spread(s: &crate::fanout::SpreadStats) -> String {
    let d = &s.spread_us;
    let mut line = format!(
        "server messages' fan-out spread (first to last subscriber): {} message(s), {} deliveries: p50 {}, p99 {}, max {} ({}, {} deliveries)",
        s.messages,
        s.deliveries,
        micros(d.p50),
        micros(d.p99),
        micros(d.max),
        s.widest,
        s.widest_deliveries
    );
    if s.untallied > 0 {
        line.push_str(&format!(
            "; {} deliveries of further messages not told apart",
            s.untallied
        ));
    }
    line
}

/// The gauges: last, highest and lowest level.
fn render_gauges(o: &mut String, r: &Report, nw: usize) {
    if !r.gauges.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<w$} {:>9} {:>9} {:>9} {:>9}",
            "gauges",
            "last",
            "max",
            "min",
            "peak",
            w = nw + 2
        );
        for (name, g) in &r.gauges {
            let _ = writeln!(
                o,
                "  {:<nw$} {:>9} {:>9} {:>9} {:>9}",
                name,
                count(g.last as f64),
                count(g.max as f64),
                count(g.min as f64),
                count(g.peak as f64)
            );
        }
        let sources = r.sources.len();
        wrap(
            o,
            &format!(
                "last, max, min: at the ends of {}s buckets; peak: the highest at any moment, tracked at every change{}",
                r.bucket_s,
                if sources > 1 {
                    format!(
                        " by each of the {sources} sources and summed: at most that (they need not peak at once)"
                    )
                } else {
                    String::new()
                }
            ),
            SERIES_WIDTH,
        );
    }
}

/// The host figures: sockets, packets, bytes, memory, the run's processes.
fn render_host(o: &mut String, r: &Report, h: &HostSummary, nw: usize) {
    let _ = writeln!(o, "\nhost ({}: {})", h.hosts.len(), h.hosts.join(", "));
    let _ = writeln!(
        o,
        "  tcp established      last {}, max {}",
        count(h.tcp_established_last as f64),
        count(h.tcp_established_max as f64)
    );
    let over = format!(
        "means over {:.1} s; the busiest {} s interval (a shorter last span merged into the one before)",
        r.duration_s,
        count(r.bucket_s)
    );
    let _ = writeln!(
        o,
        "  packets per second   in {}, out {} ({over}: in {}, out {})",
        count(h.packets_in_per_s),
        count(h.packets_out_per_s),
        count(h.packets_in_per_s_max),
        count(h.packets_out_per_s_max)
    );
    let _ = writeln!(
        o,
        "  bytes per second     in {}, out {} ({over}: in {}, out {})",
        bytes(h.bytes_in_per_s),
        bytes(h.bytes_out_per_s),
        bytes(h.bytes_in_per_s_max),
        bytes(h.bytes_out_per_s_max)
    );
    let _ = writeln!(
        o,
        "  memory               available min {} of {}, slab max {}, TCP kernel max {}",
        bytes(h.mem_available_min_bytes as f64),
        bytes(h.mem_total_bytes as f64),
        bytes(h.mem_slab_max_bytes as f64),
        bytes(h.tcp_mem_max_bytes as f64)
    );
    if !h.rss_by_process_max.is_empty() {
        let _ = writeln!(
            o,
            "  run's processes      RSS max {} in all; CPU {:.2} cores on average",
            bytes(h.rss_max_bytes as f64),
            h.cpu_cores
        );
        for (p, rss) in &h.rss_by_process_max {
            let _ = writeln!(
                o,
                "    {:<w$} RSS max {}",
                p,
                bytes(*rss as f64),
                w = nw.max(24)
            );
        }
    }
}

/// Events by kind, then one line per group of the same thing said.
fn render_events(o: &mut String, r: &Report) {
    if !r.event_kinds.is_empty() {
        let parts: Vec<String> = r
            .event_kinds
            .iter()
            .map(|(k, v)| format!("{k} ×{v}"))
            .collect();
        let _ = writeln!(o, "\nevents: {}", parts.join(", "));
        // One line for the same thing said by many sources, cut to fit a
        // terminal (a bench's summary can be kilobytes of JSON).
        for g in r.event_groups.iter().take(20) {
            let t = |ns: u64| ns.saturating_sub(r.start_ns) as f64 / 1e9;
            let (first, last) = (
                format!("+{:.1}s", t(g.first_ns)),
                format!("+{:.1}s", t(g.last_ns)),
            );
            let when = if first == last {
                first
            } else {
                format!("{first}..{last}")
            };
            let who = if g.count == 1 {
                g.sources_text()
            } else {
                format!("{} (×{})", g.sources_text(), g.count)
            };
            let head = format!("  {when} {who} {}: ", g.kind);
            let room = EVENT_LINE.saturating_sub(head.chars().count()).max(40);
            let _ = writeln!(o, "{head}{}", first_line(&g.text, room));
        }
        if r.event_groups.len() > 20 {
            let _ = writeln!(
                o,
                "  ... (--format json lists up to {})",
                crate::merge::MAX_EVENTS_KEPT
            );
        }
    }
}

/// A bench's headline, as `throng bench` printed it.
fn render_bench(o: &mut String, b: &BenchSummary) {
    let c = &b.connections;
    let m = &b.messages;
    let _ = writeln!(o, "\nbench: {}", b.title);
    let failed = c.failed_kinds();
    let _ = writeln!(
        o,
        "  connections  {} held of {} ({} opened, {} failed{}), opened at {}/s over {:.2} s",
        c.held,
        c.asked,
        c.opened,
        c.failed,
        if failed.is_empty() {
            String::new()
        } else {
            format!(": {failed}")
        },
        count(c.opened_per_s.round()),
        c.ramp_s
    );
    let mem = &b.memory;
    if mem.connections < crate::bench::MIN_MEASURED_CONNECTIONS {
        let _ = writeln!(
            o,
            "  memory       per connection: not measured (too few connections: {} open)",
            mem.connections
        );
    } else {
        let _ = writeln!(
            o,
            "  memory       per connection ({} open): server {}, harness {}, kernel {} (both sockets)",
            mem.connections,
            bytes(mem.server_bytes),
            bytes(mem.harness_bytes),
            bytes(mem.kernel_bytes)
        );
    }
    let _ = writeln!(
        o,
        "  messages     {} published ({} failed), {} of {} delivered, {} lost, {} duplicated, {} out of order",
        m.published, m.publish_errors, m.received, m.expected, m.lost, m.duplicated, m.out_of_order
    );
    let d = &m.delivery;
    let _ = writeln!(
        o,
        "  delivery     p50 {}  p99 {}  last subscriber {}  (publish to arrival)",
        micros(d.p50_us),
        micros(d.p99_us),
        micros(d.max_us)
    );
    for e in &m.each {
        let l = &e.latency;
        let _ = writeln!(
            o,
            "    message {:>3}: {:>9} delivered  p50 {:>8}  p99 {:>8}  last subscriber {:>8}",
            e.seq,
            e.delivered,
            micros(l.p50_us),
            micros(l.p99_us),
            micros(l.max_us)
        );
    }
    let _ = writeln!(
        o,
        "  CPU          server {:.2} s, harness {:.2} s (user + system, over the run's {:.1} s)",
        b.cpu.server_s, b.cpu.harness_s, b.cpu.elapsed_s
    );
    if !b.first_limit.is_empty() {
        let _ = writeln!(o, "  limits       first reached: {}", b.first_limit);
    }
    if !b.verdict.is_empty() {
        let _ = writeln!(o, "  verdict      {}", b.verdict);
        for f in &b.failures {
            let _ = writeln!(o, "    missed: {f}");
        }
    }
}

/// `text` as lines of at most `width` characters, indented by 2 (the
/// lines after the first by 4).
fn wrap(o: &mut String, text: &str, width: usize) {
    let mut line = String::from(" ");
    for word in text.split_whitespace() {
        if line.chars().count() + 1 + word.chars().count() > width && !line.trim().is_empty() {
            let _ = writeln!(o, "{line}");
            line = String::from("   ");
        }
        line.push(' ');
        line.push_str(word);
    }
    if !line.trim().is_empty() {
        let _ = writeln!(o, "{line}");
    }
}

/// The first line of `text`, at most `max` characters, with `…` where cut.
fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() <= max && line.len() == text.trim_end().len() {
        return line.to_owned();
    }
    let cut: String = line.chars().take(max).collect();
    format!("{cut}…")
}

fn error_share(r: &Report) -> f64 {
    let all: u64 = r
        .counters
        .iter()
        .filter(|(k, _)| k.starts_with("connect.") || k.starts_with("requests."))
        .map(|(_, c)| c.total)
        .sum();
    if all == 0 {
        0.0
    } else {
        100.0 * r.errors_total as f64 / all as f64
    }
}

fn stats_row(h: &HistStats) -> String {
    format!(
        "{:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
        h.count,
        latency(h.min as f64),
        latency(h.mean),
        latency(h.stddev),
        latency(h.p50 as f64),
        latency(h.p75 as f64),
        latency(h.p90 as f64),
        latency(h.p95 as f64),
        latency(h.p99 as f64),
        latency(h.p999 as f64),
        latency(h.max as f64)
    )
}

/// Columns of (title, one cell per point), aligned later to their widest
/// cell; `groups` starts a new group at a column (one histogram's three
/// columns stay together when the table is split).
struct Columns<'a> {
    series: &'a [SeriesPoint],
    columns: Vec<(String, Vec<String>)>,
    groups: Vec<usize>,
}

impl<'a> Columns<'a> {
    fn new(series: &'a [SeriesPoint]) -> Self {
        Self {
            series,
            columns: Vec::new(),
            groups: Vec::new(),
        }
    }

    /// A column of `cell` of every point; `together`: in the group of the one before.
    fn push(&mut self, title: String, together: bool, cell: &dyn Fn(&SeriesPoint) -> String) {
        if !together {
            self.groups.push(self.columns.len());
        }
        self.columns
            .push((title, self.series.iter().map(cell).collect()));
    }
}

fn per_s(p: &SeriesPoint, n: u64) -> f64 {
    if p.length_s > 0.0 {
        n as f64 / p.length_s
    } else {
        0.0
    }
}

fn render_series(o: &mut String, r: &Report, series: &[SeriesPoint]) {
    let mut columns = Columns::new(series);
    columns.push("t".to_owned(), false, &|p| format!("{:.1}", p.t_s));
    level_and_rate_columns(&mut columns, r);
    latency_columns(&mut columns);
    if series.iter().any(|p| p.host.is_some()) {
        host_columns(&mut columns);
    }
    let width = series.first().map_or(0.0, |p| p.length_s);
    let _ = writeln!(
        o,
        "\ntime series, every {} s (counters per second over each interval)",
        count(width)
    );
    series_tables(o, &columns.columns, &columns.groups);
}

/// A column per gauge, per counter (its rate) and one of errors per second.
fn level_and_rate_columns(columns: &mut Columns<'_>, r: &Report) {
    let series = columns.series;
    let gauges: BTreeSet<&String> = series.iter().flat_map(|p| p.gauges.keys()).collect();
    let counters: Vec<&String> = r
        .counters
        .iter()
        .filter(|(k, c)| c.total > 0 && !is_error(k))
        .map(|(k, _)| k)
        .collect();
    for g in &gauges {
        columns.push(short(g), false, &|p| {
            p.gauges
                .get(*g)
                .map_or("-".to_owned(), |v| count(*v as f64))
        });
    }
    for c in &counters {
        columns.push(format!("{}/s", short(c)), false, &|p| {
            let rate = per_s(p, p.counters.get(*c).copied().unwrap_or(0));
            if c.starts_with("bytes") {
                bytes(rate)
            } else {
                count(rate)
            }
        });
    }
    columns.push("errors/s".to_owned(), false, &|p| {
        count(per_s(
            p,
            p.counters
                .iter()
                .filter(|(k, _)| is_error(k))
                .map(|(_, v)| v)
                .sum(),
        ))
    });
}

/// Three columns (p50, p99, max) per histogram, kept together.
fn latency_columns(columns: &mut Columns<'_>) {
    let hists: BTreeSet<&String> = columns
        .series
        .iter()
        .flat_map(|p| p.histograms.keys())
        .collect();
    for h in &hists {
        for (i, (q, pick)) in [
            ("p50", (|s: &HistStats| s.p50) as fn(&HistStats) -> u64),
            ("p99", |s: &HistStats| s.p99),
            ("max", |s: &HistStats| s.max),
        ]
        .into_iter()
        .enumerate()
        {
            columns.push(
                format!("{} {q}", short(h)),
                i > 0,
                &|p| match p.histograms.get(*h) {
                    Some(s) if s.count > 0 => latency(pick(s) as f64),
                    _ => "-".to_owned(),
                },
            );
        }
    }
}

/// The host's columns: sockets, packets and bytes each way, memory.
fn host_columns(columns: &mut Columns<'_>) {
    type Pick = fn(&HostPoint) -> String;
    let host_columns: [(&str, Pick); 6] = [
        ("estab", |h| count(h.tcp_established as f64)),
        ("pkt in/s", |h| {
            h.packets_in_per_s.map_or("-".to_owned(), count)
        }),
        ("pkt out/s", |h| {
            h.packets_out_per_s.map_or("-".to_owned(), count)
        }),
        ("bytes in/s", |h| {
            h.bytes_in_per_s.map_or("-".to_owned(), bytes)
        }),
        ("bytes out/s", |h| {
            h.bytes_out_per_s.map_or("-".to_owned(), bytes)
        }),
        ("mem avail", |h| bytes(h.mem_available_bytes as f64)),
    ];
    for (i, (title, pick)) in host_columns.into_iter().enumerate() {
        // In and out side by side.
        columns.push(title.to_owned(), i == 2 || i == 4, &|p| {
            p.host.as_ref().map_or("-".to_owned(), pick)
        });
    }
}

/// The time column, then as many groups as fit; the rest in more tables.
fn series_tables(o: &mut String, columns: &[(String, Vec<String>)], groups: &[usize]) {
    let widths: Vec<usize> = columns
        .iter()
        .map(|(t, cells)| {
            cells
                .iter()
                .chain([t])
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut block = Vec::new();
    let mut used = widths[0] + 2;
    let ends: Vec<usize> = groups
        .iter()
        .skip(2)
        .copied()
        .chain([columns.len()])
        .collect();
    for (&start, &end) in groups.iter().skip(1).zip(&ends) {
        let wide: usize = widths[start..end].iter().map(|w| w + 2).sum();
        if !block.is_empty() && used + wide > SERIES_WIDTH {
            series_table(o, columns, &widths, &block);
            block.clear();
            used = widths[0] + 2;
        }
        block.extend(start..end);
        used += wide;
    }
    if !block.is_empty() {
        series_table(o, columns, &widths, &block);
    }
}

/// One table of the time series: the time column and the columns `block`.
fn series_table(
    o: &mut String,
    columns: &[(String, Vec<String>)],
    widths: &[usize],
    block: &[usize],
) {
    let shown: Vec<usize> = std::iter::once(0).chain(block.iter().copied()).collect();
    let mut line = String::new();
    let _ = writeln!(o);
    for &i in &shown {
        let w = widths[i];
        let _ = write!(line, "  {:>w$}", columns[i].0);
    }
    let _ = writeln!(o, "{}", line.trim_end());
    for row in 0..columns[0].1.len() {
        line.clear();
        for &i in &shown {
            let w = widths[i];
            let _ = write!(line, "  {:>w$}", columns[i].1[row]);
        }
        let _ = writeln!(o, "{}", line.trim_end());
    }
}

/// A column title from a dotted name, at most 12 characters:
/// `connections.open` → `conn.open`, `messages.received` → `received`.
fn short(name: &str) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    let last = parts.last().copied().unwrap_or(name);
    let mut s: Vec<String> = parts[..parts.len().saturating_sub(1)]
        .iter()
        .rev()
        .take(1)
        .map(|p| p.chars().take(4).collect())
        .collect();
    s.push(last.to_owned());
    let joined = s.join(".");
    if joined.chars().count() <= 12 {
        joined
    } else {
        last.chars().take(12).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_well() {
        assert_eq!(latency(850.0), "850µs");
        assert_eq!(latency(999.6), "1.00ms");
        assert_eq!(latency(1_234.0), "1.23ms");
        assert_eq!(latency(9_996.0), "10.0ms");
        assert_eq!(latency(12_345.0), "12.3ms");
        assert_eq!(latency(123_456.0), "123ms");
        assert_eq!(latency(3_210_000.0), "3.21s");
        assert_eq!(latency(12_345_678.0), "12.3s");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(-2048.0), "-2048 B");
        assert_eq!(Bytes::PER_CONNECTION.format(512.0), "512 B");
        assert_eq!(Bytes::PER_CONNECTION.format(10_106.9), "9.87 KiB");
        assert_eq!(Bytes::PER_CONNECTION.format(-1536.0), "-1.50 KiB");
        assert_eq!(
            Bytes::PER_CONNECTION.format(3.0 * 1_048_576.0),
            "3072.00 KiB"
        );
        assert_eq!(Bytes::MIB.format(12_897_485.0), "12.3 MiB");
        assert_eq!(Bytes::MIB.format(512.0), "0.0 MiB");
        assert_eq!(Bytes::WHOLE_MIB.format(256_901_120.0), "245 MiB");
        assert_eq!(count(1234.0), "1234");
        assert_eq!(count(12_500.0), "12.5k");
        assert_eq!(short("connect.error.refused"), "erro.refused");
        assert_eq!(short("connections.open"), "conn.open");
        assert_eq!(short("messages.received"), "received");
        assert_eq!(short("delivery"), "delivery");
    }

    // A bench's 4 KB JSON summary filled the terminal as one event line.
    #[test]
    fn event_texts_are_one_short_line() {
        assert_eq!(first_line("worker 3 restarted", 100), "worker 3 restarted");
        let json = format!("{{\"x\":\"{}\"}}", "y".repeat(4000));
        let cut = first_line(&json, 100);
        assert_eq!(cut.chars().count(), 101);
        assert!(cut.ends_with('…'));
        assert_eq!(first_line("two\nlines", 100), "two…");
    }

    // `--every` put every figure in one table, 544 columns wide.
    #[test]
    fn time_series_tables_fit_a_terminal() {
        use crate::summary::{HostPoint, SeriesPoint};
        let names: Vec<String> = (0..12).map(|i| format!("latency.kind{i}")).collect();
        let series: Vec<SeriesPoint> = (0..5)
            .map(|t| SeriesPoint {
                start_ns: t * 1_000_000_000,
                t_s: t as f64,
                length_s: 1.0,
                counters: names.iter().map(|n| (n.clone(), 1_234_567)).collect(),
                gauges: names.iter().map(|n| (n.clone(), 98_765)).collect(),
                histograms: names
                    .iter()
                    .map(|n| {
                        let s = HistStats {
                            count: 1,
                            p50: 1_234,
                            p99: 12_345,
                            max: 123_456,
                            ..HistStats::default()
                        };
                        (n.clone(), s)
                    })
                    .collect(),
                host: Some(HostPoint::default()),
            })
            .collect();
        let mut report = Report::build(&crate::merge::Merger::new(1).finish(), &[], false);
        for n in &names {
            report.counters.insert(
                n.clone(),
                crate::summary::CounterSummary {
                    total: 1,
                    per_second: 1.0,
                    peak_per_second: 1.0,
                },
            );
        }
        let mut o = String::new();
        render_series(&mut o, &report, &series);
        let widest = o.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(widest <= SERIES_WIDTH, "{widest} columns:\n{o}");
        // Every column is somewhere, each table with the time.
        for n in &names {
            assert!(o.contains(&format!("{} p99", short(n))), "{o}");
        }
        let tables = o
            .split("\n\n")
            .filter(|t| t.trim_start().starts_with('t'))
            .count();
        assert!(tables > 3, "{o}");
    }
}
