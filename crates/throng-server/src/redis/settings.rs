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

use super::error::{ProbeError, UnknownMode};
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

    /// The start-line description (no password).
    pub fn describe(&self) -> String {
        let what = match self.mode {
            RedisMode::Pattern => format!("PSUBSCRIBE {}", self.pattern()),
            RedisMode::Channels => format!("SUBSCRIBE {}<channel> per local channel", self.prefix),
        };
        let tls = if self.url.tls {
            format!("; {}", self.trust.describe())
        } else {
            String::new()
        };
        let publish = match self.history {
            Some(h) => format!(
                "XADD {p}<channel> MAXLEN ~ {} and PUBLISH {p}<channel> in one script",
                h.keep,
                p = self.prefix
            ),
            None => format!("PUBLISH {}<channel>", self.prefix),
        };
        format!(
            "redis {} (mode {}: {what}; publish {publish}{tls}{})",
            self.url,
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
        rt.block_on(throng_client::redis::open(
            &self.url,
            self.tls.as_ref(),
            CONNECT_TIMEOUT,
        ))
        .map(drop)
        .map_err(ProbeError::Open)
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
        };
        assert_eq!(s("throng:").pattern(), "throng:*");
        assert_eq!(s("a*b?[c]\\").pattern(), "a\\*b\\?\\[c\\]\\\\*");
        assert_eq!(s("").pattern(), "*");
    }
}
