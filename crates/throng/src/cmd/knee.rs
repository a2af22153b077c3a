//! `throng knee`: find the tipping point by itself. Raises a load level by
//! level (attack's request rate, hold's connections, or the publish rate),
//! judges each level against a service objective, and reports the highest
//! level the target sustains, the first that fails and why.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use throng_host::units::{parse_count, parse_duration, parse_fraction, parse_rate, parse_size};
use throng_load::attack;
use throng_load::attack::targets::Holding;
use throng_load::harness::clock::millis;
use throng_load::harness::progress::Progress;
use throng_load::hold::mqtt::MqttOptions;
use throng_load::hold::target::{WsTarget, parse_sources};
use throng_load::hold::{self, Settings};
use throng_load::knee::{self, Load, Objective, PublishRequest, PublishSettings, SearchPlan};
use throng_load::pacer::RateSpec;
use throng_report::knee::render_text;

use super::Format;

/// Arguments of `throng knee`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
How the search goes: a coarse ramp of geometric steps from --from (times
--factor each) up to --to, each level run for --warmup and then measured for
--step-duration; at the first failing level, bisection between the last
passing and the first failing level until they are within --precision. The
levels that decide the answer (the last pass and the first failure) are run
--repeat times and a majority decides, because a shared machine is noisy. A
level that has already failed beyond doubt (too many answers over the
objective, too many errors) is stopped at once. The search never runs past
--to or --max-duration.

The generator checks itself at every level: when it fell behind its own
schedule and either ran out of CPU or the target answered fast from the
moment it actually sent, the level is the generator's, not the target's, and
the search says so (\"the generator saturated at X; the target's knee is above
X\") instead of reporting a false knee.

Exit status: 0 a knee was found within the range; 1 no knee (the target met
the objective up to --to, or failed at --from, or the generator saturated
first); 2 bad arguments, a failed run, or Ctrl-C (which stops the level
under way and prints what the search had found so far). With --threshold:
0 when every threshold holds, 1 when one fails (2 as before).

Examples:
  throng knee attack --url http://127.0.0.1:8080/ping --from 500/s --to 50k/s
  throng knee attack --url http://127.0.0.1:8080/ping -H 'sleep: 1000' --slo-p99 1.2s --from 1k/s --to 10k/s
  throng knee hold ws://127.0.0.1:8080/news --from 1000 --to 100k
  throng knee hold sse://127.0.0.1:8080/news --from 1000 --to 100k
  throng knee hold mqtt://127.0.0.1:1883/news --qos 1 --from 1000 --to 20k
  throng knee publish ws://127.0.0.1:8080/news --connections 2000 --from 10/s --to 5k/s")]
pub(crate) struct Args {
    #[command(subcommand)]
    mode: ModeArgs,
}

#[derive(Debug, clap::Subcommand)]
enum ModeArgs {
    /// Raise attack's request rate (HTTP or HTTPS; targets files, headers such as sleep/times).
    Attack(AttackArgs),
    /// Raise the connections hold opens and holds, publishing at each level (delivery is judged too).
    Hold(HoldArgs),
    /// Raise the publish rate to --connections held subscribers (messages/s × subscribers = deliveries/s).
    Publish(PublishArgs),
}

/// The search and the objective, the same in every mode.
#[derive(Debug, clap::Args)]
struct SearchArgs {
    /// The first level: a rate (attack 100/s, publish 10/s) or connections (hold 1000).
    #[arg(long, value_name = "LEVEL")]
    from: Option<String>,

    /// The last level, never exceeded: attack 50k/s, publish 10k/s, hold 100k.
    #[arg(long, value_name = "LEVEL")]
    to: Option<String>,

    /// Each ramp level is the one before times this.
    #[arg(long, default_value_t = 2.0)]
    factor: f64,

    /// Bisect until the first failing level is within this of the last passing one.
    #[arg(long, default_value = "5%", value_parser = parse_fraction)]
    precision: f64,

    /// Runs of each decisive level (the last pass, the first failure); a majority decides.
    #[arg(long, default_value_t = 3)]
    repeat: u32,

    /// How long each level is measured, after its warm-up.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    step_duration: Duration,

    /// How long each level runs before it is measured.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = parse_duration)]
    warmup: Duration,

    /// Pause between levels, for the target to drain what the last one left.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = parse_duration)]
    cooldown: Duration,

    /// The whole search ends by then; a level that would run past it is not started.
    #[arg(long, default_value = "15m", value_name = "DURATION", value_parser = parse_duration)]
    max_duration: Duration,

    /// Objective: the 99th percentile latency at most this (from each event's intended start).
    #[arg(long, default_value = "100ms", value_name = "DURATION", value_parser = parse_duration)]
    slo_p99: Duration,

    /// Objective: the 99.9th percentile at most this. Default: not judged.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    slo_p999: Option<Duration>,

    /// Objective: failures over attempts at most this: 0.1%, 1%, 0.001.
    #[arg(long, default_value = "0.1%", value_name = "FRACTION", value_parser = parse_fraction)]
    max_error_rate: f64,

    /// Where the result file (for throng report) and the HTML page go.
    #[arg(long, default_value = "knee-out", value_name = "DIR")]
    out_dir: PathBuf,

    /// The result as text, or JSON on stdout (progress then goes to stderr).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// No progress lines (the start lines and the result still print).
    #[arg(short, long)]
    quiet: bool,

    /// Plan the search on this machine (the largest level must fit) and print the
    /// plan, then exit without sending anything.
    #[arg(long)]
    dry_run: bool,

    /// A gate on what the search found, for CI (repeatable): 'knee>=5000/s'
    /// (attack, publish) or 'knee_connections>=100000' (hold), on the highest
    /// level the target met the objective at (the knee; without one, the highest
    /// level passed: --to when all did, 0 when none did). With thresholds the exit
    /// status is theirs: 0 when every one holds, 1 naming each that failed (2 still
    /// for bad arguments, a failed run or Ctrl-C).
    #[arg(long, value_name = "EXPR", value_parser = knee_threshold)]
    threshold: Vec<throng_load::threshold::Threshold>,

    /// Serve each level's live figures as Prometheus text on
    /// http://HOST:PORT/metrics (role "knee"; counters start again at each level).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listen: Option<std::net::SocketAddr>,

    #[command(flatten)]
    agents: super::agent::RunArgs,
}

/// `throng knee attack`.
#[derive(Debug, clap::Args)]
struct AttackArgs {
    #[command(flatten)]
    target: super::attack::TargetArgs,

    /// Worker processes. Default: one per core.
    #[arg(short, long)]
    workers: Option<u32>,

    /// Connections open at once over all workers; a request waits for a free one
    /// (the generator's own limit: past it, the generator is blamed).
    #[arg(long, default_value_t = 10_000)]
    max_connections: u64,

    /// Open a new connection for every request.
    #[arg(long)]
    no_keepalive: bool,

    /// Per request, connect included; a later answer counts as error
    /// 'timeout', at its timeout in the latency. The same default as attack's.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    timeout: Duration,

    #[command(flatten)]
    tls: super::client::TlsArgs,

    #[command(flatten)]
    http2: super::attack::Http2Args,

    #[command(flatten)]
    search: SearchArgs,
}

/// What `knee hold` and `knee publish` share: the subscribers and the publishing.
#[derive(Debug, clap::Args)]
struct HeldArgs {
    /// Target: ws://HOST:PORT/<channel> (or a port range, or wss://); Server-Sent Events
    /// subscribers with sse://HOST:PORT/<channel> (sses:// for TLS); MQTT subscribers with
    /// mqtt://HOST:PORT/<topic filter> (mqtts:// for TLS).
    #[arg(value_name = "URL")]
    url: String,

    /// Publish endpoint: http://HOST:PORT/publish/<channel>, https://..., redis[s]://HOST:PORT,
    /// or mqtt[s]://HOST:PORT/<topic>. Default: throng serve's, on the target's host and first
    /// port; for an mqtt:// target, the broker itself with the filter as the topic.
    #[arg(long, value_name = "URL")]
    publish: Option<String>,

    /// --publish https:// or rediss://: PEM file of the CA certificate(s) that signed the
    /// publish endpoint's certificate. Default: the system bundle.
    #[arg(long, value_name = "FILE")]
    publish_tls_ca: Option<PathBuf>,

    /// --publish https:// or rediss://: do not check the publish endpoint's certificate at all
    /// (trials with a self-signed certificate only).
    #[arg(long, conflicts_with = "publish_tls_ca")]
    publish_tls_insecure: bool,

    /// Publish calls in flight at most, one connection each (messages are due on a
    /// schedule; waiting for a free connection is the generator's lag).
    #[arg(long, default_value_t = 64, value_name = "N")]
    publish_connections: usize,

    /// Size of each published message.
    #[arg(long, default_value = "64", value_parser = parse_size)]
    message_size: usize,

    /// Redis channel prefix: messages go to <prefix><channel>.
    #[arg(long, default_value = "throng:")]
    redis_prefix: String,

    /// Objective: messages lost (over all subscribers, net of late arrivals) at most this.
    #[arg(long, default_value_t = 0, value_name = "N")]
    max_lost: u64,

    /// Source addresses: a range 127.0.0.2-127.0.0.60 and/or a comma list.
    #[arg(long, value_name = "LIST")]
    source_ips: Option<String>,

    /// Worker processes. Default: one per core, or more when the open-file limit needs it.
    #[arg(short, long)]
    workers: Option<u32>,

    /// TCP connect timeout.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    connect_timeout: Duration,

    /// Timeout of the WebSocket upgrade after TCP connect (sse://: of the 200 answer;
    /// mqtt://: of CONNECT and SUBSCRIBE to SUBACK).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    handshake_timeout: Duration,

    #[command(flatten)]
    tls: super::client::TlsArgs,

    #[command(flatten)]
    mqtt: super::hold::MqttArgs,

    #[command(flatten)]
    search: SearchArgs,
}

impl HeldArgs {
    /// The MQTT options, when the target or the publish endpoint is MQTT.
    fn mqtt_options(&self, target: &WsTarget) -> anyhow::Result<Option<MqttOptions>> {
        let publish_mqtt = self
            .publish
            .as_deref()
            .is_some_and(|p| p.starts_with("mqtt://") || p.starts_with("mqtts://"));
        self.mqtt.options(target.mqtt || publish_mqtt)
    }
}

/// `throng knee hold`.
#[derive(Debug, clap::Args)]
struct HoldArgs {
    /// New connections per second while a level opens. Default: the level over 5s (at least 100/s).
    #[arg(short, long, value_name = "RATE")]
    rate: Option<RateSpec>,

    /// Messages per second published at each level.
    #[arg(long, default_value = "1/s", value_parser = parse_rate)]
    publish_rate: f64,

    #[command(flatten)]
    held: HeldArgs,
}

/// `throng knee publish`.
#[derive(Debug, clap::Args)]
struct PublishArgs {
    /// Subscribers held at every level.
    #[arg(short = 'c', long, default_value = "1000", value_parser = parse_count)]
    connections: u64,

    /// New connections per second while the subscribers open. Default: all in 5s (at least 100/s).
    #[arg(short, long, value_name = "RATE")]
    rate: Option<RateSpec>,

    #[command(flatten)]
    held: HeldArgs,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (load, search, plan, max_lost) = match args.mode {
        ModeArgs::Attack(a) => {
            let plan = search_plan(&a.search, (100.0, 50_000.0), false)?;
            let holding = if a.search.agents.given() {
                Holding::All
            } else {
                Holding::Auto
            };
            (attack_load(&a, holding)?, a.search, plan, None)
        }
        ModeArgs::Hold(h) => {
            let plan = search_plan(&h.held.search, (1_000.0, 100_000.0), true)?;
            let load = Load::Hold {
                hold: hold_request(&h.held, 1, RateSpec::Constant(1.0))?,
                connect_rate: h.rate,
                publish: publish_settings(&h.held, h.publish_rate)?,
            };
            (load, h.held.search, plan, Some(h.held.max_lost))
        }
        ModeArgs::Publish(p) => {
            let plan = search_plan(&p.held.search, (10.0, 10_000.0), false)?;
            let rate = p
                .rate
                .unwrap_or_else(|| knee::modes::default_connect_rate(p.connections));
            let load = Load::Publish {
                hold: hold_request(&p.held, p.connections, rate)?,
                publish: publish_settings(&p.held, 1.0)?,
            };
            (load, p.held.search, plan, Some(p.held.max_lost))
        }
    };
    let json = search.format == Format::Json;
    let progress = Progress::choose(search.quiet, json);
    let objective = Objective {
        p99: Some(search.slo_p99),
        p999: search.slo_p999,
        max_error_rate: search.max_error_rate,
        max_lost,
    };
    let agents = search.agents.options(local_plan(&load))?;
    let mut prepared = knee::prepare(knee::Request {
        command_line: std::env::args().collect(),
        agents,
        load,
        objective,
        search: plan,
        step: search.step_duration,
        warmup: search.warmup,
        cooldown: search.cooldown,
        max_duration: search.max_duration,
        out_dir: search.out_dir,
        progress,
    })?;
    if let Some(addr) = search.metrics_listen {
        prepared.serve_metrics(throng_load::harness::metrics::Metrics::listen(addr)?);
    }
    for line in prepared.lines() {
        progress.say(line);
    }
    if let Some(line) = throng_load::threshold::start_line(&search.threshold, false) {
        progress.say(&line);
    }
    if search.dry_run {
        progress.say("dry run: the search fits this machine; nothing started");
        return Ok(ExitCode::SUCCESS);
    }
    let done = prepared.run().context("knee")?;
    if json {
        super::print(&format!("{}\n", serde_json::to_string_pretty(&done.knee)?))?;
    } else {
        super::print("\n")?;
        super::print(&render_text(&done.knee))?;
    }
    progress.say(&format!(
        "results: {} (throng report reads it); page: {}",
        done.results.display(),
        done.html.display()
    ));
    let code = done.knee.outcome.exit_code();
    if search.threshold.is_empty() || code == 2 {
        return Ok(ExitCode::from(code));
    }
    let failed = knee::gate::check(&done.knee, &search.threshold);
    for f in &failed {
        eprintln!("throng knee: FAIL: {f}");
    }
    Ok(ExitCode::from(u8::from(!failed.is_empty())))
}

/// `--threshold`: one expression on what the search found.
fn knee_threshold(text: &str) -> Result<throng_load::threshold::Threshold, String> {
    throng_load::threshold::Threshold::parse(text, &knee::gate::FIGURES).map_err(|e| e.to_string())
}

/// The search as asked, `--from`/`--to` with the mode's defaults:
/// connection counts when the levels are `whole`, else rates.
/// Whether workers or source addresses were given: with `--agents` they
/// are each agent's.
fn local_plan(load: &Load) -> bool {
    match load {
        Load::Attack(a) => a.workers.is_some() || a.sources.is_some(),
        Load::Hold { hold, .. } | Load::Publish { hold, .. } => {
            hold.workers.is_some() || hold.sources.is_some()
        }
    }
}

fn search_plan(s: &SearchArgs, (from, to): (f64, f64), whole: bool) -> anyhow::Result<SearchPlan> {
    let parse = |text: &Option<String>, flag: &str, default: f64| -> anyhow::Result<f64> {
        let Some(t) = text else { return Ok(default) };
        let level = if whole {
            parse_count(t).map(|n| n as f64)
        } else {
            parse_rate(t)
        };
        level.with_context(|| format!("{flag} {t}"))
    };
    Ok(SearchPlan {
        from: parse(&s.from, "--from", from)?,
        to: parse(&s.to, "--to", to)?,
        factor: s.factor,
        precision: s.precision,
        repeat: s.repeat,
        whole,
    })
}

fn attack_load(a: &AttackArgs, holding: Holding) -> anyhow::Result<Load> {
    let targets = a.target.targets(None, holding)?;
    Ok(Load::Attack(attack::Request {
        command_line: std::env::args().collect(),
        tls: a.tls.options(targets.any_tls())?,
        targets: targets.list,
        lazy: targets.lazy,
        // The knee sets the load and the span of each level.
        load: attack::Load::Rate(RateSpec::Constant(1.0)),
        duration: None,
        requests: None,
        workers: a.workers,
        // On loopback the harness picks source addresses for the connections.
        sources: None,
        max_connections: a.max_connections,
        keepalive: !a.no_keepalive,
        timeout: a.timeout,
        output: None,
        per_request: None,
        max_error_rate: None,
        max_p99: None,
        max_lag: None,
        progress: Progress::QUIET,
        per_request_format: None,
        thresholds: Vec::new(),
        abort_on_fail: false,
        http2: a.http2.streams(),
    }))
}

/// The hold of the subscribers, `connections` at `rate`.
fn hold_request(h: &HeldArgs, connections: u64, rate: RateSpec) -> anyhow::Result<hold::Request> {
    let target: WsTarget = h.url.parse()?;
    Ok(hold::Request {
        command_line: std::env::args().collect(),
        connections,
        rate,
        duration: None,
        sources: h.source_ips.as_deref().map(parse_sources).transpose()?,
        workers: h.workers,
        settings: Settings {
            connect_timeout_ms: millis(h.connect_timeout),
            handshake_timeout_ms: millis(h.handshake_timeout),
            ..Settings::default()
        },
        publish: None,
        tls: h.tls.options(target.tls)?,
        mqtt: h.mqtt_options(&target)?.filter(|_| target.mqtt),
        sessions: None,
        target,
        output: None,
        progress: Progress::QUIET,
        // The knee judges each level by its objective, not hold's thresholds.
        thresholds: hold::Thresholds::default(),
    })
}

/// Where and how each level publishes (`--publish` or its default: the
/// library's to choose).
fn publish_settings(h: &HeldArgs, rate: f64) -> anyhow::Result<PublishSettings> {
    let ws: WsTarget = h.url.parse()?;
    let (settings, warning) = PublishSettings::new(
        &ws,
        PublishRequest {
            url: h.publish.clone(),
            tls_ca: h.publish_tls_ca.clone(),
            tls_insecure: h.publish_tls_insecure,
            mqtt: h.mqtt_options(&ws)?,
            redis_prefix: h.redis_prefix.clone(),
            message_size: h.message_size,
            rate,
            connections: h.publish_connections,
        },
    )?;
    if let Some(w) = warning {
        eprintln!("throng: WARNING: {w}");
    }
    Ok(settings)
}
