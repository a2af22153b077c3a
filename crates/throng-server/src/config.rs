//! The server's settings: what `throng serve` was asked to do, with the
//! parser of its listen ranges (durations and sizes are
//! [`throng_host::units`], the grammar every command shares).
//!
//! The supervisor resolves the listen addresses and sends the whole `Config`
//! to each worker over its control socket, so workers never parse flags.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use throng_host::units::{fmt_duration, fmt_size};

/// Largest message a client may send us. Subscribers only send control
/// frames (at most 125 bytes), so anything bigger is refused with 1009.
pub const MAX_CLIENT_MESSAGE: usize = 4096;

/// Everything a worker needs to know. Built by the CLI, resolved by the
/// supervisor ([`crate::supervisor`]), handed to workers as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Addresses to listen on, one listener per address in every worker.
    pub listen: Vec<SocketAddr>,
    /// Worker processes to run (0: one per core, raised for `max_connections`).
    pub workers: usize,
    /// The connection target the worker count must allow, if any.
    pub max_connections: Option<u64>,
    /// Largest publish body (413 above it).
    pub max_message: usize,
    /// How often every connection is pinged.
    pub ping_interval: Duration,
    /// A connection that sent nothing for this long is closed (1008).
    pub idle_timeout: Duration,
    /// Unsent bytes a connection may queue before it is closed (1008).
    pub max_queue: usize,
    /// A queued write that makes no progress for this long ends the connection (1008).
    pub write_timeout: Duration,
    /// On SIGTERM/SIGINT: how long to wait for close handshakes before exiting.
    pub drain_timeout: Duration,
    /// A request head (or publish body) not complete within this is closed (slowloris).
    pub handshake_timeout: Duration,
    /// Enables `POST /bench/floor/<channel>`: a bare `write(2)` loop over the
    /// channel's subscribers, the floor the benchmark compares fan-out with.
    pub bench_floor: bool,
    /// `/ping`: a request not answered in full within this is cut off.
    pub request_timeout: Duration,
    /// `/ping`: the largest `sleep` header accepted (400 above it).
    pub max_sleep: Duration,
    /// `/ping`: the largest `times` header accepted (400 above it).
    pub max_times: u64,
    /// The Redis broker's mode when the node routes through Redis (`None`:
    /// the local relay). Workers need only this: in channels mode they report
    /// their channels' first and last subscribers; the URL stays with the supervisor.
    #[serde(default)]
    pub redis_mode: Option<crate::redis::RedisMode>,
    /// Addresses whose connections start with a TLS handshake (wss, https),
    /// one listener per address in every worker, beside the plain `listen` ones.
    #[serde(default)]
    pub tls_listen: Vec<SocketAddr>,
    /// Certificate, key and ticket key for `tls_listen` (required when it is not empty).
    #[serde(default)]
    pub tls: Option<crate::tls::Material>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 8080))],
            workers: 0,
            max_connections: None,
            max_message: 64 * 1024,
            ping_interval: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            max_queue: 256 * 1024,
            write_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            bench_floor: false,
            request_timeout: Duration::from_secs(3600),
            max_sleep: Duration::from_secs(3600),
            max_times: 1000,
            redis_mode: None,
            tls_listen: Vec::new(),
            tls: None,
        }
    }
}

/// A flag value that could not be parsed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct ParseError(String);

/// Parses `HOST:PORT` or `HOST:FIRST-LAST` (one listener per port) into addresses.
pub fn parse_listen(s: &str) -> Result<Vec<SocketAddr>, ParseError> {
    let bad = |why: &str| {
        ParseError(format!(
            "invalid listen address '{s}': {why} (expected HOST:PORT or HOST:FIRST-LAST, e.g. 127.0.0.1:10000-10015)"
        ))
    };
    let (host, ports) = s.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip: std::net::IpAddr = host.parse().map_err(|_| bad("host is not an IP address"))?;
    let (first, last) = match ports.split_once('-') {
        Some((a, b)) => (a, b),
        None => (ports, ports),
    };
    let first: u16 = first
        .parse()
        .map_err(|_| bad("port is not a number 0-65535"))?;
    let last: u16 = last
        .parse()
        .map_err(|_| bad("port is not a number 0-65535"))?;
    if last < first {
        return Err(bad("range ends before it starts"));
    }
    if first == 0 && last != 0 {
        return Err(bad("a range cannot start at port 0"));
    }
    Ok((first..=last).map(|p| SocketAddr::new(ip, p)).collect())
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listen: Vec<String> = self.listen.iter().map(ToString::to_string).collect();
        writeln!(f, "  listen           {}", listen.join(" "))?;
        if !self.tls_listen.is_empty() {
            let tls: Vec<String> = self.tls_listen.iter().map(ToString::to_string).collect();
            let key = self
                .tls
                .as_ref()
                .and_then(crate::tls::Material::key_algorithm);
            let cert = self.tls.as_ref().map_or_else(
                || "(none)".to_owned(),
                |m| {
                    format!(
                        "{} ({} key, SHA-256 {})",
                        m.source,
                        key.as_deref().unwrap_or("unknown"),
                        m.fingerprint()
                    )
                },
            );
            writeln!(f, "  tls-listen       {}", tls.join(" "))?;
            writeln!(
                f,
                "  tls              cert {cert}; TLS 1.3 and 1.2 (rustls, ring); ALPN http/1.1; resumption: tickets (key shared by workers) + {}-session cache per worker",
                crate::tls::SESSION_CACHE
            )?;
            if key.as_deref() == Some("RSA") {
                writeln!(
                    f,
                    "  tls note         an RSA key's signature is most of the CPU of each full handshake (ring); \
                     an ECDSA P-256 certificate makes new connections several times cheaper (docs/tls.md)"
                )?;
            }
        }
        match self.max_connections {
            Some(n) => writeln!(f, "  max-connections  {n}")?,
            None => writeln!(f, "  max-connections  (none)")?,
        }
        writeln!(f, "  max-message      {}", fmt_size(self.max_message))?;
        writeln!(f, "  ping-interval    {}", fmt_duration(self.ping_interval))?;
        writeln!(f, "  idle-timeout     {}", fmt_duration(self.idle_timeout))?;
        writeln!(f, "  max-queue        {}", fmt_size(self.max_queue))?;
        writeln!(f, "  write-timeout    {}", fmt_duration(self.write_timeout))?;
        writeln!(f, "  drain-timeout    {}", fmt_duration(self.drain_timeout))?;
        writeln!(
            f,
            "  handshake-timeout {}",
            fmt_duration(self.handshake_timeout)
        )?;
        writeln!(
            f,
            "  request-timeout  {} (/ping)",
            fmt_duration(self.request_timeout)
        )?;
        write!(
            f,
            "  max-sleep        {}, max-times {} (/ping)",
            fmt_duration(self.max_sleep),
            self.max_times
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_single_and_range() {
        assert_eq!(
            parse_listen("127.0.0.1:8080").unwrap(),
            vec!["127.0.0.1:8080".parse().unwrap()]
        );
        let r = parse_listen("127.0.0.1:10000-10015").unwrap();
        assert_eq!(r.len(), 16);
        assert_eq!(r[15], "127.0.0.1:10015".parse().unwrap());
        assert_eq!(
            parse_listen("[::1]:9000").unwrap(),
            vec!["[::1]:9000".parse().unwrap()]
        );
        assert!(parse_listen("127.0.0.1:9-3").is_err());
        assert!(parse_listen("localhost:80").is_err());
        assert!(parse_listen("127.0.0.1").is_err());
        assert!(parse_listen("127.0.0.1:70000").is_err());
    }
}
