//! The supervisor: the `throng serve` process itself. It decides how many
//! workers to run, reserves the listen addresses, starts each worker by
//! re-executing this binary, restarts a worker that dies, relays every
//! published message to all workers, answers `/metrics` with the sum of their
//! counters, and on SIGTERM/SIGINT drains them.

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::addresses::{Addresses, Verdict};
use crate::broker::{Broker, News, Remote, Routed, fit_retained};
use crate::config::Config;
use crate::control::{Message, Record, ShareDeliver, read_record};
use crate::history::{self, History, Kept};
use crate::metrics::{self, Snapshot, SupervisorStats};
use crate::redis::{self, RedisSettings};
use crate::relay::{Answer, Publisher, Relay, WorkerId};
use crate::reload;
use crate::retained::{self, Retained};
use crate::reuseport;
use crate::sessions::{self, Sessions};
use crate::shares::Shares;
use throng_host::fdpass;
use throng_host::limits::{self, Budget, BudgetError, DEFAULT_FD_RESERVE, NoFile};
use throng_host::portlock::{self, ClaimError, PortLocks};

use crate::takeover::{self, Control, Handover, Step, TakeoverError};
use throng_host::process::{self, Signal};
use throng_host::shared::SharedCounters;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A listen address could not be bound.
    #[error(
        "cannot listen on {addr}: {source} (is another server using the port? pick another with --listen)"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A port another user's server listens on.
    #[error(
        "cannot listen on {addr}: a server of another user ({holder}) listens on port {}, and \
         the kernel lets only one user's sockets share a port{}",
        addr.port(),
        if *takeover {
            format!(
                "; --takeover works between serves of the same user only: run this one as that \
                 user (sudo -u {user} throng serve ... --takeover; under systemd User={user})"
            )
        } else {
            String::new()
        }
    )]
    OtherUser {
        /// The address.
        addr: SocketAddr,
        /// The user holding it (`name (uid N)`).
        holder: String,
        /// That user for `sudo -u` (`name`, or `#N`).
        user: String,
        /// Whether `--takeover` was asked for.
        takeover: bool,
    },
    /// No listen address was given.
    #[error("no listen address (use --listen HOST:PORT)")]
    NoListen,
    /// `--mqtt-sessions-in-redis` where the nodes cannot share them.
    #[error(
        "--mqtt-sessions-in-redis needs one Redis in pattern mode (--redis or --redis-sentinel,          not --redis-mode channels nor --redis-cluster): a session's marks must reach every node          in order with the messages. Without it, sessions are the memory of their node"
    )]
    SessionsInRedis,
    /// A port that a running `throng serve` holds.
    #[error(
        "cannot listen on port {port}: a running throng serve (pid {pid}) holds it, and two \
         servers on one port would split its connections; stop that one first (kill {pid}: it \
         drains within its --drain-timeout; under systemd: systemctl stop) or pick another port"
    )]
    PortHeld {
        /// The port.
        port: u16,
        /// The holder's pid (0: unknown).
        pid: i32,
    },
    /// The same address given to two listeners of one command.
    #[error(
        "{0} is given twice (--listen, --tls-listen, --mqtt-listen, --mqtts-listen, \
         --publish-listen, --metrics-listen); each address serves one purpose"
    )]
    Twice(SocketAddr),
    /// The lock file of the ports could not be used.
    #[error("{0}")]
    PortLock(ClaimError),
    /// An internal address (`--publish-listen`, `--metrics-listen`) that is
    /// also a public one.
    #[error(
        "{0} is both a public address (--listen/--tls-listen) and an internal one \
         (--publish-listen/--metrics-listen); give the internal one its own port"
    )]
    InternalIsPublic(SocketAddr),
    /// TLS listeners without a certificate.
    #[error(
        "--tls-listen needs a certificate: give --tls-cert FILE and --tls-key FILE, or --tls-self-signed for a trial"
    )]
    NoTlsCert,
    /// The first worker could not be started.
    #[error("cannot start worker: {0}")]
    Spawn(std::io::Error),
    /// A `--redis-prefix` with `{` or `}` on a cluster.
    #[error(
        "--redis-prefix '{0}' has a brace: on a Redis Cluster a {{hash tag}} in the prefix would \
         put every channel in one slot (one shard for everything); give a prefix without {{ }}"
    )]
    TaggedPrefix(String),
    /// `--redis-mode pattern` with `--redis-cluster`.
    #[error(
        "--redis-mode pattern cannot run on a Redis Cluster: sharded pub/sub (SSUBSCRIBE) has no \
         patterns, and PSUBSCRIBE would need plain PUBLISH, which the cluster copies to every \
         shard (every message crosses every shard: no scaling). Use --redis-mode channels (the \
         default with --redis-cluster): each node subscribes to its channels on their shards"
    )]
    PatternOnCluster,
    /// Redis (`--redis`) did not answer or refused us at start.
    #[error(
        "cannot use Redis at {url}: {reason} (start redis-server there or fix --redis; \
         --redis-wait starts anyway and keeps retrying)"
    )]
    Redis {
        /// The URL, password hidden.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The open-file limit leaves no room for subscribers.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// `--takeover` found a running serve but could not take its ports.
    #[error(transparent)]
    Takeover(#[from] TakeoverError),
    /// Something else at the OS level.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// How the worker processes are started: this binary and the arguments
/// that make it a worker; `--worker-index N` is appended.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// The executable (normally `std::env::current_exe()`).
    pub program: PathBuf,
    /// Arguments before the index (normally `["serve"]`).
    pub args: Vec<OsString>,
}

/// What the server will run with, known before any worker starts.
#[derive(Debug)]
pub struct Plan {
    /// The resolved settings (listen ports resolved, worker count decided).
    pub config: Config,
    /// Open-file limit per process after raising the soft limit.
    pub nofile: NoFile,
    /// Subscribers one worker can hold under that limit (`throng-host`'s
    /// file budget, the same as `hold`'s).
    pub per_worker: u64,
    /// CPU cores seen.
    pub cores: usize,
    /// Why the worker count is what it is.
    pub workers_why: String,
    /// The broker in use.
    pub broker: String,
    /// The Redis broker's settings (`None`: the local relay).
    pub redis: Option<RedisSettings>,
    /// The files SIGHUP reads again (certificate, keys).
    pub reload: reload::Files,
    /// Bound (not listening) sockets that hold the ports while workers start.
    reserved: Vec<socket2::Socket>,
    /// The claim on every port, so a second `throng serve` is refused.
    locks: PortLocks,
    /// `--takeover` and a running serve holds the ports: its pid.
    pub takeover_from: Option<i32>,
    /// The subscriber counts every worker shares, with `--max-connections`.
    shared: Option<SharedCounters>,
}

impl Plan {
    /// Raises the open-file limit, decides the worker count and reserves the
    /// listen addresses (port 0 becomes a real port).
    pub fn new(mut config: Config) -> Result<Self, ServeError> {
        if config.listen.is_empty() {
            return Err(ServeError::NoListen);
        }
        let public: Vec<SocketAddr> = config
            .listen
            .iter()
            .chain(&config.tls_listen)
            .chain(&config.mqtt_listen)
            .chain(&config.mqtts_listen)
            .copied()
            .collect();
        if let Some(a) = config
            .publish_listen
            .iter()
            .chain(&config.metrics_listen)
            // Port 0: each gets a port of its own.
            .find(|a| a.port() != 0 && public.contains(a))
        {
            return Err(ServeError::InternalIsPublic(*a));
        }
        if let Some(a) = given_twice(&config) {
            return Err(ServeError::Twice(a));
        }
        limits::raise_nofile()?;
        let nofile = limits::nofile()?;
        let tls_wanted = !config.tls_listen.is_empty() || !config.mqtts_listen.is_empty();
        if tls_wanted && config.tls.is_none() {
            return Err(ServeError::NoTlsCert);
        }
        // Each worker holds one listener per address besides the reserve
        // (the control socket, the epoll set, stdio): 1,001 ports are
        // 1,001 files of every worker.
        let reserve = DEFAULT_FD_RESERVE + listeners_per_worker(&config);
        let budget = limits::budget(config.max_connections.unwrap_or(0), nofile.soft, reserve)?;
        config.worker_files = Some(budget.per_worker);
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let (workers, workers_why) =
            worker_count(config.workers, cores, budget, config.max_connections);
        config.workers = workers;
        let mut reserved = Vec::new();
        let takeover = config.takeover;
        // Binds each address (port 0 becomes the port the kernel gave).
        let mut bind_all = |addrs: &mut Vec<SocketAddr>| -> Result<(), ServeError> {
            for addr in addrs.iter_mut() {
                // Held, not listening: the port is the workers' to take.
                let s = reuseport::member(*addr).map_err(|e| bind_error(*addr, e, takeover))?;
                if let Some(local) = s.local_addr().ok().and_then(|a| a.as_socket()) {
                    *addr = local;
                }
                reserved.push(s);
            }
            Ok(())
        };
        bind_all(&mut config.listen)?;
        bind_all(&mut config.tls_listen)?;
        bind_all(&mut config.mqtt_listen)?;
        bind_all(&mut config.mqtts_listen)?;
        // An address given to both internal options is one listener, bound
        // once (port 0 is a new port for each).
        let both: Vec<SocketAddr> = config
            .metrics_listen
            .iter()
            .filter(|a| a.port() != 0 && config.publish_listen.contains(a))
            .copied()
            .collect();
        let before = config.publish_listen.clone();
        bind_all(&mut config.publish_listen)?;
        let mut metrics_only: Vec<SocketAddr> = config
            .metrics_listen
            .iter()
            .filter(|a| !both.contains(a))
            .copied()
            .collect();
        bind_all(&mut metrics_only)?;
        config.metrics_listen = before
            .iter()
            .zip(&config.publish_listen)
            .filter(|(given, _)| both.contains(given))
            .map(|(_, bound)| *bound)
            .chain(metrics_only)
            .collect();
        // --max-connections is a cap over every worker: each counts its
        // subscribers in its own slot of counters they all map.
        let shared = match config.max_connections {
            Some(_) => Some(SharedCounters::create(workers)?),
            None => None,
        };
        config.shared_counters = shared.as_ref().map(SharedCounters::fd);
        let mut locks = PortLocks::open().map_err(ServeError::PortLock)?;
        let takeover_from = match claim_ports(&mut locks, &reserved) {
            // The claims are the takeover's to make (`run`).
            Err(ServeError::PortHeld { pid, .. }) if config.takeover && pid > 0 => Some(pid),
            other => other.map(|()| None)?,
        };
        Ok(Self {
            config,
            nofile,
            per_worker: budget.per_worker,
            cores,
            workers_why,
            broker: Broker::LOCAL.to_owned(),
            redis: None,
            reload: reload::Files::default(),
            reserved,
            locks,
            takeover_from,
            shared,
        })
    }

    /// Routes through Redis: checks now that Redis answers and takes our
    /// credentials (unless `settings.wait`), so a wrong URL fails at start.
    pub fn with_redis(mut self, settings: RedisSettings) -> Result<Self, ServeError> {
        if settings.sharded() && settings.mode == redis::RedisMode::Pattern {
            return Err(ServeError::PatternOnCluster);
        }
        if settings.sharded() && settings.prefix.contains(['{', '}']) {
            return Err(ServeError::TaggedPrefix(settings.prefix));
        }
        // MQTT sessions in Redis need every node to hear the marks in order
        // with the messages: one Redis in pattern mode.
        if self.config.mqtt_sessions_in_redis
            && (settings.mode != redis::RedisMode::Pattern || settings.sharded())
        {
            return Err(ServeError::SessionsInRedis);
        }
        if !settings.wait {
            settings.probe().map_err(|e| ServeError::Redis {
                url: settings.url.to_string(),
                reason: e.to_string(),
            })?;
        }
        let mut settings = settings;
        settings.history = (self.config.history > 0).then(|| crate::stream::StreamLimits {
            keep: self.config.history,
            ttl_ms: self
                .config
                .history_ttl
                .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        });
        settings.max_retained = self.config.max_retained;
        if self.config.mqtt_sessions_in_redis {
            settings.session_queue = self.config.mqtt_session_queue.max(1);
        }
        self.config.redis_mode = Some(settings.mode);
        self.broker = settings.describe();
        self.redis = Some(settings);
        Ok(self)
    }

    /// The settings and limits as one JSON object (the machine-readable start line).
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "event": "listening",
            "listen": self.config.listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "workers": self.config.workers,
            "nofile_soft": self.nofile.soft,
            "nofile_hard": self.nofile.hard,
            "connections_per_worker": self.per_worker,
            "connections_total": self.per_worker * self.config.workers as u64,
            "config": public_config(&self.config),
            "broker": self.broker,
            "tls_listen": self.config.tls_listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "mqtt_listen": self.config.mqtt_listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "mqtts_listen": self.config.mqtts_listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "publish_listen": self.config.publish_listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "metrics_listen": self.config.metrics_listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
        });
        // Keys and the publish key go to the workers, never to the start
        // line; nor does a descriptor number that means nothing outside.
        v["config"]["auth"] = self.config.auth.public_json();
        if let Some(c) = v["config"].as_object_mut() {
            c.remove("shared_counters");
        }
        // The key and ticket key go to the workers, never to the start line.
        if let Some(m) = &self.config.tls {
            v["config"]["tls"] = m.public_json();
        }
        v
    }
}

/// The config as the start line shows it: durations in the grammar every
/// flag takes (`30s`, `1m30s`) rather than serde's `{"secs":..,"nanos":..}`
/// (the workers get the latter), and the benchmark-only switch only when on.
/// The listening sockets every worker opens: one per address (an address
/// in both `--publish-listen` and `--metrics-listen` is one).
fn listeners_per_worker(config: &Config) -> u64 {
    let metrics_alone = config
        .metrics_listen
        .iter()
        .filter(|a| a.port() == 0 || !config.publish_listen.contains(a))
        .count();
    let n = config.listen.len()
        + config.tls_listen.len()
        + config.mqtt_listen.len()
        + config.mqtts_listen.len()
        + config.publish_listen.len()
        + metrics_alone;
    n as u64
}

/// An address two listener options of one command name (or a wildcard
/// and an address on the same port): the kernel would split its
/// connections between them. `--publish-listen` and `--metrics-listen` may
/// share one address (one listener serves both); port 0 is a new port each time.
fn given_twice(config: &Config) -> Option<SocketAddr> {
    let overlaps = |a: &SocketAddr, b: &SocketAddr| {
        a.port() == b.port()
            && a.is_ipv4() == b.is_ipv4()
            && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
    };
    let mut seen: Vec<SocketAddr> = Vec::new();
    let metrics_alone = config
        .metrics_listen
        .iter()
        .filter(|a| !config.publish_listen.contains(a));
    let all = config
        .listen
        .iter()
        .chain(&config.tls_listen)
        .chain(&config.mqtt_listen)
        .chain(&config.mqtts_listen)
        .chain(&config.publish_listen)
        .chain(metrics_alone)
        .filter(|a| a.port() != 0);
    for a in all {
        if seen.iter().any(|b| overlaps(a, b)) {
            return Some(*a);
        }
        seen.push(*a);
    }
    None
}

/// Claims every reserved port (after port 0 became a real one), so that a
/// second `throng serve` on any of them is refused, naming this one.
fn claim_ports(locks: &mut PortLocks, reserved: &[socket2::Socket]) -> Result<(), ServeError> {
    for s in reserved {
        let Some(port) = s
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
        else {
            continue;
        };
        locks.claim(port).map_err(|e| match e {
            ClaimError::Held { port, pid } => ServeError::PortHeld { port, pid },
            e @ ClaimError::File { .. } => ServeError::PortLock(e),
        })?;
    }
    Ok(())
}

/// The ports of `reserved`.
fn ports_of(reserved: &[socket2::Socket]) -> Vec<u16> {
    reserved
        .iter()
        .filter_map(|s| s.local_addr().ok()?.as_socket())
        .map(|a| a.port())
        .collect()
}

/// Why `addr` could not be bound: in use by another user's listener
/// (named), or the OS error.
fn bind_error(addr: SocketAddr, source: std::io::Error, takeover: bool) -> ServeError {
    let other = (source.kind() == std::io::ErrorKind::AddrInUse)
        .then(|| portlock::listener_uid(addr.port()))
        .flatten()
        .filter(|&uid| uid != fdpass::euid());
    match other {
        Some(uid) => ServeError::OtherUser {
            addr,
            holder: takeover::user_label(uid),
            user: takeover::sudo_user(uid),
            takeover,
        },
        None => ServeError::Bind { addr, source },
    }
}

/// `--takeover`: receives the sockets of the serve with pid `pid`, then
/// claims the ports it gives up (it does so right after sending them).
fn take_ports(plan: &mut Plan, pid: i32) -> Result<Handover, ServeError> {
    let mut h = Handover::take(&plan.locks.control_path(pid), pid)?;
    log!(
        "throng: --takeover: received {} sockets from pid {pid}",
        h.sockets.len()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match claim_ports(&mut plan.locks, &plan.reserved) {
            Ok(()) => break,
            Err(ServeError::PortHeld { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
    plan.reserved.append(&mut h.sockets);
    Ok(h)
}

fn public_config(config: &Config) -> serde_json::Value {
    let mut v = serde_json::json!(config);
    if let Some(map) = v.as_object_mut() {
        if !config.bench_floor {
            map.remove("bench_floor");
        }
        for value in map.values_mut() {
            if let Some(d) = as_duration(value) {
                *value = throng_host::units::fmt_duration(d).into();
            }
        }
    }
    v
}

/// A `Duration` as serde writes it, `{"secs":10,"nanos":0}`.
fn as_duration(v: &serde_json::Value) -> Option<Duration> {
    let o = v.as_object().filter(|o| o.len() == 2)?;
    let secs = o.get("secs")?.as_u64()?;
    let nanos = u32::try_from(o.get("nanos")?.as_u64()?).ok()?;
    Some(Duration::new(secs, nanos))
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "throng serve: effective settings")?;
        writeln!(f, "{}", self.config)?;
        writeln!(f, "  broker           {}", self.broker)?;
        writeln!(
            f,
            "  workers          {} ({})",
            self.config.workers, self.workers_why
        )?;
        writeln!(
            f,
            "open-file limit per process: {} (hard {}), so about {} subscribers per worker, {} in all",
            self.nofile.soft,
            self.nofile.hard,
            self.per_worker,
            self.per_worker * self.config.workers as u64
        )?;
        let cfg = &self.config;
        let token = if cfg.auth.tokens() {
            "?token=<JWT>"
        } else {
            ""
        };
        let credential = if cfg.auth.publish_guarded() {
            " -H 'Authorization: Bearer <token or key>'"
        } else {
            ""
        };
        let publish_at = cfg.publish_listen.first().map(|a| format!("http://{a}"));
        let line = |scheme: &str, addr: &SocketAddr, http: &str| {
            let publish = publish_at
                .clone()
                .unwrap_or_else(|| format!("{http}://{addr}"));
            format!(
                "subscribe: {scheme}://{addr}/<channel>{token}    publish: curl{credential} -d hello {publish}/publish/<channel>"
            )
        };
        f.write_str(&line("ws", &cfg.listen[0], "http"))?;
        if let Some(addr) = cfg.tls_listen.first() {
            write!(f, "\n{}", line("wss", addr, "https"))?;
        }
        if let Some(addr) = cfg.mqtt_listen.first() {
            write!(f, "\nsubscribe: mqtt://{addr} (topic = channel)")?;
        }
        if let Some(addr) = cfg.mqtts_listen.first() {
            write!(f, "\nsubscribe: mqtts://{addr} (topic = channel)")?;
        }
        Ok(())
    }
}

/// The subscribers one worker is planned to hold, of the `per_worker` its
/// files allow: `SO_REUSEPORT` hands each new connection to a worker by a
/// hash of its addresses, so shares are uneven (about √n apart at n each),
/// and a worker planned at its very limit overflows it (measured at
/// 1,000,000 over 51 workers of 19,936: three of them hit `EMFILE` and 329
/// connections waited in their accept queues until they timed out). Four
/// standard deviations of room make that unlikely at any size.
pub fn planned_per_worker(per_worker: u64) -> u64 {
    let spread = 4.0 * (per_worker as f64).sqrt();
    per_worker.saturating_sub(spread.ceil() as u64).max(1)
}

/// How many workers to run, and why: `requested` (0 = one per core), raised
/// to the workers the `target` connections need at
/// [`planned_per_worker`] each.
pub fn worker_count(
    requested: usize,
    cores: usize,
    budget: Budget,
    target: Option<u64>,
) -> (usize, String) {
    let (mut n, mut why) = if requested == 0 {
        (cores.max(1), format!("one per core ({cores})"))
    } else {
        (requested, "--workers".to_owned())
    };
    if let Some(target) = target {
        let planned = planned_per_worker(budget.per_worker);
        let needed = usize::try_from(target.div_ceil(planned)).unwrap_or(usize::MAX);
        if needed > n {
            why = format!(
                "raised from {n} so that --max-connections {target} fits at {planned} per worker \
                 ({} files each, less room for SO_REUSEPORT's uneven spread)",
                budget.per_worker
            );
            n = needed;
        }
    }
    (n, why)
}

/// Something a worker did, as seen by the supervisor's loop.
enum Event {
    Record(usize, u64, Record),
    /// Worker `i` of that generation exited; `true`: with status 0.
    Exited(usize, u64, bool, String),
    /// The back-off after worker `i`'s death (of that generation) has passed.
    Restart(usize, u64),
    /// News from the Redis broker task.
    Broker(redis::Event),
    /// The history and retained messages the serve we took over (its pid)
    /// handed over, or why not.
    History(i32, Result<takeover::Handed, String>),
    /// A read of `--auth-jwks-url` ended (`supervisor/jwks.rs`).
    Jwks(Result<crate::auth::jwks::Parsed, crate::jwks::FetchError>),
    /// The other nodes' counts for an API answer (`supervisor/counts.rs`).
    Counts(redis::counts::CountsNews),
}

/// One worker slot; `generation` tells a restarted worker from the one before.
struct Slot {
    generation: u64,
    pid: u32,
    tx: Option<mpsc::UnboundedSender<Bytes>>,
    snapshot: Option<Snapshot>,
    alive: bool,
}

struct Supervisor {
    config: Config,
    command: WorkerCommand,
    config_json: Bytes,
    slots: Vec<Slot>,
    events: mpsc::UnboundedSender<Event>,
    broker: Broker,
    /// Messages relayed to the workers and not yet counted by all.
    relay: Relay,
    stats: SupervisorStats,
    retired: Snapshot,
    draining: bool,
    /// Per-address limits over every worker (when any is set).
    addresses: Option<Addresses>,
    /// The clock `addresses` runs on.
    started: std::time::Instant,
    /// The counts shared with the workers (`--max-connections`).
    shared: Option<SharedCounters>,
    /// Ids of relayed messages, and what each channel kept for recovery.
    history: History,
    /// Each channel's retained message (the local broker's; with Redis,
    /// Redis keeps them).
    retained: Retained,
    /// Taking over with an embedded history: the publishes and recoveries
    /// that wait for the old serve's history (`handover.rs`).
    held: Option<Vec<(usize, u64, Record)>>,
    /// Taken over, our history went to the new serve: we number nothing more.
    handed_over: bool,
    /// The last sequence we gave before our sockets went to a new serve:
    /// what we number after it, that serve relays to its own subscribers.
    handover_mark: u64,
    /// MQTT persistent sessions while their clients are away.
    sessions: Sessions,
    /// MQTT shared subscriptions: each group's members by worker.
    shares: Shares,
    /// This node's subjects of `--presence` channels ([`crate::presence`]).
    presence: crate::presence::Tally,
    /// Server API questions waiting for the workers' parts.
    api: crate::api::Gather,
    /// Wakes the `--auth-jwks-url` reader (`supervisor/jwks.rs`).
    keys_stale: Option<std::rc::Rc<tokio::sync::Notify>>,
    /// Subscriber counts across nodes, with Redis (`supervisor/counts.rs`).
    counts: Option<counts::Counts>,
}

/// The Unix millisecond now: the epoch of this node's message ids. A
/// restarted node starts later, so it never gives an id twice (unless the
/// wall clock steps back across the restart).
fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Runs the server until SIGTERM/SIGINT has drained every worker.
pub fn run(mut plan: Plan, command: WorkerCommand) -> Result<(), ServeError> {
    let handover = match plan.takeover_from.take() {
        Some(pid) => Some(take_ports(&mut plan, pid)?),
        None if plan.config.takeover => {
            log!("throng: --takeover: no running serve holds these ports; starting normally");
            None
        }
        None => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, supervise(plan, command, handover))
}

/// The next step of a takeover of this server (never, without a control socket).
async fn next_step(ctl: &mut Option<Control>, ports: &[u16], sockets: &[socket2::Socket]) -> Step {
    match ctl {
        Some(c) => c.next(ports, sockets).await,
        None => std::future::pending().await,
    }
}

async fn supervise(
    mut plan: Plan,
    command: WorkerCommand,
    mut handover: Option<Handover>,
) -> Result<(), ServeError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut sup = Supervisor::new(&plan.config, command, tx)?;
    sup.shared = plan.shared;
    if handover.is_some() && plan.redis.is_none() {
        // Nothing is numbered, recovered or read from the retained store
        // before the old history and retained messages are ours.
        sup.held = Some(Vec::new());
    }
    if let Some(settings) = plan.redis.clone() {
        let events = sup.events.clone();
        sup.start_counts(settings.clone());
        if settings.session_queue > 0 {
            sup.sessions.keep_in_redis();
        }
        let cmds = sup.use_redis(settings.clone());
        let emit = move |ev| {
            let _ = events.send(Event::Broker(ev));
        };
        let max = plan.config.max_message;
        if settings.sharded() {
            tokio::task::spawn_local(redis::router::run(settings, max, cmds, emit));
        } else {
            tokio::task::spawn_local(redis::run(settings, max, cmds, emit));
        }
    }
    sup.start_jwks();
    let workers = plan.config.workers;
    for i in 0..workers {
        sup.spawn(i).map_err(ServeError::Spawn)?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut deadline = None;
    // Once taken over: when our handover is written out.
    let mut written = None;
    let mut prune = tokio::time::interval(Duration::from_secs(1));
    let ports = ports_of(&plan.reserved);
    let mut ctl = Control::open(plan.locks.control_path(std::process::id() as i32))
        .map_err(|e| log!("throng: no takeover control socket: {e}"))
        .ok();
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // Signals first: when a whole process group is signalled (as
            // systemd does), a worker's clean exit can arrive in the same
            // turn as the supervisor's own signal, and must not be taken
            // for a death.
            biased;
            _ = term.recv(), if !sup.draining => deadline = Some(sup.drain("SIGTERM")),
            _ = int.recv(), if !sup.draining => deadline = Some(sup.drain("SIGINT")),
            _ = hup.recv() => sup.reload(&plan.reload),
            step = next_step(&mut ctl, &ports, &plan.reserved), if !sup.draining => match step {
                // Dropping our claims' file frees every one of them.
                Step::Release => {
                    sup.handover_mark = sup.history.last_seq();
                    plan.locks = PortLocks::open().map_err(ServeError::PortLock)?;
                }
                Step::Go(reply) => {
                    deadline = Some(sup.taken_over());
                    written = Some(reply.send(sup.hand_over()));
                }
                Step::Abandoned => {
                    log!("throng: the takeover was abandoned; serving on");
                    if let Err(e) = claim_ports(&mut plan.locks, &plan.reserved) {
                        log!("throng: cannot claim the ports again: {e}");
                    }
                }
            },
            ev = rx.recv() => match ev {
                Some(ev) => {
                    if let Some(d) = sup.on_event(ev) {
                        deadline = Some(d);
                    }
                }
                None => break,
            },
            _ = prune.tick() => sup.each_second(),
            () = until_deadline => {
                log!("throng: workers did not exit within the drain timeout; killing them");
                for s in &sup.slots {
                    if s.alive {
                        let _ = process::signal(s.pid, Signal::Kill);
                    }
                }
                deadline = None;
            }
        }
        if sup.draining && sup.slots.iter().all(|s| !s.alive) {
            break;
        }
        // Our workers listen (and our Redis link is up, for the
        // subscribers that rejoin with ?since=): the old server may stop.
        let ready = sup.slots.iter().all(|s| s.snapshot.is_some())
            && sup.broker.stats().is_none_or(|b| b.up);
        if ready && let Some(h) = handover.take() {
            handover::go(h, sup.events.clone());
        }
    }
    // MQTT sessions the drain parked reach Redis before we go.
    sup.settle_sessions(&mut rx).await;
    // What we handed over reaches the new serve before we go.
    if let Some(w) = written {
        w.wait(Duration::from_secs(10));
    }
    // Hold the reserved ports until the workers are gone.
    drop(plan.reserved);
    drop(plan.locks);
    log!(
        "throng: stopped ({} messages published, {} worker restarts)",
        sup.stats.published,
        sup.stats.restarts
    );
    Ok(())
}

impl Supervisor {
    /// Once a second: forgets idle addresses and expired history, expires
    /// sessions, and says counts, sessions' interest and shares to Redis.
    fn each_second(&mut self) {
        let now = self.started.elapsed().as_secs_f64();
        if let Some(a) = &mut self.addresses {
            a.prune(now);
        }
        let now = self.now_ms();
        self.history.expire(now);
        for reply in self.sessions.tick(now) {
            self.send(reply.worker, Record::SessionResumed(reply.resumed).encode());
        }
        self.session_interest();
        self.session_asks();
        self.counts_tick();
        self.shares_tick();
    }

    /// A supervisor of `config.workers` slots, none started yet, with the
    /// local broker; `events` is where what its workers do arrives.
    fn new(
        config: &Config,
        command: WorkerCommand,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<Self, ServeError> {
        let config_json = Bytes::from(serde_json::to_vec(config).map_err(std::io::Error::other)?);
        let workers = config.workers;
        Ok(Self {
            config: config.clone(),
            command,
            config_json,
            slots: (0..workers)
                .map(|_| Slot {
                    generation: 0,
                    pid: 0,
                    tx: None,
                    snapshot: None,
                    alive: false,
                })
                .collect(),
            events,
            broker: Broker::Local,
            relay: Relay::default(),
            stats: SupervisorStats {
                workers,
                ..SupervisorStats::default()
            },
            retired: Snapshot::default(),
            draining: false,
            addresses: config
                .per_address
                .any()
                .then(|| Addresses::new(config.per_address, workers)),
            started: std::time::Instant::now(),
            shared: None,
            history: History::new(
                history::Limits {
                    keep: config.history,
                    ttl: config.history_ttl,
                    max_bytes: config.history_max_memory,
                },
                epoch_ms(),
            ),
            retained: Retained::new(retained::Limits {
                max_topics: config.max_retained,
                max_bytes: config.max_retained_memory,
            }),
            held: None,
            handed_over: false,
            handover_mark: 0,
            sessions: Sessions::new(sessions::Limits {
                queue: config.mqtt_session_queue,
                memory: config.mqtt_sessions_memory,
                max_expiry: config.mqtt_session_expiry,
            }),
            shares: Shares::default(),
            presence: crate::presence::Tally::default(),
            api: crate::api::Gather::default(),
            keys_stale: None,
            counts: None,
        })
    }

    /// Routes through Redis from now on; returns the commands for the
    /// link's task ([`redis::run`]).
    fn use_redis(&mut self, settings: RedisSettings) -> mpsc::UnboundedReceiver<redis::Command> {
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let workers = self.slots.len();
        self.broker = Broker::Redis(Box::new(Remote::new(settings, cmd_tx, workers)));
        self.stats.broker = self.broker.stats();
        cmd_rx
    }

    /// Starts worker `i`: this binary with stdin as its end of a socket pair.
    fn spawn(&mut self, i: usize) -> std::io::Result<()> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let mut cmd = tokio::process::Command::new(&self.command.program);
        cmd.args(&self.command.args)
            .arg("--worker-index")
            .arg(i.to_string());
        cmd.stdin(Stdio::from(OwnedFd::from(theirs)));
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child.id().unwrap_or(0);
        ours.set_nonblocking(true)?;
        let stream = tokio::net::UnixStream::from_std(ours)?;
        let (mut rd, mut wr) = stream.into_split();
        let slot = &mut self.slots[i];
        slot.generation += 1;
        let generation = slot.generation;
        slot.pid = pid;
        slot.alive = true;
        slot.snapshot = None;
        let (tx, mut out) = mpsc::unbounded_channel::<Bytes>();
        let _ = tx.send(Record::Config(self.config_json.clone()).encode());
        if let Some(rec) = self.broker.state_record() {
            let _ = tx.send(rec);
        }
        slot.tx = Some(tx);
        tokio::task::spawn_local(async move {
            while let Some(rec) = out.recv().await {
                if wr.write_all(&rec).await.is_err() {
                    break;
                }
            }
        });
        let events = self.events.clone();
        tokio::task::spawn_local(async move {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            while let Ok(Some(rec)) = read_record(&mut rd, &mut buf).await {
                if events.send(Event::Record(i, generation, rec)).is_err() {
                    break;
                }
            }
            let (clean, status) = match child.wait().await {
                Ok(s) => (s.success(), s.to_string()),
                Err(e) => (false, e.to_string()),
            };
            let _ = events.send(Event::Exited(i, generation, clean, status));
        });
        Ok(())
    }

    /// Handles one event; returns the drain deadline when the event
    /// started a drain.
    fn on_event(&mut self, ev: Event) -> Option<tokio::time::Instant> {
        match ev {
            Event::Record(i, generation, rec) => {
                if self.slots[i].generation == generation {
                    self.on_record(i, generation, rec);
                }
            }
            Event::Exited(i, generation, clean, status) => {
                if self.slots[i].generation != generation {
                    return None;
                }
                let pid = self.worker_gone(i, generation);
                if self.draining {
                    log!("throng: worker {i} (pid {pid}) exited: {status}");
                    return None;
                }
                if clean {
                    // A worker exits 0 only after draining on a signal: the
                    // signal was meant for the whole server (systemd's
                    // KillMode=control-group signals every process), so it
                    // is not restarted and the rest drain too.
                    log!(
                        "throng: worker {i} (pid {pid}) exited cleanly after a signal; \
                         stopping the whole server"
                    );
                    return Some(self.drain("a worker's clean exit"));
                }
                self.stats.restarts += 1;
                log!(
                    "throng: worker {i} (pid {pid}) died: {status}; restarting it (restart #{})",
                    self.stats.restarts
                );
                // A worker that dies at once would otherwise be restarted in a tight loop.
                let events = self.events.clone();
                tokio::task::spawn_local(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let _ = events.send(Event::Restart(i, generation));
                });
            }
            Event::Broker(ev) => self.on_broker(ev),
            Event::History(pid, got) => self.history_arrived(pid, got),
            Event::Jwks(got) => self.jwks_read(got),
            Event::Counts(news) => self.counts_news(news),
            Event::Restart(i, generation) => {
                if self.slots[i].generation != generation || self.slots[i].alive || self.draining {
                    return None;
                }
                if let Err(e) = self.spawn(i) {
                    log!("throng: cannot restart worker {i}: {e}; trying again");
                    let events = self.events.clone();
                    tokio::task::spawn_local(async move {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        let _ = events.send(Event::Restart(i, generation));
                    });
                }
            }
        }
        None
    }

    /// Worker `i` (of that generation) is gone: what it held and owed is
    /// settled. Returns its pid.
    fn worker_gone(&mut self, i: usize, generation: u64) -> u32 {
        let slot = &mut self.slots[i];
        slot.alive = false;
        slot.tx = None;
        let pid = slot.pid;
        if let Some(s) = slot.snapshot.take() {
            self.retired.add_counters(&s);
        }
        self.broker.worker_gone(i);
        // Its sockets closed with it: its connections no longer count.
        let now = self.started.elapsed().as_secs_f64();
        if let Some(a) = &mut self.addresses {
            a.worker_gone(i, now);
        }
        if let Some(slot) = self.shared.as_ref().and_then(|s| s.slot(i)) {
            slot.store(0, std::sync::atomic::Ordering::SeqCst);
        }
        // Its persistent sessions' connections are gone with it, unparked.
        self.sessions.worker_gone(i);
        self.session_asks();
        for interest in self.shares.worker_gone(i) {
            self.share_interest(interest);
        }
        self.shares_tick();
        self.presence_worker_gone(i);
        self.api_worker_gone(i);
        // Messages it will never count no longer wait for it.
        for answer in self.relay.worker_gone(WorkerId {
            slot: i,
            generation,
        }) {
            self.answer(answer);
        }
        pid
    }

    fn on_record(&mut self, i: usize, generation: u64, rec: Record) {
        let Some(rec) = self.hold(i, generation, rec) else {
            return;
        };
        match rec {
            Record::Publish(m) => self.publish(i, generation, m, None),
            Record::PublishRetained { qos, message } => {
                self.publish(i, generation, message, Some(qos));
            }
            Record::RetainedAsk { id, filters } if self.broker.keeps_retained() => {
                let to = Publisher {
                    worker: WorkerId {
                        slot: i,
                        generation,
                    },
                    request: id,
                };
                self.broker.retained(to, filters);
            }
            Record::RetainedAsk { id, filters } => {
                // Answered at once on the worker's socket: behind every
                // message relayed before the store was read, ahead of
                // every one after.
                let mut messages = self.retained.matching(&filters);
                fit_retained(&mut messages);
                self.send(i, Record::Retained { id, messages }.encode());
            }
            Record::Interest {
                channel,
                subscribed,
            } => self.broker.interest(i, channel, subscribed),
            Record::Delivered { id, subscribers } => {
                let by = WorkerId {
                    slot: i,
                    generation,
                };
                if let Some(answer) = self.relay.delivered(id, by, subscribers) {
                    self.answer(answer);
                }
            }
            Record::Snapshot(json) => match serde_json::from_slice::<Snapshot>(&json) {
                Ok(s) => self.slots[i].snapshot = Some(s),
                Err(e) => log!("throng: worker {i}: bad counters: {e}"),
            },
            Record::Recover { id, since, channel } if self.broker.keeps_history() => {
                let to = Publisher {
                    worker: WorkerId {
                        slot: i,
                        generation,
                    },
                    request: id,
                };
                self.broker.recover(to, channel, since);
            }
            Record::Recover { id, since, channel } => self.recover_here(i, id, since, &channel),
            Record::MetricsRequest { id } => {
                let text = self.metrics_text();
                self.send(
                    i,
                    Record::Metrics {
                        id,
                        text: Bytes::from(text),
                    }
                    .encode(),
                );
            }
            Record::Admit { id, source } => {
                let now = self.started.elapsed().as_secs_f64();
                let verdict = match &mut self.addresses {
                    Some(a) => a.admit(i, source, now),
                    None => Verdict::Admit,
                };
                self.send(i, Record::Admitted { id, verdict }.encode());
            }
            Record::ClientId { hash, claim } => {
                // MQTT takeover: the other workers close their connection
                // with this client id, if they have one; so do the other
                // nodes (with Redis), told when by the wall clock.
                let (mono, wall) = clocks();
                let unix_ns = wall.saturating_sub(mono.saturating_sub(claim.at_ns));
                self.broker.claim(hash, unix_ns);
                let rec = rec.encode();
                for j in (0..self.slots.len()).filter(|&j| j != i) {
                    self.send(j, rec.clone());
                }
            }
            Record::SessionOpen(o) => {
                let now = self.now_ms();
                if let Some(reply) = self.sessions.open(i, &o, now) {
                    self.send(reply.worker, Record::SessionResumed(reply.resumed).encode());
                }
                self.session_asks();
            }
            Record::SessionPark(p) => {
                let now = self.now_ms();
                if let Some(reply) = self.sessions.park(i, p, now) {
                    self.send(reply.worker, Record::SessionResumed(reply.resumed).encode());
                }
                self.session_interest();
                self.session_asks();
            }
            Record::ShareMember(m) => self.share_member(i, &m),
            Record::Presence(e) => self.presence_told(i, e),
            Record::Api(r) => self.on_api(i, generation, r),
            Record::KeysStale => self.keys_stale(),
            Record::Release { source } => {
                let now = self.started.elapsed().as_secs_f64();
                if let Some(a) = &mut self.addresses {
                    a.release(i, source, now);
                }
            }
            other => log!("throng: worker {i}: unexpected control record {other:?}"),
        }
    }

    /// Answers worker `i`'s recovery (or API read, `id` says) from the
    /// embedded history.
    fn recover_here(&mut self, i: usize, id: u64, since: history::MessageId, channel: &str) {
        let now = self.now_ms();
        let mut r = if id & crate::control::API_READ == 0 {
            self.history.recover(channel, since, now)
        } else {
            self.history.read(channel, since, now)
        };
        // 21 bytes of framing per message, 64 for the record's own.
        r.fit(crate::control::MAX_RECORD - 64, 21);
        let rec = Record::Recovered {
            id,
            complete: r.complete,
            messages: r.messages,
        };
        self.send(i, rec.encode());
    }

    /// Parked MQTT sessions' channels stay subscribed in Redis (channels
    /// mode) while their clients are away: the broker's slot past the
    /// workers' holds them.
    fn session_interest(&mut self) {
        let slot = self.slots.len();
        for (channel, on) in self.sessions.take_interest() {
            self.broker.interest(slot, channel, on);
        }
    }

    /// Worker `i` says a member joined or left a shared subscription.
    fn share_member(&mut self, i: usize, m: &crate::control::ShareMember) {
        if let Some(interest) = self.shares.member(i, m) {
            self.share_interest(interest);
        }
        self.shares_tick();
    }

    /// A filter of the node's shared subscriptions gained its first group
    /// or lost its last: in `--redis-mode channels` the node is subscribed
    /// to it meanwhile (the broker's slot after the sessions').
    fn share_interest(&mut self, (filter, on): crate::shares::Interest) {
        let slot = self.slots.len() + 1;
        self.broker.interest(slot, filter, on);
    }

    /// With Redis: forgets silent nodes, and says this node's shared
    /// subscriptions' members when due ([`crate::shares::cluster`]).
    fn shares_tick(&mut self) {
        let Some(node) = self.broker.node() else {
            return;
        };
        let now = self.now_ms();
        self.shares.view().expire(now);
        let none = self.shares.is_empty();
        self.broker.sharing(!none);
        if self.shares.view().due(now, none) {
            let (payload, left_out) = self.shares.announcement(node);
            if let Some(n) = left_out {
                log!(
                    "throng: {n} shared subscription groups do not fit in this node's \
                     announcement to the others (64 KiB): their members here may miss \
                     messages, or get them beside another node's member"
                );
            }
            self.broker.announce(payload);
        }
    }

    /// A message published through worker `i` (retained when `retain`
    /// holds its QoS): relayed, or sent to Redis.
    fn publish(&mut self, i: usize, generation: u64, m: Message, retain: Option<u8>) {
        let from = Publisher {
            worker: WorkerId {
                slot: i,
                generation,
            },
            request: m.id,
        };
        let routed = if self.handed_over {
            Routed::Refused(crate::broker::Refusal::TakenOver)
        } else {
            self.broker.publish(from, m, retain)
        };
        match routed {
            Routed::Relay(m) => self.relay(Some(from), m, None, retain, None),
            Routed::Sent => {}
            Routed::Refused(reason) => {
                let rec = Record::PublishFailed {
                    id: from.request,
                    reason: Bytes::from(reason.to_string()),
                };
                self.send(i, rec.encode());
            }
        }
    }

    /// Handles news from the Redis broker task.
    fn on_broker(&mut self, ev: redis::Event) {
        match self.broker.on_event(ev) {
            News::Nothing => {}
            News::Relay(m, permit, spread) => self.relay(None, m, Some(permit), None, spread),
            News::Announced(payload) => {
                let now = self.now_ms();
                let view = self.shares.view();
                if !view.heard(&payload, now) && view.refused().is_power_of_two() {
                    log!(
                        "throng: ignored a shared subscriptions announcement from Redis \
                         (malformed, or past {} nodes): {} so far",
                        crate::shares::cluster::MAX_NODES,
                        view.refused()
                    );
                }
            }
            News::Claimed(hash, unix_ns) => {
                // Another node's client took the id at `unix_ns`: as a
                // claim of this host's monotonic clock, every worker closes
                // its connection with it if that was made before (two
                // hosts' clocks differ by what NTP leaves).
                let (mono, wall) = clocks();
                let claim = crate::control::Claim {
                    at_ns: mono.saturating_sub(wall.saturating_sub(unix_ns)),
                    worker: u32::MAX,
                };
                let rec = Record::ClientId { hash, claim }.encode();
                for j in 0..self.slots.len() {
                    self.send(j, rec.clone());
                }
            }
            News::Answer(to, rec) => {
                if self.slots[to.worker.slot].generation == to.worker.generation {
                    self.send(to.worker.slot, rec);
                }
            }
            News::State(rec) => {
                for s in &self.slots {
                    if let Some(tx) = &s.tx {
                        let _ = tx.send(rec.clone());
                    }
                }
            }
            News::SessionMark(kind, nonce) => self.on_session_mark(kind, nonce),
            News::SessionReply(nonce, reply) => self.on_session_reply(nonce, reply),
        }
    }

    /// Sends a message to every live worker: one record, encoded once.
    /// A retained one (`retain`: its QoS) becomes its channel's retained
    /// message first (the local broker's store; Redis's keeps its own).
    /// `spread`: from Redis, its hash ([`News::Relay`]).
    fn relay(
        &mut self,
        from: Option<Publisher>,
        m: Message,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
        retain: Option<u8>,
        spread: Option<u64>,
    ) {
        self.stats.published += 1;
        // Numbered and kept before any worker sees it: a recovery the
        // supervisor answers later finds it here, one answered earlier
        // comes before it on every worker's socket.
        let now = self.now_ms();
        self.history.expire(now);
        // With the history in Redis the stream numbered it (or, published
        // there by someone else, it has no id).
        let message = if self.broker.keeps_history() {
            m.message
        } else {
            self.history.record(&m.channel, m.text, &m.payload, now)
        };
        if let Some(qos) = retain {
            let kept = Kept {
                id: message,
                text: m.text,
                payload: m.payload.clone(),
            };
            self.retained
                .set(&m.channel, qos, kept, m.properties.clone());
        }
        self.deliver(from, Message { message, ..m }, permit, spread);
    }

    /// Sends numbered message `m` to every live worker (one record, encoded
    /// once) and answers `from` once they have counted it.
    fn deliver(
        &mut self,
        from: Option<Publisher>,
        m: Message,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
        spread: Option<u64>,
    ) {
        let message = m.message;
        let now = self.now_ms();
        // Copied only while MQTT sessions want it (queued for those away,
        // matched at a park), under its relay id.
        let kept = self.sessions.wants().then(|| m.clone());
        // One member of each shared subscription it matches gets it (with
        // Redis: one in the deployment, when it is this node's).
        let shared = (!self.shares.is_empty()).then(|| m.clone());
        let (id, rec) = self.relay.deliver(m);
        match kept {
            Some(m) => self.sessions.relayed(&Message { id, ..m }, now),
            None => self.sessions.passed(id),
        }
        if let Some(m) = shared {
            let spread = spread.zip(self.broker.node());
            for (worker, key) in self.shares.picks(&m.channel, spread) {
                let message = Message { id, ..m.clone() };
                self.send(
                    worker,
                    Record::ShareDeliver(ShareDeliver { key, message }).encode(),
                );
            }
        }
        let mut to = Vec::with_capacity(self.slots.len());
        for (slot, s) in self.slots.iter().enumerate() {
            if let Some(tx) = &s.tx
                && tx.send(rec.clone()).is_ok()
            {
                to.push(WorkerId {
                    slot,
                    generation: s.generation,
                });
            }
        }
        if let Some(answer) = self.relay.wait_for((id, message), from, permit, to) {
            self.answer(answer);
        }
    }

    /// Milliseconds since the supervisor started: the history's clock.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Tells a publisher how many subscribers its message reached, unless
    /// its worker has been replaced since.
    fn answer(&self, answer: Answer) {
        let to = answer.to.worker;
        if self.slots[to.slot].generation == to.generation {
            self.send(to.slot, answer.record());
        }
    }

    fn send(&self, i: usize, rec: Bytes) {
        if let Some(tx) = &self.slots[i].tx {
            let _ = tx.send(rec);
        }
    }

    /// Stops restarting, tells every worker to drain; returns the deadline
    /// after which stragglers are killed.
    /// `/metrics`: the workers' counters summed, the supervisor's own, and
    /// every process's `process_*` figures.
    fn metrics_text(&mut self) -> String {
        let now = self.now_ms();
        self.history.expire(now);
        let mut history = self.history.stats();
        let (complete, incomplete) = self.broker.recoveries();
        history.complete += complete;
        history.incomplete += incomplete;
        self.stats.history = Some(history);
        self.stats.retained = Some(match self.broker.retained_stats() {
            Some(r) => r,
            None => self.retained.stats(),
        });
        self.stats.broker = self.broker.stats();
        self.stats.addresses = self.addresses.as_ref().map(|a| a.len() as u64);
        self.stats.sessions = self.sessions.stats();
        self.stats.shares = self.shares.counts();
        self.stats.shared_cluster = self.shares.cluster_members();
        let live: Vec<&Snapshot> = self
            .slots
            .iter()
            .filter(|s| s.alive)
            .filter_map(|s| s.snapshot.as_ref())
            .collect();
        let mut text = metrics::render(&live, &self.retired, &self.stats);
        let procs: Vec<metrics::Process> = std::iter::once(metrics::Process {
            worker: None,
            pid: std::process::id(),
        })
        .chain(
            self.slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.alive)
                .map(|(i, s)| metrics::Process {
                    worker: Some(i),
                    pid: s.pid,
                }),
        )
        .collect();
        metrics::render_processes(&mut text, &procs);
        text
    }

    /// SIGHUP: reads the certificate and keys again, logs what it took and
    /// what it kept, and hands the new settings to every worker (and to
    /// those started later).
    fn reload(&mut self, files: &reload::Files) {
        if let Some(n) = &self.keys_stale {
            log!("throng: SIGHUP: reading --auth-jwks-url again (at most once per 5s)");
            n.notify_one();
        }
        if files.is_empty() {
            if self.keys_stale.is_some() {
                return;
            }
            log!("throng: SIGHUP: nothing to reload (no certificate or key files were given)");
            return;
        }
        let out = files.reload(&mut self.config);
        for line in &out.reloaded {
            log!("throng: SIGHUP: reloaded {line}");
        }
        for line in &out.kept {
            log!("throng: SIGHUP: ERROR: {line}");
        }
        if out.changed() {
            self.push_config("SIGHUP");
        }
    }

    /// Hands the settings, changed by `why`, to every worker (and to those
    /// started later).
    fn push_config(&mut self, why: &str) {
        match serde_json::to_vec(&self.config) {
            Ok(json) => self.config_json = Bytes::from(json),
            Err(e) => {
                log!("throng: {why}: cannot encode the settings: {e}");
                return;
            }
        }
        let rec = Record::Reload(self.config_json.clone()).encode();
        for i in 0..self.slots.len() {
            self.send(i, rec.clone());
        }
    }

    /// A `serve --takeover` listens on our ports: every worker stops
    /// accepting and closes its subscribers spread over `--drain-spread`.
    fn taken_over(&mut self) -> tokio::time::Instant {
        let spread = self.config.drain_spread;
        log!("throng: taken over: closing every subscriber with 1012, spread over {spread:?}");
        self.draining = true;
        for s in &self.slots {
            if s.alive {
                let _ = process::signal(s.pid, Signal::Usr2);
            }
        }
        tokio::time::Instant::now() + spread + self.config.drain_timeout + Duration::from_secs(2)
    }

    fn drain(&mut self, signal: &str) -> tokio::time::Instant {
        log!(
            "throng: {signal}: draining (closing every subscriber with 1001, up to {:?})",
            self.config.drain_timeout
        );
        self.draining = true;
        for s in &self.slots {
            if s.alive {
                let _ = process::signal(s.pid, Signal::Term);
            }
        }
        tokio::time::Instant::now() + self.config.drain_timeout + Duration::from_secs(2)
    }
}

/// The host's monotonic clock (what MQTT client id claims are dated by)
/// and the Unix time, both in nanoseconds, read together.
fn clocks() -> (u64, u64) {
    let mono = u64::try_from(process::monotonic().as_nanos()).unwrap_or(u64::MAX);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    (mono, wall)
}

#[cfg(test)]
mod tests {
    use throng_host::limits::budget;

    use super::worker_count;

    #[test]
    fn workers_follow_cores_flag_and_connection_target() {
        let count = |requested, cores, target: Option<u64>| {
            let b = budget(target.unwrap_or(0), 19_964, 64).unwrap();
            worker_count(requested, cores, b, target)
        };
        assert_eq!(count(0, 8, None).0, 8);
        assert_eq!(count(3, 8, None).0, 3);
        assert_eq!(count(0, 2, Some(30_000)).0, 2);
        let (n, why) = count(0, 2, Some(100_000));
        assert_eq!(n, 6);
        assert!(
            why.contains("raised from 2") && why.contains("19335 per worker (19900 files"),
            "{why}"
        );
        assert_eq!(count(1, 2, Some(19_335)).0, 1);
        assert_eq!(count(1, 2, Some(19_336)).0, 2);
        // A million: one worker more than an even spread would need.
        assert_eq!(count(0, 2, Some(1_000_000)).0, 52);
    }
}

mod api;
mod counts;
mod handover;
mod jwks;
mod presence;

mod mqtt_sessions;
#[cfg(test)]
mod pair;
