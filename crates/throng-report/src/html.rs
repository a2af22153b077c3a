//! The HTML report: one self-contained page (no scripts, no fetches). A
//! bench's page leads with a box of its headline figures (the `"bench"`
//! record: held and failed, memory per connection on each side, delivery
//! per message, the CPU split), then the plots, then the detail tables; any
//! other run's page leads with the tables. The inline SVG plots share one
//! time axis: connections open, latency percentiles, throughput, errors,
//! and the host (sockets, packets and bytes per second, memory, CPU).
//!
//! The page is also well-formed XML, so tests (and tools) can parse it.
//!
//! The plot drawing is shared with the knee's page ([`crate::knee`]), whose
//! x axis is the load instead of time: a `Plot` takes where each point
//! sits along an `XAxis`, and may carry vertical `Mark`s.

use std::fmt::Write as _;

use crate::bench::{BenchSummary, Delivery};
use crate::interval::HistStats;
use crate::summary::{HostPoint, Report, SeriesPoint, explain, is_error};
use crate::text::{bytes, count, latency, micros};

const WIDTH: f64 = 960.0;
/// The plotting area's height; a plot's own height adds its titles and legend.
const PLOT_HEIGHT: f64 = 176.0;
const LEFT: f64 = 86.0;
const RIGHT: f64 = 16.0;
/// The plot area's width.
const PLOT_WIDTH: f64 = WIDTH - LEFT - RIGHT;
/// Above the plotting area: the title, and a line that says what is plotted.
const TOP: f64 = 44.0;
/// Below it: the tick labels and the axis title, then the legend's rows.
const BELOW: f64 = 50.0;
const LEGEND_ROW: f64 = 16.0;
const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
/// A line's width, dash pattern and opacity by its place in the plot: the
/// first wide and pale, the rest narrow and each dashed its own way, so a
/// line drawn over another of the same values (sockets in use over
/// established ones, packets out over packets in) still shows both.
const STYLES: [(f64, &str, f64); 5] = [
    (4.0, "", 0.5),
    (1.5, "", 1.0),
    (1.5, "6 3", 1.0),
    (1.5, "2 2", 1.0),
    (1.5, "9 3 2 3", 1.0),
];
/// A rate is averaged over windows as long as its bursts are apart (a
/// message every 2 s: 2 s windows), at most this many buckets.
const MAX_WINDOW: usize = 60;

/// How a plot labels its y values.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Unit {
    /// µs, drawn on a log scale.
    Latency,
    Count,
    Bytes,
}

/// One line of a plot: a name and one value (or a gap) per point.
pub(crate) struct Line {
    name: String,
    values: Vec<Option<f64>>,
}

/// A plot's x axis: from 0 to `span`, ticks labelled with `unit` after
/// the number (`s` for time), titled `title`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XAxis {
    pub(crate) span: f64,
    pub(crate) unit: &'static str,
    pub(crate) title: &'static str,
}

/// A vertical line across a plot at `x`, labelled (the knee).
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    pub(crate) x: f64,
    pub(crate) label: String,
    /// Drawn dashed (a level that failed) rather than solid.
    pub(crate) dashed: bool,
}

pub(crate) struct Plot {
    pub(crate) id: String,
    pub(crate) title: String,
    /// What the plot shows, in one line (or empty).
    pub(crate) caption: String,
    /// The y axis's title.
    pub(crate) y_title: &'static str,
    pub(crate) unit: Unit,
    pub(crate) lines: Vec<Line>,
    /// Where each point sits along x, and whether a line may join it to
    /// the point before (not across a gap in time).
    pub(crate) at: Vec<(f64, bool)>,
    pub(crate) x: XAxis,
    pub(crate) marks: Vec<Mark>,
}

/// Renders the page. `report` should carry its time series
/// ([`Report::build`] with `series = true`); without one only the tables appear.
pub fn render(report: &Report) -> String {
    let mut o = String::with_capacity(64 << 10);
    let title = match report.benches.as_slice() {
        [b] if !b.title.is_empty() => format!("throng bench: {}", b.title),
        [_, ..] => format!("throng report: {} benches", report.benches.len()),
        [] => "throng report".to_owned(),
    };
    head(&mut o, &title);
    let _ = writeln!(o, "<h1>{}</h1>", esc(&title));
    body(&mut o, report);
    o.push_str("</body>\n</html>\n");
    o
}

/// The page up to and including `<body>`.
pub(crate) fn head(o: &mut String, title: &str) {
    o.push_str(
        "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n",
    );
    let _ = write!(
        o,
        "<meta charset=\"utf-8\"/>\n<title>{}</title>\n<style>\n",
        esc(title)
    );
    o.push_str(STYLE);
    o.push_str("</style>\n</head>\n<body>\n");
}

/// The report's headline figures, tables and plots over time.
pub(crate) fn body(o: &mut String, report: &Report) {
    let _ = writeln!(
        o,
        "<p class=\"run\">From {} for {:.1} s: {} file(s), {} source(s), {} interval(s).</p>",
        esc(&report.start),
        report.duration_s,
        report.files.len(),
        report.sources.len(),
        report.intervals,
    );
    for b in &report.benches {
        bench_box(o, b);
    }
    let series = report.series.as_deref().unwrap_or(&[]);
    if report.benches.is_empty() {
        details(o, report);
    }
    o.push_str("<h2>Over time</h2>\n");
    if series.is_empty() {
        o.push_str("<p class=\"empty\">No intervals: nothing to plot.</p>\n");
    } else {
        for plot in plots(report, series) {
            plot.render(o);
        }
    }
    if !report.benches.is_empty() {
        details(o, report);
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:20px 24px;color:#222;max-width:1000px}
h1{font-size:21px;margin:0 0 4px}h2{font-size:17px;margin-top:26px}
p.run{margin:0 0 12px;color:#555;font-size:14px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{padding:3px 9px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child,td.l,th.l{text-align:left}
td.nw,th.nw{white-space:nowrap}
.warn{color:#a00}.muted{color:#777;font-size:13px}
pre.full{white-space:pre-wrap;word-break:break-all;max-width:760px;font-size:12px}
dl.explain{font-size:13px;margin:4px 0 0}dl.explain dt{font-weight:bold;float:left;clear:left;width:10em}
dl.explain dd{margin:0 0 2px 10.5em;color:#444}
section.headline{border:1px solid #bbb;border-radius:6px;background:#f7f9fb;padding:10px 16px;margin:6px 0 10px}
section.headline h2{font-size:14px;margin:8px 0 0;color:#444}
section.headline table{margin:4px 0;font-size:13px}
.verdict{font-size:17px;margin:2px 0 4px}.verdict b{font-size:19px}
.verdict.bad{color:#a00}
.cols{display:flex;gap:36px;flex-wrap:wrap}
svg.plot{display:block;margin:14px 0;background:#fff;border:1px solid #eee}
svg text{font-size:11px;fill:#444}svg .title{font-size:13px;font-weight:bold;fill:#222}
svg .caption{font-size:11px;fill:#666}svg .axis-title{font-size:11px;fill:#666}
svg .grid{stroke:#eee}svg .axis{stroke:#999}
";

/// The box a bench's page leads with: what the bench is run for.
fn bench_box(o: &mut String, b: &BenchSummary) {
    let c = &b.connections;
    let m = &b.messages;
    let _ = writeln!(
        o,
        "<section class=\"headline\" id=\"bench-summary\">\n<p class=\"verdict{}\">{}held <b data-figure=\"held\">{}</b> of {} connections, \
         <b data-figure=\"failed\">{}</b> failed; {} of {} deliveries, <b data-figure=\"lost\">{}</b> lost</p>",
        if b.missed() { " bad" } else { "" },
        if b.verdict.is_empty() {
            String::new()
        } else {
            format!("<b data-figure=\"verdict\">{}</b>: ", esc(&b.verdict))
        },
        c.held,
        c.asked,
        c.failed,
        m.received,
        m.expected,
        m.lost
    );
    o.push_str("<div class=\"cols\">\n<div>\n");
    let _ = writeln!(
        o,
        "<h2>Connections</h2>\n<table>\n<tr><td>opened</td><td data-figure=\"opened\">{}</td><td class=\"l\">at {}/s over {:.2} s</td></tr>\n\
         <tr><td>failed</td><td>{}</td><td class=\"l\">{}</td></tr>\n</table>",
        c.opened,
        count(c.opened_per_s.round()),
        c.ramp_s,
        c.failed,
        esc(&c.failed_kinds())
    );
    let mem = &b.memory;
    let _ = writeln!(
        o,
        "<h2>Memory per connection ({} open)</h2>\n<table>\n\
         <tr><td>server user space</td><td data-figure=\"memory-server\">{}</td></tr>\n\
         <tr><td>harness user space</td><td data-figure=\"memory-harness\">{}</td></tr>\n\
         <tr><td>kernel (both sockets)</td><td data-figure=\"memory-kernel\">{}</td></tr>\n</table>",
        mem.connections,
        esc(&bytes(mem.server_bytes)),
        esc(&bytes(mem.harness_bytes)),
        esc(&bytes(mem.kernel_bytes)),
    );
    let cpu = &b.cpu;
    let share = |s: f64| {
        if cpu.elapsed_s > 0.0 {
            format!("{:.0}% of one core", 100.0 * s / cpu.elapsed_s)
        } else {
            String::new()
        }
    };
    let _ = writeln!(
        o,
        "<h2>CPU over the run's {:.1} s (user + system)</h2>\n<table>\n\
         <tr><td>server</td><td data-figure=\"cpu-server\">{:.2} s</td><td class=\"l\">{}</td></tr>\n\
         <tr><td>harness</td><td data-figure=\"cpu-harness\">{:.2} s</td><td class=\"l\">{}</td></tr>\n</table>",
        cpu.elapsed_s,
        cpu.server_s,
        share(cpu.server_s),
        cpu.harness_s,
        share(cpu.harness_s)
    );
    o.push_str("</div>\n<div>\n");
    let _ = writeln!(
        o,
        "<h2>Delivery per message (publish to arrival)</h2>\n<table id=\"bench-messages\">\n\
         <tr><th>message</th><th>delivered</th><th>p50</th><th>p99</th><th>last subscriber</th></tr>"
    );
    let row = |o: &mut String, cell: &str, message: &str, delivered: u64, l: &Delivery| {
        let _ = writeln!(
            o,
            "<tr><{cell}>{message}</{cell}><{cell}>{delivered}</{cell}><{cell}>{}</{cell}><{cell}>{}</{cell}><{cell}>{}</{cell}></tr>",
            esc(&micros(l.p50_us)),
            esc(&micros(l.p99_us)),
            esc(&micros(l.max_us))
        );
    };
    for e in &m.each {
        row(o, "td", &e.seq.to_string(), e.delivered, &e.latency);
    }
    row(
        o,
        "th",
        &format!("all {}", m.published),
        m.received,
        &m.delivery,
    );
    o.push_str("</table>\n");
    if m.duplicated + m.out_of_order + m.publish_errors > 0 {
        let _ = writeln!(
            o,
            "<p class=\"warn\">{} duplicated, {} out of order, {} publish calls failed</p>",
            m.duplicated, m.out_of_order, m.publish_errors
        );
    }
    if !b.failures.is_empty() {
        let _ = writeln!(
            o,
            "<p class=\"warn\" data-figure=\"failures\">missed: {}</p>",
            esc(&b.failures.join("; "))
        );
    }
    if !b.first_limit.is_empty() {
        let _ = writeln!(
            o,
            "<p data-figure=\"first-limit\">first limit reached: {}</p>",
            esc(&b.first_limit)
        );
    }
    o.push_str("</div>\n</div>\n</section>\n");
}

/// The tables: files, latency, counters, host, events.
fn details(o: &mut String, r: &Report) {
    files_table(o, r);
    latency_table(o, r);
    counters_table(o, r);
    let _ = writeln!(o, "<p>errors: {}", r.errors_total);
    for (k, v) in &r.losses {
        let _ = write!(o, "; {}: {v}", esc(k));
    }
    o.push_str("</p>\n");
    if let Some(h) = &r.host {
        let _ = writeln!(
            o,
            "<h2>Host</h2>\n<p>{}: established max {}; packets/s in {} out {}, bytes/s in {} out {} \
             (means over {:.1} s; the busiest {}: packets/s in {} out {}); memory available min {} of {}, \
             run's RSS max {}, CPU {:.2} cores on average.</p>",
            esc(&h.hosts.join(", ")),
            count(h.tcp_established_max as f64),
            count(h.packets_in_per_s),
            count(h.packets_out_per_s),
            esc(&bytes(h.bytes_in_per_s)),
            esc(&bytes(h.bytes_out_per_s)),
            r.duration_s,
            esc(&bucket_name(r.bucket_s)),
            count(h.packets_in_per_s_max),
            count(h.packets_out_per_s_max),
            esc(&bytes(h.mem_available_min_bytes as f64)),
            esc(&bytes(h.mem_total_bytes as f64)),
            esc(&bytes(h.rss_max_bytes as f64)),
            h.cpu_cores
        );
    }
    events_table(o, r);
}

/// The files merged, their settings and any damage.
fn files_table(o: &mut String, r: &Report) {
    if !r.files.is_empty() {
        o.push_str("<h2>Files</h2>\n<table><tr><th>file</th><th class=\"l\">host</th><th class=\"l\">started</th><th>records</th><th class=\"l\">command</th></tr>\n");
        for f in &r.files {
            let _ = writeln!(
                o,
                "<tr><td class=\"nw\">{}</td><td class=\"l nw\">{}</td><td class=\"l nw\">{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                esc(&f.path),
                esc(&f.host),
                esc(&f.started),
                f.records,
                esc(&f.command.join(" "))
            );
        }
        o.push_str("</table>\n");
        for f in r.files.iter().filter(|f| !f.settings.is_null()) {
            let pretty = serde_json::to_string_pretty(&f.settings).unwrap_or_default();
            let _ = writeln!(
                o,
                "<details><summary>settings of {}</summary><pre>{}</pre></details>",
                esc(&f.path),
                esc(&pretty)
            );
        }
        for d in r.files.iter().filter_map(|f| f.damage.as_ref()) {
            let _ = writeln!(o, "<p class=\"warn\">warning: {}</p>", esc(d));
        }
    }
}

/// Latency percentiles, with what each latency measures.
fn latency_table(o: &mut String, r: &Report) {
    if !r.latency_us.is_empty() {
        o.push_str("<h2>Latency</h2>\n<table><tr><th></th><th>count</th><th>min</th><th>mean</th><th>stddev</th><th>p50</th><th>p75</th><th>p90</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th></tr>\n");
        for (name, h) in &r.latency_us {
            let _ = write!(
                o,
                "<tr><td class=\"nw\">{}</td><td>{}</td>",
                esc(name),
                h.count
            );
            for v in [
                h.min as f64,
                h.mean,
                h.stddev,
                h.p50 as f64,
                h.p75 as f64,
                h.p90 as f64,
                h.p95 as f64,
                h.p99 as f64,
                h.p999 as f64,
                h.max as f64,
            ] {
                let _ = write!(o, "<td>{}</td>", esc(&latency(v)));
            }
            o.push_str("</tr>\n");
        }
        o.push_str("</table>\n<dl class=\"explain\">\n");
        for name in r.latency_us.keys() {
            if let Some(what) = explain(name) {
                let _ = writeln!(o, "<dt>{}</dt><dd>{}</dd>", esc(name), esc(what));
            }
        }
        o.push_str("</dl>\n");
    }
    if let Some(spread) = &r.server_spread {
        let _ = writeln!(
            o,
            "<p id=\"server-spread\">{}</p>",
            esc(&crate::text::server_spread(spread))
        );
    }
}

/// Counter totals, means and the busiest interval.
fn counters_table(o: &mut String, r: &Report) {
    if !r.counters.is_empty() {
        let _ = writeln!(
            o,
            "<h2>Counters</h2>\n<table><tr><th></th><th>total</th><th>mean per second over {:.1} s</th><th>busiest {}</th></tr>",
            r.duration_s,
            esc(&bucket_name(r.bucket_s))
        );
        for (name, c) in &r.counters {
            let class = if is_error(name) && c.total > 0 {
                " class=\"warn\""
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "<tr{class}><td class=\"nw\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(name),
                c.total,
                esc(&count(c.per_second)),
                esc(&count(c.peak_per_second))
            );
        }
        o.push_str("</table>\n");
    }
}

/// One row for the same thing said by many sources.
fn events_table(o: &mut String, r: &Report) {
    if !r.event_kinds.is_empty() {
        // One row for the same thing said by many sources.
        o.push_str("<h2>Events</h2>\n<table><tr><th>first</th><th>last</th><th>count</th><th class=\"l\">sources</th><th class=\"l\">kind</th><th class=\"l\">text</th></tr>\n");
        for g in r.event_groups.iter().take(200) {
            let t = |ns: u64| ns.saturating_sub(r.start_ns) as f64 / 1e9;
            let _ = writeln!(
                o,
                "<tr><td class=\"nw\">+{:.1}s</td><td class=\"nw\">+{:.1}s</td><td>{}</td><td class=\"l nw\">{}</td><td class=\"l nw\">{}</td><td class=\"l\">{}</td></tr>",
                t(g.first_ns),
                t(g.last_ns),
                g.count,
                esc(&g.sources_text()),
                esc(&g.kind),
                event_text(&g.text)
            );
        }
        o.push_str("</table>\n");
    }
}

/// `1 s interval`, `10 s bucket`: what the busiest figure is the busiest of.
fn bucket_name(bucket_s: f64) -> String {
    format!("{} s interval", count(bucket_s))
}

/// The plots of a report over time, in the order the page shows them.
fn plots(r: &Report, series: &[SeriesPoint]) -> Vec<Plot> {
    let mut p = Plots {
        r,
        series,
        at: time_points(series),
        out: Vec::new(),
    };
    p.gauges();
    p.latencies();
    p.rates();
    if r.host.is_some() {
        p.host();
    }
    p.out
}

/// What the plots of one report are drawn from, and the plots so far.
struct Plots<'a> {
    r: &'a Report,
    series: &'a [SeriesPoint],
    at: Vec<(f64, bool)>,
    out: Vec<Plot>,
}

impl Plots<'_> {
    /// A plot over the run's time.
    fn plot(
        &self,
        id: &str,
        title: String,
        y_title: &'static str,
        unit: Unit,
        lines: Vec<Line>,
    ) -> Plot {
        Plot::new(
            (id, title),
            (y_title, unit),
            lines,
            self.at.clone(),
            time_axis(self.r.duration_s),
        )
    }

    /// A plot of rates averaged over their rhythm; none without lines.
    fn rate_plot(
        &self,
        id: &str,
        title: &str,
        y_title: &'static str,
        unit: Unit,
        lines: Vec<Line>,
    ) -> Option<Plot> {
        (!lines.is_empty()).then(|| {
            let mut p = self.plot(id, title.to_owned(), y_title, unit, lines);
            p.caption = RATE_CAPTION.to_owned();
            p
        })
    }

    /// Counter `k` per second, each point.
    fn counter_values(&self, k: &str) -> Vec<Option<f64>> {
        self.series
            .iter()
            .map(|p| Some(per_s(p, p.counters.get(k).copied().unwrap_or(0))))
            .collect()
    }

    /// The run's rhythm (a message every 2 s), which the host's packets,
    /// bytes and CPU follow though a burst of closes may dwarf their own.
    fn rhythm(&self) -> Rhythm {
        self.r
            .counters
            .iter()
            .filter(|(k, c)| c.total > 0 && !is_error(k))
            .map(|(k, _)| rate_window(&self.counter_values(k)))
            .max_by_key(|r| r.window)
            .unwrap_or(STEADY)
    }

    /// Every level, one line each.
    fn gauges(&mut self) {
        if self.r.gauges.is_empty() {
            return;
        }
        let lines = self
            .r
            .gauges
            .keys()
            .map(|g| {
                line(
                    g,
                    self.series
                        .iter()
                        .map(|p| p.gauges.get(g).map(|v| *v as f64))
                        .collect(),
                )
            })
            .collect();
        let p = self.plot(
            "gauges",
            "open (connections and other levels)".to_owned(),
            "count",
            Unit::Count,
            lines,
        );
        self.out.push(p);
    }

    /// One plot of percentiles per latency: delivery (hold, bench) first,
    /// what a run is for, then the rest.
    fn latencies(&mut self) {
        let mut names: Vec<&String> = self.r.latency_us.keys().collect();
        names.sort_by_key(|n| n.as_str() != "delivery");
        for name in names {
            let q = |f: fn(&HistStats) -> u64| {
                self.series
                    .iter()
                    .map(|p| {
                        p.histograms
                            .get(name)
                            .filter(|h| h.count > 0)
                            .map(|h| f(h) as f64)
                    })
                    .collect()
            };
            let lines = vec![
                line("p50", q(|h| h.p50)),
                line("p90", q(|h| h.p90)),
                line("p99", q(|h| h.p99)),
                line("p99.9", q(|h| h.p999)),
                line("max", q(|h| h.max)),
            ];
            let mut p = self.plot(
                &format!("latency-{name}"),
                format!("{name} latency percentiles (log scale)"),
                "latency",
                Unit::Latency,
                lines,
            );
            p.caption = explain(name).unwrap_or_default().to_owned();
            self.out.push(p);
        }
    }

    /// Throughput of counts and of bytes, then errors.
    fn rates(&mut self) {
        let rate_lines = |bytes_counters: bool| -> Vec<Line> {
            self.r
                .counters
                .iter()
                .filter(|(k, c)| {
                    c.total > 0 && !is_error(k) && k.starts_with("bytes") == bytes_counters
                })
                .map(|(k, _)| rate_line(k, self.counter_values(k), self.series, STEADY))
                .collect()
        };
        let counts = self.rate_plot(
            "throughput",
            "throughput (per second)",
            "per second",
            Unit::Count,
            rate_lines(false),
        );
        let bytes = self.rate_plot(
            "throughput-bytes",
            "bytes per second",
            "bytes/s",
            Unit::Bytes,
            rate_lines(true),
        );
        self.out.extend(counts);
        self.out.extend(bytes);
        if self.r.errors_total > 0 {
            let lines = self
                .r
                .errors
                .iter()
                .filter(|(_, v)| **v > 0)
                .map(|(k, _)| line(k, self.counter_values(k)))
                .collect();
            let p = self.plot(
                "errors",
                "errors (per second, each interval)".to_owned(),
                "per second",
                Unit::Count,
                lines,
            );
            self.out.push(p);
        }
    }

    /// The host's sockets, packets, bytes, memory and CPU.
    fn host(&mut self) {
        let rhythm = self.rhythm();
        let series = self.series;
        let host = |f: fn(&HostPoint) -> Option<f64>| -> Vec<Option<f64>> {
            series.iter().map(|p| p.host.as_ref().and_then(f)).collect()
        };
        let mut sockets = self.plot(
            "host-sockets",
            "host: TCP sockets".to_owned(),
            "sockets",
            Unit::Count,
            vec![
                line("established", host(|h| Some(h.tcp_established as f64))),
                line("in use", host(|h| Some(h.tcp_inuse as f64))),
                line("time-wait", host(|h| Some(h.tcp_time_wait as f64))),
            ],
        );
        sockets.caption =
            "established: connected sockets; in use: every TCP socket, listeners and closing ones too"
                .to_owned();
        self.out.push(sockets);
        type Rate = fn(&HostPoint) -> Option<f64>;
        let in_out: [(&str, &str, &'static str, Unit, Rate, Rate); 2] = [
            (
                "host-packets",
                "host: packets per second",
                "packets/s",
                Unit::Count,
                |h| h.packets_in_per_s,
                |h| h.packets_out_per_s,
            ),
            (
                "host-bytes",
                "host: bytes per second",
                "bytes/s",
                Unit::Bytes,
                |h| h.bytes_in_per_s,
                |h| h.bytes_out_per_s,
            ),
        ];
        for (id, title, y_title, unit, rate_in, rate_out) in in_out {
            let lines = vec![
                rate_line("in", host(rate_in), series, rhythm),
                rate_line("out", host(rate_out), series, rhythm),
            ];
            let p = self.rate_plot(id, title, y_title, unit, lines);
            self.out.extend(p);
        }
        let memory = self.plot(
            "host-memory",
            "host: memory".to_owned(),
            "bytes",
            Unit::Bytes,
            vec![
                line(
                    "used (total - available)",
                    host(|h| Some(h.mem_total_bytes.saturating_sub(h.mem_available_bytes) as f64)),
                ),
                line("run's RSS", host(|h| Some(h.rss_bytes as f64))),
                line("slab", host(|h| Some(h.mem_slab_bytes as f64))),
                line("TCP kernel", host(|h| Some(h.tcp_mem_bytes as f64))),
            ],
        );
        self.out.push(memory);
        let cpu = self.rate_plot(
            "host-cpu",
            "host: CPU cores used by the run's processes",
            "cores",
            Unit::Count,
            vec![rate_line("cores", host(|h| h.cpu_cores), series, rhythm)],
        );
        self.out.extend(cpu);
    }
}

fn per_s(p: &SeriesPoint, v: u64) -> f64 {
    if p.length_s > 0.0 {
        v as f64 / p.length_s
    } else {
        0.0
    }
}

const RATE_CAPTION: &str = "a rate that comes in bursts is averaged over windows as long as the bursts are apart (the legend says how long)";

pub(crate) fn line(name: &str, values: Vec<Option<f64>>) -> Line {
    Line {
        name: name.to_owned(),
        values,
    }
}

/// A run's time axis, `span` seconds long.
fn time_axis(span: f64) -> XAxis {
    XAxis {
        span,
        unit: "s",
        title: "seconds since the run's start",
    }
}

/// Each series point's place on a time axis (the middle of its bucket),
/// and whether it follows the one before without a gap in time.
fn time_points(series: &[SeriesPoint]) -> Vec<(f64, bool)> {
    let mut last_end = f64::NEG_INFINITY;
    series
        .iter()
        .map(|p| {
            let follows = p.t_s <= last_end + p.length_s * 0.5;
            last_end = p.t_s + p.length_s;
            (p.t_s + p.length_s / 2.0, follows)
        })
        .collect()
}

/// A rate's line, averaged over windows as long as its bursts are apart
/// (see [`rate_window`]; `rhythm` where its own bursts do not show one), so
/// a message every 2 s draws a level, not a sawtooth between 0 and twice
/// it; the legend names the window.
fn rate_line(name: &str, values: Vec<Option<f64>>, series: &[SeriesPoint], rhythm: Rhythm) -> Line {
    let own = rate_window(&values);
    let Rhythm { window, first } = if own.window > 1 { own } else { rhythm };
    if window <= 1 {
        return line(name, values);
    }
    let bucket_s = series.first().map_or(1.0, |p| p.length_s);
    line(
        &format!("{name} (mean per {} s)", count(window as f64 * bucket_s)),
        averaged(&values, window, first),
    )
}

/// How a rate comes: in bursts `window` buckets apart, the first at bucket
/// `first` (a window of 1: steadily, or once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rhythm {
    window: usize,
    first: usize,
}

const STEADY: Rhythm = Rhythm {
    window: 1,
    first: 0,
};

/// How many buckets apart a rate's bursts are: the median distance between
/// buckets at a quarter of its peak or more, when there are at least three
/// such bursts; 1 (no averaging) for a steady rate or a single burst.
fn rate_window(values: &[Option<f64>]) -> Rhythm {
    let peak = values.iter().flatten().fold(0.0f64, |a, v| a.max(*v));
    if peak <= 0.0 {
        return STEADY;
    }
    let bursts: Vec<usize> = values
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_some_and(|v| v >= peak / 4.0))
        .map(|(i, _)| i)
        .collect();
    if bursts.len() < 3 {
        return STEADY;
    }
    let mut gaps: Vec<usize> = bursts.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_unstable();
    Rhythm {
        window: gaps[gaps.len() / 2].clamp(1, MAX_WINDOW),
        first: bursts[0],
    }
}

/// Each value replaced by the mean of its window: windows of `window`
/// buckets from bucket `first` on (the buckets before it are one window of
/// their own). Gaps stay gaps and do not count.
fn averaged(values: &[Option<f64>], window: usize, first: usize) -> Vec<Option<f64>> {
    let first = first.min(values.len());
    let mut out = vec![None; values.len()];
    let mut start = 0;
    while start < values.len() {
        let end = if start < first {
            first
        } else {
            (start + window).min(values.len())
        };
        let part = &values[start..end];
        let known: Vec<f64> = part.iter().flatten().copied().collect();
        if !known.is_empty() {
            let mean = known.iter().sum::<f64>() / known.len() as f64;
            for (slot, v) in out[start..end].iter_mut().zip(part) {
                *slot = v.map(|_| mean);
            }
        }
        start = end;
    }
    out
}

/// Where a plot's values fall: its y range (on a log scale or not) with
/// its ticks, and its x span.
struct Scale {
    log: bool,
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    x_span: f64,
}

impl Scale {
    fn x(&self, t: f64) -> f64 {
        LEFT + t / self.x_span * PLOT_WIDTH
    }

    fn y(&self, v: f64) -> f64 {
        let (lo, hi) = (self.lo, self.hi);
        let f = if self.log {
            (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10())
        } else {
            (v - lo) / (hi - lo)
        };
        TOP + PLOT_HEIGHT - f.clamp(0.0, 1.0) * PLOT_HEIGHT
    }
}

impl Plot {
    /// A plot of `lines` over points `at` along `x`, with no caption or marks yet.
    pub(crate) fn new(
        (id, title): (&str, String),
        (y_title, unit): (&'static str, Unit),
        lines: Vec<Line>,
        at: Vec<(f64, bool)>,
        x: XAxis,
    ) -> Self {
        Self {
            id: id.to_owned(),
            title,
            caption: String::new(),
            y_title,
            unit,
            lines,
            at,
            x,
            marks: Vec::new(),
        }
    }

    pub(crate) fn render(&self, o: &mut String) {
        let (legend, rows) = self.legend();
        let height = TOP + PLOT_HEIGHT + BELOW + LEGEND_ROW * rows as f64 + 6.0;
        let scale = self.scale();
        self.open(o, height);
        self.axes(o, &scale);
        self.marks(o, &scale);
        self.lines(o, &scale, &legend);
        o.push_str("</svg>\n");
    }

    /// Each legend entry's place, in rows that fit the width; and the rows.
    fn legend(&self) -> (Vec<(f64, usize)>, usize) {
        let mut legend = Vec::with_capacity(self.lines.len());
        let (mut lx, mut row) = (LEFT, 0usize);
        for l in &self.lines {
            let w = 34.0 + 6.2 * l.name.chars().count() as f64;
            if lx + w > WIDTH - RIGHT && lx > LEFT {
                lx = LEFT;
                row += 1;
            }
            legend.push((lx, row));
            lx += w;
        }
        let rows = if self.lines.is_empty() { 0 } else { row + 1 };
        (legend, rows)
    }

    /// The y range that holds every value, with round ticks (powers of
    /// ten for latencies), and the x span.
    fn scale(&self) -> Scale {
        let log = matches!(self.unit, Unit::Latency);
        let finite = self
            .lines
            .iter()
            .flat_map(|l| l.values.iter().flatten().copied())
            .filter(|v| v.is_finite() && (!log || *v > 0.0));
        let (mut lo, mut hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
        let empty = !lo.is_finite();
        let ticks: Vec<f64>;
        if log {
            let (a, b) = if empty { (1.0, 1000.0) } else { (lo, hi) };
            lo = 10f64.powf(a.log10().floor());
            hi = 10f64.powf(b.log10().ceil().max(lo.log10() + 1.0));
            ticks = (lo.log10() as i32..=hi.log10() as i32)
                .map(|e| 10f64.powi(e))
                .collect();
        } else {
            let top = if empty || hi <= 0.0 { 1.0 } else { hi };
            let step = nice_step(top / 4.0);
            lo = 0.0;
            hi = (top / step).ceil() * step;
            ticks = (0..=((hi / step).round() as u32))
                .map(|i| i as f64 * step)
                .collect();
        }
        Scale {
            log,
            lo,
            hi,
            ticks,
            x_span: self.x.span.max(1e-9),
        }
    }

    /// The `<svg>` element's start, the title, caption and y axis title.
    fn open(&self, o: &mut String, height: f64) {
        let _ = writeln!(
            o,
            "<svg class=\"plot\" id=\"{}\" data-lines=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\">",
            esc(&self.id),
            self.lines.len()
        );
        let _ = writeln!(o, "<title>{}</title>", esc(&self.title));
        let _ = writeln!(
            o,
            "<text class=\"title\" x=\"{LEFT}\" y=\"17\">{}</text>",
            esc(&self.title)
        );
        if !self.caption.is_empty() {
            let _ = writeln!(
                o,
                "<text class=\"caption\" x=\"{LEFT}\" y=\"32\">{}</text>",
                esc(&self.caption)
            );
        }
        let mid_y = TOP + PLOT_HEIGHT / 2.0;
        let _ = writeln!(
            o,
            "<text class=\"axis-title\" x=\"14\" y=\"{mid_y:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {mid_y:.1})\">{}</text>",
            esc(self.y_title)
        );
    }

    /// The y ticks with their grid, the x ticks, both axes and their titles.
    fn axes(&self, o: &mut String, scale: &Scale) {
        for t in &scale.ticks {
            let yy = scale.y(*t);
            let label = match self.unit {
                Unit::Latency => latency(*t),
                Unit::Count => count(*t),
                Unit::Bytes => bytes(*t),
            };
            let _ = writeln!(
                o,
                "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT + PLOT_WIDTH,
                LEFT - 6.0,
                yy + 4.0,
                esc(&label)
            );
        }
        let x_step = nice_step(scale.x_span / 8.0);
        let mut t = 0.0;
        while t <= scale.x_span + 1e-9 {
            let xx = scale.x(t);
            let _ = writeln!(
                o,
                "<line class=\"axis\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/><text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}{}</text>",
                TOP + PLOT_HEIGHT,
                TOP + PLOT_HEIGHT + 4.0,
                TOP + PLOT_HEIGHT + 16.0,
                count(t),
                self.x.unit
            );
            t += x_step;
        }
        let _ = writeln!(
            o,
            "<text class=\"axis-title\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            LEFT + PLOT_WIDTH / 2.0,
            TOP + PLOT_HEIGHT + 30.0,
            esc(self.x.title)
        );
        let _ = writeln!(
            o,
            "<line class=\"axis\" x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{:.1}\"/><line class=\"axis\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>",
            TOP + PLOT_HEIGHT,
            LEFT + PLOT_WIDTH,
            TOP + PLOT_HEIGHT,
            TOP + PLOT_HEIGHT
        );
    }

    /// The vertical marks (a knee).
    fn marks(&self, o: &mut String, scale: &Scale) {
        for m in &self.marks {
            let xx = scale.x(m.x.clamp(0.0, scale.x_span));
            let dash = if m.dashed {
                " stroke-dasharray=\"5,4\""
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "<line class=\"mark\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#222\" stroke-width=\"1.5\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                TOP + PLOT_HEIGHT,
                xx + 4.0,
                TOP + 12.0,
                esc(&m.label)
            );
        }
    }

    /// Each line, its lone points as dots, and its legend entry.
    fn lines(&self, o: &mut String, scale: &Scale, legend: &[(f64, usize)]) {
        for (i, (l, (lx, row))) in self.lines.iter().zip(legend).enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let (width, dash, opacity) = STYLES[i % STYLES.len()];
            let style = if dash.is_empty() {
                format!("stroke=\"{color}\" stroke-width=\"{width}\" stroke-opacity=\"{opacity}\"")
            } else {
                format!(
                    "stroke=\"{color}\" stroke-width=\"{width}\" stroke-opacity=\"{opacity}\" stroke-dasharray=\"{dash}\""
                )
            };
            let (d, n, dots) = self.path(&l.values, &|t| scale.x(t), &|v| scale.y(v));
            let _ = writeln!(
                o,
                "<path class=\"series\" data-name=\"{}\" data-points=\"{n}\" fill=\"none\" {style} d=\"{d}\"/>",
                esc(&l.name)
            );
            for (cx, cy) in dots {
                let _ = writeln!(
                    o,
                    "<circle class=\"dot\" cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"{:.1}\" fill=\"{color}\" fill-opacity=\"{opacity}\"/>",
                    1.5 + width / 2.0
                );
            }
            let ly = TOP + PLOT_HEIGHT + BELOW + LEGEND_ROW * *row as f64;
            let _ = writeln!(
                o,
                "<line x1=\"{lx:.1}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" {style}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                lx + 24.0,
                ly - 4.0,
                ly - 4.0,
                lx + 28.0,
                ly,
                esc(&l.name)
            );
        }
    }

    /// SVG path data through the points, broken where a value is missing or
    /// a point does not follow the one before (a gap in time); how many
    /// points it draws; and the points with no neighbour to join, which a
    /// path cannot show and are drawn as dots (a message every other
    /// interval gives only such points).
    fn path(
        &self,
        values: &[Option<f64>],
        x: &impl Fn(f64) -> f64,
        y: &impl Fn(f64) -> f64,
    ) -> (String, usize, Vec<(f64, f64)>) {
        let mut d = String::new();
        let mut n = 0;
        let mut dots = Vec::new();
        // The last point drawn, while nothing has been joined to it yet.
        let mut alone: Option<(f64, f64)> = None;
        let mut pen_down = false;
        for (&(px, follows), v) in self.at.iter().zip(values) {
            let Some(v) = v.filter(|v| v.is_finite()) else {
                pen_down = false;
                continue;
            };
            let (xx, yy) = (x(px), y(v));
            let joined = pen_down && follows;
            let cmd = if joined { 'L' } else { 'M' };
            let _ = write!(d, "{cmd}{xx:.1},{yy:.1} ");
            if joined {
                alone = None;
            } else {
                dots.extend(alone.replace((xx, yy)));
            }
            pen_down = true;
            n += 1;
        }
        dots.extend(alone);
        if d.is_empty() {
            // An empty path draws nothing but stays valid.
            d.push_str("M0,0");
        }
        (d.trim_end().to_owned(), n, dots)
    }
}

/// An event's text for the table: a long one (a run's JSON summary) folds
/// into its first line, and opens in full, wrapped, on a click.
fn event_text(text: &str) -> String {
    const SHORT: usize = 120;
    if text.chars().count() <= SHORT {
        return esc(text);
    }
    let head: String = text.chars().take(SHORT).collect();
    format!(
        "<details><summary>{}…</summary><pre class=\"full\">{}</pre></details>",
        esc(&head),
        esc(text)
    )
}

/// A round step (1, 2 or 5 × 10^k) near `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// Escapes text for HTML/XML content and attributes.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0.
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(1.0), 1.0);
        assert_eq!(nice_step(2.6), 5.0);
        assert_eq!(nice_step(2_600.0), 5_000.0);
        assert_eq!(nice_step(f64::NAN), 1.0);
    }

    fn at(t_s: f64) -> SeriesPoint {
        SeriesPoint {
            start_ns: 0,
            t_s,
            length_s: 1.0,
            counters: Default::default(),
            gauges: Default::default(),
            histograms: Default::default(),
            host: None,
        }
    }

    fn drawn(times: &[f64], values: &[Option<f64>]) -> (usize, Vec<(f64, f64)>) {
        let points: Vec<SeriesPoint> = times.iter().map(|&t| at(t)).collect();
        let plot = Plot {
            id: "p".into(),
            title: "t".into(),
            caption: String::new(),
            y_title: "y",
            unit: Unit::Count,
            lines: Vec::new(),
            at: time_points(&points),
            x: time_axis(10.0),
            marks: Vec::new(),
        };
        let (_, n, dots) = plot.path(values, &|x| x, &|y| y);
        (n, dots)
    }

    // A message every other interval left the delivery plot empty: each
    // point was a path of its own, and a one-point path draws nothing.
    #[test]
    fn lone_points_are_dots_and_joined_ones_are_not() {
        let (n, dots) = drawn(&[0.0, 2.0, 4.0], &[Some(1.0), Some(2.0), Some(3.0)]);
        assert_eq!((n, dots), (3, vec![(0.5, 1.0), (2.5, 2.0), (4.5, 3.0)]));
        let (n, dots) = drawn(&[0.0, 1.0, 2.0], &[Some(1.0), Some(2.0), Some(3.0)]);
        assert_eq!((n, dots), (3, vec![]));
        let (n, dots) = drawn(
            &[0.0, 1.0, 2.0, 3.0],
            &[Some(1.0), None, Some(3.0), Some(4.0)],
        );
        assert_eq!((n, dots), (3, vec![(0.5, 1.0)]));
    }

    // A message every 2 s drew 0 -> 2000 -> 0 -> 2000: its rate is now
    // the mean over 2 s windows, a level.
    #[test]
    fn bursty_rates_are_averaged_over_their_period() {
        let every_other: Vec<Option<f64>> = (0..10)
            .map(|i| Some(if i % 2 == 1 { 2000.0 } else { 0.0 }))
            .collect();
        let rhythm = rate_window(&every_other);
        assert_eq!(
            rhythm,
            Rhythm {
                window: 2,
                first: 1
            }
        );
        let level = averaged(&every_other, rhythm.window, rhythm.first);
        assert_eq!(
            level[0],
            Some(0.0),
            "before the first burst: a window of its own"
        );
        assert!(level[1..9].iter().all(|v| *v == Some(1000.0)), "{level:?}");
        // Steady, or once: drawn as recorded.
        assert_eq!(rate_window(&[Some(5.0); 10]).window, 1);
        let once: Vec<Option<f64>> = (0..10)
            .map(|i| Some(if i == 3 { 9.0 } else { 0.0 }))
            .collect();
        assert_eq!(rate_window(&once).window, 1);
        assert_eq!(rate_window(&[None, Some(0.0)]).window, 1);
        // Gaps stay gaps.
        assert_eq!(
            averaged(&[Some(2.0), None, Some(4.0)], 3, 0),
            vec![Some(3.0), None, Some(3.0)]
        );
        // The line says it.
        let points: Vec<SeriesPoint> = (0..10).map(|t| at(f64::from(t))).collect();
        let l = rate_line("messages.received", every_other, &points, STEADY);
        assert_eq!(l.name, "messages.received (mean per 2 s)");
    }

    // Sockets in use hid established ones (the same values, drawn over
    // them in the same style); the axes had no titles.
    #[test]
    fn plots_tell_equal_lines_apart_and_name_their_axes() {
        let points: Vec<SeriesPoint> = (0..4).map(|t| at(f64::from(t))).collect();
        let same = vec![Some(4000.0); 4];
        let plot = Plot {
            id: "host-sockets".into(),
            title: "host: TCP sockets".into(),
            caption: "what it shows".into(),
            y_title: "sockets",
            unit: Unit::Count,
            lines: vec![line("established", same.clone()), line("in use", same)],
            at: time_points(&points),
            x: time_axis(4.0),
            marks: Vec::new(),
        };
        let mut o = String::new();
        plot.render(&mut o);
        let styles: Vec<&str> = o
            .lines()
            .filter(|l| l.starts_with("<path class=\"series\""))
            .map(|l| &l[l.find("stroke=").unwrap()..l.find(" d=").unwrap()])
            .collect();
        assert_eq!(styles.len(), 2);
        assert_ne!(styles[0], styles[1]);
        assert!(
            o.contains(">sockets</text>")
                && o.contains(">seconds since the run&#39;s start</text>")
        );
        assert!(o.contains(">what it shows</text>"));
    }

    #[test]
    fn a_bench_page_leads_with_its_headline() {
        use crate::bench::{BenchSummary, MessageDelivery};
        let mut b = BenchSummary {
            title: "100000 connections, 10 messages".into(),
            ..BenchSummary::default()
        };
        b.connections.held = 99_998;
        b.connections.asked = 100_000;
        b.connections.failed = 2;
        b.memory.server_bytes = 331.0;
        b.messages.each = vec![MessageDelivery {
            seq: 1,
            delivered: 99_998,
            ..MessageDelivery::default()
        }];
        let report = Report {
            benches: vec![b],
            ..Report::build(&crate::merge::Merger::new(1).finish(), &[], true)
        };
        let page = render(&report);
        assert!(page.contains("<title>throng bench: 100000 connections, 10 messages</title>"));
        let headline = page.find("id=\"bench-summary\"").unwrap();
        let over_time = page.find("<h2>Over time</h2>").unwrap();
        assert!(headline < over_time, "the headline comes first");
        assert!(page.contains("data-figure=\"held\">99998<"), "{page}");
        assert!(page.contains("data-figure=\"failed\">2<"), "{page}");
        assert!(page.contains("class=\"verdict bad\""), "{page}");
        assert!(
            page.contains("data-figure=\"memory-server\">331 B<"),
            "{page}"
        );
        assert!(
            !page.contains("data-figure=\"verdict\""),
            "an older record has none"
        );
    }

    #[test]
    fn the_server_messages_spread_is_on_the_page() {
        let mut merger = crate::merge::Merger::new(1);
        let mut spread = crate::fanout::Spread::default();
        spread.arrived(crate::fanout::MessageId::Seq(1), 1_000);
        spread.arrived(crate::fanout::MessageId::Seq(1), 301_000);
        merger.add_event(crate::format::Event {
            at_ns: 1,
            source: "h/hold-0".into(),
            kind: crate::fanout::KIND.into(),
            text: spread.to_text(),
        });
        let page = render(&Report::build(&merger.finish(), &[], true));
        assert!(
            page.contains("<p id=\"server-spread\">server messages&#39; fan-out spread"),
            "{page}"
        );
        // From 1,000 ns to 301,000 ns: 300 µs, both deliveries of s1.
        assert!(page.contains("max 300µs (s1, 2 deliveries)"), "{page}");
    }

    #[test]
    fn a_bench_page_says_its_verdict_what_missed_and_the_first_limit() {
        use crate::bench::BenchSummary;
        let page = |b: BenchSummary| {
            render(&Report {
                benches: vec![b],
                ..Report::build(&crate::merge::Merger::new(1).finish(), &[], true)
            })
        };
        let failed = page(BenchSummary {
            verdict: "FAIL".into(),
            failures: vec!["2 connections failed (reset 2)".into()],
            first_limit: "CPU at 67.0 s (the machine 96% busy)".into(),
            ..BenchSummary::default()
        });
        assert!(failed.contains("class=\"verdict bad\"><b data-figure=\"verdict\">FAIL</b>"));
        assert!(failed.contains("missed: 2 connections failed (reset 2)"));
        assert!(failed.contains("first limit reached: CPU at 67.0 s (the machine 96% busy)"));
        // The verdict decides, not the figures: a PASS is not painted red.
        let passed = page(BenchSummary {
            verdict: "PASS".into(),
            ..BenchSummary::default()
        });
        assert!(passed.contains("class=\"verdict\"><b data-figure=\"verdict\">PASS</b>"));
        assert!(!passed.contains("missed:"));
    }

    #[test]
    fn long_event_texts_fold() {
        assert_eq!(event_text("<short>"), "&lt;short&gt;");
        let long = "x".repeat(500);
        let folded = event_text(&long);
        assert!(folded.starts_with("<details><summary>"));
        assert!(folded.contains(&long));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'\u{1}"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;\u{fffd}"
        );
    }
}
