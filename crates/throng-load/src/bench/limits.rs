//! Which limit a bench run reached first, from what it measured: the
//! machine's CPU, its memory, the harness falling behind its schedule, the
//! server answering connections slowly, and the connect rate falling short
//! of the plan. Each is a threshold on one measured figure, stated in
//! [`THRESHOLDS`], checked second by second; a run that reached none says
//! how close it came.

use std::collections::BTreeMap;

use serde::Serialize;
use throng_host::sample::HostSample;
use throng_report::interval::Interval;

use super::monitor::label;

/// The thresholds, as the summary states them.
pub const THRESHOLDS: &str = "CPU: the machine >= 95% busy over a second; memory: < 10% available; \
     harness lag: a connection started >= 1 s behind its schedule; connect latency: \
     p99 >= 1 s in a second; connect rate: < 90% of the planned rate in a second of the ramp";

/// A limit the run reached.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limit {
    /// `CPU`, `memory`, `harness lag`, `connect latency`, `connect rate`.
    pub name: &'static str,
    /// Seconds from the schedule's start to the second it was first reached in.
    pub at_s: f64,
    /// What was measured then.
    pub detail: String,
}

/// What the run measured at its worst, for a run that reached no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Peaks {
    /// The busiest second of the machine, fraction of all cores.
    pub cpu_busy: f64,
    /// The least memory available, fraction of the total.
    pub mem_available: f64,
    /// The largest harness lag, µs.
    pub lag_us: u64,
    /// The largest connect p99 of a second, µs.
    pub connect_p99_us: u64,
}

/// Every limit reached, each at its first second, in time order; and the peaks.
pub fn reached(
    intervals: &BTreeMap<u64, Interval>,
    samples: &[HostSample],
    start_ns: u64,
    planned_rate: Option<f64>,
) -> (Vec<Limit>, Peaks) {
    let mut found: Vec<Limit> = Vec::new();
    let mut peaks = Peaks {
        mem_available: 1.0,
        ..Peaks::default()
    };
    let at = |ns: u64| ns.saturating_sub(start_ns) as f64 / 1e9;
    let note = |found: &mut Vec<Limit>, name: &'static str, at_s: f64, detail: String| {
        if !found.iter().any(|l| l.name == name) {
            found.push(Limit { name, at_s, detail });
        }
    };
    for w in cpu_windows(samples) {
        peaks.cpu_busy = peaks.cpu_busy.max(w.busy);
        if w.busy >= 0.95 {
            // Without the run's own CPU in the window, nothing is known of
            // whose the rest is: not blamed on other programs.
            let detail = if w.server + w.harness > 0.0 {
                format!(
                    "the machine {:.0}% busy: server {:.0}%, harness {:.0}%, other programs {:.0}%",
                    100.0 * w.busy,
                    100.0 * w.server,
                    100.0 * w.harness,
                    100.0 * (w.busy - w.server - w.harness).max(0.0)
                )
            } else {
                format!(
                    "the machine {:.0}% busy (the run's own CPU not measured in that second)",
                    100.0 * w.busy
                )
            };
            note(&mut found, "CPU", at(w.at_ns), detail);
        }
    }
    for s in samples.iter().filter(|s| s.mem_total_bytes > 0) {
        let avail = s.mem_available_bytes as f64 / s.mem_total_bytes as f64;
        peaks.mem_available = peaks.mem_available.min(avail);
        if avail < 0.10 {
            let detail = format!(
                "{} MiB of {} MiB available",
                s.mem_available_bytes >> 20,
                s.mem_total_bytes >> 20
            );
            note(&mut found, "memory", at(s.at_ns), detail);
        }
    }
    let ramp: Vec<u64> = intervals
        .iter()
        .filter(|(_, iv)| iv.counter("connect.ok") + iv.counters_under("connect.error.") > 0)
        .map(|(start, _)| *start)
        .collect();
    for (start, iv) in intervals {
        let end = at(start + iv.length_ns);
        let lag = iv.stats("connect.lag").max;
        peaks.lag_us = peaks.lag_us.max(lag);
        if lag >= 1_000_000 {
            let detail = format!(
                "connections started up to {:.2} s behind schedule",
                lag as f64 / 1e6
            );
            note(&mut found, "harness lag", end, detail);
        }
        let p99 = iv.stats("connect").p99;
        peaks.connect_p99_us = peaks.connect_p99_us.max(p99);
        if p99 >= 1_000_000 {
            let detail = format!(
                "connect p99 {:.2} s (TCP connect p99 {:.2} s, upgrade p99 {:.2} s)",
                p99 as f64 / 1e6,
                iv.stats("connect.tcp").p99 as f64 / 1e6,
                iv.stats("connect.upgrade").p99 as f64 / 1e6
            );
            note(&mut found, "connect latency", end, detail);
        }
        // Whole seconds inside the ramp only: its first and last are partial.
        let inside = ramp.len() > 2 && *start > ramp[0] && Some(start) < ramp.last();
        if let Some(rate) = planned_rate.filter(|_| inside) {
            let opened = iv.counter("connect.ok") as f64 / (iv.length_ns as f64 / 1e9);
            if opened < 0.9 * rate {
                let detail = format!("{opened:.0} connections/s against {rate:.0}/s planned");
                note(&mut found, "connect rate", end, detail);
            }
        }
    }
    found.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    (found, peaks)
}

/// One second (or so) of the machine's CPU, as fractions of all its cores.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuWindow {
    /// The end of the window, ns.
    at_ns: u64,
    busy: f64,
    server: f64,
    harness: f64,
}

/// The machine's CPU over windows of at least a second between samples.
fn cpu_windows(samples: &[HostSample]) -> Vec<CpuWindow> {
    let mut out = Vec::new();
    let mut from = 0;
    for (i, s) in samples.iter().enumerate() {
        let a = &samples[from];
        if s.at_ns < a.at_ns + 1_000_000_000 {
            continue;
        }
        let all = s.cpu_all_ns.saturating_sub(a.cpu_all_ns);
        if all > 0 {
            let share = |part: &dyn Fn(&str) -> bool| {
                let used: u64 = s
                    .cpu_ns
                    .iter()
                    .filter(|(l, _)| part(l))
                    .filter_map(|(l, v)| {
                        let before = a.cpu_ns.iter().find(|(k, _)| k == l)?.1;
                        Some(v.saturating_sub(before))
                    })
                    .sum();
                used as f64 / all as f64
            };
            out.push(CpuWindow {
                at_ns: s.at_ns,
                busy: s.cpu_busy_ns.saturating_sub(a.cpu_busy_ns) as f64 / all as f64,
                server: share(&|l| l.contains(label::SERVE)),
                harness: share(&|l| l.contains(label::HOLD) || l.contains(label::BENCH)),
            });
        }
        from = i;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn sample(at_s: u64, busy_s: u64, server_s: u64, harness_s: u64, avail_mib: u64) -> HostSample {
        HostSample {
            at_ns: at_s * SEC,
            cpu_all_ns: 2 * at_s * SEC,
            cpu_busy_ns: busy_s * SEC,
            mem_total_bytes: 1000 << 20,
            mem_available_bytes: avail_mib << 20,
            cpu_ns: vec![
                ("h/serve-0".into(), server_s * SEC),
                ("h/hold-pid7".into(), harness_s * SEC),
            ],
            ..HostSample::default()
        }
    }

    fn interval(second: u64, opened: u64, lag_us: u64, connect_us: u64) -> (u64, Interval) {
        let mut iv = Interval::empty(second * SEC, SEC, "h/hold".into());
        iv.counters.insert("connect.ok".into(), opened);
        for (name, v) in [("connect.lag", lag_us), ("connect", connect_us)] {
            let mut h = throng_report::interval::new_histogram();
            h.record(v.max(1)).unwrap();
            iv.histograms.insert(name.into(), h);
        }
        (second * SEC, iv)
    }

    #[test]
    fn each_limit_at_the_first_second_it_was_reached_in_time_order() {
        // Two cores: seconds 0-10 half busy, 10-12 fully (server 1 core,
        // harness 0.8, others the rest); memory runs low at 12 s.
        let samples = vec![
            sample(0, 0, 0, 0, 900),
            sample(10, 10, 4, 4, 800),
            sample(11, 12, 5, 5, 500),
            sample(12, 14, 6, 5, 50),
        ];
        let intervals: BTreeMap<u64, Interval> = [
            interval(0, 500, 100, 1_000),
            interval(1, 1_000, 100, 1_000),
            interval(2, 700, 300, 1_500_000),
            interval(3, 1_000, 2_000_000, 1_000),
            interval(4, 100, 100, 1_000),
        ]
        .into_iter()
        .collect();
        let (found, peaks) = reached(&intervals, &samples, 0, Some(1_000.0));
        let names: Vec<(&str, f64)> = found.iter().map(|l| (l.name, l.at_s)).collect();
        assert_eq!(
            names,
            [
                ("connect latency", 3.0),
                ("connect rate", 3.0),
                ("harness lag", 4.0),
                ("CPU", 11.0),
                ("memory", 12.0)
            ]
        );
        let cpu = &found[3].detail;
        assert!(
            cpu.contains("100% busy: server 50%, harness 50%, other programs 0%"),
            "{cpu}"
        );
        assert!((peaks.cpu_busy - 1.0).abs() < 1e-9);
        assert!((peaks.mem_available - 0.05).abs() < 1e-9);
        assert!(peaks.lag_us >= 2_000_000);
    }

    #[test]
    fn a_calm_run_reaches_none_and_says_how_close_it_came() {
        let samples = vec![sample(0, 0, 0, 0, 900), sample(2, 2, 1, 1, 850)];
        let intervals: BTreeMap<u64, Interval> = [
            interval(0, 400, 100, 2_000),
            interval(1, 1_000, 5_000, 3_000),
            interval(2, 1_000, 100, 2_000),
            interval(3, 600, 100, 2_000),
        ]
        .into_iter()
        .collect();
        let (found, peaks) = reached(&intervals, &samples, 0, Some(1_000.0));
        assert!(found.is_empty(), "{found:?}");
        assert!((peaks.cpu_busy - 0.5).abs() < 1e-9);
        assert!((peaks.mem_available - 0.85).abs() < 1e-9);
        assert!(peaks.lag_us >= 5_000 && peaks.lag_us < 6_000);
    }
}
