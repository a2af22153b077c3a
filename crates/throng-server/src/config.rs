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
    /// Start by taking the ports of the running serve that holds them
    /// (`--takeover`), which then closes its connections spread over
    /// `drain_spread`.
    pub takeover: bool,
    /// When this server is taken over: its subscribers are closed (1012)
    /// spread evenly over this long, so they reconnect gradually.
    pub drain_spread: Duration,
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
    /// Addresses that speak MQTT 3.1.1 and 5.0 (`--mqtt-listen`), one
    /// listener per address in every worker: topics are channels.
    #[serde(default)]
    pub mqtt_listen: Vec<SocketAddr>,
    /// Addresses that speak MQTT over TLS (`--mqtts-listen`), on the
    /// certificate of `tls`.
    #[serde(default)]
    pub mqtts_listen: Vec<SocketAddr>,
    /// Certificate, key and ticket key for `tls_listen` (required when it is not empty).
    #[serde(default)]
    pub tls: Option<crate::tls::Material>,
    /// Who may subscribe and publish: token keys and claims, the publish
    /// key (`--auth-*`, `--publish-key-file`). Empty: anyone may.
    #[serde(default)]
    pub auth: crate::auth::Settings,
    /// Origins a browser's upgrade may come from (`--allowed-origins`);
    /// `None`: any. An upgrade without `Origin` (not a browser) is not checked.
    #[serde(default)]
    pub allowed_origins: Option<Vec<String>>,
    /// Addresses that serve publishing (`--publish-listen`); when set, the
    /// `listen` and `tls_listen` ones refuse it.
    #[serde(default)]
    pub publish_listen: Vec<SocketAddr>,
    /// Addresses that serve `/metrics` (`--metrics-listen`); when set, the
    /// others refuse it.
    #[serde(default)]
    pub metrics_listen: Vec<SocketAddr>,
    /// Limits per client address (`--max-connections-per-ip`, `--handshakes-per-ip`).
    #[serde(default)]
    pub per_address: PerAddress,
    /// The descriptor of the subscriber counts every worker shares (made by
    /// the supervisor with `max_connections`, inherited by the workers).
    #[serde(default)]
    pub shared_counters: Option<i32>,
    /// Messages kept per channel for reconnecting subscribers (`--history`);
    /// 0: none (messages still get ids).
    #[serde(default)]
    pub history: usize,
    /// How long a kept message stays (`--history-ttl`); `None`: until pushed out.
    #[serde(default)]
    pub history_ttl: Option<Duration>,
    /// Bytes the whole history may hold, oldest dropped first (`--history-max-memory`).
    #[serde(default = "default_history_memory")]
    pub history_max_memory: usize,
    /// Channels that may hold a retained message (`--max-retained`).
    #[serde(default = "default_max_retained")]
    pub max_retained: usize,
    /// Bytes the retained messages may take (`--max-retained-memory`).
    #[serde(default = "default_retained_memory")]
    pub max_retained_memory: usize,
    /// Connections to the public listeners start with a PROXY protocol
    /// header (v1 or v2) from a trusted proxy (`--proxy-protocol`).
    #[serde(default)]
    pub proxy_protocol: bool,
    /// Whose PROXY headers and `X-Forwarded-For` are believed (`--trusted-proxies`).
    #[serde(default)]
    pub trusted_proxies: Vec<crate::proxied::Cidr>,
    /// Subscribers one worker may hold: the files its limit leaves after
    /// its listeners and the reserve (set by the supervisor's plan). Past
    /// it an upgrade gets 503, before an accept could fail with `EMFILE`.
    #[serde(default)]
    pub worker_files: Option<u64>,
    /// Serve `/ping`, the test back end, on addresses that are not
    /// loopback too (`--test-backend`); without it only loopback ones do.
    #[serde(default)]
    pub test_backend: bool,
    /// Subscriptions one MQTT connection may hold (`--max-subscriptions`).
    #[serde(default = "default_max_subscriptions")]
    pub max_subscriptions: usize,
    /// Channels one WebSocket `throng.v1` or SSE connection opened at `/`
    /// may be in (`--max-channels-per-connection`).
    #[serde(default = "default_max_channels")]
    pub max_channels_per_connection: usize,
    /// Channels whose presence `GET /api/channels/<c>` lists (`--presence`
    /// patterns, as a token's grants).
    #[serde(default)]
    pub presence: Vec<String>,
    /// Offer permessage-deflate to WebSocket subscribers (`--ws-deflate`).
    #[serde(default)]
    pub ws_deflate: bool,
    /// The smallest payload sent compressed (`--ws-deflate-min`).
    #[serde(default = "default_ws_deflate_min")]
    pub ws_deflate_min: usize,
    /// Bytes of topic filters one MQTT connection may hold (`--max-filter-bytes`).
    #[serde(default = "default_max_filter_bytes")]
    pub max_filter_bytes: usize,
    /// Messages an MQTT persistent session keeps while its client is away
    /// (`--mqtt-session-queue`).
    #[serde(default = "default_session_queue")]
    pub mqtt_session_queue: usize,
    /// Keep MQTT sessions away in Redis (`--mqtt-sessions-in-redis`).
    #[serde(default)]
    pub mqtt_sessions_in_redis: bool,
    /// Bytes the messages of every kept session may take
    /// (`--mqtt-sessions-memory`).
    #[serde(default = "default_sessions_memory")]
    pub mqtt_sessions_memory: usize,
    /// The longest an MQTT session is kept, in seconds
    /// (`--mqtt-session-expiry`).
    #[serde(default = "default_session_expiry")]
    pub mqtt_session_expiry: u32,
    /// The longest keep-alive a 5.0 client gets, in seconds
    /// (`--mqtt-max-keep-alive`): one asking for more, or for none, is
    /// told this one in CONNACK (Server Keep Alive). `None`: what it asks.
    #[serde(default)]
    pub mqtt_max_keep_alive: Option<u16>,
}

/// `--mqtt-session-queue`'s default (Mosquitto's max_queued_messages).
pub const DEFAULT_SESSION_QUEUE: usize = 1000;

/// `--mqtt-sessions-memory`'s default.
pub const DEFAULT_SESSIONS_MEMORY: usize = 64 * 1024 * 1024;

/// `--mqtt-session-expiry`'s default: two hours.
pub const DEFAULT_SESSION_EXPIRY: u32 = 7200;

fn default_session_queue() -> usize {
    DEFAULT_SESSION_QUEUE
}

fn default_sessions_memory() -> usize {
    DEFAULT_SESSIONS_MEMORY
}

fn default_session_expiry() -> u32 {
    DEFAULT_SESSION_EXPIRY
}

/// `--max-subscriptions`' default.
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 100;

/// `--max-filter-bytes`' default: 100 filters of 160 bytes.
pub const DEFAULT_MAX_FILTER_BYTES: usize = 16 * 1024;

fn default_max_subscriptions() -> usize {
    DEFAULT_MAX_SUBSCRIPTIONS
}

/// `--max-channels-per-connection`' default.
pub const DEFAULT_MAX_CHANNELS: usize = 100;

fn default_max_channels() -> usize {
    DEFAULT_MAX_CHANNELS
}

/// Payloads shorter than this go uncompressed with `--ws-deflate`: a
/// deflate stream's own overhead eats what so few bytes could save.
pub const DEFAULT_WS_DEFLATE_MIN: usize = 256;

fn default_ws_deflate_min() -> usize {
    DEFAULT_WS_DEFLATE_MIN
}

fn default_max_filter_bytes() -> usize {
    DEFAULT_MAX_FILTER_BYTES
}

fn default_max_retained() -> usize {
    crate::retained::DEFAULT_MAX_TOPICS
}

fn default_retained_memory() -> usize {
    crate::retained::DEFAULT_MAX_BYTES
}

/// The default `--history-max-memory`.
pub const DEFAULT_HISTORY_MEMORY: usize = 64 * 1024 * 1024;

fn default_history_memory() -> usize {
    DEFAULT_HISTORY_MEMORY
}

/// Limits per client address: an IPv4 address, or an IPv6 /64 (one
/// subscriber's network: a host is usually given a whole /64). Counted by
/// the supervisor over all workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PerAddress {
    /// Open connections (subscribers and HTTP requests) one address may hold.
    pub max_connections: Option<u32>,
    /// New connections per second one address may open (a token bucket).
    pub handshakes_per_sec: Option<f64>,
    /// How many new connections the bucket holds: a burst after a quiet spell.
    pub handshake_burst: u32,
}

impl PerAddress {
    /// Whether any limit is set (each new connection is then checked).
    pub fn any(&self) -> bool {
        self.max_connections.is_some() || self.handshakes_per_sec.is_some()
    }
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
            takeover: false,
            drain_spread: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            bench_floor: false,
            request_timeout: Duration::from_secs(3600),
            max_sleep: Duration::from_secs(3600),
            max_times: 1000,
            redis_mode: None,
            tls_listen: Vec::new(),
            mqtt_listen: Vec::new(),
            mqtts_listen: Vec::new(),
            tls: None,
            auth: crate::auth::Settings::default(),
            allowed_origins: None,
            publish_listen: Vec::new(),
            metrics_listen: Vec::new(),
            per_address: PerAddress::default(),
            shared_counters: None,
            history: 0,
            history_ttl: None,
            history_max_memory: DEFAULT_HISTORY_MEMORY,
            max_retained: crate::retained::DEFAULT_MAX_TOPICS,
            max_retained_memory: crate::retained::DEFAULT_MAX_BYTES,
            proxy_protocol: false,
            trusted_proxies: Vec::new(),
            worker_files: None,
            test_backend: false,
            max_subscriptions: DEFAULT_MAX_SUBSCRIPTIONS,
            max_channels_per_connection: DEFAULT_MAX_CHANNELS,
            presence: Vec::new(),
            ws_deflate: false,
            ws_deflate_min: DEFAULT_WS_DEFLATE_MIN,
            max_filter_bytes: DEFAULT_MAX_FILTER_BYTES,
            mqtt_session_queue: DEFAULT_SESSION_QUEUE,
            mqtt_sessions_in_redis: false,
            mqtt_sessions_memory: DEFAULT_SESSIONS_MEMORY,
            mqtt_session_expiry: DEFAULT_SESSION_EXPIRY,
            mqtt_max_keep_alive: None,
        }
    }
}

/// A flag value that could not be parsed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct ParseError(String);

/// A `--presence` pattern, checked as a token's grant is.
pub fn parse_presence(s: &str) -> Result<String, String> {
    crate::auth::Pattern::parse(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

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

impl Config {
    /// The start lines of the channel limits, `--presence` and `--ws-deflate`.
    fn fmt_channels(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  max-channels     {} per connection",
            self.max_channels_per_connection
        )?;
        if !self.presence.is_empty() {
            writeln!(f, "  presence         {}", self.presence.join(" "))?;
        }
        if self.ws_deflate {
            writeln!(
                f,
                "  ws-deflate       on: payloads of {} B and more, compressed once per fan-out",
                self.ws_deflate_min
            )?;
        } else {
            writeln!(f, "  ws-deflate       off")?;
        }
        Ok(())
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listen: Vec<String> = self.listen.iter().map(ToString::to_string).collect();
        writeln!(f, "  listen           {}", listen.join(" "))?;
        if !self.mqtt_listen.is_empty() {
            let mqtt: Vec<String> = self.mqtt_listen.iter().map(ToString::to_string).collect();
            writeln!(
                f,
                "  mqtt-listen      {} (MQTT 3.1.1 and 5.0; clean sessions, QoS 0 deliveries)",
                mqtt.join(" ")
            )?;
        }
        if !self.mqtts_listen.is_empty() {
            let mqtts: Vec<String> = self.mqtts_listen.iter().map(ToString::to_string).collect();
            writeln!(f, "  mqtts-listen     {} (MQTT over TLS)", mqtts.join(" "))?;
        }
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
        self.fmt_access(f)?;
        match self.max_connections {
            Some(n) => writeln!(
                f,
                "  max-connections  {n} subscribers in all (past it: 503, Retry-After)"
            )?,
            None => writeln!(f, "  max-connections  (none)")?,
        }
        writeln!(f, "  max-message      {}", fmt_size(self.max_message))?;
        self.fmt_channels(f)?;
        if self.history == 0 {
            writeln!(
                f,
                "  history          (none): ids on every message, nothing kept to recover (--history N)"
            )?;
        } else if self.redis_mode.is_some() {
            writeln!(
                f,
                "  history          last ~{} per channel, for {}, in a Redis Stream per channel (shared by every node)",
                self.history,
                self.history_ttl
                    .map_or_else(|| "ever".to_owned(), fmt_duration),
            )?;
        } else {
            writeln!(
                f,
                "  history          last {} per channel, for {}, at most {} in all (oldest dropped first)",
                self.history,
                self.history_ttl
                    .map_or_else(|| "ever".to_owned(), fmt_duration),
                fmt_size(self.history_max_memory)
            )?;
        }
        if self.redis_mode.is_some() {
            writeln!(
                f,
                "  retained         last retained message per channel in Redis (one hash under the prefix), \
                 at most {} channels (the longest-set dropped first)",
                self.max_retained
            )?;
        } else {
            writeln!(
                f,
                "  retained         last retained message per channel, at most {} channels and {} in all \
                 (the longest-set dropped first)",
                self.max_retained,
                fmt_size(self.max_retained_memory)
            )?;
        }
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

impl Config {
    /// The start lines of who may do what: tokens, publishing, metrics,
    /// origins and per-address limits.
    fn fmt_access(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.auth;
        if a.tokens() {
            let keys: Vec<String> = a.all_keys().map(crate::auth::Key::describe).collect();
            let mut rules = vec![if a.allow_no_exp {
                "exp optional (--auth-allow-no-exp)".to_owned()
            } else {
                "exp required".to_owned()
            }];
            rules.extend(a.issuer.as_ref().map(|i| format!("issuer {i:?}")));
            rules.push(match &a.audience {
                Some(aud) => format!("audience {aud:?}"),
                None => "no aud accepted (--auth-audience)".to_owned(),
            });
            writeln!(
                f,
                "  auth             tokens by {}; {}; subscribers closed 4001 at exp",
                keys.join(", "),
                rules.join(", ")
            )?;
        } else {
            writeln!(
                f,
                "  auth             (none): anyone may subscribe to any channel (docs/auth.md)"
            )?;
        }
        let who = match (a.tokens(), &a.publish_key) {
            (true, Some(k)) => format!("a token with a publish grant, or the key in {}", k.source),
            (true, None) => "a token with a publish grant".to_owned(),
            (false, Some(k)) => format!("the key in {}", k.source),
            (false, None) => "anyone".to_owned(),
        };
        let list = |addrs: &[SocketAddr]| {
            addrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        };
        let publish_at = if self.publish_listen.is_empty() {
            "the public addresses".to_owned()
        } else {
            format!("{} only", list(&self.publish_listen))
        };
        writeln!(f, "  publish          {who}, on {publish_at}")?;
        if self.metrics_listen.is_empty() {
            writeln!(f, "  metrics          on the public addresses")?;
        } else {
            writeln!(
                f,
                "  metrics          on {} only",
                list(&self.metrics_listen)
            )?;
        }
        match &self.allowed_origins {
            Some(o) => writeln!(f, "  allowed-origins  {}", o.join(" "))?,
            None => writeln!(
                f,
                "  allowed-origins  any (pages of any site may subscribe; --allowed-origins)"
            )?,
        }
        let p = &self.per_address;
        if p.any() {
            let mut limits = Vec::new();
            limits.extend(p.max_connections.map(|n| format!("{n} connections")));
            limits.extend(p.handshakes_per_sec.map(|r| {
                format!(
                    "{} new per second, burst {}",
                    fmt_rate(r),
                    p.handshake_burst
                )
            }));
            writeln!(
                f,
                "  per-address      {} per IPv4 address or IPv6 /64 (past it: 429)",
                limits.join(", ")
            )?;
        } else {
            writeln!(f, "  per-address      (none)")?;
        }
        if !self.trusted_proxies.is_empty() {
            let blocks: Vec<String> = self
                .trusted_proxies
                .iter()
                .map(ToString::to_string)
                .collect();
            let how = if self.proxy_protocol {
                "PROXY protocol v1/v2 required on the public addresses"
            } else {
                "X-Forwarded-For believed for subscriptions"
            };
            writeln!(f, "  trusted-proxies  {} ({how})", blocks.join(" "))?;
        }
        Ok(())
    }

    /// The warning to print when a listener is not loopback and nothing
    /// guards it: what anyone who reaches it can do, and how to stop it.
    /// Every listener counts (`--listen`, `--tls-listen`, `--mqtt-listen`,
    /// `--mqtts-listen`, `--publish-listen`, `--metrics-listen`). `None`
    /// when every listener is loopback, or when a token key or the publish
    /// key is set.
    pub fn exposure_warning(&self) -> Option<String> {
        if self.auth.tokens() || self.auth.publish_key.is_some() {
            return None;
        }
        let outside = |addrs: &[&SocketAddr]| -> Vec<String> {
            addrs
                .iter()
                .filter(|a| !a.ip().is_loopback())
                .map(ToString::to_string)
                .collect()
        };
        let subscribers: Vec<&SocketAddr> = self
            .listen
            .iter()
            .chain(&self.tls_listen)
            .chain(&self.mqtt_listen)
            .chain(&self.mqtts_listen)
            .collect();
        let publishers: Vec<&SocketAddr> = if self.publish_listen.is_empty() {
            subscribers.clone()
        } else {
            self.publish_listen.iter().collect()
        };
        let metrics: Vec<&SocketAddr> = if self.metrics_listen.is_empty() {
            self.listen.iter().chain(&self.tls_listen).collect()
        } else {
            self.metrics_listen.iter().collect()
        };
        let (sub, publish, met) = (
            outside(&subscribers),
            outside(&publishers),
            outside(&metrics),
        );
        let mut open = Vec::new();
        if !sub.is_empty() {
            open.push(
                "anyone who reaches it can subscribe to any channel \
                 (--auth-hs256-secret-file, --auth-public-key or --auth-jwks-url require a token)"
                    .to_owned(),
            );
        }
        if !publish.is_empty() {
            let moved = if self.publish_listen.is_empty() {
                "; --publish-listen 127.0.0.1:PORT moves publishing off the public address"
            } else {
                ""
            };
            open.push(format!(
                "anyone can publish to every subscriber (--publish-key-file requires a key{moved})"
            ));
        }
        if !met.is_empty() && !open.is_empty() {
            open.push(
                "/metrics is open to all (--metrics-listen 127.0.0.1:PORT moves it)".to_owned(),
            );
        }
        if open.is_empty() {
            return None;
        }
        let mut exposed = sub;
        for a in publish.into_iter().chain(met) {
            if !exposed.contains(&a) {
                exposed.push(a);
            }
        }
        let mut text = format!(
            "throng: WARNING: {} is not loopback and no authentication is configured:",
            exposed.join(" ")
        );
        for o in open {
            text.push_str("\nthrong: WARNING:   ");
            text.push_str(&o);
        }
        text.push_str("\nthrong: WARNING: see docs/auth.md");
        Some(text)
    }
}

/// A rate as given (`5/s`), whole numbers without a fraction.
fn fmt_rate(per_sec: f64) -> String {
    if per_sec.fract() == 0.0 {
        format!("{per_sec:.0}")
    } else {
        format!("{per_sec}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_address_without_auth_warns_naming_what_is_open() {
        let mut c = Config::default();
        assert_eq!(c.exposure_warning(), None, "loopback");
        c.listen = vec!["0.0.0.0:8080".parse().unwrap()];
        let w = c.exposure_warning().unwrap();
        for open in [
            "subscribe to any channel",
            "publish to every subscriber",
            "/metrics",
        ] {
            assert!(w.contains(open), "{w}");
        }
        c.publish_listen = vec!["127.0.0.1:8081".parse().unwrap()];
        c.metrics_listen = vec!["127.0.0.1:9090".parse().unwrap()];
        let w = c.exposure_warning().unwrap();
        assert!(!w.contains("publish to") && !w.contains("/metrics"), "{w}");
        // An MQTT or an internal publishing listener outside is no safer.
        let m = Config {
            mqtt_listen: vec!["0.0.0.0:1883".parse().unwrap()],
            ..Config::default()
        };
        let w = m.exposure_warning().unwrap();
        assert!(
            w.contains("0.0.0.0:1883") && w.contains("subscribe to any channel"),
            "{w}"
        );
        let p = Config {
            publish_listen: vec!["10.0.0.5:8081".parse().unwrap()],
            ..Config::default()
        };
        let w = p.exposure_warning().unwrap();
        assert!(
            w.contains("10.0.0.5:8081") && w.contains("publish to every subscriber"),
            "{w}"
        );
        assert!(!w.contains("subscribe to any channel"), "{w}");
        c.allowed_origins = Some(vec!["https://a.example".into()]);
        let shown = c.to_string();
        assert!(
            shown.contains("allowed-origins  https://a.example"),
            "{shown}"
        );
        assert!(
            shown.contains("publish          anyone, on 127.0.0.1:8081 only"),
            "{shown}"
        );
    }

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
