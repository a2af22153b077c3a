//! The server's settings: what `throng serve` was asked to do, with the
//! parsers for its flag values (listen ranges, durations, byte sizes).
//!
//! The supervisor resolves the listen addresses and sends the whole `Config`
//! to each worker over its control socket, so workers never parse flags.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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

/// Parses a duration: `30s`, `500ms`, `2m`, `1h`, or plain seconds (`30`).
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    let bad = || ParseError(format!("invalid duration '{s}' (examples: 30s, 500ms, 2m)"));
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" => value / 1e6,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(bad()),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a byte size: `65536`, `64KiB`, `64k`, `1MiB`, `1m`.
pub fn parse_size(s: &str) -> Result<usize, ParseError> {
    let bad = || ParseError(format!("invalid size '{s}' (examples: 65536, 64KiB, 1MiB)"));
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: usize = num.parse().map_err(|_| bad())?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        _ => return Err(bad()),
    };
    value.checked_mul(mult).ok_or_else(bad)
}

/// Formats a duration the way the flags take it (`30s`, `500ms`).
pub fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Formats a byte size the way the flags take it (`64KiB`).
pub fn fmt_size(n: usize) -> String {
    if n >= 1024 * 1024 && n % (1024 * 1024) == 0 {
        format!("{}MiB", n / (1024 * 1024))
    } else if n >= 1024 && n % 1024 == 0 {
        format!("{}KiB", n / 1024)
    } else {
        format!("{n}B")
    }
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

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3 weeks").is_err());
        assert_eq!(fmt_duration(Duration::from_secs(30)), "30s");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536").unwrap(), 65536);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1m").unwrap(), 1 << 20);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999999999g").is_err());
        assert_eq!(fmt_size(256 * 1024), "256KiB");
        assert_eq!(fmt_size(100), "100B");
    }
}
