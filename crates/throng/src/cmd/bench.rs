//! `throng bench`: the one-command proof. Starts `throng serve` as a child,
//! holds N connections to it with `hold`'s machinery (in this process, its
//! workers as child processes), publishes timestamped messages to all of
//! them, samples the host with both sides' processes labelled, stops the
//! server, and prints what was held, how fast, at what memory and CPU cost,
//! and how every message was delivered; a result file and an HTML report
//! are written beside it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use throng_host::units::{parse_duration, parse_size};
use throng_load::bench::{self, Verdict};
use throng_load::harness::progress::Progress;
use throng_load::pacer::RateSpec;

use super::Format;

/// Arguments of `throng bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
With no arguments: picks N from this machine's open-file limit, ports and
memory (100,000 on a machine with 20,000 files per process and a few GiB free),
checks the limits as 'throng doctor' does, starts 'throng serve' on 8 free
loopback ports with enough workers, opens N WebSocket connections to it from
enough harness workers and source addresses, publishes --messages timestamped
messages to all of them, waits until every connection has them, closes
everything and stops the server. Ctrl-C stops it cleanly.

How long: the default run (100,000 connections) takes about 40 s on two
idle cores, 1,000,000 about 3.5 minutes (docs/scale.md); the start lines
say what this run should take ('expect'), from its size.

It ends with a verdict: PASS when every connection is held (none fails),
every message is published and every connection receives every one (none
lost, none twice, in order); FAIL otherwise, naming what missed. Exit
status: 0 PASS, 1 FAIL, 2 bad arguments or a run that could not start (a
limit of this machine: see 'throng doctor'), 130 stopped by Ctrl-C.

For its scale it sets the server's ping interval (at most 2,000 pings/s,
up to 5 minutes: keep-alives to a million connections every 30 s would take
a third of two cores), 30 s connect and handshake timeouts on both sides (on
a busy machine a connection waits in queues; that is lag, not failure) and a
close timeout that grows with N, and prints each. The summary names the
first limit the run reached: CPU (the machine >= 95% busy), memory (< 10%
available), harness lag (a connection started >= 1 s late), connect latency
(p99 >= 1 s), connect rate (< 90% of the plan), or how close it came.

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
    rate: Option<RateSpec>,

    /// Hold wss:// connections: TLS 1.3 terminated by the server on a certificate
    /// made at start, checked by the harness.
    #[arg(long)]
    tls: bool,

    /// Messages to publish to every connection once all are open.
    #[arg(short, long, default_value_t = 10, value_name = "N")]
    messages: u32,

    /// Time between messages. At least 2s keeps each message's deliveries in
    /// intervals of their own, so its figures are exact per message.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = parse_duration)]
    message_every: Duration,

    /// Size of each message.
    #[arg(long, default_value = "64", value_name = "SIZE", value_parser = parse_size)]
    message_size: usize,

    /// Timeout of one publish call. A message whose answer is late still counts as
    /// published (its answer as 'unanswered'), and its deliveries are expected.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    publish_timeout: Duration,

    /// Where the result file and HTML report go.
    #[arg(long, default_value = "bench-out", value_name = "DIR")]
    out_dir: PathBuf,

    /// Summary format: text, or json on stdout (progress goes to stderr).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// No progress lines.
    #[arg(short, long)]
    quiet: bool,

    /// Stay on the host's network. By default, as root, a run whose sockets
    /// would crowd the host's TCP connection table (two per connection, past
    /// two per bucket: about 260,000 connections on a 24 GiB machine) runs in
    /// a private network namespace whose table fits it; the start lines say
    /// so ('network').
    #[arg(long)]
    host_network: bool,

    /// Plan the run and check this machine's limits as it would, print the plan,
    /// then exit without starting anything.
    #[arg(long)]
    dry_run: bool,

    /// Also FAIL (exit 1) unless FIGURE OP VALUE holds at the end (repeatable),
    /// on the figures bench prints: 'p99<50ms' (delivery), 'connect_p99<1s',
    /// 'server_bytes_per_connection<4096', 'server_ns_per_delivery<2000',
    /// 'connect_rate>=5000/s'. Figures: p50 p75 p90 p95 p99 p99.9 mean min max of
    /// delivery, connect_, publish_; loss_rate; connect_rate; lost, connect_errors,
    /// duplicated, out_of_order, received, opened, publish_errors, held,
    /// server_/harness_/kernel_bytes_per_connection, server_/harness_ns_per_delivery
    /// (the CPU from the first publish to the last delivery, over the deliveries),
    /// server_/harness_fanout_ns_per_delivery (the same less the idle cost measured
    /// between fan-outs; none when fan-outs leave no quiet second).
    #[arg(long, value_name = "EXPR", value_parser = bench_threshold)]
    threshold: Vec<throng_load::threshold::Threshold>,

    /// Stop the hold once a threshold can no longer pass (a count already over
    /// its bound, a max already passed); the verdict is then FAIL.
    #[arg(long)]
    abort_on_fail: bool,
}

/// `--threshold`: one expression on bench's figures.
fn bench_threshold(text: &str) -> Result<throng_load::threshold::Threshold, String> {
    throng_load::threshold::Threshold::parse(text, &bench::figures::FIGURES)
        .map_err(|e| e.to_string())
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let json = args.format == Format::Json;
    let request = bench::Request {
        command_line: std::env::args().collect(),
        connections: args.connections,
        rate: args.rate,
        tls: args.tls,
        messages: args.messages,
        message_every: args.message_every,
        message_size: args.message_size,
        publish_timeout: args.publish_timeout,
        out_dir: args.out_dir,
        progress: Progress::choose(args.quiet, json),
        host_network: args.host_network,
        thresholds: args.threshold,
        abort_on_fail: args.abort_on_fail,
    };
    if args.dry_run {
        for line in bench::dry_run(&request).context("bench")? {
            super::print(&format!("{line}\n"))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let report = bench::run(request).context("bench")?;
    if json {
        super::print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report.to_json())?
        ))?;
    } else {
        super::print(&bench::render(&report))?;
    }
    if report.server_killed {
        eprintln!(
            "throng bench: the server did not stop within {} of SIGTERM; it was killed",
            throng_host::units::fmt_duration(bench::SERVER_STOP)
        );
    }
    Ok(match report.verdict() {
        Verdict::Pass => ExitCode::SUCCESS,
        Verdict::Fail => ExitCode::from(1),
        Verdict::Stopped => ExitCode::from(130),
    })
}
