//! The Redis broker: many `throng serve` nodes share routing through Redis
//! pub/sub. The supervisor keeps one subscriber connection (what arrives is
//! relayed to its workers, exactly like the embedded relay) and one
//! publisher connection (`POST /publish` becomes `PUBLISH <prefix><channel>`).
//!
//! Everything runs in one task ([`run`]) that owns both connections, so
//! "up" means both work and the subscriptions are confirmed. When either
//! breaks, both are dropped and reconnected with backoff; subscribers stay
//! connected meanwhile, publishing is refused with the reason, and the
//! subscriptions (one pattern, or the set of channels with local
//! subscribers) are made again before the broker says it is up.
//!
//! Connections are made by [`throng_client::redis::open`]: plain TCP for
//! `redis://`, TLS for `rediss://` (the certificate checked against
//! [`RedisSettings::tls`]), then `AUTH`/`SELECT`/`PING`. Everything after that
//! is the same code over either kind of [`Stream`].

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use throng_client::link::Stream;
pub use throng_client::redis::RedisUrl;
pub use throng_client::trust::Trust;
use throng_proto::resp::{self, Push, Value};
use tokio::io::{AsyncReadExt as _, WriteHalf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use crate::channel;
use crate::history::{Kept, MessageId};
use crate::retained::{RetainedMessage, in_redis};
use crate::stream::{self, StreamLimits};

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
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pattern" => Ok(Self::Pattern),
            "channels" => Ok(Self::Channels),
            _ => Err(format!(
                "unknown Redis mode '{s}' (expected 'pattern' or 'channels')"
            )),
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
    pub fn probe(&self) -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime to check Redis: {e}"))?;
        rt.block_on(throng_client::redis::open(
            &self.url,
            self.tls.as_ref(),
            CONNECT_TIMEOUT,
        ))
        .map(drop)
        .map_err(|e| e.to_string())
    }
}

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long Redis may take to answer anything (a publish, a ping) before
/// the connection counts as lost.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an idle connection is pinged (a hung Redis is noticed within
/// this plus [`REPLY_TIMEOUT`]).
const PING_EVERY: Duration = Duration::from_secs(2);
/// First and largest pause between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Messages received from Redis and not yet delivered by every worker. At
/// the limit the node stops reading its subscriber connection: Redis then
/// buffers for us, and past its `client-output-buffer-limit pubsub` it drops
/// the connection, which we see, count and reconnect. Memory stays bounded
/// either way.
pub const MAX_IN_FLIGHT: usize = 256;
/// Channels per `SUBSCRIBE` command when resubscribing many.
const SUBSCRIBE_BATCH: usize = 512;

/// What the supervisor asks of the broker task.
#[derive(Debug)]
pub enum Command {
    /// `PUBLISH <prefix><channel> <payload>`; answered with [`Event::Published`] `tag`.
    Publish {
        /// The supervisor's tag for the answer.
        tag: u64,
        /// The channel (without prefix).
        channel: String,
        /// What to publish.
        payload: Bytes,
        /// Also the channel's retained message, at this QoS (an empty
        /// payload clears it).
        retain: Option<u8>,
    },
    /// The retained messages of the channels `filters` match; answered
    /// with [`Event::Retained`] `tag` once every message published before
    /// they were read has arrived.
    Retained {
        /// The supervisor's tag for the answer.
        tag: u64,
        /// A new subscription's filters.
        filters: Vec<String>,
    },
    /// The node has subscribers of this channel now (channels mode).
    Subscribe(String),
    /// The node's last subscriber of this channel left (channels mode).
    Unsubscribe(String),
    /// What the stream of `channel` kept after `since` (with history);
    /// answered with [`Event::Recovered`] `tag`.
    Recover {
        /// The supervisor's tag for the answer.
        tag: u64,
        /// The channel (without prefix).
        channel: String,
        /// The last id the subscriber saw.
        since: MessageId,
    },
}

/// What the broker task tells the supervisor.
#[derive(Debug)]
pub enum Event {
    /// Both connections work and the subscriptions are confirmed.
    Up,
    /// Connecting failed or the link was lost; the task retries after `retry_in`.
    Down {
        /// What went wrong.
        reason: String,
        /// When the next attempt is.
        retry_in: Duration,
    },
    /// A message arrived for local subscribers. `permit` is held until every
    /// worker has delivered it.
    Message {
        /// The channel, prefix removed, validated.
        channel: String,
        /// Its id in the channel's stream (with history; else none).
        id: MessageId,
        /// The payload.
        payload: Bytes,
        /// One of [`MAX_IN_FLIGHT`].
        permit: OwnedSemaphorePermit,
    },
    /// A message arrived that no subscriber can get (a channel name throng
    /// does not accept, or over `--max-message`).
    Dropped(String),
    /// The answer to a [`Command::Publish`]: Redis's receiver count, or why not.
    Published {
        /// The tag of the command.
        tag: u64,
        /// Receivers (nodes subscribed, plus any other Redis client) and
        /// the message's id (with history), or the reason.
        result: Result<(u64, MessageId), String>,
    },
    /// The answer to a [`Command::Recover`].
    Recovered {
        /// The tag of the command.
        tag: u64,
        /// Nothing after `since` can have been trimmed.
        complete: bool,
        /// What the stream kept after `since`.
        messages: Vec<Kept>,
    },
    /// Channels this node is subscribed to now (after a (un)subscribe confirmation).
    Subscriptions(i64),
    /// The answer to a [`Command::Retained`]: sent after every message
    /// Redis published before it read them.
    Retained {
        /// The tag of the command.
        tag: u64,
        /// One per matching channel.
        messages: Vec<RetainedMessage>,
        /// Left out over the answer's bound.
        cut: u64,
    },
    /// The shared retained store after a retained publish: channels in it,
    /// and how many it dropped past `--max-retained`.
    RetainedStore {
        /// Channels with a retained message.
        topics: u64,
        /// Dropped by this publish.
        dropped: u64,
    },
}

/// Runs the broker until the supervisor drops its command sender.
pub async fn run(
    settings: RedisSettings,
    max_message: usize,
    mut cmds: mpsc::UnboundedReceiver<Command>,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut link = Link {
        settings,
        max_message,
        channels: HashSet::new(),
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        events,
    };
    let mut backoff = BACKOFF_MIN;
    loop {
        let started = Instant::now();
        let reason = match link.session(&mut cmds).await {
            Ok(Session::Over) => return,
            Ok(Session::Lost(why)) => {
                // A link that worked for a while retries soon; one that
                // breaks as soon as it is made keeps backing off.
                if started.elapsed() > BACKOFF_MAX * 2 {
                    backoff = BACKOFF_MIN;
                }
                why
            }
            Err(why) => why,
        };
        // Jitter keeps a fleet of nodes from reconnecting in lockstep.
        let pause = backoff.mul_f64(0.5 + fastrand::f64() / 2.0);
        let _ = link.events.send(Event::Down {
            reason,
            retry_in: pause,
        });
        backoff = (backoff * 2).min(BACKOFF_MAX);
        let until = Instant::now() + pause;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => break,
                cmd = cmds.recv() => match cmd {
                    None => return,
                    Some(cmd) => link.while_down(cmd),
                },
            }
        }
    }
}

/// How a session that got connected ended.
enum Session {
    /// The supervisor is gone.
    Over,
    /// The link broke after it worked.
    Lost(String),
}

/// What is waiting for an answer on the publisher connection, in order.
enum Waiting {
    /// A publish; `true`: through the history script.
    Publish(u64, bool, Instant),
    Ping(Instant),
    /// Reply `step` (0, 1, 2) of a recovery's three ([`stream::recover`]).
    Recover(u64, MessageId, u8, Instant),
    /// A reply of no interest (`MULTI`'s `+OK`, `+QUEUED`).
    Skip(Instant),
    /// A retained publish's `EXEC` ([`in_redis::publish`]); `true`:
    /// through the history script.
    Exec(u64, bool, Instant),
    /// A read of the retained store for a new subscription's filters.
    Retained(u64, Vec<String>, Instant),
}

impl Waiting {
    fn since(&self) -> Instant {
        match self {
            Self::Publish(_, _, t)
            | Self::Ping(t)
            | Self::Recover(.., t)
            | Self::Skip(t)
            | Self::Exec(_, _, t)
            | Self::Retained(_, _, t) => *t,
        }
    }
}

/// A retained-store answer waiting for the subscriber connection's `PONG`:
/// the messages published before the store was read come before it.
type Barrier = (u64, Vec<RetainedMessage>, u64);

/// The PINGs on the subscriber connection.
#[derive(Default)]
struct SubPings {
    /// When the keep-alive's unanswered one went out (`None`: something
    /// arrived since).
    last: Option<Instant>,
    /// Every PING written, in order: the keep-alive's (`None`), and
    /// retained answers held behind them.
    pongs: VecDeque<Option<Barrier>>,
}

/// A recovery waiting for its channel's subscription to be confirmed
/// (channels mode): read before it, the stream could miss what is
/// published between the read and the subscription.
struct Parked {
    tag: u64,
    channel: String,
    since: MessageId,
}

struct Link {
    settings: RedisSettings,
    max_message: usize,
    /// Channels mode: the channels with local subscribers (what a new
    /// connection subscribes to).
    channels: HashSet<String>,
    in_flight: Arc<Semaphore>,
    events: mpsc::UnboundedSender<Event>,
}

impl Link {
    /// A command that arrives while there is no connection.
    fn while_down(&mut self, cmd: Command) {
        match cmd {
            Command::Publish { tag, .. } => {
                let _ = self.events.send(Event::Published {
                    tag,
                    result: Err("not connected to Redis (reconnecting)".into()),
                });
            }
            Command::Subscribe(c) => {
                self.channels.insert(c);
            }
            Command::Unsubscribe(c) => {
                self.channels.remove(&c);
            }
            Command::Recover { tag, .. } => self.unrecovered(tag),
            Command::Retained { tag, .. } => self.unretained(tag),
        }
    }

    /// Answers retained read `tag` with nothing: the store cannot be read now.
    fn unretained(&self, tag: u64) {
        let _ = self.events.send(Event::Retained {
            tag,
            messages: Vec::new(),
            cut: 0,
        });
    }

    /// Answers recovery `tag` with nothing, incomplete: the history cannot
    /// be read now.
    fn unrecovered(&self, tag: u64) {
        let _ = self.events.send(Event::Recovered {
            tag,
            complete: false,
            messages: Vec::new(),
        });
    }

    /// Writes recovery `tag`'s three commands and what waits for them.
    async fn recover(
        &self,
        w: &mut WriteHalf<Stream>,
        waiting: &mut VecDeque<Waiting>,
        p: Parked,
    ) -> Result<(), String> {
        let mut out = BytesMut::new();
        stream::recover(&mut out, &self.settings.prefix, &p.channel, p.since);
        let now = Instant::now();
        for step in 0..3 {
            waiting.push_back(Waiting::Recover(p.tag, p.since, step, now));
        }
        write(w, &out).await
    }

    /// One connection, greeted: plain or TLS as the URL says.
    async fn connect(&self) -> Result<(Stream, BytesMut), String> {
        throng_client::redis::open(
            &self.settings.url,
            self.settings.tls.as_ref(),
            CONNECT_TIMEOUT,
        )
        .await
        .map_err(|e| e.to_string())
    }

    /// Connects both links, subscribes, and relays until something breaks.
    /// `Err`: the connection could not be made; `Ok(Lost)`: it broke later.
    async fn session(
        &mut self,
        cmds: &mut mpsc::UnboundedReceiver<Command>,
    ) -> Result<Session, String> {
        let (sub, mut sub_in) = self.connect().await?;
        let (publ, mut pub_in) = self.connect().await?;
        let (mut sub_rd, mut sub_wr) = tokio::io::split(sub);
        let (mut pub_rd, mut pub_wr) = tokio::io::split(publ);
        let prefix = self.settings.prefix.clone();
        let mut out = BytesMut::new();
        // Confirmations still due before the node says it is up.
        let mut confirming = match self.settings.mode {
            RedisMode::Pattern => {
                resp::encode_command(
                    &mut out,
                    &[b"PSUBSCRIBE", self.settings.pattern().as_bytes()],
                );
                1
            }
            RedisMode::Channels => {
                let names: Vec<String> = self
                    .channels
                    .iter()
                    .map(|c| format!("{prefix}{c}"))
                    .collect();
                for batch in names.chunks(SUBSCRIBE_BATCH) {
                    let mut args: Vec<&[u8]> = vec![b"SUBSCRIBE"];
                    args.extend(batch.iter().map(String::as_bytes));
                    resp::encode_command(&mut out, &args);
                }
                names.len()
            }
        };
        write(&mut sub_wr, &out).await?;
        if confirming == 0 {
            let _ = self.events.send(Event::Up);
        }
        let dec = resp::Decoder::default();
        let mut waiting: VecDeque<Waiting> = VecDeque::new();
        let mut sub = SubPings::default();
        let mut tick = tokio::time::interval(PING_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut permit: Option<OwnedSemaphorePermit> = None;
        // Channels mode: subscriptions Redis confirmed, recoveries waiting
        // for theirs, channels just confirmed; replies of a recovery so far.
        let mut confirmed: HashSet<String> = HashSet::new();
        let mut parked: Vec<Parked> = Vec::new();
        let mut fresh: Vec<String> = Vec::new();
        let mut parts: Vec<Value> = Vec::new();
        let mut barriers: Vec<Barrier> = Vec::new();
        let result: Result<Session, String> = loop {
            if !barriers.is_empty() {
                out.clear();
                for b in barriers.drain(..) {
                    resp::encode_command(&mut out, &[b"PING"]);
                    sub.pongs.push_back(Some(b));
                }
                if let Err(e) = write(&mut sub_wr, &out).await {
                    break Ok(Session::Lost(e));
                }
            }
            for c in fresh.drain(..) {
                confirmed.insert(c);
            }
            if !parked.is_empty() {
                let (ready, wait): (Vec<Parked>, Vec<Parked>) = parked
                    .drain(..)
                    .partition(|p| confirmed.contains(&p.channel));
                parked = wait;
                for p in ready {
                    if let Err(e) = self.recover(&mut pub_wr, &mut waiting, p).await {
                        return Ok(Session::Lost(e));
                    }
                }
            }
            // Backpressure: read the subscriber connection only with a
            // permit in hand for the next message.
            if permit.is_none() {
                permit = self.in_flight.clone().try_acquire_owned().ok();
            }
            // Pushes read while we had no permit wait in the buffer: the
            // socket will not wake us for bytes already read.
            if permit.is_some()
                && !sub_in.is_empty()
                && let Err(e) = self.pushes(
                    &dec,
                    &mut sub_in,
                    &mut permit,
                    &mut confirming,
                    &mut sub,
                    &mut fresh,
                )
            {
                break Ok(Session::Lost(e));
            }
            let need_permit = permit.is_none();
            tokio::select! {
                p = self.in_flight.clone().acquire_owned(), if need_permit => {
                    permit = p.ok();
                }
                r = sub_rd.read_buf(&mut sub_in), if !need_permit => {
                    match r {
                        Ok(0) => break Ok(Session::Lost("Redis closed the subscriber connection".into())),
                        Err(e) => break Ok(Session::Lost(format!("subscriber connection: {e}"))),
                        Ok(_) => {}
                    }
                    match self.pushes(&dec, &mut sub_in, &mut permit, &mut confirming, &mut sub, &mut fresh) {
                        Ok(()) => {}
                        Err(e) => break Ok(Session::Lost(e)),
                    }
                }
                r = pub_rd.read_buf(&mut pub_in) => {
                    match r {
                        Ok(0) => break Ok(Session::Lost("Redis closed the publisher connection".into())),
                        Err(e) => break Ok(Session::Lost(format!("publisher connection: {e}"))),
                        Ok(_) => {}
                    }
                    if let Err(e) = self.replies(&dec, &mut pub_in, &mut waiting, &mut parts, &mut barriers) {
                        break Ok(Session::Lost(e));
                    }
                }
                cmd = cmds.recv() => {
                    let Some(cmd) = cmd else { break Ok(Session::Over) };
                    out.clear();
                    let sent = match cmd {
                        Command::Publish { tag, channel, payload, retain } => {
                            match self.settings.history {
                                Some(h) => stream::publish(&mut out, &prefix, &channel, &payload, h),
                                None => {
                                    let name = format!("{prefix}{channel}");
                                    resp::encode_command(&mut out, &[b"PUBLISH", name.as_bytes(), &payload]);
                                }
                            }
                            let kept = self.settings.history.is_some();
                            let now = Instant::now();
                            if let Some(qos) = retain {
                                let publish = out.split().freeze();
                                let max = self.settings.max_retained;
                                in_redis::publish(&mut out, &prefix, &channel, qos, &payload, max, &publish);
                                waiting.extend([Waiting::Skip(now), Waiting::Skip(now), Waiting::Skip(now)]);
                                waiting.push_back(Waiting::Exec(tag, kept, now));
                            } else {
                                waiting.push_back(Waiting::Publish(tag, kept, now));
                            }
                            write(&mut pub_wr, &out).await
                        }
                        Command::Retained { tag, filters } => {
                            in_redis::ask(&mut out, &prefix, &filters);
                            waiting.push_back(Waiting::Retained(tag, filters, Instant::now()));
                            write(&mut pub_wr, &out).await
                        }
                        Command::Recover { tag, channel, since } => {
                            let p = Parked { tag, channel, since };
                            if self.settings.mode == RedisMode::Channels && !confirmed.contains(&p.channel) {
                                parked.push(p);
                                Ok(())
                            } else {
                                self.recover(&mut pub_wr, &mut waiting, p).await
                            }
                        }
                        Command::Subscribe(c) => {
                            let name = format!("{prefix}{c}");
                            self.channels.insert(c);
                            resp::encode_command(&mut out, &[b"SUBSCRIBE", name.as_bytes()]);
                            write(&mut sub_wr, &out).await
                        }
                        Command::Unsubscribe(c) => {
                            let name = format!("{prefix}{c}");
                            confirmed.remove(&c);
                            parked.retain(|p| {
                                if p.channel == c {
                                    self.unrecovered(p.tag);
                                }
                                p.channel != c
                            });
                            self.channels.remove(&c);
                            resp::encode_command(&mut out, &[b"UNSUBSCRIBE", name.as_bytes()]);
                            write(&mut sub_wr, &out).await
                        }
                    };
                    if let Err(e) = sent {
                        break Ok(Session::Lost(e));
                    }
                }
                _ = tick.tick() => {
                    // An unanswered ping counts only while we read: behind a
                    // backlog we hold back (no permit), its answer waits unread.
                    let late = waiting.front().is_some_and(|w| w.since().elapsed() > REPLY_TIMEOUT)
                        || (permit.is_some() && sub.last.is_some_and(|t| t.elapsed() > REPLY_TIMEOUT));
                    if late {
                        break Ok(Session::Lost(format!("Redis did not answer within {REPLY_TIMEOUT:?}")));
                    }
                    out.clear();
                    resp::encode_command(&mut out, &[b"PING"]);
                    if waiting.is_empty() {
                        waiting.push_back(Waiting::Ping(Instant::now()));
                        if let Err(e) = write(&mut pub_wr, &out).await {
                            break Ok(Session::Lost(e));
                        }
                    }
                    if sub.last.is_none() {
                        sub.last = Some(Instant::now());
                        sub.pongs.push_back(None);
                        if let Err(e) = write(&mut sub_wr, &out).await {
                            break Ok(Session::Lost(e));
                        }
                    }
                }
            }
        };
        let why = match &result {
            Ok(Session::Lost(why)) => why.clone(),
            _ => "the server is stopping".into(),
        };
        for w in waiting {
            match w {
                Waiting::Publish(tag, ..) => {
                    let _ = self.events.send(Event::Published {
                        tag,
                        result: Err(format!(
                            "the connection to Redis broke before it confirmed the publish ({why}); it may or may not have been delivered"
                        )),
                    });
                }
                Waiting::Exec(tag, ..) => {
                    let _ = self.events.send(Event::Published {
                        tag,
                        result: Err(format!(
                            "the connection to Redis broke before it confirmed the publish ({why}); it may or may not have been delivered"
                        )),
                    });
                }
                Waiting::Recover(tag, _, 0, _) => self.unrecovered(tag),
                Waiting::Retained(tag, ..) => self.unretained(tag),
                _ => {}
            }
        }
        for p in parked {
            self.unrecovered(p.tag);
        }
        for (tag, ..) in barriers.into_iter().chain(sub.pongs.into_iter().flatten()) {
            self.unretained(tag);
        }
        result
    }

    /// Handles every whole push in `buf` from the subscriber connection.
    fn pushes(
        &self,
        dec: &resp::Decoder,
        buf: &mut BytesMut,
        permit: &mut Option<OwnedSemaphorePermit>,
        confirming: &mut usize,
        sub: &mut SubPings,
        fresh: &mut Vec<String>,
    ) -> Result<(), String> {
        while permit.is_some() {
            let Some(v) = dec
                .decode(buf)
                .map_err(|e| format!("subscriber connection: {e}"))?
            else {
                break;
            };
            // Anything arriving shows the connection is alive.
            sub.last = None;
            match Push::parse(&v) {
                Some(Push::Message { channel, payload }) => {
                    let name = channel
                        .strip_prefix(self.settings.prefix.as_bytes())
                        .and_then(|c| std::str::from_utf8(c).ok())
                        .and_then(|c| channel::validate(c).ok());
                    let Some(name) = name else {
                        let _ = self.events.send(Event::Dropped(format!(
                            "Redis channel '{}' does not name a throng channel",
                            String::from_utf8_lossy(&channel)
                        )));
                        continue;
                    };
                    if payload.len() > self.max_message {
                        let _ = self.events.send(Event::Dropped(format!(
                            "message of {} bytes on '{name}' is over --max-message",
                            payload.len()
                        )));
                        continue;
                    }
                    let (id, payload) = match self.settings.history {
                        Some(_) => stream::open(payload),
                        None => (MessageId::NONE, payload),
                    };
                    if let Some(p) = permit.take() {
                        let _ = self.events.send(Event::Message {
                            channel: name.to_owned(),
                            id,
                            payload,
                            permit: p,
                        });
                    }
                    *permit = self.in_flight.clone().try_acquire_owned().ok();
                }
                Some(Push::Subscription { kind, name, count }) => {
                    if &kind[..] == b"subscribe"
                        && let Some(c) = name
                            .as_ref()
                            .and_then(|n| n.strip_prefix(self.settings.prefix.as_bytes()))
                            .and_then(|c| std::str::from_utf8(c).ok())
                    {
                        fresh.push(c.to_owned());
                    }
                    if *confirming > 0 && (&kind[..] == b"subscribe" || &kind[..] == b"psubscribe")
                    {
                        *confirming -= 1;
                        if *confirming == 0 {
                            let _ = self.events.send(Event::Up);
                        }
                    }
                    let _ = self.events.send(Event::Subscriptions(count));
                }
                // A connection subscribed to nothing (channels mode, no
                // local subscribers) answers PING like any other.
                Some(Push::Pong) => self.pong(sub),
                None if v == Value::Simple(Bytes::from_static(b"PONG")) => {
                    self.pong(sub);
                }
                None => {
                    return Err(match v {
                        Value::Error(e) => {
                            format!("Redis refused: {}", String::from_utf8_lossy(&e))
                        }
                        other => format!("unexpected push from Redis: {other:?}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// A `PONG` on the subscriber connection: every message published
    /// before its `PING` has been read, so a retained answer held behind
    /// it goes now.
    fn pong(&self, sub: &mut SubPings) {
        sub.last = None;
        if let Some(Some((tag, messages, cut))) = sub.pongs.pop_front() {
            let _ = self.events.send(Event::Retained { tag, messages, cut });
        }
    }

    /// Matches every whole reply in `buf` with what was waiting for it;
    /// retained answers go to `barriers`, to wait for the subscriber
    /// connection to catch up.
    fn replies(
        &self,
        dec: &resp::Decoder,
        buf: &mut BytesMut,
        waiting: &mut VecDeque<Waiting>,
        parts: &mut Vec<Value>,
        barriers: &mut Vec<Barrier>,
    ) -> Result<(), String> {
        while let Some(v) = dec
            .decode(buf)
            .map_err(|e| format!("publisher connection: {e}"))?
        {
            match waiting.pop_front() {
                Some(Waiting::Publish(tag, true, _)) => {
                    let _ = self.events.send(Event::Published {
                        tag,
                        result: stream::published(v).map(|(id, n)| (n, id)),
                    });
                }
                Some(Waiting::Publish(tag, false, _)) => {
                    let result = match v {
                        Value::Integer(n) => Ok((u64::try_from(n).unwrap_or(0), MessageId::NONE)),
                        Value::Error(e) => {
                            Err(format!("Redis refused: {}", String::from_utf8_lossy(&e)))
                        }
                        other => Err(format!("unexpected Redis reply {other:?}")),
                    };
                    let _ = self.events.send(Event::Published { tag, result });
                }
                Some(Waiting::Recover(tag, since, step, _)) => {
                    parts.push(v);
                    if step == 2 {
                        let mut it = parts.drain(..);
                        let (Some(before), Some(after), Some(info)) =
                            (it.next(), it.next(), it.next())
                        else {
                            return Err("a recovery's replies came apart".into());
                        };
                        drop(it);
                        match stream::recovered(since, before, after, info) {
                            Ok((complete, messages)) => {
                                let _ = self.events.send(Event::Recovered {
                                    tag,
                                    complete,
                                    messages,
                                });
                            }
                            Err(e) => {
                                log!("throng: a recovery from Redis failed: {e}");
                                self.unrecovered(tag);
                            }
                        }
                    }
                }
                Some(Waiting::Exec(tag, kept, _)) => {
                    let result = in_redis::stored(v).and_then(|((topics, dropped), v)| {
                        let _ = self.events.send(Event::RetainedStore { topics, dropped });
                        if kept {
                            stream::published(v).map(|(id, n)| (n, id))
                        } else {
                            match v {
                                Value::Integer(n) => {
                                    Ok((u64::try_from(n).unwrap_or(0), MessageId::NONE))
                                }
                                other => Err(format!("unexpected Redis reply {other:?}")),
                            }
                        }
                    });
                    let _ = self.events.send(Event::Published { tag, result });
                }
                Some(Waiting::Retained(tag, filters, _)) => match in_redis::answer(&filters, v) {
                    Ok((messages, cut)) => barriers.push((tag, messages, cut)),
                    Err(e) => {
                        log!("throng: reading retained messages from Redis failed: {e}");
                        self.unretained(tag);
                    }
                },
                Some(Waiting::Ping(_) | Waiting::Skip(_)) => {}
                None => return Err(format!("Redis sent a reply nobody asked for: {v:?}")),
            }
        }
        Ok(())
    }
}

async fn write(w: &mut WriteHalf<Stream>, bytes: &[u8]) -> Result<(), String> {
    match tokio::time::timeout(REPLY_TIMEOUT, throng_client::link::write_all(w, bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("writing to Redis: {e}")),
        Err(_) => Err(format!(
            "Redis took no bytes for {REPLY_TIMEOUT:?} (not reading?)"
        )),
    }
}

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
