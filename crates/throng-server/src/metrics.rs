//! Counters: each worker keeps its own (plain `Cell`s, nothing shared), sends
//! a [`Snapshot`] to the supervisor a few times a second, and the supervisor
//! renders the sum as Prometheus text for `GET /metrics`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds (seconds) of the fan-out duration histogram buckets.
pub const FANOUT_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Why a subscriber connection ended (the `reason` label of `throng_connections_closed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The client sent a close frame.
    PeerClose,
    /// The client went away without one (EOF or reset).
    PeerGone,
    /// Nothing heard within `--idle-timeout` (closed 1008).
    IdleTimeout,
    /// Queue over `--max-queue` or no write progress in `--write-timeout` (closed 1008).
    SlowConsumer,
    /// The client broke RFC 6455 (closed 1002, 1007 or 1009).
    ProtocolError,
    /// The server is shutting down (closed 1001).
    Shutdown,
    /// A TLS subscriber's records failed to decrypt or broke TLS.
    TlsError,
    /// Its token's `exp` passed (closed 4001).
    TokenExpired,
    /// An MQTT client connected with its client id (5.0: DISCONNECT 0x8E).
    TakenOver,
    /// Closed through the server API (`POST /api/disconnect`).
    Disconnected,
}

impl CloseReason {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::PeerClose => "peer_close",
            Self::PeerGone => "peer_gone",
            Self::IdleTimeout => "idle_timeout",
            Self::SlowConsumer => "slow_consumer",
            Self::ProtocolError => "protocol_error",
            Self::Shutdown => "shutdown",
            Self::TlsError => "tls_error",
            Self::TokenExpired => "token_expired",
            Self::TakenOver => "taken_over",
            Self::Disconnected => "api_disconnect",
        }
    }
}

/// One worker's counters. Single-threaded: `Cell`s, no atomics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Subscriber connections open now.
    pub open: Cell<u64>,
    /// Subscribers that have a write queue now.
    pub queued: Cell<u64>,
    /// TCP connections accepted.
    pub accepted: Cell<u64>,
    /// WebSocket upgrades completed.
    pub upgraded: Cell<u64>,
    /// Frames written (or queued) to subscribers.
    pub frames_delivered: Cell<u64>,
    /// Frames not delivered because their connection was closed first.
    pub frames_dropped: Cell<u64>,
    /// Messages written (or queued) compressed (permessage-deflate).
    pub frames_deflated: Cell<u64>,
    /// Presence events (joins and leaves) written to watchers.
    pub presence_events: Cell<u64>,
    /// Pings sent by the heartbeat.
    pub pings: Cell<u64>,
    /// Fan-out durations, one count per bucket of [`FANOUT_BUCKETS`] plus +Inf.
    pub fanout_buckets: RefCell<Vec<u64>>,
    /// Sum of fan-out wall time.
    pub fanout_seconds: Cell<f64>,
    /// Sum of fan-out CPU time of the worker thread.
    pub fanout_cpu_seconds: Cell<f64>,
    /// Subscribers closed, by [`CloseReason::label`].
    pub closed: RefCell<BTreeMap<&'static str, u64>>,
    /// Refused or failed handshakes and HTTP requests, by reason.
    pub handshake_failures: RefCell<BTreeMap<&'static str, u64>>,
    /// Slow-consumer closes by cause (`queue`, `timeout`).
    pub slow_consumer: RefCell<BTreeMap<&'static str, u64>>,
    /// HTTP requests served, by endpoint.
    pub http_requests: RefCell<BTreeMap<&'static str, u64>>,
    /// TLS handshakes completed, by version and kind (`tls1.3_full`, `tls1.3_resumed`, ...).
    pub tls_handshakes: RefCell<BTreeMap<&'static str, u64>>,
    /// Connections and requests refused by a rule (a token, an origin, a
    /// limit), by reason.
    pub refused: RefCell<BTreeMap<&'static str, u64>>,
    /// What MQTT clients sent that was refused or not served as asked
    /// (a bad packet, by its `DecodeError` label; a wildcard filter; QoS 2;
    /// a persistent session), by kind.
    pub mqtt_refused: RefCell<BTreeMap<&'static str, u64>>,
    /// MQTT subscribers connected now (also in `open`).
    pub mqtt_open: Cell<u64>,
    /// MQTT packets received from clients, by type.
    pub mqtt_received: RefCell<BTreeMap<&'static str, u64>>,
    /// MQTT packets sent to clients as answers, by type (deliveries are
    /// `frames_delivered`).
    pub mqtt_sent: RefCell<BTreeMap<&'static str, u64>>,
    /// QoS 1 deliveries to MQTT subscribers awaiting their PUBACK now.
    pub mqtt_inflight: Cell<u64>,
    /// QoS 1 deliveries held back now: their subscriber has as many in
    /// flight as its receive maximum allows.
    pub mqtt_waiting: Cell<u64>,
    /// QoS 1 deliveries acknowledged (PUBACK).
    pub mqtt_acked: Cell<u64>,
    /// Retained messages sent to new MQTT subscriptions.
    pub mqtt_retained_sent: Cell<u64>,
}

fn bump(map: &RefCell<BTreeMap<&'static str, u64>>, key: &'static str) {
    *map.borrow_mut().entry(key).or_default() += 1;
}

/// Adds one to a plain counter.
pub fn inc(c: &Cell<u64>) {
    c.set(c.get() + 1);
}

impl Counters {
    /// Counts a closed subscriber.
    pub fn closed(&self, why: CloseReason) {
        bump(&self.closed, why.label());
    }

    /// Counts a failed handshake or refused request.
    pub fn handshake_failed(&self, why: &'static str) {
        bump(&self.handshake_failures, why);
    }

    /// Counts a slow-consumer close (`queue` or `timeout`).
    pub fn slow_consumer(&self, why: &'static str) {
        bump(&self.slow_consumer, why);
    }

    /// Counts a served HTTP request.
    pub fn http_request(&self, endpoint: &'static str) {
        bump(&self.http_requests, endpoint);
    }

    /// Counts a refusal by a rule (token, origin, limit).
    pub fn refused(&self, why: &'static str) {
        bump(&self.refused, why);
    }

    /// Counts something an MQTT client sent that was refused or not served as asked.
    pub fn mqtt_refused(&self, what: &'static str) {
        bump(&self.mqtt_refused, what);
    }

    /// Counts an MQTT packet received, by its type's name.
    pub fn mqtt_received(&self, kind: &'static str) {
        bump(&self.mqtt_received, kind);
    }

    /// Counts an MQTT packet sent as an answer, by its type's name.
    pub fn mqtt_sent(&self, kind: &'static str) {
        bump(&self.mqtt_sent, kind);
    }

    /// Counts a completed TLS handshake.
    pub fn tls_handshake(&self, kind: &'static str) {
        bump(&self.tls_handshakes, kind);
    }

    /// Records one fan-out's wall and CPU time.
    pub fn fanout(&self, wall: Duration, cpu: Duration) {
        let secs = wall.as_secs_f64();
        let mut b = self.fanout_buckets.borrow_mut();
        if b.len() != FANOUT_BUCKETS.len() + 1 {
            b.resize(FANOUT_BUCKETS.len() + 1, 0);
        }
        let i = FANOUT_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(FANOUT_BUCKETS.len());
        b[i] += 1;
        self.fanout_seconds.set(self.fanout_seconds.get() + secs);
        self.fanout_cpu_seconds
            .set(self.fanout_cpu_seconds.get() + cpu.as_secs_f64());
    }

    /// A copy for the supervisor.
    pub fn snapshot(&self, worker: usize, pid: u32, rss_bytes: u64) -> Snapshot {
        let own = |m: &RefCell<BTreeMap<&'static str, u64>>| {
            m.borrow()
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect()
        };
        Snapshot {
            worker,
            pid,
            rss_bytes,
            open: self.open.get(),
            queued: self.queued.get(),
            accepted: self.accepted.get(),
            upgraded: self.upgraded.get(),
            frames_delivered: self.frames_delivered.get(),
            frames_dropped: self.frames_dropped.get(),
            frames_deflated: self.frames_deflated.get(),
            presence_events: self.presence_events.get(),
            pings: self.pings.get(),
            fanout_buckets: self.fanout_buckets.borrow().clone(),
            fanout_seconds: self.fanout_seconds.get(),
            fanout_cpu_seconds: self.fanout_cpu_seconds.get(),
            closed: own(&self.closed),
            handshake_failures: own(&self.handshake_failures),
            slow_consumer: own(&self.slow_consumer),
            http_requests: own(&self.http_requests),
            tls_handshakes: own(&self.tls_handshakes),
            refused: own(&self.refused),
            mqtt_refused: own(&self.mqtt_refused),
            mqtt_open: self.mqtt_open.get(),
            mqtt_received: own(&self.mqtt_received),
            mqtt_sent: own(&self.mqtt_sent),
            mqtt_inflight: self.mqtt_inflight.get(),
            mqtt_waiting: self.mqtt_waiting.get(),
            mqtt_acked: self.mqtt_acked.get(),
            mqtt_retained_sent: self.mqtt_retained_sent.get(),
        }
    }
}

/// One worker's counters at one moment, as sent to the supervisor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Worker index.
    pub worker: usize,
    /// Worker process id.
    pub pid: u32,
    /// Resident set size of the worker process.
    pub rss_bytes: u64,
    /// Gauge: subscribers open.
    pub open: u64,
    /// Gauge: subscribers with a write queue.
    pub queued: u64,
    /// Counter: TCP connections accepted.
    pub accepted: u64,
    /// Counter: WebSocket upgrades completed.
    pub upgraded: u64,
    /// Counter: frames delivered.
    pub frames_delivered: u64,
    /// Counter: frames dropped.
    pub frames_dropped: u64,
    /// Counter: frames delivered compressed (permessage-deflate).
    #[serde(default)]
    pub frames_deflated: u64,
    /// Counter: presence events written to watchers.
    #[serde(default)]
    pub presence_events: u64,
    /// Counter: heartbeat pings sent.
    pub pings: u64,
    /// Counter per fan-out bucket (not cumulative), +Inf last.
    pub fanout_buckets: Vec<u64>,
    /// Counter: fan-out wall seconds.
    pub fanout_seconds: f64,
    /// Counter: fan-out CPU seconds.
    pub fanout_cpu_seconds: f64,
    /// Counter by reason.
    pub closed: BTreeMap<String, u64>,
    /// Counter by reason.
    pub handshake_failures: BTreeMap<String, u64>,
    /// Counter by cause.
    pub slow_consumer: BTreeMap<String, u64>,
    /// Counter by endpoint.
    pub http_requests: BTreeMap<String, u64>,
    /// Counter by TLS version and handshake kind.
    #[serde(default)]
    pub tls_handshakes: BTreeMap<String, u64>,
    /// Counter by reason.
    #[serde(default)]
    pub refused: BTreeMap<String, u64>,
    /// Counter by kind.
    #[serde(default)]
    pub mqtt_refused: BTreeMap<String, u64>,
    /// Gauge: MQTT subscribers connected.
    #[serde(default)]
    pub mqtt_open: u64,
    /// Counter by packet type.
    #[serde(default)]
    pub mqtt_received: BTreeMap<String, u64>,
    /// Counter by packet type.
    #[serde(default)]
    pub mqtt_sent: BTreeMap<String, u64>,
    /// Gauge: QoS 1 deliveries awaiting PUBACK.
    #[serde(default)]
    pub mqtt_inflight: u64,
    /// Gauge: QoS 1 deliveries held past a receive maximum.
    #[serde(default)]
    pub mqtt_waiting: u64,
    /// Counter: QoS 1 deliveries acknowledged.
    #[serde(default)]
    pub mqtt_acked: u64,
    /// Counter: retained messages sent to new subscriptions.
    #[serde(default)]
    pub mqtt_retained_sent: u64,
}

fn add_map(into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

impl Snapshot {
    /// Adds `other`'s counters (not its gauges) into `self`: the totals of a
    /// worker that died are kept so counters never go backwards.
    pub fn add_counters(&mut self, other: &Self) {
        self.accepted += other.accepted;
        self.upgraded += other.upgraded;
        self.frames_delivered += other.frames_delivered;
        self.frames_dropped += other.frames_dropped;
        self.frames_deflated += other.frames_deflated;
        self.presence_events += other.presence_events;
        self.pings += other.pings;
        if self.fanout_buckets.len() < other.fanout_buckets.len() {
            self.fanout_buckets.resize(other.fanout_buckets.len(), 0);
        }
        for (a, b) in self.fanout_buckets.iter_mut().zip(&other.fanout_buckets) {
            *a += b;
        }
        self.fanout_seconds += other.fanout_seconds;
        self.fanout_cpu_seconds += other.fanout_cpu_seconds;
        add_map(&mut self.closed, &other.closed);
        add_map(&mut self.handshake_failures, &other.handshake_failures);
        add_map(&mut self.slow_consumer, &other.slow_consumer);
        add_map(&mut self.http_requests, &other.http_requests);
        add_map(&mut self.tls_handshakes, &other.tls_handshakes);
        add_map(&mut self.refused, &other.refused);
        add_map(&mut self.mqtt_refused, &other.mqtt_refused);
        add_map(&mut self.mqtt_received, &other.mqtt_received);
        add_map(&mut self.mqtt_sent, &other.mqtt_sent);
        self.mqtt_acked += other.mqtt_acked;
        self.mqtt_retained_sent += other.mqtt_retained_sent;
    }
}

/// What only the supervisor knows.
#[derive(Debug, Clone, Default)]
pub struct SupervisorStats {
    /// Messages published (relayed).
    pub published: u64,
    /// Workers restarted after dying.
    pub restarts: u64,
    /// Workers configured.
    pub workers: usize,
    /// The Redis broker's state and counters (`None`: the local relay).
    pub broker: Option<BrokerStats>,
    /// Addresses in the per-address table (`None`: no per-address limit).
    pub addresses: Option<u64>,
    /// The channel history's figures (set at each `/metrics`).
    pub history: Option<crate::history::Stats>,
    /// The retained messages' figures (set at each `/metrics`).
    pub retained: Option<crate::retained::Stats>,
    /// The MQTT persistent sessions kept (set at each `/metrics`).
    pub sessions: crate::sessions::SessionStats,
    /// MQTT shared subscriptions: groups and their members node-wide.
    pub shares: (u64, u64),
    /// Members of this node's groups on every node, as heard through Redis.
    pub shared_cluster: u64,
}

/// The Redis broker as `/metrics` shows it.
#[derive(Debug, Clone, Default)]
pub struct BrokerStats {
    /// Gauge: the link works and the subscriptions are confirmed.
    pub up: bool,
    /// Gauge: seconds the current outage has lasted (0 when up).
    pub outage_seconds: f64,
    /// Counter: seconds of outages that have ended.
    pub past_outage_seconds: f64,
    /// Counter: times the link came back after it was lost.
    pub reconnects: u64,
    /// Counter: connection attempts that failed, and links lost.
    pub connect_failures: u64,
    /// Counter: messages that arrived from Redis for this node.
    pub received: u64,
    /// Counter: messages from Redis no subscriber can get (bad channel name, too large).
    pub dropped: u64,
    /// Counter: `POST /publish` answered 503 because of the broker.
    pub publish_failures: u64,
    /// Gauge: channels (or patterns) the subscriber connection holds.
    pub subscriptions: u64,
    /// A Redis Cluster's shards: master address, up, seconds in that state.
    pub shards: Vec<(String, bool, f64)>,
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn labelled(
    out: &mut String,
    name: &str,
    label: &str,
    map: &BTreeMap<String, u64>,
    always: &[&str],
) {
    let mut all = map.clone();
    for k in always {
        all.entry((*k).to_owned()).or_default();
    }
    for (k, v) in all {
        let _ = writeln!(out, "{name}{{{label}=\"{k}\"}} {v}");
    }
}

/// The refusal reasons `/metrics` always shows, at 0 until one happens.
const REFUSED_ALWAYS: &[&str] = &[
    "token_missing",
    "token_expired",
    "token_signature",
    "not_granted",
    "origin",
    "publish_key",
    "max_connections",
    "per_ip_connections",
    "per_ip_rate",
];

/// One family of one sample.
fn one(out: &mut String, name: &str, kind: &str, help: &str, v: String) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {v}");
}

/// The gauges summed over the live workers.
#[derive(Default)]
struct Gauges {
    open: u64,
    queued: u64,
    mqtt_open: u64,
    mqtt_inflight: u64,
    mqtt_waiting: u64,
}

/// Renders the Prometheus text exposition (format 0.0.4) of all workers.
/// `live` holds the latest snapshot of each running worker; `retired` the
/// summed counters of workers that died.
pub fn render(live: &[&Snapshot], retired: &Snapshot, sup: &SupervisorStats) -> String {
    let mut total = retired.clone();
    let mut now = Gauges::default();
    for s in live {
        total.add_counters(s);
        now.open += s.open;
        now.queued += s.queued;
        now.mqtt_open += s.mqtt_open;
        now.mqtt_inflight += s.mqtt_inflight;
        now.mqtt_waiting += s.mqtt_waiting;
    }
    let mut out = String::with_capacity(4096);
    render_connections(&mut out, &total, &now);
    render_mqtt(&mut out, &total, &now);
    render_delivery(&mut out, &total, sup);
    render_fanout(&mut out, &total);
    render_workers(&mut out, live, sup);
    if let Some(b) = &sup.broker {
        render_broker(&mut out, b);
    }
    if let Some(h) = &sup.history {
        render_history(&mut out, h);
    }
    render_retained(
        &mut out,
        sup.retained.unwrap_or_default(),
        total.mqtt_retained_sent,
    );
    render_sessions(&mut out, &sup.sessions);
    unlabelled(
        &mut out,
        &[
            (
                "throng_mqtt_shared_groups",
                "gauge",
                "MQTT shared subscriptions ($share/group/filter) with members now.",
                sup.shares.0,
            ),
            (
                "throng_mqtt_shared_members",
                "gauge",
                "Their members on every worker now.",
                sup.shares.1,
            ),
            (
                "throng_mqtt_shared_cluster_members",
                "gauge",
                "With --redis: members of these groups on every node, as the nodes said through Redis (this one's once heard back).",
                sup.shared_cluster,
            ),
        ],
    );
    out
}

/// Samples without labels: (name, kind, help, value) each.
fn unlabelled(out: &mut String, rows: &[(&str, &str, &str, u64)]) {
    for &(name, kind, help, v) in rows {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }
}

/// The MQTT persistent sessions kept while their clients are away.
fn render_sessions(out: &mut String, s: &crate::sessions::SessionStats) {
    let rows = [
        (
            "throng_mqtt_sessions_parked",
            "gauge",
            "MQTT persistent sessions kept for clients away now.",
            s.parked,
        ),
        (
            "throng_mqtt_session_messages",
            "gauge",
            "Messages queued in them now.",
            s.queued,
        ),
        (
            "throng_mqtt_session_bytes",
            "gauge",
            "Bytes the kept sessions take (subscriptions and messages), under \
             --mqtt-sessions-memory.",
            s.bytes,
        ),
        (
            "throng_mqtt_sessions_resumed_total",
            "counter",
            "Reconnects without clean start that found their session.",
            s.resumed,
        ),
        (
            "throng_mqtt_sessions_expired_total",
            "counter",
            "Sessions dropped at their expiry (or --mqtt-session-expiry).",
            s.expired,
        ),
        (
            "throng_mqtt_sessions_refused_total",
            "counter",
            "Sessions not kept when their client went: over --mqtt-sessions-memory themselves.",
            s.refused,
        ),
        (
            "throng_mqtt_session_gaps_missed_total",
            "counter",
            "Sessions parked after more messages than the supervisor keeps to close the gap \
             between a connection's end and its park: some may be missing.",
            s.gap_missed,
        ),
        (
            "throng_mqtt_sessions_stored_total",
            "counter",
            "Sessions written to Redis when their client went (--redis): any node resumes them.",
            s.stored,
        ),
        (
            "throng_mqtt_session_store_failures_total",
            "counter",
            "Session writes and reads Redis refused or could not answer (a resume then starts \
             afresh).",
            s.store_failed,
        ),
    ];
    unlabelled(out, &rows);
    let name = "throng_mqtt_session_dropped_total";
    family(
        out,
        name,
        "counter",
        "Messages not kept for a session away: over --mqtt-session-queue (queue) or \
         --mqtt-sessions-memory (memory).",
    );
    let _ = writeln!(out, "{name}{{cause=\"queue\"}} {}", s.dropped_queue);
    let _ = writeln!(out, "{name}{{cause=\"memory\"}} {}", s.dropped_memory);
}

/// Connections: open, accepted, upgraded, closed, failed and refused.
fn render_connections(out: &mut String, total: &Snapshot, now: &Gauges) {
    one(
        out,
        "throng_connections_open",
        "gauge",
        "WebSocket subscribers connected now.",
        now.open.to_string(),
    );
    one(
        out,
        "throng_connections_queued",
        "gauge",
        "Subscribers with unsent bytes queued now.",
        now.queued.to_string(),
    );
    one(
        out,
        "throng_connections_accepted_total",
        "counter",
        "TCP connections accepted.",
        total.accepted.to_string(),
    );
    one(
        out,
        "throng_upgrades_total",
        "counter",
        "WebSocket upgrades completed.",
        total.upgraded.to_string(),
    );
    family(
        out,
        "throng_connections_closed_total",
        "counter",
        "Subscriber connections closed, by reason.",
    );
    labelled(
        out,
        "throng_connections_closed_total",
        "reason",
        &total.closed,
        &[
            "peer_close",
            "peer_gone",
            "idle_timeout",
            "slow_consumer",
            "protocol_error",
            "shutdown",
            "tls_error",
            "token_expired",
        ],
    );
    family(
        out,
        "throng_handshake_failures_total",
        "counter",
        "Refused or failed handshakes and HTTP requests, by reason.",
    );
    labelled(
        out,
        "throng_handshake_failures_total",
        "reason",
        &total.handshake_failures,
        &[],
    );
    family(
        out,
        "throng_refused_total",
        "counter",
        "Connections and requests refused by a rule, by reason: a token (401/403), an origin, \
         a limit (429/503). See docs/auth.md.",
    );
    labelled(
        out,
        "throng_refused_total",
        "reason",
        &total.refused,
        REFUSED_ALWAYS,
    );
}

/// MQTT: refusals, connections, QoS 1 deliveries, packets.
fn render_mqtt(out: &mut String, total: &Snapshot, now: &Gauges) {
    family(
        out,
        "throng_mqtt_refused_total",
        "counter",
        "What MQTT clients sent that was refused or not served as asked, by kind: a bad \
         packet (its decode error), a wildcard filter, QoS 2, a persistent session, what a \
         token does not grant (subscribe_, publish_, will_not_granted). See docs/mqtt.md.",
    );
    labelled(
        out,
        "throng_mqtt_refused_total",
        "kind",
        &total.mqtt_refused,
        &[],
    );
    one(
        out,
        "throng_mqtt_connections",
        "gauge",
        "MQTT subscribers connected now (counted in throng_connections_open too).",
        now.mqtt_open.to_string(),
    );
    one(
        out,
        "throng_mqtt_inflight",
        "gauge",
        "QoS 1 deliveries to MQTT subscribers awaiting their PUBACK now.",
        now.mqtt_inflight.to_string(),
    );
    one(
        out,
        "throng_mqtt_inflight_waiting",
        "gauge",
        "QoS 1 deliveries held back now because their subscriber has its receive maximum \
         in flight (sent when a PUBACK frees a slot).",
        now.mqtt_waiting.to_string(),
    );
    one(
        out,
        "throng_mqtt_acked_total",
        "counter",
        "QoS 1 deliveries to MQTT subscribers acknowledged with PUBACK.",
        total.mqtt_acked.to_string(),
    );
    for (name, help, map) in [
        (
            "throng_mqtt_packets_received_total",
            "MQTT packets received from clients after CONNECT, by type.",
            &total.mqtt_received,
        ),
        (
            "throng_mqtt_packets_sent_total",
            "MQTT packets sent to clients as answers, by type (deliveries are \
             throng_frames_delivered_total).",
            &total.mqtt_sent,
        ),
    ] {
        family(out, name, "counter", help);
        labelled(out, name, "type", map, &[]);
    }
}

/// Messages and what reached the subscribers; HTTP requests, TLS handshakes.
fn render_delivery(out: &mut String, total: &Snapshot, sup: &SupervisorStats) {
    one(
        out,
        "throng_messages_published_total",
        "counter",
        "Messages published (relayed to the workers).",
        sup.published.to_string(),
    );
    one(
        out,
        "throng_frames_delivered_total",
        "counter",
        "Frames written or queued to subscribers.",
        total.frames_delivered.to_string(),
    );
    one(
        out,
        "throng_frames_dropped_total",
        "counter",
        "Frames discarded because their subscriber was closed first.",
        total.frames_dropped.to_string(),
    );
    one(
        out,
        "throng_frames_deflated_total",
        "counter",
        "Frames of those delivered that went compressed (permessage-deflate, --ws-deflate).",
        total.frames_deflated.to_string(),
    );
    one(
        out,
        "throng_presence_events_total",
        "counter",
        "Presence events (joins and leaves, --presence) written to the connections that asked for them.",
        total.presence_events.to_string(),
    );
    family(
        out,
        "throng_slow_consumer_closes_total",
        "counter",
        "Subscribers closed with 1008 for falling behind, by cause.",
    );
    labelled(
        out,
        "throng_slow_consumer_closes_total",
        "cause",
        &total.slow_consumer,
        &["queue", "timeout"],
    );
    one(
        out,
        "throng_pings_sent_total",
        "counter",
        "Heartbeat pings sent.",
        total.pings.to_string(),
    );
    family(
        out,
        "throng_http_requests_total",
        "counter",
        "HTTP requests served, by endpoint.",
    );
    labelled(
        out,
        "throng_http_requests_total",
        "endpoint",
        &total.http_requests,
        &[],
    );
    family(
        out,
        "throng_tls_handshakes_total",
        "counter",
        "TLS handshakes completed on --tls-listen listeners, by version and kind (full or resumed).",
    );
    labelled(
        out,
        "throng_tls_handshakes_total",
        "kind",
        &total.tls_handshakes,
        &[],
    );
}

/// How long fan-outs took, and their CPU.
fn render_fanout(out: &mut String, total: &Snapshot) {
    family(
        out,
        "throng_fanout_duration_seconds",
        "histogram",
        "Wall time of one fan-out in one worker.",
    );
    let mut cum = 0;
    for (i, le) in FANOUT_BUCKETS.iter().enumerate() {
        cum += total.fanout_buckets.get(i).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "throng_fanout_duration_seconds_bucket{{le=\"{le}\"}} {cum}"
        );
    }
    let count: u64 = total.fanout_buckets.iter().sum();
    let _ = writeln!(
        out,
        "throng_fanout_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
    );
    let _ = writeln!(
        out,
        "throng_fanout_duration_seconds_sum {}",
        total.fanout_seconds
    );
    let _ = writeln!(out, "throng_fanout_duration_seconds_count {count}");
    one(
        out,
        "throng_fanout_cpu_seconds_total",
        "counter",
        "Worker CPU time spent in fan-out.",
        total.fanout_cpu_seconds.to_string(),
    );
}

/// The worker processes.
fn render_workers(out: &mut String, live: &[&Snapshot], sup: &SupervisorStats) {
    family(
        out,
        "throng_worker_rss_bytes",
        "gauge",
        "Resident set size of each worker process.",
    );
    for s in live {
        let _ = writeln!(
            out,
            "throng_worker_rss_bytes{{worker=\"{}\",pid=\"{}\"}} {}",
            s.worker, s.pid, s.rss_bytes
        );
    }
    one(
        out,
        "throng_workers",
        "gauge",
        "Worker processes configured.",
        sup.workers.to_string(),
    );
    one(
        out,
        "throng_worker_restarts_total",
        "counter",
        "Workers restarted after they died.",
        sup.restarts.to_string(),
    );
    if let Some(n) = sup.addresses {
        one(
            out,
            "throng_address_table_entries",
            "gauge",
            "Client addresses the per-address limits track now (live connections or recent handshakes).",
            n.to_string(),
        );
    }
}

/// One process of the node: `worker` is `None` for the supervisor.
#[derive(Debug, Clone, Copy)]
pub struct Process {
    /// Which worker, if not the supervisor.
    pub worker: Option<usize>,
    /// Its pid.
    pub pid: u32,
}

/// One `process_*` family: name, type, help, and its value of a process.
type ProcessRow = (
    &'static str,
    &'static str,
    &'static str,
    fn(&throng_host::process::Stats) -> String,
);

/// Prometheus's standard `process_*` families for every process of the
/// node, with a `role` label (`supervisor`, `worker`), and the kernel's
/// TCP socket count and memory (machine-wide: what the node's sockets
/// cost beyond its processes' RSS). Read from `/proc` when asked.
pub fn render_processes(out: &mut String, procs: &[Process]) {
    let read: Vec<(Process, throng_host::process::Stats)> = procs
        .iter()
        .filter_map(|p| throng_host::process::stats(p.pid).map(|s| (*p, s)))
        .collect();
    let rows: [ProcessRow; 5] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time, seconds.",
            |s| s.cpu_seconds.to_string(),
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory, bytes.",
            |s| s.rss_bytes.to_string(),
        ),
        ("process_open_fds", "gauge", "Open file descriptors.", |s| {
            s.open_fds.to_string()
        }),
        ("process_max_fds", "gauge", "The open-file limit.", |s| {
            s.max_fds.to_string()
        }),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time, Unix seconds.",
            |s| s.start_time_seconds.to_string(),
        ),
    ];
    for (name, kind, help, value) in rows {
        family(out, name, kind, help);
        for (p, s) in &read {
            // No pid label: a restarted worker stays one series.
            let labels = match p.worker {
                None => "role=\"supervisor\"".to_owned(),
                Some(i) => format!("role=\"worker\",worker=\"{i}\""),
            };
            let _ = writeln!(out, "{name}{{{labels}}} {}", value(s));
        }
    }
    if let Ok(host) = throng_host::sample::Sampler::new().sample::<&str>(&[]) {
        one(
            out,
            "throng_kernel_tcp_sockets",
            "gauge",
            "TCP sockets in use on the machine (/proc/net/sockstat{,6}).",
            host.tcp_inuse.to_string(),
        );
        one(
            out,
            "throng_kernel_tcp_memory_bytes",
            "gauge",
            "Kernel memory held by TCP socket buffers on the machine (/proc/net/sockstat mem).",
            host.tcp_mem_bytes.to_string(),
        );
    }
}

/// Retained messages: how many channels hold one, what the caps dropped,
/// and how many went to new subscriptions.
fn render_retained(out: &mut String, r: crate::retained::Stats, sent: u64) {
    let rows = [
        (
            "throng_mqtt_retained_topics",
            "gauge",
            "Channels holding a retained message now (with Redis: as this node last saw \
             the shared store).",
            r.topics,
        ),
        (
            "throng_mqtt_retained_bytes",
            "gauge",
            "Bytes the retained messages take (payloads and entries), under \
             --max-retained-memory (the embedded relay's store only).",
            r.bytes,
        ),
        (
            "throng_mqtt_retained_sent_total",
            "counter",
            "Retained messages sent to new MQTT subscriptions.",
            sent,
        ),
        (
            "throng_mqtt_retained_cut_total",
            "counter",
            "Retained messages left out of a subscription's answer over its bound (1000).",
            r.cut,
        ),
    ];
    unlabelled(out, &rows);
    let name = "throng_mqtt_retained_dropped_total";
    family(
        out,
        name,
        "counter",
        "Retained messages dropped, the longest-set first: over --max-retained (count) or \
         --max-retained-memory (memory).",
    );
    let _ = writeln!(out, "{name}{{reason=\"count\"}} {}", r.dropped_count);
    let _ = writeln!(out, "{name}{{reason=\"memory\"}} {}", r.dropped_memory);
}

/// The channel history: what it holds, what it dropped and why, and how
/// reconnecting subscribers fared.
fn render_history(out: &mut String, h: &crate::history::Stats) {
    let gauges = [
        (
            "throng_history_messages",
            "Messages kept for reconnecting subscribers now.",
            h.messages,
        ),
        (
            "throng_history_bytes",
            "Bytes the kept messages take (payloads and entries), under --history-max-memory.",
            h.bytes,
        ),
        (
            "throng_history_channels",
            "Channels with kept messages now.",
            h.channels,
        ),
    ];
    for (name, help, v) in gauges {
        family(out, name, "gauge", help);
        let _ = writeln!(out, "{name} {v}");
    }
    let name = "throng_history_dropped_total";
    family(
        out,
        name,
        "counter",
        "Kept messages dropped: pushed out by --history, older than --history-ttl, over --history-max-memory.",
    );
    for (reason, v) in [
        ("count", h.dropped.count),
        ("ttl", h.dropped.ttl),
        ("memory", h.dropped.memory),
    ] {
        let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {v}");
    }
    let name = "throng_recoveries_total";
    family(
        out,
        name,
        "counter",
        "Reconnecting subscribers answered: everything since their id (complete), or told it was not (incomplete).",
    );
    let _ = writeln!(out, "{name}{{result=\"complete\"}} {}", h.complete);
    let _ = writeln!(out, "{name}{{result=\"incomplete\"}} {}", h.incomplete);
}

fn render_broker(out: &mut String, b: &BrokerStats) {
    let rows: [(&str, &str, &str, String); 9] = [
        (
            "throng_broker_up",
            "gauge",
            "1 when the Redis link works and its subscriptions are confirmed.",
            u8::from(b.up).to_string(),
        ),
        (
            "throng_broker_outage_seconds",
            "gauge",
            "How long the current Redis outage has lasted (0 when up).",
            format!("{:.3}", b.outage_seconds),
        ),
        (
            "throng_broker_outage_seconds_total",
            "counter",
            "Seconds without Redis, over every outage so far (the current one included).",
            format!("{:.3}", b.past_outage_seconds + b.outage_seconds),
        ),
        (
            "throng_broker_reconnects_total",
            "counter",
            "Times the Redis link came back after it was lost.",
            b.reconnects.to_string(),
        ),
        (
            "throng_broker_connect_failures_total",
            "counter",
            "Failed connection attempts to Redis, and links lost.",
            b.connect_failures.to_string(),
        ),
        (
            "throng_broker_messages_received_total",
            "counter",
            "Messages that arrived from Redis for this node's subscribers.",
            b.received.to_string(),
        ),
        (
            "throng_broker_messages_dropped_total",
            "counter",
            "Messages from Redis no subscriber can get (not a throng channel name, or over --max-message).",
            b.dropped.to_string(),
        ),
        (
            "throng_broker_publish_failures_total",
            "counter",
            "Publishes answered 503 because Redis was unreachable or refused.",
            b.publish_failures.to_string(),
        ),
        (
            "throng_broker_subscriptions",
            "gauge",
            "Redis channels (channels mode) or patterns (pattern mode) this node subscribes to.",
            b.subscriptions.to_string(),
        ),
    ];
    for (name, kind, help, v) in rows {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }
    render_shards(out, &b.shards);
}

/// One per-shard family: its name, its help, its value from (up, seconds).
type ShardFamily = (&'static str, &'static str, fn(bool, f64) -> String);

/// A Redis Cluster's shards, one line each (nothing without a cluster).
fn render_shards(out: &mut String, shards: &[(String, bool, f64)]) {
    if shards.is_empty() {
        return;
    }
    let families: [ShardFamily; 2] = [
        (
            "throng_broker_shard_up",
            "1 when the link to this Redis Cluster master works and its subscriptions are confirmed.",
            |up, _| u8::from(up).to_string(),
        ),
        (
            "throng_broker_shard_state_seconds",
            "How long this Redis Cluster master has been up, or down.",
            |_, secs| format!("{secs:.3}"),
        ),
    ];
    for (name, help, value) in families {
        family(out, name, "gauge", help);
        for (addr, up, secs) in shards {
            let _ = writeln!(out, "{name}{{shard=\"{addr}\"}} {}", value(*up, *secs));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_workers_and_keeps_retired_counters() {
        let a = Counters::default();
        inc(&a.accepted);
        a.open.set(2);
        a.closed(CloseReason::SlowConsumer);
        a.slow_consumer("queue");
        a.fanout(Duration::from_micros(300), Duration::from_micros(250));
        a.fanout(Duration::from_secs(9), Duration::ZERO);
        let sa = a.snapshot(0, 10, 4096);
        let b = Counters::default();
        b.open.set(3);
        inc(&b.accepted);
        b.handshake_failed("version");
        let sb = b.snapshot(1, 11, 8192);
        let mut retired = Snapshot::default();
        let mut dead = sb.clone();
        dead.accepted = 5;
        retired.add_counters(&dead);
        let text = render(
            &[&sa, &sb],
            &retired,
            &SupervisorStats {
                published: 4,
                restarts: 1,
                workers: 2,
                ..SupervisorStats::default()
            },
        );
        for line in [
            "throng_connections_open 5",
            "throng_connections_accepted_total 7",
            "throng_connections_closed_total{reason=\"slow_consumer\"} 1",
            "throng_connections_closed_total{reason=\"peer_gone\"} 0",
            "throng_handshake_failures_total{reason=\"version\"} 2",
            "throng_slow_consumer_closes_total{cause=\"queue\"} 1",
            "throng_messages_published_total 4",
            "throng_fanout_duration_seconds_bucket{le=\"0.0005\"} 1",
            "throng_fanout_duration_seconds_bucket{le=\"2.5\"} 1",
            "throng_fanout_duration_seconds_bucket{le=\"+Inf\"} 2",
            "throng_fanout_duration_seconds_count 2",
            "throng_worker_rss_bytes{worker=\"1\",pid=\"11\"} 8192",
            "throng_worker_restarts_total 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // Every sample line belongs to a declared family.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            let base = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(
                text.contains(&format!("# TYPE {base} "))
                    || text.contains(&format!("# TYPE {name} ")),
                "{l}"
            );
        }
    }
}
