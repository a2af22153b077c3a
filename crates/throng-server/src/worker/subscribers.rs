//! Every subscriber of one worker, without sockets or clocks of its own:
//! the tables (by slot, by channel), the fan-out hot path (one encoding per
//! kind of subscriber, [`super::rejoin`]), rejoins (a subscriber that came
//! back after an id holds what is published until its channel's history
//! arrives), the clock in ticks and what each tick does (heartbeat pings or
//! SSE comments and idle checks spread over the ping interval, overdue
//! closing handshakes, stalled queues), and each connection's life: what
//! it reads (WebSocket frames, MQTT packets), what it is sent, how it
//! closes. A `Conn` does its own reads, writes and queue and an `Mqtt`
//! keeps its own session ([`super::conn`], [`super::mqtt`]); each says
//! what happened, and the subscribers keep the books: counters, the
//! lists of queued and closing connections, readiness, the tables.
//!
//! What it needs from around it is the [`Outside`]: readiness registration
//! (the worker's epoll in production), the report of a channel's first
//! and last subscriber (to the supervisor, for Redis channels mode), and
//! the supervisor's answers it asks for. Tests drive it in memory
//! (`pair.rs`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use throng_host::process;
use throng_proto::deflate;
use throng_proto::mqtt::{
    Ack, Answer as MqttAnswer, Decoder, Delivery, Packet, PacketId, Properties, Property, Publish,
    ReasonCode, RetainHandling, Suback, Subscribe, Unsuback, Unsubscribe, Version, topic,
};
use throng_proto::ws::{self, Frame, OpCode, close_code};

use super::conn::{
    CLOSE_GRACE, Conn, Drained, Got, NONE, Proto, SendError, State, TlsState, Unsent, Wire,
    close_frame,
};
use super::mqtt::{self, Mqtt, Will, version_of};
use super::mqtt_auth;
use super::mqtt_ids::{Claimed, ClientIds};
use super::mqtt_qos::{self, DeliveryAck, Incoming, Qos1, Slot};
use super::mqtt_retain::{Holds, Out};
use super::mqtt_session::{Resumes, Waiting};
use super::mqtt_share::{self, Shares};
use super::mqtt_ws;
use super::rejoin::{self, Joined, Kind};
use super::table::{Channels, Slab};

mod api;
mod many;
mod presence;
mod subjects;
use crate::auth;
use crate::channel;
use crate::control::{
    Claim, Message, SessionOpen, SessionPark, SessionResumed, ShareDeliver, ShareMember,
};
use crate::history::{Kept, MessageId};
use crate::metrics::{CloseReason, Counters};
use crate::retained::RetainedMessage;
use crate::tls::Pumped;
use crate::wheel::{self, Sweep};
pub(crate) use presence::NOT_ON as PRESENCE_NOT_ON;

/// Size of the one read buffer per worker. Clients only send control
/// frames, so this is far more than one read ever needs.
/// MQTT clients publish: a packet that arrived split is kept and copied
/// back in front of the next read, so it must leave room for that read
/// ([`max_packet`] is at most half of this).
pub(crate) const SCRATCH: usize = 256 * 1024;

/// Bytes of a packet besides a PUBLISH's payload that `--max-message`
/// leaves room for: its headers, a channel name, a few properties.
const PACKET_OVERHEAD: usize = 1024;

/// The largest packet a client may send: a PUBLISH of `--max-message`
/// bytes. A packet that arrives split is kept and read again in the
/// worker's scratch buffer, which must hold it and leave room to read.
pub(crate) fn max_packet(max_message: usize) -> usize {
    max_message.saturating_add(PACKET_OVERHEAD).min(SCRATCH / 2)
}

/// `c`'s persistent session, if it has one.
fn persist_of<W>(c: &Conn<W>) -> Option<mqtt::Persist> {
    c.proto()
        .mqtt()
        .and_then(Mqtt::state)
        .and_then(|s| s.persist.as_deref().copied())
}

/// The keys of `c`'s shared subscriptions.
fn share_keys<W>(c: &Conn<W>) -> Vec<Rc<str>> {
    c.proto()
        .mqtt()
        .and_then(Mqtt::state)
        .map(|s| s.shares.clone())
        .unwrap_or_default()
}

/// Whether `c` is an MQTT subscriber carried in WebSocket frames.
fn over_ws<W>(c: &Conn<W>) -> bool {
    c.kind().is_mqtt() && c.proto().mqtt().is_some_and(|m| m.ws)
}

/// What the subscribers need from around them.
pub(crate) trait Outside {
    /// A subscriber's byte stream.
    type Wire: Wire;
    /// Watches a new subscriber's wire for reading, reported as `slot`.
    fn watch(&self, wire: &Self::Wire, slot: u32) -> io::Result<()>;
    /// Watches it for room to write too (while it has a queue), or no longer.
    fn want_write(&self, wire: &Self::Wire, slot: u32, on: bool);
    /// Stops watching it for a while, until [`Self::watch`] again (its
    /// bytes wait in the socket, which a level-triggered poll would report
    /// again and again); a wire that reports no readiness needs nothing.
    fn unwatch(&self, _wire: &Self::Wire) {}
    /// Stops watching it (the connection is gone), and gives back what it
    /// was counted under (`tag`, see [`Conn::tag`]).
    fn forget(&self, wire: &Self::Wire, tag: u32);
    /// A channel got its first subscriber here (`true`) or lost its last.
    fn channel_interest(&self, channel: &str, subscribed: bool);
    /// An MQTT client published `m` (its `id` is the link's to set; at
    /// QoS 0: `m.at_most_once`; also its channel's retained message when
    /// `retain` holds its QoS): to the supervisor, which relays it like an
    /// HTTP publish. Returns the request's id: the relay's answer comes
    /// to [`Subscribers::publish_answered`] under it.
    fn publish(&self, m: Message, retain: Option<u8>) -> u64;
    /// Asks for the retained messages of the channels `filters` match, for
    /// a new MQTT subscription; the answer comes to
    /// [`Subscribers::retained_answer`], in order with the fan-outs.
    fn ask_retained(&self, request: u64, filters: Vec<String>);
    /// Asks for what `channel` kept after `since`, for rejoin `request`;
    /// the answer comes to [`Subscribers::recovered`].
    fn recover(&self, request: u64, channel: &str, since: MessageId);
    /// The id of this node's MQTT connection in `slot` as a message's
    /// publisher ([`Message::origin`]): never 0.
    fn origin(&self, slot: u32) -> u64;
    /// An MQTT client connected here with the client id `hash` at
    /// `claim` ([`super::mqtt_ids`]): the node's other workers close
    /// theirs if it is older.
    fn client_id(&self, hash: u64, claim: Claim);
    /// An MQTT client with a client id connected: to the supervisor, which
    /// keeps sessions ([`crate::sessions`]); a resume's answer comes to
    /// [`Subscribers::session_resumed`].
    fn session_open(&self, o: SessionOpen);
    /// A persistent session's connection ended: its session, to keep.
    fn session_park(&self, p: SessionPark);
    /// A connection here joined or left a shared subscription: to the
    /// supervisor, whose picks come to [`Subscribers::share_deliver`].
    fn share_member(&self, m: ShareMember);
    /// A token subject joined or left a channel of `--presence` here: to
    /// the supervisor, which hands it to every worker (and node), back to
    /// [`Subscribers::presence_event`].
    fn presence(&self, _e: crate::control::PresenceEvent) {}
}

/// What a CONNECT with a client id asks of its session ([`Subscribers::add_mqtt`]).
pub(crate) struct SessionStart {
    /// Its id in the session records (from [`Subscribers::session_id`]).
    pub(crate) id: u64,
    /// Clean start; else its CONNACK waits for the session, and these are
    /// it with session present 0 and 1.
    pub(crate) resume: Option<[Bytes; 2]>,
    /// It outlives the connection (its persist box is set).
    pub(crate) persistent: bool,
}

/// A subscriber waiting for its channel's history, and what was published
/// on its channel meanwhile; then, until the live stream has passed what
/// the history gave, the last id it was sent.
pub(crate) struct Rejoin<W> {
    request: u64,
    conn: Rc<Conn<W>>,
    /// The channel it rejoins, for a connection of several; `None`: its one.
    channel: Option<Rc<str>>,
    since: MessageId,
    held: Vec<Kept>,
    held_bytes: usize,
    /// Set once the history was sent: live messages up to this id are
    /// repeats. Through Redis the history (read on one connection) can be
    /// ahead of the live stream (another connection); the embedded relay
    /// never is, and the first live message clears it.
    fence: Option<MessageId>,
}

/// An MQTT client's PUBLISH at QoS 1 or 2 awaiting the relay's answer:
/// its PUBACK (or PUBREC) goes out only once the relay took it.
pub(crate) struct Owed<W> {
    conn: Rc<Conn<W>>,
    packet_id: PacketId,
    /// QoS 2 (PUBREC), else QoS 1 (PUBACK).
    exactly_once: bool,
}

/// The message an MQTT client's PUBLISH `p` relays; `origin` names the
/// client's connection.
fn client_message(p: &Publish<'_>, origin: u64) -> Message {
    Message {
        id: 0,
        message: MessageId::NONE,
        text: std::str::from_utf8(p.payload).is_ok(),
        at_most_once: p.delivery == Delivery::AtMostOnce,
        exactly_once: matches!(p.delivery, Delivery::ExactlyOnce(_)),
        properties: mqtt::forwarded(p.properties),
        retained: p.retain,
        origin,
        channel: p.topic.to_owned(),
        payload: Bytes::copy_from_slice(p.payload),
    }
}

/// The message a QoS 1 or 2 delivery `q` (encoded for `version`) carries,
/// for a persistent session to send again.
fn message_of(version: Version, q: &Qos1) -> Option<Message> {
    // Any packet id but 0 reads.
    let packet = q.parts(&[0, 1]).concat();
    let mut decoder = Decoder::server_connected(version, packet.len());
    match decoder.decode(&packet) {
        Ok(Some(d)) => match d.packet {
            Packet::Publish(p) => Some(client_message(&p, 0)),
            _ => None,
        },
        _ => None,
    }
}

/// The QoS `p` is kept at as its channel's retained message, if it is one.
fn retain_qos(p: &Publish<'_>) -> Option<u8> {
    p.retain.then(|| p.delivery.qos() as u8)
}

/// What a rejoining subscriber does with a live message.
enum Live {
    /// Held until the history arrives.
    Held,
    /// Already sent with the history: dropped.
    Repeat,
    /// Past the history: sent, and the subscriber is live from now on.
    Send,
}

/// The settings a subscriber's life follows, in the worker's ticks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Unsent bytes a connection may queue (`--max-queue`).
    pub(crate) max_queue: usize,
    /// How often every connection is pinged (`--ping-interval`).
    pub(crate) ping_interval: Duration,
    /// Ticks without a word from the client before 1008 (`--idle-timeout`).
    pub(crate) idle: u32,
    /// Ticks a queue may make no progress before 1008 (`--write-timeout`).
    pub(crate) write: u32,
    /// Ticks a closing handshake may take ([`CLOSE_GRACE`]).
    pub(crate) grace: u32,
    /// MQTT wildcard filters are served: not with Redis channels mode,
    /// whose node subscribes in Redis per channel, which a filter is not.
    pub(crate) wildcards: bool,
    /// MQTT clients may publish: not when `--publish-listen` keeps
    /// publishing off the public addresses.
    pub(crate) mqtt_publish: bool,
    /// The largest packet an MQTT client may send ([`max_packet`]).
    pub(crate) mqtt_packet: usize,
    /// The largest payload an MQTT client may publish (`--max-message`,
    /// as for HTTP).
    pub(crate) max_message: usize,
    /// Publishing takes a credential (`--auth-*`, `--publish-key-file`).
    pub(crate) publish_guarded: bool,
    /// Subscriptions one MQTT connection may hold (`--max-subscriptions`).
    pub(crate) max_subscriptions: usize,
    /// Bytes of filters one MQTT connection may hold (`--max-filter-bytes`).
    pub(crate) max_filter_bytes: usize,
    /// The longest from an MQTT client id's claim to its registration
    /// (the CONNACK write's `--handshake-timeout`, and a second).
    pub(crate) claim_window: Duration,
    /// Channels one connection of several may be in
    /// (`--max-channels-per-connection`).
    pub(crate) max_channels: usize,
    /// permessage-deflate is offered (`--ws-deflate`): the smallest
    /// payload compressed (`--ws-deflate-min`). `None`: no subscriber has it.
    pub(crate) deflate_min: Option<usize>,
}

impl Limits {
    /// The limits of `cfg`.
    pub(crate) fn of(cfg: &crate::Config) -> Self {
        Self {
            max_queue: cfg.max_queue,
            ping_interval: cfg.ping_interval,
            idle: wheel::ticks(cfg.idle_timeout),
            write: wheel::ticks(cfg.write_timeout),
            grace: wheel::ticks(CLOSE_GRACE),
            wildcards: cfg.redis_mode != Some(crate::redis::RedisMode::Channels),
            mqtt_publish: cfg.publish_listen.is_empty(),
            mqtt_packet: max_packet(cfg.max_message),
            max_message: cfg.max_message,
            publish_guarded: cfg.auth.publish_guarded(),
            max_subscriptions: cfg.max_subscriptions,
            max_filter_bytes: cfg.max_filter_bytes,
            claim_window: cfg.handshake_timeout + Duration::from_secs(1),
            max_channels: cfg.max_channels_per_connection,
            deflate_min: cfg.ws_deflate.then_some(cfg.ws_deflate_min),
        }
    }
}

/// One message on its way to the subscribers its channel had when the
/// fan-out began ([`Subscribers::begin_fanout`]).
pub(crate) struct Fanout<W> {
    /// The frame, encoded once.
    frame: Bytes,
    /// The frame with the message's id, and its SSE event, encoded at the
    /// first subscriber that takes them.
    with_id: Option<Bytes>,
    sse: Option<Bytes>,
    /// The frame and the event that say the channel, for connections of
    /// several, encoded at the first of them.
    multi: Option<Bytes>,
    sse_multi: Option<Bytes>,
    /// `frame`, `with_id` and `multi` compressed (permessage-deflate),
    /// each at the first subscriber of its kind that negotiated it.
    deflated: [Option<Bytes>; 3],
    /// The QoS 0 PUBLISH, for MQTT 3.1.1 and 5.0 subscribers, then with
    /// the retain flag (Retain As Published).
    mqtt: [Option<Bytes>; 4],
    /// The QoS 1 PUBLISH, for MQTT 3.1.1 and 5.0 subscribers, then the
    /// QoS 2 one for each, then those four with the retain flag (`None`
    /// inside: it could not be encoded, and is sent at QoS 0).
    mqtt_qos1: [Option<Option<Qos1>>; 8],
    /// The message (its id, for rejoining subscribers; its body, for the
    /// other encodings).
    message: Message,
    /// The subscribers to write to: the channel's own (WebSocket, SSE,
    /// MQTT with this one subscription), then MQTT ones with more.
    conns: Vec<Rc<Conn<W>>>,
    /// How many of `conns` are the channel's own.
    exact: usize,
    /// The highest QoS the message goes at: 0 if it was published at 0.
    most: u8,
    /// The QoS each of `conns[exact..]` gets the message at (by its index
    /// in `conns`), when one of them gets it at 1; empty otherwise.
    qos: Vec<u8>,
    /// Invariant: `next <= conns.len()`; `conns[..next]` were written to.
    next: usize,
    /// When it began (the fan-out's wall time is measured to its end).
    started: Instant,
    /// The thread CPU its turns took.
    cpu: Duration,
}

/// Where an MQTT subscriber of `kind` finds its version's encodings in a
/// fan-out (0: 3.1.1, 1: 5.0), and its version.
fn version_at(kind: Kind) -> (usize, Version) {
    if kind == Kind::Mqtt5 {
        (1, Version::V5)
    } else {
        (0, Version::V311)
    }
}

/// A fan-out's QoS 1 or 2 PUBLISH of `m` for a subscriber of `kind` at
/// `qos` (with the retain flag `retain`), encoded at the first one that
/// takes it; `None` at QoS 0.
fn qos1_for<'a>(
    encoded: &'a mut [Option<Option<Qos1>>; 8],
    m: &Message,
    kind: Kind,
    qos: u8,
    retain: bool,
) -> Option<&'a Qos1> {
    if qos == 0 {
        return None;
    }
    let (v, version) = version_at(kind);
    let at = v + 2 * usize::from(qos - 1) + 4 * usize::from(retain);
    encoded[at]
        .get_or_insert_with(|| {
            let p = Qos1::with_retain(version, m, retain);
            if qos == 2 {
                p.map(|p| p.exactly_once())
            } else {
                p
            }
        })
        .as_ref()
}

/// A subscription's byte `sub` (QoS and options) with its QoS at most `most`.
fn capped(sub: u8, most: u8) -> u8 {
    (sub & mqtt::QOS).min(most) | (sub & !mqtt::QOS)
}

/// Records that the last of `n` subscribers of a fan-out gets its message
/// at `q` (a subscription's byte, [`capped`]): `qos` stays empty while
/// every one gets it at 0 with no option.
fn mark_qos(qos: &mut Vec<u8>, n: usize, q: u8) {
    if q != 0 || !qos.is_empty() {
        qos.resize(n - 1, 0);
        qos.push(q);
    }
}

/// A connection in a closing handshake, and the tick the handshake started.
pub(crate) type Closing<W> = (Rc<Conn<W>>, u32);

/// One worker's subscribers. Nothing here is shared between threads:
/// `Cell`/`RefCell` state, borrowed one operation at a time.
pub(crate) struct Subscribers<O: Outside> {
    limits: Limits,
    outside: O,
    counters: Rc<Counters>,
    conns: RefCell<Slab<O::Wire>>,
    channels: RefCell<Channels<O::Wire>>,
    /// The one read buffer: every subscriber reads into it, in turn (and
    /// the worker's HTTP connections too, between requests).
    scratch: RefCell<Box<[u8]>>,
    /// TLS subscribers: what the records just read decrypt to.
    tls_plain: RefCell<Vec<u8>>,
    /// TLS subscribers: one frame (or control record) encrypted for one
    /// connection, written from here.
    tls_out: RefCell<Vec<u8>>,
    /// Ticks of [`wheel::TICK`] since the worker started.
    now: Cell<u32>,
    /// Unix seconds, set by the worker before each tick: tokens expire on
    /// the wall clock, while ticks stretch with a busy worker.
    wall: Cell<u64>,
    /// Subscribers that have a write queue (checked each tick for `--write-timeout`).
    queued: RefCell<Vec<Rc<Conn<O::Wire>>>>,
    /// Connections in a closing handshake, with the tick it started.
    closing: RefCell<Vec<Closing<O::Wire>>>,
    /// Subscribers waiting for their channel's history (few at a time: a
    /// list searched, not a table).
    rejoins: RefCell<Vec<Rejoin<O::Wire>>>,
    next_rejoin: Cell<u64>,
    /// MQTT subscribers waiting for retained messages ([`super::mqtt_retain`]).
    retained: RefCell<Holds<O::Wire>>,
    /// MQTT PUBLISHes at QoS 1 and 2 whose acknowledgement waits for the
    /// relay's answer, by the relay request's id.
    owed: RefCell<HashMap<u64, Owed<O::Wire>>>,
    /// MQTT client ids held here, for takeover ([`super::mqtt_ids`]).
    client_ids: RefCell<ClientIds>,
    /// MQTT connections waiting for their session, and resumed ones'
    /// fences ([`super::mqtt_session`]).
    resumes: RefCell<Resumes<O::Wire>>,
    /// The last relayed message whose fan-out here is done: a session
    /// parked now may have missed those after it.
    relayed_through: Cell<u64>,
    /// Members here of MQTT shared subscriptions ([`super::mqtt_share`]).
    shares: RefCell<Shares<O::Wire>>,
    /// Wills of connections gone, waiting out their 5.0 Will Delay
    /// Interval: the tick they are due at (a reconnect cancels one).
    delayed_wills: RefCell<Vec<(u32, Box<Will>)>>,
    /// Connections of several channels: what their credential grants, by
    /// connection (none kept where nothing is guarded), their publishes
    /// awaiting the relay's answer, and the token verifier a refresh is
    /// checked by ([`many`]).
    many: many::Many<O::Wire>,
    /// The token subject of connections admitted with one ([`subjects`]).
    subjects: RefCell<subjects::Subjects>,
    /// `--presence` and the connections that watch a channel's joins and
    /// leaves ([`presence`]).
    presence: RefCell<presence::Presence<O::Wire>>,
    sweep: RefCell<Sweep>,
    ping: Bytes,
    keep_alive: Bytes,
}

impl<O: Outside> Subscribers<O> {
    /// The settings their lives follow.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What is around them (the worker's epoll set, its supervisor link).
    pub(crate) fn outside(&self) -> &O {
        &self.outside
    }

    /// The worker's counters they count in.
    #[cfg(test)]
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The worker's one read buffer, lent to its HTTP connections between
    /// requests.
    pub(crate) fn scratch(&self) -> &RefCell<Box<[u8]>> {
        &self.scratch
    }

    /// Ticks of [`wheel::TICK`] since the worker started.
    pub(crate) fn now(&self) -> u32 {
        self.now.get()
    }

    /// Sets the Unix second tokens are checked against, before each tick.
    pub(crate) fn set_wall(&self, unix: u64) {
        self.wall.set(unix);
    }

    /// Every subscriber here now (a takeover's drain closes them in turns).
    pub(crate) fn all(&self) -> Vec<Rc<Conn<O::Wire>>> {
        self.conns.borrow().all()
    }

    /// Subscribes MQTT subscriber `c` to `channel` at QoS `qos` without a
    /// SUBSCRIBE.
    #[cfg(test)]
    pub(crate) fn subscribe_mqtt(&self, channel: &str, c: &Rc<Conn<O::Wire>>, qos: u8) {
        self.channels.borrow_mut().subscribe_mqtt(channel, c, qos);
    }

    /// The subscribers of `channel` a bare write can reach now: open, with
    /// nothing queued, not TLS (`/bench/floor`).
    #[cfg(feature = "bench-floor")]
    pub(crate) fn bare_subscribers_of(&self, channel: &str) -> Vec<Rc<Conn<O::Wire>>> {
        self.channels
            .borrow()
            .get(channel)
            .map_or_else(Vec::new, |ch| {
                ch.subs
                    .iter()
                    .filter(|c| !c.has_queue() && c.is_open() && !c.is_tls())
                    .filter(|c| !c.kind().is_multi())
                    .cloned()
                    .collect()
            })
    }

    pub(crate) fn new(limits: Limits, outside: O, counters: Rc<Counters>) -> Self {
        Self {
            limits,
            outside,
            counters,
            conns: RefCell::default(),
            channels: RefCell::default(),
            scratch: RefCell::new(vec![0; SCRATCH].into_boxed_slice()),
            tls_plain: RefCell::default(),
            tls_out: RefCell::default(),
            now: Cell::new(0),
            wall: Cell::new(0),
            queued: RefCell::default(),
            closing: RefCell::default(),
            rejoins: RefCell::default(),
            next_rejoin: Cell::new(1),
            retained: RefCell::default(),
            owed: RefCell::default(),
            client_ids: RefCell::new(ClientIds::new(
                u64::try_from(limits.claim_window.as_nanos()).unwrap_or(u64::MAX),
            )),
            resumes: RefCell::default(),
            relayed_through: Cell::new(0),
            shares: RefCell::default(),
            delayed_wills: RefCell::default(),
            many: many::Many::default(),
            subjects: RefCell::default(),
            presence: RefCell::default(),
            sweep: RefCell::new(Sweep::new(limits.ping_interval)),
            ping: ws::server_frame(OpCode::Ping, b""),
            keep_alive: Bytes::from_static(throng_proto::sse::KEEP_ALIVE),
        }
    }

    /// Subscribers here now.
    pub(crate) fn len(&self) -> usize {
        self.conns.borrow().len()
    }

    /// Registers an upgraded connection: into the tables and the readiness set.
    pub(crate) fn subscribe(
        &self,
        channel: &str,
        c: Conn<O::Wire>,
    ) -> io::Result<Rc<Conn<O::Wire>>> {
        self.admit(c, Some(channel))
    }

    /// Takes `c` into the slab and the readiness set (and into `channel`'s
    /// table, for a subscriber of one), counts it, and handles what came
    /// in the same packet as its upgrade request or CONNECT.
    fn admit(&self, c: Conn<O::Wire>, channel: Option<&str>) -> io::Result<Rc<Conn<O::Wire>>> {
        let c = self.admit_quiet(c, channel)?;
        if c.has_rest() {
            self.on_readable(&c, false);
        }
        Ok(c)
    }

    /// [`Self::admit`] without handling what came behind the upgrade or
    /// CONNECT: the caller does, once it has done what must come first.
    fn admit_quiet(
        &self,
        c: Conn<O::Wire>,
        channel: Option<&str>,
    ) -> io::Result<Rc<Conn<O::Wire>>> {
        let c = Rc::new(c);
        self.conns.borrow_mut().insert(&c);
        if let Err(e) = self.outside.watch(c.wire(), c.slot()) {
            self.conns.borrow_mut().remove(&c);
            self.subject_next(None);
            return Err(e);
        }
        self.subject_admitted(&c);
        if let Some(channel) = channel {
            if self.channels.borrow_mut().subscribe(channel, &c) {
                self.outside.channel_interest(channel, true);
            }
            self.presence_told(&c, channel, true);
        }
        self.counters.open.set(self.counters.open.get() + 1);
        if c.kind().is_mqtt() {
            crate::metrics::inc(&self.counters.mqtt_open);
        }
        crate::metrics::inc(&self.counters.upgraded);
        Ok(c)
    }

    /// Registers a subscriber that reconnected after message `since`: in its
    /// channel's table at once (so nothing published from now on passes it
    /// by), held back until the history after `since` arrives.
    pub(crate) fn subscribe_after(
        &self,
        channel: &str,
        c: Conn<O::Wire>,
        since: MessageId,
    ) -> io::Result<()> {
        c.set_rejoining(true);
        let request = self.next_rejoin.get();
        self.next_rejoin.set(request + 1);
        let conn = self.subscribe(channel, c)?;
        if !conn.is_open() {
            // Ended already (bytes behind its request closed it).
            return Ok(());
        }
        self.rejoins.borrow_mut().push(Rejoin {
            request,
            conn,
            channel: None,
            since,
            held: Vec::new(),
            held_bytes: 0,
            fence: None,
        });
        self.outside.recover(request, channel, since);
        Ok(())
    }

    /// The history for rejoin `request` arrived: the subscriber gets the
    /// marker (unless `complete`), the history and what was held, each
    /// message once, then whatever is published next.
    pub(crate) fn recovered(&self, request: u64, complete: bool, history: Vec<Kept>) {
        let rejoined = {
            let mut rejoins = self.rejoins.borrow_mut();
            let Some(k) = rejoins
                .iter()
                .position(|r| r.request == request && r.fence.is_none())
            else {
                return;
            };
            if !rejoins[k].conn.is_open() {
                rejoins.swap_remove(k);
                return;
            }
            let r = &mut rejoins[k];
            let channel = r.channel.clone().unwrap_or_else(|| Rc::from(""));
            (
                r.conn.clone(),
                r.since,
                std::mem::take(&mut r.held),
                channel,
            )
        };
        let (c, since, held, channel) = rejoined;
        let mut last = MessageId::NONE;
        for j in rejoin::join(since, complete, history, held) {
            let frame = match j {
                Joined::Incomplete => rejoin::marker(c.kind(), &channel, since),
                Joined::Message(k) => {
                    last = k.id;
                    rejoin::kept(c.kind(), &channel, &k)
                }
            };
            if let Err(e) = self.send(&c, &frame) {
                self.forget_rejoin(&c);
                self.send_failed(&c, e);
                return;
            }
        }
        let mut rejoins = self.rejoins.borrow_mut();
        if let Some(r) = rejoins.iter_mut().find(|r| r.request == request) {
            r.fence = Some(last.max(if complete { since } else { MessageId::NONE }));
            r.held_bytes = 0;
        }
    }

    /// A rejoining subscriber is gone, or live: it holds nothing any more.
    pub(crate) fn forget_rejoin(&self, c: &Conn<O::Wire>) {
        if c.stop_rejoining() {
            self.rejoins
                .borrow_mut()
                .retain(|r| !std::ptr::eq(Rc::as_ptr(&r.conn), c));
            if c.kind().is_mqtt() {
                self.retained.borrow_mut().forget(c);
            }
        }
    }

    /// What a rejoining subscriber does with live message `m`: held (over
    /// `--max-queue` it is a slow consumer like any other) until the
    /// history arrives, then dropped while it repeats what the history
    /// gave, then sent.
    fn live(&self, c: &Rc<Conn<O::Wire>>, m: &Message) -> Result<Live, SendError> {
        if c.kind().is_multi() {
            return self.live_multi(c, m);
        }
        let mut rejoins = self.rejoins.borrow_mut();
        let Some(k) = rejoins.iter().position(|r| Rc::ptr_eq(&r.conn, c)) else {
            drop(rejoins);
            // A resumed MQTT session's queue had what was relayed before its answer.
            if self.resumes.borrow_mut().fenced(c, m.id) == Some(true) {
                return Ok(Live::Repeat);
            }
            // An MQTT subscriber waiting for retained messages holds too.
            let held = self.retained.borrow_mut().hold(c, m, self.limits.max_queue);
            if let Some(held) = held {
                return held.map(|()| Live::Held);
            }
            c.set_rejoining(false);
            return Ok(Live::Send);
        };
        let live = self.rejoin_live(&mut rejoins[k], m)?;
        if matches!(live, Live::Send) {
            rejoins.swap_remove(k);
            c.set_rejoining(false);
        }
        Ok(live)
    }

    /// What rejoin `r` does with live message `m` of its channel: held
    /// until the history arrives, then dropped while it repeats what the
    /// history gave, then sent (the caller then forgets the rejoin).
    fn rejoin_live(&self, r: &mut Rejoin<O::Wire>, m: &Message) -> Result<Live, SendError> {
        match r.fence {
            Some(fence) if !m.message.is_none() && m.message <= fence => Ok(Live::Repeat),
            Some(_) => Ok(Live::Send),
            None => {
                if r.held_bytes + m.payload.len() > self.limits.max_queue {
                    return Err(SendError::QueueFull);
                }
                r.held_bytes += m.payload.len();
                r.held.push(Kept {
                    id: m.message,
                    text: m.text,
                    payload: m.payload.clone(),
                });
                Ok(Live::Held)
            }
        }
    }

    /// Takes a subscriber out of its channel, saying so when that was the
    /// channel's last subscriber here.
    pub(crate) fn unsubscribe(&self, c: &Conn<O::Wire>) {
        self.presence_leave_all(c);
        if c.kind().is_mqtt() {
            self.park_session(c);
            self.leave_shares(c);
        }
        let gone = self.channels.borrow_mut().unsubscribe(c);
        if let Some(name) = gone {
            self.outside.channel_interest(&name, false);
        }
        if c.kind().is_mqtt() {
            let gone = self.channels.borrow_mut().unsubscribe_mqtt_all(c);
            for name in gone {
                self.outside.channel_interest(&name, false);
            }
        }
        if c.kind().is_multi() {
            self.leave_all(c);
        }
    }

    /// The subscriber in `slot`, if any.
    pub(crate) fn get(&self, slot: u64) -> Option<Rc<Conn<O::Wire>>> {
        let slot = usize::try_from(slot).ok()?;
        self.conns.borrow().get(slot).cloned()
    }

    /// Subscribers of `channel` here now.
    pub(crate) fn subscribers_of(&self, channel: &str) -> u64 {
        let channels = self.channels.borrow();
        if !channels.has_wildcards() {
            return channels.get(channel).map_or(0, |ch| ch.len() as u64);
        }
        let mut n = channels
            .get(channel)
            .map_or(0, |ch| (ch.subs.len() + ch.multi.len()) as u64);
        channels.for_each_mqtt(channel, |_, _, first| n += u64::from(first));
        n
    }

    /// Writes one message to every subscriber of its channel here, at once
    /// (see [`Self::begin_fanout`]). Returns the number of subscribers.
    #[cfg(test)]
    pub(crate) fn fanout(&self, m: &Message) -> u64 {
        let mut f = self.begin_fanout(m);
        let n = f.conns.len() as u64;
        while self.fanout_some(&mut f, usize::MAX) {}
        n
    }

    /// A fan-out of `m` to the subscribers its channel has here now: the
    /// frame encoded once, then one write per subscriber, in turns
    /// ([`Self::fanout_some`]) so that a worker with tens of thousands of
    /// subscribers still reads its control socket and answers publishers
    /// in between. The subscriber list is taken now (a few reference
    /// counts): one who leaves meanwhile is skipped, one who arrives
    /// gets the next message.
    pub(crate) fn begin_fanout(&self, m: &Message) -> Fanout<O::Wire> {
        let frame = ws::server_frame(
            if m.text { OpCode::Text } else { OpCode::Binary },
            &m.payload,
        );
        let channels = self.channels.borrow();
        let mut conns = channels
            .get(&m.channel)
            .map(|ch| ch.subs.clone())
            .unwrap_or_default();
        let exact = conns.len();
        // QoS 1 (2) to the subscribers who asked for it, unless it was
        // published at QoS 0 (1); HTTP and Redis publishes are QoS 1.
        let mut qos: Vec<u8> = Vec::new();
        let most = if m.at_most_once {
            0
        } else if m.exactly_once {
            2
        } else {
            1
        };
        if channels.has_wildcards() {
            channels.for_each_mqtt(&m.channel, |c, q, first| {
                let q = capped(q, most);
                if first {
                    conns.push(c.clone());
                    mark_qos(&mut qos, conns.len(), q);
                } else if q != 0
                    && let Some(k) = conns.iter().rposition(|o| Rc::ptr_eq(o, c))
                {
                    // Found again by a subscription at a higher QoS (rare).
                    qos.resize(conns.len(), 0);
                    qos[k] = q;
                }
            });
        } else if let Some(ch) = channels.get(&m.channel) {
            conns.reserve(ch.mqtt.len());
            for (c, _, q) in &ch.mqtt {
                conns.push(c.clone());
                mark_qos(&mut qos, conns.len(), capped(*q, most));
            }
        }
        // Connections of several channels come last: they are neither the
        // channel's own nor MQTT, so `exact` and `qos` do not reach them.
        if let Some(ch) = channels.get(&m.channel) {
            conns.extend(ch.multi.iter().map(|(c, _)| c.clone()));
        }
        drop(channels);
        Fanout {
            frame,
            with_id: None,
            sse: None,
            multi: None,
            sse_multi: None,
            deflated: Default::default(),
            mqtt: Default::default(),
            mqtt_qos1: Default::default(),
            message: m.clone(),
            conns,
            exact,
            most,
            qos,
            next: 0,
            started: Instant::now(),
            cpu: Duration::ZERO,
        }
    }

    /// Writes `f`'s frame to up to `n` more subscribers; only a subscriber
    /// whose socket is full gets a queue. Returns whether any are left.
    pub(crate) fn fanout_some(&self, f: &mut Fanout<O::Wire>, n: usize) -> bool {
        let cpu = process::thread_cpu();
        let end = f.next.saturating_add(n).min(f.conns.len());
        let mut behind = Vec::new();
        let mut delivered = 0u64;
        let mut zipped = 0u64;
        let m = &f.message;
        for (k, c) in f.conns[f.next..end].iter().enumerate() {
            if !c.is_open() {
                // Left the channel since the fan-out began.
                continue;
            }
            let at = f.next + k;
            let sub = if !c.kind().is_mqtt() {
                0
            } else if at < f.exact {
                // An MQTT subscriber of this one channel: its QoS is its own.
                capped(c.proto().mqtt().map_or(0, |s| s.qos), f.most)
            } else {
                f.qos.get(at).copied().unwrap_or(0)
            };
            if sub & mqtt::NO_LOCAL != 0
                && m.origin != 0
                && m.origin == self.outside.origin(c.slot())
            {
                // 5.0 No Local: its own message (never held for later
                // either, where nothing would look again).
                continue;
            }
            let now = if c.rejoining() {
                self.live(c, m)
            } else {
                Ok(Live::Send)
            };
            let qos = sub & mqtt::QOS;
            let retain = sub & mqtt::RETAIN_AS_PUBLISHED != 0 && m.retained;
            let qos1 = qos1_for(&mut f.mqtt_qos1, m, c.kind(), qos, retain);
            let sent = match (now, qos1) {
                (Ok(Live::Send), _) if self.over_client_max(c, m, qos) => Ok(()),
                (Ok(Live::Send), Some(q)) => self.deliver_qos1(c, q),
                (Ok(Live::Send), None) => {
                    // Subscribers with ids or SSE get their own encoding,
                    // made once for all of them at the first one met.
                    let frame = match c.kind() {
                        Kind::Ws => &f.frame,
                        Kind::WsIds => f
                            .with_id
                            .get_or_insert_with(|| rejoin::frame(Kind::WsIds, m)),
                        Kind::Sse => f.sse.get_or_insert_with(|| rejoin::frame(Kind::Sse, m)),
                        Kind::WsMulti => f
                            .multi
                            .get_or_insert_with(|| rejoin::frame(Kind::WsMulti, m)),
                        Kind::SseMulti => f
                            .sse_multi
                            .get_or_insert_with(|| rejoin::frame(Kind::SseMulti, m)),
                        Kind::Mqtt311 | Kind::Mqtt5 => {
                            let (v, version) = version_at(c.kind());
                            f.mqtt[v + 2 * usize::from(retain)]
                                .get_or_insert_with(|| mqtt::publish_as(version, m, retain))
                        }
                    };
                    match self.limits.deflate_min {
                        Some(min) if c.deflates() => {
                            let at = match c.kind() {
                                Kind::WsIds => 1,
                                Kind::WsMulti => 2,
                                _ => 0,
                            };
                            let base = frame.clone();
                            let z =
                                f.deflated[at].get_or_insert_with(|| rejoin::deflated(&base, min));
                            let sent = self.send(c, z);
                            if sent.is_ok() && z.first().is_some_and(|b| b & deflate::RSV1 != 0) {
                                zipped += 1;
                            }
                            sent
                        }
                        _ => self.send(c, frame),
                    }
                }
                (Ok(Live::Held | Live::Repeat), _) => Ok(()),
                (Err(e), _) => Err(e),
            };
            match sent {
                Ok(()) => delivered += 1,
                Err(e) => behind.push((c.clone(), e)),
            }
        }
        f.next = end;
        self.counters
            .frames_delivered
            .set(self.counters.frames_delivered.get() + delivered);
        let deflated = &self.counters.frames_deflated;
        deflated.set(deflated.get() + zipped);
        self.counters
            .frames_dropped
            .set(self.counters.frames_dropped.get() + behind.len() as u64);
        for (c, e) in behind {
            self.send_failed(&c, e);
        }
        f.cpu += process::thread_cpu().saturating_sub(cpu);
        let more = f.next < f.conns.len();
        if !more {
            self.counters.fanout(f.started.elapsed(), f.cpu);
            self.relayed_through.set(f.message.id);
        }
        more
    }

    /// Advances the clock one tick without visiting anyone (while draining).
    pub(crate) fn advance(&self) -> u32 {
        let now = self.now.get().wrapping_add(1);
        self.now.set(now);
        now
    }

    /// One tick: advances the clock, walks this tick's slice of the table
    /// (a connection whose token expired or that was idle too long is
    /// closed, any other open one pinged), ends closing handshakes past
    /// their grace and queues stalled past `--write-timeout`. So a token is
    /// enforced within one ping interval of its `exp`, with no timer of its own.
    pub(crate) fn tick(&self) {
        let now = self.advance();
        self.publish_due_wills(now);
        let wall = self.wall.get();
        let mut expired = Vec::new();
        let mut idle_out = Vec::new();
        let mut slow = Vec::new();
        {
            let conns = self.conns.borrow();
            for slot in self.sweep.borrow_mut().step(conns.capacity()) {
                let Some(c) = conns.get(slot) else { continue };
                if !c.is_open() {
                    continue;
                }
                // An SSE client never speaks: its keep-alive is a comment,
                // and a dead one is found by its writes failing or stalling.
                let sse = c.kind().is_sse();
                if c.expired(wall) {
                    expired.push(c.clone());
                } else if c.kind().is_mqtt() {
                    // An MQTT client keeps itself alive (PINGREQ): it is
                    // only checked, at its own keep-alive.
                    if c.mqtt_overdue(now) {
                        idle_out.push(c.clone());
                    }
                } else if !sse && wheel::expired(now, c.last_seen(), self.limits.idle) {
                    idle_out.push(c.clone());
                } else {
                    let ping = if sse { &self.keep_alive } else { &self.ping };
                    match self.send(c, ping) {
                        Ok(()) => crate::metrics::inc(&self.counters.pings),
                        Err(e) => slow.push((c.clone(), e)),
                    }
                }
            }
        }
        for c in expired {
            self.close(
                &c,
                auth::CLOSE_TOKEN_EXPIRED,
                "token expired",
                CloseReason::TokenExpired,
            );
        }
        for c in idle_out {
            self.close(
                &c,
                close_code::POLICY,
                "idle timeout",
                CloseReason::IdleTimeout,
            );
        }
        for (c, e) in slow {
            self.send_failed(&c, e);
        }
        self.end_overdue(now);
    }

    /// Ends the closing handshakes past their grace and the queues stalled
    /// past `--write-timeout` at tick `now`. A drain runs only this (no
    /// pings, no idle checks): a client that neither answers our close
    /// frame nor closes its socket must not keep a draining worker up
    /// until `--drain-timeout`.
    pub(crate) fn end_overdue(&self, now: u32) {
        let overdue: Vec<_> = {
            let mut closing = self.closing.borrow_mut();
            let mut out = Vec::new();
            closing.retain(|(c, since)| {
                if c.state() == State::Gone || c.slot() == NONE {
                    return false;
                }
                if wheel::expired(now, *since, self.limits.grace) {
                    out.push(c.clone());
                    return false;
                }
                true
            });
            out
        };
        for c in overdue {
            self.finish(&c);
        }
        let late: Vec<_> = {
            let mut queued = self.queued.borrow_mut();
            let mut late = Vec::new();
            queued.retain(|c| match c.stalled_since(now) {
                Some(since) if c.state() != State::Gone => {
                    if wheel::expired(now, since, self.limits.write) {
                        late.push(c.clone());
                        return false;
                    }
                    true
                }
                _ => {
                    c.unlist();
                    false
                }
            });
            late
        };
        for c in late {
            c.unlist();
            self.close_slow(&c, "timeout");
        }
    }

    /// Starts the closing handshake of every subscriber (a drain); returns
    /// how many there were.
    pub(crate) fn close_all(&self, code: u16, reason: &str, why: CloseReason) -> usize {
        let all = self.conns.borrow().all();
        for c in &all {
            self.close(c, code, reason, why);
        }
        all.len()
    }

    /// Hands `frame` to `c`: straight to the socket when nothing is queued,
    /// else (or for what the socket did not take) to the queue.
    pub(crate) fn send(&self, c: &Rc<Conn<O::Wire>>, frame: &Bytes) -> Result<(), SendError> {
        if c.state() == State::Gone {
            return Err(SendError::Closed);
        }
        if over_ws(c) {
            return self.send_framed(c, frame);
        }
        self.send_raw(c, frame)
    }

    /// Hands an MQTT-over-WebSocket subscriber `packet` in a binary frame:
    /// the header and the packet (encoded once for every subscriber) in
    /// one `writev`; joined only for TLS, behind a queue, or what the
    /// socket did not take.
    fn send_framed(&self, c: &Rc<Conn<O::Wire>>, packet: &[u8]) -> Result<(), SendError> {
        if c.is_tls() || c.has_queue() {
            return self.send_raw(c, &Bytes::from(mqtt_ws::wrap(packet)));
        }
        let (h, n) = mqtt_ws::header(packet.len());
        if let Some(unsent) = c.write_parts(&[&h[..n], packet, &[]])? {
            self.start_queue(c, unsent);
        }
        Ok(())
    }

    /// [`Self::send`] of bytes that are already what goes on the wire (a
    /// WebSocket frame, or a packet of MQTT not over WebSocket).
    fn send_raw(&self, c: &Rc<Conn<O::Wire>>, frame: &Bytes) -> Result<(), SendError> {
        if c.is_tls() {
            let mut out = self.tls_out.borrow_mut();
            if c.seal(frame, &mut out).is_err() {
                return Err(SendError::Broken);
            }
            return self.send_wire(c, &out, |r| Bytes::copy_from_slice(&out[r]));
        }
        self.send_wire(c, frame, |r| frame.slice(r))
    }

    /// Writes `wire` to `c`'s socket, or queues it (as `keep` of the unsent
    /// range) behind what is already queued or what the socket did not take.
    fn send_wire(
        &self,
        c: &Rc<Conn<O::Wire>>,
        wire: &[u8],
        keep: impl Fn(Range<usize>) -> Bytes,
    ) -> Result<(), SendError> {
        if let Some(unsent) = c.write_or_queue(wire, keep, self.limits.max_queue)? {
            self.start_queue(c, unsent);
        }
        Ok(())
    }

    /// Hands the frame made of `parts` to `c` (an MQTT delivery whose
    /// packet id is its own): one `writev` of the parts when nothing is
    /// queued; joined into one buffer only for a TLS subscriber, behind a
    /// queue, or for what the socket did not take.
    pub(crate) fn send_parts(
        &self,
        c: &Rc<Conn<O::Wire>>,
        parts: &[&[u8]; 3],
    ) -> Result<(), SendError> {
        if c.state() == State::Gone {
            return Err(SendError::Closed);
        }
        if c.is_tls() || c.has_queue() || over_ws(c) {
            return self.send(c, &Bytes::from(parts.concat()));
        }
        if let Some(unsent) = c.write_parts(parts)? {
            self.start_queue(c, unsent);
        }
        Ok(())
    }

    /// Starts `c`'s queue: counted, listed for `--write-timeout`, and
    /// watched for room to write.
    fn start_queue(&self, c: &Rc<Conn<O::Wire>>, unsent: Unsent) {
        c.start_queue(unsent, self.now.get());
        self.counters.queued.set(self.counters.queued.get() + 1);
        if !c.list() {
            self.queued.borrow_mut().push(c.clone());
        }
        self.outside.want_write(c.wire(), c.slot(), true);
    }

    /// Drops `c`'s queue, counting its whole frames as dropped; whether
    /// it had a frame partly written.
    fn drop_queue(&self, c: &Conn<O::Wire>) -> bool {
        let Some(q) = c.drop_queue() else {
            return false;
        };
        self.counters
            .queued
            .set(self.counters.queued.get().saturating_sub(1));
        self.counters
            .frames_dropped
            .set(self.counters.frames_dropped.get() + q.whole as u64);
        q.partial
    }

    /// Starts the closing handshake: stop delivering, send a close frame with
    /// `code`, and wait (up to [`CLOSE_GRACE`], kept by the tick) for the client's.
    pub(crate) fn close(&self, c: &Rc<Conn<O::Wire>>, code: u16, reason: &str, why: CloseReason) {
        if !c.is_open() {
            return;
        }
        self.counters.closed(why);
        self.unsubscribe(c);
        if c.kind().is_sse() || c.kind().is_mqtt() {
            // An event stream has no closing handshake: it ends (after what
            // is queued), and the client reconnects with its last id. An
            // MQTT server sends 5.0 clients a DISCONNECT saying why, then
            // closes (3.1.1 has no word for it).
            if c.kind() == Kind::Mqtt5 {
                let _ = self.send(c, &mqtt::disconnect(why));
            }
            self.ws_goodbye(c, why);
            self.end_after_queue(c);
            return;
        }
        c.set_state(if why == CloseReason::ProtocolError {
            State::Failed
        } else {
            State::Closing
        });
        if self.send(c, &close_frame(code, reason)).is_err() {
            self.finish(c);
            return;
        }
        if why == CloseReason::ProtocolError && !c.has_queue() {
            // Nothing more will be read from a client that broke the
            // protocol; FIN after the close frame tells it we are done.
            c.wire().shutdown_write();
        }
        self.closing.borrow_mut().push((c.clone(), self.now.get()));
    }

    /// Ends `c` once its queue is written (at once when it has none).
    fn end_after_queue(&self, c: &Rc<Conn<O::Wire>>) {
        if c.has_queue() {
            c.set_state(State::Finishing);
        } else {
            self.finish(c);
        }
    }

    /// Closes a client that fell behind with 1008: its queued frames are
    /// dropped, the close frame is sent if the socket takes it whole, and the
    /// connection is closed at once (a slow reader gets no grace period).
    pub(crate) fn close_slow(&self, c: &Rc<Conn<O::Wire>>, cause: &'static str) {
        if !c.is_open() {
            self.finish(c);
            return;
        }
        self.counters.closed(CloseReason::SlowConsumer);
        self.counters.slow_consumer(cause);
        let partial = self.drop_queue(c);
        if !partial && c.kind() == Kind::Mqtt5 {
            let mut d = mqtt::disconnect(CloseReason::SlowConsumer);
            if over_ws(c) {
                d = Bytes::from(mqtt_ws::wrap(&d));
            }
            c.write_now(&d, &self.tls_out);
        } else if !partial && !c.kind().is_sse() && !c.kind().is_mqtt() {
            let reason = if cause == "queue" {
                "slow consumer: over --max-queue"
            } else {
                "slow consumer: write timeout"
            };
            c.write_now(&close_frame(close_code::POLICY, reason), &self.tls_out);
        }
        self.finish(c);
    }

    /// A send to `c` failed: close it as slow (its queue is full), or as
    /// lost (its socket is broken or it is gone).
    pub(crate) fn send_failed(&self, c: &Rc<Conn<O::Wire>>, e: SendError) {
        match e {
            SendError::QueueFull => self.close_slow(c, "queue"),
            SendError::Broken | SendError::Closed => self.lost(c),
        }
    }

    /// The socket failed under us or the client left: count it and end it.
    pub(crate) fn lost(&self, c: &Rc<Conn<O::Wire>>) {
        if c.is_open() {
            self.counters.closed(CloseReason::PeerGone);
        }
        self.finish(c);
    }

    /// Takes `c` out of every table; its socket closes when the last
    /// reference (perhaps a fan-out in progress) is dropped.
    pub(crate) fn finish(&self, c: &Rc<Conn<O::Wire>>) {
        if c.state() == State::Gone {
            return;
        }
        c.set_state(State::Gone);
        self.unsubscribe(c);
        self.forget_rejoin(c);
        if c.kind().is_mqtt() {
            self.resumes.borrow_mut().forget(c);
            self.client_ids.borrow_mut().release(c.slot());
            self.publish_will(c);
            self.drop_inflight(c);
        }
        let partial = self.drop_queue(c);
        if !partial {
            c.close_notify(&self.tls_out);
        }
        self.outside.forget(c.wire(), c.tag());
        self.subject_gone(c);
        if c.slot() != NONE {
            self.conns.borrow_mut().remove(c);
            self.counters
                .open
                .set(self.counters.open.get().saturating_sub(1));
            if c.kind().is_mqtt() {
                let mqtt = &self.counters.mqtt_open;
                mqtt.set(mqtt.get().saturating_sub(1));
            }
        }
    }

    /// Reads what the socket has into the scratch buffer and handles every
    /// complete frame (decrypting first, for a TLS subscriber); keeps a
    /// split frame's (or record's) bytes. With `read` false, only handles
    /// bytes already kept (those sent with the upgrade).
    pub(crate) fn on_readable(&self, c: &Rc<Conn<O::Wire>>, read: bool) {
        // A resume's packets wait for its CONNACK (MQTT-3.2.0-1): kept,
        // in the socket or `rest`, until [`Self::session_resumed`].
        if self.resumes.borrow().holds(c) {
            return;
        }
        let tls = c.tls();
        let mut scratch = self.scratch.borrow_mut();
        let mut read = read;
        loop {
            if c.state() == State::Gone {
                return;
            }
            // What was kept goes first. Plain: taken, it is handled now.
            // TLS: copied, so `rest` stays what rustls expects until the
            // next pump replaces it.
            let mut have = 0;
            if let Some(t) = tls {
                if let Some(rest) = t.borrow().rest() {
                    scratch[..rest.len()].copy_from_slice(rest);
                    have = rest.len();
                }
            } else if let Some(rest) = c.take_rest() {
                scratch[..rest.len()].copy_from_slice(&rest);
                have = rest.len();
            }
            if read {
                match c.read_some(&mut scratch[have..]) {
                    Got::Bytes(n) => have += n,
                    Got::Nothing => {
                        if tls.is_none() && have > 0 {
                            c.set_rest(&scratch[..have]);
                        }
                        return;
                    }
                    Got::Ended => {
                        self.lost(c);
                        return;
                    }
                }
            }
            let full = have == scratch.len();
            c.set_last_seen(self.now.get());
            let open = match tls {
                None => self.on_bytes(c, &mut scratch[..have]),
                Some(t) => self.on_records(c, t, &mut scratch[..have]),
            };
            if !open || !full {
                return;
            }
            read = true;
        }
    }

    /// Runs a TLS subscriber's session over the records in `buf`: keeps
    /// what rustls did not consume, sends what the session must send (a key
    /// update, an alert), and handles the frames the records decrypt to (in
    /// the worker's plaintext buffer). False when the connection ended.
    fn on_records(&self, c: &Rc<Conn<O::Wire>>, tls: &RefCell<TlsState>, buf: &mut [u8]) -> bool {
        let mut plain = self.tls_plain.borrow_mut();
        plain.clear();
        if let Some(rest) = c.take_rest() {
            plain.extend_from_slice(&rest);
        }
        let mut out = self.tls_out.borrow_mut();
        out.clear();
        let pumped = tls.borrow_mut().pump(buf, &mut plain, &mut out);
        let sent = out.is_empty()
            || self
                .send_wire(c, &out, |r| Bytes::copy_from_slice(&out[r]))
                .is_ok();
        drop(out);
        let Some(state) = pumped else {
            if c.is_open() {
                self.counters.closed(CloseReason::TlsError);
            }
            self.finish(c);
            return false;
        };
        if !sent {
            self.lost(c);
            return false;
        }
        if !plain.is_empty() && !self.on_bytes(c, &mut plain) {
            return false;
        }
        drop(plain);
        if state == Pumped::Closed {
            // close_notify: nothing more will come.
            self.lost(c);
            return false;
        }
        true
    }

    /// Handles every complete frame in `buf` (a kept remainder followed by
    /// what was just read); keeps a split frame's bytes in `c.rest`. False
    /// when the connection ended.
    fn on_bytes(&self, c: &Rc<Conn<O::Wire>>, buf: &mut [u8]) -> bool {
        if c.state() == State::Failed || c.kind().is_sse() {
            // Discard: the decoder is not trusted after an error, and an
            // SSE client has nothing to say after its request (its end,
            // or a reset, still ends it).
            return true;
        }
        if over_ws(c) {
            return self.on_mqtt_ws_bytes(c, buf);
        }
        if c.kind().is_mqtt() {
            return self.on_mqtt_bytes(c, buf).is_some();
        }
        let have = buf.len();
        let mut pos = 0;
        while pos < have {
            let mut proto = c.proto_mut();
            let Proto::Ws(dec) = &mut *proto else {
                return false;
            };
            match dec.decode(&mut buf[pos..have]) {
                Ok(None) => break,
                Ok(Some(d)) => {
                    pos += d.consumed;
                    if let Some(frame) = d.frame
                        && !self.on_frame(c, frame)
                    {
                        return false;
                    }
                }
                Err(e) => {
                    drop(proto);
                    self.close(
                        c,
                        e.close_code(),
                        &e.to_string(),
                        CloseReason::ProtocolError,
                    );
                    return false;
                }
            }
        }
        if pos < have {
            // Bounded: the decoder refuses a header announcing more than
            // MAX_CLIENT_MESSAGE, so a split frame is at most that plus a header.
            c.set_rest(&buf[pos..have]);
        }
        true
    }

    /// Handles one frame from the client; false when the connection ended.
    fn on_frame(&self, c: &Rc<Conn<O::Wire>>, frame: Frame<'_>) -> bool {
        match frame {
            Frame::Ping(payload) => {
                if c.is_open() {
                    let pong = ws::server_frame(OpCode::Pong, payload);
                    if let Err(e) = self.send(c, &pong) {
                        self.send_failed(c, e);
                        return false;
                    }
                }
                true
            }
            // A connection of several channels asks in text frames.
            Frame::Text(t) if c.kind() == Kind::WsMulti => self.on_request(c, t),
            // One channel: only a token refresh is read.
            Frame::Text(t) if matches!(c.kind(), Kind::Ws | Kind::WsIds) => {
                self.on_single_text(c, t)
            }
            Frame::Binary(_) if c.kind() == Kind::WsMulti => {
                let why = "requests are JSON in text frames (docs/channels.md)";
                self.answer(c, &super::multi::refusal(why, "request", None))
            }
            // Subscribers have nothing to say: data is accepted and ignored,
            // and like a pong it counts as a sign of life.
            Frame::Pong(_) | Frame::Text(_) | Frame::Binary(_) => true,
            Frame::Close { code, .. } => {
                if c.is_open() {
                    self.counters.closed(CloseReason::PeerClose);
                    self.unsubscribe(c);
                    // The reply follows anything still queued.
                    let _ = self.send(c, &close_frame(code.unwrap_or(close_code::NORMAL), ""));
                }
                // Handshake complete (whichever side started it): the server
                // closes the TCP connection first (RFC 6455 section 7.1.1),
                // once the queue is written.
                self.end_after_queue(c);
                false
            }
        }
    }

    /// Writes `c`'s queue as the socket drains.
    pub(crate) fn on_writable(&self, c: &Rc<Conn<O::Wire>>) {
        match c.write_queue(self.now.get()) {
            Drained::Waiting => {}
            Drained::Emptied => {
                self.counters
                    .queued
                    .set(self.counters.queued.get().saturating_sub(1));
                if c.state() == State::Finishing {
                    self.finish(c);
                } else {
                    self.outside.want_write(c.wire(), c.slot(), false);
                }
            }
            Drained::Broken => self.lost(c),
        }
    }

    /// Registers MQTT subscriber `c` after its CONNACK: in the slab and the
    /// readiness set, in no channel until it subscribes.
    /// With its client id's hash and claim `client_id` (none for an empty
    /// or an assigned id), the older of this and a connection that holds
    /// it already, here or on another worker, is closed: taken over (5.0:
    /// DISCONNECT 0x8E).
    pub(crate) fn add_mqtt(
        &self,
        c: Conn<O::Wire>,
        client_id: Option<(u64, Claim)>,
        session: Option<SessionStart>,
    ) -> io::Result<()> {
        // The id is claimed before the packets read with the CONNECT are
        // handled: a DISCONNECT among them ends the connection, and its
        // slot with it.
        let c = self.admit_quiet(c, None)?;
        if let Some((hash, claim)) = client_id {
            let claimed = self.client_ids.borrow_mut().claim(hash, c.slot(), claim);
            let old = match claimed {
                Claimed::Superseded => Some(Rc::clone(&c)),
                Claimed::Replaced(s) => {
                    self.outside.client_id(hash, claim);
                    self.get(u64::from(s))
                }
                Claimed::First => {
                    self.outside.client_id(hash, claim);
                    None
                }
            };
            if let Some(old) = old {
                self.close(&old, 0, "", CloseReason::TakenOver);
            }
            self.cancel_will(hash);
            // After the takeover: a session it parks is the one resumed.
            if let Some(start) = session
                && c.is_open()
            {
                self.open_session(&c, hash, start);
            }
        }
        if c.has_rest() {
            self.on_readable(&c, false);
        }
        Ok(())
    }

    /// A new id for a connection in the session records.
    pub(crate) fn session_id(&self) -> u64 {
        self.resumes.borrow_mut().next_id()
    }

    /// Tells the supervisor of `c`'s session; a resume waits for it.
    fn open_session(&self, c: &Rc<Conn<O::Wire>>, hash: u64, start: SessionStart) {
        self.outside.session_open(SessionOpen {
            hash,
            conn: start.id,
            clean: start.resume.is_none(),
            persistent: start.persistent,
        });
        if let Some(connacks) = start.resume {
            let persist = persist_of(c);
            let waiting = Waiting {
                conn: c.clone(),
                persist,
                hash,
                connacks,
            };
            self.resumes.borrow_mut().wait(start.id, waiting);
            // Nothing it sent is read until its CONNACK is out.
            self.outside.unwatch(c.wire());
        }
    }

    /// The supervisor's answer to a resume: CONNACK (session present as
    /// it says), the session's subscriptions back in the tables, what
    /// came while the client was away, in order; then live messages, less
    /// those the session had. A connection that ended meanwhile parks
    /// what it was given back. Then what the client sent behind its
    /// CONNECT is handled, in order.
    pub(crate) fn session_resumed(&self, r: SessionResumed) {
        let Some(w) = self.resumes.borrow_mut().answered(r.conn) else {
            return;
        };
        let c = &w.conn;
        self.resume_with(&w, r);
        if c.state() == State::Gone {
            return;
        }
        // Watched again: what came after its CONNECT waits in the socket,
        // and the poll reports it.
        if self.outside.watch(c.wire(), c.slot()).is_err() {
            self.lost(c);
            return;
        }
        self.outside.want_write(c.wire(), c.slot(), c.has_queue());
        if c.is_open() && c.has_rest() {
            self.on_readable(c, false);
        }
    }

    /// [`Self::session_resumed`] up to the client's own packets.
    fn resume_with(&self, w: &Waiting<O::Wire>, r: SessionResumed) {
        let c = &w.conn;
        if !c.is_open() {
            if let Some(p) = w.persist {
                self.outside.session_park(SessionPark {
                    hash: w.hash,
                    conn: r.conn,
                    expiry: p.expiry,
                    through: r.through,
                    subs: r.subs,
                    pending: r.messages,
                    ids: r.ids,
                    releases: r.releases,
                    received: r.received,
                });
            }
            return;
        }
        let [absent, present] = &w.connacks;
        if let Err(e) = self.send(c, if r.present { present } else { absent }) {
            self.send_failed(c, e);
            return;
        }
        for sub in &r.subs {
            self.enter_mqtt(c, &sub.filter, sub.options);
        }
        if self.relayed_through.get() < r.through {
            self.resumes.borrow_mut().fence(c, r.through);
            c.set_rejoining(true);
        }
        if let Some(m) = c.proto_mut().mqtt_mut() {
            m.restore_received(&r.received);
        }
        if !self.release_again(c, &r.releases) {
            return;
        }
        let version = version_of(c.kind());
        for (k, m) in r.messages.iter().enumerate() {
            let qos = if m.exactly_once { 2 } else { 1 };
            let Some(q) = Qos1::of(version, m) else {
                continue;
            };
            let q = if qos == 2 { q.exactly_once() } else { q };
            if self.over_client_max(c, m, qos) {
                continue;
            }
            let sent = match r.ids.get(k).copied().unwrap_or(0) {
                0 => self.deliver_qos1(c, &q),
                id => self.deliver_again(c, &q.dup(), id),
            };
            if let Err(e) = sent {
                self.send_failed(c, e);
                return;
            }
            crate::metrics::inc(&self.counters.frames_delivered);
        }
    }

    /// A resumed session's PUBRELs owed (MQTT-4.4.0-1): sent again, each
    /// delivery in flight again until its PUBCOMP. False when the
    /// connection ended.
    fn release_again(&self, c: &Rc<Conn<O::Wire>>, ids: &[u16]) -> bool {
        for &id in ids {
            let now = self.now.get();
            let taken = c
                .proto_mut()
                .mqtt_mut()
                .is_some_and(|m| m.release_again(id, now));
            let Some(packet_id) = PacketId::new(id).filter(|_| taken) else {
                continue;
            };
            crate::metrics::inc(&self.counters.mqtt_inflight);
            if !c.list() {
                self.queued.borrow_mut().push(c.clone());
            }
            let pubrel = Ack {
                packet_id,
                reason: ReasonCode::SUCCESS,
                properties: Properties::EMPTY,
            };
            if !self.reply(c, &Packet::Pubrel(pubrel)) {
                return false;
            }
        }
        true
    }

    /// A resumed session's delivery `p` (DUP set) sent again with the
    /// packet id `id` it had, in flight again whatever the window.
    fn deliver_again(&self, c: &Rc<Conn<O::Wire>>, p: &Qos1, id: u16) -> Result<(), SendError> {
        let queued = c.queued_len();
        let now = self.now.get();
        let id = {
            let mut proto = c.proto_mut();
            let Some(m) = proto.mqtt_mut() else {
                return Err(SendError::Closed);
            };
            m.deliver_again(p, id, queued, self.limits.max_queue, now)
        };
        let Some(id) = id else {
            return Err(SendError::QueueFull);
        };
        crate::metrics::inc(&self.counters.mqtt_inflight);
        if !c.list() {
            self.queued.borrow_mut().push(c.clone());
        }
        self.send_parts(c, &p.parts(&id.to_be_bytes()))
    }

    /// Puts MQTT subscriber `c` back in the tables for `filter` with
    /// subscription byte `sub` (a resumed session's, checked when it was
    /// subscribed).
    fn enter_mqtt(&self, c: &Rc<Conn<O::Wire>>, filter: &str, sub: u8) {
        if let Some(shared) = mqtt_share::parse(filter) {
            let _ = self.share_subscribe(c, shared, sub, c.kind() == Kind::Mqtt5);
        } else if topic::is_wildcard(filter) {
            if self.limits.wildcards {
                let _ = self.channels.borrow_mut().subscribe_wild(filter, c, sub);
            }
        } else if channel::validate(filter).is_ok()
            && self.channels.borrow_mut().subscribe_mqtt(filter, c, sub)
        {
            self.outside.channel_interest(filter, true);
        }
    }

    /// A persistent session's connection is ending: its session goes to
    /// the supervisor (once), with its subscriptions and the last fan-out
    /// done here. One still waiting for its answer parks at the answer.
    fn park_session(&self, c: &Conn<O::Wire>) {
        let Some(p) = persist_of(c).filter(|p| !p.parked) else {
            return;
        };
        if let Some(m) = c.proto_mut().mqtt_mut()
            && let Some(kept) = m.state_mut().persist.as_deref_mut()
        {
            kept.parked = true;
        }
        if self.resumes.borrow().is_waiting(p.id) {
            return;
        }
        let mut subs = self.channels.borrow_mut().mqtt_subscriptions(c);
        // Its shared subscriptions too, as their SUBSCRIBE filters.
        for (key, options) in self.shares.borrow().held(&share_keys(c), c) {
            subs.push(crate::control::SessionSub {
                filter: format!("$share/{key}"),
                options,
            });
        }
        // What the client has not received goes first when it is back.
        let version = version_of(c.kind());
        let unreceived = c.proto().mqtt().map(Mqtt::unreceived).unwrap_or_default();
        let (mut pending, mut ids) = (Vec::new(), Vec::new());
        for (id, q) in &unreceived {
            if let Some(m) = message_of(version, q) {
                pending.push(m);
                ids.push(*id);
            }
        }
        let releases = c.proto().mqtt().map(Mqtt::releasing).unwrap_or_default();
        let received = c.proto().mqtt().map(Mqtt::received_ids).unwrap_or_default();
        self.outside.session_park(SessionPark {
            hash: p.hash,
            conn: p.id,
            expiry: p.expiry,
            through: self.relayed_through.get(),
            subs,
            pending,
            ids,
            releases,
            received,
        });
    }

    /// `c` subscribes to a shared subscription (`$share/...` parsed):
    /// granted the QoS asked, or refused with a reason (counted).
    fn share_subscribe(
        &self,
        c: &Rc<Conn<O::Wire>>,
        shared: Result<(&str, &str), ()>,
        sub: u8,
        v5: bool,
    ) -> ReasonCode {
        let refuse = |kind, code| {
            self.counters.mqtt_refused(kind);
            if v5 { code } else { ReasonCode::UNSPECIFIED }
        };
        let Ok((key, filter)) = shared else {
            return refuse("bad_share", ReasonCode::TOPIC_FILTER_INVALID);
        };
        if topic::check_filter(filter).is_err() {
            return refuse("bad_share", ReasonCode::TOPIC_FILTER_INVALID);
        }
        if topic::is_wildcard(filter) && !self.limits.wildcards {
            return refuse(
                "wildcard_filter",
                ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
            );
        }
        if self.shares.borrow_mut().join(key, c, sub) {
            if let Some(m) = c.proto_mut().mqtt_mut() {
                m.state_mut().shares.push(key.into());
            }
            self.outside.share_member(ShareMember {
                key: key.to_owned(),
                joined: true,
            });
        }
        ReasonCode(sub & mqtt::QOS)
    }

    /// `c` leaves shared subscription `key`: whether it was a member.
    fn leave_share(&self, c: &Conn<O::Wire>, key: &str) -> bool {
        if !self.shares.borrow_mut().leave(key, c) {
            return false;
        }
        if let Some(m) = c.proto_mut().mqtt_mut()
            && let Some(s) = m.more.as_deref_mut()
        {
            s.shares.retain(|k| &**k != key);
        }
        self.outside.share_member(ShareMember {
            key: key.to_owned(),
            joined: false,
        });
        true
    }

    /// `c` is ending: it leaves every shared subscription it had.
    fn leave_shares(&self, c: &Conn<O::Wire>) {
        for key in share_keys(c) {
            self.leave_share(c, &key);
        }
    }

    /// A message the supervisor gave this worker for one member of a
    /// shared subscription: to the member whose turn it is, at the lower
    /// of its QoS and the message's.
    pub(crate) fn share_deliver(&self, d: ShareDeliver) {
        let Some((c, sub)) = self.shares.borrow_mut().pick(&d.key) else {
            return;
        };
        let m = &d.message;
        let published = if m.at_most_once {
            0
        } else if m.exactly_once {
            2
        } else {
            1
        };
        let qos = (sub & mqtt::QOS).min(published);
        if !c.is_open() || self.over_client_max(&c, m, qos) {
            return;
        }
        let version = version_of(c.kind());
        let sent = match Qos1::of(version, m) {
            Some(q) if qos > 0 => {
                let q = if qos == 2 { q.exactly_once() } else { q };
                self.deliver_qos1(&c, &q)
            }
            _ => self.send(&c, &mqtt::publish(version, m)),
        };
        match sent {
            Ok(()) => crate::metrics::inc(&self.counters.frames_delivered),
            Err(e) => self.send_failed(&c, e),
        }
    }

    /// Relayed message `id` needs no fan-out here (nobody's fan-out waits
    /// before it either): sessions parked from now on come after it.
    pub(crate) fn passed(&self, id: u64) {
        self.relayed_through.set(id);
    }

    /// A connection on another worker took the client id `hash`: this
    /// worker's connection that holds it, if any, is closed.
    pub(crate) fn taken_over(&self, hash: u64, claim: Claim) {
        self.cancel_will(hash);
        let slot = self.client_ids.borrow_mut().take(hash, claim);
        if let Some(old) = slot.and_then(|s| self.get(u64::from(s))) {
            self.close(&old, 0, "", CloseReason::TakenOver);
        }
    }

    /// Handles an MQTT-over-WebSocket subscriber's frames in `buf`: their
    /// packets as [`Self::on_mqtt_bytes`] does, then their pings and close;
    /// keeps a split packet and a split frame ([`mqtt_ws::keep`]). False
    /// when the connection ended.
    fn on_mqtt_ws_bytes(&self, c: &Rc<Conn<O::Wire>>, buf: &mut [u8]) -> bool {
        let max_frame = self.limits.mqtt_packet + mqtt_ws::FRAME_SLACK;
        let got = match mqtt_ws::unwrap(buf, max_frame) {
            Ok(got) => got,
            Err(e) => {
                self.counters.mqtt_refused(e.label());
                if c.is_open() {
                    self.counters.closed(CloseReason::ProtocolError);
                    self.unsubscribe(c);
                }
                let _ = self.send_raw(c, &close_frame(e.close_code(), &e.to_string()));
                self.end_after_queue(c);
                return false;
            }
        };
        let Some(used) = self.mqtt_packets(c, &buf[..got.data]) else {
            return false;
        };
        for control in got.controls {
            match control {
                mqtt_ws::Control::Ping(payload) => {
                    let pong = ws::server_frame(OpCode::Pong, &payload);
                    if let Err(e) = self.send_raw(c, &pong) {
                        self.send_failed(c, e);
                        return false;
                    }
                }
                mqtt_ws::Control::Close(code) => {
                    // Without DISCONNECT: its will is published as for a
                    // dropped connection.
                    if c.is_open() {
                        self.counters.closed(CloseReason::PeerClose);
                        self.unsubscribe(c);
                    }
                    let reply = close_frame(code.unwrap_or(close_code::NORMAL), "");
                    let _ = self.send_raw(c, &reply);
                    self.end_after_queue(c);
                    return false;
                }
            }
        }
        let kept = mqtt_ws::keep(&buf[used..got.data], &buf[got.consumed..]);
        if !kept.is_empty() && c.is_open() {
            c.set_rest(&kept);
        }
        true
    }

    /// The WebSocket close frame that follows an MQTT-over-WebSocket
    /// subscriber's last packet; nothing for others.
    fn ws_goodbye(&self, c: &Rc<Conn<O::Wire>>, why: CloseReason) {
        if over_ws(c) {
            let code = if why == CloseReason::ProtocolError {
                close_code::PROTOCOL
            } else {
                close_code::NORMAL
            };
            let _ = self.send_raw(c, &close_frame(code, ""));
        }
    }

    /// Handles every whole packet in `buf`, keeps a split one's bytes;
    /// `None` when the connection ended.
    pub(crate) fn on_mqtt_bytes(&self, c: &Rc<Conn<O::Wire>>, buf: &mut [u8]) -> Option<()> {
        let have = buf.len();
        let pos = self.mqtt_packets(c, buf)?;
        if pos < have && c.is_open() {
            // Bounded: the decoder refuses a packet over max_packet.
            c.set_rest(&buf[pos..have]);
        }
        Some(())
    }

    /// Handles every whole packet in `buf`: the bytes they took, or `None`
    /// when the connection ended.
    fn mqtt_packets(&self, c: &Rc<Conn<O::Wire>>, buf: &[u8]) -> Option<usize> {
        let have = buf.len();
        let mut pos = 0;
        let mut decoder = Decoder::server_connected(version_of(c.kind()), self.limits.mqtt_packet);
        while pos < have {
            if !c.is_open() {
                // Closing after an answer: what follows is not read.
                return Some(have);
            }
            let decoded = decoder.decode(&buf[pos..have]).map_err(|e| {
                let mut out = Vec::new();
                decoder.answer(&e).encode(&mut out);
                (e, out)
            });
            match decoded {
                Ok(None) => break,
                Ok(Some(d)) => {
                    pos += d.consumed;
                    if !self.on_packet(c, d.packet) {
                        return None;
                    }
                }
                Err((e, answer)) => {
                    self.counters.mqtt_refused(e.label());
                    self.fail(c, &answer);
                    return None;
                }
            }
        }
        Some(pos)
    }

    /// Publishes `c`'s will, if it has one (its connection is ending
    /// without a DISCONNECT that dropped it).
    pub(crate) fn publish_will(&self, c: &Conn<O::Wire>) {
        let will = c.proto_mut().mqtt_mut().and_then(Mqtt::take_will);
        let Some(will) = will else { return };
        // 5.0: after its delay, or when its session ends if that is sooner.
        let session = persist_of(c).map_or(0, |p| p.expiry);
        let delay = will.delay.min(session);
        if delay == 0 || will.client == 0 {
            self.send_will(*will);
            return;
        }
        let due = self
            .now
            .get()
            .wrapping_add(wheel::ticks(Duration::from_secs(u64::from(delay))));
        self.delayed_wills.borrow_mut().push((due, will));
        self.counters.mqtt_sent("will_delayed");
    }

    /// Publishes the delayed wills due at tick `now`.
    fn publish_due_wills(&self, now: u32) {
        if self.delayed_wills.borrow().is_empty() {
            return;
        }
        let due: Vec<Box<Will>> = {
            let mut wills = self.delayed_wills.borrow_mut();
            let (due, wait) = wills
                .drain(..)
                // Due: `now` is at or past `at` (ticks wrap).
                .partition(|(at, _)| now.wrapping_sub(*at) < 1 << 31);
            *wills = wait;
            due.into_iter().map(|(_, w)| w).collect()
        };
        for will in due {
            self.send_will(*will);
        }
    }

    /// Client `hash` connected again: its delayed will is not sent.
    fn cancel_will(&self, hash: u64) {
        let mut wills = self.delayed_wills.borrow_mut();
        let before = wills.len();
        wills.retain(|(_, w)| w.client != hash);
        for _ in wills.len()..before {
            self.counters.mqtt_sent("will_cancelled");
        }
    }

    /// Publishes a will now.
    fn send_will(&self, will: Will) {
        {
            let Will {
                channel,
                payload,
                properties,
                retain,
                ..
            } = will;
            // A will is published at QoS 0 (its QoS is not kept).
            let m = Message {
                id: 0,
                message: MessageId::NONE,
                text: std::str::from_utf8(&payload).is_ok(),
                at_most_once: true,
                exactly_once: false,
                properties,
                retained: false,
                origin: 0,
                channel,
                payload,
            };
            self.outside.publish(m, retain);
            self.counters.mqtt_sent("will");
        }
    }

    /// Sends `answer` (if any) and ends `c`: it broke the protocol.
    fn fail(&self, c: &Rc<Conn<O::Wire>>, answer: &[u8]) {
        if c.is_open() {
            self.counters.closed(CloseReason::ProtocolError);
            self.unsubscribe(c);
        }
        if !answer.is_empty() {
            let _ = self.send(c, &Bytes::copy_from_slice(answer));
        }
        self.ws_goodbye(c, CloseReason::ProtocolError);
        self.end_after_queue(c);
    }

    /// Sends a packet to `c`; false (and `c` ended) when it could not.
    fn reply(&self, c: &Rc<Conn<O::Wire>>, p: &Packet<'_>) -> bool {
        self.counters.mqtt_sent(p.packet_type().name());
        let bytes = mqtt::encode(version_of(c.kind()), p);
        match self.send(c, &bytes) {
            Ok(()) => true,
            Err(e) => {
                self.send_failed(c, e);
                false
            }
        }
    }

    /// Handles one packet from the client; false when the connection ended.
    fn on_packet(&self, c: &Rc<Conn<O::Wire>>, p: Packet<'_>) -> bool {
        self.counters.mqtt_received(p.packet_type().name());
        let version = version_of(c.kind());
        match p {
            Packet::Pingreq => self.reply(c, &Packet::Pingresp),
            Packet::Subscribe(s) => self.on_subscribe(c, &s),
            Packet::Unsubscribe(u) => self.on_unsubscribe(c, &u),
            Packet::Publish(p) => self.on_publish(c, &p),
            Packet::Disconnect(d) => {
                // The client's clean end: nothing to answer, and its will
                // is dropped unless it asks for it (5.0's 0x04).
                if d.reason != ReasonCode::DISCONNECT_WITH_WILL
                    && let Some(m) = c.proto_mut().mqtt_mut()
                {
                    m.drop_will();
                }
                // 5.0: the session's expiry may change at the end.
                if let Some(expiry) = d.properties.session_expiry_interval()
                    && let Some(m) = c.proto_mut().mqtt_mut()
                    && let Some(p) = m.more.as_deref_mut().and_then(|s| s.persist.as_deref_mut())
                {
                    p.expiry = expiry;
                }
                self.counters.closed(CloseReason::PeerClose);
                self.unsubscribe(c);
                self.end_after_queue(c);
                false
            }
            Packet::Puback(a) => self.on_delivery_ack(c, DeliveryAck::Puback, a.packet_id),
            Packet::Pubrec(a) if a.reason.0 >= 0x80 => {
                self.on_delivery_ack(c, DeliveryAck::Refused, a.packet_id)
            }
            Packet::Pubrec(a) => self.on_delivery_ack(c, DeliveryAck::Pubrec, a.packet_id),
            Packet::Pubcomp(a) => self.on_delivery_ack(c, DeliveryAck::Pubcomp, a.packet_id),
            // 5.0 AUTH, which it does not offer.
            Packet::Auth(_) => true,
            Packet::Pubrel(a) => self.on_pubrel(c, a.packet_id),
            // A server's packets, or a second CONNECT: the decoder refuses
            // those before they get here.
            _ => {
                let mut out = Vec::new();
                if version == Version::V5 {
                    MqttAnswer::Disconnect(ReasonCode::PROTOCOL_ERROR).encode(&mut out);
                }
                self.counters.mqtt_refused("unexpected_packet");
                self.fail(c, &out);
                false
            }
        }
    }

    fn on_subscribe(&self, c: &Rc<Conn<O::Wire>>, s: &Subscribe<'_>) -> bool {
        let v5 = c.kind() == Kind::Mqtt5;
        if s.properties
            .iter()
            .any(|p| matches!(p, Property::SubscriptionIdentifier(_)))
        {
            // CONNACK said Subscription Identifiers are not available.
            self.counters.mqtt_refused("subscription_identifier");
            return self.protocol_end(c, ReasonCode::SUBSCRIPTION_IDS_NOT_SUPPORTED);
        }
        let mut codes = Vec::with_capacity(s.filters.len());
        // Its subscriptions and their filters' bytes, against the limits.
        let mut held = self.channels.borrow().mqtt_footprint(c);
        // The filters whose retained messages are sent (5.0's retain
        // handling: at every subscribe, only a new one's, or never).
        let mut retained = Vec::new();
        for (filter, options) in &s.filters {
            let shared = mqtt_share::parse(filter);
            // A shared subscription's filter is what its grant must cover.
            let target = match shared {
                Some(Ok((_, f))) => f,
                _ => filter,
            };
            let wants_retained = shared.is_none()
                && match options.retain_handling {
                    RetainHandling::OnSubscribe => true,
                    RetainHandling::OnNewSubscribe => {
                        !self.channels.borrow().has_mqtt_subscription(filter, c)
                    }
                    RetainHandling::Never => false,
                };
            // QoS 0, 1 or 2: what was asked; the 5.0 options beside it.
            let qos = (options.qos as u8).min(2);
            let granted = ReasonCode(qos);
            let sub = qos
                | if options.no_local { mqtt::NO_LOCAL } else { 0 }
                | if options.retain_as_published {
                    mqtt::RETAIN_AS_PUBLISHED
                } else {
                    0
                };
            let new = !self.channels.borrow().has_mqtt_subscription(filter, c);
            let over = new
                .then(|| self.over_subscription_limits(held, filter))
                .flatten();
            let code = if let Some(kind) = over {
                self.counters.mqtt_refused(kind);
                if v5 {
                    ReasonCode::QUOTA_EXCEEDED
                } else {
                    ReasonCode::UNSPECIFIED
                }
            } else if !self.mqtt_may_subscribe(c, target) {
                ReasonCode::NOT_AUTHORIZED
            } else if let Some(shared) = shared {
                self.share_subscribe(c, shared, sub, v5)
            } else if topic::is_wildcard(filter) {
                let ok = self.limits.wildcards
                    && self
                        .channels
                        .borrow_mut()
                        .subscribe_wild(filter, c, sub)
                        .is_ok();
                if ok {
                    granted
                } else {
                    // Redis channels mode: the node subscribes in Redis per
                    // channel, and a filter is not one.
                    self.counters.mqtt_refused("wildcard_filter");
                    if v5 {
                        ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED
                    } else {
                        ReasonCode::UNSPECIFIED
                    }
                }
            } else if channel::validate(filter).is_err() {
                self.counters.mqtt_refused("bad_channel");
                if v5 {
                    ReasonCode::TOPIC_FILTER_INVALID
                } else {
                    ReasonCode::UNSPECIFIED
                }
            } else {
                if self.channels.borrow_mut().subscribe_mqtt(filter, c, sub) {
                    self.outside.channel_interest(filter, true);
                }
                granted
            };
            if code == granted && new {
                held = (held.0 + 1, held.1 + filter.len());
            }
            if code == granted && wants_retained {
                retained.push((*filter).to_owned());
            }
            codes.push(code);
        }
        let answered = self.reply(
            c,
            &Packet::Suback(Suback {
                packet_id: s.packet_id,
                properties: Properties::EMPTY,
                codes,
            }),
        );
        if answered {
            self.ask_retained(c, retained);
        }
        answered
    }

    /// Whether one more subscription, to `filter`, would take a connection
    /// holding `held` (subscriptions, filter bytes) past a limit: which.
    fn over_subscription_limits(&self, held: (usize, usize), filter: &str) -> Option<&'static str> {
        if held.0 >= self.limits.max_subscriptions {
            Some("max_subscriptions")
        } else if held.1 + filter.len() > self.limits.max_filter_bytes {
            Some("max_filter_bytes")
        } else {
            None
        }
    }

    fn on_unsubscribe(&self, c: &Rc<Conn<O::Wire>>, u: &Unsubscribe<'_>) -> bool {
        let v5 = c.kind() == Kind::Mqtt5;
        let mut codes = Vec::new();
        for filter in &u.filters {
            let had = if let Some(Ok((key, _))) = mqtt_share::parse(filter) {
                self.leave_share(c, key)
            } else if topic::is_wildcard(filter) {
                self.channels.borrow_mut().unsubscribe_wild(filter, c)
            } else {
                let left = self.channels.borrow_mut().unsubscribe_mqtt(filter, c);
                if let Some(Some(name)) = &left {
                    self.outside.channel_interest(name, false);
                }
                left.is_some()
            };
            if v5 {
                codes.push(if had {
                    ReasonCode::SUCCESS
                } else {
                    ReasonCode::NO_SUBSCRIPTION_EXISTED
                });
            }
        }
        self.reply(
            c,
            &Packet::Unsuback(Unsuback {
                packet_id: u.packet_id,
                properties: Properties::EMPTY,
                codes,
            }),
        )
    }

    /// A client's PUBLISH: relayed as an HTTP publish is (to every
    /// subscriber of its channel, on every node with Redis). QoS 1 is
    /// acknowledged (PUBACK) and QoS 2 received (PUBREC) only once the
    /// relay took it ([`Self::publish_answered`]); a QoS 2 PUBLISH sent
    /// again before its PUBREL is not relayed again. A payload over
    /// `--max-message` ends the connection (5.0: DISCONNECT 0x95).
    fn on_publish(&self, c: &Rc<Conn<O::Wire>>, p: &Publish<'_>) -> bool {
        if p.payload.len() > self.limits.max_message {
            self.counters.mqtt_refused("too_large");
            return self.protocol_end(c, ReasonCode::PACKET_TOO_LARGE);
        }
        if p.properties.topic_alias().is_some() {
            // CONNACK offered no Topic Alias Maximum (0).
            self.counters.mqtt_refused("topic_alias");
            return self.protocol_end(c, ReasonCode::TOPIC_ALIAS_INVALID);
        }
        let reason = if !self.limits.mqtt_publish {
            // --publish-listen: publishing is for the internal address.
            self.counters.mqtt_refused("publish_not_here");
            ReasonCode::NOT_AUTHORIZED
        } else if channel::validate(p.topic).is_err() {
            self.counters.mqtt_refused("bad_channel");
            ReasonCode::TOPIC_NAME_INVALID
        } else if !self.mqtt_may_publish(c, p.topic) {
            ReasonCode::NOT_AUTHORIZED
        } else {
            ReasonCode::SUCCESS
        };
        let (packet_id, exactly_once) = match p.delivery {
            Delivery::AtMostOnce => {
                if reason == ReasonCode::SUCCESS {
                    self.outside.publish(
                        client_message(p, self.outside.origin(c.slot())),
                        retain_qos(p),
                    );
                }
                return true;
            }
            Delivery::AtLeastOnce(id) => (id, false),
            Delivery::ExactlyOnce(id) => (id, true),
        };
        if reason != ReasonCode::SUCCESS {
            return self.ack_publish(c, packet_id, exactly_once, reason);
        }
        let qos2 = exactly_once.then_some(packet_id.get());
        let incoming = c
            .proto_mut()
            .mqtt_mut()
            .map_or(Incoming::TooMany, |m| m.receive(qos2));
        match incoming {
            Incoming::TooMany => {
                self.counters.mqtt_refused("receive_maximum");
                self.protocol_end(c, ReasonCode::RECEIVE_MAXIMUM_EXCEEDED)
            }
            Incoming::Again(true) => self.ack_publish(c, packet_id, true, ReasonCode::SUCCESS),
            // Sent again before the relay answered: its PUBREC comes then.
            Incoming::Again(false) => true,
            Incoming::Relay => {
                let request = self.outside.publish(
                    client_message(p, self.outside.origin(c.slot())),
                    retain_qos(p),
                );
                let owed = Owed {
                    conn: c.clone(),
                    packet_id,
                    exactly_once,
                };
                self.owed.borrow_mut().insert(request, owed);
                true
            }
        }
    }

    /// Ends `c` for breaking a rule: 5.0 gets DISCONNECT `reason` first.
    fn protocol_end(&self, c: &Rc<Conn<O::Wire>>, reason: ReasonCode) -> bool {
        let mut out = Vec::new();
        if c.kind() == Kind::Mqtt5 {
            MqttAnswer::Disconnect(reason).encode(&mut out);
        }
        self.fail(c, &out);
        false
    }

    /// PUBACK (QoS 1) or PUBREC (QoS 2) `id` with `reason`.
    fn ack_publish(
        &self,
        c: &Rc<Conn<O::Wire>>,
        packet_id: PacketId,
        exactly_once: bool,
        reason: ReasonCode,
    ) -> bool {
        let ack = Ack {
            packet_id,
            reason,
            properties: Properties::EMPTY,
        };
        if exactly_once {
            self.reply(c, &Packet::Pubrec(ack))
        } else {
            self.reply(c, &Packet::Puback(ack))
        }
    }

    /// The relay's answer to MQTT publish `request`: taken (`refused`
    /// `None`), or refused with the supervisor's reason. A client's QoS 1
    /// or 2 PUBLISH is acknowledged now; a refused one gets 5.0's PUBACK
    /// or PUBREC 0x80, and a 3.1.1 client, which has no way to hear a
    /// refusal, is closed rather than told a lost message arrived.
    pub(crate) fn publish_answered(&self, request: u64, id: MessageId, refused: Option<&[u8]>) {
        if self.many_published(request, id, refused) {
            return;
        }
        let Some(o) = self.owed.borrow_mut().remove(&request) else {
            // A QoS 0 publish, or a connection gone.
            return;
        };
        let c = &o.conn;
        if !c.is_open() {
            return;
        }
        let qos2 = o.exactly_once.then_some(o.packet_id.get());
        if let Some(m) = c.proto_mut().mqtt_mut() {
            m.answered(qos2, refused.is_none());
        }
        if refused.is_none() {
            self.ack_publish(c, o.packet_id, o.exactly_once, ReasonCode::SUCCESS);
            return;
        }
        self.counters.mqtt_refused("publish_failed");
        if c.kind() == Kind::Mqtt5 {
            self.ack_publish(c, o.packet_id, o.exactly_once, ReasonCode::UNSPECIFIED);
        } else {
            self.fail(c, &[]);
        }
    }

    /// PUBREL `id`: the QoS 2 exchange ends with PUBCOMP (5.0: 0x92 when
    /// no PUBLISH the relay took has that id).
    fn on_pubrel(&self, c: &Rc<Conn<O::Wire>>, packet_id: PacketId) -> bool {
        let known = c
            .proto_mut()
            .mqtt_mut()
            .is_some_and(|m| m.released(packet_id.get()));
        if !known {
            self.counters.mqtt_refused("unknown_pubrel");
        }
        let reason = if known {
            ReasonCode::SUCCESS
        } else {
            ReasonCode::PACKET_ID_NOT_FOUND
        };
        self.reply(
            c,
            &Packet::Pubcomp(Ack {
                packet_id,
                reason,
                properties: Properties::EMPTY,
            }),
        )
    }

    /// Whether message `m` is too large for MQTT subscriber `c` (its 5.0
    /// Maximum Packet Size): then it is skipped for `c`, and counted.
    fn over_client_max(&self, c: &Conn<O::Wire>, m: &Message, qos: u8) -> bool {
        let over = c.kind() == Kind::Mqtt5
            && c.proto()
                .mqtt()
                .is_some_and(|s| s.too_large(mqtt_qos::publish_len(m, qos)));
        if over {
            self.counters.mqtt_refused("over_client_maximum_packet");
        }
        over
    }

    /// Delivers `p` to `c` at QoS 1: sent with the connection's next
    /// packet id, or held while its receive maximum is in flight.
    pub(crate) fn deliver_qos1(&self, c: &Rc<Conn<O::Wire>>, p: &Qos1) -> Result<(), SendError> {
        if c.state() == State::Gone {
            return Err(SendError::Closed);
        }
        let queued = c.queued_len();
        let slot = {
            let mut proto = c.proto_mut();
            let Some(m) = proto.mqtt_mut() else {
                return Err(SendError::Closed);
            };
            m.deliver(p, queued, self.limits.max_queue, self.now.get())
        };
        match slot {
            None => Err(SendError::QueueFull),
            Some(Slot::Held) => {
                crate::metrics::inc(&self.counters.mqtt_waiting);
                Ok(())
            }
            Some(Slot::Send(id)) => {
                crate::metrics::inc(&self.counters.mqtt_inflight);
                // The tick checks its acknowledgements with the queues.
                if !c.list() {
                    self.queued.borrow_mut().push(c.clone());
                }
                self.send_parts(c, &p.parts(&id.to_be_bytes()))
            }
        }
    }

    /// `c` acknowledged delivery `id`: a PUBREC is answered with PUBREL;
    /// a PUBACK, a PUBCOMP or a refusal frees its slot, and a held delivery
    /// takes it. One for an id not in flight is counted and ignored (5.0:
    /// a PUBREC's PUBREL says 0x92). False when the connection ended.
    fn on_delivery_ack(&self, c: &Rc<Conn<O::Wire>>, ack: DeliveryAck, id: PacketId) -> bool {
        let now = self.now.get();
        let acked = c
            .proto_mut()
            .mqtt_mut()
            .is_some_and(|m| m.acked(ack, id.get(), now));
        if !acked {
            self.counters.mqtt_refused(match ack {
                DeliveryAck::Puback => "unknown_puback",
                DeliveryAck::Pubcomp => "unknown_pubcomp",
                DeliveryAck::Pubrec | DeliveryAck::Refused => "unknown_pubrec",
            });
        }
        if ack == DeliveryAck::Pubrec {
            let reason = if acked {
                ReasonCode::SUCCESS
            } else {
                ReasonCode::PACKET_ID_NOT_FOUND
            };
            let pubrel = Ack {
                packet_id: id,
                reason,
                properties: Properties::EMPTY,
            };
            return self.reply(c, &Packet::Pubrel(pubrel));
        }
        if !acked {
            return true;
        }
        let gauge = &self.counters.mqtt_inflight;
        gauge.set(gauge.get().saturating_sub(1));
        crate::metrics::inc(&self.counters.mqtt_acked);
        loop {
            let next = c.proto_mut().mqtt_mut().and_then(Mqtt::next_held);
            let Some((p, id)) = next else {
                return true;
            };
            let waiting = &self.counters.mqtt_waiting;
            waiting.set(waiting.get().saturating_sub(1));
            crate::metrics::inc(&self.counters.mqtt_inflight);
            if let Err(e) = self.send_parts(c, &p.parts(&id.to_be_bytes())) {
                self.send_failed(c, e);
                return false;
            }
        }
    }

    /// `c` is ending: its deliveries in flight die with it (a clean
    /// session is not resumed), and those held were never sent (dropped).
    fn drop_inflight(&self, c: &Conn<O::Wire>) {
        let inflight = c.proto_mut().mqtt_mut().and_then(Mqtt::take_inflight);
        let Some(i) = inflight else { return };
        let gauge = &self.counters.mqtt_inflight;
        gauge.set(gauge.get().saturating_sub(i.sent() as u64));
        let waiting = &self.counters.mqtt_waiting;
        waiting.set(waiting.get().saturating_sub(i.held() as u64));
        let dropped = &self.counters.frames_dropped;
        dropped.set(dropped.get() + i.held() as u64);
    }

    /// After a SUBSCRIBE whose `filters` (already in the tables) want
    /// retained messages: asks for them, and holds `c`'s live messages
    /// until they come.
    pub(crate) fn ask_retained(&self, c: &Rc<Conn<O::Wire>>, filters: Vec<String>) {
        if filters.is_empty() || !c.is_open() {
            return;
        }
        let request = self.retained.borrow_mut().ask(c);
        c.set_rejoining(true);
        self.outside.ask_retained(request, filters);
    }

    /// The answer to ask `request`: its retained messages go out (those
    /// not held live already), then, once the connection waits for no
    /// other answer, what was held, in order.
    pub(crate) fn retained_answer(&self, request: u64, messages: Vec<RetainedMessage>) {
        let answered = {
            let mut channels = self.channels.borrow_mut();
            self.retained
                .borrow_mut()
                .answer(request, &messages, &mut channels)
        };
        let Some(a) = answered else { return };
        let c = &a.conn;
        if a.done {
            c.set_rejoining(false);
        }
        for (i, out) in a.out.iter().enumerate() {
            // Held live messages and retained ones obey the client's 5.0
            // Maximum Packet Size as a fan-out does: skipped, and counted.
            let len = match out {
                Out::Qos0(bytes) => bytes.len(),
                Out::Qos1(q) => q.len(),
            };
            if c.proto().mqtt().is_some_and(|s| s.too_large(len)) {
                self.counters.mqtt_refused("over_client_maximum_packet");
                continue;
            }
            let sent = match out {
                Out::Qos0(bytes) => self.send(c, bytes),
                Out::Qos1(q) => self.deliver_qos1(c, q),
            };
            if let Err(e) = sent {
                self.retained.borrow_mut().forget(c);
                self.send_failed(c, e);
                return;
            }
            if i < a.retained {
                crate::metrics::inc(&self.counters.mqtt_retained_sent);
            }
        }
    }

    /// Whether MQTT subscriber `c` may subscribe to `filter`; counts a refusal.
    fn mqtt_may_subscribe(&self, c: &Conn<O::Wire>, filter: &str) -> bool {
        let ok = !c.expired(self.wall.get())
            && mqtt_auth::may_subscribe(c.proto().mqtt().and_then(Mqtt::grants), filter);
        if !ok {
            self.counters.mqtt_refused("subscribe_not_granted");
        }
        ok
    }

    /// Whether MQTT subscriber `c` may publish to `channel`; counts a
    /// refusal. A token past its expiry publishes nothing, though the
    /// sweep may not have closed its connection yet.
    fn mqtt_may_publish(&self, c: &Conn<O::Wire>, channel: &str) -> bool {
        let ok = !c.expired(self.wall.get())
            && mqtt_auth::may_publish(
                self.limits.publish_guarded,
                c.proto().mqtt().and_then(Mqtt::grants),
                channel,
            );
        if !ok {
            self.counters.mqtt_refused("publish_not_granted");
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    //! What the tick does to connections, and the drain, both ends in
    //! memory ([`Pair`]) on the worker's clock.

    use throng_proto::ws::{OpCode, close_code};

    use super::Limits;
    use crate::metrics::CloseReason;
    use crate::wheel::TICK;
    use crate::worker::conn::State;
    use crate::worker::pair::{Got, Pair, limits};

    fn pings(got: &[Got]) -> usize {
        got.iter().filter(|g| matches!(g, Got::Ping(_))).count()
    }

    /// The acknowledgements in `raw` (what a 5.0 client read): each
    /// packet's type and reason code.
    fn acks(raw: &[u8]) -> Vec<(&'static str, u8)> {
        use throng_proto::mqtt::{Connack, Decoder, Packet, Properties, ReasonCode, Version};
        let mut dec = Decoder::client(Version::V5, 1 << 16);
        let mut connack = Vec::new();
        Packet::Connack(Connack {
            session_present: false,
            code: ReasonCode::SUCCESS,
            properties: Properties::EMPTY,
        })
        .encode(Version::V5, &mut connack)
        .expect("encode");
        dec.decode(&connack).expect("a CONNACK");
        let mut pos = 0;
        let mut out = Vec::new();
        while let Some(d) = dec.decode(&raw[pos..]).expect("MQTT") {
            pos += d.consumed;
            let name = d.packet.packet_type().name();
            let code = match d.packet {
                Packet::Puback(a) | Packet::Pubrec(a) | Packet::Pubcomp(a) => a.reason.0,
                Packet::Disconnect(x) => x.reason.0,
                _ => 0,
            };
            out.push((name, code));
        }
        out
    }

    /// A client's QoS 1 and 2 PUBLISHes are acknowledged only with the
    /// relay's answer, in the reason it gives; a QoS 2 one sent again
    /// before PUBREL is relayed once.
    #[test]
    fn a_publish_is_acknowledged_by_the_relays_answer_and_a_qos2_one_relayed_once() {
        use throng_proto::mqtt::{Delivery, Packet, Properties, Publish, Version};
        let mut p = Pair::defaults();
        let (i, _) = p.connect_mqtt(Version::V5);
        let publish = |delivery| {
            let mut out = Vec::new();
            Packet::Publish(Publish {
                dup: false,
                delivery,
                retain: false,
                topic: "q/a",
                properties: Properties::EMPTY,
                payload: b"x",
            })
            .encode(Version::V5, &mut out)
            .expect("encode");
            out
        };
        let q2 = publish(Delivery::ExactlyOnce(5.try_into().unwrap()));
        p.clients[i].send_raw(&q2);
        p.clients[i].send_raw(&q2);
        p.clients[i].send_raw(&publish(Delivery::AtLeastOnce(6.try_into().unwrap())));
        p.drive();
        assert_eq!(
            p.subs.outside().published.borrow().len(),
            2,
            "the QoS 2 one once"
        );
        assert!(
            acks(&p.clients[i].take_raw()).is_empty(),
            "nothing before the relay"
        );
        p.subs
            .publish_answered(1, crate::history::MessageId::NONE, None);
        p.subs.publish_answered(
            2,
            crate::history::MessageId::NONE,
            Some(b"Redis is unreachable"),
        );
        p.subs
            .publish_answered(99, crate::history::MessageId::NONE, None);
        p.drive();
        assert_eq!(
            acks(&p.clients[i].take_raw()),
            [("PUBREC", 0), ("PUBACK", 0x80)]
        );
        // Again after the relay took it: PUBREC again, not relayed again.
        p.clients[i].send_raw(&q2);
        p.drive();
        assert_eq!(acks(&p.clients[i].take_raw()), [("PUBREC", 0)]);
        assert_eq!(p.subs.outside().published.borrow().len(), 2);
    }

    /// A fan-out in turns: a subscriber who leaves between turns is
    /// skipped, one who arrives gets the next message, and nobody gets a
    /// message twice or misses it.
    #[test]
    fn a_fanout_in_turns_writes_each_subscriber_it_began_with_once() {
        let mut p = Pair::defaults();
        let subs: Vec<usize> = (0..10).map(|_| p.connect("news")).collect();
        let m = crate::control::Message {
            id: 1,
            message: crate::history::MessageId::NONE,
            text: true,
            at_most_once: false,
            exactly_once: false,
            properties: bytes::Bytes::new(),
            retained: false,
            origin: 0,
            channel: "news".into(),
            payload: bytes::Bytes::from_static(b"one"),
        };
        let mut f = p.subs.begin_fanout(&m);
        assert!(p.subs.fanout_some(&mut f, 4), "six left");
        // Between turns: the third, already written to, leaves (the channel's
        // table moves its last subscriber into its place), the seventh, not
        // yet written to, leaves too, and a newcomer arrives.
        p.clients[subs[2]].close(close_code::NORMAL);
        p.clients[subs[6]].close(close_code::NORMAL);
        p.drive();
        let late = p.connect("news");
        assert!(p.subs.fanout_some(&mut f, 4));
        assert!(!p.subs.fanout_some(&mut f, 4), "done");
        p.drive();
        let texts = |got: Vec<Got>| {
            got.into_iter()
                .filter(|g| matches!(g, Got::Text(_)))
                .count()
        };
        for (k, &i) in subs.iter().enumerate() {
            let n = texts(p.clients[i].take());
            assert_eq!(n, usize::from(k != 6), "subscriber {k}");
        }
        assert_eq!(texts(p.clients[late].take()), 0, "arrived after it began");
        assert_eq!(p.counters().frames_delivered.get(), 9);
        assert_eq!(p.counters().frames_dropped.get(), 0);
        assert_eq!(
            p.publish("news", "two"),
            9,
            "8 left of 10, and the newcomer"
        );
    }

    #[test]
    fn a_silent_client_is_closed_1008_and_dropped_after_the_grace() {
        let mut p = Pair::new(limits(1 << 20, 3, 1000, 2));
        let a = p.connect("news");
        p.tick(2);
        assert_eq!(pings(&p.clients[a].take()), 2, "pinged while silent");
        p.tick(1);
        assert_eq!(
            p.clients[a].take(),
            [Got::Close(Some(close_code::POLICY), "idle timeout".into())]
        );
        assert_eq!(p.conn(a).unwrap().state(), State::Closing);
        assert_eq!(p.publish("news", "x"), 0, "no longer delivered to");
        p.tick(1);
        assert!(!p.clients[a].server_closed(), "within the grace");
        p.tick(1);
        assert!(p.clients[a].server_closed(), "grace over: closed");
        assert_eq!(p.counters().closed.borrow()["idle_timeout"], 1);
        assert_eq!(p.counters().open.get(), 0);
    }

    #[test]
    fn a_client_that_answers_pings_stays_and_a_close_answered_ends_at_once() {
        let mut p = Pair::new(limits(1 << 20, 3, 1000, 50));
        let a = p.connect("news");
        for _ in 0..20 {
            p.tick(1);
            for g in p.clients[a].take() {
                assert_eq!(g, Got::Ping(Vec::new()));
                p.clients[a].send(OpCode::Pong, b"");
            }
        }
        assert!(p.conn(a).unwrap().is_open());
        assert_eq!(p.counters().pings.get(), 20);
        // The server closes (a drain), the client answers: gone before the grace.
        p.subs
            .close_all(close_code::GOING_AWAY, "bye", CloseReason::Shutdown);
        p.drive();
        let got = p.clients[a].take();
        assert_eq!(
            got,
            [Got::Close(Some(close_code::GOING_AWAY), "bye".into())]
        );
        p.clients[a].close(close_code::GOING_AWAY);
        p.drive();
        p.tick(1);
        assert!(p.clients[a].server_closed());
    }

    #[test]
    fn pings_are_spread_over_the_interval_one_per_connection() {
        let mut p = Pair::new(Limits {
            ping_interval: TICK * 10,
            ..limits(1 << 20, 1000, 1000, 50)
        });
        let clients: Vec<usize> = (0..20).map(|_| p.connect("c")).collect();
        for _ in 0..10 {
            let before = p.counters().pings.get();
            p.tick(1);
            assert_eq!(p.counters().pings.get() - before, 2, "two per tick");
        }
        for &c in &clients {
            assert_eq!(pings(&p.clients[c].take()), 1);
        }
    }

    #[test]
    fn an_expired_token_closes_its_subscriber_4001_within_one_sweep_and_no_one_else() {
        let mut p = Pair::new(Limits {
            ping_interval: TICK * 10,
            ..limits(1 << 20, 1000, 1000, 50)
        });
        p.subs.set_wall(1_000);
        let short = p.connect_until("news", 1_005);
        let long = p.connect_until("news", 2_000);
        let plain = p.connect("news");
        // A whole sweep just before exp: nobody is closed.
        p.subs.set_wall(1_004);
        p.tick(10);
        assert!(p.conn(short).unwrap().is_open());
        p.subs.set_wall(1_005);
        p.tick(10);
        let got = p.clients[short].take();
        assert_eq!(
            got.last(),
            Some(&Got::Close(Some(4001), "token expired".into())),
            "{got:?}"
        );
        assert_eq!(p.publish("news", "still here"), 2);
        for c in [long, plain] {
            assert!(p.conn(c).unwrap().is_open());
            assert_eq!(
                p.clients[c].take().last(),
                Some(&Got::Text("still here".into()))
            );
        }
        assert_eq!(p.counters().closed.borrow()["token_expired"], 1);
        p.clients[short].close(4001);
        p.drive();
        p.tick(1);
        assert!(p.clients[short].server_closed());
    }

    #[test]
    fn a_queue_without_progress_for_write_timeout_closes_the_client() {
        let mut p = Pair::new(Limits {
            ping_interval: TICK * 1000,
            ..limits(1 << 20, 1000, 3, 50)
        });
        let a = p.connect_with("news", 8, b"");
        p.clients[a].reading = false;
        p.publish("news", &"x".repeat(200));
        // Reading a little each tick is progress: the deadline moves.
        for _ in 0..10 {
            assert!(p.clients[a].read() > 0);
            p.tick(1);
            assert!(p.conn(a).unwrap().has_queue());
        }
        p.tick(2);
        assert!(p.conn(a).unwrap().is_open());
        p.tick(1);
        assert!(p.conn(a).is_none(), "3 ticks without progress");
        assert_eq!(p.counters().slow_consumer.borrow()["timeout"], 1);
        assert_eq!(p.counters().closed.borrow()["slow_consumer"], 1);
        assert_eq!(p.counters().queued.get(), 0);
        p.tick(1);
        assert!(p.clients[a].server_closed());
    }

    #[test]
    fn the_first_and_last_subscriber_of_a_channel_are_reported() {
        let mut p = Pair::defaults();
        let (a, b) = (p.connect("x"), p.connect("x"));
        let c = p.connect("y");
        p.clients[a].close(close_code::NORMAL);
        p.drive();
        assert_eq!(
            *p.subs.outside().interest.borrow(),
            [("x".to_owned(), true), ("y".to_owned(), true)]
        );
        p.clients[b].fin();
        p.reset(c);
        p.drive();
        assert_eq!(
            p.subs.outside().interest.borrow()[2..],
            [("x".to_owned(), false), ("y".to_owned(), false)]
        );
        assert_eq!(p.subs.len(), 0);
    }

    #[test]
    fn a_drain_closes_everyone_with_1001() {
        let mut p = Pair::defaults();
        let all: Vec<usize> = (0..3).map(|i| p.connect(&format!("c{i}"))).collect();
        let n = p.subs.close_all(
            close_code::GOING_AWAY,
            "server shutting down",
            CloseReason::Shutdown,
        );
        assert_eq!(n, 3);
        p.drive();
        for &c in &all {
            assert_eq!(
                p.clients[c].take(),
                [Got::Close(
                    Some(close_code::GOING_AWAY),
                    "server shutting down".into()
                )]
            );
            p.clients[c].close(close_code::GOING_AWAY);
        }
        p.drive();
        assert_eq!(p.subs.len(), 0);
        assert_eq!(p.counters().closed.borrow()["shutdown"], 3);
        assert!(!p.counters().closed.borrow().contains_key("peer_close"));
    }

    #[test]
    fn an_sse_subscriber_gets_events_and_comments_is_never_idle_and_a_drain_ends_its_stream() {
        use crate::worker::rejoin::Kind;
        let mut p = Pair::new(limits(1 << 20, 3, 1000, 2));
        let a = p.connect_kind("news", Kind::Sse, None);
        p.clients[a].reading = false; // it reads raw bytes, not frames
        p.publish("news", "two\nlines");
        assert_eq!(p.clients[a].take_raw(), b"data: two\ndata: lines\n\n");
        // Well past the idle timeout: a comment per sweep, never closed.
        p.tick(10);
        assert_eq!(p.clients[a].take_raw(), b":\n".repeat(10));
        assert!(p.conn(a).unwrap().is_open());
        // What the client sends is dropped, not decoded as WebSocket.
        p.clients[a].send_raw(b"GET / HTTP/1.1\r\n\r\n");
        p.drive();
        assert!(p.conn(a).unwrap().is_open());
        p.subs
            .close_all(close_code::GOING_AWAY, "bye", CloseReason::Shutdown);
        p.drive();
        assert!(p.clients[a].server_closed(), "no handshake to wait for");
        assert!(p.clients[a].take_raw().is_empty(), "no close frame");
        assert_eq!(p.counters().closed.borrow()["shutdown"], 1);
    }

    /// A supervisor (the real [`History`]) and one worker (the real
    /// subscribers, in memory), with the two sockets between them as
    /// queues: every order of publishing, delivering, the subscriber's
    /// reconnect and the history's answer.
    mod rejoin_model {
        use std::collections::VecDeque;

        use bytes::Bytes;

        use crate::control::Message;
        use crate::history::{History, Kept, Limits, MessageId};
        use crate::worker::pair::{Got, Pair};
        use crate::worker::rejoin::Kind;

        const EPOCH: u64 = 77;

        /// What the worker reads from its socket, in order.
        enum ToWorker {
            Deliver(Message),
            Recovered(u64, bool, Vec<Kept>),
        }

        #[derive(Clone, Copy, Debug)]
        enum Step {
            /// The supervisor relays the next publish (numbers and keeps it).
            Publish,
            /// The supervisor answers the rejoin request.
            Answer,
            /// The worker reads the next record from its socket.
            Read,
            /// The worker reads the answer, which came apart from the
            /// messages (as through Redis: another connection).
            ReadAnswer,
            /// The subscriber reconnects.
            Rejoin,
        }

        /// Every valid order of `publishes` publishes, one rejoin and its
        /// answer; `apart`: the answer does not queue behind the messages.
        fn schedules(publishes: usize, apart: bool) -> Vec<Vec<Step>> {
            struct Walk {
                publishes: usize,
                apart: bool,
                path: Vec<Step>,
                out: Vec<Vec<Step>>,
            }
            // (published, rejoined, answered, records read, answer read)
            type State = (usize, bool, bool, usize, bool);
            fn walk(w: &mut Walk, (published, rejoined, answered, read, got): State) {
                let queued = published + usize::from(answered && !w.apart);
                if published == w.publishes && answered && read == queued && (got || !w.apart) {
                    w.out.push(w.path.clone());
                    return;
                }
                let go = |w: &mut Walk, step, state| {
                    w.path.push(step);
                    walk(w, state);
                    w.path.pop();
                };
                if published < w.publishes {
                    go(
                        w,
                        Step::Publish,
                        (published + 1, rejoined, answered, read, got),
                    );
                }
                if !rejoined {
                    go(w, Step::Rejoin, (published, true, answered, read, got));
                }
                if rejoined && !answered {
                    go(w, Step::Answer, (published, rejoined, true, read, got));
                }
                if read < queued {
                    go(
                        w,
                        Step::Read,
                        (published, rejoined, answered, read + 1, got),
                    );
                }
                if w.apart && answered && !got {
                    go(
                        w,
                        Step::ReadAnswer,
                        (published, rejoined, answered, read, true),
                    );
                }
            }
            let mut w = Walk {
                publishes,
                apart,
                path: Vec::new(),
                out: Vec::new(),
            };
            walk(&mut w, (0, false, false, 0, false));
            w.out
        }

        /// What the rejoining subscriber received: `None` for the marker, else ids.
        fn received(got: Vec<Got>) -> Vec<Option<u64>> {
            got.into_iter()
                .filter_map(|g| match g {
                    Got::Text(t) => {
                        let (head, body) = t.split_once('\n').expect("throng.v1 framing");
                        if head == "!incomplete" {
                            return Some(None);
                        }
                        let id: MessageId = head.parse().expect("an id");
                        assert_eq!(id.epoch, EPOCH);
                        assert_eq!(body, format!("m{}", id.seq));
                        Some(Some(id.seq))
                    }
                    Got::Ping(_) => None,
                    other => panic!("unexpected {other:?}"),
                })
                .collect()
        }

        /// Runs one order: `before` messages were published while the
        /// subscriber was away (it saw up to `seen`), `publishes` follow.
        fn run(keep: usize, before: u64, seen: u64, steps: &[Step]) -> (Vec<Option<u64>>, u64) {
            let mut answers = VecDeque::new();
            let mut h = History::new(
                Limits {
                    keep,
                    ttl: None,
                    max_bytes: 1 << 20,
                },
                EPOCH,
            );
            let mut seq = 0;
            let mut record = |h: &mut History| {
                seq += 1;
                let body = Bytes::from(format!("m{seq}"));
                let message = h.record("c", true, &body, 0);
                Message {
                    id: seq,
                    message,
                    text: true,
                    at_most_once: false,
                    exactly_once: false,
                    properties: Bytes::new(),
                    retained: false,
                    origin: 0,
                    channel: "c".into(),
                    payload: body,
                }
            };
            for _ in 0..before {
                record(&mut h);
            }
            let mut p = Pair::defaults();
            let live = p.connect("c");
            let mut to_worker = VecDeque::new();
            let mut client = None;
            let (mut published, mut rejoined_at) = (before, 0);
            for step in steps {
                match step {
                    Step::Publish => {
                        published += 1;
                        to_worker.push_back(ToWorker::Deliver(record(&mut h)));
                    }
                    Step::Rejoin => {
                        let since = MessageId {
                            epoch: EPOCH,
                            seq: seen,
                        };
                        client = Some(p.connect_kind("c", Kind::WsIds, Some(since)));
                        rejoined_at = published;
                    }
                    Step::Answer => {
                        let (req, channel, since) =
                            p.subs.outside().recovers.borrow_mut().remove(0);
                        let r = h.recover(&channel, since, 0);
                        let answer = ToWorker::Recovered(req, r.complete, r.messages);
                        if steps.iter().any(|s| matches!(s, Step::ReadAnswer)) {
                            answers.push_back(answer);
                        } else {
                            to_worker.push_back(answer);
                        }
                    }
                    Step::ReadAnswer => {
                        if let Some(ToWorker::Recovered(req, complete, kept)) = answers.pop_front()
                        {
                            p.subs.recovered(req, complete, kept);
                        }
                    }
                    Step::Read => match to_worker.pop_front() {
                        Some(ToWorker::Deliver(m)) => {
                            p.subs.fanout(&m);
                        }
                        Some(ToWorker::Recovered(req, complete, kept)) => {
                            p.subs.recovered(req, complete, kept);
                        }
                        None => unreachable!("schedules read only what was queued"),
                    },
                }
                p.drive();
            }
            assert!(p.conn(live).is_some());
            let client = client.expect("rejoined");
            (received(p.clients[client].take()), rejoined_at)
        }

        #[test]
        fn with_enough_history_every_order_gives_every_message_once_in_order() {
            let all = schedules(4, false);
            assert!(all.len() > 500, "{}", all.len());
            // Through Redis the answer may also overtake the messages.
            let apart = schedules(4, true);
            assert!(apart.len() > all.len(), "{}", apart.len());
            for steps in all.iter().chain(&apart) {
                // 3 published while away, the client saw 1: it must get 2..=7.
                let (got, _) = run(100, 3, 1, steps);
                let want: Vec<Option<u64>> = (2..=7).map(Some).collect();
                assert_eq!(got, want, "{steps:?}");
            }
        }

        #[test]
        fn with_too_little_history_the_marker_comes_first_and_nothing_repeats() {
            for steps in schedules(3, false).iter().chain(&schedules(3, true)) {
                let (got, rejoined_at) = run(2, 4, 1, steps);
                assert_eq!(got.first(), Some(&None), "2 and 3 were dropped: {steps:?}");
                let ids: Vec<u64> = got[1..].iter().map(|x| x.expect("one marker")).collect();
                assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?} {steps:?}");
                assert_eq!(ids.last(), Some(&7), "{steps:?}");
                // In order with the messages, everything published after the
                // reconnect arrives; an answer that overtook them (Redis) may
                // leave out what it no longer held: it said it was incomplete.
                if !steps.iter().any(|s| matches!(s, Step::ReadAnswer)) {
                    for s in rejoined_at + 1..=7 {
                        assert!(ids.contains(&s), "{s} missing from {ids:?}: {steps:?}");
                    }
                }
            }
        }
    }
}
