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
/// first publish to the last delivery, over the deliveries.
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
    let near = |t: u64| samples.iter().min_by_key(|s| s.at_ns.abs_diff(t));
    let (Some(a), Some(b)) = (near(from), near(to)) else {
        return DeliveryCpu::default();
    };
    let used = |part: &str, extra: &str| -> u64 {
        b.cpu_ns
            .iter()
            .filter(|(l, _)| l.contains(part) || (!extra.is_empty() && l.contains(extra)))
            .map(|(l, v)| {
                let before = a.cpu_ns.iter().find(|(k, _)| k == l).map_or(0, |x| x.1);
                v.saturating_sub(before)
            })
            .sum()
    };
    let per = |ns: u64| {
        if deliveries == 0 {
            0.0
        } else {
            ns as f64 / deliveries as f64
        }
    };
    DeliveryCpu {
        deliveries,
        window_s: to.saturating_sub(from) as f64 / 1e9,
        server_ns: per(used(label::SERVE, "")),
        harness_ns: per(used(label::HOLD, label::BENCH)),
    }
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
}
