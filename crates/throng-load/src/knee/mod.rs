//! `throng knee`: find the tipping point by itself. It runs a load at
//! rising levels (a series of `attack` or `hold` runs on the harness core,
//! one per level), judges each against a service objective while checking
//! the generator's own health, and reports the highest level the target
//! sustains, the first that fails and why, with every level's figures.
//!
//! - [`search`]: which level to run next (a geometric ramp, bisection,
//!   repeats of the decisive levels): a state machine without I/O;
//! - [`objective`]: the objective, the verdict on a level, and whom to
//!   blame (the target or the generator);
//! - [`modes`]: what rises (`attack`'s rate, `hold`'s connections, the
//!   publish rate) and how one level runs and is read;
//! - [`level`]: the role around one level's run (warm-up, the measured
//!   window, early stop, progress); [`publisher`]: the open-model publisher
//!   of the hold and publish modes;
//! - this module: the request, its checks and start lines ([`prepare`]),
//!   and the driver that runs the search, writes the result file and page.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;
use throng_host::units::fmt_duration;
use throng_report::format::{Event, Header, Writer};
use throng_report::knee::{self as report, Knee, Mode, Phase, Run, Verdict};
use throng_report::merge::{Merger, merge_files_into};
use throng_report::summary::Report;

use crate::agent::crew::{self, AgentsError};
use crate::attack::request::AttackError;
use crate::attack::{self};
use crate::harness::clock::now_unix_ns;
use crate::harness::metrics::Metrics;
use crate::harness::progress::{Mode as Shown, Progress};
use crate::hold::mqtt::MqttOptions;
use crate::hold::request::HoldError;
use crate::hold::target::{PublishTarget, TargetError, WsTarget};
use crate::hold::{self};
use crate::pacer::RateSpec;

pub mod gate;
pub mod level;
pub mod modes;
pub mod objective;
pub mod publisher;
pub mod search;

use modes::{Common, Plan};
pub use objective::Objective;
pub use search::{Search, SearchError, SearchPlan, Seen};

/// The default `--step-duration`.
pub const DEFAULT_STEP: Duration = Duration::from_secs(10);
/// The default `--warmup`.
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(2);
/// The default `--cooldown`.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(2);
/// The default `--max-duration`.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(15 * 60);
/// The default `--publish-connections`.
pub const DEFAULT_PUBLISH_CONNECTIONS: usize = 64;
/// The default `--timeout` of a level's requests: `attack`'s own, so that a
/// level and the same `attack` count the same requests as timed out (an
/// overloaded level is stopped early by its objective, not by the timeout).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = attack::DEFAULT_TIMEOUT;

/// What rises, as the command asks for it.
#[derive(Debug, Clone)]
// One per search: the size of its variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Load {
    /// `attack`'s request rate; the request is `attack`'s own (its load,
    /// duration and output are the knee's to set).
    Attack(attack::Request),
    /// `hold`'s connections (its count, rate, duration and output are the
    /// knee's to set), with a publish at `publish.rate` each level.
    Hold {
        /// The hold.
        hold: hold::Request,
        /// The connect rate (`None`: each level opened in [`modes::OPEN_IN`]).
        connect_rate: Option<RateSpec>,
        /// The publishing.
        publish: PublishSettings,
    },
    /// The publish rate to `hold.connections` subscribers.
    Publish {
        /// The hold of the subscribers (its rate: the connect rate).
        hold: hold::Request,
        /// The publishing (its rate is the level's).
        publish: PublishSettings,
    },
}

/// How a level publishes (hold and publish modes).
#[derive(Debug, Clone)]
pub struct PublishSettings {
    /// Where (`POST /publish/<channel>`, or Redis).
    pub target: PublishTarget,
    /// The Redis channel (`<prefix><channel>`); unused over HTTP.
    pub redis_channel: String,
    /// Bytes per message.
    pub message_size: usize,
    /// Messages per second (hold mode; the publish mode's level replaces it).
    pub rate: f64,
    /// Calls in flight at most, one connection each.
    pub connections: usize,
}

/// How a level publishes, as the command line asks for it: what
/// [`PublishSettings::new`] checks and completes.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    /// `--publish`; `None`: the default for the subscribers' target
    /// ([`default_publish_url`]).
    pub url: Option<String>,
    /// `--publish-tls-ca`.
    pub tls_ca: Option<PathBuf>,
    /// `--publish-tls-insecure`.
    pub tls_insecure: bool,
    /// The MQTT options, when the target or the publish endpoint is MQTT.
    pub mqtt: Option<MqttOptions>,
    /// Redis channel prefix: messages go to `<prefix><channel>`.
    pub redis_prefix: String,
    /// Bytes per message.
    pub message_size: usize,
    /// Messages per second.
    pub rate: f64,
    /// Calls in flight at most.
    pub connections: usize,
}

/// Why a level's publishing cannot be set up.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PublishError {
    /// An MQTT target's topic filter has wildcards, so no `--publish`
    /// default can be made from it.
    #[error(
        "the topic filter '{0}' has wildcards, so there is no one topic to publish to: \
         give --publish mqtt://HOST:PORT/<topic> (a topic it matches)"
    )]
    Wildcards(String),
    /// `--publish` does not parse.
    #[error("--publish {url}")]
    Url {
        /// The URL as given (or defaulted).
        url: String,
        /// Why it does not parse.
        #[source]
        why: TargetError,
    },
    /// The publish endpoint's TLS trust cannot be set up.
    #[error(transparent)]
    Trust(TargetError),
    /// `--publish-connections 0`.
    #[error("--publish-connections must be at least 1")]
    NoConnections,
}

/// The publish endpoint a level uses when `--publish` is not given: throng
/// serve's `POST /publish/<channel>` on the target's host and first port,
/// or for an MQTT target a PUBLISH on the broker to the topic it
/// subscribes to (which must then have no wildcards).
pub fn default_publish_url(ws: &WsTarget) -> Result<String, PublishError> {
    if ws.mqtt {
        if ws.channel().contains(['+', '#']) {
            return Err(PublishError::Wildcards(ws.channel().to_owned()));
        }
        return Ok(format!(
            "{}://{}/{}",
            if ws.tls { "mqtts" } else { "mqtt" },
            ws.host_header(ws.port(0)),
            ws.channel()
        ));
    }
    Ok(format!(
        "{}://{}/publish/{}",
        if ws.tls { "https" } else { "http" },
        ws.host_header(ws.port(0)),
        ws.channel()
    ))
}

impl PublishSettings {
    /// Where and how each level publishes to the subscribers of `ws`, as
    /// `req` asks; with the warning to show for `--publish-tls-insecure`.
    pub fn new(ws: &WsTarget, req: PublishRequest) -> Result<(Self, Option<String>), PublishError> {
        let url = match req.url {
            Some(u) => u,
            None => default_publish_url(ws)?,
        };
        let mut target: PublishTarget = match url.parse() {
            Ok(t) => t,
            Err(why) => return Err(PublishError::Url { url, why }),
        };
        if let (PublishTarget::Mqtt { options, .. }, Some(m)) = (&mut target, req.mqtt) {
            *options = m;
        }
        let warning = target
            .set_trust(req.tls_ca, req.tls_insecure)
            .map_err(PublishError::Trust)?;
        if req.connections == 0 {
            return Err(PublishError::NoConnections);
        }
        let settings = Self {
            target,
            redis_channel: format!("{}{}", req.redis_prefix, ws.channel()),
            message_size: req.message_size,
            rate: req.rate,
            connections: req.connections,
        };
        Ok((settings, warning))
    }
}

/// A knee search as the command line asks for it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The command line, for the result file.
    pub command_line: Vec<String>,
    /// What rises.
    pub load: Load,
    /// What every level must meet.
    pub objective: Objective,
    /// Where to search and how.
    pub search: SearchPlan,
    /// How long each level is measured.
    pub step: Duration,
    /// How long each level runs before it is measured.
    pub warmup: Duration,
    /// The pause between levels, for the target to drain.
    pub cooldown: Duration,
    /// The whole search ends by then.
    pub max_duration: Duration,
    /// Where the result file and the page go.
    pub out_dir: PathBuf,
    /// The live view.
    pub progress: Progress,
    /// Run every level on these agents (`--agents`) instead of here.
    pub agents: Option<crew::Options>,
}

/// Why a search cannot start, or stopped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KneeError {
    /// A setting that makes no search.
    #[error("{0}")]
    Setting(String),
    /// A range or search plan that makes no search.
    #[error(transparent)]
    Search(#[from] SearchError),
    /// The attack cannot run.
    #[error(transparent)]
    Attack(#[from] AttackError),
    /// The hold cannot run.
    #[error(transparent)]
    Hold(#[from] HoldError),
    /// Files, workers, the machine.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The agents cannot take a level (`--agents`). One lost during a
    /// level is that level's verdict, not an error.
    #[error(transparent)]
    Agents(#[from] AgentsError),
}

/// A search checked and planned, ready to run.
#[derive(Debug)]
pub struct Prepared {
    plan: Plan,
    common: Common,
    search: Search,
    req: Request,
    lines: Vec<String>,
    html: PathBuf,
}

/// What a finished search wrote.
#[derive(Debug)]
pub struct Finished {
    /// The search.
    pub knee: Knee,
    /// The result file (`throng report` reads it).
    pub results: PathBuf,
    /// The page.
    pub html: PathBuf,
}

/// Checks `req` and plans it on this machine: a search that cannot run
/// is refused now, with the flag to change.
pub fn prepare(req: Request) -> Result<Prepared, KneeError> {
    if req.step.is_zero() {
        return Err(KneeError::Setting(
            "--step-duration must be more than zero (each level is measured this long)".into(),
        ));
    }
    if req.max_duration.is_zero() {
        return Err(KneeError::Setting(
            "--max-duration must be more than zero".into(),
        ));
    }
    if req
        .agents
        .as_ref()
        .is_some_and(|o| o.per_agent_output.is_some())
    {
        // Each level would write the agents' files afresh, keeping the last only.
        return Err(KneeError::Setting(
            "--per-agent-output is for hold and attack; a knee search keeps every level, every agent's records included, in its one result file".into(),
        ));
    }
    let search = Search::new(req.search)?;
    let o = &req.objective;
    if o.p99.is_some_and(|d| d.is_zero()) || o.p999.is_some_and(|d| d.is_zero()) {
        return Err(KneeError::Setting(
            "a latency objective of zero can never be met; give e.g. --slo-p99 100ms".into(),
        ));
    }
    let (plan, mode_lines) = plan(&req)?;
    let stamp = throng_report::format::rfc3339(now_unix_ns()).replace([':', '-'], "");
    let results = req.out_dir.join(format!("knee-{stamp}.jsonl"));
    let html = req.out_dir.join(format!("knee-{stamp}.html"));
    let common = Common {
        objective: req.objective.clone(),
        warmup: req.warmup,
        step: req.step,
        results,
        command_line: req.command_line.clone(),
        metrics: None,
        agents: req.agents.clone(),
    };
    let lines = start_lines(&req, &plan, &search, &common, &html, mode_lines);
    Ok(Prepared {
        plan,
        common,
        search,
        req,
        lines,
        html,
    })
}

/// The mode's plan, checked once, and the lines it prints at start.
fn plan(req: &Request) -> Result<(Plan, Vec<String>), KneeError> {
    let span = req.warmup + req.step;
    Ok(match &req.load {
        Load::Attack(a) => {
            // On agents: checked now (found, same version, clocks, room);
            // each level is then a run of its own on them.
            let remote = match &req.agents {
                Some(o) => {
                    let interval_ns = attack::Settings::default().interval_ns;
                    Some(crew::attack(o.clone(), a.max_connections, interval_ns)?.0)
                }
                None => None,
            };
            let prepared = attack::prepare_on(
                attack::Request {
                    load: attack::Load::Rate(RateSpec::Constant(req.search.from)),
                    duration: Some(span),
                    requests: None,
                    output: None,
                    per_request: None,
                    max_error_rate: None,
                    max_p99: None,
                    max_lag: None,
                    progress: req.progress,
                    ..a.clone()
                },
                remote,
            )?;
            let lines = prepared.lines().to_vec();
            let (run, setup) = prepared.into_parts();
            (Plan::Attack { run, setup }, lines)
        }
        Load::Hold {
            hold: h,
            connect_rate,
            publish,
        } => {
            // The largest level must fit the machine; check it now.
            let top = req.search.to.round().max(1.0) as u64;
            let rate = connect_rate.unwrap_or_else(|| modes::default_connect_rate(top));
            let lines = held(req, h, Some((top, rate)))?.lines().to_vec();
            let plan = Plan::Hold {
                template: hold::Request {
                    progress: req.progress,
                    ..h.clone()
                },
                connect_rate: *connect_rate,
                publish: publish.clone(),
            };
            (plan, lines)
        }
        Load::Publish { hold: h, publish } => {
            if h.connections == 0 {
                return Err(KneeError::Setting(
                    "--connections must be at least 1 (the subscribers each message goes to)"
                        .into(),
                ));
            }
            let prepared = held(req, h, None)?;
            let lines = prepared.lines().to_vec();
            let (run, setup) = prepared.into_parts();
            let plan = Plan::Publish {
                run,
                setup,
                subscribers: h.connections,
                publish: publish.clone(),
            };
            (plan, lines)
        }
    })
}

/// `hold`'s plan of one level's connections (`connections` at `rate` when
/// given, else `h`'s own), checked against the machine: the knee publishes
/// and writes results itself, so the hold does neither.
fn held(
    req: &Request,
    h: &hold::Request,
    connections: Option<(u64, RateSpec)>,
) -> Result<hold::Prepared, KneeError> {
    let (connections, rate) = connections.unwrap_or((h.connections, h.rate));
    // On agents the largest level must fit them, not this machine.
    let remote = match &req.agents {
        Some(o) => Some(crew::hold(o.clone(), connections, &h.target, h.settings.interval_ns)?.0),
        None => None,
    };
    Ok(hold::prepare_on(
        hold::Request {
            connections,
            rate,
            duration: Some(req.warmup + req.step),
            publish: None,
            output: None,
            progress: req.progress,
            ..h.clone()
        },
        remote,
    )?)
}

fn start_lines(
    req: &Request,
    plan: &Plan,
    search: &Search,
    c: &Common,
    html: &Path,
    mode_lines: Vec<String>,
) -> Vec<String> {
    let mode = plan.mode();
    let s = &req.search;
    let lv = |v: f64| mode.level(v);
    // The mode's first line names what it loads: `throng attack GET http://...`.
    let target = mode_lines.first().map_or(String::new(), |l| {
        l.trim_start_matches("throng attack ")
            .trim_start_matches("throng hold ")
            .to_owned()
    });
    let mut out = vec![
        format!("throng knee {}: {target}", mode.name()),
        format!("  objective: {}", req.objective.lines().join(", ")),
        format!(
            "  search: {} to {}, a ramp of ×{} steps (--factor: {}), then bisection to within {} (--precision); \
             decisive levels run {} time(s) (--repeat), a majority decides; a level that fails beyond doubt stops early",
            lv(s.from),
            lv(s.to),
            s.factor,
            search
                .ramp()
                .iter()
                .map(|l| throng_report::text::count(*l))
                .collect::<Vec<_>>()
                .join(", "),
            objective::percent(s.precision),
            s.repeat
        ),
        format!(
            "  each level: {} warm-up (--warmup) + {} measured (--step-duration), {} pause between levels (--cooldown); \
             the whole search at most {} (--max-duration)",
            fmt_duration(req.warmup),
            fmt_duration(req.step),
            fmt_duration(req.cooldown),
            fmt_duration(req.max_duration)
        ),
        format!(
            "  the generator is blamed, not the target, when its lag p99 is over {} (or over {} of its events start that late) \
             and one of its processes used {:.0}% of a core or the latency from its actual send met the objective",
            throng_report::text::micros(objective::GENERATOR_LAG_US),
            objective::percent(objective::GENERATOR_LATE_SHARE),
            objective::GENERATOR_CPU * 100.0
        ),
    ];
    let first = s.from * req.step.as_secs_f64();
    if mode != Mode::Hold && first < 100.0 {
        out.push(format!(
            "  note: the first level measures about {first:.0} events; a p99 of fewer than 100 is their largest, \
             so one slow event fails it: a longer --step-duration or a higher --from makes it steadier"
        ));
    }
    match &req.load {
        Load::Hold {
            connect_rate,
            publish,
            ..
        } => {
            out.push(format!(
                "  each level opens its connections at {}, then publishes {}/s (--publish-rate) of {} B (--message-size) \
                 to {} over up to {} connections (--publish-connections), every message timestamped with its due time",
                connect_rate.map_or(
                    format!(
                        "the level / {} (at least 100/s; --rate)",
                        fmt_duration(modes::OPEN_IN)
                    ),
                    |r| format!("{r} (--rate)")
                ),
                publish.rate,
                publish.message_size,
                publish.target,
                publish.connections
            ));
        }
        Load::Publish { hold: h, publish } => {
            out.push(format!(
                "  each level holds {} subscribers (--connections, opened at {}: --rate), then publishes messages of {} B \
                 (--message-size) at the level's rate to {} over up to {} connections (--publish-connections), \
                 every message timestamped with its due time",
                h.connections,
                h.rate,
                publish.message_size,
                publish.target,
                publish.connections
            ));
        }
        Load::Attack(_) => {}
    }
    out.push(format!(
        "  results to {} and {}",
        c.results.display(),
        html.display()
    ));
    out.push(format!(
        "  each level runs this {} (shown at {}):",
        mode.name(),
        match mode {
            Mode::Hold => "the largest level, which must fit this machine",
            Mode::Attack | Mode::Publish => "the first level",
        }
    ));
    out.extend(mode_lines.into_iter().map(|l| format!("  {l}")));
    out
}

impl Prepared {
    /// What will run, every default that matters, one line each.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// Serves every level's live figures on `metrics` (`--metrics-listen`),
    /// and says where in the start lines.
    pub fn serve_metrics(&mut self, metrics: Metrics) {
        self.lines.push(metrics.line());
        self.common.metrics = Some(metrics);
    }

    /// Runs the search to its end; writes the result file and the page.
    pub fn run(mut self) -> Result<Finished, KneeError> {
        // Made here, not in `prepare`: a plan only printed leaves no folder.
        std::fs::create_dir_all(&self.req.out_dir).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot create {}: {e}", self.req.out_dir.display()),
            )
        })?;
        let mode = self.plan.mode();
        let begun = Instant::now();
        let settings = serde_json::json!({
            "subcommand": "knee",
            "mode": mode.name(),
            "objective": self.req.objective.lines(),
            "search": {
                "from": self.req.search.from, "to": self.req.search.to,
                "factor": self.req.search.factor, "precision": self.req.search.precision,
                "repeat": self.req.search.repeat,
            },
            "step_s": self.req.step.as_secs_f64(),
            "warmup_s": self.req.warmup.as_secs_f64(),
            "cooldown_s": self.req.cooldown.as_secs_f64(),
            "max_duration_s": self.req.max_duration.as_secs_f64(),
        });
        Writer::create(
            &self.common.results,
            &Header::new(self.req.command_line.clone(), settings),
        )
        .map_err(io::Error::other)?;
        let say = |line: &str| {
            if self.req.progress.mode != Shown::Quiet {
                self.req.progress.say(line);
            }
        };
        let mut runs: Vec<Run> = Vec::new();
        let outcome = loop {
            let (level, phase) = match self.search.next() {
                search::Step::Done(o) => break o,
                search::Step::Run { level, phase } => (level, phase),
            };
            let estimate = self.plan.estimate(level, &self.common);
            if begun.elapsed() + estimate > self.req.max_duration {
                say(&format!(
                    "throng knee: the next level ({}, about {}s) would run past --max-duration {}; stopping",
                    mode.level(level),
                    estimate.as_secs(),
                    fmt_duration(self.req.max_duration)
                ));
                break self.search.cut_short();
            }
            let n = runs.len() as u32 + 1;
            let title = format!("run {n} · {} · {}", mode.level(level), phase_word(phase));
            say(&format!(
                "{title}: {} warm-up + {} measured",
                fmt_duration(self.req.warmup),
                fmt_duration(self.req.step)
            ));
            let header = serde_json::json!({
                "subcommand": "knee", "mode": mode.name(), "run": n,
                "level": level, "phase": phase_word(phase),
            });
            let seen = self.plan.run_level(level, &title, header, &self.common)?;
            let (verdict, reasons) = judge(&self.common.objective, &seen);
            let run = row(n, level, phase, &seen, verdict, reasons);
            say(&format!("{title}: {}", verdict_line(&run, mode)));
            let clear = seen.failed_early.is_some() && verdict == Verdict::Fail;
            if !seen.interrupted {
                self.search.record(
                    level,
                    match verdict {
                        Verdict::Pass => Seen::Pass,
                        Verdict::Fail => Seen::Fail { clear },
                        Verdict::Generator => Seen::Generator,
                    },
                );
            }
            runs.push(run);
            if seen.interrupted {
                break self.search.interrupted();
            }
            if matches!(self.search.next(), search::Step::Run { .. })
                && !self.req.cooldown.is_zero()
                && cool_down(self.req.cooldown)
            {
                break self.search.interrupted();
            }
        };
        let knee = Knee {
            mode,
            target: self
                .lines
                .first()
                .and_then(|l| l.split_once(": "))
                .map_or(String::new(), |(_, t)| t.to_owned()),
            objective: self.req.objective.lines(),
            slo_p99_us: self.req.objective.p99.map(crate::harness::clock::micros),
            slo_p999_us: self.req.objective.p999.map(crate::harness::clock::micros),
            search: search_lines(&self.req),
            runs,
            outcome,
            elapsed_s: begun.elapsed().as_secs_f64(),
        };
        write_result(&self.common.results, &self.req.command_line, &knee)?;
        let page = report::render_html(&knee, over_time(&self.common.results).as_ref());
        std::fs::write(&self.html, page).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot write {}: {e}", self.html.display()),
            )
        })?;
        Ok(Finished {
            knee,
            results: self.common.results,
            html: self.html,
        })
    }
}

fn phase_word(p: Phase) -> &'static str {
    match p {
        Phase::Ramp => "ramp",
        Phase::Refine => "refine",
        Phase::Repeat => "repeat",
    }
}

/// The search's settings, one per line, for the result.
fn search_lines(req: &Request) -> Vec<String> {
    let s = &req.search;
    vec![
        format!("--from {}", s.from),
        format!("--to {}", s.to),
        format!("--factor {}", s.factor),
        format!("--precision {}", objective::percent(s.precision)),
        format!("--repeat {}", s.repeat),
        format!("--warmup {}", fmt_duration(req.warmup)),
        format!("--step-duration {}", fmt_duration(req.step)),
    ]
}

/// A level's verdict and its reasons: the objective's, unless an agent
/// was lost or Ctrl-C cut it off.
fn judge(objective: &Objective, seen: &modes::Seen) -> (Verdict, Vec<String>) {
    let (mut verdict, mut reasons) = objective.judge(&seen.figures);
    if let Some(lost) = &seen.lost_agents {
        // Part of the load was never generated: the harness's failure,
        // not the target's, judged as a saturated generator.
        verdict = Verdict::Generator;
        reasons.insert(
            0,
            format!(
                "agent(s) lost during the level ({lost}): their share of the load was not generated"
            ),
        );
    }
    if seen.interrupted && verdict == Verdict::Pass {
        // Cut off by Ctrl-C: what it measured says nothing either way.
        verdict = Verdict::Fail;
        reasons.push("interrupted before its end".into());
    }
    (verdict, reasons)
}

/// The table row of one run.
fn row(
    n: u32,
    level: f64,
    phase: Phase,
    seen: &modes::Seen,
    verdict: Verdict,
    mut reasons: Vec<String>,
) -> Run {
    let f = &seen.figures;
    if let Some(why) = &seen.failed_early
        && verdict == Verdict::Fail
    {
        reasons.push(format!("stopped early: {why}"));
    }
    Run {
        run: n,
        level,
        phase,
        started_ns: seen.started_ns,
        measured_s: seen.measured_s,
        offered: seen.offered,
        achieved: seen.achieved,
        offered_deliveries: seen.offered_deliveries,
        latency_us: f.latency,
        delivery_us: f.delivery,
        errors: f.errors.clone(),
        error_rate: f.error_rate(),
        lost: f.lost,
        lag_us: f.lag,
        late_share: f.late_share,
        generator_cpu: f.generator_cpu,
        generator_busiest: f.generator_busiest.clone(),
        host_cpu: seen.host_cpu,
        host_mem_used_bytes: seen.host_mem_used_bytes,
        verdict,
        reasons,
        stopped_early: seen.failed_early.is_some(),
    }
}

/// A level's verdict in one line: pass with its p99, or why not.
fn verdict_line(r: &Run, mode: Mode) -> String {
    let lat = throng_report::text::micros;
    match r.verdict {
        Verdict::Pass => format!(
            "pass: p99 {}, errors {}, achieved {}{}",
            lat(r.latency_us.p99),
            objective::percent(r.error_rate),
            throng_report::text::count(r.achieved),
            match mode {
                Mode::Hold => " open",
                Mode::Attack => "/s",
                Mode::Publish => " deliveries/s",
            }
        ),
        Verdict::Fail | Verdict::Generator => {
            format!("{}: {}", r.verdict.word(), r.reasons.join("; "))
        }
    }
}

/// Waits `d` between levels; `true` if Ctrl-C came first.
fn cool_down(d: Duration) -> bool {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        std::thread::sleep(d);
        return false;
    };
    rt.block_on(async {
        tokio::select! {
            () = tokio::time::sleep(d) => false,
            r = tokio::signal::ctrl_c() => r.is_ok(),
        }
    })
}

/// Appends the result: one event per run and the whole search, last.
fn write_result(path: &Path, command_line: &[String], knee: &Knee) -> Result<(), KneeError> {
    let header = Header::new(
        command_line.to_vec(),
        serde_json::json!({"subcommand": "knee", "section": "result"}),
    );
    let mut w = Writer::append(path, &header).map_err(io::Error::other)?;
    let source = format!("{}/knee", throng_host::sample::hostname());
    for r in &knee.runs {
        w.write_event(&Event {
            at_ns: r.started_ns,
            source: source.clone(),
            kind: report::LEVEL_EVENT.to_owned(),
            text: serde_json::to_string(r).unwrap_or_default(),
        })
        .map_err(io::Error::other)?;
    }
    w.write_event(&Event {
        at_ns: now_unix_ns(),
        source,
        kind: report::RESULT_EVENT.to_owned(),
        text: serde_json::to_string(knee).unwrap_or_default(),
    })
    .map_err(io::Error::other)?;
    Ok(())
}

/// The whole search over time, read back from its result file (the
/// page's last part); `None` when it cannot be read.
fn over_time(path: &Path) -> Option<Report> {
    const SECOND: u64 = 1_000_000_000;
    let mut mergers = vec![Merger::new(SECOND).with_max_buckets(1_000)];
    let files = merge_files_into(&[path], &mut mergers).ok()?;
    let merged = mergers.pop()?.finish();
    Some(Report::build(&merged, &files, true))
}
