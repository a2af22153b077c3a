//! `throng hold`: open N WebSocket connections at a set rate, hold them,
//! publish timestamped messages and measure every delivery.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::Context as _;
use throng_host::units::{parse_duration, parse_size};
use throng_load::hold::Settings;
use throng_load::pacer::RateSpec;
use throng_load::plan::{self, Machine};
use throng_load::supervisor::{self, HoldRun, Progress, PublishPlan};
use throng_load::target::{PublishTarget, WsTarget, parse_sources};

/// Arguments of `throng hold`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  throng hold ws://127.0.0.1:9000/news --connections 10000 --rate 2000/s --duration 30s
  throng hold ws://127.0.0.1:10000-10015/news -c 100000 --rate 100/s..20000/s \\
      --publish http://127.0.0.1:9000/publish/news --publish-rate 10/s --duration 1m --output run.jsonl
  throng hold ws://10.0.0.5:9000/news -c 50000 --source-ips 10.0.1.1-10.0.1.4 --publish redis://10.0.0.6:6379
  throng hold wss://localhost:9443/news -c 10000 --tls-ca ca.pem --publish http://127.0.0.1:9000/publish/news
  throng hold ws://10.0.0.5:9000/news -c 1000 --publish rediss://bob:secret@10.0.0.6:6380 --publish-tls-ca ca.pem

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
    rate: String,

    /// How long to hold once every connection is open or failed (30s, 5m); default: until Ctrl-C.
    #[arg(short, long)]
    duration: Option<String>,

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
    publish_rate: String,

    /// Size of each published message (64, 1k, ...); never smaller than its header.
    #[arg(long, default_value = "64")]
    message_size: String,

    /// Redis channel prefix: messages go to <prefix><channel>.
    #[arg(long, default_value = "throng:")]
    redis_prefix: String,

    /// TCP connect timeout.
    #[arg(long, default_value = "10s")]
    connect_timeout: String,

    /// Timeout of the WebSocket upgrade after TCP connect (wss://: of the TLS handshake, then of the upgrade).
    #[arg(long, default_value = "10s")]
    handshake_timeout: String,

    /// How long to wait for the server's close frame at the end.
    #[arg(long, default_value = "2s")]
    close_timeout: String,

    /// Largest message accepted; a bigger one closes the connection with 1009.
    #[arg(long, default_value = "1MiB")]
    max_message: String,

    /// Append per-second results (throng result-file format) to FILE.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Print the final summary as JSON on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,

    /// No progress lines.
    #[arg(short, long)]
    quiet: bool,

    #[command(flatten)]
    tls: super::tls_client::TlsArgs,

    /// Internal: run as a worker process (plan on stdin).
    #[arg(long, hide = true)]
    worker: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.worker {
        // Workers hold the connections: take every file the hard limit allows.
        throng_host::limits::raise_nofile().context("raising the open-file limit")?;
        let stdin = std::io::BufReader::new(std::io::stdin());
        throng_load::hold::run_worker(stdin, Box::new(std::io::stdout())).context("worker")?;
        return Ok(ExitCode::SUCCESS);
    }
    let url = args.url.as_deref().context("a target URL is needed")?;
    let target: WsTarget = url.parse()?;
    let rate: RateSpec = args.rate.parse()?;
    let duration = args
        .duration
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let settings = Settings {
        connect_timeout_ms: ms(&args.connect_timeout)?,
        handshake_timeout_ms: ms(&args.handshake_timeout)?,
        close_timeout_ms: ms(&args.close_timeout)?,
        max_message: parse_size(&args.max_message).map_err(anyhow::Error::msg)?,
        ..Settings::default()
    };
    let sources = args.source_ips.as_deref().map(parse_sources).transpose()?;
    let publish = match &args.publish {
        None => None,
        Some(p) => {
            let mut target_pub: PublishTarget = p.parse()?;
            let tls_flags = args.publish_tls_ca.is_some() || args.publish_tls_insecure;
            match &mut target_pub {
                PublishTarget::Redis { url, trust, .. } if url.tls => {
                    trust.ca.clone_from(&args.publish_tls_ca);
                    trust.insecure = args.publish_tls_insecure;
                    // A bad CA file is an error now, not one per publish.
                    trust.client_config(url).with_context(|| {
                        format!(
                            "cannot set up TLS to Redis at {url} (give --publish-tls-ca FILE, \
                             or --publish-tls-insecure for a trial)"
                        )
                    })?;
                    if trust.insecure {
                        eprintln!(
                            "throng: WARNING: --publish-tls-insecure: the certificate of Redis \
                             at {url} is NOT checked. For trials only."
                        );
                    }
                }
                PublishTarget::Http {
                    tls: Some((name, trust)),
                    ..
                } => {
                    trust.ca.clone_from(&args.publish_tls_ca);
                    trust.insecure = args.publish_tls_insecure;
                    trust.tls_config().with_context(|| {
                        format!(
                            "cannot set up TLS to the publish endpoint {name} (give \
                             --publish-tls-ca FILE, or --publish-tls-insecure for a trial)"
                        )
                    })?;
                    if trust.insecure {
                        eprintln!(
                            "throng: WARNING: --publish-tls-insecure: the certificate of the \
                             publish endpoint {name} is NOT checked. For trials only."
                        );
                    }
                }
                _ if tls_flags => anyhow::bail!(
                    "--publish-tls-ca and --publish-tls-insecure are for --publish https://... \
                     or rediss://..."
                ),
                _ => {}
            }
            let rate = match args.publish_rate.parse::<RateSpec>()? {
                RateSpec::Constant(r) => r,
                RateSpec::Ramp(..) => {
                    anyhow::bail!("--publish-rate takes a constant rate (e.g. 10/s), not a ramp")
                }
            };
            Some(PublishPlan {
                target: target_pub,
                rate,
                message_size: parse_size(&args.message_size).map_err(anyhow::Error::msg)?,
                redis_channel: format!("{}{}", args.redis_prefix, target.channel()),
            })
        }
    };

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
    let request = plan::Request {
        connections: args.connections,
        target: target.clone(),
        sources,
        workers: args.workers,
    };
    let fit = plan::fit(&request, &machine).context("this run does not fit the machine")?;

    // Every default that matters, before anything happens.
    let say = |line: String| {
        if args.json {
            eprintln!("{line}")
        } else {
            println!("{line}")
        }
    };
    say(format!("throng hold {target}"));
    say(format!(
        "  connections {}  rate {rate}  hold {}",
        args.connections,
        match duration {
            Some(d) => format!("{d:?} once every connection is open or failed"),
            None => "until Ctrl-C".to_owned(),
        }
    ));
    say(format!(
        "  workers {} ({}), at most {} connections each",
        fit.workers, fit.workers_reason, fit.per_worker
    ));
    say(format!("  sources {}", fit.sources_reason));
    say(format!(
        "  target ports {} × sources {} = {} pairs, at most {} connections per pair (usable local ports per pair {}, ip_local_port_range {}-{})",
        target.port_count(),
        fit.sources.len().max(1),
        u64::from(target.port_count()) * fit.sources.len().max(1) as u64,
        fit.per_pair,
        machine.usable_ports(),
        local_ports.0,
        local_ports.1
    ));
    let tls = args.tls.options(target.tls, &say)?;
    say(format!(
        "  timeouts: connect {} ms, handshake {} ms, close {} ms; max message {} bytes; open-file limit {nofile}/process",
        settings.connect_timeout_ms,
        settings.handshake_timeout_ms,
        settings.close_timeout_ms,
        settings.max_message
    ));
    if let Some(p) = &publish {
        let via = match &p.target {
            PublishTarget::Redis { url, trust, .. } if url.tls => {
                format!(" (Redis channel {}; {})", p.redis_channel, trust.describe())
            }
            PublishTarget::Redis { .. } => format!(" (Redis channel {})", p.redis_channel),
            PublishTarget::Http { .. } => String::new(),
        };
        say(format!(
            "  publish {}{via} at {}/s, {} bytes per message, from {} ms after every connection is open; timeout {} s",
            p.target,
            p.rate,
            p.message_size,
            supervisor::PUBLISH_SETTLE.as_millis(),
            supervisor::PUBLISH_TIMEOUT.as_secs()
        ));
    }
    if let Some(o) = &args.output {
        say(format!("  results to {}", o.display()));
    }

    let progress = if args.quiet {
        Progress::Quiet
    } else if (args.json && std::io::stderr().is_terminal())
        || (!args.json && std::io::stdout().is_terminal())
    {
        Progress::Tty
    } else {
        Progress::Lines
    };
    let header = args.output.as_ref().map(|_| {
        throng_report::format::Header::new(
            std::env::args().collect(),
            serde_json::json!({
                "subcommand": "hold",
                "target": target.to_string(),
                "connections": args.connections,
                "rate": rate.to_string(),
                "duration_s": duration.map(|d| d.as_secs_f64()),
                "workers": fit.workers,
                "sources": fit.sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "settings": settings,
                "tls": tls,
                "publish": publish.as_ref().map(|p| serde_json::json!({
                    "target": p.target.to_string(), "rate": p.rate, "message_size": p.message_size,
                })),
            }),
        )
    });
    let exe = std::env::current_exe().context("finding this program to start workers")?;
    let worker_command = move || {
        let mut c = Command::new(&exe);
        c.args(["hold", "--worker"]);
        c
    };
    let json = args.json;
    let run = HoldRun {
        connections: args.connections,
        rate,
        target,
        tls,
        fit,
        settings,
        duration,
        publish,
        output: args.output,
        header,
        progress,
        progress_to_stderr: json,
    };
    let summary = supervisor::run(run, &worker_command).context("hold")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", supervisor::render_summary(&summary));
    }
    Ok(ExitCode::SUCCESS)
}

fn ms(text: &str) -> anyhow::Result<u64> {
    let d: Duration = parse_duration(text).map_err(anyhow::Error::msg)?;
    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
