//! What `throng hold` asks for, checked and fitted onto this machine
//! before anything starts: a plan that cannot work is refused with the
//! reason and the fix, and every default that matters is in the lines
//! printed at start ([`Prepared::lines`]).

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use throng_host::units::{fmt_duration, fmt_size};
use throng_report::format::Header;

use super::Settings;
use super::plan::{self, PlanError};
use super::summary::Summary;
use super::supervisor::{HoldRun, PUBLISH_SETTLE, PUBLISH_TIMEOUT, PublishPlan};
use super::target::{PublishTarget, WsTarget};
use crate::harness::Setup;
use crate::harness::collect::ResultFile;
use crate::harness::machine::Machine;
use crate::harness::pool::WorkerCommand;
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
    /// The result file, if any.
    pub output: Option<PathBuf>,
    /// The live view.
    pub progress: Progress,
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
}

/// Why a `hold` cannot start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HoldError {
    /// The run does not fit this machine (with the fix).
    #[error("this run does not fit the machine: {0}")]
    Plan(#[from] PlanError),
    /// `--publish-rate` was a ramp.
    #[error("--publish-rate takes a constant rate (e.g. 10/s), not a ramp")]
    PublishRamp,
    /// The machine could not be read, or the workers not found.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A run that fits, ready to start.
#[derive(Debug)]
pub struct Prepared {
    hold: HoldRun,
    setup: Setup,
    lines: Vec<String>,
}

/// Checks `req` and fits it onto this machine.
pub fn prepare(req: Request) -> Result<Prepared, HoldError> {
    let machine = Machine::probe()?;
    let fit = plan::fit(
        &plan::Request {
            connections: req.connections,
            target: req.target.clone(),
            sources: req.sources.clone(),
            workers: req.workers,
        },
        &machine,
    )?;
    let publish = match &req.publish {
        None => None,
        Some(p) => Some(PublishPlan {
            target: p.target.clone(),
            rate: match p.rate {
                RateSpec::Constant(r) => r,
                RateSpec::Ramp(..) => return Err(HoldError::PublishRamp),
            },
            message_size: p.message_size,
            redis_channel: format!("{}{}", p.redis_prefix, req.target.channel()),
        }),
    };
    let hold = HoldRun {
        connections: req.connections,
        rate: req.rate,
        target: req.target.clone(),
        tls: req.tls.clone(),
        fit,
        settings: req.settings,
        duration: req.duration,
        publish,
    };
    let lines = start_lines(&hold, &machine, req.output.as_ref());
    let results = req.output.clone().map(|path| ResultFile {
        path,
        header: header(&req, &hold),
        append: false,
    });
    let setup = Setup {
        command: WorkerCommand::this_program(&WORKER_ARGS)?,
        results,
        progress: req.progress,
    };
    Ok(Prepared { hold, setup, lines })
}

impl Prepared {
    /// What will run, every default that matters, one line each.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// The fitted run and its set-up, for a caller that runs it its own
    /// way (`knee` runs it once per level).
    pub fn into_parts(self) -> (HoldRun, Setup) {
        (self.hold, self.setup)
    }

    /// Runs it.
    pub fn run(self) -> io::Result<Summary> {
        super::run(self.hold, self.setup)
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
            match h.duration {
                Some(d) => format!(
                    "{} once every connection is open or failed",
                    fmt_duration(d)
                ),
                None => "until Ctrl-C".to_owned(),
            }
        ),
        format!(
            "  workers {} ({}), at most {} connections each",
            fit.workers, fit.workers_reason, fit.per_worker
        ),
        format!("  sources {}", fit.sources_reason),
        format!(
            "  target ports {} × sources {sources} = {} pairs, at most {} connections per pair (usable local ports per pair {}, ip_local_port_range {lo}-{hi})",
            h.target.port_count(),
            u64::from(h.target.port_count()) * sources as u64,
            fit.per_pair,
            machine.usable_ports(),
        ),
    ];
    if let Some(tls) = &h.tls {
        out.push(format!("  tls: {}", tls.describe()));
    }
    let s = &h.settings;
    out.push(format!(
        "  timeouts: connect {} ms, handshake {} ms, close {} ms; max message {}; open-file limit {}/process",
        s.connect_timeout_ms,
        s.handshake_timeout_ms,
        s.close_timeout_ms,
        fmt_size(s.max_message),
        machine.nofile
    ));
    if let Some(p) = &h.publish {
        let via = match &p.target {
            PublishTarget::Redis { url, trust, .. } if url.tls => {
                format!(" (Redis channel {}; {})", p.redis_channel, trust.describe())
            }
            PublishTarget::Redis { .. } => format!(" (Redis channel {})", p.redis_channel),
            PublishTarget::Http { .. } => String::new(),
        };
        out.push(format!(
            "  publish {}{via} at {}/s, {} bytes per message, from {} ms after every connection is open; timeout {}",
            p.target,
            p.rate,
            p.message_size,
            PUBLISH_SETTLE.as_millis(),
            fmt_duration(PUBLISH_TIMEOUT)
        ));
    }
    if let Some(o) = output {
        out.push(format!("  results to {}", o.display()));
    }
    out
}

/// The result file's header: the command line and what the run was.
fn header(req: &Request, h: &HoldRun) -> Header {
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
            "publish": h.publish.as_ref().map(|p| serde_json::json!({
                "target": p.target.to_string(), "rate": p.rate, "message_size": p.message_size,
            })),
        }),
    )
}
