//! `throng agent` (a load machine's part of a distributed run), `throng
//! agents` (the live ones) and the `--agents` options `hold` takes; the
//! work is `throng_load::agent`'s.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;

use anyhow::Context as _;
use throng_client::redis::RedisUrl;
use throng_client::trust::Trust;
use throng_load::agent::crew::{self, Agents, OnLoss};
use throng_load::agent::redis::Redis;
use throng_load::agent::{DEFAULT_PREFIX, Keys, list, serve, valid_name};
use throng_load::harness::pool::Remote;
use throng_load::hold::target::{WsTarget, parse_sources};

use super::Format;

/// How to reach Redis, as every agent command takes it.
#[derive(Debug, clap::Args)]
pub(crate) struct RedisArgs {
    /// Key and channel prefix of the agents in Redis (keys <prefix>agent:<name>, channels
    /// <prefix>to:<name> and <prefix>run:<id>); controller and agents must agree.
    #[arg(long, default_value = DEFAULT_PREFIX, value_name = "PREFIX")]
    agents_prefix: String,

    /// rediss://: PEM file of the CA certificate(s) that signed Redis's certificate.
    /// Default: the system bundle.
    #[arg(long, value_name = "FILE")]
    redis_tls_ca: Option<PathBuf>,
}

impl RedisArgs {
    fn redis(&self, url: &str) -> anyhow::Result<(Redis, Keys)> {
        let url: RedisUrl = url.parse()?;
        let trust = Trust {
            ca: self.redis_tls_ca.clone(),
            insecure: false,
        };
        let tls = trust
            .client_config(&url)
            .context("TLS trust for Redis (--redis-tls-ca)")?;
        if self.agents_prefix.is_empty() || self.agents_prefix.contains(['*', '?', '[', ' ']) {
            anyhow::bail!(
                "--agents-prefix '{}': give a non-empty prefix without spaces or * ? [ (default {DEFAULT_PREFIX})",
                self.agents_prefix
            );
        }
        Ok((Redis { url, tls }, Keys::new(&self.agents_prefix)))
    }
}

/// Arguments of `throng agent`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  throng agent --redis redis://10.0.0.6:6379
  throng agent --redis rediss://agent:secret@redis.example:6380 --name load-3 --group eu --source-ips 10.0.1.1-10.0.1.4

Runs in the foreground and logs to stderr (a systemd service as it is; see
docs/distributed.md). It registers under <prefix>agent:<name> with its capacity
and refreshes that every second (the key expires 5 s after the last refresh),
and runs the hold and attack workers a controller (throng hold --agents ...)
gives it: throng's own worker plans only, never a command line. SIGINT or
SIGTERM stops its workers and unregisters it.")]
pub(crate) struct AgentArgs {
    /// Redis to register with: redis[s]://[user:password@]HOST[:PORT][/DB].
    #[arg(long, value_name = "URL")]
    redis: String,

    /// This agent's name (letters, digits, - _ .). Default: the host name.
    #[arg(long)]
    name: Option<String>,

    /// Its group: a controller with --group G uses only agents of group G.
    #[arg(long, value_name = "G")]
    group: Option<String>,

    /// Source addresses its connections bind: a range 10.0.1.1-10.0.1.4 and/or a comma list.
    /// Default: the kernel picks (on a loopback target: 127.0.0.2.., as hold does).
    #[arg(long, value_name = "LIST")]
    source_ips: Option<String>,

    /// Serve this agent's own live figures as Prometheus text on
    /// http://HOST:PORT/metrics: its workers' counters, levels and latency
    /// histograms of the run it serves (starting again at each run), for a
    /// dashboard per load machine. The controller's --metrics-listen has the
    /// whole run.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listen: Option<std::net::SocketAddr>,

    #[command(flatten)]
    redis_args: RedisArgs,
}

pub(crate) fn run_agent(args: AgentArgs) -> anyhow::Result<ExitCode> {
    let (redis, keys) = args.redis_args.redis(&args.redis)?;
    let name = args.name.unwrap_or_else(throng_host::sample::hostname);
    if !valid_name(&name) {
        anyhow::bail!("agent name '{name}': use 1-64 letters, digits, '-', '_' or '.' (--name)");
    }
    if let Some(g) = &args.group
        && !valid_name(g)
    {
        anyhow::bail!("group '{g}': use 1-64 letters, digits, '-', '_' or '.'");
    }
    let sources: Vec<IpAddr> = match &args.source_ips {
        Some(s) => parse_sources(s)?,
        None => Vec::new(),
    };
    let metrics = args
        .metrics_listen
        .map(throng_load::harness::metrics::Metrics::listen)
        .transpose()?;
    if let Some(m) = &metrics {
        eprintln!(
            "throng agent {name}: metrics on http://{}/metrics (this agent's workers, each run's)",
            m.addr()
        );
    }
    serve::run(serve::Options {
        redis,
        keys,
        name,
        group: args.group,
        sources,
        instance: 0,
        metrics,
    })
    .context("agent")?;
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `throng agents`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Example:
  throng agents --redis redis://10.0.0.6:6379

Lists every live agent: its capacity (cores, open files per process, free
memory, local port range, source addresses), version, clock offset to this
machine (measured against Redis's TIME, with its uncertainty) and what it runs.")]
pub(crate) struct AgentsArgs {
    /// Redis the agents registered with.
    #[arg(long, value_name = "URL")]
    redis: String,

    /// Only agents of this group.
    #[arg(long, value_name = "G")]
    group: Option<String>,

    /// The registrations as text or json.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// The same as --format json.
    #[arg(long, conflicts_with = "format")]
    json: bool,

    #[command(flatten)]
    redis_args: RedisArgs,
}

pub(crate) fn run_agents(args: AgentsArgs) -> anyhow::Result<ExitCode> {
    let (redis, keys) = args.redis_args.redis(&args.redis)?;
    let listed = list::list(&redis, &keys, args.group.as_deref())
        .with_context(|| format!("Redis at {}", redis.url))?;
    if args.json || args.format == Format::Json {
        let regs: Vec<_> = listed
            .iter()
            .map(|l| {
                serde_json::json!({
                    "registration": l.reg,
                    "offset_ns": l.offset_ns,
                    "offset_error_ns": l.offset_error_ns,
                })
            })
            .collect();
        super::print(&format!("{}\n", serde_json::to_string_pretty(&regs)?))?;
    } else if listed.is_empty() {
        eprintln!(
            "no live agents under {}agent:* (start 'throng agent --redis {}' on each load machine)",
            keys.prefix(),
            redis.url
        );
    } else {
        super::print(&list::render(&listed))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The `--agents` options of `hold`, `attack` and `knee`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// Run on the live agents registered in this Redis (see 'throng agent'), instead of
    /// worker processes here: redis[s]://[user:password@]HOST[:PORT][/DB].
    #[arg(long, value_name = "URL")]
    agents: Option<String>,

    /// --agents: only agents of this group.
    #[arg(long, value_name = "G", requires = "agents")]
    group: Option<String>,

    /// --agents: when an agent is lost mid-run (no word for 3 s), go on without its share
    /// (counted as lost) or stop the run.
    #[arg(
        long,
        default_value = "continue",
        value_name = "continue|stop",
        requires = "agents"
    )]
    on_agent_loss: OnLoss,

    /// --agents: also write each agent's own result file, DIR/<agent>.jsonl.
    #[arg(long, value_name = "DIR", requires = "agents")]
    per_agent_output: Option<PathBuf>,

    /// --agents: a line per agent each second (on stderr) besides the merged progress.
    #[arg(long, requires = "agents")]
    verbose: bool,

    #[command(flatten)]
    redis_args: RedisArgs,
}

impl RunArgs {
    /// Whether `--agents` was given.
    pub(crate) fn given(&self) -> bool {
        self.agents.is_some()
    }

    /// The agents of a `hold`, when `--agents` was given.
    pub(crate) fn hold(
        &self,
        connections: u64,
        target: &WsTarget,
        interval_ns: u64,
        local_plan: bool,
    ) -> anyhow::Result<Option<(Remote, Rc<Agents>)>> {
        let Some(opts) = self.options(local_plan)? else {
            return Ok(None);
        };
        Ok(Some(crew::hold(opts, connections, target, interval_ns)?))
    }

    /// The agents of an `attack`, when `--agents` was given.
    pub(crate) fn attack(
        &self,
        max_connections: u64,
        interval_ns: u64,
        local_plan: bool,
    ) -> anyhow::Result<Option<(Remote, Rc<Agents>)>> {
        let Some(opts) = self.options(local_plan)? else {
            return Ok(None);
        };
        Ok(Some(crew::attack(opts, max_connections, interval_ns)?))
    }

    /// `local_plan`: `--workers` or `--source-ips` was given, which with
    /// agents are each agent's.
    pub(crate) fn options(&self, local_plan: bool) -> anyhow::Result<Option<crew::Options>> {
        let Some(url) = &self.agents else {
            return Ok(None);
        };
        if local_plan {
            anyhow::bail!(
                "with --agents, workers and source addresses are each agent's: give --source-ips to 'throng agent', and leave --workers out"
            );
        }
        let (redis, keys) = self.redis_args.redis(url)?;
        Ok(Some(crew::Options {
            redis,
            keys,
            group: self.group.clone(),
            on_loss: self.on_agent_loss,
            per_agent_output: self.per_agent_output.clone(),
            verbose: self.verbose,
        }))
    }
}

/// The end of a `hold` or `attack` run, maybe on agents: its summary (the
/// `json` one when given, with an `agents` section when it ran on agents;
/// or the `text` followed by one line per agent), then each failed
/// threshold (a lost agent fails the run) on stderr after `fail`; exit
/// status 1 if any failed.
pub(crate) fn conclude(
    json: Option<serde_json::Value>,
    text: impl FnOnce() -> String,
    start_unix_ns: u64,
    agents: Option<&Agents>,
    mut failed: Vec<String>,
    fail: &str,
) -> anyhow::Result<ExitCode> {
    let shown_as_json = json.is_some();
    if let Some(mut value) = json {
        if let (Some(a), Some(fields)) = (agents, value.as_object_mut()) {
            fields.insert("agents".into(), a.to_json(start_unix_ns));
        }
        super::print(&format!("{}\n", serde_json::to_string_pretty(&value)?))?;
    } else {
        super::print(&text())?;
    }
    if let Some(a) = agents {
        if !shown_as_json {
            super::print(&a.summary(start_unix_ns))?;
        }
        failed.extend(a.lost().into_iter().map(|l| format!("agent {l}")));
    }
    for f in &failed {
        eprintln!("{fail}{f}");
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
