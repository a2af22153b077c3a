//! What an `attack` run did, summed up the way Vegeta's report does, with
//! the generator's own lag beside the latencies; the progress line of each
//! second; the figures the thresholds that fail a run are on (`--threshold`,
//! and the `--max-*` flags that are its aliases).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use throng_host::units::fmt_duration;
use throng_report::events::EventGroup;
use throng_report::interval::Interval;
use throng_report::summary::HistStats;
use throng_report::text::micros;

use super::worker::Done;
use crate::harness::collect::{Totals, event_lines, kinds, peak_rss};
use crate::harness::progress::View;
use crate::threshold::{
    Catalogue, Figure, Figures, Live, Stat, Threshold, ThresholdError, count_over,
};

/// What a run did: the final print and `--format json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Worker processes.
    pub workers: u32,
    /// Requests the schedule planned (rate mode).
    pub planned: Option<u64>,
    /// Requests started.
    pub requests: u64,
    /// Requests started per second, first to last start.
    pub rate: f64,
    /// Successful (2xx/3xx) responses per second, from the start to the last end.
    pub throughput: f64,
    /// Seconds from the first to the last request start.
    pub attack_s: f64,
    /// Seconds from the last start to the last end.
    pub wait_s: f64,
    /// Workers that were ready only after the run's start (a plan slow to
    /// send and parse): each began its schedule when ready and sent for the
    /// whole duration, so the run spans that much longer.
    pub late_workers: u32,
    /// How long after the run's start the latest of them was ready, s
    /// (0: every worker on time).
    pub late_start_s: f64,
    /// Responses that arrived whole.
    pub answered: u64,
    /// 2xx and 3xx responses.
    pub success: u64,
    /// `success / requests`.
    pub success_ratio: f64,
    /// Requests without a success: failures of every kind plus 1xx/4xx/5xx
    /// answers, over requests (0 when none were sent).
    pub error_rate: f64,
    /// Responses by status code.
    pub status: BTreeMap<String, u64>,
    /// Failures by kind (refused, timeout, reset, closed, bad_response, ...).
    pub errors: BTreeMap<String, u64>,
    /// Requests started more than `late_threshold_us` after their intended time.
    pub late: u64,
    /// The lateness that counts a request as late, µs.
    pub late_threshold_us: u64,
    /// Requests sent again because a reused connection had been closed,
    /// or (HTTP/2) the server did not process their stream.
    pub retried: u64,
    /// Connections opened.
    pub connections_opened: u64,
    /// Most requests in flight at any moment: each worker's own peak (tracked
    /// at every change), summed over workers in the busiest interval (exact
    /// with one worker, at most that with several).
    pub peak_in_flight: i64,
    /// Most connections open at any moment, the same way.
    pub peak_connections: i64,
    /// Bytes read.
    pub bytes_in: u64,
    /// Bytes written.
    pub bytes_out: u64,
    /// Intended start → response end, µs, of every request: a timed-out one
    /// at the moment it was given up, a failed one when it failed.
    pub latency_us: HistStats,
    /// The answered requests' latency alone, µs.
    pub answered_latency_us: HistStats,
    /// Of `latency_us`'s requests, those given up at `--timeout`.
    pub latency_timeouts: u64,
    /// Of `latency_us`'s requests, those that failed otherwise.
    pub latency_errors: u64,
    /// Actual start → response end, µs.
    pub service_us: HistStats,
    /// Intended → actual start (the generator's lag), µs.
    pub lag_us: HistStats,
    /// TCP connect of new connections, µs.
    pub connect_tcp_us: HistStats,
    /// TLS handshake of new connections (`https://`), µs.
    pub connect_tls_us: HistStats,
    /// TLS handshakes that were full (not resumed).
    pub tls_full: u64,
    /// TLS handshakes that resumed an earlier session.
    pub tls_resumed: u64,
    /// Peak resident memory per process of the run, bytes.
    pub peak_rss_bytes: BTreeMap<String, u64>,
    /// The run was stopped (Ctrl-C) before its schedule ended.
    pub stopped: bool,
    /// The workers' events, grouped: one for the same thing said by many workers.
    pub events: Vec<EventGroup>,
    /// When the schedule started, ns since the epoch.
    pub start_unix_ns: u64,
    /// Why `--abort-on-fail` stopped the run: the threshold that could no
    /// longer pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
    /// The start lines' section on this machine's limits (`throng doctor
    /// --role client`'s checks of the plan): how many, and each to watch.
    pub limits: Vec<String>,
}

impl Summary {
    /// Sums up the run from its totals and what each worker said at its
    /// end. `start_ns`: when the open model's schedule started (a closed
    /// pool counts from its first request).
    pub(super) fn finish(
        &mut self,
        totals: Totals,
        dones: &[Option<Done>],
        start_ns: u64,
        open_model: bool,
    ) {
        let s = self;
        let total = &totals.total;
        s.peak_rss_bytes = totals.peak_rss_bytes;
        s.events = totals.events;
        s.start_unix_ns = start_ns;
        let c = &total.counters;
        s.requests = total.counter("requests.sent");
        s.late = total.counter("requests.late");
        s.retried = total.counter("requests.retried");
        s.connections_opened = total.counter("connections.opened");
        s.bytes_in = total.counter("bytes.in");
        s.bytes_out = total.counter("bytes.out");
        for (k, v) in c {
            if let Some(code) = k.strip_prefix("status.") {
                s.status.insert(code.to_owned(), *v);
                s.answered += v;
                if code.starts_with('2') || code.starts_with('3') {
                    s.success += v;
                }
            } else if let Some(kind) = k.strip_prefix("requests.error.") {
                s.errors.insert(kind.to_owned(), *v);
            }
        }
        s.latency_us = total.every_request_stats();
        s.answered_latency_us = total.stats("latency");
        s.latency_timeouts = total.stats("latency.timeout").count;
        s.latency_errors = total.stats("latency.error").count;
        s.service_us = total.stats("service");
        s.lag_us = total.stats("lag");
        s.connect_tcp_us = total.stats("connect.tcp");
        s.connect_tls_us = total.stats("connect.tls");
        s.tls_full = total.counter("tls.handshakes.full");
        s.tls_resumed = total.counter("tls.handshakes.resumed");
        if s.requests > 0 {
            s.success_ratio = s.success as f64 / s.requests as f64;
            s.error_rate = 1.0 - s.success_ratio;
        }
        let dones: Vec<Done> = dones.iter().flatten().copied().collect();
        s.stopped |= dones.iter().any(|d| d.stopped);
        s.late_workers = dones.iter().filter(|d| d.late_ns > 0).count() as u32;
        s.late_start_s = dones.iter().map(|d| d.late_ns).max().unwrap_or(0) as f64 / 1e9;
        // A worker ready late started its schedule then.
        let start_ns = dones
            .iter()
            .map(|d| d.start_ns)
            .filter(|&n| n > 0)
            .min()
            .unwrap_or(start_ns);
        let first = dones
            .iter()
            .map(|d| d.first_sent_ns)
            .filter(|&n| n > 0)
            .min();
        let last_sent = dones.iter().map(|d| d.last_sent_ns).max().unwrap_or(0);
        let last_done = dones.iter().map(|d| d.last_done_ns).max().unwrap_or(0);
        // The open model's schedule starts at `start_ns`; a closed pool at its first send.
        let from = if open_model { Some(start_ns) } else { first };
        if let Some(from) = from {
            let attack = last_sent.saturating_sub(from) as f64 / 1e9;
            s.attack_s = attack;
            s.wait_s = last_done.saturating_sub(last_sent) as f64 / 1e9;
            if attack > 0.0 && s.requests > 1 {
                // n starts span n - 1 gaps.
                s.rate = (s.requests - 1) as f64 / attack;
            }
            let until_done = last_done.saturating_sub(from) as f64 / 1e9;
            if until_done > 0.0 {
                s.throughput = s.success as f64 / until_done;
            }
        }
    }
}

/// The figures an `attack` threshold may name (`--threshold`).
pub const FIGURES: Catalogue = Catalogue {
    command: "attack",
    latencies: &["latency", "service", "lag", "connect", "tls"],
    ratios: &["error_rate", "success_ratio"],
    rates: &["rate", "throughput"],
    counts: &["requests", "errors", "timeouts", "late", "retried"],
};

impl Figures for Summary {
    fn value(&self, figure: &Figure) -> Option<f64> {
        let stats = |h: &HistStats, stat: Stat| (h.count > 0).then(|| stat.of(h));
        let sent = self.requests > 0;
        match figure {
            Figure::Latency { of, stat } => stats(
                match *of {
                    "service" => &self.service_us,
                    "lag" => &self.lag_us,
                    "connect" => &self.connect_tcp_us,
                    "tls" => &self.connect_tls_us,
                    _ => &self.latency_us,
                },
                *stat,
            ),
            Figure::Ratio("success_ratio") => sent.then_some(self.success_ratio),
            Figure::Ratio(_) => sent.then_some(self.error_rate),
            Figure::Rate("throughput") => Some(self.throughput),
            Figure::Rate(_) => Some(self.rate),
            Figure::Count(c) => Some(match *c {
                "requests" => self.requests,
                "timeouts" => self.errors.get("timeout").copied().unwrap_or(0),
                "late" => self.late,
                "retried" => self.retried,
                _ => self.errors.values().sum(),
            } as f64),
        }
    }
}

/// A running attack's totals, for `--abort-on-fail`.
pub(super) struct Running<'a> {
    /// Everything counted so far.
    pub(super) totals: &'a Interval,
    /// Requests the schedule plans (rate mode).
    pub(super) planned: Option<u64>,
}

impl Live for Running<'_> {
    fn planned(&self) -> Option<u64> {
        self.planned
    }

    fn count(&self, name: &str) -> Option<u64> {
        let t = self.totals;
        Some(match name {
            "requests" => t.counter("requests.sent"),
            "timeouts" => t.counter("requests.error.timeout"),
            "late" => t.counter("requests.late"),
            "retried" => t.counter("requests.retried"),
            _ => counters_under(t, "requests.error."),
        })
    }

    fn at_least(&self, of: &str, bound_us: f64, inclusive: bool) -> Option<u64> {
        let names: &[&str] = match of {
            "service" => &["service"],
            "lag" => &["lag"],
            "connect" => &["connect.tcp"],
            "tls" => &["connect.tls"],
            _ => &["latency", "latency.timeout", "latency.error"],
        };
        Some(
            names
                .iter()
                .filter_map(|n| self.totals.histograms.get(*n))
                .map(|h| count_over(h, bound_us, inclusive))
                .sum(),
        )
    }

    fn failures(&self) -> Option<u64> {
        let unsuccessful: u64 = self
            .totals
            .counters
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("status.").map(|code| (code, v)))
            .filter(|(code, _)| !(code.starts_with('2') || code.starts_with('3')))
            .map(|(_, v)| v)
            .sum();
        Some(unsuccessful + counters_under(self.totals, "requests.error."))
    }
}

fn counters_under(iv: &Interval, prefix: &str) -> u64 {
    iv.counters
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

/// The thresholds of `--threshold` and the `--max-*` flags, which are
/// aliases: `--max-error-rate R` is `error_rate<=R`, `--max-p99 D` is
/// `p99<=D`, `--max-lag D` is `lag_max<=D`.
pub fn thresholds(
    given: &[Threshold],
    max_error_rate: Option<f64>,
    max_p99: Option<Duration>,
    max_lag: Option<Duration>,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut out = Vec::new();
    if let Some(r) = max_error_rate {
        out.push(
            Threshold::parse(&format!("error_rate<={r}"), &FIGURES)?.alias("--max-error-rate"),
        );
    }
    if let Some(d) = max_p99 {
        out.push(
            Threshold::parse(&format!("p99<={}", fmt_duration(d)), &FIGURES)?.alias("--max-p99"),
        );
    }
    if let Some(d) = max_lag {
        out.push(
            Threshold::parse(&format!("lag_max<={}", fmt_duration(d)), &FIGURES)?
                .alias("--max-lag"),
        );
    }
    out.extend(given.iter().cloned());
    Ok(out)
}

/// The progress line of one interval; `sent` requests so far of `planned`.
pub(super) fn progress_line(view: &View<'_>, planned: Option<u64>) -> String {
    let iv = view.merged;
    let of = planned.map_or(String::new(), |p| format!("/{p}"));
    let mut s = format!(
        "[{:>6.1}s] sent {}{of}  +{}/s  answered {}/s  err {}  in flight {}",
        view.elapsed_s(),
        view.totals.counter("requests.sent"),
        iv.counter("requests.sent"),
        iv.counters_under("status."),
        view.totals.counters_under("requests.error."),
        iv.gauge("requests.in_flight")
    );
    let l = iv.every_request_stats();
    if l.count > 0 {
        s.push_str(&format!(
            "  latency p50 {} p99 {}",
            micros(l.p50),
            micros(l.p99)
        ));
    }
    let lag = iv.stats("lag").max;
    if lag >= 1000 {
        s.push_str(&format!("  lag max {}", micros(lag)));
    }
    if iv.counter("requests.late") > 0 {
        s.push_str(&format!("  late {}", iv.counter("requests.late")));
    }
    s.push_str(&view.late_note());
    s
}

/// What the latencies include beside answers: every request counts.
fn unanswered(s: &Summary) -> String {
    if s.latency_timeouts + s.latency_errors == 0 {
        return String::new();
    }
    format!(
        "\n              every request: {} of {} timed out (counted at their timeout), {} failed (at the time they failed); answered alone: {}",
        s.latency_timeouts,
        s.latency_us.count,
        s.latency_errors,
        if s.answered_latency_us.count == 0 {
            "no answers".to_owned()
        } else {
            format!(
                "p50 {}, p99 {}",
                micros(s.answered_latency_us.p50),
                micros(s.answered_latency_us.p99)
            )
        }
    )
}

/// The final human summary, laid out like Vegeta's report.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let lat = |l: &HistStats| {
        if l.count == 0 {
            return "no answers".to_owned();
        }
        format!(
            "{}, {}, {}, {}, {}, {}, {}",
            micros(l.min),
            micros(l.mean as u64),
            micros(l.p50),
            micros(l.p90),
            micros(l.p99),
            micros(l.p999),
            micros(l.max)
        )
    };
    let planned = s
        .planned
        .map_or(String::new(), |p| format!(" (planned {p})"));
    out.push_str(&format!(
        "Requests      [total, rate, throughput]         {}{planned}, {:.2}/s, {:.2}/s\n",
        s.requests, s.rate, s.throughput
    ));
    out.push_str(&format!(
        "Duration      [total, attack, wait]             {:.3}s, {:.3}s, {:.3}s\n",
        s.attack_s + s.wait_s,
        s.attack_s,
        s.wait_s
    ));
    out.push_str(&format!(
        "Latencies     [min, mean, 50, 90, 99, 99.9, max]  {}   (from the intended start){}\n",
        lat(&s.latency_us),
        unanswered(s)
    ));
    out.push_str(&format!(
        "Service       [min, mean, 50, 90, 99, 99.9, max]  {}   (from the actual send)\n",
        lat(&s.service_us)
    ));
    out.push_str(&format!(
        "Lag           [mean, 99, max, late]             {}, {}, {}, {} late (> {})\n",
        micros(s.lag_us.mean as u64),
        micros(s.lag_us.p99),
        micros(s.lag_us.max),
        s.late,
        micros(s.late_threshold_us)
    ));
    let mean = |n: u64| {
        if s.requests > 0 {
            n as f64 / s.requests as f64
        } else {
            0.0
        }
    };
    out.push_str(&format!(
        "Bytes In      [total, mean]                     {}, {:.2}\n",
        s.bytes_in,
        mean(s.bytes_in)
    ));
    out.push_str(&format!(
        "Bytes Out     [total, mean]                     {}, {:.2}\n",
        s.bytes_out,
        mean(s.bytes_out)
    ));
    out.push_str(&format!(
        "Connections   [opened, peak open, peak in flight] {}, {}, {}{}\n",
        s.connections_opened,
        s.peak_connections,
        s.peak_in_flight,
        if s.retried > 0 {
            format!(
                ", {} retried (a stale connection, or an HTTP/2 stream the server did not process)",
                s.retried
            )
        } else {
            String::new()
        }
    ));
    if s.connect_tcp_us.count > 0 {
        out.push_str(&format!(
            "TCP Connect   [min, mean, 50, 90, 99, 99.9, max]  {}\n",
            lat(&s.connect_tcp_us)
        ));
    }
    if s.connect_tls_us.count > 0 {
        out.push_str(&format!(
            "TLS Handshake [min, mean, 50, 90, 99, 99.9, max]  {}   ({} full, {} resumed)\n",
            lat(&s.connect_tls_us),
            s.tls_full,
            s.tls_resumed
        ));
    }
    out.push_str(&format!(
        "Success       [ratio]                           {:.2}%\n",
        s.success_ratio * 100.0
    ));
    out.push_str(&format!(
        "Status Codes  [code:count]                      {}\n",
        kinds(&s.status, ":", "  ")
    ));
    if !s.errors.is_empty() {
        out.push_str(&format!(
            "Error Set     [kind:count]                      {}\n",
            kinds(&s.errors, ":", "  ")
        ));
    }
    if !s.peak_rss_bytes.is_empty() {
        out.push_str(&format!("Peak RSS      {}\n", peak_rss(&s.peak_rss_bytes)));
    }
    out.push_str(&late_start(s));
    if !s.events.is_empty() {
        out.push_str("Events\n");
        out.push_str(&event_lines(&s.events, s.start_unix_ns));
    }
    if s.stopped {
        out.push_str("Stopped before the schedule ended.\n");
    }
    out
}

/// The line on workers ready after the run's start, if any were.
fn late_start(s: &Summary) -> String {
    if s.late_workers == 0 {
        return String::new();
    }
    format!(
        "Late start    [workers, up to]                  {}, {:.3}s (ready after the run's start: each sent for its whole duration from then)\n",
        s.late_workers, s.late_start_s
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_and_their_aliases() {
        let mut s = Summary {
            requests: 100,
            success: 97,
            error_rate: 0.03,
            success_ratio: 0.97,
            ..Summary::default()
        };
        s.latency_us = HistStats {
            count: 100,
            p99: 250_000,
            ..HistStats::default()
        };
        s.lag_us = HistStats {
            count: 100,
            max: 784_000,
            ..HistStats::default()
        };
        s.errors.insert("timeout".into(), 3);
        let ms = Duration::from_millis;
        let check = |t: &[Threshold]| crate::threshold::check_all(t, &s);
        let all = thresholds(&[], Some(0.05), Some(ms(300)), Some(ms(1000))).unwrap();
        assert!(check(&all).is_empty());
        assert_eq!(
            check(&thresholds(&[], Some(0.01), None, None).unwrap()).len(),
            1
        );
        assert_eq!(
            check(&thresholds(&[], None, Some(ms(200)), None).unwrap()).len(),
            1
        );
        let lag = check(&thresholds(&[], None, None, Some(ms(500))).unwrap());
        assert_eq!(lag, ["lag_max<=500ms (--max-lag): lag_max was 784ms"]);
        let mine = Threshold::parse("timeouts==0", &FIGURES).unwrap();
        assert_eq!(check(&[mine]), ["timeouts==0: timeouts was 3"]);
        let unmeasured = Summary {
            latency_us: HistStats::default(),
            ..s.clone()
        };
        let p99 = crate::threshold::check_all(
            &thresholds(&[], None, Some(ms(200)), None).unwrap(),
            &unmeasured,
        );
        assert_eq!(
            p99,
            ["p99<=200ms (--max-p99): p99 is unknown (nothing measured)"]
        );
    }
}
