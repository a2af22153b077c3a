//! `throng attack`: HTTP load at a set request rate (open model) or the most
//! a closed pool of connections can do, measured without coordinated omission.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use throng_host::units::parse_duration;
use throng_load::attack::record::RowFormat;
use throng_load::attack::targets::{Flags, Holding, TargetFormat, Targets};
use throng_load::attack::{self, Load};
use throng_load::harness::progress::Progress;
use throng_load::pacer::RateSpec;
use throng_load::threshold::Threshold;

/// What `attack` writes on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AttackFormat {
    /// The summary as text.
    Text,
    /// The summary as one JSON document.
    Json,
    /// Vegeta's JSON results, one per request.
    Vegeta,
}

/// Arguments of `throng attack`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  throng attack --url http://127.0.0.1:8080/ping --rate 2000/s --duration 30s
  throng attack --url http://127.0.0.1:8080/ping -H 'sleep: 5000' \\
      --rate 2000/s --duration 1m --timeout 10s
  throng attack --targets targets.txt --rate 100/s..5000/s --duration 2m \\
      --output run.jsonl
  throng attack --url http://127.0.0.1:8080/ping \\
      --rate 0/s..1000/s@30s,1000/s@5m,1000/s..0/s@30s
  throng attack --url http://127.0.0.1:8080/ping --max --connections 64 \\
      --duration 10s
  throng attack --url https://localhost:8443/ping --tls-ca ca.pem \\
      --rate 1000/s --duration 10s --no-keepalive
  throng attack --url http://127.0.0.1:8080/ping --rate 1000/s --duration 30s \\
      --format vegeta | vegeta report
  throng attack --url https://localhost:8443/ping --tls-ca ca.pem --http2 \\
      --max-streams 100 --rate 20k/s --duration 30s
  cat targets.txt | throng attack --targets - --rate 500/s \\
      --requests 10000 --max-p99 200ms
  throng attack --targets huge.json --lazy --rate 5k/s

Targets file (Vegeta's text format, or its JSON format one target a line;
requests take the targets in turn, request i target i % targets). Every
target the run uses is checked before it starts (a run that plans N requests
reads no more than N). Up to 10,000 targets (16 MiB) are held in memory; past
that each worker reads the file as the run takes its targets, going round it,
and holds only those of its requests in flight (--lazy: each target once, as
Vegeta's -lazy). From stdin, or with --agents, every target is held, up to
256 MiB:
  GET http://127.0.0.1:8080/ping
  sleep: 1000

  POST http://127.0.0.1:8080/ping
  Content-Type: application/json
  @body.json

  {\"method\":\"GET\",\"url\":\"http://127.0.0.1:8080/ping\",\"header\":{\"sleep\":[\"1000\"]}}

Open model: request i is due at a time fixed by --rate before the run
starts. Its latency counts from that intended time, so a server that stalls
cannot hide its stall by slowing the generator down; the service time (from
the actual start) is kept beside it. When the generator itself falls
behind, it still sends every request and reports its lag and the requests it
started late.

Thresholds (exit 1 names every one that failed):
  throng attack --url http://127.0.0.1:8080/ping --rate 1000/s --duration 1m \\
      --threshold 'p99<100ms' --threshold 'error_rate<0.1%' \\
      --threshold 'rate>=990/s' --abort-on-fail

Exit status: 0 ok, 1 a threshold failed (--threshold, --max-error-rate, --max-p99,
--max-lag), 2 bad arguments or a failed run.")]
pub(crate) struct Args {
    #[command(flatten)]
    target: TargetArgs,

    /// Requests per second: 2000/s, 5k/s, a linear ramp 100/s..5000/s over the
    /// duration, or stages RATE[..RATE]@TIME,... (ramp up, hold, ramp down:
    /// 0/s..1000/s@30s,1000/s@5m,1000/s..0/s@30s), which set the duration.
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

    /// Final summary as text or json (JSON on stdout; progress then goes to
    /// stderr); or vegeta: Vegeta's JSON results on stdout, one line per
    /// request (`| vegeta report`, `vegeta plot`, `vegeta encode`), with the
    /// progress and the summary on stderr. Each result carries its response's
    /// headers and body (base64, up to 1 MiB) over HTTP/1.1; over HTTP/2 they
    /// are null (only the status is decoded).
    #[arg(long, value_enum, default_value_t = AttackFormat::Text)]
    format: AttackFormat,

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

    /// Exit 1 unless FIGURE OP VALUE holds at the end (repeatable), k6's way:
    /// 'p99<100ms', 'p99.9<1s', 'error_rate<0.1%', 'rate>=900/s', 'errors==0',
    /// 'connect_p99<1s'. Figures: p50 p75 p90 p95 p99 p99.9 mean min max (of
    /// latency), the same of service_, lag_, connect_, tls_ (lag_max<1s),
    /// error_rate, success_ratio, rate, throughput, requests, errors,
    /// timeouts, late, retried. --max-error-rate R is error_rate<=R, --max-p99
    /// D is p99<=D, --max-lag D is lag_max<=D.
    #[arg(long, value_name = "EXPR", value_parser = attack_threshold)]
    threshold: Vec<Threshold>,

    /// Stop the run as soon as a threshold can no longer pass: a count
    /// already over its bound (errors==0 after an error), a max already
    /// passed, or with a planned request count (--rate with --requests or
    /// --duration) an error_rate, success_ratio or percentile whose budget of
    /// failed or slow requests is already spent. The start lines say which.
    #[arg(long)]
    abort_on_fail: bool,

    /// Vegeta's -lazy: send each target of --targets once, in turn, and end
    /// the run after the last (with --requests or --duration, whichever
    /// comes first). A file is read as the run takes its targets, never
    /// held whole (a large one is read so without this flag too, but
    /// cycled); stdin is read to its end first and held, up to 256 MiB.
    #[arg(long)]
    lazy: bool,

    #[command(flatten)]
    http2: Http2Args,

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
    if args.lazy && args.target.targets.is_none() {
        anyhow::bail!(
            "--lazy sends each target of a targets file once: it goes with --targets FILE"
        );
    }
    let holding = if args.agents.given() {
        Holding::All
    } else if args.lazy {
        Holding::Lazy
    } else {
        Holding::Auto
    };
    let targets = args.target.targets(requests_needed(&args), holding)?;
    // Vegeta's -lazy: each target once, and the run ends with the last.
    let requests = match args.requests {
        Some(n) if args.lazy => Some(n.min(targets.count())),
        None if args.lazy => Some(targets.count()),
        n => n,
    };
    let load = match (args.max, args.rate) {
        (true, _) => Load::Max {
            connections: args.connections,
        },
        (false, Some(spec)) => Load::Rate(spec),
        // Invariant: `missing` refused a run with neither.
        (false, None) => anyhow::bail!("--rate or --max is needed"),
    };
    let json = args.format == AttackFormat::Json;
    let vegeta = args.format == AttackFormat::Vegeta;
    let (per_request, per_request_format) = per_request(&args)?;
    let progress = Progress::choose(args.client.quiet, json || vegeta);
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
            tls: args.client.tls.options(targets.any_tls())?,
            targets: targets.list,
            lazy: targets.lazy,
            load,
            duration: args.duration,
            requests,
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
            per_request,
            max_error_rate: args.max_error_rate,
            max_p99: args.max_p99,
            max_lag: args.max_lag,
            progress,
            per_request_format,
            thresholds: args.threshold,
            abort_on_fail: args.abort_on_fail,
            http2: args.http2.streams(),
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
    if vegeta {
        // stdout holds the results: the summary goes beside the progress.
        eprint!("{}", attack::render(&summary));
        for f in &failed {
            eprintln!("throng attack: threshold failed: {f}");
        }
        return Ok(if failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    super::agent::conclude(
        json.then(|| serde_json::to_value(&summary)).transpose()?,
        || attack::render(&summary),
        summary.start_unix_ns,
        agents.as_deref(),
        failed,
        "throng attack: threshold failed: ",
    )
}

/// Where per-request rows go, and how: `--per-request FILE`, or with
/// `--format vegeta` Vegeta's results on this process's stdout (which the
/// workers open by its /proc name: their own stdout carries their records).
fn per_request(args: &Args) -> anyhow::Result<(Option<PathBuf>, Option<RowFormat>)> {
    if args.format != AttackFormat::Vegeta {
        return Ok((args.per_request.clone(), None));
    }
    if args.per_request.is_some() {
        anyhow::bail!(
            "--format vegeta writes one result per request on stdout already; leave out --per-request (or use --format text with --per-request FILE)"
        );
    }
    let stdout = PathBuf::from(format!("/proc/{}/fd/1", std::process::id()));
    Ok((Some(stdout), Some(RowFormat::Vegeta)))
}

/// The requests the run will send at most, when known before it starts: a
/// rate's schedule over the duration (or --requests), or --requests alone.
fn requests_needed(args: &Args) -> Option<u64> {
    match (args.max, args.rate) {
        (false, Some(spec)) => {
            let duration = match spec {
                RateSpec::Stages(st) if args.duration.is_none() => Some(st.total()),
                _ => args.duration,
            };
            let pacer = attack::pacer(spec, duration, args.requests).ok()?;
            attack::planned(&pacer, duration, args.requests)
        }
        _ => args.requests,
    }
}

/// `--threshold`: one expression on attack's figures.
fn attack_threshold(text: &str) -> Result<Threshold, String> {
    Threshold::parse(text, &attack::summary::FIGURES).map_err(|e| e.to_string())
}

/// HTTP/2; `attack`'s and `knee attack`'s.
#[derive(Debug, clap::Args)]
pub(crate) struct Http2Args {
    /// Speak HTTP/2: ALPN h2 on https:// (a server that does not choose h2
    /// fails the connection), prior knowledge (h2c) on http://. Many requests
    /// go at once on each connection, as streams; a request due when every
    /// stream is busy waits for one, its latency counted from its intended time.
    #[arg(long)]
    http2: bool,

    /// With --http2: streams open at once per connection, at most (the
    /// server's SETTINGS_MAX_CONCURRENT_STREAMS may allow fewer). More
    /// connections open, up to --max-connections, when all are busy; with
    /// --max each of the --connections keeps this many requests in flight.
    #[arg(long, value_name = "N", default_value_t = attack::request::DEFAULT_MAX_STREAMS, requires = "http2")]
    max_streams: u32,
}

impl Http2Args {
    /// Streams per connection under --http2; `None`: HTTP/1.1.
    pub(crate) fn streams(&self) -> Option<u32> {
        self.http2.then_some(self.max_streams)
    }
}

/// What to request: a targets file, or one URL with its method, headers
/// and body; `attack`'s and `knee attack`'s.
#[derive(Debug, clap::Args)]
pub(crate) struct TargetArgs {
    /// Targets file in Vegeta's text or JSON format ('-' for stdin), read line
    /// by line and no further than the targets the run's planned requests use,
    /// every one checked before the run. Up to 10,000 targets (16 MiB) are held
    /// in memory; a larger file is read by each worker as the run takes its
    /// targets (request i takes target i % targets, as when held). From stdin
    /// (which cannot be read twice) or with --agents, every target is held, up
    /// to 256 MiB.
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

    /// The targets file's format (Vegeta's -format): http (its text format),
    /// json (one {"method","url","header":{"Name":["value"]},"body":"<base64>"}
    /// per line), or auto: JSON when the first line starts with '{'.
    #[arg(long, value_name = "FORMAT", default_value = "auto")]
    targets_format: TargetFormat,
}

impl TargetArgs {
    /// The targets these flags name, read (a targets file, no further than
    /// the `limit` targets a run of that many requests uses) and checked.
    pub(crate) fn targets(&self, limit: Option<u64>, holding: Holding) -> anyhow::Result<Targets> {
        Ok(Flags {
            file: self.targets.clone(),
            url: self.url.clone(),
            method: self.method.clone(),
            headers: self.headers.clone(),
            body: self.body.clone(),
            body_file: self.body_file.clone(),
            format: self.targets_format,
            limit,
            holding,
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
    let stages = matches!(args.rate, Some(RateSpec::Stages(_)));
    if args.duration.is_none() && args.requests.is_none() && !stages && !args.lazy {
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
