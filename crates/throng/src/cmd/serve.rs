//! `throng serve`: the WebSocket push server. Parses flags into a
//! [`throng_server::Config`], prints the plan, runs the supervisor (or, with
//! the hidden `--worker-index`, one worker started by the supervisor).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use throng_host::units::{parse_duration, parse_rate, parse_size};
use throng_server::auth::{Key, PublishKeyFile, Settings};
use throng_server::config::{PerAddress, parse_listen, parse_presence};
use throng_server::redis::{RedisMode, RedisSettings, RedisUrl, Topology, Trust};
use throng_server::reload::Files;
use throng_server::{Config, Plan, WorkerCommand};

/// Arguments of `throng serve`.
#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("tls_listeners")
        .args(["tls_listen", "mqtts_listen"])
        .multiple(true)
))]
#[command(group(
    clap::ArgGroup::new("redis_any")
        .args(["redis", "redis_cluster", "redis_sentinel"])
        .multiple(true)
))]
#[command(after_help = "\
Subscribe:  a WebSocket upgrade on ws://HOST:PORT/<channel>
            (channel: 1-128 bytes of A-Z a-z 0-9 _ . : / -)
Several:    one connection, several channels (docs/channels.md):
            ws://HOST:PORT/?channel=a&channel=b offering throng.v1 (frames
            <channel>\\n<id>\\n<payload>; JSON text frames
            {\"subscribe\":\"c\",\"since\":ID} {\"unsubscribe\":\"a\"}
            {\"publish\":\"a\",\"data\":..} {\"refresh\":JWT}, each answered),
            or GET /sse/?channel=a&channel=b; --max-channels-per-connection
Publish:    curl -d 'hello' http://HOST:PORT/publish/<channel>
            answers {\"channel\":..,\"subscribers\":N}; a text frame when the
            body is UTF-8 (or Content-Type text/*, */json), binary otherwise
            (or Content-Type: application/octet-stream)
            ?retain=1 also makes it the channel's retained message, which
            each new MQTT subscription of the channel gets first (an empty
            body clears it; see --max-retained)
MQTT:       --mqtt-listen HOST:PORT; a topic is a channel (docs/mqtt.md)
Observe:    GET /metrics (Prometheus text), GET /healthz
API:        where publishing is, with its credentials (docs/api.md):
            GET /api/channels?prefix=&limit=&after= (subscriber counts),
            GET /api/channels/<c>, GET /api/history/<c>?since=&limit=,
            POST /api/disconnect {\"channel\":..,\"code\":4000},
            POST /api/publish {\"channels\":[..],\"data\":..}
            With --redis, counts and disconnects cover every node
            (\"scope\":\"cluster\"; each node writes its counts every 5s)
Cluster:    --redis redis[s]://[user:password@]HOST:PORT[/DB] makes this a
            node: POST /publish goes to Redis (PUBLISH <prefix><channel>),
            and every node delivers what Redis sends it. The publish answer
            is then {\"channel\":..,\"redis_receivers\":N}: the Redis
            connections that got the message (subscribed nodes, plus any
            other client), not WebSocket subscribers; 503 with the reason
            while Redis is unreachable. See docs/deploy.md.
            Past one Redis: --redis-cluster HOST:PORT,... (a Redis Cluster,
            sharded pub/sub, one link per master; channels mode) or
            --redis-sentinel HOST:PORT,... --redis-master NAME (the master
            Sentinel names, followed on failover). See docs/scale-out.md.
TLS:        every --tls-listen listener serves the same endpoints as wss://
            and https:// (TLS 1.3 and 1.2, ALPN http/1.1, session tickets
            shared by all workers), beside the plain --listen ones. A
            plain-HTTP request on a TLS port gets a plain 400; failed or
            stalled handshakes are closed and counted in
            throng_handshake_failures_total{reason=\"tls_...\"}
Test back end: GET or POST /ping -> pong; header 'sleep: S' waits a random
            0..S ms first, 'times: T' then sends T more pongs (chunked),
            each after such a wait. On loopback addresses only, unless
            --test-backend
Access:     with no option below anyone may subscribe to any channel and
            publish (a non-loopback --listen then prints a warning).
            docs/auth.md has the whole story.
            --auth-hs256-secret-file / --auth-public-key: every upgrade
              needs a JWT whose 'channels' claim grants the channel: names,
              'prefix*', '*', MQTT-style '+' and '#'. The token goes in
              'Authorization: Bearer <JWT>', in ?token=<JWT>, or (browsers)
              as a Sec-WebSocket-Protocol entry 'bearer.<JWT>' beside
              'throng', the one echoed:
              new WebSocket(url, ['throng', 'bearer.' + jwt]).
              No or a bad token: 401 with WWW-Authenticate; a channel not
              granted: 403.
            --auth-jwks-url: keys from an OIDC provider's key set (RSA, EC
              P-256/P-384, Ed25519), read at start (a set that cannot be
              read stops the start), again every --auth-jwks-refresh and
              when a token names an unknown kid (at most once per 5s: that
              token is refused, a retry after the read passes).
            Publishing needs the key (--publish-key-file) as
              'Authorization: Bearer <key>' (only there: never ?token=),
              or a token whose 'publish' claim grants the channel; --publish-listen moves it to an
              internal address, --metrics-listen moves /metrics.
            MQTT: the token (or the publish key) is CONNECT's password,
              beside any user name (mosquitto_sub -u any -P <JWT>); none:
              CONNACK 0x87 (3.1.1: 5), a bad one: 0x86 (3.1.1: 4). A
              filter not granted: SUBACK 0x87; a PUBLISH: PUBACK 0x87 (QoS
              0, 3.1.1: dropped); expired: DISCONNECT 0x87 (3.1.1: closed).
            --allowed-origins: browser pages from other sites get 403.
Limits:     --max-connections-per-ip, --handshakes-per-ip (429,
            Retry-After), --max-connections (503, Retry-After); refusals by
            reason in throng_refused_total.

Close codes sent: 1000 echo of the client's close, 1001 shutdown, 1002
protocol error, 1007 invalid UTF-8, 1008 idle timeout or slow consumer (queue
over --max-queue or no write progress within --write-timeout), 1009 client
frame too big, 4001 token expired (get a new token and reconnect; sent within
one --ping-interval of the token's exp).

Stops on SIGTERM or SIGINT, to the supervisor or to the whole process group
(systemd's default): stops accepting, sends 1001 to every subscriber, exits
within --drain-timeout. A worker that exits cleanly after such a signal is not
restarted: the whole server stops.

SIGHUP (systemctl reload) reads --tls-cert/--tls-key, the --auth-* key files,
--auth-jwks-url and --publish-key-file again; each new connection uses what was read. A bad file is
logged and the old material kept; nothing else changes without a restart.

Examples:
  throng serve
  throng serve --listen 0.0.0.0:10000-10015 --max-connections 1000000
  throng serve --listen 127.0.0.1:8080 --tls-listen 0.0.0.0:8443 \\
      --tls-cert cert.pem --tls-key key.pem
  throng serve --listen 0.0.0.0:8080 --redis redis://10.0.0.6:6379
  throng serve --listen 127.0.0.1:0 --json --dry-run")]
// The doc comments are `--help` text, where a bare URL reads best.
#[allow(rustdoc::bare_urls)]
pub(crate) struct Args {
    /// Address to listen on; repeat for more. A range HOST:FIRST-LAST opens a listener
    /// per port (more ports = more client source ports on one machine). Port 0 picks a free port.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8080", value_parser = parse_listen, action = clap::ArgAction::Append)]
    listen: Vec<Vec<SocketAddr>>,

    /// Address that speaks TLS (wss://, https://); repeat for more, ranges as for --listen.
    /// Needs --tls-cert and --tls-key, or --tls-self-signed.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen, action = clap::ArgAction::Append)]
    tls_listen: Vec<Vec<SocketAddr>>,

    /// Address that speaks MQTT 3.1.1 and 5.0 (mqtt://); repeat for more, ranges as for
    /// --listen. A topic is a channel: MQTT, WebSocket and SSE subscribers of one channel get
    /// the same messages, and what an MQTT client publishes reaches them all. Clean sessions,
    /// QoS 0, 1 and 2, retained messages, wildcard filters, wills (docs/mqtt.md).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen, action = clap::ArgAction::Append)]
    mqtt_listen: Vec<Vec<SocketAddr>>,

    /// Address that speaks MQTT over TLS (mqtts://); repeat for more, ranges as for --listen.
    /// Uses the certificate of --tls-cert/--tls-key or --tls-self-signed.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen, action = clap::ArgAction::Append)]
    mqtts_listen: Vec<Vec<SocketAddr>>,

    /// Certificate chain for --tls-listen and --mqtts-listen: a PEM file, leaf certificate first.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        requires = "tls_listeners"
    )]
    tls_cert: Option<PathBuf>,

    /// Private key of --tls-cert: a PEM file (PKCS#8, PKCS#1 RSA or SEC1 EC).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// For trials: make an ECDSA P-256 certificate for localhost, 127.0.0.1 and ::1 at start
    /// (its PEM is in the --json start line, for clients to trust).
    #[arg(long, conflicts_with = "tls_cert", requires = "tls_listeners")]
    tls_self_signed: bool,

    /// Worker processes (0 = one per core). Raised automatically when --max-connections needs
    /// more processes than the per-process open-file limit allows.
    #[arg(long, value_name = "N", default_value_t = 0)]
    workers: usize,

    /// Subscribers the whole server holds at most (over every worker): past it an upgrade
    /// gets 503 with Retry-After instead of the workers running out of files. Also sets the
    /// minimum number of workers.
    #[arg(long, value_name = "N")]
    max_connections: Option<u64>,

    /// Connections (subscribers and HTTP requests) one client address may hold at once,
    /// counted over every worker; past it a new one gets 429. An address is an IPv4 address
    /// or an IPv6 /64.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_ip: Option<u32>,

    /// New connections one client address may open, as a rate (e.g. 10/s, 300/m) with a
    /// burst (--handshake-burst); past it 429 with Retry-After. On --tls-listen ports a
    /// refused connection is closed before its TLS handshake, without an answer.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    handshakes_per_ip: Option<f64>,

    /// How many new connections an address may open at once after a quiet spell
    /// (the token bucket of --handshakes-per-ip). Default: one second's worth of the rate.
    #[arg(long, value_name = "N", requires = "handshakes_per_ip", value_parser = clap::value_parser!(u32).range(1..))]
    handshake_burst: Option<u32>,

    /// Largest publish body; larger ones get 413.
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = parse_size)]
    max_message: usize,

    /// How often every connection gets a WebSocket ping (spread over the interval).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    ping_interval: Duration,

    /// Keep the last N messages of every channel, so a subscriber that reconnects with
    /// the last id it saw (?since=ID with the throng.v1 subprotocol, Last-Event-ID over
    /// SSE) gets what it missed (docs/clients.md). 0: keep none; ids are given anyway.
    #[arg(long, value_name = "N", default_value_t = 0)]
    history: usize,

    /// Drop kept messages older than this (default: kept until pushed out).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "history")]
    history_ttl: Option<Duration>,

    /// Bytes the whole history may hold, over every channel; past it the oldest message
    /// of any channel is dropped (counted in /metrics: throng_history_dropped_total).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    history_max_memory: usize,

    /// Channels that may hold a retained message (an MQTT PUBLISH with the retain flag,
    /// or POST /publish/<channel>?retain=1); past it the channel whose message was set
    /// longest ago loses it (counted: throng_mqtt_retained_dropped_total). With --redis
    /// the cap holds for the store all nodes share.
    #[arg(long, value_name = "N", default_value_t = throng_server::retained::DEFAULT_MAX_TOPICS)]
    max_retained: usize,

    /// Bytes the retained messages may take (the embedded relay's store); past it the
    /// longest-set is dropped first.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    max_retained_memory: usize,

    /// Subscriptions one MQTT connection may hold; a SUBSCRIBE filter past it is refused
    /// (5.0 SUBACK 0x97, 3.1.1 0x80; counted: throng_mqtt_refused_total{kind="max_subscriptions"}).
    #[arg(long, value_name = "N", default_value_t = throng_server::config::DEFAULT_MAX_SUBSCRIPTIONS)]
    max_subscriptions: usize,

    /// Channels one connection opened at / may be in: a WebSocket offering throng.v1
    /// (/?channel=a&channel=b, then {"subscribe":"c"} frames) or an event stream
    /// (/sse/?channel=a&channel=b). Past it a subscribe is answered with an error
    /// (docs/channels.md); at connect, 400.
    #[arg(long, value_name = "N", default_value_t = throng_server::config::DEFAULT_MAX_CHANNELS)]
    max_channels_per_connection: usize,

    /// Channels whose presence (who is subscribed: the tokens' sub) GET /api/channels/<c>
    /// lists, by pattern as in a token's grants (room.*, exact names, *); repeatable.
    /// Their subscribers may also follow joins and leaves: `presence=<c>` at connect or
    /// {"subscribe":"<c>","presence":true} (docs/channels.md). With --redis: every node's.
    /// Off by default: the subjects of users are not shown (docs/api.md).
    #[arg(long, value_name = "PATTERN", value_parser = parse_presence, action = clap::ArgAction::Append)]
    presence: Vec<String>,

    /// Offer permessage-deflate (RFC 7692) to WebSocket subscribers. Negotiated with
    /// server_no_context_takeover and client_no_context_takeover: each message is
    /// compressed once per fan-out and the same frame goes to every subscriber that
    /// accepted it (others get it uncompressed), and no subscriber keeps compression
    /// state, so an idle one costs what it did. An offer asking for a server window
    /// under 15 bits is declined. Compressed client frames are inflated to at most their
    /// message limit (past it: close 1009; not deflate data: 1007). docs/clients.md.
    #[arg(long)]
    ws_deflate: bool,

    /// With --ws-deflate, payloads shorter than this go uncompressed (RSV1 clear).
    #[arg(long, value_name = "SIZE", default_value = "256B", value_parser = parse_size)]
    ws_deflate_min: usize,

    /// Bytes of topic filters one MQTT connection may hold; a filter past it is refused
    /// as past --max-subscriptions (kind="max_filter_bytes").
    #[arg(long, value_name = "SIZE", default_value = "16KiB", value_parser = parse_size)]
    max_filter_bytes: usize,

    /// Messages an MQTT persistent session (3.1.1 clean session 0, 5.0 Session Expiry
    /// Interval) keeps while its client is away; past it new ones are dropped for it
    /// (counted: throng_mqtt_session_dropped_total{cause="queue"}). With
    /// --mqtt-sessions-in-redis this is the limit this node's publishes queue to in
    /// Redis (give every node the same); without, sessions are this node's memory only.
    #[arg(long, value_name = "N", default_value_t = throng_server::config::DEFAULT_SESSION_QUEUE)]
    mqtt_session_queue: usize,

    /// Keep MQTT persistent sessions whose client is away in Redis (--redis, pattern
    /// mode; give it to every node): a client that comes back to any node resumes its
    /// session, and a node's death or restart loses none. Its cost: each QoS 1/2 publish
    /// (every HTTP publish included) runs a Redis script that queues it for the matching
    /// sessions away, atomically with the PUBLISH (about 30 times a bare PUBLISH's Redis
    /// CPU). Off: sessions are the memory of the node the client last used. docs/mqtt.md.
    #[arg(long, requires = "redis_any")]
    mqtt_sessions_in_redis: bool,

    /// Bytes the messages of every kept MQTT session may take in all; past it new ones
    /// are dropped (cause="memory"). Sessions kept in Redis (--mqtt-sessions-in-redis) are bounded by
    /// --mqtt-session-queue and Redis's maxmemory instead.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    mqtt_sessions_memory: usize,

    /// The longest an MQTT session is kept while its client is away (a 5.0 client's
    /// Session Expiry Interval up to it; a 3.1.1 clean session 0 this long).
    #[arg(long, value_name = "DURATION", default_value = "2h", value_parser = parse_duration)]
    mqtt_session_expiry: Duration,

    /// The longest keep-alive an MQTT 5.0 client gets: one asking for more (or for none)
    /// is told this one in CONNACK (Server Keep Alive) and held to it. 3.1.1 has no way
    /// to say so: its clients keep what they asked. Default: what the client asks.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    mqtt_max_keep_alive: Option<Duration>,

    /// Close (1008) a connection that sent nothing (not even a pong) for this long.
    /// Default: 3 x --ping-interval. Checked once per ping interval.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    idle_timeout: Option<Duration>,

    /// Unsent bytes one connection may have queued; past it the connection is closed (1008).
    #[arg(long, value_name = "SIZE", default_value = "256KiB", value_parser = parse_size)]
    max_queue: usize,

    /// Close (1008) a connection whose queued write made no progress for this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    write_timeout: Duration,

    /// On SIGTERM/SIGINT, wait at most this long for close handshakes before exiting
    /// (it exits once the last connection is gone; a client that does not answer gets 5 s).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    drain_timeout: Duration,

    /// Take the ports of the running throng serve that holds them: its
    /// listening sockets come over its control socket, this server's workers
    /// start on them, then the old one closes its connections (WebSocket
    /// 1012, MQTT 5 DISCONNECT 0x8B, SSE end of stream) spread over
    /// --drain-spread and exits; without --redis it hands its --history and
    /// its retained MQTT messages over, so clients rejoining with ?since= miss
    /// nothing and a new MQTT subscriber gets what was retained (persistent
    /// MQTT sessions are not handed over; with --redis they are parked in
    /// Redis, where this one resumes them). Only a serve of the same user can
    /// be taken over. Without a running serve: starts normally.
    #[arg(long)]
    takeover: bool,

    /// When taken over by a `serve --takeover`: close the connections spread
    /// evenly over this long, so clients reconnect gradually (no storm).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    drain_spread: Duration,

    /// Close a connection whose request head (or publish body) is not complete within this
    /// (slowloris). On --tls-listen the TLS handshake gets the same time again, first.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    handshake_timeout: Duration,

    /// /ping: cut off a request not answered in full within this (sleep and times included).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    request_timeout: Duration,

    /// /ping: the largest `sleep` header accepted (400 above it).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    max_sleep: Duration,

    /// /ping: the largest `times` header accepted (400 above it).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    max_times: u64,

    /// Route through Redis pub/sub so many nodes share channels:
    /// redis://[user:password@]HOST[:PORT][/DB] (escape @ : / in the password as %40 %3A %2F),
    /// or rediss://... for TLS to Redis (both of the node's connections; SNI from HOST unless it
    /// is an IP address; see --redis-tls-ca). Default: the embedded relay (one machine).
    #[arg(long, value_name = "URL", value_parser = parse_redis_url)]
    redis: Option<RedisUrl>,

    /// Redis channel prefix: channel <c> is the Redis channel <prefix><c>.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "throng:",
        requires = "redis_any"
    )]
    redis_prefix: String,

    /// pattern: one PSUBSCRIBE <prefix>* (every node receives every message; simplest, best
    /// for few nodes). channels: SUBSCRIBE only to channels with subscribers on this node,
    /// UNSUBSCRIBE when the last leaves (for many nodes x many channels). Default: pattern;
    /// channels with --redis-cluster, where pattern is refused.
    #[arg(long, value_name = "MODE", value_parser = parse_redis_mode, requires = "redis_any")]
    redis_mode: Option<RedisMode>,

    /// rediss://: PEM file of the CA certificate(s) that signed Redis's certificate, which
    /// must name the URL's host (a DNS name or IP address). Default: the system bundle
    /// /etc/ssl/certs/ca-certificates.crt.
    #[arg(long, value_name = "FILE", requires = "redis_any")]
    redis_tls_ca: Option<PathBuf>,

    /// rediss://: do not check Redis's certificate at all (trials with a self-signed
    /// certificate only: anyone on the path can then read and change the traffic, password
    /// included).
    #[arg(long, requires = "redis_any", conflicts_with = "redis_tls_ca")]
    redis_tls_insecure: bool,

    /// Start even when Redis is unreachable and keep retrying with backoff (subscribers are
    /// accepted meanwhile; publishing answers 503). Without it, an unreachable Redis is an
    /// error at start.
    #[arg(long, requires = "redis_any")]
    redis_wait: bool,

    /// Route through a Redis Cluster (Redis 7): HOST:PORT[,HOST:PORT...] of any of its nodes
    /// (the map is read from them). One link per master, sharded pub/sub (SSUBSCRIBE and
    /// SPUBLISH on the master of each channel's slot), MOVED/ASK followed. --redis, if given,
    /// supplies only credentials and TLS. See docs/scale-out.md.
    #[arg(
        long,
        value_name = "HOST:PORT[,...]",
        conflicts_with = "redis_sentinel"
    )]
    redis_cluster: Option<String>,

    /// Find the master through Redis Sentinel: HOST:PORT[,HOST:PORT...] of the sentinels,
    /// asked in turn before every connection; a +switch-master moves the node to the new
    /// master. Needs --redis-master. --redis, if given, supplies only credentials and TLS.
    #[arg(long, value_name = "HOST:PORT[,...]", requires = "redis_master")]
    redis_sentinel: Option<String>,

    /// The master's name in Sentinel's configuration (with --redis-sentinel).
    #[arg(long, value_name = "NAME", requires = "redis_sentinel")]
    redis_master: Option<String>,

    /// Require a token (JWT) signed with this HS256 secret: a file of at least 32 bytes (one
    /// trailing newline is ignored). KID=FILE names the key for tokens whose header has that
    /// kid. Repeat for more keys.
    #[arg(long, value_name = "[KID=]FILE", action = clap::ArgAction::Append)]
    auth_hs256_secret_file: Vec<String>,

    /// Require a token (JWT) signed by this key: a PEM public key whose type decides the one
    /// algorithm it checks (RSA: RS256, EC P-256: ES256, P-384: ES384, Ed25519: EdDSA).
    /// KID=FILE as above; repeat for more keys.
    #[arg(long, value_name = "[KID=]FILE", action = clap::ArgAction::Append)]
    auth_public_key: Vec<String>,

    /// Require a token (JWT) signed by a key of this JSON Web Key Set (an OIDC provider's
    /// jwks_uri): https://, or http:// to a loopback address only. Read at start: a set that
    /// cannot be read, or holds no usable key, stops the start. Read again every
    /// --auth-jwks-refresh, and when a token names a kid the set lacks (at most once per 5s;
    /// that token is refused, a retry after the read passes); a failed read keeps the keys.
    #[arg(long, value_name = "URL", value_parser = parse_jwks_url)]
    auth_jwks_url: Option<throng_server::auth::JwksUrl>,

    /// The CA certificates (PEM) the --auth-jwks-url server's certificate must chain to.
    /// Default: the system bundle.
    #[arg(long, value_name = "FILE", requires = "auth_jwks_url")]
    auth_jwks_ca: Option<PathBuf>,

    /// How often --auth-jwks-url is read again.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    auth_jwks_refresh: Duration,

    /// Tokens must carry this issuer (iss).
    #[arg(long, value_name = "ISS")]
    auth_issuer: Option<String>,

    /// Tokens must name this audience (aud). Without it a token that has an aud is refused
    /// (RFC 7519: it was meant for someone else).
    #[arg(long, value_name = "AUD")]
    auth_audience: Option<String>,

    /// Accept tokens without an expiry (exp). Without it they are refused; a subscriber is
    /// closed with 4001 (MQTT 5.0: DISCONNECT 0x87) within one --ping-interval after its
    /// token's exp.
    #[arg(long)]
    auth_allow_no_exp: bool,

    /// Publishing needs this key (a file of at least 16 bytes), sent as
    /// 'Authorization: Bearer <key>' (compared in constant time), or a token whose publish
    /// claim grants the channel.
    #[arg(long, value_name = "FILE")]
    publish_key_file: Option<String>,

    /// Serve publishing, the server API (/api/...) and /healthz on this internal address
    /// only, like an admin port; the public addresses then refuse them with 403.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen, action = clap::ArgAction::Append)]
    publish_listen: Vec<Vec<SocketAddr>>,

    /// Serve /metrics (and /healthz) on this internal address only; the public addresses
    /// then refuse it with 403. May be the --publish-listen address.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen, action = clap::ArgAction::Append)]
    metrics_listen: Vec<Vec<SocketAddr>>,

    /// Browser pages from these origins only may subscribe: a comma-separated list such as
    /// https://app.example.com,https://example.com (others get 403: cross-site WebSocket
    /// hijacking). Clients that send no Origin header are not browsers and are not checked.
    /// Default: any origin.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    allowed_origins: Option<Vec<String>>,

    /// Connections to the public listeners (--listen, --tls-listen, --mqtt-listen,
    /// --mqtts-listen) start with a PROXY protocol header, v1 or v2 (HAProxy's send-proxy,
    /// send-proxy-v2), naming the client: per-address limits and logs then count the
    /// client, not the balancer. Accepted only from --trusted-proxies; any other
    /// connection, or one without a header, is closed.
    #[arg(long, requires = "trusted_proxies")]
    proxy_protocol: bool,

    /// The balancers whose word about the client is believed: a comma-separated list of
    /// address blocks (10.0.0.0/8,192.0.2.7,2001:db8::/32). Needed by --proxy-protocol.
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',', value_parser = parse_cidr)]
    trusted_proxies: Vec<throng_server::proxied::Cidr>,

    /// Serve /ping, the test back end (it may hold a connection an hour), on addresses that
    /// are not loopback too; without it only loopback addresses serve it (others: 404).
    #[arg(long)]
    test_backend: bool,

    /// Print the start line as one JSON object on stdout (for scripts) instead of the
    /// readable settings on stderr.
    #[arg(long)]
    json: bool,

    /// Print the effective settings (the listen addresses bound, so a port in use is an
    /// error now), then exit without starting anything.
    #[arg(long)]
    dry_run: bool,

    /// Read settings from this TOML file (or $THRONG_CONFIG): keys are the long option
    /// names (max-connections = 100000), a repeatable option takes an array
    /// (listen = ["0.0.0.0:8080", "0.0.0.0:8081"]). Every option is also read from
    /// THRONG_<OPTION> (THRONG_MAX_CONNECTIONS=100000; one value for a repeatable one).
    /// Flags override the environment, which overrides the file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Print every setting with its value and where it came from (flag, environment,
    /// file, default), as a file --config reads, then exit.
    #[arg(long)]
    print_config: bool,

    /// What --print-config shows (filled in by the settings layer).
    #[arg(skip)]
    pub(crate) shown: String,

    /// Benchmark only: enable POST /bench/floor/<channel>, a bare write(2) loop over the
    /// channel's subscribers (in a build with the `bench-floor` feature only).
    #[cfg(feature = "bench-floor")]
    #[arg(long, hide = true)]
    bench_floor: bool,

    /// Internal: run as worker N of a supervisor (stdin is its control socket).
    #[arg(long, hide = true, value_name = "N")]
    worker_index: Option<usize>,
}

/// The keys, claims and publish key of `args`, each file read and checked now.
fn auth_settings(args: &Args) -> anyhow::Result<Settings> {
    let mut keys = Vec::new();
    for spec in &args.auth_hs256_secret_file {
        keys.push(Key::hs256_secret_file(spec).context("--auth-hs256-secret-file")?);
    }
    for spec in &args.auth_public_key {
        keys.push(Key::public_key_file(spec).context("--auth-public-key")?);
    }
    let jwks = match &args.auth_jwks_url {
        Some(url) => {
            let ca = args.auth_jwks_ca.as_deref();
            let read = throng_server::jwks::read_now(url, ca)
                .with_context(|| format!("--auth-jwks-url {url}: cannot read the key set"))?;
            for s in &read.skipped {
                eprintln!("throng: --auth-jwks-url: skipped {s}");
            }
            Some(throng_server::auth::Jwks {
                url: url.clone(),
                ca: args.auth_jwks_ca.clone(),
                refresh: args.auth_jwks_refresh,
                keys: read.keys,
            })
        }
        None => None,
    };
    if keys.is_empty()
        && jwks.is_none()
        && (args.auth_issuer.is_some() || args.auth_audience.is_some() || args.auth_allow_no_exp)
    {
        anyhow::bail!(
            "--auth-issuer, --auth-audience and --auth-allow-no-exp are rules for tokens: \
             give the key they are signed with (--auth-hs256-secret-file, --auth-public-key \
             or --auth-jwks-url)"
        );
    }
    if let Some(allowed) = &args.allowed_origins
        && let Some(bad) = allowed
            .iter()
            .find(|o| !(o.starts_with("http://") || o.starts_with("https://")) || o.ends_with('/'))
    {
        anyhow::bail!(
            "--allowed-origins: '{bad}' is not an origin (scheme://host[:port], no path or \
             trailing '/'; e.g. https://app.example.com)"
        );
    }
    let publish_key = match &args.publish_key_file {
        Some(path) => Some(PublishKeyFile::read(path).context("--publish-key-file")?),
        None => None,
    };
    Ok(Settings {
        keys,
        issuer: args.auth_issuer.clone(),
        audience: args.auth_audience.clone(),
        allow_no_exp: args.auth_allow_no_exp,
        publish_key,
        jwks,
    })
}

fn parse_jwks_url(s: &str) -> Result<throng_server::auth::JwksUrl, String> {
    s.parse()
        .map_err(|e: throng_server::auth::JwksError| e.to_string())
}

fn parse_cidr(s: &str) -> Result<throng_server::proxied::Cidr, String> {
    s.parse()
        .map_err(|e: throng_server::proxied::BadCidr| e.to_string())
}

fn parse_redis_url(s: &str) -> Result<RedisUrl, String> {
    s.parse::<RedisUrl>().map_err(|e| e.to_string())
}

fn parse_redis_mode(s: &str) -> Result<RedisMode, String> {
    s.parse()
        .map_err(|e: throng_server::redis::error::UnknownMode| e.to_string())
}

/// The server's settings from `args`, every file read and checked now.
fn build_config(args: &Args) -> anyhow::Result<Config> {
    let auth = auth_settings(args)?;
    let config = Config {
        listen: args.listen.iter().flatten().copied().collect(),
        workers: args.workers,
        max_connections: args.max_connections,
        max_message: args.max_message,
        ping_interval: args.ping_interval,
        idle_timeout: args.idle_timeout.unwrap_or(args.ping_interval * 3),
        max_queue: args.max_queue,
        write_timeout: args.write_timeout,
        drain_timeout: args.drain_timeout,
        takeover: args.takeover,
        drain_spread: args.drain_spread,
        handshake_timeout: args.handshake_timeout,
        #[cfg(feature = "bench-floor")]
        bench_floor: args.bench_floor,
        #[cfg(not(feature = "bench-floor"))]
        bench_floor: false,
        request_timeout: args.request_timeout,
        max_sleep: args.max_sleep,
        max_times: args.max_times,
        redis_mode: None,
        tls_listen: args.tls_listen.iter().flatten().copied().collect(),
        mqtt_listen: args.mqtt_listen.iter().flatten().copied().collect(),
        mqtts_listen: args.mqtts_listen.iter().flatten().copied().collect(),
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(throng_server::tls::Material::from_files(cert, key)?),
            _ if args.tls_self_signed => Some(throng_server::tls::Material::self_signed()?),
            _ => None,
        },
        auth,
        allowed_origins: args.allowed_origins.clone(),
        publish_listen: args.publish_listen.iter().flatten().copied().collect(),
        metrics_listen: args.metrics_listen.iter().flatten().copied().collect(),
        per_address: PerAddress {
            max_connections: args.max_connections_per_ip,
            handshakes_per_sec: args.handshakes_per_ip,
            handshake_burst: args.handshake_burst.unwrap_or_else(|| {
                // One second's worth, at least one: f64 to u32 saturates.
                args.handshakes_per_ip
                    .map_or(0, |r| r.ceil().max(1.0) as u32)
            }),
        },
        shared_counters: None,
        history: args.history,
        history_ttl: args.history_ttl,
        history_max_memory: args.history_max_memory,
        max_retained: args.max_retained,
        max_retained_memory: args.max_retained_memory,
        proxy_protocol: args.proxy_protocol,
        trusted_proxies: args.trusted_proxies.clone(),
        // Set by the plan from the open-file limit and the listeners.
        worker_files: None,
        test_backend: args.test_backend,
        max_subscriptions: args.max_subscriptions,
        max_channels_per_connection: args.max_channels_per_connection,
        presence: args.presence.clone(),
        ws_deflate: args.ws_deflate,
        ws_deflate_min: args.ws_deflate_min,
        max_filter_bytes: args.max_filter_bytes,
        mqtt_session_queue: args.mqtt_session_queue,
        mqtt_sessions_in_redis: args.mqtt_sessions_in_redis,
        mqtt_sessions_memory: args.mqtt_sessions_memory,
        mqtt_session_expiry: u32::try_from(args.mqtt_session_expiry.as_secs()).unwrap_or(u32::MAX),
        mqtt_max_keep_alive: args
            .mqtt_max_keep_alive
            .map(|d| u16::try_from(d.as_secs().max(1)).unwrap_or(u16::MAX)),
    };
    if config.proxy_protocol && config.trusted_proxies.is_empty() {
        anyhow::bail!(
            "--proxy-protocol needs --trusted-proxies CIDR,... (the balancers' addresses): \
             a PROXY header from anyone else would let them claim any address"
        );
    }
    if config.ping_interval.is_zero() {
        anyhow::bail!("--ping-interval must be more than 0");
    }
    Ok(config)
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(index) = args.worker_index {
        throng_server::worker::run_from_stdin(index)?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.print_config {
        print!("{}", args.shown);
        return Ok(ExitCode::SUCCESS);
    }
    let config = build_config(&args)?;
    let mut plan = Plan::new(config)?;
    plan.reload = Files {
        tls: args.tls_cert.clone().zip(args.tls_key.clone()),
        hs256: args.auth_hs256_secret_file.clone(),
        public_keys: args.auth_public_key.clone(),
        publish_key: args.publish_key_file.clone(),
    };
    let topology = Topology::from_flags(
        args.redis_cluster.as_deref(),
        args.redis_sentinel.as_deref(),
        args.redis_master.clone(),
    )?;
    if let Some(url) = topology.url(args.redis) {
        let trust = Trust {
            ca: args.redis_tls_ca,
            insecure: args.redis_tls_insecure,
        };
        if !url.tls && (trust.ca.is_some() || trust.insecure) {
            anyhow::bail!(
                "--redis-tls-ca and --redis-tls-insecure are for TLS to Redis: use a rediss:// URL"
            );
        }
        let tls = trust.client_config(&url).with_context(|| {
            format!(
                "cannot set up TLS to Redis at {url} (give --redis-tls-ca FILE, or \
                 --redis-tls-insecure for a trial)"
            )
        })?;
        if url.tls && trust.insecure {
            eprintln!(
                "throng: WARNING: --redis-tls-insecure: the certificate of Redis at {url} is NOT \
                 checked; anyone on the path can read and change this node's Redis traffic, \
                 password included. For trials only."
            );
        }
        plan = plan.with_redis(RedisSettings {
            url,
            prefix: args.redis_prefix,
            mode: topology.mode(args.redis_mode),
            wait: args.redis_wait,
            trust,
            tls,
            // Set by the plan from --history: the streams follow the node's settings.
            history: None,
            // Set by the plan from --max-retained.
            max_retained: 0,
            topology,
            // Set by the plan from --mqtt-sessions-in-redis and --mqtt-session-queue.
            session_queue: 0,
        })?;
    }
    if args.json {
        // One JSON line on stdout: what scripts and tests read (actual ports, workers, limits).
        println!("{}", plan.to_json());
    } else {
        eprintln!("{plan}");
    }
    // Loud whatever the output format: it is about the machine's exposure.
    if let Some(warning) = plan.config.exposure_warning() {
        eprintln!("{warning}");
    }
    if args.dry_run {
        if !args.json {
            eprintln!("dry run: nothing started");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let command = WorkerCommand {
        program: std::env::current_exe().context("cannot find this executable to start workers")?,
        args: vec!["serve".into()],
    };
    throng_server::supervisor::run(plan, command)?;
    Ok(ExitCode::SUCCESS)
}
