//! Where the load goes and where it comes from: the subscriber target with
//! its port range (`ws://HOST:10000-10015/chan`, or `wss://` for TLS; MQTT
//! subscribers with `mqtt://HOST:PORT/<topic filter>` or `mqtts://`; Server-Sent
//! Events subscribers with `sse://HOST:PORT/chan` or `sses://`), the publish endpoint
//! (`http://…/publish/chan`, `redis[s]://[user:password@]HOST:PORT` or
//! `mqtt[s]://HOST:PORT/<topic>`), and the source
//! addresses connections are spread over (`127.0.0.2-127.0.0.60`, a comma
//! list, or both).
//!
//! Only literal IP addresses and `localhost` are accepted as hosts: a load
//! harness that resolves names per connection measures DNS, not the server.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::stamp::Stamp;
use thiserror::Error;
use throng_client::redis::{RedisUrl, RedisUrlError};
use throng_client::trust::Trust;
use throng_proto::mqtt::topic;

use super::mqtt::MqttOptions;

/// Why a URL or address list was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetError {
    /// Not `scheme://host:port/path` with the scheme expected.
    #[error("invalid URL '{url}': {why}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The TLS trust of a publish endpoint cannot be set up (a CA file that
    /// does not read), or was given for one without TLS.
    #[error("{0}")]
    Trust(String),
    /// A `-H` header that is not `Name: value`, or holds a line break.
    #[error("invalid header '{0}': expected 'Name: value' on one line")]
    Header(String),
    /// A source address list that does not parse.
    #[error("invalid source addresses '{list}': {why}")]
    Sources {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        why: String,
    },
}

fn url_err(url: &str, why: impl Into<String>) -> TargetError {
    TargetError::Url {
        url: url.to_owned(),
        why: why.into(),
    }
}

/// A subscriber target: one host, one or more consecutive ports, one path;
/// WebSocket, MQTT (whose path is the topic filter) or Server-Sent Events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsTarget {
    /// The server's address.
    pub ip: IpAddr,
    /// The host as written in the URL, sent in the `Host` header.
    pub host: String,
    /// First port of the range.
    pub port_first: u16,
    /// Last port of the range (inclusive, `>= port_first`).
    pub port_last: u16,
    /// Request target: `/chan` (with any query).
    pub path: String,
    /// `wss://`: TLS before the upgrade.
    #[serde(default)]
    pub tls: bool,
    /// `mqtt://`, `mqtts://`: MQTT subscribers, not WebSocket.
    #[serde(default)]
    pub mqtt: bool,
    /// `sse://`, `sses://`: Server-Sent Events subscribers (`GET /chan` with
    /// `Accept: text/event-stream`, over `https` for `sses://`), not WebSocket.
    #[serde(default)]
    pub sse: bool,
    /// Headers added to the WebSocket upgrade or the event stream's `GET`
    /// (`-H`: a cookie, a token), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    /// The subprotocol the upgrade asks for (`Sec-WebSocket-Protocol`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subprotocol: Option<String>,
    /// Where a message the harness did not publish says when it was sent
    /// (`--stamp`): such messages are timed, not only counted as foreign.
    #[serde(default)]
    pub stamp: Stamp,
}

/// Parses one `-H` header, `Name: value`; refuses a line break anywhere
/// (it would end the request head early).
pub fn parse_header(text: &str) -> Result<(String, String), TargetError> {
    let bad = || TargetError::Header(text.to_owned());
    if text.contains(['\r', '\n']) {
        return Err(bad());
    }
    let (name, value) = text.split_once(':').ok_or_else(bad)?;
    let name = name.trim();
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(bad());
    }
    Ok((name.to_owned(), value.trim().to_owned()))
}

impl WsTarget {
    /// The extra lines of a subscriber's request head: each `-H` header and
    /// the subprotocol, each ended by CRLF.
    pub fn extra_head(&self) -> String {
        let mut out = String::new();
        for (name, value) in &self.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(p) = self
            .subprotocol
            .as_ref()
            .filter(|_| !self.sse && !self.mqtt)
        {
            out.push_str(&format!("Sec-WebSocket-Protocol: {p}\r\n"));
        }
        out
    }

    /// Number of target ports.
    pub fn port_count(&self) -> u32 {
        u32::from(self.port_last - self.port_first) + 1
    }

    /// Port number `k` of the range (wraps around).
    pub fn port(&self, k: u32) -> u16 {
        // Invariant: the remainder is below port_count() <= 65536, and
        // port_first + it <= port_last, so it fits in a u16.
        let off = k % self.port_count();
        self.port_first + off as u16
    }

    /// The channel name: the path without its leading `/` and query; an
    /// MQTT target's topic filter (all of the path after its `/`).
    pub fn channel(&self) -> &str {
        let p = self.path.strip_prefix('/').unwrap_or(&self.path);
        if self.mqtt {
            return p;
        }
        p.split(['?', '#']).next().unwrap_or(p)
    }

    /// Whether the server is on this machine's loopback.
    pub fn is_loopback(&self) -> bool {
        self.ip.is_loopback()
    }

    /// The `Host` header value for port `port`.
    pub fn host_header(&self, port: u16) -> String {
        match self.ip {
            IpAddr::V6(_) if !self.host.starts_with('[') => format!("[{}]:{port}", self.host),
            _ => format!("{}:{port}", self.host),
        }
    }
}

impl fmt::Display for WsTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match self.ip {
            IpAddr::V6(_) if !self.host.starts_with('[') => format!("[{}]", self.host),
            _ => self.host.clone(),
        };
        let scheme = match (self.mqtt, self.sse, self.tls) {
            (true, _, false) => "mqtt",
            (true, _, true) => "mqtts",
            (false, true, false) => "sse",
            (false, true, true) => "sses",
            (false, false, false) => "ws",
            (false, false, true) => "wss",
        };
        if self.port_first == self.port_last {
            write!(f, "{scheme}://{host}:{}{}", self.port_first, self.path)
        } else {
            write!(
                f,
                "{scheme}://{host}:{}-{}{}",
                self.port_first, self.port_last, self.path
            )
        }
    }
}

impl FromStr for WsTarget {
    type Err = TargetError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        if url.starts_with("mqtt://") || url.starts_with("mqtts://") {
            let tls = url.starts_with("mqtts://");
            let (parts, topic) = mqtt_url(url, "<topic filter>")?;
            topic::check_filter(&topic)
                .map_err(|e| url_err(url, format!("'{topic}' is not an MQTT topic filter: {e}")))?;
            return Ok(Self {
                ip: parts.ip,
                host: parts.host,
                port_first: parts.ports.0,
                port_last: parts.ports.1,
                path: parts.path,
                tls,
                mqtt: true,
                sse: false,
                headers: Vec::new(),
                subprotocol: None,
                stamp: Stamp::Throng,
            });
        }
        let tls = url.starts_with("wss://") || url.starts_with("sses://");
        let sse = url.starts_with("sse://") || url.starts_with("sses://");
        // Every scheme is named, so a wrong one is told all it could be.
        let schemes = ["ws", "wss", "mqtt", "mqtts", "sse", "sses"];
        if url.starts_with("http://") || url.starts_with("https://") {
            return Err(url_err(
                url,
                "an http:// URL is where hold publishes (--publish); Server-Sent Events \
                 subscribers are sse://HOST:PORT/<channel> (sses:// for TLS), WebSocket ones \
                 ws:// or wss://, MQTT ones mqtt:// or mqtts://",
            ));
        }
        let parts = split_url(url, &schemes, if tls { 443 } else { 80 })?;
        let (first, last) = parts.ports;
        // The root path is a target too: servers that push to every client
        // (the time, each minute) serve it; it names no channel to publish to.
        Ok(Self {
            ip: parts.ip,
            host: parts.host,
            port_first: first,
            port_last: last,
            path: parts.path,
            tls,
            mqtt: false,
            sse,
            headers: Vec::new(),
            subprotocol: None,
            stamp: Stamp::Throng,
        })
    }
}

/// The parts of an `mqtt://` or `mqtts://` URL (ports 1883 and 8883 by
/// default) and its topic: the path after its `/`, taken as is (`+` and `#`
/// are MQTT's, not URL syntax).
fn mqtt_url(url: &str, what: &str) -> Result<(UrlParts, String), TargetError> {
    let tls = url.starts_with("mqtts://");
    let parts = split_url(url, &["mqtt", "mqtts"], if tls { 8883 } else { 1883 })?;
    let topic = parts
        .path
        .strip_prefix('/')
        .unwrap_or(&parts.path)
        .to_owned();
    if topic.is_empty() {
        return Err(url_err(
            url,
            format!("no topic in the path (expected mqtt://HOST:PORT/{what})"),
        ));
    }
    Ok((parts, topic))
}

/// Where `hold` publishes its timestamped messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishTarget {
    /// `POST` the message to this HTTP endpoint (`http://host:port/publish/chan`,
    /// or `https://` for TLS).
    Http {
        /// Server address.
        addr: SocketAddr,
        /// `Host` header value.
        host: String,
        /// Request target, e.g. `/publish/chan`.
        path: String,
        /// `https://`: the host name to check the certificate against (and
        /// send as SNI), and which certificates it may present (the system
        /// bundle unless set after parsing). `None` for `http://`.
        tls: Option<(String, Trust)>,
    },
    /// An MQTT PUBLISH to this topic (`mqtt://HOST:PORT/<topic>`, or
    /// `mqtts://` for TLS), over one MQTT connection.
    Mqtt {
        /// Broker address.
        addr: SocketAddr,
        /// The host as written, for the URL.
        host: String,
        /// The topic name (no wildcards).
        topic: String,
        /// `mqtts://`: as for [`Self::Http`]'s `tls`.
        tls: Option<(String, Trust)>,
        /// How to connect and at which QoS (set after parsing).
        options: MqttOptions,
    },
    /// `PUBLISH <channel> <message>` on this Redis server
    /// (`redis[s]://[user:password@]HOST:PORT[/DB]`).
    Redis {
        /// Redis address.
        addr: SocketAddr,
        /// The URL: TLS or not, the TLS server name, `AUTH` and `SELECT`.
        url: RedisUrl,
        /// `rediss://`: which certificates Redis may present (the system
        /// bundle unless set after parsing).
        trust: Trust,
    },
}

impl FromStr for PublishTarget {
    type Err = TargetError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        if url.starts_with("mqtt://") || url.starts_with("mqtts://") {
            let (p, topic) = mqtt_url(url, "<topic>")?;
            if p.ports.0 != p.ports.1 {
                return Err(url_err(url, "give one port for the publish endpoint"));
            }
            topic::check_name(&topic)
                .map_err(|e| url_err(url, format!("'{topic}' is not an MQTT topic name: {e}")))?;
            let tls = url.starts_with("mqtts://").then(|| {
                let name = p.host.trim_start_matches('[').trim_end_matches(']');
                (name.to_owned(), Trust::default())
            });
            let host = match p.ip {
                IpAddr::V6(_) if !p.host.starts_with('[') => format!("[{}]:{}", p.host, p.ports.0),
                _ => format!("{}:{}", p.host, p.ports.0),
            };
            return Ok(Self::Mqtt {
                addr: SocketAddr::new(p.ip, p.ports.0),
                host,
                topic,
                tls,
                options: MqttOptions::default(),
            });
        }
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            let r: RedisUrl = url.parse().map_err(|e: RedisUrlError| TargetError::Url {
                url: redact_userinfo(url),
                why: e.to_string(),
            })?;
            let ip = if r.host.eq_ignore_ascii_case("localhost") {
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            } else {
                r.host.parse::<IpAddr>().map_err(|_| {
                    url_err(
                        &redact_userinfo(url),
                        format!("host '{}' must be an IP address or localhost", r.host),
                    )
                })?
            };
            return Ok(Self::Redis {
                addr: SocketAddr::new(ip, r.port),
                url: r,
                trust: Trust::default(),
            });
        }
        let https = url.starts_with("https://");
        let p = if https {
            split_url(url, &["https"], 443)?
        } else {
            split_url(url, &["http"], 80)?
        };
        if p.ports.0 != p.ports.1 {
            return Err(url_err(url, "give one port for the publish endpoint"));
        }
        let host = match p.ip {
            IpAddr::V6(_) if !p.host.starts_with('[') => format!("[{}]:{}", p.host, p.ports.0),
            _ => format!("{}:{}", p.host, p.ports.0),
        };
        let tls = https.then(|| {
            let name = p.host.trim_start_matches('[').trim_end_matches(']');
            (name.to_owned(), Trust::default())
        });
        Ok(Self::Http {
            addr: SocketAddr::new(p.ip, p.ports.0),
            host,
            path: p.path,
            tls,
        })
    }
}

impl fmt::Display for PublishTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http {
                host, path, tls, ..
            } => {
                let scheme = if tls.is_some() { "https" } else { "http" };
                write!(f, "{scheme}://{host}{path}")
            }
            Self::Mqtt {
                host, topic, tls, ..
            } => {
                let scheme = if tls.is_some() { "mqtts" } else { "mqtt" };
                write!(f, "{scheme}://{host}/{topic}")
            }
            // The URL prints its password as ***.
            Self::Redis { url, .. } => write!(f, "{url}"),
        }
    }
}

impl PublishTarget {
    /// Sets which certificates an `https://` or `rediss://` endpoint may
    /// present (`ca`: a PEM file, else the system bundle; `insecure`: any),
    /// and checks now that they can be read, so a bad CA file is one error
    /// at start, not one per publish. Returns the warning to show for
    /// `insecure`.
    pub fn set_trust(
        &mut self,
        ca: Option<PathBuf>,
        insecure: bool,
    ) -> Result<Option<String>, TargetError> {
        let fix = "(give --publish-tls-ca FILE, or --publish-tls-insecure for a trial)";
        let (checked, name) = match self {
            Self::Redis { url, trust, .. } if url.tls => {
                *trust = Trust { ca, insecure };
                let checked = trust.client_config(url).map(|_| ());
                (checked, format!("Redis at {url}"))
            }
            Self::Http {
                tls: Some((host, trust)),
                ..
            }
            | Self::Mqtt {
                tls: Some((host, trust)),
                ..
            } => {
                *trust = Trust { ca, insecure };
                (
                    trust.tls_config().map(|_| ()),
                    format!("the publish endpoint {host}"),
                )
            }
            _ if ca.is_some() || insecure => {
                return Err(TargetError::Trust(
                    "--publish-tls-ca and --publish-tls-insecure are for --publish https://..., \
                     rediss://... or mqtts://..."
                        .to_owned(),
                ));
            }
            _ => return Ok(None),
        };
        checked
            .map_err(|e| TargetError::Trust(format!("cannot set up TLS to {name} {fix}: {e}")))?;
        Ok(insecure.then(|| {
            format!(
                "--publish-tls-insecure: the certificate of {name} is NOT checked. For trials only."
            )
        }))
    }
}

/// `url` with anything between `//` and `@` hidden (a Redis password).
fn redact_userinfo(url: &str) -> String {
    match (url.find("//"), url.rfind('@')) {
        (Some(s), Some(a)) if a > s => format!("{}***{}", &url[..s + 2], &url[a..]),
        _ => url.to_owned(),
    }
}

struct UrlParts {
    ip: IpAddr,
    host: String,
    ports: (u16, u16),
    path: String,
}

fn split_url(url: &str, schemes: &[&str], default_port: u16) -> Result<UrlParts, TargetError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(url_err(
            url,
            format!("expected {}://HOST:PORT/...", schemes[0]),
        ));
    };
    if !schemes.contains(&scheme) {
        let why = if scheme == "https" || scheme == "rediss" {
            format!(
                "{scheme}:// (TLS) is not supported here yet; use {}://",
                schemes[0]
            )
        } else {
            format!("scheme must be {}://", schemes.join("://, "))
        };
        return Err(url_err(url, why));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err(url_err(url, "user info in the URL is not supported"));
    }
    let (host, port_text) = if let Some(inner) = authority.strip_prefix('[') {
        let Some((h, after)) = inner.split_once(']') else {
            return Err(url_err(url, "unclosed '[' in IPv6 address"));
        };
        match after.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if after.is_empty() => (h, None),
            None => return Err(url_err(url, "junk after ']'")),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(url_err(url, "no host"));
    }
    let ip = if host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.parse::<IpAddr>().map_err(|_| {
            url_err(
                url,
                format!("host '{host}' must be an IP address or localhost"),
            )
        })?
    };
    let ports = match port_text {
        None => (default_port, default_port),
        Some(p) => parse_port_range(p)
            .ok_or_else(|| url_err(url, format!("invalid port or port range '{p}'")))?,
    };
    Ok(UrlParts {
        ip,
        host: host.to_owned(),
        ports,
        path: path.to_owned(),
    })
}

/// `10000` or `10000-10015` (inclusive, first <= last, no port 0).
fn parse_port_range(s: &str) -> Option<(u16, u16)> {
    let (a, b) = match s.split_once('-') {
        Some((a, b)) => (a.parse::<u16>().ok()?, b.parse::<u16>().ok()?),
        None => {
            let p = s.parse::<u16>().ok()?;
            (p, p)
        }
    };
    (a > 0 && a <= b).then_some((a, b))
}

/// The most source addresses one list may name: a typo such as
/// `127.0.0.1-127.255.0.0` should be an error, not sixteen million binds.
pub const MAX_SOURCES: usize = 65_536;

/// Parses `--source-ips`: comma-separated addresses and inclusive ranges
/// (`127.0.0.2-127.0.0.60`, `::1`, `10.0.0.5,10.0.0.7-10.0.0.9`). Duplicates
/// are dropped; order is kept.
pub fn parse_sources(list: &str) -> Result<Vec<IpAddr>, TargetError> {
    let err = |why: String| TargetError::Sources {
        list: list.to_owned(),
        why,
    };
    let mut out: Vec<IpAddr> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match item.split_once('-') {
            None => {
                let ip: IpAddr = item
                    .parse()
                    .map_err(|_| err(format!("'{item}' is not an IP address")))?;
                out.push(ip);
            }
            Some((a, b)) => {
                let a: IpAddr = a
                    .trim()
                    .parse()
                    .map_err(|_| err(format!("'{a}' is not an IP address")))?;
                let b: IpAddr = b
                    .trim()
                    .parse()
                    .map_err(|_| err(format!("'{b}' is not an IP address")))?;
                let (lo, hi) = match (a, b) {
                    (IpAddr::V4(a), IpAddr::V4(b)) => {
                        (u128::from(u32::from(a)), u128::from(u32::from(b)))
                    }
                    (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b)),
                    _ => return Err(err(format!("range '{item}' mixes IPv4 and IPv6"))),
                };
                if lo > hi {
                    return Err(err(format!("range '{item}' runs backwards")));
                }
                if hi - lo >= MAX_SOURCES as u128 {
                    return Err(err(format!(
                        "range '{item}' has more than {MAX_SOURCES} addresses"
                    )));
                }
                for v in lo..=hi {
                    out.push(match a {
                        // Invariant: both ends are IPv4 here, so v fits in a u32.
                        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(v as u32)),
                        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(v)),
                    });
                }
            }
        }
        if out.len() > MAX_SOURCES {
            return Err(err(format!("more than {MAX_SOURCES} addresses")));
        }
    }
    if out.is_empty() {
        return Err(err("no addresses".into()));
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|ip| seen.insert(*ip));
    Ok(out)
}

/// `count` loopback source addresses starting at 127.0.0.2 (every address
/// of 127.0.0.0/8 is local on Linux, no setup needed).
pub fn loopback_sources(count: usize) -> Vec<IpAddr> {
    let base = u32::from(Ipv4Addr::new(127, 0, 0, 2));
    (0..count.min(MAX_SOURCES) as u32)
        .map(|k| IpAddr::V4(Ipv4Addr::from(base + k)))
        .collect()
}

/// Renders a source list compactly: runs of consecutive IPv4 addresses as ranges.
pub fn format_sources(ips: &[IpAddr]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ips.len() {
        let mut j = i;
        if let IpAddr::V4(start) = ips[i] {
            while j + 1 < ips.len() {
                match ips[j + 1] {
                    IpAddr::V4(n) if u32::from(n) == u32::from(start) + (j + 1 - i) as u32 => {
                        j += 1
                    }
                    _ => break,
                }
            }
        }
        if j > i {
            parts.push(format!("{}-{}", ips[i], ips[j]));
        } else {
            parts.push(ips[i].to_string());
        }
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ws_target_with_port_range() {
        let t: WsTarget = "ws://127.0.0.1:10000-10015/chan".parse().unwrap();
        assert_eq!(t.port_count(), 16);
        assert_eq!(t.port(0), 10000);
        assert_eq!(t.port(15), 10015);
        assert_eq!(t.port(16), 10000);
        assert_eq!(t.channel(), "chan");
        assert_eq!(t.host_header(10003), "127.0.0.1:10003");
        assert_eq!(t.to_string(), "ws://127.0.0.1:10000-10015/chan");
        let t: WsTarget = "ws://[::1]:9000/a?x=1".parse().unwrap();
        assert_eq!(t.ip, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(t.channel(), "a");
        assert_eq!(t.host_header(9000), "[::1]:9000");
        let t: WsTarget = "ws://localhost/c".parse().unwrap();
        assert_eq!((t.port_first, t.is_loopback(), t.tls), (80, true, false));
        let t: WsTarget = "wss://localhost/c".parse().unwrap();
        assert_eq!((t.port_first, t.tls), (443, true));
        assert_eq!(t.to_string(), "wss://localhost:443/c");
    }

    #[test]
    fn sse_targets_are_http_urls_by_another_scheme() {
        let t: WsTarget = "sse://127.0.0.1:9000-9001/news?token=x".parse().unwrap();
        assert!(t.sse && !t.tls && !t.mqtt);
        assert_eq!((t.port_count(), t.channel()), (2, "news"));
        assert_eq!(t.to_string(), "sse://127.0.0.1:9000-9001/news?token=x");
        let t: WsTarget = "sses://localhost/news".parse().unwrap();
        assert!(t.sse && t.tls);
        assert_eq!(t.to_string(), "sses://localhost:443/news");
        // The root path: a server that pushes to every client.
        let t: WsTarget = "sse://127.0.0.1:9000/".parse().unwrap();
        assert_eq!((t.path.as_str(), t.channel()), ("/", ""));
    }

    #[test]
    fn a_wrong_scheme_is_told_every_subscriber_scheme() {
        for url in ["http://127.0.0.1:9000/news", "tcp://127.0.0.1:9000/news"] {
            let e = url.parse::<WsTarget>().unwrap_err().to_string();
            for scheme in [
                "ws://", "wss://", "mqtt://", "mqtts://", "sse://", "sses://",
            ] {
                assert!(e.contains(scheme), "{url}: {e}");
            }
        }
    }

    #[test]
    fn mqtt_targets_take_the_path_as_a_topic_filter() {
        let t: WsTarget = "mqtt://127.0.0.1/sensors/+/temp".parse().unwrap();
        assert!(t.mqtt && !t.tls);
        assert_eq!(t.port_first, 1883);
        assert_eq!(t.channel(), "sensors/+/temp");
        assert_eq!(t.to_string(), "mqtt://127.0.0.1:1883/sensors/+/temp");
        let t: WsTarget = "mqtts://localhost:9000-9001/a/#".parse().unwrap();
        assert!(t.mqtt && t.tls);
        assert_eq!(
            (t.port_count(), t.channel()),
            (2, "a/#"),
            "'#' is MQTT's, not a fragment"
        );
        let t: WsTarget = "mqtts://localhost/x?y".parse().unwrap();
        assert_eq!((t.port_first, t.channel()), (8883, "x?y"));
        for bad in [
            "mqtt://127.0.0.1:1",
            "mqtt://127.0.0.1:1/",
            "mqtt://127.0.0.1/a#",
            "mqtt://h/a",
        ] {
            assert!(bad.parse::<WsTarget>().is_err(), "{bad} was accepted");
        }
        let p: PublishTarget = "mqtt://127.0.0.1:1884/a/b".parse().unwrap();
        assert!(matches!(&p, PublishTarget::Mqtt { topic, tls: None, .. } if topic == "a/b"));
        assert_eq!(p.to_string(), "mqtt://127.0.0.1:1884/a/b");
        let p: PublishTarget = "mqtts://[::1]/a".parse().unwrap();
        assert_eq!(p.to_string(), "mqtts://[::1]:8883/a");
        for bad in [
            "mqtt://127.0.0.1/a/+",
            "mqtt://127.0.0.1/#",
            "mqtt://127.0.0.1:1-2/a",
        ] {
            assert!(bad.parse::<PublishTarget>().is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn the_root_path_and_extra_head_lines() {
        for root in ["ws://127.0.0.1:1", "ws://127.0.0.1:1/", "wss://127.0.0.1:1"] {
            let t: WsTarget = root.parse().unwrap();
            assert_eq!(t.path, "/", "{root}");
        }
        let mut t: WsTarget = "ws://127.0.0.1:1/".parse().unwrap();
        t.headers = vec![parse_header("Cookie: s=1; t=2").unwrap()];
        t.subprotocol = Some("chat".into());
        assert_eq!(
            t.extra_head(),
            "Cookie: s=1; t=2\r\nSec-WebSocket-Protocol: chat\r\n"
        );
        for bad in ["NoColon", ": v", "Bad Name: v", "X: a\r\nY: b"] {
            assert!(parse_header(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ws_target_errors() {
        for bad in [
            "http://127.0.0.1:1/c",
            "ws://example.com:1/c",
            "ws://127.0.0.1:0/c",
            "ws://127.0.0.1:20-10/c",
            "ws://127.0.0.1:99999/c",
            "ws://[::1/c",
            "ws://:80/c",
            "127.0.0.1:80/c",
        ] {
            assert!(bad.parse::<WsTarget>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn publish_targets() {
        let p: PublishTarget = "http://127.0.0.1:8080/publish/chan".parse().unwrap();
        assert_eq!(
            p,
            PublishTarget::Http {
                addr: "127.0.0.1:8080".parse().unwrap(),
                host: "127.0.0.1:8080".into(),
                path: "/publish/chan".into(),
                tls: None,
            }
        );
        let p: PublishTarget = "https://localhost/publish/chan".parse().unwrap();
        assert!(matches!(
            &p,
            PublishTarget::Http { addr, tls: Some((name, _)), .. }
                if *addr == "127.0.0.1:443".parse().unwrap() && name == "localhost"
        ));
        assert_eq!(p.to_string(), "https://localhost:443/publish/chan");
        let r: PublishTarget = "redis://127.0.0.1".parse().unwrap();
        assert!(matches!(
            &r,
            PublishTarget::Redis { addr, url, .. }
                if *addr == "127.0.0.1:6379".parse().unwrap() && !url.tls
        ));
        let r: PublishTarget = "rediss://bob:p%40ss@localhost:6380/2".parse().unwrap();
        let PublishTarget::Redis { addr, url, .. } = &r else {
            panic!("{r:?}")
        };
        assert_eq!(*addr, "127.0.0.1:6380".parse().unwrap());
        assert!(url.tls);
        assert_eq!(url.password.as_deref(), Some("p@ss"));
        assert_eq!(r.to_string(), "rediss://bob:***@localhost:6380/2");
        let e = "rediss://bob:topsecret@redis.example".parse::<PublishTarget>();
        assert!(!format!("{e:?}").contains("topsecret"), "{e:?}");
        assert!("ftp://1.2.3.4/x".parse::<PublishTarget>().is_err());
        assert!("http://127.0.0.1:1-2/x".parse::<PublishTarget>().is_err());
    }

    #[test]
    fn source_ranges_and_lists() {
        let v = parse_sources("127.0.0.2-127.0.0.5").unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v[3], "127.0.0.5".parse::<IpAddr>().unwrap());
        let v = parse_sources("10.0.0.1, 10.0.0.3-10.0.0.4,10.0.0.1").unwrap();
        assert_eq!(format_sources(&v), "10.0.0.1,10.0.0.3-10.0.0.4");
        let v = parse_sources("127.0.0.254-127.0.1.1").unwrap();
        assert_eq!(format_sources(&v), "127.0.0.254-127.0.1.1");
        assert_eq!(parse_sources("::1").unwrap().len(), 1);
        assert_eq!(parse_sources("fe80::1-fe80::3").unwrap().len(), 3);
        for bad in [
            "",
            "127.0.0.5-127.0.0.2",
            "x",
            "127.0.0.1-::1",
            "10.0.0.0-10.255.255.255",
            "1.2.3",
        ] {
            assert!(parse_sources(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn loopback_sources_start_at_2() {
        let v = loopback_sources(3);
        assert_eq!(format_sources(&v), "127.0.0.2-127.0.0.4");
    }
}
