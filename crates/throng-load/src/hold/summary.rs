//! What a `hold` run did: the summary printed at the end (and as JSON),
//! and the progress line of each second.

use std::collections::BTreeMap;

use serde::Serialize;
use throng_report::events::EventGroup;
use throng_report::fanout::SpreadStats;
use throng_report::interval::Interval;
use throng_report::summary::HistStats;
use throng_report::text::{micros, server_spread};

use crate::harness::collect::{Totals, event_lines, kinds, latency_line, peak_rss};
use crate::harness::progress::View;

/// What a run did, for the final print and `--json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Connections asked for.
    pub target: u64,
    /// Worker processes.
    pub workers: u32,
    /// Handshakes completed.
    pub opened: u64,
    /// The most connections open at an interval's end.
    pub peak_open: i64,
    /// Failed attempts by kind.
    pub failed: BTreeMap<String, u64>,
    /// Ended connections by how (`server.1008`, `eof`, `clean`, ...).
    pub closed: BTreeMap<String, u64>,
    /// Connections opened per second, from the schedule's start until every
    /// worker had opened (or failed) its whole share.
    pub connect_rate: f64,
    /// Seconds from the schedule's start until every connection was open or failed.
    pub ramp_s: f64,
    /// Connect latency from the intended start (TCP + upgrade), µs.
    pub connect_us: HistStats,
    /// Connect latency from the actual start, µs.
    pub connect_service_us: HistStats,
    /// How late connections were started against the schedule, µs.
    pub connect_lag_us: HistStats,
    /// TCP connect alone, µs.
    pub connect_tcp_us: HistStats,
    /// The TLS handshake alone (`wss://`), µs.
    pub connect_tls_us: HistStats,
    /// The WebSocket upgrade alone, µs.
    pub connect_upgrade_us: HistStats,
    /// TLS handshakes that were full (not resumed).
    pub tls_full: u64,
    /// TLS handshakes that resumed an earlier session.
    pub tls_resumed: u64,
    /// Messages published: sent whole and not refused (an answer that came
    /// late or not at all still counts, in `publish_unanswered`).
    pub published: u64,
    /// Publish calls answered 2xx.
    pub publish_answered: u64,
    /// Published messages whose answer did not come (`timeout`, `io`), by why.
    pub publish_unanswered: BTreeMap<String, u64>,
    /// Messages not published: never sent (`connect`, ...), or refused
    /// (`status`, `protocol`), by why.
    pub publish_errors: BTreeMap<String, u64>,
    /// Time to each answer that came, µs.
    pub publish_us: HistStats,
    /// Deliveries expected: every message published to every connection
    /// held (the peak open).
    pub expected: u64,
    /// Messages received over all subscribers.
    pub received: u64,
    /// Messages lost (sequence gaps, and the tail missing at the end).
    pub lost: u64,
    /// Messages received twice.
    pub duplicated: u64,
    /// Publishing clients, when more than one (`--publishers`): `lost` is
    /// then net of messages that arrived after another client's later one.
    #[serde(skip_serializing_if = "is_one_or_less")]
    pub publishers: u32,
    /// Messages received after a later one.
    pub out_of_order: u64,
    /// Data messages that were not ours (nor timed by `--stamp`).
    pub foreign: u64,
    /// Messages the server made, timed by their own stamp (`--stamp`).
    pub pushed: u64,
    /// Their delivery latency (their stamp to arrival), µs.
    pub pushed_delivery_us: HistStats,
    /// Bytes received on held connections.
    pub bytes_in: u64,
    /// Delivery latency (publish start to arrival), µs.
    pub delivery_us: HistStats,
    /// The largest RSS seen per process, bytes.
    pub peak_rss_bytes: BTreeMap<String, u64>,
    /// CPU time used per process, ns.
    pub cpu_ns: BTreeMap<String, u64>,
    /// Seconds from the schedule's start to the end.
    pub elapsed_s: f64,
    /// When the schedule started (connection 0 was due), ns since the epoch.
    pub start_unix_ns: u64,
    /// The workers' events, grouped: one for the same thing said by many workers.
    pub events: Vec<EventGroup>,
    /// Stopped by Ctrl-C (or a signal) before its end.
    pub stopped: bool,
    /// Why `--abort-on-fail` stopped the run: the threshold that could no
    /// longer pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
    /// The fan-out spread of the messages the server made (`--stamp`):
    /// first to last subscriber, per message, over every worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_spread: Option<SpreadStats>,
    /// What the persistent-session clients did (`--mqtt-sessions`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<super::sessions::SessionSummary>,
    /// The start lines' section on this machine's limits (doctor's
    /// checks): how many were checked, and each to watch.
    pub limits: Vec<String>,
    /// Workers ready only after the run's start (each started its schedule
    /// then, and opened its whole share from there).
    pub late_workers: u32,
    /// How long after the run's start the latest of them was ready, s.
    pub late_start_s: f64,
}

impl Summary {
    /// The counts and latencies of the whole run, from its totals.
    pub(super) fn of(totals: Totals) -> Self {
        let t = &totals.total;
        let mut s = Self {
            opened: t.counter("connect.ok"),
            published: t.counter("publish.sent"),
            publish_answered: t.counter("publish.ok"),
            received: t.counter("messages.received"),
            lost: t.counter("messages.lost"),
            duplicated: t.counter("messages.duplicated"),
            out_of_order: t.counter("messages.out_of_order"),
            foreign: t.counter("messages.foreign"),
            pushed: t.counter("messages.pushed"),
            pushed_delivery_us: t.stats("delivery.pushed"),
            bytes_in: t.counter("bytes.in"),
            tls_full: t.counter("tls.handshakes.full"),
            tls_resumed: t.counter("tls.handshakes.resumed"),
            connect_us: t.stats("connect"),
            connect_service_us: t.stats("connect.service"),
            connect_lag_us: t.stats("connect.lag"),
            connect_tcp_us: t.stats("connect.tcp"),
            connect_tls_us: t.stats("connect.tls"),
            connect_upgrade_us: t.stats("connect.upgrade"),
            publish_us: t.stats("publish"),
            delivery_us: t.stats("delivery"),
            peak_rss_bytes: totals.peak_rss_bytes,
            events: totals.events,
            cpu_ns: totals
                .last_host
                .map(|h| h.cpu_ns.into_iter().collect())
                .unwrap_or_default(),
            ..Self::default()
        };
        for (k, v) in &t.counters {
            if let Some(kind) = k.strip_prefix("connect.error.") {
                s.failed.insert(kind.to_owned(), *v);
            } else if let Some(how) = k.strip_prefix("closed.") {
                s.closed.insert(how.to_owned(), *v);
            } else if let Some(kind) = k.strip_prefix("publish.error.") {
                s.publish_errors.insert(kind.to_owned(), *v);
            } else if let Some(kind) = k.strip_prefix("publish.unanswered.") {
                s.publish_unanswered.insert(kind.to_owned(), *v);
            } else if let Some(kind) = k.strip_prefix("publish.refused.") {
                *s.publish_errors.entry(kind.to_owned()).or_insert(0) += *v;
                s.published = s.published.saturating_sub(*v);
            }
        }
        s
    }
}

fn is_one_or_less(n: &u32) -> bool {
    *n <= 1
}

/// The progress line of one interval: connections (every worker's last
/// known count), this interval's connects, the run's failures and closes so
/// far, and with publishing the messages and their delivery; workers whose
/// record is late are named.
pub(super) fn progress_line(view: &View<'_>, target: u64) -> String {
    let iv: &Interval = view.merged;
    let t = view.totals;
    let failed = t.counters_under("connect.error.");
    let closed = t.counters_under("closed.");
    let unclean = closed - t.counter("closed.clean");
    let mut s = format!(
        "[{:>6.1}s] open {}/{target}  +{}/s  failed {failed}  closed {closed}",
        view.elapsed_s(),
        iv.gauge("connections.open"),
        iv.counter("connect.ok")
    );
    if unclean > 0 {
        s.push_str(&format!(" ({unclean} not clean)"));
    }
    if iv.histograms.contains_key("connect") {
        s.push_str(&format!(
            "  connect p99 {}",
            micros(iv.stats("connect").p99)
        ));
    }
    let lag = iv.stats("connect.lag").max;
    if lag >= 1000 {
        s.push_str(&format!("  lag {}", micros(lag)));
    }
    if t.counter("publish.sent") > 0 || iv.counter("messages.received") > 0 {
        s.push_str(&format!(
            "  pub {}  msgs {}/s  lost {}",
            t.counter("publish.sent"),
            iv.counter("messages.received"),
            t.counter("messages.lost")
        ));
        if iv.histograms.contains_key("delivery") {
            let d = iv.stats("delivery");
            s.push_str(&format!(
                "  delivery p50 {} p99 {}",
                micros(d.p50),
                micros(d.p99)
            ));
        }
    }
    s.push_str(&view.late_note());
    s
}

/// The final human summary.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let lat = latency_line;
    out.push_str(&format!(
        "connections: {} opened of {} over {} worker(s) in {:.2}s ({:.0}/s), peak {} open\n",
        s.opened, s.target, s.workers, s.ramp_s, s.connect_rate, s.peak_open
    ));
    let failed: u64 = s.failed.values().sum();
    if failed > 0 {
        out.push_str(&format!(
            "  failed: {failed} ({})\n",
            kinds(&s.failed, " ", ", ")
        ));
    }
    if !s.closed.is_empty() {
        out.push_str(&format!("  closed: {}\n", kinds(&s.closed, " ", ", ")));
    }
    out.push_str(&format!(
        "  connect (from intended start): {}\n",
        lat(&s.connect_us)
    ));
    out.push_str(&format!(
        "  connect (from actual start):   {}\n",
        lat(&s.connect_service_us)
    ));
    out.push_str(&format!("    TCP connect:  {}\n", lat(&s.connect_tcp_us)));
    if s.connect_tls_us.count > 0 {
        out.push_str(&format!(
            "    TLS handshake: {}  ({} full, {} resumed)\n",
            lat(&s.connect_tls_us),
            s.tls_full,
            s.tls_resumed
        ));
    }
    // WebSocket's upgrade, or MQTT's CONNECT and SUBSCRIBE to their SUBACK.
    out.push_str(&format!(
        "    upgrade/subscribe: {}\n",
        lat(&s.connect_upgrade_us)
    ));
    if s.connect_lag_us.max >= 1000 {
        out.push_str(&format!(
            "  harness lag behind schedule: {}\n",
            lat(&s.connect_lag_us)
        ));
    }
    if s.late_workers > 0 {
        out.push_str(&format!(
            "  late start: {} worker(s) ready up to {:.3}s after the run's start (each started its schedule when ready)\n",
            s.late_workers, s.late_start_s
        ));
    }
    if s.published > 0 || !s.publish_errors.is_empty() || s.received > 0 {
        out.push_str(&format!(
            "messages: {} published, {} received of {} expected, {} lost, {} duplicated, {} out of order\n",
            s.published, s.received, s.expected, s.lost, s.duplicated, s.out_of_order
        ));
        if s.publishers > 1 {
            out.push_str(&format!(
                "  from {} publishing clients: a message overtaken by another client's is out of order, not lost\n",
                s.publishers
            ));
        }
        let errs: u64 = s.publish_errors.values().sum();
        if errs > 0 {
            out.push_str(&format!(
                "  not published: {errs} ({}; the first error is in the progress lines)\n",
                kinds(&s.publish_errors, ": ", ", ")
            ));
        }
        out.push_str(&format!("  delivery: {}\n", lat(&s.delivery_us)));
        out.push_str(&format!(
            "  publish answers: {} of {}: {}\n",
            s.publish_answered,
            s.published,
            lat(&s.publish_us)
        ));
        let unanswered: u64 = s.publish_unanswered.values().sum();
        if unanswered > 0 {
            out.push_str(&format!(
                "  published, answer missing: {unanswered} ({}); their deliveries are counted above\n",
                kinds(&s.publish_unanswered, " ", ", ")
            ));
        }
    }
    out.push_str(&server_messages(s));
    if let Some(sessions) = &s.sessions {
        out.push_str(&sessions.render());
    }
    if !s.peak_rss_bytes.is_empty() {
        out.push_str(&format!("peak RSS: {}\n", peak_rss(&s.peak_rss_bytes)));
    }
    if !s.events.is_empty() {
        out.push_str("events:\n");
        out.push_str(&event_lines(&s.events, s.start_unix_ns));
    }
    out
}

/// The messages the server made on its own: timed by their stamp
/// (`--stamp`), or only counted.
fn server_messages(s: &Summary) -> String {
    let mut out = String::new();
    if s.pushed > 0 {
        let d = &s.pushed_delivery_us;
        out.push_str(&format!(
            "server messages: {} timed by their own stamp: delivery p50 {}, p99 {}, max {}\n",
            s.pushed,
            micros(d.p50),
            micros(d.p99),
            micros(d.max)
        ));
    }
    if let Some(spread) = &s.server_spread {
        out.push_str(&format!("  {}\n", server_spread(spread)));
    }
    if s.foreign > 0 {
        out.push_str(&format!(
            "  {} message(s) not ours and without a stamp (--stamp json:FIELD or number times them)\n",
            s.foreign
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::progress::Latest;

    fn interval(counters: &[(&str, u64)], open: i64) -> Interval {
        let mut iv = Interval::empty(10_000_000_000, 1_000_000_000, "h/hold".into());
        for (k, v) in counters {
            iv.counters.insert((*k).to_owned(), *v);
        }
        iv.gauges.insert("connections.open".into(), open);
        iv
    }

    #[test]
    fn the_last_line_counts_every_close_of_the_run_clean_ones_too() {
        // The last interval saw the last 40,000 closes; the run closed 100,000, all cleanly.
        let merged = interval(&[("closed.clean", 40_000)], 0);
        let totals = interval(&[("closed.clean", 100_000), ("connect.ok", 100_000)], 0);
        let workers = vec![None; 6];
        let view = View {
            merged: &merged,
            totals: &totals,
            late: 0,
            start_unix_ns: 0,
            workers: &workers,
        };
        let line = progress_line(&view, 100_000);
        assert!(line.contains("open 0/100000"), "{line}");
        assert!(line.contains("failed 0  closed 100000"), "{line}");
        assert!(
            !line.contains("not clean") && !line.contains("late"),
            "{line}"
        );

        let totals = interval(&[("closed.clean", 90), ("closed.reset", 10)], 0);
        let view = View {
            totals: &totals,
            ..view
        };
        assert!(progress_line(&view, 100).contains("closed 100 (10 not clean)"));
    }

    #[test]
    fn late_workers_are_named_on_the_line() {
        let merged = interval(&[("connect.ok", 500)], 2_000);
        let mut workers = vec![
            Some(Latest {
                start_ns: 10_000_000_000,
                ..Latest::default()
            });
            3
        ];
        workers[2] = Some(Latest {
            start_ns: 6_000_000_000,
            ..Latest::default()
        });
        let view = View {
            merged: &merged,
            totals: &merged,
            late: 1,
            start_unix_ns: 0,
            workers: &workers,
        };
        let line = progress_line(&view, 3_000);
        assert!(line.contains("open 2000/3000"), "{line}");
        assert!(
            line.contains("(1 of 3 workers late, oldest 4.0s behind"),
            "{line}"
        );
    }

    /// Workers ready after the run's start are counted, in the text and
    /// the JSON, as in attack's summary; none, no line.
    #[test]
    fn late_workers_are_in_the_summary() {
        let mut s = Summary::default();
        assert!(!render(&s).contains("late start"));
        s.late_workers = 2;
        s.late_start_s = 1.25;
        let text = render(&s);
        assert!(
            text.contains("late start: 2 worker(s) ready up to 1.250s after the run's start"),
            "{text}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["late_workers"], 2);
        assert_eq!(json["late_start_s"], 1.25);
    }
}
