//! Everything a bench reports: built from `hold`'s summary and the
//! bench's own measurements, rendered as text or JSON, and written as an
//! HTML page beside the result file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use throng_report::bench::{
    BenchSummary, Connections, CpuSplit, Delivery, MemoryPerConnection, MessageDelivery, Messages,
};
use throng_report::summary::HistStats;
use throng_report::text::micros;

use super::BenchError;
use super::costs::{Cpu, Memory, MessageStats};
use crate::hold::Summary;

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
    /// Messages published.
    pub published: u64,
    /// Publish calls that failed.
    pub publish_errors: u64,
    /// Deliveries counted.
    pub received: u64,
    /// Deliveries expected: every message to every connection.
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
}

/// What a report is made of.
#[derive(Debug)]
pub(super) struct Parts {
    pub(super) settings: serde_json::Value,
    pub(super) connections: u64,
    pub(super) messages_asked: u32,
    pub(super) memory: Memory,
    pub(super) cpu: Cpu,
    pub(super) messages: Vec<MessageStats>,
    pub(super) result_file: PathBuf,
    pub(super) html_report: PathBuf,
    pub(super) server_killed: bool,
    pub(super) hold: Summary,
}

/// How a bench ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every connection held, every message delivered.
    Ok,
    /// Connections failed, or messages were lost or not published.
    Failures,
    /// Stopped (Ctrl-C) before every message was published.
    StoppedEarly,
}

impl Report {
    pub(super) fn new(p: Parts) -> Self {
        let h = &p.hold;
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
            publish_errors: h.publish_errors.values().sum(),
            received: h.received,
            expected: h.published * h.opened,
            lost: h.lost,
            duplicated: h.duplicated,
            out_of_order: h.out_of_order,
            delivery_us: h.delivery_us,
            elapsed_s: h.elapsed_s,
            settings: p.settings,
            memory: p.memory,
            cpu: p.cpu,
            messages: p.messages,
            result_file: p.result_file,
            html_report: p.html_report,
            server_killed: p.server_killed,
            hold: p.hold,
        }
    }

    /// How the bench ended.
    pub fn verdict(&self) -> Verdict {
        if self.failed > 0 || self.lost > 0 || self.publish_errors > 0 {
            Verdict::Failures
        } else if self.published < u64::from(self.messages_asked) {
            Verdict::StoppedEarly
        } else {
            Verdict::Ok
        }
    }

    /// The report as JSON (also the `bench.summary` event of the result file).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
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
            "published": self.published,
            "publish_errors": self.publish_errors,
            "received": self.received,
            "expected": self.expected,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "out_of_order": self.out_of_order,
            "delivery_us": self.delivery_us,
            "messages": self.messages,
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
                        latency: latency(&m.latency_us),
                    })
                    .collect(),
            },
            cpu: CpuSplit {
                server_s: self.cpu.server_s,
                harness_s: self.cpu.harness_s,
                elapsed_s: self.elapsed_s,
            },
        }
    }
}

/// The HTML page of the result file.
pub(super) fn write_html(result_file: &Path, html_file: &Path) -> Result<(), BenchError> {
    use throng_report::merge::{Merger, merge_files_into};
    use throng_report::summary::Report as Page;
    let err = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        BenchError::Results(format!("cannot {what} {}: {e}", path.display()))
    };
    let mut mergers = [Merger::new(1_000_000_000).with_max_buckets(1_000)];
    // A read error names the file itself.
    let files = merge_files_into(&[result_file], &mut mergers)
        .map_err(|e| BenchError::Results(e.to_string()))?;
    let [merger] = mergers;
    let page = throng_report::html::render(&Page::build(&merger.finish(), &files, true));
    std::fs::write(html_file, page).map_err(|e| err("write", html_file, &e))
}

fn bytes(v: f64) -> String {
    if v.abs() >= 1024.0 {
        format!("{:.2} KiB", v / 1024.0)
    } else {
        format!("{v:.0} B")
    }
}

/// The report as text.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let m = &r.memory;
    s.push_str(&format!(
        "\nconnections  {} held of {} ({} opened, {} failed{}), opened at {:.0}/s ({:.2} s)\n",
        r.held,
        r.connections,
        r.opened,
        r.failed,
        if r.failed_by_kind.is_empty() {
            String::new()
        } else {
            format!(": {:?}", r.failed_by_kind)
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
    s.push_str(&format!(
        "memory per connection (measured with {} open):\n  server user space   {:>10}   (RSS {} -> {} MiB)\n  harness user space  {:>10}   (RSS {} -> {} MiB)\n  kernel              {:>10}   (Slab {} -> {} MiB, TCP buffers {} -> {} MiB; two sockets per connection)\n",
        m.connections,
        bytes(m.server_per_connection),
        m.server_before >> 20,
        m.server_loaded >> 20,
        bytes(m.harness_per_connection),
        m.harness_before >> 20,
        m.harness_loaded >> 20,
        bytes(m.kernel_per_connection),
        m.slab_before >> 20,
        m.slab_loaded >> 20,
        m.tcp_mem_before >> 20,
        m.tcp_mem_loaded >> 20,
    ));
    s.push_str(&format!(
        "messages     {} published ({} failed), {} received of {} expected, {} lost, {} duplicated, {} out of order\n",
        r.published, r.publish_errors, r.received, r.expected, r.lost, r.duplicated, r.out_of_order
    ));
    let d = &r.delivery_us;
    s.push_str(&format!(
        "delivery     p50 {}  p99 {}  max {}  (all messages, publish to arrival)\n",
        micros(d.p50),
        micros(d.p99),
        micros(d.max)
    ));
    for msg in &r.messages {
        let l = &msg.latency_us;
        s.push_str(&format!(
            "  message {:>3}: {:>7} delivered  p50 {:>8}  p99 {:>8}  last subscriber {:>8}\n",
            msg.seq,
            msg.delivered,
            micros(l.p50),
            micros(l.p99),
            micros(l.max)
        ));
    }
    s.push_str(&format!(
        "CPU          server {:.2} s, harness {:.2} s (user + system, whole run of {:.1} s)\n",
        r.cpu.server_s, r.cpu.harness_s, r.elapsed_s
    ));
    s.push_str(&format!(
        "results      {}\nreport       {}\n",
        r.result_file.display(),
        r.html_report.display()
    ));
    s
}
