//! The HTML report: one self-contained page (no scripts, no fetches) with
//! the summary tables and inline SVG plots drawn here, all on one time axis:
//! latency percentiles, connections open, throughput, errors, and the host
//! (established sockets, packets and bytes per second, memory).
//!
//! The page is also well-formed XML, so tests (and tools) can parse it.
//!
//! The plot drawing is shared with the knee's page ([`crate::knee`]), whose
//! x axis is the load instead of time: a [`Plot`] takes where each point
//! sits along an [`XAxis`], and may carry vertical [`Mark`]s.

use std::fmt::Write as _;

use crate::summary::{HostPoint, Report, SeriesPoint, is_error};
use crate::text::{bytes, count, latency};

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 240.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 34.0;
const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

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
/// the number (`s` for time).
#[derive(Debug, Clone, Copy)]
pub(crate) struct XAxis {
    pub(crate) span: f64,
    pub(crate) unit: &'static str,
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
    head(&mut o, "throng report");
    o.push_str("<h1>throng report</h1>\n");
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

/// The report's tables and its plots over time.
pub(crate) fn body(o: &mut String, report: &Report) {
    summary(o, report);
    let series = report.series.as_deref().unwrap_or(&[]);
    if series.is_empty() {
        o.push_str("<p class=\"empty\">No intervals: nothing to plot.</p>\n");
    } else {
        for plot in plots(report, series) {
            plot.render(o);
        }
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{padding:3px 9px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child,td.l,th.l{text-align:left}
.warn{color:#a00}.muted{color:#777;font-size:13px}
pre.full{white-space:pre-wrap;word-break:break-all;max-width:760px;font-size:12px}
svg.plot{display:block;margin:14px 0;background:#fff;border:1px solid #eee}
svg text{font-size:11px;fill:#444}svg .title{font-size:13px;font-weight:bold;fill:#222}
svg .grid{stroke:#eee}svg .axis{stroke:#999}
";

fn summary(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "<p>{} file(s), {} source(s), {} interval(s); from {} for {:.1} s.</p>",
        r.files.len(),
        r.sources.len(),
        r.intervals,
        esc(&r.start),
        r.duration_s
    );
    if !r.files.is_empty() {
        o.push_str("<table><tr><th>file</th><th class=\"l\">host</th><th class=\"l\">started</th><th>records</th><th class=\"l\">command</th></tr>\n");
        for f in &r.files {
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
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
    if !r.latency_us.is_empty() {
        o.push_str("<h2>Latency</h2>\n<table><tr><th></th><th>count</th><th>min</th><th>mean</th><th>stddev</th><th>p50</th><th>p75</th><th>p90</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th></tr>\n");
        for (name, h) in &r.latency_us {
            let _ = write!(o, "<tr><td>{}</td><td>{}</td>", esc(name), h.count);
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
        o.push_str("</table>\n");
    }
    if !r.counters.is_empty() {
        o.push_str(
            "<h2>Counters</h2>\n<table><tr><th></th><th>total</th><th>per second</th></tr>\n",
        );
        for (name, c) in &r.counters {
            let class = if is_error(name) && c.total > 0 {
                " class=\"warn\""
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "<tr{class}><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(name),
                c.total,
                esc(&count(c.per_second))
            );
        }
        o.push_str("</table>\n");
    }
    let _ = writeln!(o, "<p>errors: {}", r.errors_total);
    for (k, v) in &r.losses {
        let _ = write!(o, "; {}: {v}", esc(k));
    }
    o.push_str("</p>\n");
    if let Some(h) = &r.host {
        let _ = writeln!(
            o,
            "<h2>Host</h2>\n<p>{}: established max {}, packets/s in {} out {}, bytes/s in {} out {}, \
             memory available min {} of {}, run's RSS max {}, CPU {:.2} cores.</p>",
            esc(&h.hosts.join(", ")),
            count(h.tcp_established_max as f64),
            count(h.packets_in_per_s),
            count(h.packets_out_per_s),
            esc(&bytes(h.bytes_in_per_s)),
            esc(&bytes(h.bytes_out_per_s)),
            esc(&bytes(h.mem_available_min_bytes as f64)),
            esc(&bytes(h.mem_total_bytes as f64)),
            esc(&bytes(h.rss_max_bytes as f64)),
            h.cpu_cores
        );
    }
    if !r.event_kinds.is_empty() {
        o.push_str("<h2>Events</h2>\n<table><tr><th>t</th><th class=\"l\">source</th><th class=\"l\">kind</th><th class=\"l\">text</th></tr>\n");
        for e in r.events.iter().take(200) {
            let _ = writeln!(
                o,
                "<tr><td>+{:.1}s</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                e.at_ns.saturating_sub(r.start_ns) as f64 / 1e9,
                esc(&e.source),
                esc(&e.kind),
                event_text(&e.text)
            );
        }
        o.push_str("</table>\n");
    }
    o.push_str("<h2>Over time</h2>\n");
}

fn plots(r: &Report, series: &[SeriesPoint]) -> Vec<Plot> {
    let mut plots = Vec::new();
    let at = time_points(series);
    let plot = |id: &str, title: String, unit, lines| Plot {
        id: id.to_owned(),
        title,
        unit,
        lines,
        at: at.clone(),
        x: XAxis {
            span: r.duration_s,
            unit: "s",
        },
        marks: Vec::new(),
    };
    for name in r.latency_us.keys() {
        let q = |f: fn(&crate::summary::HistStats) -> u64| {
            series
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
        plots.push(plot(
            &format!("latency-{name}"),
            format!("{name} latency percentiles (log scale)"),
            Unit::Latency,
            lines,
        ));
    }
    if !r.gauges.is_empty() {
        let lines = r
            .gauges
            .keys()
            .map(|g| {
                line(
                    g,
                    series
                        .iter()
                        .map(|p| p.gauges.get(g).map(|v| *v as f64))
                        .collect(),
                )
            })
            .collect();
        plots.push(plot(
            "gauges",
            "open (connections and other levels)".to_owned(),
            Unit::Count,
            lines,
        ));
    }
    let per_s = |p: &SeriesPoint, v: u64| {
        if p.length_s > 0.0 {
            v as f64 / p.length_s
        } else {
            0.0
        }
    };
    let counter_line = |k: &str| {
        line(
            k,
            series
                .iter()
                .map(|p| Some(per_s(p, p.counters.get(k).copied().unwrap_or(0))))
                .collect(),
        )
    };
    let rate_lines = |bytes_counters: bool| -> Vec<Line> {
        r.counters
            .iter()
            .filter(|(k, c)| {
                c.total > 0 && !is_error(k) && k.starts_with("bytes") == bytes_counters
            })
            .map(|(k, _)| counter_line(k))
            .collect()
    };
    let throughput = rate_lines(false);
    if !throughput.is_empty() {
        plots.push(plot(
            "throughput",
            "throughput (per second)".to_owned(),
            Unit::Count,
            throughput,
        ));
    }
    let byte_rates = rate_lines(true);
    if !byte_rates.is_empty() {
        plots.push(plot(
            "throughput-bytes",
            "bytes per second".to_owned(),
            Unit::Bytes,
            byte_rates,
        ));
    }
    if r.errors_total > 0 {
        let lines = r
            .errors
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, _)| counter_line(k))
            .collect();
        plots.push(plot(
            "errors",
            "errors (per second)".to_owned(),
            Unit::Count,
            lines,
        ));
    }
    if r.host.is_some() {
        let host = |f: fn(&HostPoint) -> Option<f64>| -> Vec<Option<f64>> {
            series.iter().map(|p| p.host.as_ref().and_then(f)).collect()
        };
        plots.push(plot(
            "host-sockets",
            "host: TCP sockets".to_owned(),
            Unit::Count,
            vec![
                line("established", host(|h| Some(h.tcp_established as f64))),
                line("in use", host(|h| Some(h.tcp_inuse as f64))),
                line("time-wait", host(|h| Some(h.tcp_time_wait as f64))),
            ],
        ));
        type Rate = fn(&HostPoint) -> Option<f64>;
        let in_out: [(&str, &str, Unit, Rate, Rate); 2] = [
            (
                "host-packets",
                "host: packets per second",
                Unit::Count,
                |h| h.packets_in_per_s,
                |h| h.packets_out_per_s,
            ),
            (
                "host-bytes",
                "host: bytes per second",
                Unit::Bytes,
                |h| h.bytes_in_per_s,
                |h| h.bytes_out_per_s,
            ),
        ];
        for (id, title, unit, rate_in, rate_out) in in_out {
            let lines = vec![line("in", host(rate_in)), line("out", host(rate_out))];
            plots.push(plot(id, title.to_owned(), unit, lines));
        }
        plots.push(plot(
            "host-memory",
            "host: memory".to_owned(),
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
        ));
        plots.push(plot(
            "host-cpu",
            "host: CPU cores used by the run's processes".to_owned(),
            Unit::Count,
            vec![line("cores", host(|h| h.cpu_cores))],
        ));
    }
    plots
}

pub(crate) fn line(name: &str, values: Vec<Option<f64>>) -> Line {
    Line {
        name: name.to_owned(),
        values,
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

impl Plot {
    pub(crate) fn render(&self, o: &mut String) {
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;
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
        let x_span = self.x.span.max(1e-9);
        let x = |t: f64| LEFT + t / x_span * plot_w;
        let y = |v: f64| {
            let f = if log {
                (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10())
            } else {
                (v - lo) / (hi - lo)
            };
            TOP + plot_h - f.clamp(0.0, 1.0) * plot_h
        };

        let _ = writeln!(
            o,
            "<svg class=\"plot\" id=\"{}\" data-lines=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\">",
            esc(&self.id),
            self.lines.len()
        );
        let _ = writeln!(o, "<title>{}</title>", esc(&self.title));
        let _ = writeln!(
            o,
            "<text class=\"title\" x=\"{LEFT}\" y=\"18\">{}</text>",
            esc(&self.title)
        );
        for t in &ticks {
            let yy = y(*t);
            let label = match self.unit {
                Unit::Latency => latency(*t),
                Unit::Count => count(*t),
                Unit::Bytes => bytes(*t),
            };
            let _ = writeln!(
                o,
                "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT + plot_w,
                LEFT - 6.0,
                yy + 4.0,
                esc(&label)
            );
        }
        let x_step = nice_step(x_span / 8.0);
        let mut t = 0.0;
        while t <= x_span + 1e-9 {
            let xx = x(t);
            let _ = writeln!(
                o,
                "<line class=\"axis\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/><text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}{}</text>",
                TOP + plot_h,
                TOP + plot_h + 4.0,
                TOP + plot_h + 16.0,
                count(t),
                self.x.unit
            );
            t += x_step;
        }
        let _ = writeln!(
            o,
            "<line class=\"axis\" x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{:.1}\"/><line class=\"axis\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>",
            TOP + plot_h,
            LEFT + plot_w,
            TOP + plot_h,
            TOP + plot_h
        );
        for m in &self.marks {
            let xx = x(m.x.clamp(0.0, x_span));
            let dash = if m.dashed {
                " stroke-dasharray=\"5,4\""
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "<line class=\"mark\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#222\" stroke-width=\"1.5\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                TOP + plot_h,
                xx + 4.0,
                TOP + 12.0,
                esc(&m.label)
            );
        }
        let mut legend_x = LEFT;
        for (i, l) in self.lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let (d, n, dots) = self.path(&l.values, &x, &y);
            let _ = writeln!(
                o,
                "<path class=\"series\" data-name=\"{}\" data-points=\"{n}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" d=\"{d}\"/>",
                esc(&l.name)
            );
            for (cx, cy) in dots {
                let _ = writeln!(
                    o,
                    "<circle class=\"dot\" cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"2.5\" fill=\"{color}\"/>"
                );
            }
            let _ = writeln!(
                o,
                "<rect x=\"{legend_x:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                HEIGHT - 12.0,
                legend_x + 14.0,
                HEIGHT - 3.0,
                esc(&l.name)
            );
            legend_x += 22.0 + 7.0 * l.name.chars().count() as f64;
        }
        o.push_str("</svg>\n");
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
            unit: Unit::Count,
            lines: Vec::new(),
            at: time_points(&points),
            x: XAxis {
                span: 10.0,
                unit: "s",
            },
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
