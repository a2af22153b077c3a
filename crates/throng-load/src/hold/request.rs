//! What `throng hold` asks for, checked and fitted onto this machine
//! before anything starts: a plan that cannot work is refused with the
//! reason and the fix, and every default that matters is in the lines
//! printed at start ([`Prepared::lines`]).

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use throng_host::doctor::{self, Finding, Role, Status};
use throng_host::units::{fmt_duration, fmt_size};
use throng_report::format::Header;

use super::Settings;
use super::figures::Thresholds;
use super::mqtt::MqttOptions;
use super::plan::{self, PlanError};
use super::sessions::SessionPlan;
use super::summary::Summary;
use super::supervisor::{
    DRAIN_MAX, DRAIN_QUIET, HoldRun, PUBLISH_SETTLE, PUBLISH_TIMEOUT, PublishPlan, client_topic,
};
use super::target::{PublishTarget, WsTarget};
use crate::harness::Setup;
use crate::harness::collect::ResultFile;
use crate::harness::machine::{Machine, limit_lines};
use crate::harness::metrics::Metrics;
use crate::harness::pool::{Remote, WorkerCommand};
use crate::harness::progress::Progress;
use crate::pacer::RateSpec;
use crate::tls::TlsOptions;

/// The arguments a `hold` worker process is started with.
pub const WORKER_ARGS: [&str; 2] = ["hold", "--worker"];

/// A `hold` run as the command line asks for it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The command line, for the result file's header.
    pub command_line: Vec<String>,
    /// Where to connect.
    pub target: WsTarget,
    /// Connections to open and hold.
    pub connections: u64,
    /// New connections per second (constant or a ramp).
    pub rate: RateSpec,
    /// How long to hold once every connection is open or failed (`None`: until Ctrl-C).
    pub duration: Option<Duration>,
    /// Source addresses (`None`: picked on loopback, else the kernel's).
    pub sources: Option<Vec<IpAddr>>,
    /// Worker processes (`None`: from the cores and the open-file limit).
    pub workers: Option<u32>,
    /// Timeouts and limits.
    pub settings: Settings,
    /// Publishing, if any.
    pub publish: Option<PublishRequest>,
    /// TLS of a `wss://` target.
    pub tls: Option<TlsOptions>,
    /// How MQTT subscribers (`mqtt://` targets) connect and subscribe.
    pub mqtt: Option<MqttOptions>,
    /// Persistent-session clients beside the held subscribers (`mqtt://`).
    pub sessions: Option<SessionPlan>,
    /// The result file, if any.
    pub output: Option<PathBuf>,
    /// The live view.
    pub progress: Progress,
    /// What fails the run.
    pub thresholds: Thresholds,
}

/// Publishing as the command line asks for it.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    /// Where (its TLS trust already set).
    pub target: PublishTarget,
    /// Messages per second: a constant rate.
    pub rate: RateSpec,
    /// Size of each message, bytes.
    pub message_size: usize,
    /// Redis channel prefix: messages go to `<prefix><channel>`.
    pub redis_prefix: String,
    /// Publish this many, then end once they are delivered (`None`: until the hold ends).
    pub messages: Option<u64>,
    /// Timeout of one publish call.
    pub timeout: Duration,
    /// Publishing clients sharing `rate`, each on its own connection
    /// (`--publishers`); an MQTT topic's `%i` is each one's number.
    pub clients: u32,
}

/// Why a `hold` cannot start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HoldError {
    /// The run does not fit this machine (with the fix). Not a `source`:
    /// its text is in the message, and a chain printed in full would say
    /// it twice.
    #[error("this run does not fit the machine: {0}")]
    Plan(PlanError),
    /// Stages of the connection rate that cannot open every connection.
    #[error("{0}")]
    Stages(String),
    /// A publishing client's topic that the subscribers' filter does not
    /// match: each of them would count its messages lost.
    #[error("{0}")]
    Publishers(String),
    /// `--publish-rate` was a ramp.
    #[error("--publish-rate takes a constant rate (e.g. 10/s), not a ramp or stages")]
    PublishRamp,
    /// A limit `throng doctor` checks will stop the run (the same check:
    /// a dry run that passed would promise what doctor refuses).
    #[error(
        "a limit of this machine will stop a run of {connections} connections:\n  {}\n  run 'throng doctor --connections {connections} --role client' for the fixes, or use a smaller --connections",
        .stops.join("\n  ")
    )]
    Limits {
        /// Connections asked for.
        connections: u64,
        /// Each limit that stops it, one line.
        stops: Vec<String>,
    },
    /// The machine could not be read, or the workers not found.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// What `throng doctor --role client` finds for hold's own side of
/// `connections` from `sources` addresses to the target's ports: every
/// limit it checks. The client side only: a server on this machine plans
/// its own sockets (`throng serve`, or doctor's default role, both).
fn doctor_findings(connections: u64, target: &WsTarget, sources: usize) -> Vec<Finding> {
    let plan = doctor::Plan {
        source_ips: sources.max(1) as u64,
        target_ports: u64::from(target.port_count()),
        ..doctor::Plan::new(connections, Role::Client)
    };
    doctor::check(&plan)
}

impl From<PlanError> for HoldError {
    fn from(e: PlanError) -> Self {
        Self::Plan(e)
    }
}

/// A run that fits, ready to start.
#[derive(Debug)]
pub struct Prepared {
    hold: HoldRun,
    setup: Setup,
    lines: Vec<String>,
    thresholds: Thresholds,
    /// The start lines' section on this machine's limits.
    limits: Vec<String>,
}

/// With several MQTT publishing clients (`%i` in the topic), that the
/// subscribers' filter matches every client's topic: loss is counted
/// against every message published.
fn check_client_topics(req: &Request) -> Result<(), HoldError> {
    let Some(p) = &req.publish else {
        return Ok(());
    };
    let PublishTarget::Mqtt { topic, .. } = &p.target else {
        return Ok(());
    };
    if !req.target.mqtt {
        return Ok(());
    }
    let filter = req.target.channel();
    for k in 0..p.clients.max(1) {
        let name = client_topic(topic, k);
        if !throng_proto::mqtt::topic::matches(filter, &name) {
            return Err(HoldError::Publishers(format!(
                "publishing client {} publishes to '{name}', which the subscribers' filter '{filter}' does not match: every subscriber is owed every message, so give a filter that matches every client's topic (e.g. a + where the topic has %i)",
                k + 1
            )));
        }
    }
    Ok(())
}

/// Checks `req` and fits it onto this machine.
pub fn prepare(req: Request) -> Result<Prepared, HoldError> {
    prepare_on(req, None)
}

/// Checks `req` and fits it onto this machine, or runs it on `remote`.
pub fn prepare_on(req: Request, remote: Option<Remote>) -> Result<Prepared, HoldError> {
    let machine = Machine::probe()?;
    let mut findings = Vec::new();
    let fit = match &remote {
        // Each agent's machine was fitted when the run was shared out.
        Some(r) => plan::Fit {
            workers: r.workers,
            sources: Vec::new(),
            per_worker: req.connections.div_ceil(u64::from(r.workers.max(1))),
            per_pair: 0,
            workers_reason: "on agents".to_owned(),
            sources_reason: "each agent's own".to_owned(),
        },
        None => {
            let asked = plan::Request {
                connections: req.connections,
                target: req.target.clone(),
                sources: req.sources.clone(),
                workers: req.workers,
            };
            let fit = plan::fit(&asked, &machine)?;
            plan::check_sources(&asked)?;
            findings = doctor_findings(req.connections, &req.target, fit.sources.len());
            let stops: Vec<String> = findings
                .iter()
                .filter(|f| f.status == Status::Stop)
                .map(Finding::line)
                .collect();
            if !stops.is_empty() {
                return Err(HoldError::Limits {
                    connections: req.connections,
                    stops,
                });
            }
            fit
        }
    };
    if let RateSpec::Stages(st) = req.rate {
        let last = st.stages().last().map_or(0.0, |s| s.to);
        if last <= 0.0 && st.events() < req.connections as f64 {
            return Err(HoldError::Stages(format!(
                "the stages --rate {} open only {} of the {} connections (--connections), and end at 0/s: give stages that reach them, or end at a rate above 0/s",
                req.rate,
                st.events().floor(),
                req.connections
            )));
        }
    }
    check_client_topics(&req)?;
    let publish = match &req.publish {
        None => None,
        Some(p) => Some(PublishPlan {
            target: p.target.clone(),
            rate: match p.rate {
                RateSpec::Constant(r) => r,
                RateSpec::Ramp(..) | RateSpec::Stages(_) => return Err(HoldError::PublishRamp),
            },
            message_size: p.message_size,
            redis_channel: format!("{}{}", p.redis_prefix, req.target.channel()),
            messages: p.messages,
            timeout: p.timeout,
            clients: p.clients.max(1),
        }),
    };
    let hold = HoldRun {
        connections: req.connections,
        rate: req.rate,
        target: req.target.clone(),
        tls: req.tls.clone(),
        mqtt: req.mqtt.clone(),
        fit,
        settings: req.settings,
        duration: req.duration,
        publish,
        sessions: req.sessions.clone(),
    };
    let mut lines = start_lines(&hold, &machine, req.output.as_ref());
    if let Some(r) = &remote {
        // Workers, sources and ports are each agent's (its lines), not this machine's.
        lines.splice(2..5, r.lines.iter().cloned());
    }
    if let RateSpec::Stages(st) = req.rate {
        lines.splice(2..2, crate::pacer::stage_lines(&st, "connections"));
    }
    let limits = if remote.is_some() {
        // Each agent checked its own machine when the run was shared out.
        Vec::new()
    } else {
        limit_lines(req.connections, &findings)
    };
    lines.extend(limits.iter().cloned());
    lines.push(req.thresholds.line());
    let results = req.output.clone().map(|path| ResultFile {
        path,
        header: header(&req, &hold, &limits),
        append: false,
    });
    let setup = Setup {
        command: WorkerCommand::this_program(&WORKER_ARGS)?,
        results,
        progress: req.progress,
        remote: remote.map(|r| r.launch),
        metrics: None,
    };
    Ok(Prepared {
        hold,
        setup,
        lines,
        thresholds: req.thresholds,
        limits,
    })
}

impl Prepared {
    /// What will run, every default that matters, one line each.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// Serves the run's live figures on `metrics` (`--metrics-listen`),
    /// and says where in the start lines.
    pub fn serve_metrics(&mut self, metrics: Metrics) {
        self.lines.push(metrics.line());
        self.setup.metrics = Some(metrics);
    }

    /// The fitted run and its set-up, for a caller that runs it its own
    /// way (`knee` runs it once per level).
    pub fn into_parts(self) -> (HoldRun, Setup) {
        (self.hold, self.setup)
    }

    /// Runs it; the summary and what it broke of the thresholds, one line each.
    pub fn run(self) -> io::Result<(Summary, Vec<String>)> {
        let live = self.thresholds.live();
        let mut summary = super::supervisor::run_until_doomed(self.hold, self.setup, live)?;
        summary.limits = self.limits.iter().map(|l| l.trim().to_owned()).collect();
        let failed = self.thresholds.check(&summary);
        Ok((summary, failed))
    }
}

fn start_lines(h: &HoldRun, machine: &Machine, output: Option<&PathBuf>) -> Vec<String> {
    let fit = &h.fit;
    let sources = fit.sources.len().max(1);
    let (lo, hi) = machine.local_ports;
    let mut out = vec![
        format!("throng hold {}", h.target),
        format!(
            "  connections {}  rate {}  hold {}",
            h.connections,
            h.rate,
            match (h.duration, h.publish.as_ref().and_then(|p| p.messages)) {
                (Some(d), _) => format!(
                    "{} once every connection is open or failed",
                    fmt_duration(d)
                ),
                (None, Some(n)) => format!("until {n} messages are published and delivered"),
                (None, None) => "until Ctrl-C".to_owned(),
            }
        ),
        format!(
            "  workers {} ({}), at most {} connections each",
            fit.workers, fit.workers_reason, fit.per_worker
        ),
        format!("  sources {}", fit.sources_reason),
        format!(
            "  target ports {} × sources {sources} = {} pairs, at most {} connections per pair (usable local ports per pair {}, cheap connects up to {}, ip_local_port_range {lo}-{hi})",
            h.target.port_count(),
            u64::from(h.target.port_count()) * sources as u64,
            fit.per_pair,
            machine.usable_ports(),
            machine.fast_ports(),
        ),
    ];
    if fit.per_pair > machine.fast_ports() {
        out.push(format!(
            "  slow connects ahead: {} connections per pair is over half the local port range ({}); Linux's connect() \
             walks a whole half of it per connect once that half is taken (over 10x the CPU): give more --source-ips or target ports",
            fit.per_pair,
            machine.fast_ports()
        ));
    }
    if let Some(tls) = &h.tls {
        out.push(format!("  tls: {}", tls.describe()));
    }
    let publish_mqtt = h.publish.as_ref().and_then(|p| match &p.target {
        PublishTarget::Mqtt { options, .. } => Some(options),
        _ => None,
    });
    if let Some(m) = h.mqtt.as_ref().or(publish_mqtt) {
        out.push(format!("  {}", m.describe()));
    }
    if let (Some(sp), Some(m)) = (&h.sessions, &h.mqtt) {
        out.push(format!("  {}", sp.describe(m)));
    }
    let s = &h.settings;
    out.push(format!(
        "  timeouts: connect {} ms, handshake {} ms, close {} ms, read {}; max message {}; open-file limit {}/process",
        s.connect_timeout_ms,
        s.handshake_timeout_ms,
        s.close_timeout_ms,
        if s.read_timeout_ms > 0 {
            format!("{} ms", s.read_timeout_ms)
        } else {
            "none".to_owned()
        },
        fmt_size(s.max_message),
        machine.nofile
    ));
    if let Some(p) = &h.publish {
        let via = match &p.target {
            PublishTarget::Redis { url, trust, .. } if url.tls => {
                format!(" (Redis channel {}; {})", p.redis_channel, trust.describe())
            }
            PublishTarget::Redis { .. } => format!(" (Redis channel {})", p.redis_channel),
            PublishTarget::Http { .. } | PublishTarget::Mqtt { .. } => String::new(),
        };
        let count = match p.messages {
            Some(n) => format!("{n} messages"),
            None => "messages".to_owned(),
        };
        let clients = match p.clients {
            0 | 1 => String::new(),
            n => format!(
                " from {n} clients (each on its own connection, one every {})",
                fmt_duration(Duration::from_secs_f64(f64::from(n) / p.rate))
            ),
        };
        out.push(format!(
            "  publish {count} to {}{via} at {}/s{clients}, {} bytes each, from {} ms after every connection is open; publish timeout {}{} (a late answer counts apart: the message was sent)",
            p.target,
            p.rate,
            p.message_size,
            PUBLISH_SETTLE.as_millis(),
            fmt_duration(p.timeout),
            if p.timeout == PUBLISH_TIMEOUT { ", the default" } else { "" },
        ));
        if let PublishTarget::Http {
            path, host, tls, ..
        } = &p.target
            && !path.starts_with("/publish/")
        {
            let scheme = if tls.is_some() { "https" } else { "http" };
            out.push(format!(
                "  note: the messages are POSTed to '{path}'; throng serve takes them on /publish/<channel> (--publish {scheme}://{host}/publish/<channel>)"
            ));
        }
        out.push(format!(
            "  after the last message: connections stay open until every one has every message, or no delivery came for {}, {} at most",
            fmt_duration(DRAIN_QUIET),
            fmt_duration(DRAIN_MAX)
        ));
    }
    if let Some(o) = output {
        out.push(format!("  results to {}", o.display()));
    }
    out
}

/// The result file's header: the command line and what the run was.
fn header(req: &Request, h: &HoldRun, limits: &[String]) -> Header {
    Header::new(
        req.command_line.clone(),
        serde_json::json!({
            "subcommand": "hold",
            "target": h.target.to_string(),
            "connections": h.connections,
            "rate": h.rate.to_string(),
            "duration_s": h.duration.map(|d| d.as_secs_f64()),
            "workers": h.fit.workers,
            "sources": h.fit.sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "settings": h.settings,
            "tls": h.tls,
            "mqtt": h.mqtt.as_ref().map(|m| serde_json::json!({
                "level": m.level, "qos": m.qos, "keep_alive_s": m.keep_alive_s,
                "client_id_prefix": m.client_id_prefix, "connect_only": m.connect_only,
            })),
            "sessions": h.sessions.as_ref().map(|p| serde_json::json!({
                "clients": p.clients, "online_s": p.online.as_secs_f64(),
                "away_s": p.away.as_secs_f64(), "expiry_s": p.expiry_s,
            })),
            "publish": h.publish.as_ref().map(|p| serde_json::json!({
                "target": p.target.to_string(), "rate": p.rate, "message_size": p.message_size,
                "clients": p.clients,
            })),
            "limits": limits.iter().map(|l| l.trim()).collect::<Vec<_>>(),
        }),
    )
}
