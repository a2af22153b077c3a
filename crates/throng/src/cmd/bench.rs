//! `throng bench`: the one-command proof. Starts `throng serve` as a child,
//! holds N connections to it with `hold`'s machinery (in this process, its
//! workers as child processes), publishes timestamped messages to all of
//! them, samples the host with both sides' processes labelled, stops the
//! server, and prints what was held, how fast, at what memory and CPU cost,
//! and how every message was delivered; a result file and an HTML report
//! are written beside it.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::Context as _;
use throng_host::doctor::{self, Role, Status};
use throng_host::units::{parse_duration, parse_size};
use throng_load::bench::{self, Cpu, Memory, MessageStats, Monitor, Server};
use throng_load::hold::{Settings, now_unix_ns};
use throng_load::pacer::RateSpec;
use throng_load::plan::{self, Machine};
use throng_load::supervisor::{self, HoldRun, Progress, PublishPlan, Summary};
use throng_load::target::{PublishTarget, WsTarget};
use throng_report::format::{Event, Header};

/// Arguments of `throng bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
With no arguments: picks N from this machine's open-file limit, ports and
memory (100,000 on a machine with 20,000 files per process and a few GiB free),
checks the limits as 'throng doctor' does, starts 'throng serve' on 8 free
loopback ports with enough workers, opens N WebSocket connections to it from
enough harness workers and source addresses, publishes --messages timestamped
messages to all of them, closes everything and stops the server. A few
minutes at most; Ctrl-C stops it cleanly.

Memory per connection is measured, not estimated: server and harness RSS with
every connection open minus before the first one, and the kernel's Slab plus
TCP buffer memory (/proc/meminfo, /proc/net/sockstat) likewise, each divided by
the connections held. Both ends of each connection are on this machine, so the
kernel figure covers two sockets.

With --tls the connections are wss://: the server terminates TLS itself on a
certificate it makes at start (ECDSA P-256, --tls-self-signed), the harness
trusts exactly that certificate and makes a full handshake per connection, and
the memory figures include what TLS keeps per connection on each side.
Handshakes cost CPU on both sides of this one machine, so the default rate is
lower.

Examples:
  throng bench
  throng bench --tls
  throng bench --connections 20000 --messages 5 --format json")]
pub(crate) struct Args {
    /// Connections to hold. Default: from this machine's limits and memory (at most 100,000).
    #[arg(short = 'c', long, value_name = "N")]
    connections: Option<u64>,

    /// New connections per second while opening. Default: 10000/s; with --tls 2500/s.
    #[arg(short, long, value_name = "RATE")]
    rate: Option<String>,

    /// Hold wss:// connections: TLS 1.3 terminated by the server on a certificate
    /// made at start, checked by the harness.
    #[arg(long)]
    tls: bool,

    /// Messages to publish to every connection once all are open.
    #[arg(short, long, default_value_t = 10, value_name = "N")]
    messages: u32,

    /// Time between messages. At least 2s keeps each message's deliveries in
    /// intervals of their own, so its figures are exact per message.
    #[arg(long, default_value = "2s", value_name = "DURATION")]
    message_every: String,

    /// Size of each message.
    #[arg(long, default_value = "64", value_name = "SIZE")]
    message_size: String,

    /// Where the result file and HTML report go.
    #[arg(long, default_value = "bench-out", value_name = "DIR")]
    out_dir: PathBuf,

    /// Summary format: text, or json on stdout (progress goes to stderr).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// No progress lines.
    #[arg(short, long)]
    quiet: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// The most connections a default run holds: enough to prove the point, short enough to wait for.
const DEFAULT_MAX: u64 = 100_000;
/// Memory a default run may plan on per connection (both ends, user and kernel),
/// generous against the measured ~10 KiB so a default run never nears the OOM killer.
const PLAN_BYTES_PER_CONNECTION: u64 = 32 * 1024;
/// Ports the server listens on: one accept queue each, so that a burst of
/// connects on a busy machine does not overflow one queue (SYNs dropped there
/// are retried only after 1, 3, 7, 15, 31 s).
const LISTEN_PORTS: u16 = 8;
const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
/// Close handshakes of 100,000 connections take seconds on two cores.
const CLOSE_TIMEOUT_MS: u64 = 10_000;
/// Default connect rates: a TLS handshake costs the server about 0.2 ms of
/// CPU and the harness as much again (docs/tls.md), on the same cores.
const DEFAULT_RATE: &str = "10000/s";
const DEFAULT_RATE_TLS: &str = "2500/s";

/// Everything `bench` reports.
#[derive(Debug)]
struct Report {
    settings: serde_json::Value,
    connections: u64,
    held: i64,
    opened: u64,
    failed: u64,
    failed_by_kind: std::collections::BTreeMap<String, u64>,
    connect_rate: f64,
    ramp_s: f64,
    memory: Memory,
    cpu: Cpu,
    published: u64,
    publish_errors: u64,
    received: u64,
    expected: u64,
    lost: u64,
    duplicated: u64,
    out_of_order: u64,
    delivery_us: supervisor::Latency,
    messages: Vec<MessageStats>,
    elapsed_s: f64,
    result_file: PathBuf,
    html_report: PathBuf,
    hold: Summary,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let json = args.format == Format::Json;
    let say = |line: &str| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    let rate: RateSpec = args
        .rate
        .as_deref()
        .unwrap_or(if args.tls {
            DEFAULT_RATE_TLS
        } else {
            DEFAULT_RATE
        })
        .parse()?;
    let every = parse_duration(&args.message_every).map_err(anyhow::Error::msg)?;
    if every.is_zero() {
        anyhow::bail!("--message-every must be more than 0");
    }
    let message_size = parse_size(&args.message_size).map_err(anyhow::Error::msg)?;

    // The machine.
    let nofile = throng_host::limits::raise_nofile().context("raising the open-file limit")?;
    let sysctls = throng_host::limits::Sysctls::system();
    let local_ports = match sysctls.read_numbers("net.ipv4.ip_local_port_range") {
        Ok(Some(v)) if v.len() == 2 => (
            u16::try_from(v[0]).unwrap_or(32768),
            u16::try_from(v[1]).unwrap_or(60999),
        ),
        _ => (32768, 60999),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let machine = Machine {
        nofile,
        local_ports,
        cores,
    };
    let snapshot = doctor::Machine::read(&doctor::proc_root());
    let connections = match args.connections {
        Some(n) => n,
        None => {
            let by_memory = snapshot
                .mem_available
                .map_or(DEFAULT_MAX, |m| m / 2 / PLAN_BYTES_PER_CONNECTION);
            let n = DEFAULT_MAX.min(by_memory);
            // Round to a figure a person reads at a glance.
            if n >= 10_000 {
                n / 10_000 * 10_000
            } else {
                n.max(100)
            }
        }
    };
    // The target port is known only once the server runs; plan with a placeholder.
    let placeholder: WsTarget = "ws://127.0.0.1:1/bench".parse()?;
    let fit = plan::fit(
        &plan::Request {
            connections,
            target: placeholder,
            sources: None,
            workers: None,
        },
        &machine,
    )
    .context("this run does not fit the machine (see 'throng doctor')")?;

    // What will stop the run, before anything starts.
    let dplan = doctor::Plan {
        source_ips: fit.sources.len().max(1) as u64,
        target_ports: u64::from(LISTEN_PORTS),
        ..doctor::Plan::new(connections, Role::Both)
    };
    let findings = doctor::check_machine(&dplan, &snapshot);
    let lines = doctor::warning_lines(&findings);
    for l in &lines {
        eprintln!("throng bench: {l}");
    }
    if findings.iter().any(|f| f.status == Status::Stop) {
        anyhow::bail!(
            "a limit of this machine will stop a run of {connections} connections (above); \
             run 'throng doctor --connections {connections}' for the fixes, or use a smaller --connections"
        );
    }

    let settings = Settings {
        close_timeout_ms: CLOSE_TIMEOUT_MS,
        ..Settings::default()
    };
    let publish_rate = 1.0 / every.as_secs_f64();
    // Hold long enough for `messages` publishes after the settle time, with a
    // second of slack for a late start (the publisher stops at the hold's end).
    let hold_for = every.mul_f64(f64::from(args.messages.max(1)) - 0.5)
        + supervisor::PUBLISH_SETTLE
        + Duration::from_millis(100);
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    let stamp = throng_report::format::rfc3339(now_unix_ns())
        .replace([':', '-'], "")
        .chars()
        .take(15)
        .collect::<String>();
    let result_file = args.out_dir.join(format!("bench-{stamp}.jsonl"));
    let html_file = args.out_dir.join(format!("bench-{stamp}.html"));
    let hold_file = args.out_dir.join(format!(".bench-{stamp}.hold.jsonl"));
    let cert_file = args.out_dir.join(format!(".bench-{stamp}.cert.pem"));

    // The server.
    let exe = std::env::current_exe().context("finding this program to start the server")?;
    let first_port = bench::free_port_range(LOOPBACK, LISTEN_PORTS)
        .context("finding free ports for the server")?;
    let ports = format!("{first_port}-{}", first_port + LISTEN_PORTS - 1);
    let mut serve_args: Vec<String> = vec!["serve".into(), "--listen".into()];
    if args.tls {
        // Subscribers on the TLS ports; publishing, /healthz and /metrics
        // on a plain one.
        let plain = bench::free_port_range(LOOPBACK, 1)
            .context("finding a free port for the server's plain listener")?;
        serve_args.extend([
            format!("127.0.0.1:{plain}"),
            "--tls-listen".into(),
            format!("127.0.0.1:{ports}"),
            "--tls-self-signed".into(),
        ]);
    } else {
        serve_args.push(format!("127.0.0.1:{ports}"));
    }
    serve_args.extend([
        "--max-connections".into(),
        connections.to_string(),
        "--json".into(),
    ]);
    say(&format!(
        "throng bench: {connections} connections{} on {cores} cores, {} MiB available, open-file limit {nofile}/process",
        if args.connections.is_some() {
            ""
        } else {
            " (default: from this machine's limits and memory)"
        },
        snapshot.mem_available.unwrap_or(0) >> 20
    ));
    let mut server = Server::start(&exe, &serve_args, Duration::from_secs(20))
        .context("starting 'throng serve'")?;
    let addr = server.addr();
    let server_workers = bench::children(server.pid()).len();
    let scheme = if args.tls { "wss" } else { "ws" };
    let target: WsTarget = format!("{scheme}://127.0.0.1:{ports}/bench").parse()?;
    let publish_target: PublishTarget = format!("http://{addr}/publish/bench").parse()?;
    let tls = if args.tls {
        // Trust exactly the certificate the server made.
        let pem = server.start_line()["config"]["tls"]["cert_pem"]
            .as_str()
            .context("the server's start line has no TLS certificate")?;
        std::fs::write(&cert_file, pem)
            .with_context(|| format!("cannot write {}", cert_file.display()))?;
        let opts = throng_load::tls::TlsOptions {
            insecure: false,
            ca_file: Some(cert_file.clone()),
            resume: false,
        };
        throng_load::tls::TlsClient::new(&opts).context("setting up TLS")?;
        Some(opts)
    } else {
        None
    };
    say(&format!(
        "  server    throng serve on {scheme}://127.0.0.1:{ports}{}, {server_workers} worker(s) (pid {})",
        if args.tls {
            " (self-signed ECDSA P-256; the harness trusts only it, full handshakes)"
        } else {
            ""
        },
        server.pid()
    ));
    say(&format!(
        "  harness   {} worker(s) ({}), sources {}, rate {rate}, close timeout {} s",
        fit.workers,
        fit.workers_reason,
        fit.sources_reason,
        CLOSE_TIMEOUT_MS / 1000
    ));
    say(&format!(
        "  messages  {} of {message_size} bytes, one every {:?}, over HTTP POST to /publish/bench",
        args.messages, every
    ));
    say(&format!(
        "  results   {} and {}",
        result_file.display(),
        html_file.display()
    ));

    let settings_json = serde_json::json!({
        "subcommand": "bench",
        "connections": connections,
        "rate": rate.to_string(),
        "messages": args.messages,
        "message_every_s": every.as_secs_f64(),
        "message_size": message_size,
        "tls": args.tls,
        "server": { "address": format!("127.0.0.1:{ports}"), "workers": server_workers, "args": serve_args },
        "harness": { "workers": fit.workers, "sources": fit.sources.iter().map(ToString::to_string).collect::<Vec<_>>() },
        "settings": settings,
        "machine": { "cores": cores, "nofile": nofile, "mem_available": snapshot.mem_available },
    });
    let header = Header::new(std::env::args().collect(), settings_json.clone());
    let progress = if args.quiet {
        Progress::Quiet
    } else if (json && std::io::stderr().is_terminal())
        || (!json && std::io::stdout().is_terminal())
    {
        Progress::Tty
    } else {
        Progress::Lines
    };
    let run = HoldRun {
        connections,
        rate,
        target,
        tls,
        fit,
        settings,
        duration: Some(hold_for),
        publish: Some(PublishPlan {
            target: publish_target,
            rate: publish_rate,
            message_size,
            redis_channel: "throng:bench".into(),
        }),
        output: Some(hold_file.clone()),
        header: Some(header),
        progress,
        progress_to_stderr: json,
    };
    let worker_exe = exe;
    let worker_command = move || {
        let mut c = Command::new(&worker_exe);
        c.args(["hold", "--worker"]);
        c
    };

    // Let the monitor see the idle server, then hold.
    let monitor = Monitor::start(server.pid(), Duration::from_millis(250));
    std::thread::sleep(Duration::from_millis(600));
    let before_ns = now_unix_ns();
    monitor.arm(true);
    let held = supervisor::run(run, &worker_command);
    monitor.arm(false);
    let server_died = monitor.server_died() || server.exited().is_some();
    let samples = monitor.finish();
    let stopped = server.stop(Duration::from_secs(15));
    let summary = held.context("hold")?;
    if server_died {
        anyhow::bail!(
            "the server exited during the run; its connections are gone (a limit? see 'throng doctor --connections {connections}')"
        );
    }

    let (memory, cpu) = bench::costs(&samples, before_ns, summary.peak_open.max(0) as u64);
    let messages = bench::per_message(&hold_file)?;
    let failed: u64 = summary.failed.values().sum();
    let report = Report {
        settings: settings_json,
        connections,
        held: summary.peak_open,
        opened: summary.opened,
        failed,
        failed_by_kind: summary.failed.clone(),
        connect_rate: summary.connect_rate,
        ramp_s: summary.ramp_s,
        memory,
        cpu,
        published: summary.published,
        publish_errors: summary.publish_errors.values().sum(),
        received: summary.received,
        expected: summary.published * summary.opened,
        lost: summary.lost,
        duplicated: summary.duplicated,
        out_of_order: summary.out_of_order,
        delivery_us: summary.delivery_us.clone(),
        messages,
        elapsed_s: summary.elapsed_s,
        result_file: result_file.clone(),
        html_report: html_file.clone(),
        hold: summary,
    };
    let event = Event {
        at_ns: now_unix_ns(),
        source: format!("{}/bench", throng_host::sample::hostname()),
        kind: "bench.summary".into(),
        text: report.to_json().to_string(),
    };
    bench::write_results(&hold_file, &result_file, &samples, &[event])?;
    let _ = std::fs::remove_file(&hold_file);
    let _ = std::fs::remove_file(&cert_file);
    write_html(&result_file, &html_file)?;

    if json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", render(&report));
    }
    if stopped.is_none() {
        eprintln!("throng bench: the server did not stop within 15 s of SIGTERM; it was killed");
    }
    let bad = report.failed > 0 || report.lost > 0 || report.publish_errors > 0;
    if bad {
        eprintln!("throng bench: the run had failures or losses (above)");
        return Ok(ExitCode::from(1));
    }
    if report.published < u64::from(args.messages) {
        eprintln!(
            "throng bench: stopped early: {} of {} messages published",
            report.published, args.messages
        );
        return Ok(ExitCode::from(130));
    }
    Ok(ExitCode::SUCCESS)
}

impl Report {
    fn to_json(&self) -> serde_json::Value {
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

fn write_html(result_file: &Path, html_file: &Path) -> anyhow::Result<()> {
    use throng_report::merge::{Merger, merge_files_into};
    use throng_report::summary::Report as Page;
    let mut mergers = [Merger::new(1_000_000_000).with_max_buckets(1_000)];
    let files = merge_files_into(&[result_file], &mut mergers)
        .with_context(|| format!("cannot read {}", result_file.display()))?;
    let [merger] = mergers;
    let page = throng_report::html::render(&Page::build(&merger.finish(), &files, true));
    std::fs::write(html_file, page).with_context(|| format!("cannot write {}", html_file.display()))
}

fn us(v: u64) -> String {
    throng_report::text::latency(v as f64)
}

fn bytes(v: f64) -> String {
    if v.abs() >= 1024.0 {
        format!("{:.2} KiB", v / 1024.0)
    } else {
        format!("{v:.0} B")
    }
}

fn render(r: &Report) -> String {
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
            us(t.p50),
            us(t.p99),
            us(t.max)
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
        us(d.p50),
        us(d.p99),
        us(d.max)
    ));
    for msg in &r.messages {
        let l = &msg.latency_us;
        s.push_str(&format!(
            "  message {:>3}: {:>7} delivered  p50 {:>8}  p99 {:>8}  last subscriber {:>8}\n",
            msg.seq,
            msg.delivered,
            us(l.p50),
            us(l.p99),
            us(l.max)
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
