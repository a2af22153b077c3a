//! Many load machines, one command: `throng agent` on each load machine,
//! and a controller (`throng hold --agents`, `throng agents`) on one,
//! coordinated through Redis, which throng already speaks.
//!
//! An agent is the harness's worker pool run on another machine: the
//! controller's supervisor loop ([`crate::harness::supervise`]) is the same,
//! its [`crate::harness::pool::Crew`] is the agents ([`crew`]) and its
//! [`crate::harness::pool::Feed`] is what they publish. What crosses Redis,
//! all under one prefix (`throng:agents:` by default):
//!
//! - `<prefix>agent:<name>`: a key per live agent, its [`Registration`]
//!   (capacity, version, clock offset, what it runs) as JSON, set again
//!   every second with a [`TTL`]: an agent that is gone expires;
//! - `<prefix>to:<name>`: the channel an agent listens on for a
//!   controller's [`Command`]s (start these workers of a run, an order,
//!   stop, kill): throng's own worker plans only, never a shell command;
//! - `<prefix>run:<id>`: the channel of one run, where its agents publish
//!   [`Report`]s: each worker's record lines as its pipe would carry them,
//!   when a worker is gone, and a heartbeat twice a second that tells the
//!   controller an agent is still there.
//!
//! [`redis`] is the Redis connection both sides use (on
//! `throng-client`'s connect and greeting), [`serve`] the agent process,
//! [`list`] what `throng agents` shows, [`crew`] the controller's side of a
//! run, [`split`] how a run is shared out by capacity.

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod crew;
pub mod list;
pub mod redis;
pub mod serve;
pub mod split;

/// The default key and channel prefix.
pub const DEFAULT_PREFIX: &str = "throng:agents:";
/// How long an agent's key lives unless refreshed (it is, every [`BEAT`]).
pub const TTL: Duration = Duration::from_secs(5);
/// How often an agent refreshes its key, and twice as often says it is
/// alive on a run's channel.
pub const BEAT: Duration = Duration::from_secs(1);
/// An agent silent this long on a run's channel is lost: named, its workers
/// counted gone. Six heartbeats: a busy machine delays one or two.
pub const LOST_AFTER: Duration = Duration::from_secs(3);
/// The roles an agent runs: `throng <role> --worker` with the plan on stdin.
pub const ROLES: [&str; 2] = ["hold", "attack"];
/// This program's version, which controller and agents must share (the
/// worker plans are this version's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where the keys and channels are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key holding agent `name`'s registration.
    pub fn agent(&self, name: &str) -> String {
        format!("{}agent:{name}", self.prefix)
    }

    /// The pattern matching every agent's key.
    pub fn agents_pattern(&self) -> String {
        format!("{}agent:*", self.prefix)
    }

    /// The channel agent `name` listens on.
    pub fn to(&self, name: &str) -> String {
        format!("{}to:{name}", self.prefix)
    }

    /// The channel of run `id`.
    pub fn run(&self, id: &str) -> String {
        format!("{}run:{id}", self.prefix)
    }
}

/// What a machine gives a run, as an agent registers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// CPU cores.
    pub cores: u32,
    /// Open files one process may have (the hard limit).
    pub nofile: u64,
    /// `MemAvailable`, bytes (0: unknown).
    pub free_memory: u64,
    /// `net.ipv4.ip_local_port_range`, inclusive.
    pub local_ports: (u16, u16),
    /// Source addresses the agent binds (`--source-ips`; empty: the kernel picks).
    pub sources: Vec<IpAddr>,
}

/// An agent's key: who it is, what it can take, what it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// Its name (`--name`, default the host name).
    pub name: String,
    /// Its group (`--group`), if any: a controller may use one group only.
    pub group: Option<String>,
    /// Its throng version.
    pub version: String,
    /// What it can take.
    pub capacity: Capacity,
    /// Its clock less Redis's (`TIME`), ns, measured at the last heartbeat.
    pub clock_offset_ns: i64,
    /// How long that measurement's round trip took, ns (its uncertainty).
    pub clock_rtt_ns: u64,
    /// What it runs now, if anything.
    pub running: Option<Running>,
    /// When it wrote this, its own clock, ns since the Unix epoch.
    pub at_unix_ns: u64,
    /// A number drawn at its start: two live agents of one name differ in it.
    #[serde(default)]
    pub instance: u64,
}

/// A run an agent takes part in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    /// The run's id.
    pub run: String,
    /// Its role (`hold`, `attack`).
    pub role: String,
    /// Worker processes the agent runs for it.
    pub workers: u32,
}

/// One worker of a run, as a controller hands it to an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assigned {
    /// Its number in the whole run, `0..workers`.
    pub index: u32,
    /// The `source` its records carry (`agent/hold-3`).
    pub label: String,
    /// Its plan: the role's worker plan, as a local worker gets it on stdin.
    pub plan: serde_json::Value,
}

/// What a controller tells an agent on `<prefix>to:<name>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum Command {
    /// Start these workers of run `run` and report on `reply`.
    Start {
        /// The run's id.
        run: String,
        /// `hold` or `attack` (one of [`ROLES`]).
        role: String,
        /// The controller's version (an agent refuses another).
        version: String,
        /// The run's channel.
        reply: String,
        /// The workers.
        workers: Vec<Assigned>,
    },
    /// Pass a harness order line (`publishing <ns>`) to every worker of `run`.
    Order {
        /// The run.
        run: String,
        /// The order line.
        order: String,
    },
    /// Pass `order` (`stop <seq>`), then end the workers' input.
    Close {
        /// The run.
        run: String,
        /// The order line.
        order: String,
    },
    /// End the workers of `run` at once.
    Kill {
        /// The run.
        run: String,
    },
}

/// What an agent says on a run's channel: one line of text each, so a
/// record line crosses as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// `L <worker> <line>`: one line worker `worker` printed.
    Line {
        /// The worker's number in the run.
        worker: u32,
        /// The line.
        line: String,
    },
    /// `G <worker>`: worker `worker` is gone.
    Gone {
        /// The worker's number in the run.
        worker: u32,
    },
    /// `H <agent>`: the agent is alive.
    Alive {
        /// The agent.
        agent: String,
    },
    /// `E <agent> <text>`: the agent could not do what it was told.
    Error {
        /// The agent.
        agent: String,
        /// Why.
        text: String,
    },
}

impl Report {
    /// The report as it goes on the channel.
    pub fn encode(&self) -> String {
        match self {
            Self::Line { worker, line } => format!("L {worker} {line}"),
            Self::Gone { worker } => format!("G {worker}"),
            Self::Alive { agent } => format!("H {agent}"),
            Self::Error { agent, text } => format!("E {agent} {text}"),
        }
    }

    /// The report in `text`; `None` if it is not one.
    pub fn decode(text: &str) -> Option<Self> {
        let (kind, rest) = text.split_once(' ')?;
        match kind {
            "L" => {
                let (w, line) = rest.split_once(' ').unwrap_or((rest, ""));
                Some(Self::Line {
                    worker: w.parse().ok()?,
                    line: line.to_owned(),
                })
            }
            "G" => Some(Self::Gone {
                worker: rest.parse().ok()?,
            }),
            "H" => Some(Self::Alive {
                agent: rest.to_owned(),
            }),
            "E" => {
                let (agent, text) = rest.split_once(' ').unwrap_or((rest, ""));
                Some(Self::Error {
                    agent: agent.to_owned(),
                    text: text.to_owned(),
                })
            }
            _ => None,
        }
    }
}

/// Source addresses for people: ranges folded (`10.0.1.1-10.0.1.4`), or
/// that the kernel picks.
pub fn describe_sources(sources: &[IpAddr]) -> String {
    if sources.is_empty() {
        "(the kernel picks)".to_owned()
    } else {
        crate::hold::target::format_sources(sources)
    }
}

/// Whether `name` may name an agent: it is part of keys and channel names
/// and of every record's `source`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_cross_as_one_line_each() {
        for r in [
            Report::Line {
                worker: 7,
                line: r#"{"type":"interval","x":"a b"}"#.into(),
            },
            Report::Line {
                worker: 0,
                line: String::new(),
            },
            Report::Gone { worker: 3 },
            Report::Alive {
                agent: "load-1".into(),
            },
            Report::Error {
                agent: "a".into(),
                text: "version 0.1 is not 0.2".into(),
            },
        ] {
            assert_eq!(Report::decode(&r.encode()), Some(r.clone()), "{r:?}");
        }
        for bad in ["", "L", "L x y", "G", "G -1", "Z 1", "H"] {
            assert_eq!(Report::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn commands_are_tagged_json() {
        let c = Command::Close {
            run: "r1".into(),
            order: "stop 4".into(),
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(text, r#"{"do":"close","run":"r1","order":"stop 4"}"#);
        assert_eq!(serde_json::from_str::<Command>(&text).unwrap(), c);
        assert!(serde_json::from_str::<Command>(r#"{"do":"shell","cmd":"rm"}"#).is_err());
    }

    #[test]
    fn names_stay_inside_keys() {
        assert!(valid_name("load-1.dc_2"));
        for bad in ["", "a b", "a:b", "a/b", "a*", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
        let k = Keys::new(DEFAULT_PREFIX);
        assert_eq!(k.agent("a"), "throng:agents:agent:a");
        assert_eq!(k.to("a"), "throng:agents:to:a");
        assert_eq!(k.run("r"), "throng:agents:run:r");
    }
}
