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

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::io::{Read as _, Write as _};
use std::net::ToSocketAddrs as _;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use throng_proto::resp::{self, Push, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use crate::channel;

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

/// A parsed `redis://[user:password@]HOST[:PORT][/DB]`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port (6379 when not given).
    pub port: u16,
    /// ACL user name, if any.
    pub user: Option<String>,
    /// Password (for `AUTH`), if any. Never printed.
    pub password: Option<String>,
    /// Database number for `SELECT` (pub/sub itself ignores it).
    pub db: u32,
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Prints the URL with the password replaced by `***`.
impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("redis://")?;
        match (&self.user, &self.password) {
            (Some(u), Some(_)) => write!(f, "{u}:***@")?,
            (Some(u), None) => write!(f, "{u}@")?,
            (None, Some(_)) => f.write_str(":***@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}/{}", self.host, self.port, self.db)
        } else {
            write!(f, "{}:{}/{}", self.host, self.port, self.db)
        }
    }
}

impl FromStr for RedisUrl {
    type Err = String;
    fn from_str(url: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "invalid Redis URL '{}': {why} (expected redis://[user:password@]HOST[:PORT][/DB])",
                redact(url)
            )
        };
        if url.starts_with("rediss://") {
            return Err(bad("TLS to Redis (rediss://) is not supported yet"));
        }
        let rest = url
            .strip_prefix("redis://")
            .ok_or_else(|| bad("it must start with redis://"))?;
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (Some(a), r),
            None => (None, rest),
        };
        let (hostport, db) = match rest.split_once('/') {
            Some((h, "")) => (h, 0),
            Some((h, d)) => (
                h,
                d.parse()
                    .map_err(|_| bad("the database after '/' must be a number"))?,
            ),
            None => (rest, 0),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, p) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed '[' in host"))?;
            (h, p.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            Some(p) => p
                .parse()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad("the port must be a number 1-65535"))?,
            None => 6379,
        };
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => {
                let (u, p) = match a.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (a, None),
                };
                let u = percent_decode(u).ok_or_else(|| bad("bad %-escape in the user"))?;
                let p = match p {
                    Some(p) => {
                        Some(percent_decode(p).ok_or_else(|| bad("bad %-escape in the password"))?)
                    }
                    None => None,
                }
                .filter(|p| !p.is_empty());
                ((!u.is_empty()).then_some(u), p)
            }
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            user,
            password,
            db,
        })
    }
}

/// The URL with anything between `//` and `@` hidden, for error messages.
fn redact(url: &str) -> String {
    match (url.find("//"), url.rfind('@')) {
        (Some(s), Some(a)) if a > s => format!("{}***{}", &url[..s + 2], &url[a..]),
        _ => url.to_owned(),
    }
}

/// Decodes `%XX` escapes (for user names and passwords with `@`, `:` or `/`).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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
        format!(
            "redis {} (mode {}: {what}; publish PUBLISH {}<channel>{})",
            self.url,
            self.mode,
            self.prefix,
            if self.wait {
                "; --redis-wait: serve before Redis answers"
            } else {
                ""
            }
        )
    }

    /// The commands sent on every new connection before anything else
    /// (`AUTH`, `SELECT`, `PING`), and how many replies they get.
    fn hello(&self) -> (BytesMut, usize) {
        let mut out = BytesMut::new();
        let mut n = 0;
        if let Some(p) = &self.url.password {
            match &self.url.user {
                Some(u) => resp::encode_command(&mut out, &[b"AUTH", u.as_bytes(), p.as_bytes()]),
                None => resp::encode_command(&mut out, &[b"AUTH", p.as_bytes()]),
            }
            n += 1;
        }
        if self.url.db != 0 {
            resp::encode_command(&mut out, &[b"SELECT", self.url.db.to_string().as_bytes()]);
            n += 1;
        }
        resp::encode_command(&mut out, &[b"PING"]);
        (out, n + 1)
    }

    /// Checks, without a runtime, that Redis answers and accepts our
    /// credentials: what `throng serve` does before it starts, so a wrong
    /// URL is an error at once rather than a node that never delivers.
    pub fn probe(&self) -> Result<(), String> {
        let addrs: Vec<_> = (self.url.host.as_str(), self.url.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self.url.host))?
            .collect();
        let mut last = String::from("no address");
        for addr in addrs {
            match std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(mut s) => {
                    let _ = s.set_read_timeout(Some(REPLY_TIMEOUT));
                    let _ = s.set_write_timeout(Some(REPLY_TIMEOUT));
                    let (hello, replies) = self.hello();
                    s.write_all(&hello).map_err(|e| e.to_string())?;
                    let mut buf = BytesMut::new();
                    let dec = resp::Decoder::default();
                    for _ in 0..replies {
                        let v = loop {
                            if let Some(v) = dec.decode(&mut buf).map_err(|e| e.to_string())? {
                                break v;
                            }
                            let mut chunk = [0u8; 4096];
                            let n = s.read(&mut chunk).map_err(|e| e.to_string())?;
                            if n == 0 {
                                return Err("Redis closed the connection".into());
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        };
                        check_hello_reply(&v)?;
                    }
                    return Ok(());
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
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

fn check_hello_reply(v: &Value) -> Result<(), String> {
    match v {
        Value::Error(e) => Err(format!("Redis refused: {}", String::from_utf8_lossy(e))),
        _ => Ok(()),
    }
}

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
    },
    /// The node has subscribers of this channel now (channels mode).
    Subscribe(String),
    /// The node's last subscriber of this channel left (channels mode).
    Unsubscribe(String),
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
        /// Receivers (nodes subscribed, plus any other Redis client), or the reason.
        result: Result<u64, String>,
    },
    /// Channels this node is subscribed to now (after a (un)subscribe confirmation).
    Subscriptions(i64),
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
    Publish(u64, Instant),
    Ping(Instant),
}

impl Waiting {
    fn since(&self) -> Instant {
        match self {
            Self::Publish(_, t) | Self::Ping(t) => *t,
        }
    }
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
        }
    }

    async fn connect(&self) -> Result<(TcpStream, BytesMut), String> {
        let url = &self.settings.url;
        let s = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((url.host.as_str(), url.port)),
        )
        .await
        .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
        let _ = s.set_nodelay(true);
        let mut s = s;
        let (hello, replies) = self.settings.hello();
        s.write_all(&hello).await.map_err(|e| e.to_string())?;
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let dec = resp::Decoder::default();
        for _ in 0..replies {
            let v = tokio::time::timeout(REPLY_TIMEOUT, read_value(&mut s, &mut buf, &dec))
                .await
                .map_err(|_| format!("no answer within {REPLY_TIMEOUT:?}"))??;
            check_hello_reply(&v)?;
        }
        Ok((s, buf))
    }

    /// Connects both links, subscribes, and relays until something breaks.
    /// `Err`: the connection could not be made; `Ok(Lost)`: it broke later.
    async fn session(
        &mut self,
        cmds: &mut mpsc::UnboundedReceiver<Command>,
    ) -> Result<Session, String> {
        let (sub, mut sub_in) = self.connect().await?;
        let (publ, mut pub_in) = self.connect().await?;
        let (mut sub_rd, mut sub_wr) = sub.into_split();
        let (mut pub_rd, mut pub_wr) = publ.into_split();
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
        let mut sub_ping: Option<Instant> = None;
        let mut tick = tokio::time::interval(PING_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut permit: Option<OwnedSemaphorePermit> = None;
        let result: Result<Session, String> = loop {
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
                    &mut sub_ping,
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
                    match self.pushes(&dec, &mut sub_in, &mut permit, &mut confirming, &mut sub_ping) {
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
                    if let Err(e) = self.replies(&dec, &mut pub_in, &mut waiting) {
                        break Ok(Session::Lost(e));
                    }
                }
                cmd = cmds.recv() => {
                    let Some(cmd) = cmd else { break Ok(Session::Over) };
                    out.clear();
                    let sent = match cmd {
                        Command::Publish { tag, channel, payload } => {
                            let name = format!("{prefix}{channel}");
                            resp::encode_command(&mut out, &[b"PUBLISH", name.as_bytes(), &payload]);
                            waiting.push_back(Waiting::Publish(tag, Instant::now()));
                            write(&mut pub_wr, &out).await
                        }
                        Command::Subscribe(c) => {
                            let name = format!("{prefix}{c}");
                            self.channels.insert(c);
                            resp::encode_command(&mut out, &[b"SUBSCRIBE", name.as_bytes()]);
                            write(&mut sub_wr, &out).await
                        }
                        Command::Unsubscribe(c) => {
                            let name = format!("{prefix}{c}");
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
                        || (permit.is_some() && sub_ping.is_some_and(|t| t.elapsed() > REPLY_TIMEOUT));
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
                    if sub_ping.is_none() {
                        sub_ping = Some(Instant::now());
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
            if let Waiting::Publish(tag, _) = w {
                let _ = self.events.send(Event::Published {
                    tag,
                    result: Err(format!(
                        "the connection to Redis broke before it confirmed the publish ({why}); it may or may not have been delivered"
                    )),
                });
            }
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
        sub_ping: &mut Option<Instant>,
    ) -> Result<(), String> {
        while permit.is_some() {
            let Some(v) = dec
                .decode(buf)
                .map_err(|e| format!("subscriber connection: {e}"))?
            else {
                break;
            };
            // Anything arriving shows the connection is alive.
            *sub_ping = None;
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
                    if let Some(p) = permit.take() {
                        let _ = self.events.send(Event::Message {
                            channel: name.to_owned(),
                            payload,
                            permit: p,
                        });
                    }
                    *permit = self.in_flight.clone().try_acquire_owned().ok();
                }
                Some(Push::Subscription { kind, count, .. }) => {
                    if *confirming > 0 && (&kind[..] == b"subscribe" || &kind[..] == b"psubscribe")
                    {
                        *confirming -= 1;
                        if *confirming == 0 {
                            let _ = self.events.send(Event::Up);
                        }
                    }
                    let _ = self.events.send(Event::Subscriptions(count));
                }
                Some(Push::Pong) => *sub_ping = None,
                // A connection subscribed to nothing (channels mode, no
                // local subscribers) answers PING like any other.
                None if v == Value::Simple(Bytes::from_static(b"PONG")) => *sub_ping = None,
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

    /// Matches every whole reply in `buf` with what was waiting for it.
    fn replies(
        &self,
        dec: &resp::Decoder,
        buf: &mut BytesMut,
        waiting: &mut VecDeque<Waiting>,
    ) -> Result<(), String> {
        while let Some(v) = dec
            .decode(buf)
            .map_err(|e| format!("publisher connection: {e}"))?
        {
            match waiting.pop_front() {
                Some(Waiting::Publish(tag, _)) => {
                    let result = match v {
                        Value::Integer(n) => Ok(u64::try_from(n).unwrap_or(0)),
                        Value::Error(e) => {
                            Err(format!("Redis refused: {}", String::from_utf8_lossy(&e)))
                        }
                        other => Err(format!("unexpected Redis reply {other:?}")),
                    };
                    let _ = self.events.send(Event::Published { tag, result });
                }
                Some(Waiting::Ping(_)) => {}
                None => return Err(format!("Redis sent a reply nobody asked for: {v:?}")),
            }
        }
        Ok(())
    }
}

async fn read_value(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    dec: &resp::Decoder,
) -> Result<Value, String> {
    loop {
        if let Some(v) = dec.decode(buf).map_err(|e| e.to_string())? {
            return Ok(v);
        }
        buf.reserve(4096);
        match s.read_buf(buf).await {
            Ok(0) => return Err("Redis closed the connection".into()),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

async fn write(w: &mut tokio::net::tcp::OwnedWriteHalf, bytes: &[u8]) -> Result<(), String> {
    match tokio::time::timeout(REPLY_TIMEOUT, w.write_all(bytes)).await {
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
    fn urls() {
        let u: RedisUrl = "redis://127.0.0.1:6380/2".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port, u.db), ("127.0.0.1", 6380, 2));
        assert_eq!(u.user, None);
        let u: RedisUrl = "redis://alice:s%40cret%3A1@redis.local".parse().unwrap();
        assert_eq!(u.user.as_deref(), Some("alice"));
        assert_eq!(u.password.as_deref(), Some("s@cret:1"));
        assert_eq!((u.port, u.db), (6379, 0));
        assert_eq!(u.to_string(), "redis://alice:***@redis.local:6379/0");
        let u: RedisUrl = "redis://:pw@[::1]:7000/".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 7000));
        assert_eq!((u.user, u.password.as_deref()), (None, Some("pw")));
        for bad in [
            "http://x",
            "rediss://x",
            "redis://",
            "redis://h:0",
            "redis://h:99999",
            "redis://h/x",
            "redis://u:%zz@h",
        ] {
            assert!(bad.parse::<RedisUrl>().is_err(), "{bad}");
        }
        let e = "redis://u:topsecret@h:1/x".parse::<RedisUrl>().unwrap_err();
        assert!(!e.contains("topsecret"), "{e}");
    }

    #[test]
    fn pattern_escapes_glob_characters() {
        let s = |prefix: &str| RedisSettings {
            url: "redis://h".parse().unwrap(),
            prefix: prefix.into(),
            mode: RedisMode::Pattern,
            wait: false,
        };
        assert_eq!(s("throng:").pattern(), "throng:*");
        assert_eq!(s("a*b?[c]\\").pattern(), "a\\*b\\?\\[c\\]\\\\*");
        assert_eq!(s("").pattern(), "*");
    }

    #[test]
    fn hello_authenticates_and_selects() {
        let mut s = RedisSettings {
            url: "redis://bob:pw@h/3".parse().unwrap(),
            prefix: "t:".into(),
            mode: RedisMode::Channels,
            wait: false,
        };
        let (out, n) = s.hello();
        assert_eq!(n, 3);
        assert_eq!(
            &out[..],
            b"*3\r\n$4\r\nAUTH\r\n$3\r\nbob\r\n$2\r\npw\r\n*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n*1\r\n$4\r\nPING\r\n"
        );
        s.url = "redis://h".parse().unwrap();
        assert_eq!(s.hello().1, 1);
    }
}
