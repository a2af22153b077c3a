//! What the Redis broker is told at start: where Redis is, how a node
//! subscribes ([`RedisMode`]), and the history and retained limits it
//! applies there; also the probe `throng serve` runs before it starts.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use throng_client::redis::RedisUrl;
pub use throng_client::trust::Trust;

pub use super::cluster::Addr;
use super::error::{BadAddr, ProbeError, SessionError, UnknownMode};
use super::sentinel::Sentinels;
use crate::stream::StreamLimits;

/// How a node subscribes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One `PSUBSCRIBE <prefix>*`: every node receives every message.
    Pattern,
    /// `SUBSCRIBE` to each channel that has local subscribers, `UNSUBSCRIBE`
    /// when the last one leaves: a node receives only what it delivers.
    Channels,
}

impl FromStr for RedisMode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, UnknownMode> {
        match s {
            "pattern" => Ok(Self::Pattern),
            "channels" => Ok(Self::Channels),
            _ => Err(UnknownMode(s.to_owned())),
        }
    }
}

impl fmt::Display for RedisMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pattern => "pattern",
            Self::Channels => "channels",
        })
    }
}

/// Where a node finds Redis.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Topology {
    /// One Redis, at the URL's address (`--redis`).
    #[default]
    Single,
    /// A Redis Cluster (`--redis-cluster`): its map learnt from any of
    /// these nodes, one link per master, sharded pub/sub (`SSUBSCRIBE`,
    /// `SPUBLISH`). The URL gives the credentials and TLS, not the address.
    Cluster(Vec<Addr>),
    /// A master that Sentinel names (`--redis-sentinel`, `--redis-master`):
    /// asked of these sentinels before every connection, and left when
    /// one announces `+switch-master`.
    Sentinel {
        /// The sentinels, asked in turn.
        sentinels: Vec<Addr>,
        /// The master's name in Sentinel's configuration.
        master: String,
    },
}

impl Topology {
    /// From `--redis-cluster LIST`, or `--redis-sentinel LIST` with
    /// `--redis-master NAME`; neither: one Redis.
    pub fn from_flags(
        cluster: Option<&str>,
        sentinel: Option<&str>,
        master: Option<String>,
    ) -> Result<Self, BadAddr> {
        Ok(match (cluster, sentinel, master) {
            (Some(list), _, _) => Self::Cluster(Self::addrs(list)?),
            (None, Some(list), Some(master)) => Self::Sentinel {
                sentinels: Self::addrs(list)?,
                master,
            },
            _ => Self::Single,
        })
    }

    /// The URL to use: `--redis`'s, or with a cluster or sentinels and no
    /// `--redis`, one without credentials; `None`: no Redis at all.
    pub fn url(&self, given: Option<RedisUrl>) -> Option<RedisUrl> {
        match (given, self) {
            (Some(url), _) => Some(url),
            (None, Self::Single) => None,
            (None, _) => Some(self.default_url()),
        }
    }

    /// The mode when `--redis-mode` is not given: channels on a cluster
    /// (where pattern is refused), else pattern.
    pub fn mode(&self, given: Option<RedisMode>) -> RedisMode {
        given.unwrap_or(match self {
            Self::Cluster(_) => RedisMode::Channels,
            _ => RedisMode::Pattern,
        })
    }

    /// The first address, no credentials.
    fn default_url(&self) -> RedisUrl {
        let first = match self {
            Self::Cluster(v) | Self::Sentinel { sentinels: v, .. } => v.first(),
            Self::Single => None,
        };
        RedisUrl {
            host: first.map_or_else(|| "127.0.0.1".to_owned(), |a| a.host.clone()),
            port: first.map_or(6379, |a| a.port),
            user: None,
            password: None,
            db: 0,
            tls: false,
        }
    }

    /// Reads `HOST:PORT[,HOST:PORT...]` (`--redis-cluster`, `--redis-sentinel`).
    pub fn addrs(list: &str) -> Result<Vec<Addr>, BadAddr> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| Addr::parse(s).ok_or_else(|| BadAddr(s.to_owned())))
            .collect::<Result<Vec<_>, _>>()
            .and_then(|v| {
                if v.is_empty() {
                    Err(BadAddr(list.to_owned()))
                } else {
                    Ok(v)
                }
            })
    }
}

/// Everything the Redis broker needs; lives in the supervisor only (the
/// password never reaches the workers or the start line).
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// Where Redis is.
    pub url: RedisUrl,
    /// Channel `c` is the Redis channel `<prefix>c`.
    pub prefix: String,
    /// How this node subscribes.
    pub mode: RedisMode,
    /// Start even when Redis is unreachable, and keep retrying.
    pub wait: bool,
    /// `rediss://`: which certificates Redis may present (for the start line).
    pub trust: Trust,
    /// `rediss://`: the TLS configuration made from `trust` (`None`: plain TCP).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Channel history in Redis Streams (`--history`): every node recovers
    /// the same messages under the streams' ids ([`crate::stream`]).
    pub history: Option<StreamLimits>,
    /// Channels the shared retained store may hold (`--max-retained`).
    pub max_retained: usize,
    /// One Redis, a cluster, or a master found through Sentinel.
    pub topology: Topology,
    /// MQTT sessions in Redis: the messages queued per session away by
    /// each publish (`--mqtt-session-queue`); 0: sessions are the node's
    /// (channels mode, a cluster), publishes queue nothing.
    pub session_queue: usize,
}

impl RedisSettings {
    /// The one pattern of [`RedisMode::Pattern`]: the prefix with glob
    /// characters escaped, then `*`.
    pub fn pattern(&self) -> String {
        let mut p = String::with_capacity(self.prefix.len() + 2);
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                p.push('\\');
            }
            p.push(c);
        }
        p.push('*');
        p
    }

    /// Whether pub/sub is sharded (`SSUBSCRIBE`, `SPUBLISH`): on a cluster.
    pub fn sharded(&self) -> bool {
        matches!(self.topology, Topology::Cluster(_))
    }

    /// These settings aimed at one server (a cluster's master, the master
    /// Sentinel named): same credentials, TLS and everything else.
    pub(crate) fn at(&self, a: &Addr) -> Self {
        let mut s = self.clone();
        s.url.host.clone_from(&a.host);
        s.url.port = a.port;
        s
    }

    /// The sentinels to ask, with `--redis-sentinel`.
    pub(crate) fn sentinels(&self) -> Option<Sentinels> {
        match &self.topology {
            Topology::Sentinel { sentinels, master } => Some(Sentinels {
                addrs: sentinels.clone(),
                master: master.clone(),
                tls: self.tls.clone(),
            }),
            _ => None,
        }
    }

    /// The master's address: the URL's, or the one the sentinels name.
    pub(crate) async fn master(&self) -> Result<Addr, SessionError> {
        match self.sentinels() {
            Some(q) => super::sentinel::resolve(&q).await,
            None => Ok(Addr {
                host: self.url.host.clone(),
                port: self.url.port,
            }),
        }
    }

    /// Where Redis is, for the start line and `/healthz` (no password).
    pub fn place(&self) -> String {
        let list = |v: &[Addr]| {
            v.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        match &self.topology {
            Topology::Single => self.url.to_string(),
            Topology::Cluster(seeds) => format!("cluster {} (seeds)", list(seeds)),
            Topology::Sentinel { sentinels, master } => {
                format!("master '{master}' of sentinels {}", list(sentinels))
            }
        }
    }

    /// The start-line description (no password).
    pub fn describe(&self) -> String {
        let (sub, publ) = if self.sharded() {
            ("SSUBSCRIBE", "SPUBLISH")
        } else {
            ("SUBSCRIBE", "PUBLISH")
        };
        let what = match self.mode {
            RedisMode::Pattern => format!("PSUBSCRIBE {}", self.pattern()),
            RedisMode::Channels if self.sharded() => format!(
                "{sub} {}<channel> per local channel, on the master of its slot",
                self.prefix
            ),
            RedisMode::Channels => format!("{sub} {}<channel> per local channel", self.prefix),
        };
        let tls = if self.url.tls {
            format!("; {}", self.trust.describe())
        } else {
            String::new()
        };
        let publish = match self.history {
            Some(h) => format!(
                "XADD {p}<channel> MAXLEN ~ {} and {publ} {p}<channel> in one script",
                h.keep,
                p = self.prefix
            ),
            None => format!("{publ} {}<channel>", self.prefix),
        };
        format!(
            "redis {} (mode {}: {what}; publish {publish}{tls}{})",
            self.place(),
            self.mode,
            if self.wait {
                "; --redis-wait: serve before Redis answers"
            } else {
                ""
            }
        )
    }

    /// Checks, before the server's runtime exists, that Redis answers
    /// (over TLS for `rediss://`: the certificate is checked) and accepts
    /// our credentials: what `throng serve` does before it starts, so a
    /// wrong URL or CA is an error at once rather than a node that never
    /// delivers. The same connect as the broker's, on a runtime of its own.
    pub fn probe(&self) -> Result<(), ProbeError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ProbeError::Runtime)?;
        rt.block_on(self.probe_on())
    }

    /// The probe's connection: the URL; any seed of a cluster; the master
    /// the sentinels name.
    async fn probe_on(&self) -> Result<(), ProbeError> {
        let open = |s: Self| async move {
            throng_client::redis::open(&s.url, s.tls.as_ref(), CONNECT_TIMEOUT)
                .await
                .map(drop)
        };
        match &self.topology {
            Topology::Single => open(self.clone()).await.map_err(ProbeError::Open),
            Topology::Cluster(seeds) => {
                let mut last = None;
                for a in seeds {
                    match open(self.at(a)).await {
                        Ok(()) => return Ok(()),
                        Err(e) => last = Some(e),
                    }
                }
                Err(ProbeError::Open(last.expect("at least one seed")))
            }
            Topology::Sentinel { .. } => {
                let a = self
                    .master()
                    .await
                    .map_err(|e| ProbeError::Sentinel(e.to_string()))?;
                open(self.at(&a)).await.map_err(ProbeError::Open)
            }
        }
    }
}

/// How long a connection attempt may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_escapes_glob_characters() {
        let s = |prefix: &str| RedisSettings {
            url: "redis://h".parse().unwrap(),
            prefix: prefix.into(),
            mode: RedisMode::Pattern,
            wait: false,
            trust: Trust::default(),
            tls: None,
            history: None,
            max_retained: 10,
            topology: Topology::Single,
            session_queue: 0,
        };
        assert_eq!(s("throng:").pattern(), "throng:*");
        assert_eq!(s("a*b?[c]\\").pattern(), "a\\*b\\?\\[c\\]\\\\*");
        assert_eq!(s("").pattern(), "*");
    }
}
