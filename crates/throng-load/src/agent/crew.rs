//! The controller's side of a run on agents: find the live agents and
//! refuse a run they cannot take (none, another version, a clock too far
//! off, busy, limits too small) before anything starts; then, as the
//! harness's [`Launch`], hand each agent its workers' plans and be the
//! run's [`Crew`] (orders go out on each agent's channel) and the source of
//! its [`Feed`] (the record lines the agents publish on the run's
//! channel). An agent silent for [`LOST_AFTER`] is lost: named at once,
//! its workers counted gone (their connections and messages lost, never
//! dropped from the totals), and the run goes on or stops as
//! `--on-agent-loss` says.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use thiserror::Error;
use throng_client::link::LinkError;
use throng_report::format::{Header, Record, Writer, decode_record};
use tokio::sync::mpsc;

use super::list::{Listed, fmt_offset};
use super::redis::{Conn, Redis};
use super::split::{Split, SplitError};
use super::{Assigned, Command, Keys, LOST_AFTER, Report, VERSION};
use crate::harness::clock::now_unix_ns;
use crate::harness::pool::{Crew, Feed, Launch, Remote};
use crate::harness::worker::Order;

/// How far ahead of now a run on agents starts: time for the plans to
/// cross Redis and every agent to start its workers.
pub const LEAD: Duration = Duration::from_secs(2);

/// What to do when an agent is lost mid-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLoss {
    /// Go on with the others; the lost share counts as lost.
    Continue,
    /// Stop the whole run, as Ctrl-C does.
    Stop,
}

/// An `--on-agent-loss` that is neither `continue` nor `stop`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("'{0}': expected continue or stop")]
pub struct OnLossError(String);

impl std::str::FromStr for OnLoss {
    type Err = OnLossError;
    fn from_str(s: &str) -> Result<Self, OnLossError> {
        match s {
            "continue" => Ok(Self::Continue),
            "stop" => Ok(Self::Stop),
            _ => Err(OnLossError(s.to_owned())),
        }
    }
}

/// How a controller reaches its agents.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where Redis is.
    pub redis: Redis,
    /// The key and channel prefix.
    pub keys: Keys,
    /// Only agents of this group.
    pub group: Option<String>,
    /// What a lost agent does to the run.
    pub on_loss: OnLoss,
    /// Each agent's own result file goes to `<dir>/<agent>.jsonl`.
    pub per_agent_output: Option<PathBuf>,
    /// A line per agent every second besides the merged progress.
    pub verbose: bool,
}

/// Why a run on agents cannot start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AgentsError {
    /// Redis could not be reached or refused us.
    #[error("Redis at {url}: {error}{hint}")]
    Link {
        /// The URL (password hidden).
        url: String,
        /// What failed.
        error: LinkError,
        /// What to check.
        hint: &'static str,
    },
    /// Nobody registered.
    #[error(
        "no live agents under {prefix}agent:*{group} in Redis at {url}\n  fix: start 'throng agent --redis {url}' on each load machine (same --agents-prefix{group_flag}), then check with 'throng agents --redis {url}'"
    )]
    NoAgents {
        /// The URL.
        url: String,
        /// The prefix.
        prefix: String,
        /// ` of group G`, or nothing.
        group: String,
        /// ` and --group G`, or nothing.
        group_flag: String,
    },
    /// An agent of another version.
    #[error(
        "agent {agent} is throng {theirs}, this controller {ours}: worker plans differ between versions\n  fix: install throng {ours} on {agent} (or this version of the controller on the others)"
    )]
    Version {
        /// The agent.
        agent: String,
        /// Its version.
        theirs: String,
        /// Ours.
        ours: String,
    },
    /// An agent's clock is too far off.
    #[error(
        "agent {agent}'s clock is {offset} off this machine's, more than {limit} ms (a quarter of the {interval_ms} ms interval): intervals would not line up\n  fix: sync the clocks of both machines (chrony or ntpd; 'chronyc tracking' shows the offset)"
    )]
    Clock {
        /// The agent.
        agent: String,
        /// Its offset, formatted.
        offset: String,
        /// The limit, ms.
        limit: u64,
        /// The interval, ms.
        interval_ms: u64,
    },
    /// An agent is running another run.
    #[error(
        "agent {agent} is busy with {role} run {run}\n  fix: wait for it to end, or leave it out with --group"
    )]
    Busy {
        /// The agent.
        agent: String,
        /// Its run.
        run: String,
        /// Its role.
        role: String,
    },
    /// The run does not fit the agents.
    #[error("{0}")]
    Split(#[from] SplitError),
}

/// The live agents that can take a run with intervals of `interval_ns`.
pub fn find(opts: &Options, interval_ns: u64) -> Result<Vec<Listed>, AgentsError> {
    let url = opts.redis.url.to_string();
    let listed =
        super::list::list(&opts.redis, &opts.keys, opts.group.as_deref()).map_err(|error| {
            AgentsError::Link {
                url: url.clone(),
                hint: match error {
                    LinkError::Refused(_) => {
                        " (check the user and password in the URL: redis://USER:PASSWORD@HOST:PORT)"
                    }
                    _ => "",
                },
                error,
            }
        })?;
    check(&listed, opts, interval_ns)?;
    Ok(listed)
}

/// What refuses a run before it starts.
fn check(listed: &[Listed], opts: &Options, interval_ns: u64) -> Result<(), AgentsError> {
    if listed.is_empty() {
        let group = opts.group.as_deref();
        return Err(AgentsError::NoAgents {
            url: opts.redis.url.to_string(),
            prefix: opts.keys.prefix().to_owned(),
            group: group.map_or(String::new(), |g| format!(" of group {g}")),
            group_flag: group.map_or(String::new(), |g| format!(" and --group {g}")),
        });
    }
    let limit_ns = interval_ns / 4;
    for l in listed {
        let r = &l.reg;
        if r.version != VERSION {
            return Err(AgentsError::Version {
                agent: r.name.clone(),
                theirs: r.version.clone(),
                ours: VERSION.to_owned(),
            });
        }
        if l.offset_ns.unsigned_abs() > limit_ns {
            return Err(AgentsError::Clock {
                agent: r.name.clone(),
                offset: fmt_offset(l.offset_ns),
                limit: limit_ns / 1_000_000,
                interval_ms: interval_ns / 1_000_000,
            });
        }
        if let Some(run) = &r.running {
            return Err(AgentsError::Busy {
                agent: r.name.clone(),
                run: run.run.clone(),
                role: run.role.clone(),
            });
        }
    }
    Ok(())
}

/// One agent's part of a run, as it went.
#[derive(Debug)]
struct Part {
    name: String,
    first: u32,
    workers: u32,
    connections: u64,
    gone: Vec<bool>,
    last_heard: Instant,
    lost: Option<(u64, String)>,
    opened: u64,
    received: u64,
    requests: u64,
    /// Messages its connections lost (`messages.lost`).
    messages_lost: u64,
    /// Connections that failed to open, or requests that failed.
    errors: u64,
    /// Each worker's last `connections.open`.
    open_now: Vec<i64>,
    file: Option<Writer>,
}

impl Part {
    fn open(&self) -> bool {
        self.lost.is_none() && self.gone.iter().any(|g| !g)
    }
}

/// The agents of one run: its [`Launch`], and afterwards one line per agent.
#[derive(Debug)]
pub struct Agents {
    opts: Options,
    run: String,
    split: Split,
    offsets: BTreeMap<String, i64>,
    parts: Rc<RefCell<Vec<Part>>>,
    /// The role launched (`hold`, `attack`).
    role: std::cell::Cell<&'static str>,
}

impl Agents {
    /// The run shared out as `split` over `listed`.
    pub fn new(opts: Options, listed: &[Listed], split: Split) -> Self {
        let run = format!("{:x}-{:x}", now_unix_ns(), std::process::id());
        let now = Instant::now();
        let parts = split
            .shares
            .iter()
            .map(|s| Part {
                name: s.agent.clone(),
                first: s.first,
                workers: s.workers,
                connections: s.connections,
                gone: vec![false; s.workers as usize],
                last_heard: now,
                lost: None,
                opened: 0,
                received: 0,
                requests: 0,
                messages_lost: 0,
                errors: 0,
                open_now: vec![0; s.workers as usize],
                file: None,
            })
            .collect();
        Self {
            run,
            offsets: listed
                .iter()
                .map(|l| (l.reg.name.clone(), l.offset_ns))
                .collect(),
            opts,
            split,
            parts: Rc::new(RefCell::new(parts)),
            role: std::cell::Cell::new("hold"),
        }
    }

    /// The run's id (its channel is `<prefix>run:<id>`).
    pub fn run_id(&self) -> &str {
        &self.run
    }

    /// The split.
    pub fn split(&self) -> &Split {
        &self.split
    }

    /// The lines printed at start: one per agent.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "  agents {} via {} (run {}, channel {}), lost agent: {}",
            self.split.shares.len(),
            self.opts.redis.url,
            self.run,
            self.opts.keys.run(&self.run),
            match self.opts.on_loss {
                OnLoss::Continue => "its share counts as lost, the run goes on (--on-agent-loss)",
                OnLoss::Stop => "the run stops (--on-agent-loss)",
            }
        )];
        for s in &self.split.shares {
            out.push(format!(
                "    {}: workers {}-{}, {} connections, sources {}, clock {}",
                s.agent,
                s.first,
                s.first + s.workers.saturating_sub(1),
                s.connections,
                super::describe_sources(&s.sources),
                fmt_offset(self.offsets.get(&s.agent).copied().unwrap_or(0)),
            ));
        }
        if let Some(dir) = &self.opts.per_agent_output {
            out.push(format!(
                "  each agent's own results to {}/<agent>.jsonl",
                dir.display()
            ));
        }
        out
    }

    /// Agents lost during the run, with why.
    pub fn lost(&self) -> Vec<String> {
        self.parts
            .borrow()
            .iter()
            .filter_map(|p| p.lost.as_ref().map(|(_, why)| format!("{}: {why}", p.name)))
            .collect()
    }

    /// One line per agent, for the summary.
    pub fn summary(&self, start_unix_ns: u64) -> String {
        let mut out = String::new();
        for p in self.parts.borrow().iter() {
            let state = match &p.lost {
                Some((at, why)) => format!(
                    "LOST at +{:.1} s ({why}): its share counts as lost",
                    at.saturating_sub(start_unix_ns) as f64 / 1e9
                ),
                None => "done".to_owned(),
            };
            let did = if self.role.get() == "attack" {
                format!(
                    "at most {} connections, {} requests sent",
                    p.connections, p.requests
                )
            } else {
                format!(
                    "{} connections planned, {} opened, {} messages received",
                    p.connections, p.opened, p.received
                )
            };
            let _ = writeln!(
                out,
                "agent {}: workers {}, {did}; {state}",
                p.name, p.workers
            );
        }
        out
    }
}

impl Agents {
    /// One object per agent, for the JSON summary: its name, workers,
    /// connections (planned: a hold's share, an attack's most at once),
    /// what it did (a hold's `opened`, `delivered` and `lost` messages; an
    /// attack's `requests`), its `errors` (failed connects or requests) and
    /// whether it was lost mid-run (`lost`: at how many seconds, and why).
    pub fn to_json(&self, start_unix_ns: u64) -> serde_json::Value {
        let attack = self.role.get() == "attack";
        let parts = self.parts.borrow();
        let agents = parts.iter().map(|p| {
            let mut one = serde_json::json!({
                "agent": p.name,
                "workers": p.workers,
                "connections": p.connections,
                "errors": p.errors,
            });
            if attack {
                one["requests"] = p.requests.into();
            } else {
                one["opened"] = p.opened.into();
                one["delivered"] = p.received.into();
                one["lost"] = p.messages_lost.into();
            }
            one["state"] = match &p.lost {
                Some(_) => "lost",
                None => "done",
            }
            .into();
            if let Some((at, why)) = &p.lost {
                one["lost_at_s"] = (at.saturating_sub(start_unix_ns) as f64 / 1e9).into();
                one["lost_why"] = why.clone().into();
            }
            one
        });
        serde_json::Value::Array(agents.collect())
    }
}

/// What the run's crew asks the control task to send.
#[derive(Debug)]
enum Outgoing {
    Order(Order),
    Close(Order),
    Kill,
}

/// The run's workers as the supervisor sees them: on agents.
#[derive(Debug)]
struct AgentCrew {
    labels: Vec<String>,
    out: mpsc::UnboundedSender<Outgoing>,
}

impl Crew for AgentCrew {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn label(&self, worker: usize) -> &str {
        self.labels.get(worker).map_or("?", String::as_str)
    }

    fn tell_all(&self, order: &Order) {
        let _ = self.out.send(Outgoing::Order(*order));
    }

    fn stop_all(&self, order: &Order) {
        let _ = self.out.send(Outgoing::Close(*order));
    }

    fn kill_all(&self) {
        let _ = self.out.send(Outgoing::Kill);
    }

    fn processes(&self) -> Vec<(String, u32)> {
        Vec::new()
    }

    fn wait_all(&self) {}
}

impl Launch for Agents {
    fn label(&self, role: &str, index: u32) -> String {
        let agent = self
            .split
            .of_worker(index)
            .map_or("?", |s| s.agent.as_str());
        format!("{agent}/{role}-{index}")
    }

    fn lead(&self) -> Duration {
        LEAD
    }

    fn launch(
        &self,
        role: &'static str,
        plans: Vec<(String, serde_json::Value)>,
        feed: &mpsc::UnboundedSender<Feed>,
    ) -> io::Result<Box<dyn Crew>> {
        self.role.set(role);
        let labels: Vec<String> = plans.iter().map(|(l, _)| l.clone()).collect();
        let mut starts: Vec<(String, Vec<Assigned>)> = self
            .split
            .shares
            .iter()
            .map(|s| (s.agent.clone(), Vec::new()))
            .collect();
        for (index, (label, mut plan)) in (0u32..).zip(plans) {
            let Some(at) = self
                .split
                .shares
                .iter()
                .position(|s| (s.first..s.first + s.workers).contains(&index))
            else {
                continue;
            };
            // Each agent binds its own source addresses.
            if let Some(obj) = plan.as_object_mut() {
                obj.insert(
                    "sources".to_owned(),
                    serde_json::to_value(&self.split.shares[at].sources)
                        .map_err(io::Error::other)?,
                );
            }
            starts[at].1.push(Assigned { index, label, plan });
        }
        if let Some(dir) = &self.opts.per_agent_output {
            std::fs::create_dir_all(dir).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("--per-agent-output {}: {e}", dir.display()),
                )
            })?;
            for p in self.parts.borrow_mut().iter_mut() {
                let header = Header::new(
                    std::env::args().collect(),
                    serde_json::json!({"subcommand": role, "agent": p.name, "run": self.run}),
                );
                let path = dir.join(format!("{}.jsonl", p.name));
                p.file = Some(Writer::create(&path, &header).map_err(io::Error::other)?);
            }
        }
        let (out, orders) = mpsc::unbounded_channel();
        let control = Control {
            opts: self.opts.clone(),
            run: self.run.clone(),
            role,
            parts: self.parts.clone(),
            feed: feed.clone(),
        };
        tokio::task::spawn_local(control.run(starts, orders));
        Ok(Box::new(AgentCrew { labels, out }))
    }
}

/// The part running `worker`, heard from now; `None` if there is none, or
/// its agent was lost (its workers are gone for the run: what it says late
/// is not counted).
fn live_part(parts: &mut [Part], worker: u32) -> Option<&mut Part> {
    let p = parts
        .iter_mut()
        .find(|p| (p.first..p.first + p.workers).contains(&worker))?;
    if p.lost.is_some() {
        return None;
    }
    p.last_heard = Instant::now();
    Some(p)
}

/// The task that talks to the agents during a run.
struct Control {
    opts: Options,
    run: String,
    role: &'static str,
    parts: Rc<RefCell<Vec<Part>>>,
    feed: mpsc::UnboundedSender<Feed>,
}

impl Control {
    async fn run(
        self,
        starts: Vec<(String, Vec<Assigned>)>,
        orders: mpsc::UnboundedReceiver<Outgoing>,
    ) {
        if let Err(e) = self.talk(starts, orders).await {
            let names: Vec<String> = self
                .parts
                .borrow()
                .iter()
                .filter(|p| p.open())
                .map(|p| p.name.clone())
                .collect();
            for name in names {
                self.lose(&name, &format!("the controller lost Redis: {e}"));
            }
        }
    }

    async fn talk(
        &self,
        starts: Vec<(String, Vec<Assigned>)>,
        mut orders: mpsc::UnboundedReceiver<Outgoing>,
    ) -> Result<(), LinkError> {
        let channel = self.opts.keys.run(&self.run);
        let mut sub = Conn::open(&self.opts.redis).await?;
        sub.subscribe(&channel).await?;
        let mut cmd = Conn::open(&self.opts.redis).await?;
        for (agent, workers) in starts {
            let start = Command::Start {
                run: self.run.clone(),
                role: self.role.to_owned(),
                version: VERSION.to_owned(),
                reply: channel.clone(),
                workers,
            };
            let text =
                serde_json::to_vec(&start).map_err(|e| LinkError::Protocol(e.to_string()))?;
            if cmd.publish(&self.opts.keys.to(&agent), &text).await? == 0 {
                self.lose(&agent, "not listening on its channel");
            }
        }
        let now = Instant::now();
        for p in self.parts.borrow_mut().iter_mut() {
            p.last_heard = now;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut closing = false;
        let mut ticks = 0u64;
        while self.parts.borrow().iter().any(Part::open) {
            tokio::select! {
                m = sub.message() => {
                    let m = m?;
                    if let Some(r) = std::str::from_utf8(&m).ok().and_then(Report::decode) {
                        self.heard(r);
                    }
                }
                o = orders.recv(), if !closing => {
                    let command = match o {
                        Some(Outgoing::Order(o)) => Command::Order { run: self.run.clone(), order: o.to_string() },
                        Some(Outgoing::Close(o)) => Command::Close { run: self.run.clone(), order: o.to_string() },
                        Some(Outgoing::Kill) => Command::Kill { run: self.run.clone() },
                        // The supervisor is gone: tell the agents to stop.
                        None => {
                            closing = true;
                            Command::Close { run: self.run.clone(), order: Order::Stop(0).to_string() }
                        }
                    };
                    let text = serde_json::to_vec(&command).map_err(|e| LinkError::Protocol(e.to_string()))?;
                    let names: Vec<String> = self.parts.borrow().iter().filter(|p| p.open()).map(|p| p.name.clone()).collect();
                    for name in names {
                        cmd.publish(&self.opts.keys.to(&name), &text).await?;
                    }
                }
                _ = tick.tick() => {
                    ticks += 1;
                    if self.opts.verbose && ticks % 4 == 0 {
                        self.show_parts();
                    }
                    let now = Instant::now();
                    let silent: Vec<String> = self.parts.borrow().iter()
                        .filter(|p| p.open() && now.duration_since(p.last_heard) >= LOST_AFTER)
                        .map(|p| p.name.clone())
                        .collect();
                    for name in silent {
                        self.lose(&name, &format!("no word from it for {} s", LOST_AFTER.as_secs()));
                    }
                }
            }
        }
        Ok(())
    }

    /// `--verbose`: one line per agent, what it did so far.
    fn show_parts(&self) {
        for p in self.parts.borrow().iter() {
            let state = if p.lost.is_some() {
                "LOST"
            } else if p.open() {
                "running"
            } else {
                "done"
            };
            let did = if self.role == "attack" {
                format!("requests {}", p.requests)
            } else {
                format!(
                    "open {}/{}  msgs {}",
                    p.open_now.iter().sum::<i64>(),
                    p.connections,
                    p.received
                )
            };
            let _ = self.feed.send(Feed::Note {
                text: format!("agent {}: {did}  ({state})", p.name),
                stop: false,
            });
        }
    }

    /// What an agent said.
    fn heard(&self, r: Report) {
        let mut parts = self.parts.borrow_mut();
        match r {
            Report::Line { worker, line } => {
                let Some(p) = live_part(&mut parts, worker) else {
                    return;
                };
                if let Ok(Record::Interval(i)) = decode_record(&line) {
                    if let Some(o) = p.open_now.get_mut((worker - p.first) as usize) {
                        *o = i.gauge("connections.open");
                    }
                    p.opened += i.counter("connect.ok");
                    p.received += i.counter("messages.received");
                    p.requests += i.counter("requests.sent");
                    p.messages_lost += i.counter("messages.lost");
                    p.errors +=
                        i.counters_under("connect.error.") + i.counters_under("requests.error.");
                }
                if let Some(f) = p.file.as_mut()
                    && f.write_encoded(&line).is_err()
                {
                    p.file = None;
                }
                let _ = self.feed.send(Feed::Line {
                    worker: worker as usize,
                    line,
                });
            }
            Report::Gone { worker } => {
                let Some(p) = live_part(&mut parts, worker) else {
                    return;
                };
                if let Some(g) = p.gone.get_mut((worker - p.first) as usize)
                    && !*g
                {
                    *g = true;
                    let _ = self.feed.send(Feed::Gone {
                        worker: worker as usize,
                    });
                }
            }
            Report::Alive { agent } => {
                if let Some(p) = parts.iter_mut().find(|p| p.name == agent) {
                    p.last_heard = Instant::now();
                }
            }
            Report::Error { agent, text } => {
                drop(parts);
                self.lose(&agent, &text);
            }
        }
    }

    /// Agent `name` is lost: say so, count its workers gone, stop the run if asked.
    fn lose(&self, name: &str, why: &str) {
        let mut parts = self.parts.borrow_mut();
        let Some(p) = parts.iter_mut().find(|p| p.name == name) else {
            return;
        };
        if p.lost.is_some() {
            return;
        }
        let open = p.gone.iter().filter(|g| !**g).count();
        p.lost = Some((now_unix_ns(), why.to_owned()));
        let stop = self.opts.on_loss == OnLoss::Stop;
        let _ = self.feed.send(Feed::Note {
            text: format!(
                "agent {name} lost ({why}): its {open} running worker(s) and their connections count as lost{}",
                if stop { "; stopping the run (--on-agent-loss stop)" } else { "" }
            ),
            stop,
        });
        for (k, g) in p.gone.iter_mut().enumerate() {
            if !*g {
                *g = true;
                let _ = self.feed.send(Feed::Gone {
                    worker: p.first as usize + k,
                });
            }
        }
    }
}

/// A `hold` of `connections` to `target` on the live agents: the run's
/// workers fitted over them, and the agents (for the summary afterwards).
pub fn hold(
    opts: Options,
    connections: u64,
    target: &crate::hold::target::WsTarget,
    interval_ns: u64,
) -> Result<(Remote, Rc<Agents>), AgentsError> {
    let listed = find(&opts, interval_ns)?;
    let split = super::split::hold(&listed, connections, target)?;
    Ok(remote(opts, &listed, split))
}

/// An `attack` holding at most `max_connections` at once on the live agents.
pub fn attack(
    opts: Options,
    max_connections: u64,
    interval_ns: u64,
) -> Result<(Remote, Rc<Agents>), AgentsError> {
    let listed = find(&opts, interval_ns)?;
    let split = super::split::attack(&listed, max_connections)?;
    Ok(remote(opts, &listed, split))
}

fn remote(opts: Options, listed: &[Listed], split: Split) -> (Remote, Rc<Agents>) {
    let agents = Rc::new(Agents::new(opts, listed, split));
    let remote = Remote {
        workers: agents.split.workers,
        launch: agents.clone(),
        lines: agents.lines(),
    };
    (remote, agents)
}
