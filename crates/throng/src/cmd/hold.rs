//! `throng hold`: open N WebSocket connections at a set rate, hold them,
//! publish timestamped messages and measure every delivery.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use throng_host::units::{parse_duration, parse_size};
use throng_load::harness::clock::millis;
use throng_load::harness::progress::Progress;
use throng_load::hold::request::PublishRequest;
use throng_load::hold::target::{PublishTarget, WsTarget, parse_sources};
use throng_load::hold::{self, Settings};
use throng_load::pacer::RateSpec;

/// Arguments of `throng hold`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  throng hold ws://127.0.0.1:9000/news --connections 10000 --rate 2000/s \\
      --duration 30s
  throng hold ws://127.0.0.1:10000-10015/news -c 100000 \\
      --rate 100/s..20000/s --publish http://127.0.0.1:9000/publish/news \\
      --publish-rate 10/s --duration 1m --output run.jsonl
  throng hold ws://10.0.0.5:9000/news -c 50000 \\
      --source-ips 10.0.1.1-10.0.1.4 --publish redis://10.0.0.6:6379
  throng hold wss://localhost:9443/news -c 10000 --tls-ca ca.pem \\
      --publish http://127.0.0.1:9000/publish/news
  throng hold ws://10.0.0.5:9000/news -c 1000 \\
      --publish rediss://bob:secret@10.0.0.6:6380 --publish-tls-ca ca.pem

Connection i goes to worker i % workers, source address i % sources and
target port (i / sources) % ports. The run opens every connection on a
schedule fixed in advance (open model): connect latency counts from the
intended start, so a stalled server cannot hide its stall, and the harness
reports its own lag when it falls behind.")]
pub(crate) struct Args {
    /// Target: ws://HOST:PORT/<channel>, or a port range ws://HOST:10000-10015/<channel>;
    /// wss://... for TLS (see --tls-ca, --tls-insecure).
    #[arg(value_name = "URL", required_unless_present = "worker")]
    url: Option<String>,

    /// Connections to open and hold.
    #[arg(short = 'c', long, default_value_t = 1000)]
    connections: u64,

    /// New connections per second: 2000/s, 5k/s, or a linear ramp 100/s..5000/s
    /// (which ends as the last connection is due).
    #[arg(short, long, default_value = "1000/s")]
    rate: RateSpec,

    /// How long to hold once every connection is open or failed (30s, 5m); default: until Ctrl-C.
    #[arg(short, long, value_parser = parse_duration)]
    duration: Option<Duration>,

    /// Source addresses: a range 127.0.0.2-127.0.0.60 and/or a comma list.
    /// Default on loopback: enough of 127.0.0.2.. (at least 4); elsewhere the kernel picks.
    #[arg(long, value_name = "LIST")]
    source_ips: Option<String>,

    /// Worker processes. Default: one per core, or more when the open-file limit needs it.
    #[arg(short, long)]
    workers: Option<u32>,

    /// Publish timestamped messages: http://HOST:PORT/publish/<channel> (https:// for TLS, see
    /// --publish-tls-ca), or Redis PUBLISH with
    /// redis://[user:password@]HOST:PORT[/DB] (AUTH as that user; escape @ : / in the password
    /// as %40 %3A %2F), or rediss://... for TLS to Redis (see --publish-tls-ca).
    #[arg(long, value_name = "URL")]
    publish: Option<String>,

    /// --publish https:// or rediss://: PEM file of the CA certificate(s) that signed the
    /// publish endpoint's certificate (which must name the URL's host). Default: the system bundle
    /// /etc/ssl/certs/ca-certificates.crt.
    #[arg(long, value_name = "FILE", requires = "publish")]
    publish_tls_ca: Option<PathBuf>,

    /// --publish https:// or rediss://: do not check the publish endpoint's certificate at all
    /// (trials with a self-signed certificate only).
    #[arg(long, requires = "publish", conflicts_with = "publish_tls_ca")]
    publish_tls_insecure: bool,

    /// Messages per second to publish.
    #[arg(long, default_value = "1/s")]
    publish_rate: RateSpec,

    /// Size of each published message (64, 1k, ...); never smaller than its header.
    #[arg(long, default_value = "64", value_parser = parse_size)]
    message_size: usize,

    /// Redis channel prefix: messages go to <prefix><channel>.
    #[arg(long, default_value = "throng:")]
    redis_prefix: String,

    /// TCP connect timeout.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    connect_timeout: Duration,

    /// Timeout of the WebSocket upgrade after TCP connect (wss://: of the TLS handshake, then of the upgrade).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    handshake_timeout: Duration,

    /// How long to wait for the server's close frame at the end.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    close_timeout: Duration,

    /// Largest message accepted; a bigger one closes the connection with 1009.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    max_message: usize,

    /// Append per-second results (throng result-file format) to FILE.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Print the final summary as JSON on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,

    /// Fit the run onto this machine (workers, source addresses, local ports) and print
    /// the plan, then exit without connecting.
    #[arg(long)]
    dry_run: bool,

    #[command(flatten)]
    client: super::client::ClientArgs,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.client.worker {
        hold::run_worker().context("worker")?;
        return Ok(ExitCode::SUCCESS);
    }
    let url = args.url.as_deref().context("a target URL is needed")?;
    let target: WsTarget = url.parse()?;
    let publish = match &args.publish {
        Some(url) => Some(publish(&args, url)?),
        None => None,
    };
    let progress = Progress::choose(args.client.quiet, args.json);
    let prepared = hold::prepare(hold::Request {
        command_line: std::env::args().collect(),
        connections: args.connections,
        rate: args.rate,
        duration: args.duration,
        sources: args.source_ips.as_deref().map(parse_sources).transpose()?,
        workers: args.workers,
        settings: Settings {
            connect_timeout_ms: millis(args.connect_timeout),
            handshake_timeout_ms: millis(args.handshake_timeout),
            close_timeout_ms: millis(args.close_timeout),
            max_message: args.max_message,
            ..Settings::default()
        },
        publish,
        tls: args.client.tls.options(target.tls)?,
        target,
        output: args.output,
        progress,
    })?;
    for line in prepared.lines() {
        progress.say(line);
    }
    if args.dry_run {
        progress.say("dry run: the plan fits this machine; nothing started");
        return Ok(ExitCode::SUCCESS);
    }
    let summary = prepared.run().context("hold")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", hold::render(&summary));
    }
    Ok(ExitCode::SUCCESS)
}

/// `--publish` and its TLS trust, its rate, size and Redis prefix.
fn publish(args: &Args, url: &str) -> anyhow::Result<PublishRequest> {
    let mut target: PublishTarget = url.parse()?;
    let warning = target.set_trust(args.publish_tls_ca.clone(), args.publish_tls_insecure)?;
    if let Some(w) = warning {
        eprintln!("throng: WARNING: {w}");
    }
    Ok(PublishRequest {
        target,
        rate: args.publish_rate,
        message_size: args.message_size,
        redis_prefix: args.redis_prefix.clone(),
    })
}
