//! `throng hold`: open N WebSocket (or MQTT) connections at a set rate, hold
//! them, publish timestamped messages and measure every delivery.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use throng_host::units::{parse_duration, parse_size};
use throng_load::harness::clock::millis;
use throng_load::harness::progress::Progress;
use throng_load::hold::mqtt::MqttOptions;
use throng_load::hold::request::PublishRequest;
use throng_load::hold::sessions::SessionPlan;
use throng_load::hold::stamp::Stamp;
use throng_load::hold::target::{PublishTarget, WsTarget, parse_header, parse_sources};
use throng_load::hold::{self, Settings};
use throng_load::pacer::RateSpec;

use super::Format;

/// Arguments of `throng hold`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  throng hold ws://127.0.0.1:9000/news --connections 10000 --rate 2000/s \\
      --duration 30s
  throng hold ws://127.0.0.1:10000-10015/news -c 100000 \\
      --rate 100/s..20000/s --publish http://127.0.0.1:9000/publish/news \\
      --publish-rate 10/s --duration 1m --output run.jsonl
  throng hold ws://10.0.0.5:9000/news -c 50000 \\
      --source-ips 10.0.1.1-10.0.1.4 --publish redis://10.0.0.6:6379
  throng hold wss://localhost:9443/news -c 10000 --tls-ca ca.pem \\
      --publish http://127.0.0.1:9000/publish/news
  throng hold ws://10.0.0.5:9000/news -c 1000 \\
      --publish rediss://bob:secret@10.0.0.6:6380 --publish-tls-ca ca.pem
  throng hold 'mqtt://127.0.0.1:1883/sensors/+/temp' -c 5000 --qos 1 \\
      --publish mqtt://127.0.0.1:1883/sensors/1/temp --messages 100
  throng hold 'mqtt://127.0.0.1:1883/sensors/+/temp' -c 1000 --qos 1 \\
      --publish 'mqtt://127.0.0.1:1883/sensors/%i/temp' --publishers 200 \\
      --publish-interval 1s --mqtt-sessions 50 --duration 1m

Exit status: 0 when at most --max-connect-errors connections failed, at most
--max-lost messages were lost, every message was published (both 0 by
default), every --threshold held and the --mqtt-sessions clients found their
sessions kept and lost nothing; 1 otherwise, with the reasons on stderr; 2 for
bad arguments or a run that could not start.

Connection i goes to worker i % workers, source address i % sources and
target port (i / sources) % ports. The run opens every connection on a
schedule fixed in advance (open model): connect latency counts from the
intended start, so a stalled server cannot hide its stall, and the harness
reports its own lag when it falls behind.")]
pub(crate) struct Args {
    /// Target: ws://HOST:PORT/<channel>, or a port range ws://HOST:10000-10015/<channel>;
    /// wss://... for TLS (see --tls-ca, --tls-insecure). MQTT subscribers:
    /// mqtt://HOST:PORT/<topic filter> (+ and # are MQTT wildcards; quote them for the shell),
    /// mqtts://... for TLS. Server-Sent Events subscribers: sse://HOST:PORT/<channel>
    /// (GET with Accept: text/event-stream), sses://... for TLS. The root path
    /// (ws://HOST:PORT/) is a target too: a server that pushes to every client.
    #[arg(value_name = "URL", required_unless_present = "worker")]
    url: Option<String>,

    /// A header for the upgrade (or the event stream's GET): 'Cookie: s=1',
    /// 'Authorization: Bearer ...'. Repeatable.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,

    /// The WebSocket subprotocol to ask for (Sec-WebSocket-Protocol).
    #[arg(long, value_name = "NAME")]
    subprotocol: Option<String>,

    /// Fail a held connection that receives nothing, not even a ping, for
    /// this long (closed.read_timeout; the run exits 1): 30s, 2m. Checked
    /// every half of it. Default: never.
    #[arg(long, value_parser = parse_duration)]
    read_timeout: Option<Duration>,

    /// Where messages the server makes on its own say when they were sent:
    /// json:FIELD (a JSON object's field), number (a number the message
    /// starts with), or throng (only throng's own messages; the default).
    /// A Unix time in s, ms, µs or ns, told by its magnitude. Each such
    /// message is told apart by its JSON `seq`, else its stamp (else, for
    /// one without a stamp, its bytes): its fan-out spread, first to last
    /// subscriber over every worker, is in the summary.
    #[arg(long, value_name = "FORMAT", default_value = "throng")]
    stamp: Stamp,

    /// Connections to open and hold.
    #[arg(short = 'c', long, default_value_t = 1000)]
    connections: u64,

    /// New connections per second: 2000/s, 5k/s, a linear ramp 100/s..5000/s
    /// (which ends as the last connection is due), or stages
    /// RATE[..RATE]@TIME,... (100/s@1m,100/s..2000/s@2m: each for its time, the
    /// last rate going on until every connection is due).
    #[arg(short, long, default_value = "1000/s")]
    rate: RateSpec,

    /// How long to hold once every connection is open or failed (30s, 5m); default: until Ctrl-C.
    #[arg(short, long, value_parser = parse_duration)]
    duration: Option<Duration>,

    /// Source addresses: a range 127.0.0.2-127.0.0.60 and/or a comma list.
    /// Default on loopback: enough of 127.0.0.2.. (at least 4); elsewhere the kernel picks.
    #[arg(long, value_name = "LIST")]
    source_ips: Option<String>,

    /// Worker processes. Default: one per core, or more when the open-file limit needs it.
    #[arg(short, long)]
    workers: Option<u32>,

    /// Publish timestamped messages: http://HOST:PORT/publish/<channel> (https:// for TLS, see
    /// --publish-tls-ca), or Redis PUBLISH with
    /// redis://[user:password@]HOST:PORT[/DB] (AUTH as that user; escape @ : / in the password
    /// as %40 %3A %2F), or rediss://... for TLS to Redis (see --publish-tls-ca), or an MQTT
    /// PUBLISH with mqtt://HOST:PORT/<topic> (mqtts:// for TLS) at --qos.
    #[arg(long, value_name = "URL")]
    publish: Option<String>,

    /// --publish https://, rediss:// or mqtts://: PEM file of the CA certificate(s) that signed the
    /// publish endpoint's certificate (which must name the URL's host). Default: the system bundle
    /// /etc/ssl/certs/ca-certificates.crt.
    #[arg(long, value_name = "FILE", requires = "publish")]
    publish_tls_ca: Option<PathBuf>,

    /// --publish https://, rediss:// or mqtts://: do not check the publish endpoint's certificate at all
    /// (trials with a self-signed certificate only).
    #[arg(long, requires = "publish", conflicts_with = "publish_tls_ca")]
    publish_tls_insecure: bool,

    /// Messages per second to publish (over every --publishers client).
    #[arg(long, default_value = "1/s")]
    publish_rate: RateSpec,

    /// Publishing clients, each on its own connection with its own client id
    /// (<prefix>publisher<n>), sharing --publish-rate and spread evenly
    /// (emqtt-bench's pub -c N). In an mqtt:// topic, %i is each client's
    /// number from 1 (sensors/%i/temp); the subscribers' filter must match
    /// every client's topic (sensors/+/temp). With several, the broker may
    /// deliver two clients' messages in either order: a message overtaken by
    /// another client's is counted out of order, not lost.
    #[arg(long, default_value_t = 1, value_name = "N", requires = "publish",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    publishers: u32,

    /// Each publishing client sends one message every DURATION (emqtt-bench's
    /// -I; 100ms, 1s): the publish rate is then --publishers / DURATION.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          requires = "publish", conflicts_with = "publish_rate")]
    publish_interval: Option<Duration>,

    /// Publish this many messages, then end once every connection has them (or
    /// deliveries stop); without it, publishing goes on until --duration ends.
    #[arg(long, value_name = "N", requires = "publish")]
    messages: Option<u64>,

    /// Timeout of one publish call (connect, send, answer). A message whose answer
    /// is late still counts as published (its answer as 'unanswered').
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    publish_timeout: Duration,

    /// Size of each published message (64, 1k, ...); never smaller than its header.
    #[arg(long, default_value = "64", value_parser = parse_size)]
    message_size: usize,

    /// Redis channel prefix: messages go to <prefix><channel>.
    #[arg(long, default_value = "throng:")]
    redis_prefix: String,

    /// TCP connect timeout.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    connect_timeout: Duration,

    /// Timeout of the WebSocket upgrade after TCP connect (wss://: of the TLS handshake, then of the
    /// upgrade; mqtt://: of CONNECT and SUBSCRIBE to SUBACK; sse://: of the GET to its 200).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    handshake_timeout: Duration,

    /// How long to wait for the server's close frame at the end (mqtt://: for the broker to close
    /// after our DISCONNECT; sse:// connections close at once).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    close_timeout: Duration,

    /// Largest message accepted; a bigger one closes the connection with 1009.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    max_message: usize,

    /// Exit 1 when more than this many connections fail to open: an alias of
    /// --threshold 'connect_errors<=N'.
    #[arg(long, default_value_t = 0, value_name = "N")]
    max_connect_errors: u64,

    /// Exit 1 when more than this many messages are lost (over all connections):
    /// an alias of --threshold 'lost<=N'.
    #[arg(long, default_value_t = 0, value_name = "N")]
    max_lost: u64,

    /// Exit 1 unless FIGURE OP VALUE holds at the end (repeatable):
    /// 'lost==0', 'p99<100ms' (delivery), 'p99.9<1s', 'connect_p99<1s',
    /// 'publish_p99<50ms', 'loss_rate<0.1%', 'connect_rate>=900/s'. Figures:
    /// p50 p75 p90 p95 p99 p99.9 mean min max of delivery, connect_, publish_,
    /// pushed_; loss_rate; connect_rate; lost, connect_errors, duplicated,
    /// out_of_order, received, opened, publish_errors.
    #[arg(long, value_name = "EXPR", value_parser = hold_threshold)]
    threshold: Vec<throng_load::threshold::Threshold>,

    /// Stop the run once a threshold can no longer pass: a count already
    /// over its bound (lost==0 after a loss), or a max already passed.
    /// --max-connect-errors and --max-lost (0 unless given) are thresholds too.
    #[arg(long)]
    abort_on_fail: bool,

    /// Append per-second results (throng result-file format) to FILE.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Final summary as text or json (JSON on stdout; progress then goes to stderr).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// The same as --format json.
    #[arg(long, conflicts_with = "format")]
    json: bool,

    /// Fit the run onto this machine (workers, source addresses, local ports) and print
    /// the plan, then exit without connecting.
    #[arg(long)]
    dry_run: bool,

    #[command(flatten)]
    mqtt: MqttArgs,

    #[command(flatten)]
    client: super::client::ClientArgs,

    #[command(flatten)]
    agents: super::agent::RunArgs,
}

/// How MQTT subscribers and the MQTT publisher connect (mqtt:// URLs only).
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "MQTT (mqtt:// and mqtts:// URLs)")]
pub(crate) struct MqttArgs {
    /// QoS of the subscriptions and of --publish mqtt://: 0 (at most once), 1 (at least
    /// once, each delivery acknowledged with PUBACK) or 2 (exactly once: PUBREC, PUBREL,
    /// PUBCOMP).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    qos: u8,

    /// CONNECT's keep-alive: each subscriber sends PINGREQ every half of it (0: no keep-alive).
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = parse_duration)]
    mqtt_keepalive: Duration,

    /// Protocol version: 3.1.1 or 5.
    #[arg(long, default_value = "3.1.1", value_parser = ["3.1.1", "5"])]
    mqtt_version: String,

    /// Client ids are this followed by the connection's number (the publisher's: followed
    /// by "publisher", "publisher<n>" with --publishers; --mqtt-sessions clients':
    /// "session<n>"). Default: throng-<process id>-, unique per run on one machine.
    #[arg(long, value_name = "PREFIX")]
    client_id_prefix: Option<String>,

    /// CONNECT's user name.
    #[arg(long)]
    username: Option<String>,

    /// CONNECT's password (with a broker that checks tokens, the token).
    #[arg(long)]
    password: Option<String>,

    /// Connect only: CONNECT and keep-alive, no SUBSCRIBE (what idle devices cost a
    /// broker). Not with --publish: nothing would be received.
    #[arg(long)]
    mqtt_connect_only: bool,

    /// Persistent-session clients beside the held subscribers: they first connect at
    /// --rate, as the subscribers do; each keeps a session
    /// (3.1.1 clean session 0; 5.0 Clean Start 0 with --mqtt-session-expiry), is online
    /// for --mqtt-session-online, goes away (DISCONNECT) for --mqtt-session-away, and
    /// returns, again and again. Each return checks the broker kept the session and
    /// measures the messages published while it was away: delivered on return, none
    /// lost, none twice (the run fails otherwise; twice only at QoS 2). Needs --qos 1 or 2
    /// (a broker keeps no QoS 0 message) and an mqtt:// URL.
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=10_000))]
    mqtt_sessions: u32,

    /// How long each --mqtt-sessions client stays connected between two absences.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_duration)]
    mqtt_session_online: Duration,

    /// How long each --mqtt-sessions client stays away.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = parse_duration)]
    mqtt_session_away: Duration,

    /// 5.0: the Session Expiry Interval the --mqtt-sessions clients ask for (whole
    /// seconds); it must outlast --mqtt-session-away.
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = parse_duration)]
    mqtt_session_expiry: Duration,
}

impl MqttArgs {
    /// The persistent-session clients, when asked for; checked against
    /// the target and the QoS.
    pub(crate) fn sessions(&self, target: &WsTarget) -> anyhow::Result<Option<SessionPlan>> {
        if self.mqtt_sessions == 0 {
            return Ok(None);
        }
        anyhow::ensure!(
            target.mqtt && !target.tls,
            "--mqtt-sessions needs an mqtt:// URL (mqtts:// is not supported for them yet)"
        );
        anyhow::ensure!(
            self.qos > 0,
            "--mqtt-sessions needs --qos 1 or 2: a broker keeps no QoS 0 message for a client away"
        );
        anyhow::ensure!(
            !self.mqtt_connect_only,
            "--mqtt-sessions clients subscribe: not with --mqtt-connect-only"
        );
        anyhow::ensure!(
            !self.mqtt_session_online.is_zero() && !self.mqtt_session_away.is_zero(),
            "--mqtt-session-online and --mqtt-session-away must be above 0"
        );
        let expiry_s = u32::try_from(self.mqtt_session_expiry.as_secs())
            .context("--mqtt-session-expiry is too long")?;
        anyhow::ensure!(
            self.mqtt_version != "5" || self.mqtt_session_expiry > self.mqtt_session_away,
            "--mqtt-session-expiry ({expiry_s} s) must outlast --mqtt-session-away, or the broker ends each session while its client is away"
        );
        Ok(Some(SessionPlan {
            clients: self.mqtt_sessions,
            online: self.mqtt_session_online,
            away: self.mqtt_session_away,
            expiry_s,
        }))
    }

    /// The options, when a URL is mqtt://; an error if MQTT options were
    /// given for no MQTT URL.
    pub(crate) fn options(&self, used: bool) -> anyhow::Result<Option<MqttOptions>> {
        let keep_alive_s = u16::try_from(self.mqtt_keepalive.as_secs())
            .ok()
            .filter(|_| self.mqtt_keepalive.subsec_nanos() == 0)
            .context("--mqtt-keepalive is whole seconds, at most 65535s (18h12m15s)")?;
        let given = self.qos != 0
            || keep_alive_s != 60
            || self.mqtt_version != "3.1.1"
            || self.client_id_prefix.is_some()
            || self.username.is_some()
            || self.password.is_some()
            || self.mqtt_connect_only;
        if !used {
            anyhow::ensure!(
                !given,
                "--qos, --mqtt-keepalive, --mqtt-version, --client-id-prefix, --username, \
                 --password and --mqtt-connect-only are for mqtt:// or mqtts:// URLs"
            );
            return Ok(None);
        }
        let prefix = self
            .client_id_prefix
            .clone()
            .unwrap_or_else(|| format!("throng-{}-", std::process::id()));
        for (what, text) in [
            ("--client-id-prefix", Some(&prefix)),
            ("--username", self.username.as_ref()),
            ("--password", self.password.as_ref()),
        ] {
            if text.is_some_and(|t| t.len() > 60_000) {
                anyhow::bail!("{what} is over 60,000 bytes: MQTT strings hold at most 65,535");
            }
        }
        Ok(Some(MqttOptions {
            level: if self.mqtt_version == "5" { 5 } else { 4 },
            qos: self.qos,
            keep_alive_s,
            client_id_prefix: prefix,
            username: self.username.clone(),
            password: self.password.clone(),
            connect_only: self.mqtt_connect_only,
        }))
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.client.worker {
        hold::run_worker().context("worker")?;
        return Ok(ExitCode::SUCCESS);
    }
    let url = args.url.as_deref().context("a target URL is needed")?;
    let mut target: WsTarget = url.parse()?;
    target.headers = args
        .headers
        .iter()
        .map(|h| parse_header(h))
        .collect::<Result<_, _>>()?;
    target.subprotocol.clone_from(&args.subprotocol);
    target.stamp = args.stamp.clone();
    let publish_mqtt = args
        .publish
        .as_deref()
        .is_some_and(|p| p.starts_with("mqtt://") || p.starts_with("mqtts://"));
    let mqtt = args.mqtt.options(target.mqtt || publish_mqtt)?;
    anyhow::ensure!(
        !(args.mqtt.mqtt_connect_only && args.publish.is_some()),
        "--mqtt-connect-only subscribes to nothing: --publish would count every message lost"
    );
    let publish = match &args.publish {
        Some(url) => Some(publish(&args, url, mqtt.as_ref())?),
        None => None,
    };
    let json = args.json || args.format == Format::Json;
    let progress = Progress::choose(args.client.quiet, json);
    let settings = Settings {
        connect_timeout_ms: millis(args.connect_timeout),
        handshake_timeout_ms: millis(args.handshake_timeout),
        close_timeout_ms: millis(args.close_timeout),
        max_message: args.max_message,
        read_timeout_ms: args.read_timeout.map_or(0, millis),
        ..Settings::default()
    };
    let (remote, agents) = args
        .agents
        .hold(
            args.connections,
            &target,
            settings.interval_ns,
            args.workers.is_some() || args.source_ips.is_some(),
        )?
        .unzip();
    let mut prepared = hold::prepare_on(
        hold::Request {
            command_line: std::env::args().collect(),
            connections: args.connections,
            rate: args.rate,
            duration: args.duration,
            sources: args.source_ips.as_deref().map(parse_sources).transpose()?,
            workers: args.workers,
            settings,
            publish,
            tls: args.client.tls.options(target.tls)?,
            mqtt: mqtt.filter(|_| target.mqtt),
            sessions: args.mqtt.sessions(&target)?,
            target,
            output: args.output,
            progress,
            thresholds: hold::Thresholds {
                max_connect_errors: args.max_connect_errors,
                max_lost: args.max_lost,
                given: args.threshold,
                abort_on_fail: args.abort_on_fail,
            },
        },
        remote,
    )?;
    if let Some(m) = args.client.metrics()? {
        prepared.serve_metrics(m);
    }
    for line in prepared.lines() {
        progress.say(line);
    }
    if args.dry_run {
        progress.say(if agents.is_some() {
            "dry run: the plan fits the agents; nothing started"
        } else {
            "dry run: the plan fits this machine; nothing started"
        });
        return Ok(ExitCode::SUCCESS);
    }
    let (summary, failed) = prepared.run().context("hold")?;
    super::agent::conclude(
        json.then(|| serde_json::to_value(&summary)).transpose()?,
        || hold::render(&summary),
        summary.start_unix_ns,
        agents.as_deref(),
        failed,
        "throng hold: FAIL: ",
    )
}

/// `--publish` and its TLS trust, its rate, size, Redis prefix and MQTT options.
fn publish(args: &Args, url: &str, mqtt: Option<&MqttOptions>) -> anyhow::Result<PublishRequest> {
    let mut target: PublishTarget = url.parse()?;
    if let (PublishTarget::Mqtt { options, .. }, Some(m)) = (&mut target, mqtt) {
        options.clone_from(m);
    }
    let warning = target.set_trust(args.publish_tls_ca.clone(), args.publish_tls_insecure)?;
    if let Some(w) = warning {
        eprintln!("throng: WARNING: {w}");
    }
    let rate = match args.publish_interval {
        Some(every) => {
            anyhow::ensure!(!every.is_zero(), "--publish-interval must be above 0");
            RateSpec::Constant(f64::from(args.publishers) / every.as_secs_f64())
        }
        None => args.publish_rate,
    };
    Ok(PublishRequest {
        target,
        rate,
        clients: args.publishers,
        message_size: args.message_size,
        redis_prefix: args.redis_prefix.clone(),
        messages: args.messages,
        timeout: args.publish_timeout,
    })
}

/// `--threshold`: one expression on hold's figures.
fn hold_threshold(text: &str) -> Result<throng_load::threshold::Threshold, String> {
    throng_load::threshold::Threshold::parse(text, &hold::figures::FIGURES)
        .map_err(|e| e.to_string())
}
