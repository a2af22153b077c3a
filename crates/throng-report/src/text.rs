//! The human report: aligned plain text, latencies in readable units, one
//! section per kind of figure, and the time series as a table when asked.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::summary::{HistStats, Report, is_error};

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

/// Bytes with a binary unit: `512 B`, `3.2 KiB`, `1.50 GiB`.
pub fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
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
    if r.duplicates > 0 {
        let _ = writeln!(
            o,
            "  note: {} interval(s) appeared twice (same source and start) and were counted once",
            r.duplicates
        );
    }

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
    if !r.latency_us.is_empty() {
        let _ = writeln!(o, "\nlatency");
        let _ = writeln!(
            o,
            "  {:<nw$} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "", "count", "min", "mean", "stddev", "p50", "p75", "p90", "p95", "p99", "p99.9", "max"
        );
        for (name, h) in &r.latency_us {
            let _ = writeln!(o, "  {:<nw$} {}", name, stats_row(h));
        }
    }

    if !r.counters.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<w$} {:>9} {:>12}",
            "counters",
            "total",
            "per second",
            w = nw + 2
        );
        for (name, c) in &r.counters {
            let (total, rate) = if name.starts_with("bytes") {
                (bytes(c.total as f64), format!("{}/s", bytes(c.per_second)))
            } else {
                (count(c.total as f64), count(c.per_second))
            };
            let _ = writeln!(o, "  {name:<nw$} {total:>9} {rate:>12}");
        }
    }

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

    if !r.gauges.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<w$} {:>9} {:>9} {:>9}",
            "gauges",
            "last",
            "max",
            "min",
            w = nw + 2
        );
        for (name, g) in &r.gauges {
            let _ = writeln!(
                o,
                "  {:<nw$} {:>9} {:>9} {:>9}",
                name,
                count(g.last as f64),
                count(g.max as f64),
                count(g.min as f64)
            );
        }
    }

    if let Some(h) = &r.host {
        let _ = writeln!(o, "\nhost ({}: {})", h.hosts.len(), h.hosts.join(", "));
        let _ = writeln!(
            o,
            "  tcp established      last {}, max {}",
            count(h.tcp_established_last as f64),
            count(h.tcp_established_max as f64)
        );
        let _ = writeln!(
            o,
            "  packets per second   in {} (max {}), out {} (max {})",
            count(h.packets_in_per_s),
            count(h.packets_in_per_s_max),
            count(h.packets_out_per_s),
            count(h.packets_out_per_s_max)
        );
        let _ = writeln!(
            o,
            "  bytes per second     in {} (max {}), out {} (max {})",
            bytes(h.bytes_in_per_s),
            bytes(h.bytes_in_per_s_max),
            bytes(h.bytes_out_per_s),
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

    if !r.event_kinds.is_empty() {
        let parts: Vec<String> = r
            .event_kinds
            .iter()
            .map(|(k, v)| format!("{k} ×{v}"))
            .collect();
        let _ = writeln!(o, "\nevents: {}", parts.join(", "));
        // One line for the same thing said by many sources.
        for g in r.event_groups.iter().take(20) {
            let t = |ns: u64| ns.saturating_sub(r.start_ns) as f64 / 1e9;
            let (when, who) = if g.count == 1 {
                (format!("+{:.1}s", t(g.first_ns)), g.sources_text())
            } else {
                (
                    format!("+{:.1}s..+{:.1}s", t(g.first_ns), t(g.last_ns)),
                    format!("×{} from {}", g.count, g.sources_text()),
                )
            };
            let _ = writeln!(o, "  {when} {} {who}: {}", g.kind, g.text);
        }
        if r.event_groups.len() > 20 {
            let _ = writeln!(
                o,
                "  ... (--format json lists up to {})",
                crate::merge::MAX_EVENTS_KEPT
            );
        }
    }

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
        "{:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
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

fn render_series(o: &mut String, r: &Report, series: &[crate::summary::SeriesPoint]) {
    let gauges: BTreeSet<&String> = series.iter().flat_map(|p| p.gauges.keys()).collect();
    let counters: Vec<&String> = r
        .counters
        .iter()
        .filter(|(k, c)| c.total > 0 && !is_error(k))
        .map(|(k, _)| k)
        .collect();
    let hists: BTreeSet<&String> = series.iter().flat_map(|p| p.histograms.keys()).collect();
    let with_host = series.iter().any(|p| p.host.is_some());
    let width = series.first().map_or(0.0, |p| p.length_s);

    // Columns of (title, one cell per point), then aligned to their widest cell.
    let mut columns: Vec<(String, Vec<String>)> = Vec::new();
    let mut column = |title: String, cell: &dyn Fn(&crate::summary::SeriesPoint) -> String| {
        columns.push((title, series.iter().map(cell).collect()));
    };
    column("t".to_owned(), &|p| format!("{:.1}", p.t_s));
    let per_s = |p: &crate::summary::SeriesPoint, n: u64| {
        if p.length_s > 0.0 {
            n as f64 / p.length_s
        } else {
            0.0
        }
    };
    for g in &gauges {
        column(short(g), &|p| {
            p.gauges
                .get(*g)
                .map_or("-".to_owned(), |v| count(*v as f64))
        });
    }
    for c in &counters {
        column(format!("{}/s", short(c)), &|p| {
            count(per_s(p, p.counters.get(*c).copied().unwrap_or(0)))
        });
    }
    column("errors/s".to_owned(), &|p| {
        count(per_s(
            p,
            p.counters
                .iter()
                .filter(|(k, _)| is_error(k))
                .map(|(_, v)| v)
                .sum(),
        ))
    });
    for h in &hists {
        for (q, pick) in [
            ("p50", (|s: &HistStats| s.p50) as fn(&HistStats) -> u64),
            ("p99", |s: &HistStats| s.p99),
            ("max", |s: &HistStats| s.max),
        ] {
            column(
                format!("{} {q}", short(h)),
                &|p| match p.histograms.get(*h) {
                    Some(s) if s.count > 0 => latency(pick(s) as f64),
                    _ => "-".to_owned(),
                },
            );
        }
    }
    if with_host {
        type Pick = fn(&crate::summary::HostPoint) -> String;
        let host_columns: [(&str, Pick); 6] = [
            ("estab", |h| count(h.tcp_established as f64)),
            ("pkt in/s", |h| {
                h.packets_in_per_s.map_or("-".to_owned(), count)
            }),
            ("pkt out/s", |h| {
                h.packets_out_per_s.map_or("-".to_owned(), count)
            }),
            ("in", |h| {
                h.bytes_in_per_s
                    .map_or("-".to_owned(), |b| format!("{}/s", bytes(b)))
            }),
            ("out", |h| {
                h.bytes_out_per_s
                    .map_or("-".to_owned(), |b| format!("{}/s", bytes(b)))
            }),
            ("mem avail", |h| bytes(h.mem_available_bytes as f64)),
        ];
        for (title, pick) in host_columns {
            column(title.to_owned(), &|p| {
                p.host.as_ref().map_or("-".to_owned(), pick)
            });
        }
    }

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
    let _ = writeln!(o, "\ntime series, every {width} s (counters per second)");
    let mut line = String::new();
    for ((title, _), w) in columns.iter().zip(&widths) {
        let _ = write!(line, "  {title:>w$}");
    }
    let _ = writeln!(o, "{}", line.trim_end());
    for i in 0..series.len() {
        line.clear();
        for ((_, cells), w) in columns.iter().zip(&widths) {
            let _ = write!(line, "  {:>w$}", cells[i]);
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
        assert_eq!(count(1234.0), "1234");
        assert_eq!(count(12_500.0), "12.5k");
        assert_eq!(short("connect.error.refused"), "erro.refused");
        assert_eq!(short("connections.open"), "conn.open");
        assert_eq!(short("messages.received"), "received");
        assert_eq!(short("delivery"), "delivery");
    }
}
