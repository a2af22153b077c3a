//! What a bench measures beside `hold`'s figures: memory per connection on
//! each side and in the kernel, as deltas between the idle baseline and
//! the plateau with every connection open; CPU per side; delivery per
//! message.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;
use throng_host::sample::HostSample;
use throng_report::interval::HistStats;
use throng_report::interval::{Interval, new_histogram};

use super::monitor::label;
use crate::hold::recorder::MessageTally;

fn sum_rss(s: &HostSample, part: &str) -> u64 {
    s.rss_bytes
        .iter()
        .filter(|(l, _)| l.contains(part))
        .map(|(_, v)| v)
        .sum()
}

/// Memory per connection, measured as deltas between the idle server (and
/// each harness worker before its first connection) and the moment every
/// connection was still open.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Memory {
    /// Connections the deltas are divided by.
    pub connections: u64,
    /// Server RSS (supervisor + workers) before the first connection, bytes.
    pub server_before: u64,
    /// Server RSS with every connection open, bytes.
    pub server_loaded: u64,
    /// Harness worker RSS before their first connection (the last sample before any opened), bytes.
    pub harness_before: u64,
    /// Harness worker RSS with every connection open, bytes.
    pub harness_loaded: u64,
    /// `/proc/meminfo` Slab before and loaded, bytes.
    pub slab_before: u64,
    /// See `slab_before`.
    pub slab_loaded: u64,
    /// `/proc/net/sockstat` TCP mem before and loaded, bytes.
    pub tcp_mem_before: u64,
    /// See `tcp_mem_before`.
    pub tcp_mem_loaded: u64,
    /// TCP sockets in use before and loaded (both ends of every connection are here).
    pub tcp_inuse_before: u64,
    /// See `tcp_inuse_before`.
    pub tcp_inuse_loaded: u64,
    /// Server user space per connection, bytes.
    pub server_per_connection: f64,
    /// Harness user space per connection, bytes.
    pub harness_per_connection: f64,
    /// Kernel (slab + TCP buffers) per connection, both sockets of it, bytes.
    pub kernel_per_connection: f64,
    /// When the loaded sample was taken, ns since the epoch.
    pub loaded_at_ns: u64,
}

/// CPU used, seconds (user + system).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cpu {
    /// Server supervisor and workers, from before the first connection to the end.
    pub server_s: f64,
    /// Harness workers and the bench process (supervisor, publisher).
    pub harness_s: f64,
}

/// Memory and CPU from the monitor's samples. `before_ns`: when the harness
/// started (the last sample before it is the idle baseline); `held`:
/// connections open at the plateau.
pub fn costs(samples: &[HostSample], before_ns: u64, held: u64) -> (Memory, Cpu) {
    let mut m = Memory {
        connections: held,
        ..Memory::default()
    };
    let mut cpu = Cpu::default();
    let Some(base) = samples.iter().rev().find(|s| s.at_ns <= before_ns) else {
        return (m, cpu);
    };
    let max_inuse = samples.iter().map(|s| s.tcp_inuse).max().unwrap_or(0);
    let grown = max_inuse.saturating_sub(base.tcp_inuse);
    let Some(loaded) = samples
        .iter()
        .rev()
        .find(|s| s.at_ns > before_ns && s.tcp_inuse >= max_inuse - grown / 100)
    else {
        return (m, cpu);
    };
    m.server_before = sum_rss(base, label::SERVE);
    m.server_loaded = sum_rss(loaded, label::SERVE);
    // Each harness worker's RSS in the last sample before the connections
    // began (its runtime up, the schedule not yet started); a worker first
    // seen later falls back to its smallest RSS.
    let mut least: BTreeMap<&str, u64> = BTreeMap::new();
    let mut idle: BTreeMap<&str, u64> = BTreeMap::new();
    for s in samples {
        let quiet = s.tcp_inuse <= base.tcp_inuse + grown / 100;
        for (l, v) in &s.rss_bytes {
            if l.contains(label::HOLD) {
                let e = least.entry(l.as_str()).or_insert(u64::MAX);
                *e = (*e).min(*v);
                if quiet && s.at_ns < loaded.at_ns {
                    idle.insert(l.as_str(), *v);
                }
            }
        }
    }
    for (l, v) in idle {
        least.insert(l, v);
    }
    for (l, v) in &loaded.rss_bytes {
        if l.contains(label::HOLD) {
            m.harness_loaded += v;
            m.harness_before += least.get(l.as_str()).copied().unwrap_or(*v);
        }
    }
    m.slab_before = base.mem_slab_bytes;
    m.slab_loaded = loaded.mem_slab_bytes;
    m.tcp_mem_before = base.tcp_mem_bytes;
    m.tcp_mem_loaded = loaded.tcp_mem_bytes;
    m.tcp_inuse_before = base.tcp_inuse;
    m.tcp_inuse_loaded = loaded.tcp_inuse;
    m.loaded_at_ns = loaded.at_ns;
    if held > 0 {
        let n = held as f64;
        let d = |a: u64, b: u64| a as f64 - b as f64;
        m.server_per_connection = d(m.server_loaded, m.server_before) / n;
        m.harness_per_connection = d(m.harness_loaded, m.harness_before) / n;
        // TCP buffers that shrank were other programs' (idle sockets hold none).
        m.kernel_per_connection =
            (d(m.slab_loaded, m.slab_before) + d(m.tcp_mem_loaded, m.tcp_mem_before).max(0.0)) / n;
    }
    // CPU: each process's last figure minus its figure in the baseline.
    let mut first: BTreeMap<&str, u64> = BTreeMap::new();
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for (l, v) in &base.cpu_ns {
        first.insert(l.as_str(), *v);
    }
    for s in samples.iter().filter(|s| s.at_ns >= base.at_ns) {
        for (l, v) in &s.cpu_ns {
            last.insert(l.as_str(), *v);
        }
    }
    for (l, v) in last {
        let used = v.saturating_sub(first.get(l).copied().unwrap_or(0)) as f64 / 1e9;
        if l.contains(label::SERVE) {
            cpu.server_s += used;
        } else {
            cpu.harness_s += used;
        }
    }
    (m, cpu)
}

/// CPU per delivery while the messages went out: each side's CPU from the
/// first publish to the last delivery, over the deliveries; and the same
/// with what each side spends holding its connections idle (pings, timers)
/// taken out, measured in the seconds between fan-outs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DeliveryCpu {
    /// Deliveries in the window.
    pub deliveries: u64,
    /// Seconds from the interval of the first publish to the end of the last delivery's.
    pub window_s: f64,
    /// Server CPU per delivery (its processes' user + system), ns.
    pub server_ns: f64,
    /// Harness CPU per delivery (workers and the bench process), ns.
    pub harness_ns: f64,
    /// Seconds of the window with no publish and no delivery, the first and
    /// last of each such stretch left out (a fan-out's edges): where the
    /// idle cost is measured. `None` when fan-outs left no such second.
    pub idle_s: Option<f64>,
    /// The server's CPU in those seconds, in cores (0.03: 3% of one).
    pub server_idle_cores: Option<f64>,
    /// The harness's, in cores.
    pub harness_idle_cores: Option<f64>,
    /// Server CPU per delivery above its idle cost: the window's CPU less
    /// the idle rate over every second without a fan-out, ns. What a
    /// fan-out costs, against `fanout_floor`'s writers.
    pub server_fanout_ns: Option<f64>,
    /// The harness's, ns.
    pub harness_fanout_ns: Option<f64>,
}

/// [`DeliveryCpu`] from the monitor's samples and the run's intervals.
pub fn delivery_cpu(samples: &[HostSample], intervals: &BTreeMap<u64, Interval>) -> DeliveryCpu {
    let from = intervals
        .iter()
        .find(|(_, iv)| iv.counter("publish.sent") > 0)
        .map(|(start, _)| *start);
    let Some(from) = from else {
        return DeliveryCpu::default();
    };
    let to = intervals
        .range(from..)
        .rev()
        .find(|(_, iv)| iv.counter("messages.received") > 0)
        .map(|(start, iv)| start + iv.length_ns)
        .unwrap_or(from);
    let deliveries: u64 = intervals
        .range(from..to)
        .map(|(_, iv)| iv.counter("messages.received"))
        .sum();
    // Each side's CPU between the samples nearest `t0` and `t1`, ns.
    let used = |t0: u64, t1: u64, part: &str, extra: &str| -> Option<u64> {
        let (a, b) = (nearest(samples, t0)?, nearest(samples, t1)?);
        Some(cpu_between(a, b, |l| {
            l.contains(part) || (!extra.is_empty() && l.contains(extra))
        }))
    };
    let server = |t0, t1| used(t0, t1, label::SERVE, "");
    let harness = |t0, t1| used(t0, t1, label::HOLD, label::BENCH);
    let (Some(server_all), Some(harness_all)) = (server(from, to), harness(from, to)) else {
        return DeliveryCpu::default();
    };
    let per = |ns: f64| {
        if deliveries == 0 {
            0.0
        } else {
            ns / deliveries as f64
        }
    };
    let window_ns = to.saturating_sub(from);
    let idle = idle_stretches(intervals, from, to);
    let idle_ns: u64 = idle.iter().map(|(a, b)| b - a).sum();
    let mut d = DeliveryCpu {
        deliveries,
        window_s: window_ns as f64 / 1e9,
        server_ns: per(server_all as f64),
        harness_ns: per(harness_all as f64),
        ..DeliveryCpu::default()
    };
    if idle_ns == 0 {
        return d;
    }
    let idle_cpu = |side: &dyn Fn(u64, u64) -> Option<u64>| -> f64 {
        idle.iter().filter_map(|&(a, b)| side(a, b)).sum::<u64>() as f64
    };
    // Cores: CPU ns per wall ns.
    let server_rate = idle_cpu(&server) / idle_ns as f64;
    let harness_rate = idle_cpu(&harness) / idle_ns as f64;
    // Every second of the window that is not a fan-out's, edges included,
    // is charged at the idle rate; the rest is the fan-outs'.
    let quiet_ns = quiet_ns(intervals, from, to) as f64;
    d.idle_s = Some(idle_ns as f64 / 1e9);
    d.server_idle_cores = Some(server_rate);
    d.harness_idle_cores = Some(harness_rate);
    d.server_fanout_ns = Some(per((server_all as f64 - server_rate * quiet_ns).max(0.0)));
    d.harness_fanout_ns = Some(per((harness_all as f64 - harness_rate * quiet_ns).max(0.0)));
    d
}

/// CPU per connection opened while the connections were being opened (the
/// ramp: from the first interval with a connect to the last), each side's
/// processes' user + system time over the connections opened in it, and
/// the rate the machine's cores would allow at these costs: the connect
/// path's ceiling here.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ConnectCpu {
    /// Connections opened in the window.
    pub opened: u64,
    /// Seconds from the first interval with a connect to the end of the last.
    pub window_s: f64,
    /// Server CPU per connection opened (accept, upgrade, registration), ns.
    pub server_ns: f64,
    /// Harness CPU per connection opened (connect, upgrade, registration; the bench process too), ns.
    pub harness_ns: f64,
    /// The machine's cores over both sides' CPU per connection: connects a
    /// second when both sides have every core and nothing else runs.
    pub ceiling_per_s: f64,
}

/// [`ConnectCpu`] from the monitor's samples and the run's intervals, on a
/// machine of `cores`.
pub fn connect_cpu(
    samples: &[HostSample],
    intervals: &BTreeMap<u64, Interval>,
    cores: f64,
) -> ConnectCpu {
    let opening = |iv: &Interval| iv.counter("connect.ok") > 0;
    let Some(from) = intervals
        .iter()
        .find(|(_, iv)| opening(iv))
        .map(|(t, _)| *t)
    else {
        return ConnectCpu::default();
    };
    let to = intervals
        .range(from..)
        .rev()
        .find(|(_, iv)| opening(iv))
        .map_or(from, |(t, iv)| t + iv.length_ns);
    let opened: u64 = intervals
        .range(from..to)
        .map(|(_, iv)| iv.counter("connect.ok"))
        .sum();
    let (Some(a), Some(b)) = (nearest(samples, from), nearest(samples, to)) else {
        return ConnectCpu::default();
    };
    if opened == 0 || b.at_ns <= a.at_ns {
        return ConnectCpu::default();
    }
    let used = |serve: bool| cpu_between(a, b, |l| l.contains(label::SERVE) == serve);
    let server_ns = used(true) as f64 / opened as f64;
    let harness_ns = used(false) as f64 / opened as f64;
    let both = server_ns + harness_ns;
    ConnectCpu {
        opened,
        window_s: to.saturating_sub(from) as f64 / 1e9,
        server_ns,
        harness_ns,
        ceiling_per_s: if both > 0.0 { cores * 1e9 / both } else { 0.0 },
    }
}

/// The sample taken nearest to `t` (ns since the epoch).
fn nearest(samples: &[HostSample], t: u64) -> Option<&HostSample> {
    samples.iter().min_by_key(|s| s.at_ns.abs_diff(t))
}

/// CPU (ns) the processes whose labels `keep` takes used from sample `a`
/// to sample `b`; a process first seen in `b` counts from 0.
fn cpu_between(a: &HostSample, b: &HostSample, keep: impl Fn(&str) -> bool) -> u64 {
    b.cpu_ns
        .iter()
        .filter(|(l, _)| keep(l))
        .map(|(l, v)| {
            let before = a.cpu_ns.iter().find(|(k, _)| k == l).map_or(0, |x| x.1);
            v.saturating_sub(before)
        })
        .sum()
}

/// Whether interval `iv` saw a publish or a delivery.
fn busy(iv: &Interval) -> bool {
    iv.counter("publish.sent") > 0 || iv.counter("messages.received") > 0
}

/// The stretches of `from..to` without a publish or a delivery, each less
/// its first and last interval (where a fan-out's start or tail may fall
/// between samples), as (start, end) ns.
fn idle_stretches(intervals: &BTreeMap<u64, Interval>, from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut run: Vec<&Interval> = Vec::new();
    let mut flush = |run: &mut Vec<&Interval>| {
        if run.len() >= 3 {
            let first = run[1].start_ns;
            let last = run[run.len() - 2];
            out.push((first, last.start_ns + last.length_ns));
        }
        run.clear();
    };
    for iv in intervals.range(from..to).map(|(_, iv)| iv) {
        if busy(iv) {
            flush(&mut run);
        } else {
            run.push(iv);
        }
    }
    flush(&mut run);
    out
}

/// The nanoseconds of `from..to` outside the intervals with a publish or a
/// delivery (an interval nobody recorded in is quiet too).
fn quiet_ns(intervals: &BTreeMap<u64, Interval>, from: u64, to: u64) -> u64 {
    let busy_ns: u64 = intervals
        .range(from..to)
        .filter(|(_, iv)| busy(iv))
        .map(|(_, iv)| iv.length_ns)
        .sum();
    to.saturating_sub(from).saturating_sub(busy_ns)
}

/// Delivery of one published message to every subscriber.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MessageStats {
    /// 1, 2, ... in publish order.
    pub seq: u64,
    /// Deliveries counted (each worker counts every message apart).
    pub delivered: u64,
    /// Mean latency from publish to arrival, µs.
    pub mean_us: u64,
    /// From publish to the last subscriber, µs.
    pub last_subscriber_us: u64,
    /// Latency from publish to arrival of the deliveries in the intervals
    /// from this message's publish to the next one's, µs: the message's
    /// own when each reaches every subscriber before the next is published.
    pub latency_us: HistStats,
}

/// Per-message delivery: exact counts, means and last subscribers from the
/// workers' `tallies`, and each message's latency histogram by interval:
/// each interval's deliveries belong to the latest message published at or
/// before it (`hold` publishes just after an interval boundary, so this is
/// exact when each message reaches every subscriber before the next one is
/// published).
pub fn per_message(
    intervals: &BTreeMap<u64, Interval>,
    tallies: &BTreeMap<u64, MessageTally>,
) -> Vec<MessageStats> {
    let mut out: Vec<(u64, Histogram<u64>)> = Vec::new();
    let mut seq = 0u64;
    for iv in intervals.values() {
        for _ in 0..iv.counter("publish.sent") {
            seq += 1;
            out.push((seq, new_histogram()));
        }
        if let (Some(h), Some((_, cur))) = (iv.histograms.get("delivery"), out.last_mut()) {
            // Every interval histogram has the shared shape; a foreign one is skipped.
            let _ = cur.add(h);
        }
    }
    out.into_iter()
        .map(|(seq, h)| {
            let latency_us = HistStats::of(&h);
            match tallies.get(&seq) {
                Some(t) => MessageStats {
                    seq,
                    delivered: t.count,
                    mean_us: t.sum_us.checked_div(t.count).unwrap_or(0),
                    last_subscriber_us: t.max_us,
                    latency_us,
                },
                // An older file: by interval only.
                None => MessageStats {
                    seq,
                    delivered: h.len(),
                    mean_us: latency_us.mean as u64,
                    last_subscriber_us: latency_us.max,
                    latency_us,
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: u64, inuse: u64, slab: u64, rss: &[(&str, u64)]) -> HostSample {
        HostSample {
            at_ns: at,
            tcp_inuse: inuse,
            mem_slab_bytes: slab,
            rss_bytes: rss.iter().map(|(l, v)| ((*l).to_owned(), *v)).collect(),
            cpu_ns: rss.iter().map(|(l, v)| ((*l).to_owned(), *v)).collect(),
            ..HostSample::default()
        }
    }

    #[test]
    fn costs_are_deltas_at_the_plateau() {
        let s = vec![
            sample(1, 10, 1000, &[("h/serve-0", 100)]),
            sample(2, 10, 1000, &[("h/serve-0", 100), ("h/hold-pid9", 50)]),
            sample(3, 2010, 5000, &[("h/serve-0", 2100), ("h/hold-pid9", 1050)]),
            sample(4, 2010, 5000, &[("h/serve-0", 3100), ("h/hold-pid9", 2050)]),
            sample(5, 10, 1000, &[("h/serve-0", 3100)]),
        ];
        let (m, cpu) = costs(&s, 1, 1000);
        assert_eq!(m.loaded_at_ns, 4);
        assert!((m.server_per_connection - 3.0).abs() < 1e-9);
        assert!((m.harness_per_connection - 2.0).abs() < 1e-9);
        assert!((m.kernel_per_connection - 4.0).abs() < 1e-9);
        assert!((cpu.server_s - 3000e-9).abs() < 1e-12);
    }

    /// Two fan-outs ten seconds apart, each 50 deliveries in each of two
    /// seconds, the server idling at 3% of a core between them: the idle
    /// cost is measured in the quiet seconds and taken out of the fan-outs'.
    #[test]
    fn the_idle_cost_between_fan_outs_is_taken_out_of_theirs() {
        const S: u64 = 1_000_000_000;
        let mut intervals = BTreeMap::new();
        for i in 0..20u64 {
            let mut iv = Interval::empty(i * S, S, "h/hold-0".into());
            if i == 0 || i == 10 {
                iv.counters.insert("publish.sent".into(), 1);
            }
            if matches!(i, 0 | 1 | 10 | 11) {
                iv.counters.insert("messages.received".into(), 50);
            }
            intervals.insert(i * S, iv);
        }
        // Cumulative CPU at each second: 30 ms a second, 500 ms more in
        // each second with deliveries.
        let mut samples = Vec::new();
        let mut cpu = 0;
        for i in 0..=20u64 {
            samples.push(HostSample {
                at_ns: i * S,
                cpu_ns: vec![("h/serve-0".into(), cpu), ("h/hold-pid9".into(), cpu / 10)],
                ..HostSample::default()
            });
            cpu += 30_000_000
                + if matches!(i, 0 | 1 | 10 | 11) {
                    500_000_000
                } else {
                    0
                };
        }
        let d = delivery_cpu(&samples, &intervals);
        assert_eq!(d.deliveries, 200);
        assert!((d.window_s - 12.0).abs() < 1e-9, "{d:?}");
        // The whole window's CPU: 12 s at 30 ms, 4 s at 500 ms.
        assert!((d.server_ns - 2.36e9 / 200.0).abs() < 1.0, "{d:?}");
        // Seconds 3..=8: the quiet stretch less its first and last second.
        assert_eq!(d.idle_s, Some(6.0));
        assert!((d.server_idle_cores.unwrap() - 0.03).abs() < 1e-9, "{d:?}");
        // Less 8 quiet seconds at 30 ms.
        assert!(
            (d.server_fanout_ns.unwrap() - 2.12e9 / 200.0).abs() < 1.0,
            "{d:?}"
        );
        assert!(
            (d.harness_fanout_ns.unwrap() - 2.12e8 / 200.0).abs() < 1.0,
            "{d:?}"
        );
    }

    /// Fan-outs that follow one another leave no quiet second: no idle
    /// figure, rather than a guess.
    #[test]
    fn back_to_back_fan_outs_have_no_idle_figure() {
        const S: u64 = 1_000_000_000;
        let mut intervals = BTreeMap::new();
        let mut samples = Vec::new();
        for i in 0..4u64 {
            let mut iv = Interval::empty(i * S, S, "h/hold-0".into());
            iv.counters.insert("publish.sent".into(), 1);
            iv.counters.insert("messages.received".into(), 10);
            intervals.insert(i * S, iv);
        }
        for i in 0..=4u64 {
            samples.push(HostSample {
                at_ns: i * S,
                cpu_ns: vec![("h/serve-0".into(), i * 100)],
                ..HostSample::default()
            });
        }
        let d = delivery_cpu(&samples, &intervals);
        assert_eq!(
            (d.deliveries, d.idle_s, d.server_fanout_ns),
            (40, None, None)
        );
        assert!((d.server_ns - 10.0).abs() < 1e-9);
    }

    /// A ramp of 3 seconds opening 10,000 a second after a quiet second:
    /// the CPU of the ramp's seconds over the connections they opened, and
    /// the rate two cores allow at that cost; a run that opened nothing has
    /// no figure.
    #[test]
    fn connect_cpu_is_the_ramps_cpu_over_its_connections() {
        const S: u64 = 1_000_000_000;
        let mut intervals = BTreeMap::new();
        for i in 0..6u64 {
            let mut iv = Interval::empty(i * S, S, "h/hold-0".into());
            if (1..=3).contains(&i) {
                iv.counters.insert("connect.ok".into(), 10_000);
            }
            intervals.insert(i * S, iv);
        }
        // 0.3 s of server and 0.4 s of harness CPU in each ramp second, a
        // little outside it.
        let mut samples = Vec::new();
        let (mut serve, mut hold) = (0u64, 0u64);
        for i in 0..=6u64 {
            samples.push(HostSample {
                at_ns: i * S,
                cpu_ns: vec![
                    ("h/serve-0".into(), serve),
                    ("h/hold-pid9".into(), hold),
                    ("h/bench".into(), 0),
                ],
                ..HostSample::default()
            });
            let ramp = (1..=3).contains(&i);
            serve += if ramp { 300_000_000 } else { 5_000_000 };
            hold += if ramp { 400_000_000 } else { 5_000_000 };
        }
        let c = connect_cpu(&samples, &intervals, 2.0);
        assert_eq!(c.opened, 30_000);
        assert!((c.window_s - 3.0).abs() < 1e-9, "{c:?}");
        assert!((c.server_ns - 30_000.0).abs() < 1e-6, "{c:?}");
        assert!((c.harness_ns - 40_000.0).abs() < 1e-6, "{c:?}");
        assert!((c.ceiling_per_s - 2e9 / 70_000.0).abs() < 1e-6, "{c:?}");
        let none = connect_cpu(&samples, &BTreeMap::new(), 2.0);
        assert_eq!((none.opened, none.ceiling_per_s), (0, 0.0));
    }
}
