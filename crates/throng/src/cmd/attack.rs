//! `throng attack`: HTTP load at a set request rate (open model) or the most
//! a closed pool of connections can do, measured without coordinated omission.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use throng_host::units::parse_duration;
use throng_load::attack::targets::Flags;
use throng_load::attack::{self, Load};
use throng_load::harness::progress::Progress;
use throng_load::pacer::RateSpec;

use super::Format;

/// Arguments of `throng attack`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  throng attack --url http://127.0.0.1:8080/ping --rate 2000/s --duration 30s
  throng attack --url http://127.0.0.1:8080/ping -H 'sleep: 5000' \\
      --rate 2000/s --duration 1m --timeout 10s
  throng attack --targets targets.txt --rate 100/s..5000/s --duration 2m \\
      --output run.jsonl
  throng attack --url http://127.0.0.1:8080/ping --max --connections 64 \\
      --duration 10s
  throng attack --url https://localhost:8443/ping --tls-ca ca.pem \\
      --rate 1000/s --duration 10s --no-keepalive
  cat targets.txt | throng attack --targets - --rate 500/s \\
      --requests 10000 --max-p99 200ms

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

Exit status: 0 ok, 1 a --max-error-rate, --max-p99 or --max-lag threshold was passed,
2 bad arguments or a failed run.")]
pub(crate) struct Args {
    #[command(flatten)]
    target: TargetArgs,

    /// Requests per second: 2000/s, 5k/s, or a linear ramp 100/s..5000/s over the duration.
    #[arg(short, long)]
    rate: Option<RateSpec>,

    /// Closed model instead of a rate: --connections connections, each sending its
    /// next request as soon as the last one ends (the most the server gives; wrk's mode).
    #[arg(long, conflicts_with = "rate")]
    max: bool,

    /// Connections of the closed pool (--max).
    #[arg(short, long, default_value_t = 64)]
    connections: u64,

    /// How long to start requests for (30s, 5m).
    #[arg(short, long, value_parser = parse_duration)]
    duration: Option<Duration>,

    /// Requests in all (with --duration too: whichever ends first).
    #[arg(short = 'n', long)]
    requests: Option<u64>,

    /// Worker processes. Default: one per core, or more when --max-connections needs
    /// more processes under the open-file limit.
    #[arg(short, long)]
    workers: Option<u32>,

    /// Connections open at once over all workers, idle keep-alive ones included;
    /// at the limit a request waits for a free connection (and that wait is in its latency).
    /// The workers are as many as this needs under the open-file limit.
    #[arg(long, default_value_t = 10_000)]
    max_connections: u64,

    /// Source addresses: a range 127.0.0.2-127.0.0.60 and/or a comma list. Default on
    /// loopback: as many of 127.0.0.2.. as --max-connections needs local ports for (at
    /// least 1); elsewhere the kernel picks.
    #[arg(long, value_name = "LIST")]
    source_ips: Option<String>,

    /// Reuse connections (HTTP/1.1 keep-alive): the default.
    #[arg(long, overrides_with = "no_keepalive")]
    keepalive: bool,

    /// Open a new connection for every request (sends Connection: close).
    #[arg(long, overrides_with = "keepalive")]
    no_keepalive: bool,

    /// Per request, connect included; a later answer counts as error 'timeout'.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    timeout: Duration,

    /// Append per-second results (throng result-file format) to FILE; read with `throng report`.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Write one row per request to FILE: CSV if it ends in .csv, else JSON lines.
    #[arg(long, value_name = "FILE")]
    per_request: Option<PathBuf>,

    /// Final summary as text or json (JSON on stdout; progress then goes to stderr).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// Exit 1 when more than this fraction of requests fail (errors and non-2xx/3xx), e.g. 0.01.
    #[arg(long, value_name = "FRACTION")]
    max_error_rate: Option<f64>,

    /// Exit 1 when the p99 latency (from the intended start) is above this, e.g. 250ms.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    max_p99: Option<Duration>,

    /// Exit 1 when a request starts more than this behind its schedule, e.g. 1s: the
    /// harness fell behind, so the load it made was not the load asked for. Lateness
    /// is in the latency either way (measured from the intended start); this says
    /// whether the run itself kept up. Every run reports its largest lag and how many
    /// requests started more than 10 ms late.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    max_lag: Option<Duration>,

    #[command(flatten)]
    client: super::client::ClientArgs,

    #[command(flatten)]
    agents: super::agent::RunArgs,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.client.worker {
        attack::run_worker().context("worker")?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(what) = missing(&args) {
        anyhow::bail!("{what}");
    }
    let targets = args.target.targets()?;
    let load = match (args.max, args.rate) {
        (true, _) => Load::Max {
            connections: args.connections,
        },
        (false, Some(spec)) => Load::Rate(spec),
        // Invariant: `missing` refused a run with neither.
        (false, None) => anyhow::bail!("--rate or --max is needed"),
    };
    let json = args.format == Format::Json;
    let progress = Progress::choose(args.client.quiet, json);
    let (remote, agents) = args
        .agents
        .attack(
            args.max_connections,
            attack::Settings::default().interval_ns,
            args.workers.is_some() || args.source_ips.is_some(),
        )?
        .unzip();
    let mut prepared = attack::prepare_on(
        attack::Request {
            command_line: std::env::args().collect(),
            tls: args.client.tls.options(targets.iter().any(|t| t.url.tls))?,
            targets,
            load,
            duration: args.duration,
            requests: args.requests,
            workers: args.workers,
            max_connections: args.max_connections,
            sources: args
                .source_ips
                .as_deref()
                .map(throng_load::hold::target::parse_sources)
                .transpose()?,
            keepalive: !args.no_keepalive,
            timeout: args.timeout,
            output: args.output,
            per_request: args.per_request,
            max_error_rate: args.max_error_rate,
            max_p99: args.max_p99,
            max_lag: args.max_lag,
            progress,
        },
        remote,
    )?;
    if let Some(m) = args.client.metrics()? {
        prepared.serve_metrics(m);
    }
    for line in prepared.lines() {
        progress.say(line);
    }
    let (summary, failed) = prepared.run().context("attack")?;
    super::agent::conclude(
        json.then(|| serde_json::to_value(&summary)).transpose()?,
        || attack::render(&summary),
        summary.start_unix_ns,
        agents.as_deref(),
        failed,
        "throng attack: threshold passed: ",
    )
}

/// What to request: a targets file, or one URL with its method, headers
/// and body; `attack`'s and `knee attack`'s.
#[derive(Debug, clap::Args)]
pub(crate) struct TargetArgs {
    /// Targets file in Vegeta's format ('-' for stdin).
    #[arg(short, long, value_name = "FILE", conflicts_with = "url")]
    pub(crate) targets: Option<PathBuf>,

    /// One target URL (http://HOST:PORT/PATH or https://...) instead of a targets file.
    #[arg(short, long)]
    pub(crate) url: Option<String>,

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
}

impl TargetArgs {
    /// The targets these flags name, read (a targets file) and checked.
    pub(crate) fn targets(&self) -> anyhow::Result<Vec<attack::targets::Target>> {
        Ok(Flags {
            file: self.targets.clone(),
            url: self.url.clone(),
            method: self.method.clone(),
            headers: self.headers.clone(),
            body: self.body.clone(),
            body_file: self.body_file.clone(),
        }
        .targets()?)
    }
}

/// What a run needs and `args` lacks, said in a user's terms (clap's
/// "required" list cannot say "one of these, or that"); `None` when
/// nothing is missing.
fn missing(args: &Args) -> Option<String> {
    let mut lines = Vec::new();
    if args.target.url.is_none() && args.target.targets.is_none() {
        lines.push(
            "  what to request: --url URL (one target), or --targets FILE (a targets file, - for stdin)",
        );
    }
    if args.rate.is_none() && !args.max {
        lines.push(
            "  how hard: --rate RATE (2000/s, or a ramp 100/s..5000/s), or --max (a closed pool of --connections, wrk's mode)",
        );
    }
    if args.duration.is_none() && args.requests.is_none() {
        lines.push(
            "  how long: --duration D (30s, 5m), or --requests N (or both: whichever ends first)",
        );
    }
    if lines.is_empty() {
        return None;
    }
    Some(format!(
        "throng attack needs to know\n{}\nfor example: throng attack --url http://127.0.0.1:8080/ping --rate 2000/s --duration 30s\n(throng attack --help shows more examples)",
        lines.join("\n")
    ))
}
