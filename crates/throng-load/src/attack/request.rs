//! What `throng attack` asks for, checked and planned before anything
//! starts: the workers, the connection cap under the open-file limit, the
//! schedule, and the lines printed at start with every default that
//! matters (the request timeout first: hidden timeouts are what the
//! seeds' teams lost days to).

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use throng_host::limits::DEFAULT_FD_RESERVE;
use throng_host::units::fmt_duration;
use throng_report::format::Header;

use super::record::{CSV_HEADER, LATE_US, RowFormat};
use super::summary::Summary;
use super::supervisor::AttackRun;
use super::targets::{LazyFile, Target, TargetError};
use super::worker::TARGETS_ERROR;
use super::{DEFAULT_TIMEOUT, Load, Settings, WorkerPlan, pacer, planned};
use crate::harness::Setup;
use crate::harness::clock::{millis, nanos};
use crate::harness::collect::ResultFile;
use crate::harness::machine::{self, Machine};
use crate::harness::metrics::Metrics;
use crate::harness::pool::{Remote, WorkerCommand};
use crate::harness::progress::Progress;
use crate::pacer::{PacerError, RateSpec, stage_lines};
use crate::threshold::{Threshold, ThresholdError, check_all, start_line};
use crate::tls::TlsOptions;

/// The arguments an `attack` worker process is started with.
pub const WORKER_ARGS: [&str; 2] = ["attack", "--worker"];

/// An `attack` run as the command line asks for it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The command line, for the result file's header.
    pub command_line: Vec<String>,
    /// What to send, taken in turn; with `lazy`, the first target of each
    /// endpoint (the file holds the rest).
    pub targets: Vec<Target>,
    /// A targets file too large to hold, read as the run takes its targets.
    pub lazy: Option<LazyFile>,
    /// A rate, or a closed pool.
    pub load: Load,
    /// How long to start requests for.
    pub duration: Option<Duration>,
    /// Requests in all (with a duration: whichever ends first).
    pub requests: Option<u64>,
    /// Worker processes (`None`: one per core).
    pub workers: Option<u32>,
    /// Connections open at once over all workers.
    pub max_connections: u64,
    /// Source addresses (`None`: picked on loopback, else the kernel's).
    pub sources: Option<Vec<std::net::IpAddr>>,
    /// Reuse connections.
    pub keepalive: bool,
    /// Per request, connect included.
    pub timeout: Duration,
    /// The result file, if any.
    pub output: Option<PathBuf>,
    /// One row per request to this file, if any.
    pub per_request: Option<PathBuf>,
    /// Fail the run above this error rate.
    pub max_error_rate: Option<f64>,
    /// Fail the run above this p99 latency.
    pub max_p99: Option<Duration>,
    /// Fail the run when a request starts further than this behind its
    /// schedule (the harness fell behind: the load it made was not the
    /// load asked for).
    pub max_lag: Option<Duration>,
    /// TLS of `https://` targets.
    pub tls: Option<TlsOptions>,
    /// The live view.
    pub progress: Progress,
    /// How per-request rows are written (`None`: CSV for a `.csv` name,
    /// else JSON lines; Vegeta's results for `--format vegeta`).
    pub per_request_format: Option<RowFormat>,
    /// `--threshold`s (the `--max-*` flags above are added to them).
    pub thresholds: Vec<Threshold>,
    /// Stop the run once a threshold can no longer pass.
    pub abort_on_fail: bool,
    /// HTTP/2 (`--http2`) with at most this many streams per connection
    /// (`--max-streams`); `None`: HTTP/1.1.
    pub http2: Option<u32>,
}

/// The default `--max-streams`: HAProxy's and nginx's default
/// SETTINGS_MAX_CONCURRENT_STREAMS, and h2load's usual `-m`.
pub const DEFAULT_MAX_STREAMS: u32 = 100;

/// Why an `attack` cannot start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AttackError {
    /// A setting that makes no run (with the flag to change).
    #[error("{0}")]
    Setting(String),
    /// A target that cannot be attacked.
    #[error("{0}")]
    Target(#[from] TargetError),
    /// A rate that makes no schedule.
    #[error("{0}")]
    Rate(#[from] PacerError),
    /// A threshold that cannot be checked.
    #[error("{0}")]
    Threshold(#[from] ThresholdError),
    /// The machine could not be read, a file not written, or the workers not found.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A planned run, ready to start.
#[derive(Debug)]
pub struct Prepared {
    attack: AttackRun,
    setup: Setup,
    lines: Vec<String>,
    thresholds: Vec<Threshold>,
    /// The start lines' section on this machine's limits (none on agents).
    limits: Vec<String>,
}

/// Checks `req` and plans it on this machine.
pub fn prepare(req: Request) -> Result<Prepared, AttackError> {
    prepare_on(req, None)
}

/// Checks `req` and plans it on this machine, or runs it on `remote`.
pub fn prepare_on(mut req: Request, remote: Option<Remote>) -> Result<Prepared, AttackError> {
    // Stages set their own time: the run lasts them out unless told shorter.
    if let (Load::Rate(RateSpec::Stages(st)), None) = (req.load, req.duration) {
        req.duration = Some(st.total());
    }
    check_settings(&req)?;
    let thresholds = super::summary::thresholds(
        &req.thresholds,
        req.max_error_rate,
        req.max_p99,
        req.max_lag,
    )?;
    check_remote(&req, remote.is_some())?;
    let addrs = req
        .targets
        .iter()
        .map(|t| t.url.resolve())
        .collect::<Result<Vec<_>, _>>()?;
    let machine = Machine::probe()?;
    let (workers, workers_why, sources, sources_why) = match &remote {
        // Each agent's machine was fitted when the run was shared out.
        Some(r) => (r.workers, String::new(), Vec::new(), String::new()),
        None => {
            let (w, why) = plan_workers(&req, &machine)?;
            let (s, s_why) = plan_sources(&req, &addrs, &machine)?;
            (w, why, s, s_why)
        }
    };
    let max_connections = req.max_connections;
    let settings = Settings {
        timeout_ms: millis(req.timeout),
        keepalive: req.keepalive,
        max_connections,
        http2: req.http2,
        ..Settings::default()
    };
    let planned = match req.load {
        Load::Rate(spec) => planned(
            &pacer(spec, req.duration, req.requests)?,
            req.duration,
            req.requests,
        ),
        Load::Max { .. } => None,
    };
    let row_format = req.per_request.as_deref().map(|p| {
        req.per_request_format
            .unwrap_or_else(|| RowFormat::for_path(p))
    });
    // Vegeta's results go to stdout, which is there already.
    if let Some(p) = req
        .per_request
        .as_ref()
        .filter(|_| row_format != Some(RowFormat::Vegeta))
    {
        let head = if row_format == Some(RowFormat::Csv) {
            CSV_HEADER
        } else {
            ""
        };
        std::fs::write(p, head)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", p.display())))?;
    }
    let attack = AttackRun {
        plan: WorkerPlan {
            index: 0,
            workers,
            label: String::new(),
            load: req.load,
            duration_ns: req.duration.map(nanos),
            requests: req.requests,
            targets: req.targets.clone(),
            lazy: req.lazy.clone(),
            addrs,
            sources,
            start_unix_ns: 0,
            settings,
            per_request: req.per_request.clone(),
            tls: req.tls.clone(),
            row_format,
        },
        planned,
        abort: crate::threshold::live(&thresholds, req.abort_on_fail),
    };
    let mut lines = start_lines(&req, &attack, &machine, &workers_why, &sources_why);
    lines.extend(start_line(&thresholds, req.abort_on_fail));
    if let Some(r) = &remote {
        // Workers and sources are each agent's (its lines), not this machine's.
        lines.splice(3..4, r.lines.iter().cloned());
    }
    if let Load::Rate(RateSpec::Stages(st)) = req.load {
        lines.splice(2..2, stage_lines(&st, "requests"));
    }
    let limits = if remote.is_some() {
        Vec::new()
    } else {
        limit_lines(&attack.plan)
    };
    lines.extend(limits.iter().cloned());
    let results = req.output.clone().map(|path| ResultFile {
        path,
        header: header(&req, &attack),
        append: false,
    });
    Ok(Prepared {
        setup: Setup {
            command: WorkerCommand::this_program(&WORKER_ARGS)?,
            results,
            progress: req.progress,
            remote: remote.map(|r| r.launch),
            metrics: None,
        },
        attack,
        lines,
        thresholds,
        limits,
    })
}

/// The start lines' section on this machine's limits: `throng doctor
/// --role client`'s checks of the most connections the run may open, from
/// its sources to its targets' ports.
fn limit_lines(plan: &WorkerPlan) -> Vec<String> {
    use throng_host::doctor::{self, Role};
    let connections = plan.settings.max_connections;
    let ports: std::collections::BTreeSet<_> = plan.addrs.iter().collect();
    let dp = doctor::Plan {
        source_ips: plan.sources.len().max(1) as u64,
        target_ports: ports.len().max(1) as u64,
        ..doctor::Plan::new(connections, Role::Client)
    };
    machine::limit_lines(connections, &doctor::check(&dp))
}

/// What does not go with `--agents` (`remote`).
fn check_remote(req: &Request, remote: bool) -> Result<(), AttackError> {
    if remote && req.per_request.is_some() {
        return Err(AttackError::Setting(
            if req.per_request_format == Some(RowFormat::Vegeta) {
                "--format vegeta writes each request's result on this machine's stdout; it does not go with --agents (give --output and read the merged run with throng report)"
            } else {
                "--per-request writes on this machine; it does not go with --agents"
            }
            .into(),
        ));
    }
    if remote && req.lazy.is_some() {
        return Err(AttackError::Setting(
            "a targets file read as the run goes cannot go to agents (they cannot read it); hold its targets instead".into(),
        ));
    }
    Ok(())
}

/// The settings that make no run, refused with the flag to change.
fn check_settings(req: &Request) -> Result<(), AttackError> {
    let bad = |m: String| Err(AttackError::Setting(m));
    if req.targets.is_empty() {
        return bad("give --url URL or --targets FILE".into());
    }
    if req.duration.is_some_and(|d| d.is_zero()) {
        return bad("--duration must be more than zero".into());
    }
    if req.requests == Some(0) {
        return bad("--requests must be at least 1".into());
    }
    if req.timeout.is_zero() {
        return bad("--timeout must be more than zero".into());
    }
    if let Some(r) = req.max_error_rate
        && !(0.0..=1.0).contains(&r)
    {
        return bad("--max-error-rate is a fraction between 0 and 1, e.g. 0.01 for 1%".into());
    }
    if req.max_connections == 0 {
        return bad("--max-connections must be at least 1".into());
    }
    if req.http2 == Some(0) {
        return bad("--max-streams must be at least 1".into());
    }
    if req.http2.is_some() && !req.keepalive {
        return bad("--no-keepalive does not go with --http2: HTTP/2 carries many requests on each connection".into());
    }
    match req.load {
        Load::Max { connections: 0 } => bad("--connections must be at least 1".into()),
        Load::Max { connections } if connections > req.max_connections => bad(format!(
            "--connections {connections} is over --max-connections {}; raise --max-connections",
            req.max_connections
        )),
        _ => Ok(()),
    }
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

    /// The planned run and its set-up, for a caller that runs it its own
    /// way (`knee` runs it once per level, at the level's rate).
    pub fn into_parts(self) -> (AttackRun, Setup) {
        (self.attack, self.setup)
    }

    /// Runs it; the summary and the thresholds it failed, one line each
    /// (the one that stopped it first, under `--abort-on-fail`).
    pub fn run(self) -> io::Result<(Summary, Vec<String>)> {
        let mut summary = super::supervisor::run(self.attack, self.setup)?;
        summary.limits = self.limits.iter().map(|l| l.trim().to_owned()).collect();
        let mut failed = check_all(&self.thresholds, &summary);
        if let Some(why) = &summary.aborted {
            failed.insert(0, format!("stopped early (--abort-on-fail): {why}"));
        }
        // Not the run asked for: fail it, whatever the thresholds say.
        if summary.events.iter().any(|e| e.kind == TARGETS_ERROR) {
            failed.insert(
                0,
                "a worker stopped early: its targets file no longer read as checked (see the events)"
                    .to_owned(),
            );
        }
        Ok((summary, failed))
    }
}

/// The worker processes: one per core, or `--workers`, raised to what
/// `--max-connections` needs under the open-file limit (each worker holds
/// its share of the connections, one file each); and why.
fn plan_workers(req: &Request, machine: &Machine) -> Result<(u32, String), AttackError> {
    let per_worker = machine.per_worker().max(1);
    let needed = req.max_connections.div_ceil(per_worker).max(1);
    match req.workers {
        Some(0) => Err(AttackError::Setting("--workers must be at least 1".into())),
        Some(w) if u64::from(w) < needed => Err(AttackError::Setting(format!(
            "--max-connections {} over --workers {w} is {} per process, but a process may open only {} files; use --workers {needed} or more, or leave --workers out",
            req.max_connections,
            req.max_connections.div_ceil(u64::from(w)),
            machine.nofile
        ))),
        Some(w) => Ok((w, "--workers".to_owned())),
        None => {
            let cores = machine.cores.max(1) as u64;
            if needed > cores {
                Ok((
                    u32::try_from(needed).unwrap_or(u32::MAX),
                    format!(
                        "raised from {cores} (one per core) so that --max-connections {} fits at {per_worker} per process (open-file limit {} - {DEFAULT_FD_RESERVE})",
                        req.max_connections, machine.nofile
                    ),
                ))
            } else {
                Ok((
                    u32::try_from(cores).unwrap_or(1),
                    format!("one per core ({cores})"),
                ))
            }
        }
    }
}

/// The source addresses new connections bind: `--source-ips`, or on IPv4
/// loopback as many of `127.0.0.2..` as the local ports to each target
/// need (a source address has one port range per target address); and why.
fn plan_sources(
    req: &Request,
    addrs: &[std::net::SocketAddr],
    machine: &Machine,
) -> Result<(Vec<std::net::IpAddr>, String), AttackError> {
    if let Some(list) = &req.sources {
        if let Some(bad) = list
            .iter()
            .find(|ip| addrs.iter().any(|a| a.is_ipv4() != ip.is_ipv4()))
        {
            return Err(AttackError::Setting(format!(
                "source address {bad} is not of the same family as the targets; give --source-ips of their family"
            )));
        }
        if let Err((ip, e)) = crate::harness::source::check_bindable(list) {
            return Err(AttackError::Setting(format!(
                "source address {ip} cannot be used here: {e}; give --source-ips of this host, or add the address to an interface first"
            )));
        }
        let pairs = (list.len() * addrs.len().max(1)).max(1) as u64;
        let why = slow_connects(req.max_connections.div_ceil(pairs), machine).map_or_else(
            || "--source-ips".to_owned(),
            |w| format!("--source-ips; {w}"),
        );
        return Ok((list.clone(), why));
    }
    let loopback = addrs.iter().all(|a| a.is_ipv4() && a.ip().is_loopback());
    let mut endpoints: Vec<_> = addrs.to_vec();
    endpoints.sort_unstable();
    endpoints.dedup();
    let targets = endpoints.len().max(1) as u64;
    let per_source = machine.usable_ports().max(1) * targets;
    let needed = req.max_connections.div_ceil(per_source);
    // Loopback sources cost nothing: as many as keep each pair where
    // connect() is cheap (see `PORT_FAST`), not merely where it fits.
    let cheap = req
        .max_connections
        .div_ceil(machine.fast_ports().max(1) * targets);
    if loopback && cheap > 1 {
        let ips = crate::hold::target::loopback_sources(usize::try_from(cheap).unwrap_or(1));
        let why = format!(
            "{} ({} addresses; loopback: picked so that --max-connections {} finds local ports)",
            crate::hold::target::format_sources(&ips),
            ips.len(),
            req.max_connections
        );
        return Ok((ips, why));
    }
    if !loopback && needed > 1 {
        return Err(AttackError::Setting(format!(
            "--max-connections {} needs {needed} source addresses for local ports ({per_source} per address to these targets); give --source-ips (add them to an interface first), or more target ports",
            req.max_connections
        )));
    }
    let why = slow_connects(req.max_connections.div_ceil(targets), machine).map_or_else(
        || "the kernel picks".to_owned(),
        |w| format!("the kernel picks; {w}"),
    );
    Ok((Vec::new(), why))
}

/// A warning when `per_pair` connections per (source, target) pair are
/// past where connect() is cheap (see `PORT_FAST`).
fn slow_connects(per_pair: u64, machine: &Machine) -> Option<String> {
    (per_pair > machine.fast_ports()).then(|| {
        format!(
            "slow connects ahead: up to {per_pair} connections per (source, target) pair is over half the local port range ({}); \
             Linux's connect() walks a whole half of it per connect once that half is taken (over 10x the CPU): give more --source-ips",
            machine.fast_ports()
        )
    })
}

fn start_lines(
    req: &Request,
    a: &AttackRun,
    machine: &Machine,
    workers_why: &str,
    sources_why: &str,
) -> Vec<String> {
    let first = &req.targets[0];
    let count = req
        .lazy
        .as_ref()
        .map_or(req.targets.len() as u64, |l| l.count);
    let more = match &req.lazy {
        Some(l) => format!(
            " (+{} more targets, taken in turn, each worker reading {} as the run goes)",
            count - 1,
            l.path.display()
        ),
        None if count > 1 => format!(" (+{} more targets, taken in turn)", count - 1),
        None => String::new(),
    };
    let span = match (req.duration, req.requests) {
        (Some(d), Some(n)) => format!(
            "for {} or {n} requests, whichever ends first",
            fmt_duration(d)
        ),
        (Some(d), None) => format!("for {}", fmt_duration(d)),
        (None, Some(n)) => format!("{n} requests"),
        (None, None) => String::new(),
    };
    let settings = &a.plan.settings;
    let mut out = vec![
        format!("throng attack {} {}{more}", first.method, first.url),
        match req.load {
            Load::Rate(spec) => format!(
                "  rate {spec} (open model) {span}: {} requests planned",
                a.planned.map_or("?".to_owned(), |n| n.to_string())
            ),
            Load::Max { connections } => {
                format!("  closed pool of {connections} connections (--max) {span}")
            }
        },
        format!(
            "  TIMEOUT {} per request, connect included (--timeout{}); later answers count as error 'timeout'",
            fmt_duration(req.timeout),
            if req.timeout == DEFAULT_TIMEOUT {
                ", the default"
            } else {
                ""
            }
        ),
        format!(
            "  workers {} ({workers_why}); sources {sources_why}",
            a.plan.workers
        ),
        format!(
            "  max connections {} over all workers; keep-alive {}; open-file limit {}/process",
            settings.max_connections,
            if settings.keepalive {
                "on"
            } else {
                "off (--no-keepalive)"
            },
            machine.nofile
        ),
    ];
    out.push(match req.http2 {
        Some(streams) => format!(
            "  protocol HTTP/2 (--http2: ALPN h2 on https://, prior knowledge h2c on http://), up to {streams} streams per connection (--max-streams{}; the server's SETTINGS_MAX_CONCURRENT_STREAMS may allow fewer)",
            if streams == DEFAULT_MAX_STREAMS {
                ", the default"
            } else {
                ""
            }
        ),
        None => "  protocol HTTP/1.1 (--http2 for HTTP/2)".into(),
    });
    if let Some(tls) = &req.tls {
        let mut line = format!("  tls: {}", tls.describe());
        if req.http2.is_some() {
            line = line.replace("ALPN http/1.1", "ALPN h2");
        }
        out.push(line);
    }
    out.push(format!(
        "  latency from each request's intended start; 'late' = started more than {} ms behind schedule",
        LATE_US / 1000
    ));
    if let Some(o) = &req.output {
        out.push(format!("  results to {}", o.display()));
    }
    if let Some(p) = &req.per_request {
        match a.plan.row_format {
            Some(RowFormat::Vegeta) => out.push(
                "  one Vegeta JSON result per request on stdout (for vegeta report, plot, encode)"
                    .to_owned(),
            ),
            f => out.push(format!(
                "  per-request rows to {} ({:?})",
                p.display(),
                f.unwrap_or_else(|| RowFormat::for_path(p))
            )),
        }
    }
    out
}

/// The result file's header: the command line and what the run was.
fn header(req: &Request, a: &AttackRun) -> Header {
    let plan = &a.plan;
    Header::new(
        req.command_line.clone(),
        serde_json::json!({
            "subcommand": "attack",
            "targets": plan.targets.iter().map(|t| format!("{} {}", t.method, t.url)).collect::<Vec<_>>(),
            "targets_file": plan.lazy.as_ref().map(|l| serde_json::json!({"path": l.path, "count": l.count})),
            "load": match plan.load {
                Load::Rate(spec @ RateSpec::Stages(st)) => serde_json::json!({"rate": spec.to_string(), "stages": st}),
                Load::Rate(spec) => serde_json::json!({"rate": spec.to_string()}),
                Load::Max { connections } => serde_json::json!({"max": true, "connections": connections}),
            },
            "duration_s": req.duration.map(|d| d.as_secs_f64()),
            "requests": req.requests,
            "planned": a.planned,
            "workers": plan.workers,
            "sources": plan.sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "settings": plan.settings,
            "tls": plan.tls,
            "late_threshold_us": LATE_US,
        }),
    )
}
