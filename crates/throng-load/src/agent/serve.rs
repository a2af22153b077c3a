//! `throng agent`: one load machine's part of a distributed run. It
//! registers itself under the prefix (its capacity, version and clock
//! offset, refreshed every second, expiring when it is gone), listens on
//! its own channel for a controller's commands, runs the workers it is
//! given as local child processes (the harness's [`Pool`]: the same
//! `throng hold --worker` a one-machine run starts) and publishes what they
//! print on the run's channel. It runs only throng's own worker plans, of
//! the roles in [`super::ROLES`]; nothing it is sent is a shell command.
//!
//! When Redis goes away it stops its workers (the controller has lost it
//! anyway), reconnects with a growing pause and registers again. When a
//! controller stops listening (nobody gets what it publishes), it stops
//! the run's workers too: a killed controller leaves no load behind.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use throng_client::link::LinkError;
use throng_report::format::{Record, decode_record};
use throng_report::interval::Interval;
use tokio::sync::mpsc;

use super::redis::{Conn, Redis};
use super::{Assigned, BEAT, Capacity, Command, Keys, Registration, Report, Running, TTL};
use crate::harness::clock::now_unix_ns;
use crate::harness::machine::Machine;
use crate::harness::metrics::Metrics;
use crate::harness::pool::{Crew, Feed, Pool, WorkerCommand};
use crate::harness::worker::Order;

/// How long workers told to stop get before they are killed.
const CLOSE_GRACE: Duration = Duration::from_secs(15);

/// What `throng agent` was asked to be.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where Redis is.
    pub redis: Redis,
    /// The key and channel prefix.
    pub keys: Keys,
    /// This agent's name.
    pub name: String,
    /// Its group, if any.
    pub group: Option<String>,
    /// Source addresses its workers bind (empty: the kernel picks).
    pub sources: Vec<IpAddr>,
    /// See [`Registration::instance`]; 0: drawn at start.
    pub instance: u64,
    /// `--metrics-listen`: this agent's own live figures (its workers'
    /// records merged, per run), if anywhere.
    pub metrics: Option<Metrics>,
}

/// This machine's capacity, as registered.
pub fn capacity(sources: &[IpAddr]) -> io::Result<Capacity> {
    let m = Machine::probe()?;
    let free_memory = throng_host::doctor::HostLimits::read(std::path::Path::new("/proc"))
        .mem_available
        .unwrap_or(0);
    Ok(Capacity {
        cores: u32::try_from(m.cores).unwrap_or(u32::MAX),
        nofile: m.nofile,
        free_memory,
        local_ports: m.local_ports,
        sources: sources.to_vec(),
    })
}

/// The workers of one run on this agent.
struct Job {
    run: String,
    role: String,
    reply: String,
    pool: Pool,
    /// Each local worker's number in the run.
    global: Vec<u32>,
    open: usize,
    feed: mpsc::UnboundedReceiver<Feed>,
    /// Told to stop: kill what is left at this time.
    kill_at: Option<Instant>,
    /// What its workers counted so far, for `--metrics-listen`.
    live: Live,
}

/// A run's figures on this agent: its workers' interval records added as
/// they pass through (counters and histograms), and each worker's latest
/// levels (gauges), summed. Shown as they come, not per interval: the
/// controller's endpoint has the run's merged intervals.
struct Live {
    totals: Interval,
    gauges: Vec<BTreeMap<String, i64>>,
}

impl Live {
    fn new(workers: usize) -> Self {
        Self {
            totals: Interval::empty(0, 0, String::new()),
            gauges: vec![BTreeMap::new(); workers],
        }
    }

    /// Takes `line` of local worker `worker`; true when it was an interval.
    fn take(&mut self, worker: usize, line: &str) -> bool {
        let Ok(Record::Interval(iv)) = decode_record(line) else {
            return false;
        };
        self.totals.add(&iv);
        if let Some(g) = self.gauges.get_mut(worker) {
            g.clone_from(&iv.gauges);
        }
        true
    }

    /// The levels now: every worker's latest gauges, summed.
    fn levels(&self) -> Interval {
        let mut now = Interval::empty(0, 0, String::new());
        for g in &self.gauges {
            for (k, v) in g {
                *now.gauges.entry(k.clone()).or_insert(0) += v;
            }
        }
        now
    }
}

impl Job {
    fn close(&mut self, order: &Order) {
        self.pool.stop_all(order);
        self.kill_at.get_or_insert(Instant::now() + CLOSE_GRACE);
    }
}

/// Runs the agent until SIGINT or SIGTERM.
pub fn run(mut opts: Options) -> io::Result<()> {
    if opts.instance == 0 {
        opts.instance = fastrand::u64(1..);
    }
    let capacity = capacity(&opts.sources)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, serve(opts, capacity))
}

fn say(name: &str, what: &str) {
    eprintln!("throng agent {name}: {what}");
}

async fn serve(opts: Options, capacity: Capacity) -> io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut job: Option<Job> = None;
    let mut pause = Duration::from_millis(250);
    say(
        &opts.name,
        &format!(
            "Redis {}, keys {}, group {}, {} cores, open files {}/process, ports {}-{}, sources {}",
            opts.redis.url,
            opts.keys.agent(&opts.name),
            opts.group.as_deref().unwrap_or("(none)"),
            capacity.cores,
            capacity.nofile,
            capacity.local_ports.0,
            capacity.local_ports.1,
            super::describe_sources(&opts.sources),
        ),
    );
    loop {
        let mut registered = false;
        let outcome = tokio::select! {
            r = session(&opts, &capacity, &mut job, &mut registered) => Some(r),
            _ = tokio::signal::ctrl_c() => None,
            _ = term.recv() => None,
        };
        let Some(Err(e)) = outcome else {
            say(&opts.name, "stopping");
            if let Some(j) = job.take() {
                retire(&opts.name, j).await;
            }
            forget(&opts).await;
            return Ok(());
        };
        if let Some(j) = job.take() {
            say(
                &opts.name,
                &format!("lost Redis during run {}: stopping its workers", j.run),
            );
            retire(&opts.name, j).await;
        }
        if registered {
            pause = Duration::from_millis(250);
        }
        say(
            &opts.name,
            &format!(
                "Redis {}: {e}; trying again in {} ms",
                opts.redis.url,
                pause.as_millis()
            ),
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Deletes this agent's key on the way out (best effort: it expires anyway).
async fn forget(opts: &Options) {
    let del = async {
        let mut c = Conn::open(&opts.redis).await?;
        c.call(&[b"DEL", opts.keys.agent(&opts.name).as_bytes()])
            .await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), del).await;
}

/// Stops a job's workers and waits for them (killing what outlives the grace).
async fn retire(name: &str, mut j: Job) {
    j.close(&Order::Stop(0));
    while j.open > 0 {
        let until = j.kill_at.unwrap_or_else(Instant::now);
        match tokio::time::timeout_at(until.into(), j.feed.recv()).await {
            Ok(Some(Feed::Gone { .. })) => j.open -= 1,
            Ok(Some(Feed::Line { .. } | Feed::Note { .. })) => {}
            Ok(None) => break,
            Err(_) => {
                say(name, "workers did not stop in time; killing them");
                j.pool.kill_all();
                j.kill_at = Some(Instant::now() + Duration::from_secs(5));
            }
        }
    }
    j.pool.wait_all();
    say(name, &format!("run {}: idle again", j.run));
}

/// The next thing a job's workers said; pending forever without a job.
async fn next_feed(job: &mut Option<Job>) -> Option<Feed> {
    match job {
        Some(j) => j.feed.recv().await,
        None => std::future::pending().await,
    }
}

/// One connected stretch: register, then serve commands and forward
/// records until the Redis connection fails.
async fn session(
    opts: &Options,
    capacity: &Capacity,
    job: &mut Option<Job>,
    registered: &mut bool,
) -> Result<(), LinkError> {
    let mut cmd = Conn::open(&opts.redis).await?;
    // Another live agent of this name would get our commands, and we its.
    if let Some(other) = cmd.get(&opts.keys.agent(&opts.name)).await?
        && let Ok(r) = serde_json::from_slice::<Registration>(&other)
        && r.instance != opts.instance
    {
        return Err(LinkError::Refused(format!(
            "another agent named {} is registered; waiting until its key expires (give each agent its own --name)",
            opts.name
        )));
    }
    let mut sub = Conn::open(&opts.redis).await?;
    sub.subscribe(&opts.keys.to(&opts.name)).await?;
    register(opts, capacity, job.as_ref(), &mut cmd).await?;
    *registered = true;
    say(
        &opts.name,
        &format!(
            "registered as {} (expires {} s after its last refresh)",
            opts.keys.agent(&opts.name),
            TTL.as_secs()
        ),
    );
    let mut beat = tokio::time::interval(BEAT / 2);
    let mut beats = 0u64;
    loop {
        tokio::select! {
            m = sub.message() => {
                let m = m?;
                match serde_json::from_slice::<Command>(&m) {
                    Ok(c) => obey(opts, c, job, &mut cmd).await?,
                    Err(e) => say(&opts.name, &format!("ignored a message that is not a command: {e}")),
                }
            }
            f = next_feed(job) => {
                let Some(j) = job.as_mut() else { continue };
                if let (Some(Feed::Line { worker, line }), Some(m)) = (&f, &opts.metrics)
                    && j.live.take(*worker, line)
                {
                    let levels = j.live.levels();
                    m.update(|e| e.flushed(&j.role, &j.live.totals, &levels, true));
                }
                let report = match f {
                    Some(Feed::Line { worker, line }) => Some(Report::Line {
                        worker: j.global.get(worker).copied().unwrap_or(u32::MAX),
                        line,
                    }),
                    Some(Feed::Gone { worker }) => {
                        j.open = j.open.saturating_sub(1);
                        Some(Report::Gone { worker: j.global.get(worker).copied().unwrap_or(u32::MAX) })
                    }
                    // A local pool says nothing else.
                    Some(Feed::Note { .. }) => None,
                    None => {
                        j.open = 0;
                        None
                    }
                };
                if let Some(report) = report {
                    let heard = cmd.publish(&j.reply, report.encode().as_bytes()).await?;
                    if heard == 0 && j.kill_at.is_none() {
                        say(&opts.name, &format!("run {}: its controller is gone; stopping the workers", j.run));
                        j.close(&Order::Stop(0));
                    }
                }
                if j.open == 0 {
                    j.pool.wait_all();
                    say(&opts.name, &format!("run {}: done, idle again", j.run));
                    *job = None;
                    register(opts, capacity, None, &mut cmd).await?;
                }
            }
            _ = beat.tick() => {
                beats += 1;
                if let Some(j) = job.as_mut() {
                    let alive = Report::Alive { agent: opts.name.clone() };
                    let heard = cmd.publish(&j.reply, alive.encode().as_bytes()).await?;
                    if heard == 0 && j.kill_at.is_none() {
                        say(&opts.name, &format!("run {}: its controller is gone; stopping the workers", j.run));
                        j.close(&Order::Stop(0));
                    }
                    if j.kill_at.is_some_and(|k| Instant::now() >= k) {
                        say(&opts.name, &format!("run {}: workers did not stop in time; killing them", j.run));
                        j.pool.kill_all();
                        j.kill_at = Some(Instant::now() + CLOSE_GRACE);
                    }
                }
                if beats % 2 == 0 {
                    register(opts, capacity, job.as_ref(), &mut cmd).await?;
                }
            }
        }
    }
}

/// Writes this agent's key, with a fresh clock offset.
async fn register(
    opts: &Options,
    capacity: &Capacity,
    job: Option<&Job>,
    cmd: &mut Conn,
) -> Result<(), LinkError> {
    let (clock_offset_ns, clock_rtt_ns) = cmd.clock_offset().await?;
    let reg = Registration {
        name: opts.name.clone(),
        group: opts.group.clone(),
        version: super::VERSION.to_owned(),
        capacity: capacity.clone(),
        clock_offset_ns,
        clock_rtt_ns,
        running: job.map(|j| Running {
            run: j.run.clone(),
            role: j.role.clone(),
            workers: u32::try_from(j.global.len()).unwrap_or(u32::MAX),
        }),
        at_unix_ns: now_unix_ns(),
        instance: opts.instance,
    };
    let value = serde_json::to_vec(&reg).map_err(|e| LinkError::Protocol(e.to_string()))?;
    cmd.call(&[
        b"SET",
        opts.keys.agent(&opts.name).as_bytes(),
        &value,
        b"EX",
        TTL.as_secs().to_string().as_bytes(),
    ])
    .await?;
    Ok(())
}

/// Carries out one command.
async fn obey(
    opts: &Options,
    c: Command,
    job: &mut Option<Job>,
    cmd: &mut Conn,
) -> Result<(), LinkError> {
    match c {
        Command::Start {
            run,
            role,
            version,
            reply,
            workers,
        } => {
            let refusal = if let Some(j) = job.as_ref() {
                Some(format!("busy with run {}", j.run))
            } else if version != super::VERSION {
                Some(format!(
                    "this agent is throng {}, the controller {version}: run the same version on both",
                    super::VERSION
                ))
            } else if !super::ROLES.contains(&role.as_str()) {
                Some(format!(
                    "unknown role '{role}' (an agent runs {:?})",
                    super::ROLES
                ))
            } else if workers
                .iter()
                .any(|w| w.plan.get("per_request").is_some_and(|p| !p.is_null()))
            {
                // A path to write on this machine: whoever can publish to
                // the agent must not choose files for it to write.
                Some("a plan that writes per-request rows to a file: agents do not".to_owned())
            } else {
                match start(&run, &role, &reply, workers) {
                    Ok(j) => {
                        say(
                            &opts.name,
                            &format!("run {run}: started {} {role} worker(s)", j.global.len()),
                        );
                        *job = Some(j);
                        None
                    }
                    Err(e) => Some(format!("cannot start the workers: {e}")),
                }
            };
            if let Some(text) = refusal {
                say(&opts.name, &format!("run {run}: refused: {text}"));
                let r = Report::Error {
                    agent: opts.name.clone(),
                    text,
                };
                cmd.publish(&reply, r.encode().as_bytes()).await?;
            }
        }
        Command::Order { run, order } => {
            if let (Some(j), Some(o)) =
                (job.as_ref().filter(|j| j.run == run), Order::parse(&order))
            {
                j.pool.tell_all(&o);
            }
        }
        Command::Close { run, order } => {
            if let Some(j) = job.as_mut().filter(|j| j.run == run) {
                let o = Order::parse(&order).unwrap_or(Order::Stop(0));
                say(&opts.name, &format!("run {run}: told to stop ({o})"));
                j.close(&o);
            }
        }
        Command::Kill { run } => {
            if let Some(j) = job.as_ref().filter(|j| j.run == run) {
                say(&opts.name, &format!("run {run}: told to kill its workers"));
                j.pool.kill_all();
            }
        }
    }
    Ok(())
}

fn start(run: &str, role: &str, reply: &str, workers: Vec<Assigned>) -> io::Result<Job> {
    let command = WorkerCommand::this_program(&[role, "--worker"])?;
    let (tx, feed) = mpsc::unbounded_channel();
    let global = workers.iter().map(|w| w.index).collect::<Vec<_>>();
    let global_len = global.len();
    let plans = workers.into_iter().map(|w| (w.label, w.plan)).collect();
    let pool = Pool::spawn(&command, plans, &tx)?;
    Ok(Job {
        run: run.to_owned(),
        role: role.to_owned(),
        reply: reply.to_owned(),
        open: global.len(),
        global,
        pool,
        feed,
        kill_at: None,
        live: Live::new(global_len),
    })
}
