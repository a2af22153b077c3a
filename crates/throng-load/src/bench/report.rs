//! Everything a bench reports: built from `hold`'s summary and the
//! bench's own measurements, rendered as text or JSON, and written as an
//! HTML page beside the result file; and its verdict against the criteria
//! it states at start ([`criteria`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use throng_report::bench::{
    BenchSummary, Connections, CpuSplit, Delivery, MemoryPerConnection, MessageDelivery, Messages,
};
use throng_report::interval::HistStats;
use throng_report::text::{Bytes, micros};

use super::costs::{ConnectCpu, Cpu, DeliveryCpu, Memory, MessageStats};
use super::limits::{Limit, Peaks};
use crate::harness::collect::kinds;
use crate::hold::Summary;
use crate::threshold::Threshold;

/// Everything `bench` reports.
#[derive(Debug)]
pub struct Report {
    /// The settings, as the result file's header holds them.
    pub settings: serde_json::Value,
    /// Connections asked for.
    pub connections: u64,
    /// Messages asked for.
    pub messages_asked: u32,
    /// The most connections open at once.
    pub held: i64,
    /// Handshakes completed.
    pub opened: u64,
    /// Failed connection attempts.
    pub failed: u64,
    /// Failed attempts by kind.
    pub failed_by_kind: BTreeMap<String, u64>,
    /// Connections opened per second over the ramp.
    pub connect_rate: f64,
    /// Seconds the ramp took.
    pub ramp_s: f64,
    /// Memory per connection, measured.
    pub memory: Memory,
    /// CPU per side.
    pub cpu: Cpu,
    /// CPU per delivery while the messages went out.
    pub delivery_cpu: DeliveryCpu,
    /// CPU per connection opened over the ramp, and the connect rate it allows.
    pub connect_cpu: ConnectCpu,
    /// Messages published (sent and not refused; a late answer still counts).
    pub published: u64,
    /// Publish calls answered in time.
    pub publish_answered: u64,
    /// Published messages whose answer was late or lost.
    pub publish_unanswered: u64,
    /// Messages not published (never sent, or refused).
    pub publish_errors: u64,
    /// Deliveries counted.
    pub received: u64,
    /// Deliveries expected: every message published to every connection held.
    pub expected: u64,
    /// Messages lost.
    pub lost: u64,
    /// Messages received twice.
    pub duplicated: u64,
    /// Messages received after a later one.
    pub out_of_order: u64,
    /// Delivery latency of every message, µs.
    pub delivery_us: HistStats,
    /// Delivery of each message.
    pub messages: Vec<MessageStats>,
    /// The limits the run reached, first first.
    pub limits: Vec<Limit>,
    /// The run at its worst (how close it came to a limit).
    pub peaks: Peaks,
    /// Seconds the run took.
    pub elapsed_s: f64,
    /// The result file.
    pub result_file: PathBuf,
    /// The HTML report.
    pub html_report: PathBuf,
    /// The server did not stop after SIGTERM in time and was killed.
    pub server_killed: bool,
    /// `hold`'s own summary.
    pub hold: Summary,
    /// `--threshold`s, checked beside the criteria.
    pub thresholds: Vec<Threshold>,
}

/// What a report is made of.
#[derive(Debug)]
pub(super) struct Parts {
    pub(super) settings: serde_json::Value,
    pub(super) connections: u64,
    pub(super) messages_asked: u32,
    pub(super) memory: Memory,
    pub(super) cpu: Cpu,
    pub(super) delivery_cpu: DeliveryCpu,
    pub(super) connect_cpu: ConnectCpu,
    pub(super) messages: Vec<MessageStats>,
    pub(super) limits: (Vec<Limit>, Peaks),
    pub(super) result_file: PathBuf,
    pub(super) html_report: PathBuf,
    pub(super) server_killed: bool,
    pub(super) hold: Summary,
    pub(super) thresholds: Vec<Threshold>,
}

/// How a bench ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every criterion met (exit 0).
    Pass,
    /// A criterion missed (exit 1); [`Report::failures`] says which.
    Fail,
    /// Stopped (Ctrl-C) before its end (exit 130).
    Stopped,
}

impl Verdict {
    /// `PASS`, `FAIL` or `STOPPED`.
    pub fn word(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Stopped => "STOPPED",
        }
    }
}

/// The criteria of a PASS, as the start lines and `--help` state them.
pub fn criteria(connections: u64, messages: u32) -> String {
    format!(
        "PASS when all {connections} connections are held (none fails), all {messages} messages are \
         published, and every connection receives every one (none lost, none twice, in order); \
         FAIL (exit 1) otherwise"
    )
}

impl Report {
    pub(super) fn new(p: Parts) -> Self {
        let h = &p.hold;
        let (limits, peaks) = p.limits;
        Self {
            connections: p.connections,
            messages_asked: p.messages_asked,
            held: h.peak_open,
            opened: h.opened,
            failed: h.failed.values().sum(),
            failed_by_kind: h.failed.clone(),
            connect_rate: h.connect_rate,
            ramp_s: h.ramp_s,
            published: h.published,
            publish_answered: h.publish_answered,
            publish_unanswered: h.publish_unanswered.values().sum(),
            publish_errors: h.publish_errors.values().sum(),
            received: h.received,
            expected: h.expected,
            lost: h.lost,
            duplicated: h.duplicated,
            out_of_order: h.out_of_order,
            delivery_us: h.delivery_us,
            elapsed_s: h.elapsed_s,
            settings: p.settings,
            memory: p.memory,
            cpu: p.cpu,
            delivery_cpu: p.delivery_cpu,
            connect_cpu: p.connect_cpu,
            messages: p.messages,
            limits,
            peaks,
            result_file: p.result_file,
            html_report: p.html_report,
            server_killed: p.server_killed,
            hold: p.hold,
            thresholds: p.thresholds,
        }
    }

    /// The criteria of [`criteria`] this run missed, one line each.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        let held = u64::try_from(self.held).unwrap_or(0);
        if held < self.connections {
            out.push(format!("{held} of {} connections held", self.connections));
        }
        if self.failed > 0 {
            out.push(format!(
                "{} connections failed ({})",
                self.failed,
                kinds(&self.failed_by_kind, " ", ", ")
            ));
        }
        if self.published < u64::from(self.messages_asked) {
            let why = if self.hold.publish_errors.is_empty() {
                String::new()
            } else {
                format!(
                    " (not published: {})",
                    kinds(&self.hold.publish_errors, " ", ", ")
                )
            };
            out.push(format!(
                "{} of {} messages published{why}",
                self.published, self.messages_asked
            ));
        }
        if self.received < self.expected {
            out.push(format!("{} of {} deliveries", self.received, self.expected));
        }
        for (n, what) in [
            (self.lost, "lost"),
            (self.duplicated, "received twice"),
            (self.out_of_order, "out of order"),
        ] {
            if n > 0 {
                out.push(format!("{n} messages {what}"));
            }
        }
        if let Some(why) = &self.hold.aborted {
            out.push(format!("stopped early (--abort-on-fail): {why}"));
        }
        out.extend(crate::threshold::check_all(&self.thresholds, self));
        out
    }

    /// How the bench ended.
    pub fn verdict(&self) -> Verdict {
        // Stopped by Ctrl-C; a threshold's stop is a failure.
        if self.hold.stopped && self.hold.aborted.is_none() {
            Verdict::Stopped
        } else if self.failures().is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    }

    /// The report as JSON (`throng bench --json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "verdict": self.verdict().word(),
            "failures": self.failures(),
            "criteria": criteria(self.connections, self.messages_asked),
            "settings": self.settings,
            "connections": self.connections,
            "held": self.held,
            "opened": self.opened,
            "failed": self.failed,
            "failed_by_kind": self.failed_by_kind,
            "connect_rate": self.connect_rate,
            "ramp_s": self.ramp_s,
            "memory": self.memory,
            "cpu": self.cpu,
            "delivery_cpu": self.delivery_cpu,
            "connect_cpu": self.connect_cpu,
            "messages_asked": self.messages_asked,
            "published": self.published,
            "publish_answered": self.publish_answered,
            "publish_unanswered": self.publish_unanswered,
            "publish_errors": self.publish_errors,
            "received": self.received,
            "expected": self.expected,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "out_of_order": self.out_of_order,
            "delivery_us": self.delivery_us,
            "messages": self.messages,
            "limits": self.limits,
            "limit_thresholds": super::limits::THRESHOLDS,
            "peaks": self.peaks,
            "elapsed_s": self.elapsed_s,
            "result_file": self.result_file,
            "html_report": self.html_report,
            "hold": self.hold,
        })
    }
}

impl Report {
    /// The `"bench"` record the result file ends with: the headline the
    /// text and HTML reports lead with.
    pub fn to_record(&self, at_ns: u64, source: String) -> BenchSummary {
        let setting = |k: &str| &self.settings[k];
        let every = setting("message_every_s").as_f64().unwrap_or(0.0);
        let host = source.split('/').next().unwrap_or_default().to_owned();
        let latency = |h: &HistStats| Delivery {
            p50_us: h.p50,
            p99_us: h.p99,
            max_us: h.max,
        };
        BenchSummary {
            at_ns,
            title: format!(
                "{} connections{}, {} messages of {} B every {}, on {host} ({} cores)",
                self.connections,
                if setting("tls").as_bool() == Some(true) {
                    " over TLS (wss://)"
                } else {
                    ""
                },
                self.messages_asked,
                setting("message_size").as_u64().unwrap_or(0),
                throng_host::units::fmt_duration(std::time::Duration::from_secs_f64(every)),
                self.settings["machine"]["cores"].as_u64().unwrap_or(0),
            ),
            source,
            connections: Connections {
                asked: self.connections,
                held: u64::try_from(self.held).unwrap_or(0),
                opened: self.opened,
                failed: self.failed,
                failed_by_kind: self.failed_by_kind.clone(),
                opened_per_s: self.connect_rate,
                ramp_s: self.ramp_s,
            },
            memory: MemoryPerConnection {
                connections: self.memory.connections,
                server_bytes: self.memory.server_per_connection,
                harness_bytes: self.memory.harness_per_connection,
                kernel_bytes: self.memory.kernel_per_connection,
            },
            messages: Messages {
                asked: u64::from(self.messages_asked),
                published: self.published,
                publish_errors: self.publish_errors,
                publish_unanswered: self.publish_unanswered,
                expected: self.expected,
                received: self.received,
                lost: self.lost,
                duplicated: self.duplicated,
                out_of_order: self.out_of_order,
                delivery: latency(&self.delivery_us),
                each: self
                    .messages
                    .iter()
                    .map(|m| MessageDelivery {
                        seq: m.seq,
                        delivered: m.delivered,
                        // Exact, from every worker's tally; the percentiles
                        // are of the deliveries between this publish and the next.
                        latency: Delivery {
                            max_us: m.last_subscriber_us,
                            ..latency(&m.latency_us)
                        },
                    })
                    .collect(),
            },
            cpu: CpuSplit {
                server_s: self.cpu.server_s,
                harness_s: self.cpu.harness_s,
                elapsed_s: self.elapsed_s,
            },
            verdict: self.verdict().word().to_owned(),
            criteria: criteria(self.connections, self.messages_asked),
            failures: self.failures(),
            first_limit: self
                .limits
                .first()
                .map(|l| format!("{} at {:.1} s ({})", l.name, l.at_s, l.detail))
                .unwrap_or_default(),
        }
    }
}

/// Bytes per connection: `9.87 KiB`.
fn per_connection(v: f64) -> String {
    Bytes::PER_CONNECTION.format(v)
}

/// `+245 MiB`, or `none held` for a change under half a MiB (idle
/// sockets keep no buffers; what moves then is other programs' sockets).
fn grown(before: u64, after: u64, what: &str) -> String {
    let d = after as f64 - before as f64;
    if d < 512.0 * 1024.0 {
        format!("{what}: none held")
    } else {
        format!("{what} +{}", Bytes::WHOLE_MIB.format(d))
    }
}

/// The report as text.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    connections(&mut s, r);
    memory(&mut s, r);
    messages(&mut s, r);
    cpu(&mut s, r);
    limits(&mut s, r);
    s.push_str(&format!(
        "results      {}\nreport       {}\n",
        r.result_file.display(),
        r.html_report.display()
    ));
    match r.verdict() {
        Verdict::Pass => s.push_str(&format!(
            "PASS         all {} connections held, {} of {} messages published, {} of {} deliveries, none lost\n",
            r.connections, r.published, r.messages_asked, r.received, r.expected
        )),
        Verdict::Fail => s.push_str(&format!("FAIL         {}\n", r.failures().join("; "))),
        Verdict::Stopped => s.push_str("STOPPED      by Ctrl-C before its end: no verdict\n"),
    }
    s
}

/// What was held, how fast, and the TLS handshakes.
fn connections(s: &mut String, r: &Report) {
    s.push_str(&format!(
        "\nconnections  {} held of {} ({} opened, {} failed{}), opened at {:.0}/s ({:.2} s)\n",
        r.held,
        r.connections,
        r.opened,
        r.failed,
        if r.failed_by_kind.is_empty() {
            String::new()
        } else {
            format!(": {}", kinds(&r.failed_by_kind, " ", ", "))
        },
        r.connect_rate,
        r.ramp_s
    ));
    if r.hold.tls_full + r.hold.tls_resumed > 0 {
        let t = &r.hold.connect_tls_us;
        s.push_str(&format!(
            "tls          {} full handshakes, {} resumed; handshake p50 {}  p99 {}  max {}\n",
            r.hold.tls_full,
            r.hold.tls_resumed,
            micros(t.p50),
            micros(t.p99),
            micros(t.max)
        ));
    }
}

/// Memory per connection on each side and in the kernel.
fn memory(s: &mut String, r: &Report) {
    use throng_report::bench::MIN_MEASURED_CONNECTIONS;
    let m = &r.memory;
    if m.connections < MIN_MEASURED_CONNECTIONS {
        s.push_str(&format!(
            "memory per connection: not measured (too few connections: {} open, at least {MIN_MEASURED_CONNECTIONS} needed)\n",
            m.connections
        ));
        return;
    }
    s.push_str(&format!(
        "memory per connection (measured with {} open):\n  server user space   {:>10}   (RSS {} -> {} MiB)\n  harness user space  {:>10}   (RSS {} -> {} MiB)\n  kernel              {:>10}   (Slab +{}, {}; two sockets per connection)\n",
        m.connections,
        per_connection(m.server_per_connection),
        m.server_before >> 20,
        m.server_loaded >> 20,
        per_connection(m.harness_per_connection),
        m.harness_before >> 20,
        m.harness_loaded >> 20,
        per_connection(m.kernel_per_connection),
        Bytes::WHOLE_MIB.format(m.slab_loaded as f64 - m.slab_before as f64),
        grown(m.tcp_mem_before, m.tcp_mem_loaded, "TCP buffers"),
    ));
}

/// The messages published and received, and their delivery.
fn messages(s: &mut String, r: &Report) {
    let answers = if r.publish_unanswered > 0 {
        format!(
            "{} answered in time, {} answered late or not at all",
            r.publish_answered, r.publish_unanswered
        )
    } else {
        format!("each answered in p50 {}", micros(r.hold.publish_us.p50))
    };
    s.push_str(&format!(
        "messages     {} of {} published ({answers}{}), {} received of {} expected, {} lost, {} duplicated, {} out of order\n",
        r.published,
        r.messages_asked,
        if r.publish_errors > 0 {
            format!("; {} not published", r.publish_errors)
        } else {
            String::new()
        },
        r.received,
        r.expected,
        r.lost,
        r.duplicated,
        r.out_of_order
    ));
    let d = &r.delivery_us;
    s.push_str(&format!(
        "delivery     p50 {}  p99 {}  max {}  (all messages, publish to arrival)\n",
        micros(d.p50),
        micros(d.p99),
        micros(d.max)
    ));
    for msg in &r.messages {
        s.push_str(&format!(
            "  message {:>3}: {:>7} delivered  mean {:>8}  last subscriber {:>8}\n",
            msg.seq,
            msg.delivered,
            micros(msg.mean_us),
            micros(msg.last_subscriber_us)
        ));
    }
}

/// CPU over the whole run, and per delivery.
fn cpu(s: &mut String, r: &Report) {
    if r.cpu.server_s + r.cpu.harness_s < 0.005 {
        s.push_str(&format!(
            "CPU          not measured (the run of {:.1} s used less than the sampling shows)\n",
            r.elapsed_s
        ));
        return;
    }
    s.push_str(&format!(
        "CPU          server {:.2} s, harness {:.2} s (user + system, whole run of {:.1} s)\n",
        r.cpu.server_s, r.cpu.harness_s, r.elapsed_s
    ));
    let cc = &r.connect_cpu;
    if cc.opened > 0 {
        s.push_str(&format!(
            "  per connection opened: server {:.1} µs, harness {:.1} µs ({} in {:.1} s): at these costs {} cores open at most ~{:.0}/s\n",
            cc.server_ns / 1e3,
            cc.harness_ns / 1e3,
            cc.opened,
            cc.window_s,
            r.settings["machine"]["cores"].as_u64().unwrap_or(0),
            cc.ceiling_per_s
        ));
    }
    let dc = &r.delivery_cpu;
    if dc.deliveries > 0 {
        s.push_str(&format!(
            "  per delivery: server {:.2} µs, harness {:.2} µs ({} deliveries in {:.1} s)\n",
            dc.server_ns / 1e3,
            dc.harness_ns / 1e3,
            dc.deliveries,
            dc.window_s
        ));
        if let (Some(idle_s), Some(si), Some(hi), Some(sf), Some(hf)) = (
            dc.idle_s,
            dc.server_idle_cores,
            dc.harness_idle_cores,
            dc.server_fanout_ns,
            dc.harness_fanout_ns,
        ) {
            s.push_str(&format!(
                "  idle between fan-outs: server {:.1}%, harness {:.1}% of a core (over {idle_s:.0} s); per delivery above it: server {:.2} µs, harness {:.2} µs\n",
                100.0 * si,
                100.0 * hi,
                sf / 1e3,
                hf / 1e3
            ));
        }
    }
}

/// The limits reached, or how close the run came.
fn limits(s: &mut String, r: &Report) {
    if r.limits.is_empty() {
        let p = &r.peaks;
        s.push_str(&format!(
            "limits       none reached (the busiest second: CPU {:.0}%; memory available at least {:.0}%; harness lag at most {}; connect p99 at most {})\n",
            100.0 * p.cpu_busy,
            100.0 * p.mem_available,
            micros(p.lag_us),
            micros(p.connect_p99_us)
        ));
    } else {
        let first = &r.limits[0];
        s.push_str(&format!(
            "limits       first reached: {} at {:.1} s ({})\n",
            first.name, first.at_s, first.detail
        ));
        for l in &r.limits[1..] {
            s.push_str(&format!(
                "             then {} at {:.1} s ({})\n",
                l.name, l.at_s, l.detail
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of a run of 1,000 connections and 2 messages that went as
    /// `hold` says; the bench's own measurements as given.
    fn report(hold: Summary, memory: Memory) -> Report {
        Report::new(Parts {
            settings: serde_json::json!({}),
            connections: 1_000,
            messages_asked: 2,
            memory,
            cpu: Cpu::default(),
            delivery_cpu: DeliveryCpu::default(),
            connect_cpu: ConnectCpu::default(),
            messages: Vec::new(),
            limits: (Vec::new(), Peaks::default()),
            result_file: PathBuf::from("r.jsonl"),
            html_report: PathBuf::from("r.html"),
            server_killed: false,
            hold,
            thresholds: Vec::new(),
        })
    }

    fn clean() -> Summary {
        Summary {
            target: 1_000,
            opened: 1_000,
            peak_open: 1_000,
            published: 2,
            publish_answered: 2,
            received: 2_000,
            expected: 2_000,
            ..Summary::default()
        }
    }

    #[test]
    fn a_clean_run_passes_and_says_so_last() {
        let r = report(clean(), Memory::default());
        assert_eq!(r.verdict(), Verdict::Pass);
        let text = render(&r);
        let last = text.lines().last().unwrap();
        assert!(last.starts_with("PASS "), "{text}");
        assert_eq!(r.to_json()["verdict"], "PASS");
    }

    #[test]
    fn each_missed_criterion_fails_the_run_by_name() {
        let mut h = clean();
        h.peak_open = 990;
        h.opened = 990;
        h.failed.insert("timeout".into(), 10);
        h.received = 1_980;
        h.expected = 1_980;
        let r = report(h, Memory::default());
        assert_eq!(r.verdict(), Verdict::Fail);
        assert_eq!(
            r.failures(),
            [
                "990 of 1000 connections held",
                "10 connections failed (timeout 10)"
            ]
        );
        assert!(render(&r).ends_with(
            "FAIL         990 of 1000 connections held; 10 connections failed (timeout 10)\n"
        ));

        // Every connection held, but a message short: one not published, its
        // deliveries missing.
        let mut h = clean();
        h.published = 1;
        h.publish_errors.insert("status".into(), 1);
        h.received = 1_000;
        h.expected = 1_000;
        assert_eq!(
            report(h, Memory::default()).failures(),
            ["1 of 2 messages published (not published: status 1)"]
        );

        // Published, but some deliveries never came.
        let mut h = clean();
        h.received = 1_990;
        h.lost = 10;
        assert_eq!(
            report(h, Memory::default()).failures(),
            ["1990 of 2000 deliveries", "10 messages lost"]
        );

        let mut h = clean();
        h.stopped = true;
        assert_eq!(report(h, Memory::default()).verdict(), Verdict::Stopped);
    }

    #[test]
    fn the_memory_line_says_idle_sockets_hold_no_tcp_buffers() {
        // Other programs' sockets freed a MiB of TCP buffers meanwhile.
        let m = Memory {
            connections: 1_000,
            tcp_mem_before: 1 << 20,
            tcp_mem_loaded: 200 << 10,
            slab_before: 400 << 20,
            slab_loaded: 410 << 20,
            ..Memory::default()
        };
        let text = render(&report(clean(), m));
        assert!(
            text.contains("(Slab +10 MiB, TCP buffers: none held; two sockets per connection)"),
            "{text}"
        );
        assert!(!text.contains("TCP buffers 1 -> 0"), "{text}");
        let m = Memory {
            connections: 1_000,
            tcp_mem_before: 0,
            tcp_mem_loaded: 245 << 20,
            ..Memory::default()
        };
        assert!(render(&report(clean(), m)).contains("TCP buffers +245 MiB"));
    }

    #[test]
    fn a_small_run_says_what_it_did_not_measure() {
        let m = Memory {
            connections: 200,
            ..Memory::default()
        };
        let text = render(&report(clean(), m));
        assert!(
            text.contains("memory per connection: not measured (too few connections: 200 open"),
            "{text}"
        );
        assert!(!text.contains(" 0 B"), "{text}");
        assert!(text.contains("CPU          not measured"), "{text}");
    }
}
