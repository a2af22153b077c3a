//! `throng bench`, the one-command proof: picks N from this machine's
//! limits and memory, checks those limits as `throng doctor` does, starts
//! `throng serve` as a child ([`server`]), holds N connections to it with
//! `hold`'s machinery (this process its supervisor, the workers its
//! children), publishes timestamped messages to all of them, samples the
//! host with both sides' processes labelled ([`monitor`]), stops the
//! server, and reports what was held, how fast, at what memory and CPU
//! cost, and how every message was delivered ([`costs`], [`report`]); a
//! result file and an HTML report go beside it.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;
use throng_host::doctor::{self, Role, Status};
use throng_host::sample::HostSample;
use throng_host::units::fmt_duration;
use throng_report::format::Header;

use crate::harness::Setup;
use crate::harness::clock::now_unix_ns;
use crate::harness::collect::ResultFile;
use crate::harness::machine::Machine;
use crate::harness::pool::WorkerCommand;
use crate::harness::progress::Progress;
use crate::hold::plan::{self, Fit, PlanError};
use crate::hold::request::WORKER_ARGS;
use crate::hold::supervisor::{HoldRun, PublishPlan};
use crate::hold::target::{PublishTarget, WsTarget};
use crate::hold::{Settings, Summary};
use crate::pacer::RateSpec;
use crate::threshold::Threshold;
use crate::tls::{TlsClient, TlsOptions};

pub mod costs;
pub mod figures;
pub mod limits;
pub mod monitor;
pub mod report;
pub mod results;
pub mod server;

pub use report::{Report, Verdict, criteria, render};
use results::Results;

/// The most connections a default run holds: enough to prove the point, short enough to wait for.
pub const DEFAULT_MAX: u64 = 100_000;
/// Memory a default run may plan on per connection (both ends, user and kernel),
/// generous against the measured ~10 KiB so a default run never nears the OOM killer.
pub const PLAN_BYTES_PER_CONNECTION: u64 = 32 * 1024;
/// Ports the server listens on: one accept queue each, so that a burst of
/// connects on a busy machine does not overflow one queue (SYNs dropped there
/// are retried only after 1, 3, 7, 15, 31 s).
pub const LISTEN_PORTS: u16 = 8;
/// Close handshakes of 100,000 connections take seconds on two cores: the
/// close timeout is this, plus a second per [`CLOSES_PER_S`] connections.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Close handshakes per second the close timeout allows for (both sides on
/// two cores, with room: measured at about twice this).
pub const CLOSES_PER_S: u64 = 10_000;
/// Deliveries per second the time estimate counts on (measured: about
/// 80,000/s on two cores at 1,000,000 connections, docs/scale.md).
pub const DELIVERIES_PER_S: u64 = 80_000;
/// Default connect rates: a TLS handshake costs the server about 0.2 ms of
/// CPU and the harness as much again (docs/tls.md), on the same cores.
pub const DEFAULT_RATE: RateSpec = RateSpec::Constant(10_000.0);
/// See [`DEFAULT_RATE`].
pub const DEFAULT_RATE_TLS: RateSpec = RateSpec::Constant(2_500.0);
/// How long the server may take to stop after SIGTERM before it is killed.
pub const SERVER_STOP: Duration = Duration::from_secs(15);
/// Pings per second the server may send over all connections: each costs a
/// wake-up and a loopback round trip on both sides (measured: ~20 µs of CPU
/// per ping and pong at 200,000 connections), so the default 30 s interval
/// would spend a third of two cores on keep-alives at 1,000,000.
pub const MAX_PINGS_PER_S: u64 = 2_000;
/// The server's ping interval at most (the 10M seed server pinged every 5 minutes).
pub const MAX_PING_INTERVAL: Duration = Duration::from_secs(300);
/// Connect, TLS and upgrade timeouts on both sides: on a busy machine a
/// connection waits in queues (the server's accept queue, a worker's run
/// queue) for seconds before anyone works on it; that is lag, not failure.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The settings a bench chooses for its scale, every one printed at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleSettings {
    /// The server's `--ping-interval` (its idle timeout is 3 times it).
    pub ping_interval: Duration,
    /// The server's `--handshake-timeout` and the harness's connect and
    /// handshake timeouts.
    pub connect_timeout: Duration,
    /// How long the harness waits for the server's close frames at the end.
    pub close_timeout: Duration,
}

impl ScaleSettings {
    /// The settings for `connections`: pings at most [`MAX_PINGS_PER_S`]
    /// (the server's default of 30 s below 60,000 connections), up to
    /// [`MAX_PING_INTERVAL`]; [`CONNECT_TIMEOUT`].
    pub fn for_connections(connections: u64) -> Self {
        let secs = connections.div_ceil(MAX_PINGS_PER_S).max(30);
        Self {
            ping_interval: Duration::from_secs(secs).min(MAX_PING_INTERVAL),
            connect_timeout: CONNECT_TIMEOUT,
            close_timeout: CLOSE_TIMEOUT + Duration::from_secs(connections / CLOSES_PER_S),
        }
    }

    /// The start line that says them, and why.
    pub fn line(&self, connections: u64) -> String {
        let per_s = connections as f64 / self.ping_interval.as_secs_f64();
        let why = if per_s > MAX_PINGS_PER_S as f64 {
            format!(
                "{} is the longest interval it uses, past the {MAX_PINGS_PER_S}/s it aims at",
                fmt_duration(MAX_PING_INTERVAL)
            )
        } else {
            format!("at most {MAX_PINGS_PER_S}/s")
        };
        format!(
            "  settings  server pings every {} ({per_s:.0}/s over {connections} connections; {why}), idle timeout {}; connect, TLS and upgrade timeouts {} on both sides; close timeout {}",
            fmt_duration(self.ping_interval),
            fmt_duration(self.ping_interval * 3),
            fmt_duration(self.connect_timeout),
            fmt_duration(self.close_timeout),
        )
    }
}
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A bench as the command line asks for it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The command line, for the result file's header.
    pub command_line: Vec<String>,
    /// Connections to hold (`None`: from the machine's limits and memory).
    pub connections: Option<u64>,
    /// New connections per second (`None`: [`DEFAULT_RATE`], with TLS [`DEFAULT_RATE_TLS`]).
    pub rate: Option<RateSpec>,
    /// Hold `wss://` connections to a server that terminates TLS.
    pub tls: bool,
    /// Messages to publish to every connection.
    pub messages: u32,
    /// Time between messages.
    pub message_every: Duration,
    /// Size of each message, bytes.
    pub message_size: usize,
    /// Timeout of one publish call.
    pub publish_timeout: Duration,
    /// Where the result file and the HTML report go.
    pub out_dir: PathBuf,
    /// The live view (and where the start lines go).
    pub progress: Progress,
    /// Run on the host's network even where a private namespace would
    /// give the run a TCP connection table of its size (as root, when the
    /// host's would chain the run's sockets: the `network` start line).
    pub host_network: bool,
    /// `--threshold`s on the figures bench prints ([`figures::FIGURES`]),
    /// checked beside its own criteria.
    pub thresholds: Vec<Threshold>,
    /// `--abort-on-fail`: stop the hold once one of `thresholds` can no
    /// longer pass (those hold's running totals can tell).
    pub abort_on_fail: bool,
}

/// Why a bench could not run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A setting that makes no bench.
    #[error("{0}")]
    Setting(String),
    /// A limit of this machine will stop the run (the findings were shown).
    #[error(
        "a limit of this machine will stop a run of {0} connections (above); run 'throng doctor \
         --connections {0}' for the fixes, or use a smaller --connections"
    )]
    Limits(u64),
    /// The run does not fit the machine.
    #[error("this run does not fit the machine (see 'throng doctor'): {0}")]
    Plan(#[from] PlanError),
    /// The server could not be started.
    #[error("cannot start the server: {0}")]
    Spawn(io::Error),
    /// The server did not say it was listening, or did not answer /healthz, in time.
    #[error("the server did not become ready: {0}")]
    NotReady(String),
    /// The server exited before it was ready, having said `said` last.
    #[error("the server exited before it was ready ({status}){}", said.as_ref().map_or_else(String::new, |s| format!(": {s}")))]
    ServerExited {
        /// Its exit status.
        status: String,
        /// Its last stderr lines.
        said: Option<String>,
    },
    /// The server exited while the connections were held.
    #[error(
        "the server exited during the run; its connections are gone (a limit? see 'throng \
         doctor --connections {0}')"
    )]
    ServerDied(u64),
    /// Reading or writing a result file.
    #[error("{0}")]
    Results(String),
    /// The machine, a file, the harness. Transparent: the OS's error said
    /// once, not again as its own source.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// What a bench will run, decided before anything starts.
struct Plan {
    connections: u64,
    rate: RateSpec,
    machine: Machine,
    snapshot: doctor::HostLimits,
    fit: Fit,
    network: Network,
}

/// Where a bench's connections live. Both ends are on this machine, so the
/// kernel's table of established connections holds two sockets per
/// connection; the host's is sized at boot (262,144 buckets on 24 GiB), and
/// at a million connections its chains make every segment's lookup a walk
/// (the fan-out took 11.6 s against 8.4 s in a table of its size:
/// docs/scale.md). As root on Linux 6.1+ the bench runs in a private
/// network namespace whose table fits ([`throng_host::netns`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Network {
    /// The host's network: its table is big enough, or `--host-network`.
    Host,
    /// The host's, although its chains will be long: not root, or a
    /// kernel that cannot size a namespace's table.
    HostTooSmall { buckets: u64, sockets: u64 },
    /// A namespace of the bench's own with a table of `buckets`.
    Private {
        buckets: u64,
        host_buckets: u64,
        sockets: u64,
    },
}

impl Network {
    /// Decides for `sockets` from the TCP table finding `throng doctor`
    /// made (its absence: a kernel that does not say: the host's).
    fn choose(sockets: u64, snapshot: &doctor::HostLimits, host_network: bool) -> Self {
        let Some(host) = snapshot.tcp_buckets.filter(|b| *b > 0) else {
            return Self::Host;
        };
        if host_network || sockets <= host.saturating_mul(doctor::TCP_CHAIN_WARN) {
            return Self::Host;
        }
        if throng_host::netns::root() && snapshot.child_tables {
            Self::Private {
                buckets: throng_host::netns::buckets_for(sockets),
                host_buckets: host,
                sockets,
            }
        } else {
            Self::HostTooSmall {
                buckets: host,
                sockets,
            }
        }
    }

    /// The start line that says where the run is, and why.
    fn line(self) -> Option<String> {
        match self {
            Self::Host => None,
            Self::HostTooSmall { buckets, sockets } => Some(format!(
                "  network   the host's, whose TCP table has {buckets} buckets for {sockets} sockets \
                 (chains of {:.1}: slower fan-outs; as root, throng bench gives the run a table of its size)",
                sockets as f64 / buckets as f64
            )),
            Self::Private {
                buckets,
                host_buckets,
                sockets,
            } => Some(format!(
                "  network   a private namespace (loopback only) with a TCP table of {buckets} buckets: \
                 the host's {host_buckets} would chain {sockets} sockets {:.1} deep (--host-network keeps it)",
                sockets as f64 / host_buckets as f64
            )),
        }
    }

    fn json(self) -> serde_json::Value {
        match self {
            Self::Host => serde_json::json!({ "namespace": "host" }),
            Self::HostTooSmall { buckets, sockets } => {
                serde_json::json!({ "namespace": "host", "tcp_buckets": buckets, "sockets": sockets })
            }
            Self::Private {
                buckets,
                host_buckets,
                sockets,
            } => serde_json::json!({
                "namespace": "private",
                "tcp_buckets": buckets,
                "host_tcp_buckets": host_buckets,
                "sockets": sockets,
            }),
        }
    }
}

/// Runs a whole bench; the start lines go where `req.progress` says.
pub fn run(req: Request) -> Result<Report, BenchError> {
    if req.message_every.is_zero() {
        return Err(BenchError::Setting(
            "--message-every must be more than 0".into(),
        ));
    }
    let mut plan = plan(&req)?;
    enter_network(&mut plan);
    std::fs::create_dir_all(&req.out_dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot create {}: {e}", req.out_dir.display()),
        )
    })?;
    let files = Files::new(&req.out_dir);
    // Whatever ends the run (a full disk), no hidden or partial file stays.
    let mut cleanup = Cleanup {
        files: &files,
        done: false,
    };
    req.progress.say(&headline(&req, &plan));
    if let Some(line) = busy_machine(&load_average(), plan.machine.cores) {
        req.progress.say(&line);
    }
    let scale = ScaleSettings::for_connections(plan.connections);
    let program = std::env::current_exe()?;
    let (serve_args, mut server) = start_server(&program, plan.connections, req.tls, &scale)?;
    let tls = if req.tls {
        Some(trust_the_server(&server, &files.cert)?)
    } else {
        None
    };
    let server_workers = monitor::children(server.pid()).len();
    start_lines(
        &req,
        &plan,
        &files,
        &server,
        server_workers,
        &serve_args,
        &scale,
    );
    let settings_json = settings_json(&req, &plan, server_workers, &serve_args, &scale);
    let hold = hold_run(
        &req,
        (plan.connections, plan.rate, plan.fit),
        &server,
        &serve_args.ports,
        tls,
        &scale,
    )?;
    let setup = Setup {
        command: WorkerCommand {
            program,
            args: WORKER_ARGS.iter().map(|a| (*a).to_owned()).collect(),
        },
        results: Some(ResultFile {
            path: files.hold.clone(),
            header: Header::new(req.command_line.clone(), settings_json.clone()),
            append: false,
        }),
        progress: req.progress,
        remote: None,
        metrics: None,
    };
    let (
        summary,
        Measured {
            samples,
            before_ns,
            server_killed,
        },
    ) = hold_and_measure(
        &mut server,
        hold,
        setup,
        plan.connections,
        crate::threshold::live(&req.thresholds, req.abort_on_fail),
    )?;
    // One read of hold's file: the figures, the bench's own file, the page.
    let mut results = Results::copy(&files.hold, &files.results, &samples)?;
    let intervals = results.intervals();
    let (memory, cpu) = costs::costs(&samples, before_ns, summary.peak_open.max(0) as u64);
    let planned_rate = match plan.rate {
        RateSpec::Constant(r) => Some(r),
        RateSpec::Ramp(..) | RateSpec::Stages(_) => None,
    };
    let report = Report::new(report::Parts {
        settings: settings_json,
        connections: plan.connections,
        messages_asked: req.messages,
        memory,
        cpu,
        delivery_cpu: costs::delivery_cpu(&samples, &intervals),
        connect_cpu: costs::connect_cpu(&samples, &intervals, plan.machine.cores as f64),
        messages: costs::per_message(&intervals, results.tallies()),
        limits: limits::reached(&intervals, &samples, summary.start_unix_ns, planned_rate),
        result_file: files.results.clone(),
        html_report: files.html.clone(),
        server_killed,
        hold: summary,
        thresholds: req.thresholds,
    });
    let summary = report.to_record(
        now_unix_ns(),
        format!("{}/bench", throng_host::sample::hostname()),
    );
    results.finish(&summary, &files.html)?;
    cleanup.done = true;
    Ok(report)
}

/// Removes a bench's own scratch files (hold's result file, the
/// certificate) when the run ends, and its results and page too when it
/// ends in an error: a run that could not finish its file leaves none.
struct Cleanup<'a> {
    files: &'a Files,
    /// The results and the page were written whole.
    done: bool,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let f = self.files;
        let _ = std::fs::remove_file(&f.hold);
        let _ = std::fs::remove_file(&f.cert);
        if !self.done {
            let _ = std::fs::remove_file(&f.results);
            let _ = std::fs::remove_file(&f.html);
        }
    }
}

/// Enters the private network namespace the plan chose, before the
/// server, the harness workers and any thread start (all of them inherit
/// it); where it cannot, the run stays on the host's and says so.
fn enter_network(plan: &mut Plan) {
    if let Network::Private {
        buckets,
        host_buckets,
        sockets,
    } = plan.network
    {
        // Before the server, the harness workers and any thread start: all
        // of them inherit it.
        if let Err(e) = throng_host::netns::enter_private(buckets) {
            eprintln!(
                "throng bench: warning: cannot make a private network namespace ({e}); the run stays on the host's"
            );
            plan.network = Network::HostTooSmall {
                buckets: host_buckets,
                sockets,
            };
        }
    }
}

/// The start lines after the headline: the server, the harness, the
/// messages, where the results go, the settings, the network, the
/// verdict's criteria and the time to expect.
fn start_lines(
    req: &Request,
    plan: &Plan,
    files: &Files,
    server: &server::Server,
    server_workers: usize,
    serve_args: &ServeArgs,
    scale: &ScaleSettings,
) {
    let say = |line: &str| req.progress.say(line);
    let scheme = if req.tls { "wss" } else { "ws" };
    let ports = &serve_args.ports;
    say(&format!(
        "  server    throng serve on {scheme}://127.0.0.1:{ports}{}, {server_workers} worker(s) (pid {})",
        if req.tls {
            " (self-signed ECDSA P-256; the harness trusts only it, full handshakes)"
        } else {
            ""
        },
        server.pid()
    ));
    say(&format!(
        "  harness   {} worker(s) ({}), sources {}, rate {}",
        plan.fit.workers, plan.fit.workers_reason, plan.fit.sources_reason, plan.rate,
    ));
    say(&format!(
        "  messages  {} of {} bytes, one every {}, over HTTP POST to /publish/bench; publish timeout {} (a late answer is counted apart: the message was sent)",
        req.messages,
        req.message_size,
        fmt_duration(req.message_every),
        fmt_duration(req.publish_timeout)
    ));
    say(&format!(
        "  results   {} and {}",
        files.results.display(),
        files.html.display()
    ));
    say(&scale.line(plan.connections));
    if let Some(line) = plan.network.line() {
        say(&line);
    }
    say(&format!(
        "  verdict   {}",
        criteria(plan.connections, req.messages)
    ));
    if let Some(line) = crate::threshold::start_line(&req.thresholds, req.abort_on_fail) {
        say(&line);
    }
    say(&format!(
        "  expect    {}",
        expected_time(plan.connections, plan.rate, req.messages, req.message_every)
    ));
}

/// The settings of the run, as the result file's header holds them.
fn settings_json(
    req: &Request,
    plan: &Plan,
    server_workers: usize,
    serve_args: &ServeArgs,
    scale: &ScaleSettings,
) -> serde_json::Value {
    let ports = &serve_args.ports;
    serde_json::json!({
        "subcommand": "bench",
        "connections": plan.connections,
        "rate": plan.rate.to_string(),
        "messages": req.messages,
        "message_every_s": req.message_every.as_secs_f64(),
        "message_size": req.message_size,
        "tls": req.tls,
        "server": { "address": format!("127.0.0.1:{ports}"), "workers": server_workers, "args": serve_args.args },
        "harness": { "workers": plan.fit.workers, "sources": plan.fit.sources.iter().map(ToString::to_string).collect::<Vec<_>>() },
        "settings": hold_settings(scale),
        "network": plan.network.json(),
        "machine": { "cores": plan.machine.cores, "nofile": plan.machine.nofile, "mem_available": plan.snapshot.mem_available },
    })
}

/// The harness's timeouts for the bench's scale.
fn hold_settings(scale: &ScaleSettings) -> Settings {
    Settings {
        close_timeout_ms: crate::harness::clock::millis(scale.close_timeout),
        connect_timeout_ms: crate::harness::clock::millis(scale.connect_timeout),
        handshake_timeout_ms: crate::harness::clock::millis(scale.connect_timeout),
        ..Settings::default()
    }
}

/// `hold`'s run: every connection to the server's ports, and its
/// publisher posting the messages to the server's plain address.
fn hold_run(
    req: &Request,
    (connections, rate, fit): (u64, RateSpec, Fit),
    server: &server::Server,
    ports: &str,
    tls: Option<TlsOptions>,
    scale: &ScaleSettings,
) -> Result<HoldRun, BenchError> {
    let scheme = if req.tls { "wss" } else { "ws" };
    let addr = server.addr();
    Ok(HoldRun {
        connections,
        rate,
        target: format!("{scheme}://127.0.0.1:{ports}/bench")
            .parse()
            .map_err(setting)?,
        tls,
        mqtt: None,
        fit,
        settings: hold_settings(scale),
        // Held until every message is published and delivered.
        duration: None,
        publish: Some(PublishPlan {
            target: format!("http://{addr}/publish/bench")
                .parse::<PublishTarget>()
                .map_err(setting)?,
            rate: 1.0 / req.message_every.as_secs_f64(),
            message_size: req.message_size,
            redis_channel: "throng:bench".into(),
            messages: Some(u64::from(req.messages)),
            timeout: req.publish_timeout,
            clients: 1,
        }),
        sessions: None,
    })
}

/// What the hold measured beside its summary.
struct Measured {
    /// The monitor's host samples, the server's processes labelled.
    samples: Vec<HostSample>,
    /// When the harness started: the last sample before is the idle baseline.
    before_ns: u64,
    /// The server did not stop in time after SIGTERM and was killed.
    server_killed: bool,
}

/// Lets the monitor see the idle server, then holds, then stops the
/// server: an error if it died during the run.
fn hold_and_measure(
    server: &mut server::Server,
    hold: HoldRun,
    setup: Setup,
    connections: u64,
    live: Vec<Threshold>,
) -> Result<(Summary, Measured), BenchError> {
    let monitor = monitor::Monitor::start(server.pid(), Duration::from_millis(250));
    std::thread::sleep(Duration::from_millis(600));
    let before_ns = now_unix_ns();
    monitor.arm(true);
    let held = if live.is_empty() {
        crate::hold::run(hold, setup)
    } else {
        crate::hold::supervisor::run_until_doomed(hold, setup, live)
    };
    monitor.arm(false);
    let server_died = monitor.server_died() || server.exited().is_some();
    let samples = monitor.finish();
    let server_killed = server.stop(SERVER_STOP).is_none();
    let summary = held?;
    if server_died {
        return Err(BenchError::ServerDied(connections));
    }
    Ok((
        summary,
        Measured {
            samples,
            before_ns,
            server_killed,
        },
    ))
}

/// How long a bench should take, in words: the ramp at `rate`, the
/// messages, the last fan-out and the closing, at the speeds measured on
/// two cores ([`DELIVERIES_PER_S`], [`CLOSES_PER_S`] twice over).
pub fn expected_time(connections: u64, rate: RateSpec, messages: u32, every: Duration) -> String {
    let ramp = match rate {
        RateSpec::Constant(r) if r > 0.0 => Duration::from_secs_f64(connections as f64 / r),
        RateSpec::Ramp(a, b) if a + b > 0.0 => {
            Duration::from_secs_f64(2.0 * connections as f64 / (a + b))
        }
        _ => Duration::ZERO,
    };
    let publishing = every * messages.saturating_sub(1) + Duration::from_secs(2);
    let fanout = Duration::from_secs(connections / DELIVERIES_PER_S + 1);
    let closing = Duration::from_secs(connections / (2 * CLOSES_PER_S) + 2);
    let total = ramp + publishing + fanout + closing + Duration::from_secs(3);
    let round = |d: Duration| fmt_duration(Duration::from_secs(d.as_secs().max(1)));
    format!(
        "about {} on two idle cores: opening {}, {messages} messages over {}, the last one's fan-out ~{}, closing ~{}",
        round(total),
        round(ramp),
        round(publishing),
        round(fanout),
        round(closing)
    )
}

/// `/proc/loadavg`'s 1-minute figure (0 when unreadable).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default()
}

/// A warning when other programs keep the machine busy (`loadavg`, as
/// `/proc/loadavg` has it, at half the cores or more): the run still
/// holds (its timeouts allow for queues), but it is slower, and the
/// summary's CPU limit will say whose CPU it was.
fn busy_machine(loadavg: &str, cores: usize) -> Option<String> {
    let load: f64 = loadavg.split_whitespace().next()?.parse().ok()?;
    (load >= cores.max(1) as f64 / 2.0).then(|| {
        format!(
            "  WARNING  load average {load:.1} on {cores} cores before the run: other programs are busy; \
             this run will be slower, and its summary shows their share of the CPU"
        )
    })
}

fn setting(e: impl std::fmt::Display) -> BenchError {
    BenchError::Setting(e.to_string())
}

/// The connection count, the rate and the fit, once the machine's limits
/// said yes: a limit that will stop the run stops it now.
fn plan(req: &Request) -> Result<Plan, BenchError> {
    let machine = Machine::probe()?;
    let snapshot = doctor::HostLimits::read(&doctor::proc_root());
    let connections = req
        .connections
        .unwrap_or_else(|| default_connections(&snapshot));
    let (fit, check) = layout(connections, &machine)?;
    let mut findings = doctor::check_machine(&check, &snapshot);
    let network = Network::choose(check.sockets(), &snapshot, req.host_network);
    if network != Network::Host {
        // The network line says it, with what the bench does about it.
        findings.retain(|f| f.check != doctor::TCP_TABLE);
    }
    for line in doctor::warning_lines(&findings) {
        eprintln!("throng bench: {line}");
    }
    if findings.iter().any(|f| f.status == Status::Stop) {
        return Err(BenchError::Limits(connections));
    }
    let rate = req.rate.unwrap_or(if req.tls {
        DEFAULT_RATE_TLS
    } else {
        DEFAULT_RATE
    });
    Ok(Plan {
        connections,
        rate,
        machine,
        snapshot,
        fit,
        network,
    })
}

/// The first start line: how many connections, and on what.
fn headline(req: &Request, plan: &Plan) -> String {
    format!(
        "throng bench: {} connections{} on {} cores, {} MiB available, open-file limit {}/process",
        plan.connections,
        if req.connections.is_some() {
            ""
        } else {
            " (default: from this machine's limits and memory)"
        },
        plan.machine.cores,
        plan.snapshot.mem_available.unwrap_or(0) >> 20,
        plan.machine.nofile
    )
}

/// The connections a bench holds when none are asked for: [`DEFAULT_MAX`],
/// fewer where half the memory available would not hold them at
/// [`PLAN_BYTES_PER_CONNECTION`].
pub fn default_connections(snapshot: &doctor::HostLimits) -> u64 {
    let by_memory = snapshot
        .mem_available
        .map_or(DEFAULT_MAX, |m| m / 2 / PLAN_BYTES_PER_CONNECTION);
    let n = DEFAULT_MAX.min(by_memory);
    // Round to a figure a person reads at a glance.
    if n >= 10_000 {
        n / 10_000 * 10_000
    } else {
        n.max(100)
    }
}

/// How a bench lays out `connections` on `machine`: the harness's fit
/// (workers, loopback source addresses) and the plan `throng doctor`
/// checks (both sides here, those sources × [`LISTEN_PORTS`] server
/// ports). `throng doctor` shows this same plan, so the two never disagree
/// about one run.
pub fn layout(connections: u64, machine: &Machine) -> Result<(Fit, doctor::Plan), PlanError> {
    // The server's ports are known only once it runs; any loopback port
    // plans the same.
    // Invariant: a constant, well-formed URL.
    let placeholder: WsTarget = "ws://127.0.0.1:1/bench".parse().expect("a well-formed URL");
    let fit = plan::fit(
        &plan::Request {
            connections,
            target: placeholder,
            sources: None,
            workers: None,
        },
        machine,
    )?;
    let check = doctor::Plan {
        source_ips: fit.sources.len().max(1) as u64,
        target_ports: u64::from(LISTEN_PORTS),
        source_list: Some(crate::hold::target::format_sources(&fit.sources)),
        bench: true,
        ..doctor::Plan::new(connections, Role::Both)
    };
    Ok((fit, check))
}

/// What a bench would run, one line each, without starting anything
/// (`throng bench --dry-run`): the plan, and the limits it passed.
pub fn dry_run(req: &Request) -> Result<Vec<String>, BenchError> {
    let plan = plan(req)?;
    Ok(vec![
        headline(req, &plan),
        format!(
            "  harness   {} worker(s) ({}), sources {}, rate {}",
            plan.fit.workers, plan.fit.workers_reason, plan.fit.sources_reason, plan.rate
        ),
        format!("  server    throng serve on {LISTEN_PORTS} free loopback ports"),
        ScaleSettings::for_connections(plan.connections).line(plan.connections),
    ]
    .into_iter()
    .chain(plan.network.line())
    .chain([
        format!("  verdict   {}", criteria(plan.connections, req.messages)),
        "dry run: the limits allow it; nothing started".to_owned(),
    ])
    .collect())
}

/// The files of one bench, named by its start time.
struct Files {
    results: PathBuf,
    html: PathBuf,
    /// `hold`'s own result file, copied into `results` with the server's samples.
    hold: PathBuf,
    /// The certificate the harness trusts (`--tls`).
    cert: PathBuf,
}

impl Files {
    fn new(dir: &Path) -> Self {
        let stamp = throng_report::format::rfc3339(now_unix_ns())
            .replace([':', '-'], "")
            .chars()
            .take(15)
            .collect::<String>();
        Self {
            results: dir.join(format!("bench-{stamp}.jsonl")),
            html: dir.join(format!("bench-{stamp}.html")),
            hold: dir.join(format!(".bench-{stamp}.hold.jsonl")),
            cert: dir.join(format!(".bench-{stamp}.cert.pem")),
        }
    }
}

/// Starts `throng serve` on free ports. The ports are probed free, then
/// bound by the server: another program can take one meanwhile, so a server
/// that exits saying a port is in use is started again on other ports.
fn start_server(
    program: &Path,
    connections: u64,
    tls: bool,
    scale: &ScaleSettings,
) -> Result<(ServeArgs, server::Server), BenchError> {
    const TRIES: u32 = 3;
    let mut tries = 0;
    loop {
        tries += 1;
        let args = serve_args(connections, tls, scale)?;
        match server::Server::start(program, &args.args, Duration::from_secs(20)) {
            Ok(server) => return Ok((args, server)),
            Err(BenchError::ServerExited {
                said: Some(ref said),
                ..
            }) if tries < TRIES && said.contains("cannot listen on") => {}
            Err(e) => return Err(e),
        }
    }
}

/// `throng serve`'s arguments and the port range it listens on.
struct ServeArgs {
    args: Vec<String>,
    /// `FIRST-LAST`.
    ports: String,
}

/// `serve` on [`LISTEN_PORTS`] free loopback ports, sized for `connections`
/// with the ping interval and handshake timeout of `scale`;
/// with TLS, subscribers on TLS ports and publishing, `/healthz` and
/// `/metrics` on a plain one.
fn serve_args(connections: u64, tls: bool, scale: &ScaleSettings) -> io::Result<ServeArgs> {
    let first = server::free_port_range(LOOPBACK, LISTEN_PORTS)?;
    let ports = format!("{first}-{}", first + LISTEN_PORTS - 1);
    let mut args: Vec<String> = vec!["serve".into(), "--listen".into()];
    if tls {
        // Not one of the TLS ports (each probe's listeners are gone by the
        // next): serve refuses an address given twice.
        let tls_ports = first..first + LISTEN_PORTS;
        let mut plain = server::free_port_range(LOOPBACK, 1)?;
        while tls_ports.contains(&plain) {
            plain = server::free_port_range(LOOPBACK, 1)?;
        }
        args.extend([
            format!("127.0.0.1:{plain}"),
            "--tls-listen".into(),
            format!("127.0.0.1:{ports}"),
            "--tls-self-signed".into(),
        ]);
    } else {
        args.push(format!("127.0.0.1:{ports}"));
    }
    args.extend([
        "--max-connections".into(),
        connections.to_string(),
        "--ping-interval".into(),
        fmt_duration(scale.ping_interval),
        "--handshake-timeout".into(),
        fmt_duration(scale.connect_timeout),
        "--json".into(),
    ]);
    Ok(ServeArgs { args, ports })
}

/// TLS options that trust exactly the certificate the server made (its PEM
/// is in its start line), written to `cert`.
fn trust_the_server(server: &server::Server, cert: &Path) -> Result<TlsOptions, BenchError> {
    let pem = server.start_line()["config"]["tls"]["cert_pem"]
        .as_str()
        .ok_or_else(|| {
            BenchError::NotReady("the server's start line has no TLS certificate".into())
        })?;
    std::fs::write(cert, pem)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {}: {e}", cert.display())))?;
    let opts = TlsOptions {
        insecure: false,
        ca_file: Some(cert.to_path_buf()),
        resume: false,
    };
    TlsClient::new(&opts).map_err(|e| BenchError::Setting(format!("setting up TLS: {e}")))?;
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_follow_the_scale() {
        let small = ScaleSettings::for_connections(20_000);
        assert_eq!(
            small.ping_interval,
            Duration::from_secs(30),
            "the server's default"
        );
        assert_eq!(small.close_timeout, Duration::from_secs(12));
        let big = ScaleSettings::for_connections(1_000_000);
        assert_eq!(big.ping_interval, MAX_PING_INTERVAL);
        assert_eq!(big.close_timeout, Duration::from_secs(110));
        let mid = ScaleSettings::for_connections(100_000);
        assert_eq!(mid.ping_interval, Duration::from_secs(50), "2,000 pings/s");
        assert!(big.line(1_000_000).contains(
            "pings every 5m (3333/s over 1000000 connections; 5m is the longest interval it uses, past the 2000/s it aims at)"
        ));
        assert!(
            mid.line(100_000)
                .contains("pings every 50s (2000/s over 100000 connections; at most 2000/s)")
        );
    }

    #[test]
    fn the_network_follows_the_tcp_table() {
        let p = throng_testkit::fake_proc::FakeProc::new("bench-network");
        p.set("net.ipv4.tcp_ehash_entries", "-262144");
        let old_kernel = doctor::HostLimits::read(p.root());
        p.set("net.ipv4.tcp_child_ehash_entries", "0");
        let m = doctor::HostLimits::read(p.root());
        assert_eq!(Network::choose(200_000, &m, false), Network::Host);
        assert_eq!(Network::choose(2_000_000, &m, true), Network::Host);
        let too_small = Network::HostTooSmall {
            buckets: 262_144,
            sockets: 2_000_000,
        };
        assert_eq!(Network::choose(2_000_000, &old_kernel, false), too_small);
        let own = Network::choose(2_000_000, &m, false);
        if throng_host::netns::root() {
            assert_eq!(
                own,
                Network::Private {
                    buckets: 2_097_152,
                    host_buckets: 262_144,
                    sockets: 2_000_000
                }
            );
            let line = own.line().unwrap();
            assert!(line.contains("2097152 buckets"), "{line}");
            assert!(line.contains("7.6 deep"), "{line}");
        } else {
            assert_eq!(own, too_small);
        }
        assert!(too_small.line().unwrap().contains("chains of 7.6"));
        assert_eq!(Network::Host.line(), None);
    }

    #[test]
    fn a_busy_machine_is_named_before_the_run() {
        assert_eq!(busy_machine("0.40 0.50 0.60 1/200 123", 2), None);
        let w = busy_machine("6.23 6.28 5.21 3/400 999", 2).unwrap();
        assert!(w.contains("load average 6.2 on 2 cores"), "{w}");
        assert_eq!(busy_machine("", 2), None);
    }

    #[test]
    fn the_expected_time_adds_up_the_phases() {
        let t = expected_time(
            1_000_000,
            RateSpec::Constant(10_000.0),
            3,
            Duration::from_secs(20),
        );
        assert!(
            t.starts_with("about 3m30s on two idle cores: opening 1m40s, 3 messages over 42s"),
            "{t}"
        );
    }
}
