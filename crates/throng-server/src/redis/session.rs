//! The node's Redis session as a state machine without sockets or a clock:
//! handed the bytes each connection delivered, the supervisor's commands
//! and the time, it says what to write on which connection and what to
//! tell the supervisor ([`Output`]). The task in [`super::driver`] moves
//! the bytes; a test can drive it against a Redis of its own.
//!
//! What it keeps between a request and its answer: the publisher
//! connection's replies come in the order of its commands ([`Waiting`]);
//! a retained read is answered only after a `PONG` on the subscriber
//! connection, so every message published before the store was read is
//! relayed first; a recovery (channels mode) waits for its channel's
//! subscription to be confirmed; at most [`MAX_IN_FLIGHT`] messages are
//! relayed and not yet delivered, and the subscriber connection is not
//! read past that.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use throng_proto::resp::{self, Push, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::cluster::Redirect;
use super::envelope;
use super::error::{Conn, PublishError, SessionError};
use super::settings::{RedisMode, RedisSettings};
use crate::channel;
use crate::history::{Kept, MessageId};
use crate::relay::Publisher;
use crate::retained::{RetainedMessage, in_redis};
use crate::stream;

/// How long Redis may take to answer anything (a publish, a ping) before
/// the connection counts as lost.
pub(crate) const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an idle connection is pinged (a hung Redis is noticed within
/// this plus [`REPLY_TIMEOUT`]): the period of [`Session::on_tick`].
pub(crate) const PING_EVERY: Duration = Duration::from_secs(2);
/// Messages received from Redis and not yet delivered by every worker. At
/// the limit the node stops reading its subscriber connection: Redis then
/// buffers for us, and past its `client-output-buffer-limit pubsub` it drops
/// the connection, which we see, count and reconnect. Memory stays bounded
/// either way.
pub(crate) const MAX_IN_FLIGHT: usize = 256;
/// Channels per `SUBSCRIBE` command when resubscribing many.
const SUBSCRIBE_BATCH: usize = 512;

/// What the supervisor asks of the Redis session. Each request carries the
/// [`Publisher`] its answer goes to.
#[derive(Debug)]
pub(crate) enum Command {
    /// `PUBLISH <prefix><channel> <payload>`; answered with [`Event::Published`].
    Publish {
        /// Who asked.
        to: Publisher,
        /// The channel (without prefix).
        channel: String,
        /// What to publish.
        payload: Bytes,
        /// Also the channel's retained message, at this QoS (an empty
        /// payload clears it).
        retain: Option<u8>,
    },
    /// The retained messages of the channels `filters` match; answered
    /// with [`Event::Retained`] once every message published before they
    /// were read has arrived.
    Retained {
        /// Who asked.
        to: Publisher,
        /// A new subscription's filters.
        filters: Vec<String>,
    },
    /// An MQTT client id (its hash) connected to node `node`: said on
    /// [`envelope::CLAIMS`] for the other nodes; no answer.
    Claim {
        /// This node's tag.
        node: u64,
        /// The client id's hash.
        hash: u64,
        /// When it was claimed, in Unix nanoseconds.
        unix_ns: u64,
    },
    /// This node's members of MQTT shared subscriptions, said on
    /// [`envelope::SHARES`] ([`crate::shares::cluster::announcement`]); no answer.
    Announce(Bytes),
    /// A script of the MQTT sessions in Redis ([`super::mqtt_sessions`]),
    /// encoded; answered with [`Event::SessionReply`].
    Session {
        /// The sessions' nonce for the answer.
        nonce: u64,
        /// The command's bytes.
        bytes: Bytes,
    },
    /// The node has subscribers of this channel now (channels mode).
    Subscribe(String),
    /// The node's last subscriber of this channel left (channels mode).
    Unsubscribe(String),
    /// A cluster's retained publish, first half: the store (on its own
    /// master); once it answered, `then` (the publish) goes to the
    /// channel's master ([`Event::Stored`]), or the publisher is answered
    /// with the failure.
    Store {
        /// Who asked.
        to: Publisher,
        /// The channel (without prefix).
        channel: String,
        /// The retained message's QoS.
        qos: u8,
        /// The message (empty: clears the channel's retained message).
        payload: Bytes,
        /// The publish to send once stored.
        then: Box<Self>,
    },
    /// A cluster publish sent on after a `MOVED`; answered like a publish.
    Resend {
        /// Who asked.
        to: Publisher,
        /// The channel (without prefix).
        channel: String,
        /// What to publish.
        payload: Bytes,
        /// Redirects so far.
        hops: u8,
    },
    /// What the stream of `channel` kept after `since` (with history);
    /// answered with [`Event::Recovered`].
    Recover {
        /// Who asked.
        to: Publisher,
        /// The channel (without prefix).
        channel: String,
        /// The last id the subscriber saw.
        since: MessageId,
    },
}

/// What the Redis session tells the supervisor.
#[derive(Debug)]
pub(crate) enum Event {
    /// Both connections work and the subscriptions are confirmed.
    Up,
    /// Connecting failed or the link was lost; the task retries after `retry_in`.
    Down {
        /// What went wrong.
        reason: SessionError,
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
        /// What an MQTT publisher sealed beside it ([`envelope`]); `None`
        /// for a plain publish.
        meta: Option<envelope::Meta>,
        /// One of [`MAX_IN_FLIGHT`].
        permit: OwnedSemaphorePermit,
    },
    /// A message arrived that no subscriber can get (a channel name throng
    /// does not accept, or over `--max-message`).
    Dropped(String),
    /// A node (maybe this one) said an MQTT client id (its hash)
    /// connected to it ([`Command::Claim`]).
    Claimed {
        /// The claiming node's tag.
        node: u64,
        /// The client id's hash.
        hash: u64,
        /// When, in Unix nanoseconds by the claiming node's clock.
        unix_ns: u64,
    },
    /// A node (maybe this one) said its shared subscriptions' members
    /// ([`Command::Announce`]).
    Announced(Bytes),
    /// A park or take mark of the MQTT sessions in Redis (any node's),
    /// in its place among the messages ([`super::mqtt_sessions::MARKS`]).
    SessionMark {
        /// `p` (park) or `t` (take).
        kind: u8,
        /// The nonce of the park or take.
        nonce: u64,
    },
    /// The answer to a [`Command::Session`]: the script's reply, or why
    /// there is none.
    SessionReply {
        /// The nonce it carried.
        nonce: u64,
        /// The reply.
        reply: Result<Value, String>,
    },
    /// The answer to a [`Command::Publish`]: Redis's receiver count, or why not.
    Published {
        /// Who asked.
        to: Publisher,
        /// Receivers (nodes subscribed, plus any other Redis client) and
        /// the message's id (with history), or the reason.
        result: Result<(u64, MessageId), PublishError>,
    },
    /// The answer to a [`Command::Recover`].
    Recovered {
        /// Who asked.
        to: Publisher,
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
        /// Who asked.
        to: Publisher,
        /// One per matching channel.
        messages: Vec<RetainedMessage>,
        /// Left out over the answer's bound.
        cut: u64,
    },
    /// A cluster's master refused a publish with a redirect: the router
    /// sends it where it points.
    Redirected {
        /// Who asked.
        to: Publisher,
        /// The channel (without prefix).
        channel: String,
        /// What to publish.
        payload: Bytes,
        /// Redirects before this one.
        hops: u8,
        /// Where to.
        redirect: Redirect,
    },
    /// The cluster moved a channel's slot away from this master (an
    /// unasked `sunsubscribe`, or `MOVED` to an `SSUBSCRIBE`): the router
    /// subscribes on its new master.
    Lost(String),
    /// A cluster master confirmed a channel's `SSUBSCRIBE`.
    Placed(String),
    /// A cluster's retained store took a message: the publish to send now.
    Stored(Box<Command>),
    /// A cluster's shards, after one of them came up or went down.
    Shards(Vec<super::cluster::ShardState>),
    /// The shared retained store after a retained publish: channels in it,
    /// and how many it dropped past `--max-retained`.
    RetainedStore {
        /// Channels with a retained message.
        topics: u64,
        /// Dropped by this publish.
        dropped: u64,
    },
}

/// What the session wants done, in order.
#[derive(Debug)]
pub(crate) enum Output {
    /// Write these bytes on that connection.
    Write(Conn, Bytes),
    /// Tell the supervisor.
    Event(Event),
}

/// What is waiting for an answer on the publisher connection, in order.
enum Waiting {
    /// A publish; `true`: through the history script; on a cluster, what
    /// to send on when it is redirected.
    Publish(Publisher, bool, Option<Box<Resend>>, Instant),
    Ping(Instant),
    /// Reply `step` (0, 1, 2) of a recovery's three ([`stream::recover`]).
    Recover(Publisher, MessageId, u8, Instant),
    /// A reply of no interest (`MULTI`'s `+OK`, `+QUEUED`).
    Skip(Instant),
    /// A retained publish's `EXEC` ([`in_redis::publish`]); `true`:
    /// through the history script.
    Exec(Publisher, bool, Instant),
    /// A read of the retained store for a new subscription's filters.
    Retained(Publisher, Vec<String>, Instant),
    /// A cluster's store write, and the publish that follows it.
    Store(Publisher, Box<Command>, Instant),
    /// A script of the MQTT sessions, by its nonce.
    Session(u64, Instant),
}

impl Waiting {
    fn since(&self) -> Instant {
        match self {
            Self::Publish(_, _, _, t)
            | Self::Ping(t)
            | Self::Recover(.., t)
            | Self::Skip(t)
            | Self::Exec(_, _, t)
            | Self::Retained(_, _, t)
            | Self::Store(_, _, t)
            | Self::Session(_, t) => *t,
        }
    }
}

/// A cluster publish kept until its answer, in case it is redirected.
struct Resend {
    channel: String,
    payload: Bytes,
    hops: u8,
}

/// A retained-store answer waiting for the subscriber connection's `PONG`:
/// the messages published before the store was read come before it.
struct Barrier {
    to: Publisher,
    messages: Vec<RetainedMessage>,
    cut: u64,
}

/// A recovery waiting for its channel's subscription to be confirmed
/// (channels mode): read before it, the stream could miss what is
/// published between the read and the subscription.
struct Parked {
    to: Publisher,
    channel: String,
    since: MessageId,
}

/// The state of one pair of connections, from connect to loss.
#[derive(Default)]
struct Live {
    /// Subscriber bytes not decoded yet (read while no permit was in hand).
    sub_in: BytesMut,
    /// Publisher bytes not decoded yet (a reply in pieces).
    pub_in: BytesMut,
    /// Subscription confirmations still due before the node says it is up.
    confirming: usize,
    /// The publisher connection's commands still to be answered, in order.
    waiting: VecDeque<Waiting>,
    /// When the subscriber keep-alive's unanswered PING went out (`None`:
    /// something arrived since).
    ping_sent: Option<Instant>,
    /// Every PING written on the subscriber connection, in order: the
    /// keep-alive's (`None`), and retained answers held behind them.
    pongs: VecDeque<Option<Barrier>>,
    /// The place among [`MAX_IN_FLIGHT`] for the next message. Invariant:
    /// the subscriber connection is decoded (and read) only while `Some`.
    permit: Option<OwnedSemaphorePermit>,
    /// Channels mode: the subscriptions Redis confirmed.
    confirmed: HashSet<String>,
    /// Channels mode: recoveries waiting for their channel's confirmation.
    parked: Vec<Parked>,
    /// Of the subscriptions Redis counts, the [`envelope::CONTROL`]
    /// channels' (left out of the count the node reports).
    control: i64,
    /// The replies of the recovery being read, so far.
    parts: Vec<Value>,
    /// The publish script that queues for MQTT sessions was loaded on
    /// the publisher connection ([`super::mqtt_sessions::load`]).
    scripts_loaded: bool,
}

/// The Redis session: the state of both connections and of the requests
/// on them, fed by [`Session::on_bytes`], [`Session::on_command`] and
/// [`Session::on_tick`], emptied by [`Session::poll_output`].
pub(crate) struct Session {
    settings: RedisSettings,
    max_message: usize,
    /// Channels mode: the channels with local subscribers (what a new
    /// connection subscribes to).
    channels: HashSet<String>,
    in_flight: Arc<Semaphore>,
    dec: resp::Decoder,
    /// `None` while disconnected.
    live: Option<Live>,
    out: VecDeque<Output>,
}

impl Session {
    /// A session with no connection yet.
    pub(crate) fn new(settings: RedisSettings, max_message: usize) -> Self {
        Self {
            settings,
            max_message,
            channels: HashSet::new(),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            dec: resp::Decoder::default(),
            live: None,
            out: VecDeque::new(),
        }
    }

    /// What the session was made with.
    pub(crate) fn settings(&self) -> &RedisSettings {
        &self.settings
    }

    /// The next thing to do, if any.
    pub(crate) fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The places of [`MAX_IN_FLIGHT`]: a driver waits on it for
    /// [`Session::on_permit`] while [`Session::wants_permit`].
    pub(crate) fn in_flight(&self) -> Arc<Semaphore> {
        self.in_flight.clone()
    }

    /// Whether the session waits for a place before it reads more messages
    /// (the subscriber connection is then not to be read).
    pub(crate) fn wants_permit(&self) -> bool {
        self.live.as_ref().is_some_and(|l| l.permit.is_none())
    }

    /// Both connections are open and greeted: subscribes.
    pub(crate) fn on_connected(&mut self) {
        let prefix = &self.settings.prefix;
        let mut out = BytesMut::new();
        let confirming = match self.settings.mode {
            RedisMode::Pattern => {
                let pattern = self.settings.pattern();
                resp::encode_command(&mut out, &[b"PSUBSCRIBE", pattern.as_bytes()]);
                1
            }
            RedisMode::Channels => {
                let names: Vec<String> = self
                    .channels
                    .iter()
                    .map(|c| format!("{prefix}{c}"))
                    .collect();
                // A cluster takes several channels in one command only
                // when they share a slot: one each.
                let batch = if self.settings.sharded() {
                    1
                } else {
                    SUBSCRIBE_BATCH
                };
                for batch in names.chunks(batch) {
                    let mut args: Vec<&[u8]> = vec![self.verb(b"SUBSCRIBE")];
                    args.extend(batch.iter().map(String::as_bytes));
                    resp::encode_command(&mut out, &args);
                }
                names.len()
            }
        };
        self.live = Some(Live {
            confirming,
            permit: self.in_flight.clone().try_acquire_owned().ok(),
            ..Live::default()
        });
        self.write(Conn::Subscriber, out);
        if confirming == 0 {
            self.emit(Event::Up);
        }
    }

    /// A connection delivered `bytes`.
    pub(crate) fn on_bytes(
        &mut self,
        conn: Conn,
        bytes: &[u8],
        now: Instant,
    ) -> Result<(), SessionError> {
        let Some(live) = &mut self.live else {
            return Ok(());
        };
        match conn {
            Conn::Subscriber => {
                live.sub_in.extend_from_slice(bytes);
                self.pushes(now)
            }
            Conn::Publisher => {
                live.pub_in.extend_from_slice(bytes);
                self.replies()
            }
        }
    }

    /// A place for the next message is free (after [`Session::wants_permit`]):
    /// what was read meanwhile is decoded.
    pub(crate) fn on_permit(
        &mut self,
        permit: OwnedSemaphorePermit,
        now: Instant,
    ) -> Result<(), SessionError> {
        if let Some(live) = &mut self.live {
            live.permit = Some(permit);
        }
        self.pushes(now)
    }

    /// Time has passed (every [`PING_EVERY`]): a silent Redis is lost, an
    /// idle one is pinged.
    pub(crate) fn on_tick(&mut self, now: Instant) -> Result<(), SessionError> {
        let Some(live) = &mut self.live else {
            return Ok(());
        };
        let late = |t: Instant| now.saturating_duration_since(t) > REPLY_TIMEOUT;
        // An unanswered ping counts only while we read: behind a backlog
        // we hold back (no permit), its answer waits unread.
        if live.waiting.front().is_some_and(|w| late(w.since()))
            || (live.permit.is_some() && live.ping_sent.is_some_and(late))
        {
            return Err(SessionError::Silent(REPLY_TIMEOUT));
        }
        let mut ping = BytesMut::new();
        resp::encode_command(&mut ping, &[b"PING"]);
        let ping = ping.freeze();
        let on_pub = live.waiting.is_empty();
        if on_pub {
            live.waiting.push_back(Waiting::Ping(now));
        }
        let on_sub = live.ping_sent.is_none();
        if on_sub {
            live.ping_sent = Some(now);
            live.pongs.push_back(None);
        }
        if on_pub {
            self.out
                .push_back(Output::Write(Conn::Publisher, ping.clone()));
        }
        if on_sub {
            self.out.push_back(Output::Write(Conn::Subscriber, ping));
        }
        Ok(())
    }

    /// The supervisor asks for something.
    pub(crate) fn on_command(&mut self, cmd: Command, now: Instant) {
        let Some(cmd) = self.before(cmd, now) else {
            return;
        };
        let Some(live) = &mut self.live else {
            return self.while_down(cmd);
        };
        let prefix = &self.settings.prefix;
        let mut out = BytesMut::new();
        match cmd {
            Command::Publish {
                to,
                channel,
                payload,
                retain,
            } => {
                let sharded = self.settings.sharded();
                publish_command(&mut out, &self.settings, &channel, &payload);
                let kept = self.settings.history.is_some();
                if let Some(qos) = retain {
                    let publish = out.split().freeze();
                    let max = self.settings.max_retained;
                    in_redis::publish(&mut out, prefix, &channel, qos, &payload, max, &publish);
                    live.waiting.extend([
                        Waiting::Skip(now),
                        Waiting::Skip(now),
                        Waiting::Skip(now),
                    ]);
                    live.waiting.push_back(Waiting::Exec(to, kept, now));
                } else {
                    let resend = sharded.then(|| {
                        Box::new(Resend {
                            channel,
                            payload,
                            hops: 0,
                        })
                    });
                    live.waiting
                        .push_back(Waiting::Publish(to, kept, resend, now));
                }
                self.write(Conn::Publisher, out);
            }
            Command::Store {
                to,
                channel,
                qos,
                payload,
                then,
            } => {
                let max = self.settings.max_retained;
                in_redis::store(&mut out, prefix, &channel, qos, &payload, max, true);
                live.waiting.push_back(Waiting::Store(to, then, now));
                self.write(Conn::Publisher, out);
            }
            Command::Resend {
                to,
                channel,
                payload,
                hops,
            } => {
                publish_command(&mut out, &self.settings, &channel, &payload);
                let kept = self.settings.history.is_some();
                let resend = Box::new(Resend {
                    channel,
                    payload,
                    hops,
                });
                live.waiting
                    .push_back(Waiting::Publish(to, kept, Some(resend), now));
                self.write(Conn::Publisher, out);
            }
            Command::Retained { to, filters } => {
                in_redis::ask(&mut out, prefix, &filters, self.settings.sharded());
                live.waiting.push_back(Waiting::Retained(to, filters, now));
                self.write(Conn::Publisher, out);
            }
            Command::Recover { to, channel, since } => {
                let p = Parked { to, channel, since };
                // A subscriber's recovery waits for its channel's subscription,
                // so nothing falls between the read and the live messages; a
                // server API read (`GET /api/history`) has no such gap to close,
                // and on a node without subscribers of the channel no
                // subscription is ever coming.
                let api_read = p.to.request & crate::control::API_READ != 0;
                if self.settings.mode == RedisMode::Channels
                    && !api_read
                    && !live.confirmed.contains(&p.channel)
                {
                    live.parked.push(p);
                } else {
                    self.recover(p, now);
                }
            }
            Command::Claim {
                node,
                hash,
                unix_ns,
            } => {
                let claim = envelope::claim(node, hash, unix_ns);
                self.say(envelope::CLAIMS, &claim, now);
            }
            Command::Announce(payload) => self.say(envelope::SHARES, &payload, now),
            // Taken by `before`.
            Command::Session { .. } => {}
            Command::Subscribe(c) => {
                let name = format!("{prefix}{c}");
                self.channels.insert(c);
                resp::encode_command(&mut out, &[self.verb(b"SUBSCRIBE"), name.as_bytes()]);
                self.write(Conn::Subscriber, out);
            }
            Command::Unsubscribe(c) => {
                let name = format!("{prefix}{c}");
                live.confirmed.remove(&c);
                let (gone, parked): (Vec<Parked>, Vec<Parked>) =
                    live.parked.drain(..).partition(|p| p.channel == c);
                live.parked = parked;
                for p in gone {
                    self.unrecovered(p.to);
                }
                self.channels.remove(&c);
                resp::encode_command(&mut out, &[self.verb(b"UNSUBSCRIBE"), name.as_bytes()]);
                self.write(Conn::Subscriber, out);
            }
        }
    }

    /// What [`Self::on_command`] does first: a script of the MQTT sessions
    /// goes as it is; a publish that queues for them loads their script.
    fn before(&mut self, cmd: Command, now: Instant) -> Option<Command> {
        match cmd {
            Command::Session { nonce, bytes } => {
                match &mut self.live {
                    Some(live) => {
                        live.waiting.push_back(Waiting::Session(nonce, now));
                        self.out.push_back(Output::Write(Conn::Publisher, bytes));
                    }
                    None => self.while_down(Command::Session { nonce, bytes }),
                }
                None
            }
            Command::Publish { ref payload, .. } => {
                self.load_scripts(payload, now);
                Some(cmd)
            }
            other => Some(other),
        }
    }

    /// Loads the publish script that queues for MQTT sessions on the
    /// publisher connection before the first publish that uses it (on its
    /// own: not inside the MULTI of a retained publish).
    fn load_scripts(&mut self, payload: &Bytes, now: Instant) {
        let Some(live) = &mut self.live else {
            return;
        };
        if live.scripts_loaded || session_qos(&self.settings, payload).is_none() {
            return;
        }
        let mut load = BytesMut::new();
        super::mqtt_sessions::load(&mut load, self.settings.history.is_some());
        live.waiting.push_back(Waiting::Skip(now));
        live.scripts_loaded = true;
        self.write(Conn::Publisher, load);
    }

    /// The connections are gone (`why`): every request on them is
    /// answered with a failure, and the session waits for the next.
    pub(crate) fn on_closed(&mut self, why: &SessionError) {
        let Some(live) = self.live.take() else {
            return;
        };
        // Bytes meant for the connections that broke must not reach the next.
        self.out.retain(|o| matches!(o, Output::Event(_)));
        for w in live.waiting {
            match w {
                Waiting::Publish(to, ..) | Waiting::Exec(to, ..) | Waiting::Store(to, ..) => self
                    .emit(Event::Published {
                        to,
                        result: Err(PublishError::Unconfirmed(why.to_string())),
                    }),
                Waiting::Recover(to, _, 0, _) => self.unrecovered(to),
                Waiting::Retained(to, ..) => self.unretained(to),
                Waiting::Session(nonce, _) => self.emit(Event::SessionReply {
                    nonce,
                    reply: Err(why.to_string()),
                }),
                _ => {}
            }
        }
        for p in live.parked {
            self.unrecovered(p.to);
        }
        for b in live.pongs.into_iter().flatten() {
            self.unretained(b.to);
        }
    }

    /// A command that arrives while there is no connection.
    fn while_down(&mut self, cmd: Command) {
        match cmd {
            Command::Publish { to, .. }
            | Command::Resend { to, .. }
            | Command::Store { to, .. } => self.emit(Event::Published {
                to,
                result: Err(PublishError::NotConnected),
            }),
            Command::Subscribe(c) => {
                self.channels.insert(c);
            }
            Command::Unsubscribe(c) => {
                self.channels.remove(&c);
            }
            Command::Recover { to, .. } => self.unrecovered(to),
            Command::Retained { to, .. } => self.unretained(to),
            // Nobody to tell while Redis is away; a client that moves
            // meanwhile keeps both connections (docs/mqtt.md). Members are
            // said again every second.
            Command::Claim { .. } | Command::Announce(_) => {}
            Command::Session { nonce, .. } => self.emit(Event::SessionReply {
                nonce,
                reply: Err("Redis is not connected".into()),
            }),
        }
    }

    /// Publishes `payload` on control channel `channel` ([`envelope::CONTROL`]),
    /// its reply of no interest.
    fn say(&mut self, channel: &str, payload: &[u8], now: Instant) {
        let name = format!("{}{channel}", self.settings.prefix);
        let mut out = BytesMut::new();
        resp::encode_command(&mut out, &[self.verb(b"PUBLISH"), name.as_bytes(), payload]);
        let Some(live) = &mut self.live else {
            return;
        };
        live.waiting.push_back(Waiting::Skip(now));
        self.write(Conn::Publisher, out);
    }

    /// A (un)subscribe or publish command's name: `SSUBSCRIBE`,
    /// `SUNSUBSCRIBE` and `SPUBLISH` (sharded pub/sub) on a cluster.
    fn verb(&self, plain: &'static [u8]) -> &'static [u8] {
        match (self.settings.sharded(), plain) {
            (true, b"SUBSCRIBE") => b"SSUBSCRIBE",
            (true, b"UNSUBSCRIBE") => b"SUNSUBSCRIBE",
            (true, b"PUBLISH") => b"SPUBLISH",
            _ => plain,
        }
    }

    fn emit(&mut self, ev: Event) {
        self.out.push_back(Output::Event(ev));
    }

    fn write(&mut self, conn: Conn, bytes: BytesMut) {
        if !bytes.is_empty() {
            self.out.push_back(Output::Write(conn, bytes.freeze()));
        }
    }

    /// Answers a retained read with nothing: the store cannot be read now.
    fn unretained(&mut self, to: Publisher) {
        self.emit(Event::Retained {
            to,
            messages: Vec::new(),
            cut: 0,
        });
    }

    /// Answers a recovery with nothing, incomplete: the history cannot be
    /// read now.
    fn unrecovered(&mut self, to: Publisher) {
        self.emit(Event::Recovered {
            to,
            complete: false,
            messages: Vec::new(),
        });
    }

    /// Writes a recovery's three commands and what waits for them.
    fn recover(&mut self, p: Parked, now: Instant) {
        let Some(live) = &mut self.live else {
            return self.unrecovered(p.to);
        };
        let mut out = BytesMut::new();
        stream::recover(&mut out, &self.settings.prefix, &p.channel, p.since);
        for step in 0..3 {
            live.waiting
                .push_back(Waiting::Recover(p.to, p.since, step, now));
        }
        self.write(Conn::Publisher, out);
    }

    /// The next whole value `conn` delivered, if any; the subscriber
    /// connection's only while a permit is in hand.
    fn decode(&mut self, conn: Conn) -> Result<Option<Value>, SessionError> {
        let Some(live) = &mut self.live else {
            return Ok(None);
        };
        let buf = match conn {
            Conn::Subscriber if live.permit.is_none() => return Ok(None),
            Conn::Subscriber => &mut live.sub_in,
            Conn::Publisher => &mut live.pub_in,
        };
        self.dec
            .decode(buf)
            .map_err(|e| SessionError::Decode(conn, e))
    }

    /// Handles every whole push in the subscriber buffer while a permit is
    /// in hand.
    fn pushes(&mut self, now: Instant) -> Result<(), SessionError> {
        while let Some(v) = self.decode(Conn::Subscriber)? {
            // Anything arriving shows the connection is alive.
            if let Some(live) = &mut self.live {
                live.ping_sent = None;
            }
            match Push::parse(&v) {
                Some(Push::Message { channel, payload }) => self.message(&channel, payload),
                Some(Push::Subscription { kind, name, count }) => {
                    self.subscription(&kind, name.as_deref(), count, now);
                }
                // A connection subscribed to nothing (channels mode, no
                // local subscribers) answers PING like any other.
                Some(Push::Pong) => self.pong(),
                None if v == Value::Simple(Bytes::from_static(b"PONG")) => self.pong(),
                None if self.settings.sharded() && self.moved_away(&v) => {}
                None => {
                    return Err(match v {
                        Value::Error(e) => {
                            SessionError::Refused(String::from_utf8_lossy(&e).into_owned())
                        }
                        other => SessionError::UnexpectedPush(format!("{other:?}")),
                    });
                }
            }
        }
        Ok(())
    }

    /// A message pushed on `channel` (with the prefix): relayed with the
    /// permit in hand, or dropped with the reason.
    fn message(&mut self, channel: &[u8], payload: Bytes) {
        match channel.strip_prefix(self.settings.prefix.as_bytes()) {
            Some(c) if c == envelope::CLAIMS.as_bytes() => {
                return match envelope::open_claim(&payload) {
                    Some((node, hash, unix_ns)) => self.emit(Event::Claimed {
                        node,
                        hash,
                        unix_ns,
                    }),
                    None => self.emit(Event::Dropped("a malformed client id claim".into())),
                };
            }
            Some(c) if c == envelope::SHARES.as_bytes() => {
                return self.emit(Event::Announced(payload));
            }
            _ => {}
        }
        if channel.strip_prefix(self.settings.prefix.as_bytes())
            == Some(super::mqtt_sessions::MARKS.as_bytes())
        {
            return match super::mqtt_sessions::open_mark(&payload) {
                Some((kind, nonce)) => self.emit(Event::SessionMark { kind, nonce }),
                None => self.emit(Event::Dropped("a malformed session mark".into())),
            };
        }
        let name = channel
            .strip_prefix(self.settings.prefix.as_bytes())
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| channel::validate(c).ok());
        let Some(name) = name else {
            return self.emit(Event::Dropped(format!(
                "Redis channel '{}' does not name a throng channel",
                String::from_utf8_lossy(channel)
            )));
        };
        let (id, payload) = match self.settings.history {
            Some(_) => stream::open(payload),
            None => (MessageId::NONE, payload),
        };
        if payload.len() > self.max_message + envelope::SLACK {
            return self.emit(Event::Dropped(format!(
                "message of {} bytes on '{name}' is over --max-message",
                payload.len()
            )));
        }
        let (meta, payload) = match envelope::open(payload) {
            Ok(opened) => opened,
            Err(e) => return self.emit(Event::Dropped(format!("{e} (on '{name}')"))),
        };
        if payload.len() > self.max_message {
            return self.emit(Event::Dropped(format!(
                "message of {} bytes on '{name}' is over --max-message",
                payload.len()
            )));
        }
        let channel = name.to_owned();
        let Some(live) = &mut self.live else {
            return;
        };
        let Some(permit) = live.permit.take() else {
            return;
        };
        live.permit = self.in_flight.clone().try_acquire_owned().ok();
        self.emit(Event::Message {
            channel,
            id,
            payload,
            meta,
            permit,
        });
    }

    /// A (un)subscribe confirmation: the node is up once all of a new
    /// connection's are in, and a recovery parked for the channel goes.
    fn subscription(&mut self, kind: &[u8], name: Option<&[u8]>, count: i64, now: Instant) {
        let Some(live) = &mut self.live else {
            return;
        };
        let mut ready = Vec::new();
        let channel = name
            .and_then(|n| n.strip_prefix(self.settings.prefix.as_bytes()))
            .and_then(|c| std::str::from_utf8(c).ok());
        // Unasked: the cluster moved the channel's slot to another master
        // (this master no longer has it to subscribe again after a loss).
        if kind == b"sunsubscribe"
            && let Some(c) = channel
            && self.channels.remove(c)
        {
            live.confirmed.remove(c);
            self.out.push_back(Output::Event(Event::Lost(c.to_owned())));
        }
        if let Some(c) = channel
            && envelope::CONTROL.contains(&c)
        {
            live.control += match kind {
                b"subscribe" | b"ssubscribe" => 1,
                b"unsubscribe" | b"sunsubscribe" => -1,
                _ => 0,
            };
        }
        if kind == b"ssubscribe"
            && let Some(c) = channel
        {
            self.out
                .push_back(Output::Event(Event::Placed(c.to_owned())));
        }
        if (kind == b"subscribe" || kind == b"ssubscribe")
            && let Some(c) = name
                .and_then(|n| n.strip_prefix(self.settings.prefix.as_bytes()))
                .and_then(|c| std::str::from_utf8(c).ok())
        {
            live.confirmed.insert(c.to_owned());
            let (go, wait): (Vec<Parked>, Vec<Parked>) =
                live.parked.drain(..).partition(|p| p.channel == c);
            live.parked = wait;
            ready = go;
        }
        let mut up = false;
        if live.confirming > 0
            && (kind == b"subscribe" || kind == b"psubscribe" || kind == b"ssubscribe")
        {
            live.confirming -= 1;
            up = live.confirming == 0;
        }
        let count = count - live.control;
        if up {
            self.emit(Event::Up);
        }
        self.emit(Event::Subscriptions(count.max(0)));
        for p in ready {
            self.recover(p, now);
        }
    }

    /// An `SSUBSCRIBE` refused with `MOVED`/`ASK` (the map was stale):
    /// its channels of that slot are the router's to place elsewhere, and
    /// no confirmation is due for them. False when `v` is no redirect.
    fn moved_away(&mut self, v: &Value) -> bool {
        let Value::Error(e) = v else {
            return false;
        };
        let Some(r) = Redirect::parse(&String::from_utf8_lossy(e)) else {
            return false;
        };
        let prefix = &self.settings.prefix;
        let lost: Vec<String> = self
            .channels
            .iter()
            .filter(|c| super::cluster::slot(format!("{prefix}{c}").as_bytes()) == r.slot)
            .cloned()
            .collect();
        for c in lost {
            self.channels.remove(&c);
            if let Some(live) = &mut self.live {
                live.confirmed.remove(&c);
                if live.confirming > 0 {
                    live.confirming -= 1;
                    if live.confirming == 0 {
                        self.out.push_back(Output::Event(Event::Up));
                    }
                }
            }
            self.emit(Event::Lost(c));
        }
        true
    }

    /// A `PONG` on the subscriber connection: every message published
    /// before its `PING` has been read, so a retained answer held behind
    /// it goes now.
    fn pong(&mut self) {
        let Some(live) = &mut self.live else {
            return;
        };
        live.ping_sent = None;
        if let Some(Some(b)) = live.pongs.pop_front() {
            self.emit(Event::Retained {
                to: b.to,
                messages: b.messages,
                cut: b.cut,
            });
        }
    }

    /// Matches every whole reply in the publisher buffer with what was
    /// waiting for it.
    fn replies(&mut self) -> Result<(), SessionError> {
        while let Some(v) = self.decode(Conn::Publisher)? {
            let Some(live) = &mut self.live else {
                return Ok(());
            };
            if super::mqtt_sessions::lost_script(&v) {
                live.scripts_loaded = false;
            }
            match live.waiting.pop_front() {
                Some(Waiting::Publish(to, kept, resend, _)) => {
                    if let (Some(r), Value::Error(e)) = (resend, &v)
                        && let Some(redirect) = Redirect::parse(&String::from_utf8_lossy(e))
                    {
                        self.emit(Event::Redirected {
                            to,
                            channel: r.channel,
                            payload: r.payload,
                            hops: r.hops,
                            redirect,
                        });
                        continue;
                    }
                    let result = if kept {
                        stream::published(v).map(|(id, n)| (n, id))
                    } else {
                        receivers(v)
                    };
                    self.emit(Event::Published {
                        to,
                        result: result.map_err(PublishError::from),
                    });
                }
                Some(Waiting::Recover(to, since, step, _)) => {
                    live.parts.push(v);
                    if step == 2 {
                        let parts = std::mem::take(&mut live.parts);
                        self.recovered(to, since, parts)?;
                    }
                }
                Some(Waiting::Exec(to, kept, _)) => self.exec(to, kept, v),
                Some(Waiting::Store(to, then, _)) => match in_redis::figures(v) {
                    Ok((topics, dropped)) => {
                        self.emit(Event::RetainedStore { topics, dropped });
                        self.emit(Event::Stored(then));
                    }
                    Err(e) => self.emit(Event::Published {
                        to,
                        result: Err(e.into()),
                    }),
                },
                Some(Waiting::Retained(to, filters, _)) => match in_redis::answer(&filters, v) {
                    Ok((messages, cut)) => self.hold_behind_pong(Barrier { to, messages, cut }),
                    Err(e) => {
                        log!("throng: reading retained messages from Redis failed: {e}");
                        self.unretained(to);
                    }
                },
                Some(Waiting::Session(nonce, _)) => self.emit(Event::SessionReply {
                    nonce,
                    reply: Ok(v),
                }),
                Some(Waiting::Ping(_) | Waiting::Skip(_)) => {}
                None => return Err(SessionError::Unasked(format!("{v:?}"))),
            }
        }
        Ok(())
    }

    /// A recovery's three replies are in: its answer.
    fn recovered(
        &mut self,
        to: Publisher,
        since: MessageId,
        parts: Vec<Value>,
    ) -> Result<(), SessionError> {
        let mut it = parts.into_iter();
        let (Some(before), Some(after), Some(info)) = (it.next(), it.next(), it.next()) else {
            return Err(SessionError::RecoveryApart);
        };
        match stream::recovered(since, before, after, info) {
            Ok((complete, messages)) => self.emit(Event::Recovered {
                to,
                complete,
                messages,
            }),
            Err(e) => {
                log!("throng: a recovery from Redis failed: {e}");
                self.unrecovered(to);
            }
        }
        Ok(())
    }

    /// A retained publish's `EXEC` answered: the store's figures, then the
    /// publish's answer.
    fn exec(&mut self, to: Publisher, kept: bool, v: Value) {
        let result = match in_redis::stored(v) {
            Ok(((topics, dropped), v)) => {
                self.emit(Event::RetainedStore { topics, dropped });
                if kept {
                    stream::published(v).map(|(id, n)| (n, id))
                } else {
                    receivers(v)
                }
            }
            Err(e) => Err(e),
        };
        self.emit(Event::Published {
            to,
            result: result.map_err(PublishError::from),
        });
    }

    /// Holds a retained answer behind a `PING` on the subscriber connection.
    fn hold_behind_pong(&mut self, b: Barrier) {
        let Some(live) = &mut self.live else {
            return self.unretained(b.to);
        };
        live.pongs.push_back(Some(b));
        let mut out = BytesMut::new();
        resp::encode_command(&mut out, &[b"PING"]);
        self.write(Conn::Subscriber, out);
    }
}

/// The QoS a publish of `payload` is queued at for MQTT sessions away, in
/// the same script ([`super::mqtt_sessions::publish`]): QoS 1 and 2 (a
/// bare payload is QoS 1; an empty one clears a retained message), with
/// sessions in Redis.
fn session_qos(settings: &RedisSettings, payload: &Bytes) -> Option<u8> {
    if settings.session_queue == 0 || settings.sharded() || payload.is_empty() {
        return None;
    }
    let qos = match envelope::open(payload.clone()) {
        Ok((Some(meta), _)) => meta.qos,
        _ => 1,
    };
    (qos > 0).then_some(qos)
}

/// Appends the command that publishes `payload` on `channel`: `PUBLISH`
/// (`SPUBLISH` on a cluster), or the history script.
fn publish_command(out: &mut BytesMut, settings: &RedisSettings, channel: &str, payload: &Bytes) {
    let prefix = &settings.prefix;
    if let Some(qos) = session_qos(settings, payload) {
        let (limit, h) = (settings.session_queue, settings.history);
        return super::mqtt_sessions::publish(out, prefix, channel, payload, qos, limit, h);
    }
    match settings.history {
        Some(h) => stream::publish(out, prefix, channel, payload, h, settings.sharded()),
        None => {
            let name = format!("{prefix}{channel}");
            let verb: &[u8] = if settings.sharded() {
                b"SPUBLISH"
            } else {
                b"PUBLISH"
            };
            resp::encode_command(out, &[verb, name.as_bytes(), payload]);
        }
    }
}

/// `PUBLISH`'s reply: the receiver count.
fn receivers(v: Value) -> Result<(u64, MessageId), super::error::ReplyError> {
    match v {
        Value::Integer(n) => Ok((u64::try_from(n).unwrap_or(0), MessageId::NONE)),
        other => Err(super::error::ReplyError::of(other)),
    }
}

#[cfg(test)]
mod tests {
    //! The session alone against the fake Redis, time injected: the rules
    //! of keep-alive and backpressure.

    use super::*;
    use crate::redis::fake::{self, FakeRedis};

    /// A session in pattern mode, connected and up, and its Redis.
    fn up() -> (Session, FakeRedis) {
        let mut s = Session::new(fake::settings(RedisMode::Pattern, 0), 1 << 20);
        let mut redis = FakeRedis::default();
        s.on_connected();
        let events = exchange(&mut s, &mut redis, Instant::now());
        assert!(matches!(events[0], Event::Up), "{events:?}");
        (s, redis)
    }

    /// Writes what the session wrote to Redis and hands back what Redis
    /// answered, until neither has more; the session's events.
    fn exchange(s: &mut Session, redis: &mut FakeRedis, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            while let Some(out) = s.poll_output() {
                match out {
                    Output::Write(conn, b) => redis.on_bytes(conn, &b),
                    Output::Event(ev) => events.push(ev),
                }
            }
            let mut moved = false;
            for conn in [Conn::Subscriber, Conn::Publisher] {
                if let Some(b) = redis.take(conn) {
                    s.on_bytes(conn, &b, now).unwrap();
                    moved = true;
                }
            }
            if !moved && s.out.is_empty() {
                return events;
            }
        }
    }

    #[test]
    fn a_redis_that_leaves_a_ping_unanswered_past_the_reply_timeout_is_lost() {
        let (mut s, _) = up();
        let t0 = Instant::now();
        s.on_tick(t0).unwrap();
        let pings: Vec<Conn> = std::iter::from_fn(|| s.poll_output())
            .filter_map(|o| match o {
                Output::Write(conn, _) => Some(conn),
                Output::Event(_) => None,
            })
            .collect();
        assert_eq!(
            pings,
            [Conn::Publisher, Conn::Subscriber],
            "idle: both pinged"
        );
        // Redis hears nothing of them: silent, but not yet for long.
        s.on_tick(t0 + PING_EVERY).unwrap();
        let late = s.on_tick(t0 + REPLY_TIMEOUT + Duration::from_millis(1));
        assert!(matches!(late, Err(SessionError::Silent(_))), "{late:?}");
        // Answered, the same wait is fine.
        let (mut s, mut redis) = up();
        s.on_tick(t0).unwrap();
        exchange(&mut s, &mut redis, t0);
        s.on_tick(t0 + REPLY_TIMEOUT + Duration::from_millis(1))
            .unwrap();
    }

    #[test]
    fn what_was_to_be_written_on_a_broken_connection_is_not_written_on_the_next() {
        let (mut s, _) = up();
        s.on_tick(Instant::now()).unwrap();
        s.on_closed(&SessionError::Closed(Conn::Publisher));
        s.on_connected();
        let writes: Vec<Bytes> = std::iter::from_fn(|| s.poll_output())
            .filter_map(|o| match o {
                Output::Write(_, b) => Some(b),
                Output::Event(_) => None,
            })
            .collect();
        assert_eq!(writes.len(), 1, "{writes:?}");
        assert!(writes[0].windows(10).any(|w| w == b"PSUBSCRIBE"));
    }

    #[test]
    fn past_the_in_flight_window_the_subscriber_connection_waits_for_a_place() {
        let (mut s, mut redis) = up();
        for i in 0..MAX_IN_FLIGHT + 3 {
            redis.publish_elsewhere(b"t:news", i.to_string().as_bytes());
        }
        let now = Instant::now();
        let mut held = Vec::new();
        for ev in exchange(&mut s, &mut redis, now) {
            if let Event::Message { permit, .. } = ev {
                held.push(permit);
            }
        }
        assert_eq!(held.len(), MAX_IN_FLIGHT);
        assert!(s.wants_permit(), "no place: nothing more is read");
        // The subscriber connection's PONG waits unread behind the backlog:
        // that is no silence.
        s.on_tick(now).unwrap();
        assert!(exchange(&mut s, &mut redis, now).is_empty());
        s.on_tick(now + REPLY_TIMEOUT + Duration::from_millis(1))
            .unwrap();
        // Every worker delivered one: the next message goes.
        held.pop();
        let p = s.in_flight().try_acquire_owned().unwrap();
        s.on_permit(p, now).unwrap();
        let next: Vec<Event> = std::iter::from_fn(|| s.poll_output())
            .filter_map(|o| match o {
                Output::Event(ev @ Event::Message { .. }) => Some(ev),
                _ => None,
            })
            .collect();
        assert_eq!(next.len(), 1);
        assert!(s.wants_permit());
    }

    /// A session on a cluster's master (sharded pub/sub), history
    /// messages kept per channel (0: none).
    fn on_a_cluster(history: usize) -> Session {
        let mut settings = fake::settings(RedisMode::Channels, history);
        settings.topology =
            crate::redis::Topology::Cluster(vec![crate::redis::Addr::parse("h:1").unwrap()]);
        Session::new(settings, 1 << 20)
    }

    /// A publish of `payload` on `news`, as request `request` of worker 0.
    fn publish_news(request: u64, payload: &'static [u8]) -> Command {
        let to = Publisher {
            worker: crate::relay::WorkerId {
                slot: 0,
                generation: 1,
            },
            request,
        };
        Command::Publish {
            to,
            channel: "news".into(),
            payload: Bytes::from_static(payload),
            retain: None,
        }
    }

    /// Everything the session emitted, writes as text.
    fn drain(s: &mut Session) -> (Vec<String>, Vec<Event>) {
        let (mut writes, mut events) = (Vec::new(), Vec::new());
        while let Some(o) = s.poll_output() {
            match o {
                Output::Write(_, b) => writes.push(String::from_utf8_lossy(&b).into_owned()),
                Output::Event(ev) => events.push(ev),
            }
        }
        (writes, events)
    }

    #[test]
    fn control_channels_are_heard_said_sharded_and_left_out_of_the_count() {
        // Channels mode on one Redis, against the fake.
        let mut s = Session::new(fake::settings(RedisMode::Channels, 0), 1 << 20);
        let mut redis = FakeRedis::default();
        let now = Instant::now();
        s.on_command(Command::Subscribe("#claims".into()), now);
        s.on_command(Command::Subscribe("news".into()), now);
        s.on_connected();
        let events = exchange(&mut s, &mut redis, now);
        let counts: Vec<i64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Subscriptions(n) => Some(*n),
                _ => None,
            })
            .collect();
        assert_eq!(counts.last(), Some(&1), "news only: {events:?}");
        let claim = envelope::claim(3, 4, 5);
        redis.publish_elsewhere(b"t:#claims", &claim);
        let events = exchange(&mut s, &mut redis, now);
        assert!(
            matches!(
                events[..],
                [Event::Claimed {
                    node: 3,
                    hash: 4,
                    unix_ns: 5
                }]
            ),
            "{events:?}"
        );
        // On a cluster: said with SPUBLISH, heard from an smessage.
        let mut s = on_a_cluster(0);
        s.on_connected();
        s.on_command(Command::Subscribe("#shares".into()), now);
        s.on_command(Command::Announce(Bytes::from_static(b"members")), now);
        let (writes, _) = drain(&mut s);
        assert!(
            writes
                .iter()
                .any(|w| w.contains("SPUBLISH") && w.contains("t:#shares")),
            "{writes:?}"
        );
        let heard = b"*3\r\n$10\r\nssubscribe\r\n$9\r\nt:#shares\r\n:1\r\n\
                      *3\r\n$8\r\nsmessage\r\n$9\r\nt:#shares\r\n$2\r\nhi\r\n";
        s.on_bytes(Conn::Subscriber, heard, now).unwrap();
        let (_, events) = drain(&mut s);
        assert!(
            matches!(&events[..], [Event::Placed(_), Event::Subscriptions(0), Event::Announced(p)]
                if p == "hi"),
            "{events:?}"
        );
    }

    #[test]
    fn on_a_cluster_the_session_speaks_sharded_pub_sub_and_hands_redirects_back() {
        let mut s = on_a_cluster(0);
        let now = Instant::now();
        s.on_connected();
        s.on_command(Command::Subscribe("news".into()), now);
        let (writes, _) = drain(&mut s);
        assert!(
            writes.iter().any(|w| w.contains("SSUBSCRIBE")),
            "{writes:?}"
        );
        let sub = b"*3\r\n$10\r\nssubscribe\r\n$6\r\nt:news\r\n:1\r\n\
                    *3\r\n$8\r\nsmessage\r\n$6\r\nt:news\r\n$2\r\nhi\r\n";
        s.on_bytes(Conn::Subscriber, sub, now).unwrap();
        let (_, events) = drain(&mut s);
        assert!(
            matches!(&events[..], [Event::Placed(p), Event::Subscriptions(1), Event::Message { channel, .. }]
                if channel == "news" && p == "news"),
            "{events:?}"
        );
        s.on_command(publish_news(7, b"x"), now);
        let (writes, _) = drain(&mut s);
        assert!(writes[0].contains("SPUBLISH"), "{writes:?}");
        s.on_bytes(Conn::Publisher, b"-MOVED 1 127.0.0.1:7001\r\n", now)
            .unwrap();
        let (_, events) = drain(&mut s);
        assert!(
            matches!(&events[..], [Event::Redirected { channel, hops: 0, redirect, .. }]
                if channel == "news" && redirect.to.port == 7001 && !redirect.ask),
            "{events:?}"
        );
        // The cluster moved the slot away: an unasked sunsubscribe.
        let gone = b"*3\r\n$12\r\nsunsubscribe\r\n$6\r\nt:news\r\n:0\r\n";
        s.on_bytes(Conn::Subscriber, gone, now).unwrap();
        let (_, events) = drain(&mut s);
        assert!(
            matches!(&events[..], [Event::Lost(c), Event::Subscriptions(0)] if c == "news"),
            "{events:?}"
        );
        // Subscribed again where the map (stale) says, and refused with
        // MOVED: handed back too, and the link stays.
        s.on_command(Command::Subscribe("news".into()), now);
        drain(&mut s);
        let slot = crate::redis::cluster::slot(b"t:news");
        let moved = format!("-MOVED {slot} 127.0.0.1:7002\r\n");
        s.on_bytes(Conn::Subscriber, moved.as_bytes(), now).unwrap();
        let (_, events) = drain(&mut s);
        assert!(
            matches!(&events[..], [Event::Lost(c)] if c == "news"),
            "{events:?}"
        );
    }

    #[test]
    fn a_cluster_session_against_the_fake_master_publishes_with_history_and_follows_a_moved_slot() {
        let mut s = on_a_cluster(5);
        let mut redis = FakeRedis::default();
        let now = Instant::now();
        s.on_command(Command::Subscribe("news".into()), now);
        s.on_connected();
        let events = exchange(&mut s, &mut redis, now);
        assert!(
            matches!(events[..], [Event::Placed(_), Event::Up, ..]),
            "{events:?}"
        );
        s.on_command(publish_news(3, b"hello"), now);
        let events = exchange(&mut s, &mut redis, now);
        // Through the history script's SPUBLISH: one receiver, an id, and
        // the message back on the shard subscription with that id.
        let (mut answered, mut relayed) = (None, None);
        for ev in events {
            match ev {
                Event::Published { result, .. } => answered = Some(result.unwrap()),
                Event::Message { id, payload, .. } => relayed = Some((id, payload)),
                _ => {}
            }
        }
        let (receivers, id) = answered.expect("answered");
        assert_eq!(receivers, 1);
        assert_eq!(relayed, Some((id, Bytes::from_static(b"hello"))));
        // The slot moves away: handed to the router, and not subscribed
        // again here after a reconnect.
        redis.slot_moved_away(b"t:news");
        let events = exchange(&mut s, &mut redis, now);
        assert!(
            matches!(&events[..], [Event::Lost(c), ..] if c == "news"),
            "{events:?}"
        );
        s.on_closed(&SessionError::Closed(Conn::Subscriber));
        redis.disconnect();
        s.on_connected();
        let events = exchange(&mut s, &mut redis, now);
        assert!(matches!(events[..], [Event::Up]), "{events:?}");
    }
}
