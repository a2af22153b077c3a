//! `throng attack`: HTTP load at a set request rate (open model) or the most
//! a closed pool of connections can do, measured without coordinated omission.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::Context as _;
use throng_host::units::parse_duration;
use throng_load::attack::record::{CSV_HEADER, LATE_US, RowFormat};
use throng_load::attack::supervisor::{self, AttackRun};
use throng_load::attack::targets::{self, HttpUrl, Target};
use throng_load::attack::{DEFAULT_TIMEOUT, Load, Settings, WorkerPlan};
use throng_load::pacer::RateSpec;
use throng_load::supervisor::Progress;

/// Arguments of `throng attack`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  throng attack --url http://127.0.0.1:8080/ping --rate 2000/s --duration 30s
  throng attack --url http://127.0.0.1:8080/ping -H 'sleep: 5000' --rate 2000/s --duration 1m --timeout 10s
  throng attack --targets targets.txt --rate 100/s..5000/s --duration 2m --output run.jsonl
  throng attack --url http://127.0.0.1:8080/ping --max --connections 64 --duration 10s
  throng attack --url https://localhost:8443/ping --tls-ca ca.pem --rate 1000/s --duration 10s --no-keepalive
  cat targets.txt | throng attack --targets - --rate 500/s --requests 10000 --max-p99 200ms

Targets file (Vegeta's format; requests take the targets in turn):
  GET http://127.0.0.1:8080/ping
  sleep: 1000

  POST http://127.0.0.1:8080/ping
  Content-Type: application/json
  @body.json

Open model: request i is due at a time fixed by --rate before the run
starts. Its latency counts from that intended time, so a server that stalls
cannot hide its stall by slowing the generator down; the service time (from
the actual start) is kept beside it. When the generator itself falls
behind, it still sends every request and reports its lag and the requests it
started late.

Exit status: 0 ok, 1 a --max-error-rate or --max-p99 threshold was passed,
2 bad arguments or a failed run.")]
pub(crate) struct Args {
    /// Targets file in Vegeta's format ('-' for stdin).
    #[arg(short, long, value_name = "FILE", conflicts_with = "url")]
    targets: Option<PathBuf>,

    /// One target URL (http://HOST:PORT/PATH or https://...) instead of a targets file.
    #[arg(short, long, required_unless_present_any = ["targets", "worker"])]
    url: Option<String>,

    /// Method for --url (default GET, or POST with a body).
    #[arg(short = 'm', long)]
    method: Option<String>,

    /// Header for every request, 'Name: value' (repeatable; a targets file's own headers win).
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    headers: Vec<String>,

    /// Body for --url.
    #[arg(long, conflicts_with = "body_file")]
    body: Option<String>,

    /// Body for --url, read from a file.
    #[arg(long, value_name = "FILE")]
    body_file: Option<PathBuf>,

    /// Requests per second: 2000/s, 5k/s, or a linear ramp 100/s..5000/s over the duration.
    #[arg(short, long, required_unless_present_any = ["max", "worker"])]
    rate: Option<String>,

    /// Closed model instead of a rate: --connections connections, each sending its
    /// next request as soon as the last one ends (the most the server gives; wrk's mode).
    #[arg(long, conflicts_with = "rate")]
    max: bool,

    /// Connections of the closed pool (--max).
    #[arg(short, long, default_value_t = 64)]
    connections: u64,

    /// How long to start requests for (30s, 5m).
    #[arg(short, long, required_unless_present_any = ["requests", "worker"])]
    duration: Option<String>,

    /// Requests in all (with --duration too: whichever ends first).
    #[arg(short = 'n', long)]
    requests: Option<u64>,

    /// Worker processes. Default: one per core.
    #[arg(short, long)]
    workers: Option<u32>,

    /// Connections open at once over all workers, idle keep-alive ones included;
    /// at the limit a request waits for a free connection (and that wait is in its latency).
    #[arg(long, default_value_t = 10_000)]
    max_connections: u64,

    /// Reuse connections (HTTP/1.1 keep-alive): the default.
    #[arg(long, overrides_with = "no_keepalive")]
    keepalive: bool,

    /// Open a new connection for every request (sends Connection: close).
    #[arg(long, overrides_with = "keepalive")]
    no_keepalive: bool,

    /// Per request, connect included; a later answer counts as error 'timeout'.
    #[arg(long, default_value = "60s")]
    timeout: String,

    /// Append per-second results (throng result-file format) to FILE; read with `throng report`.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Write one row per request to FILE: CSV if it ends in .csv, else JSON lines.
    #[arg(long, value_name = "FILE")]
    per_request: Option<PathBuf>,

    /// Final summary as text or json (JSON on stdout; progress then goes to stderr).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    format: String,

    /// Exit 1 when more than this fraction of requests fail (errors and non-2xx/3xx), e.g. 0.01.
    #[arg(long, value_name = "FRACTION")]
    max_error_rate: Option<f64>,

    /// Exit 1 when the p99 latency (from the intended start) is above this, e.g. 250ms.
    #[arg(long, value_name = "DURATION")]
    max_p99: Option<String>,

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
        throng_host::limits::raise_nofile().context("raising the open-file limit")?;
        let stdin = std::io::BufReader::new(std::io::stdin());
        throng_load::attack::worker::run_worker(stdin, Box::new(std::io::stdout()))
            .context("worker")?;
        return Ok(ExitCode::SUCCESS);
    }
    let targets = read_targets(&args)?;
    let addrs = targets
        .iter()
        .map(|t| t.url.resolve())
        .collect::<Result<Vec<_>, _>>()?;
    let duration = args
        .duration
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    if duration.is_some_and(|d| d.is_zero()) {
        anyhow::bail!("--duration must be more than zero");
    }
    if args.requests == Some(0) {
        anyhow::bail!("--requests must be at least 1");
    }
    let timeout = parse_duration(&args.timeout).map_err(anyhow::Error::msg)?;
    if timeout.is_zero() {
        anyhow::bail!("--timeout must be more than zero");
    }
    let max_p99 = args
        .max_p99
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    if let Some(r) = args.max_error_rate
        && !(0.0..=1.0).contains(&r)
    {
        anyhow::bail!("--max-error-rate is a fraction between 0 and 1, e.g. 0.01 for 1%");
    }
    if args.max_connections == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    let load = if args.max {
        if args.connections == 0 {
            anyhow::bail!("--connections must be at least 1");
        }
        Load::Max {
            connections: args.connections,
        }
    } else {
        let text = args.rate.as_deref().context("--rate or --max is needed")?;
        Load::Rate(text.parse::<RateSpec>()?)
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = args
        .workers
        .unwrap_or(u32::try_from(cores).unwrap_or(1))
        .max(1);
    let nofile = throng_host::limits::raise_nofile().context("raising the open-file limit")?;
    // Each worker needs a file per connection, and a few of its own.
    let per_worker_cap = nofile
        .saturating_sub(throng_host::limits::DEFAULT_FD_RESERVE)
        .max(1);
    let mut max_connections = args.max_connections;
    if let Load::Max { connections } = load
        && connections > max_connections
    {
        anyhow::bail!(
            "--connections {connections} is over --max-connections {max_connections}; raise --max-connections"
        );
    }
    if max_connections.div_ceil(u64::from(workers)) > per_worker_cap {
        max_connections = per_worker_cap * u64::from(workers);
    }
    let settings = Settings {
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        keepalive: !args.no_keepalive,
        max_connections,
        ..Settings::default()
    };
    let pacer = match load {
        Load::Rate(spec) => Some(throng_load::attack::pacer(spec, duration, args.requests)?),
        Load::Max { .. } => None,
    };
    let planned = pacer
        .map(|p| throng_load::attack::planned(&p, duration, args.requests))
        .and_then(|n| n);

    // Every default that matters, before anything happens.
    let json = args.format == "json";
    let say = |line: String| {
        if json {
            eprintln!("{line}")
        } else {
            println!("{line}")
        }
    };
    let first = &targets[0];
    let more = if targets.len() > 1 {
        format!(" (+{} more targets, taken in turn)", targets.len() - 1)
    } else {
        String::new()
    };
    say(format!(
        "throng attack {} {}{more}",
        first.method, first.url
    ));
    let span = match (duration, args.requests) {
        (Some(d), Some(n)) => format!("for {d:?} or {n} requests, whichever ends first"),
        (Some(d), None) => format!("for {d:?}"),
        (None, Some(n)) => format!("{n} requests"),
        (None, None) => String::new(),
    };
    match load {
        Load::Rate(spec) => say(format!(
            "  rate {spec} (open model) {span}: {} requests planned",
            planned.map_or("?".to_owned(), |n| n.to_string())
        )),
        Load::Max { connections } => say(format!(
            "  closed pool of {connections} connections (--max) {span}"
        )),
    }
    say(format!(
        "  TIMEOUT {} per request, connect included (--timeout{}); later answers count as error 'timeout'",
        fmt_duration(timeout),
        if timeout == DEFAULT_TIMEOUT {
            ", the default"
        } else {
            ""
        }
    ));
    say(format!(
        "  workers {workers}; max connections {max_connections} over all workers; keep-alive {}; open-file limit {nofile}/process",
        if settings.keepalive {
            "on"
        } else {
            "off (--no-keepalive)"
        }
    ));
    let tls = args.tls.options(targets.iter().any(|t| t.url.tls), &say)?;
    say(format!(
        "  latency from each request's intended start; 'late' = started more than {} ms behind schedule",
        LATE_US / 1000
    ));
    if let Some(o) = &args.output {
        say(format!("  results to {}", o.display()));
    }
    if let Some(p) = &args.per_request {
        let format = RowFormat::for_path(p);
        say(format!(
            "  per-request rows to {} ({format:?})",
            p.display()
        ));
        let head = if format == RowFormat::Csv {
            CSV_HEADER
        } else {
            ""
        };
        std::fs::write(p, head).with_context(|| format!("creating {}", p.display()))?;
    }
    if args.max_error_rate.is_some() || max_p99.is_some() {
        say(format!(
            "  thresholds: error rate <= {}, p99 latency <= {}",
            args.max_error_rate
                .map_or("-".to_owned(), |r| r.to_string()),
            max_p99.map_or("-".to_owned(), fmt_duration)
        ));
    }

    let progress = if args.quiet {
        Progress::Quiet
    } else if (json && std::io::stderr().is_terminal())
        || (!json && std::io::stdout().is_terminal())
    {
        Progress::Tty
    } else {
        Progress::Lines
    };
    let header = args.output.as_ref().map(|_| {
        throng_report::format::Header::new(
            std::env::args().collect(),
            serde_json::json!({
                "subcommand": "attack",
                "targets": targets.iter().map(|t| format!("{} {}", t.method, t.url)).collect::<Vec<_>>(),
                "load": match load {
                    Load::Rate(spec) => serde_json::json!({"rate": spec.to_string()}),
                    Load::Max { connections } => serde_json::json!({"max": true, "connections": connections}),
                },
                "duration_s": duration.map(|d| d.as_secs_f64()),
                "requests": args.requests,
                "planned": planned,
                "workers": workers,
                "settings": settings,
                "tls": tls,
                "late_threshold_us": LATE_US,
            }),
        )
    });
    let plan = WorkerPlan {
        index: 0,
        workers,
        label: String::new(),
        load,
        duration_ns: duration.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        requests: args.requests,
        targets,
        addrs,
        start_unix_ns: 0,
        settings,
        per_request: args.per_request.clone(),
        tls,
    };
    let exe = std::env::current_exe().context("finding this program to start workers")?;
    let worker_command = move || {
        let mut c = Command::new(&exe);
        c.args(["attack", "--worker"]);
        c
    };
    let run = AttackRun {
        plan,
        planned,
        output: args.output,
        header,
        progress,
        progress_to_stderr: json,
    };
    let summary = supervisor::run(run, &worker_command).context("attack")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", supervisor::render(&summary));
    }
    let max_p99_us = max_p99.map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let failed = supervisor::check(&summary, args.max_error_rate, max_p99_us);
    for f in &failed {
        eprintln!("throng attack: threshold passed: {f}");
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The targets: a file (or stdin), or one `--url`.
fn read_targets(args: &Args) -> anyhow::Result<Vec<Target>> {
    let defaults = args
        .headers
        .iter()
        .map(|h| targets::parse_header(h).map_err(|e| anyhow::anyhow!("-H {h:?}: {e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut list = match (&args.targets, &args.url) {
        (Some(path), _) => {
            if args.body.is_some() || args.body_file.is_some() || args.method.is_some() {
                anyhow::bail!(
                    "--body, --body-file and --method go with --url; a targets file says these per target"
                );
            }
            targets::read(path)?
        }
        (None, Some(url)) => {
            let body = match (&args.body, &args.body_file) {
                (Some(b), _) => b.clone().into_bytes(),
                (None, Some(p)) => std::fs::read(p)
                    .with_context(|| format!("reading --body-file {}", p.display()))?,
                (None, None) => Vec::new(),
            };
            let method = match &args.method {
                Some(m) => m.to_ascii_uppercase(),
                None if body.is_empty() => "GET".to_owned(),
                None => "POST".to_owned(),
            };
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                anyhow::bail!("--method {method:?} is not an HTTP method");
            }
            vec![Target {
                method,
                url: HttpUrl::parse(url)?,
                headers: Vec::new(),
                body,
            }]
        }
        (None, None) => anyhow::bail!("give --url URL or --targets FILE"),
    };
    for t in &mut list {
        t.add_defaults(&defaults);
    }
    Ok(list)
}

fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}
