//! The MQTT listener (`--mqtt-listen`): a connection's handshake (CONNECT
//! within `--handshake-timeout`, CONNACK), then its life as a subscriber in
//! the worker's tables beside WebSocket and SSE ones, and the packets it
//! sends (SUBSCRIBE, UNSUBSCRIBE, PUBLISH, PINGREQ, DISCONNECT).
//!
//! A topic is a channel: an MQTT subscriber of `sensors/42` gets what any
//! route publishes there (HTTP, Redis, another MQTT client), and what it
//! publishes reaches WebSocket and SSE subscribers too. Sessions are clean
//! only: a client asking for a persistent one gets a clean one, and
//! CONNACK says so (session present 0). Messages go out at QoS 0 as one
//! PUBLISH encoded per worker and per version, written to every MQTT
//! subscriber as a WebSocket frame is to every WebSocket one
//! ([`super::subscribers`]). A subscriber's state is a few bytes in its
//! `Conn` and a box for the rarer parts ([`Mqtt`]); an idle one of one
//! channel has no box and no buffer.
//!
//! A wildcard filter (`+`, `#`) is not a channel: it is indexed in the
//! worker's trie ([`super::table::Channels`]), and a connection two of whose
//! filters match a topic gets its message once.
//!
//! `--mqtts-listen` runs the TLS handshake first (the `--tls-listen` set-up:
//! certificate, tickets), then the same; a TLS subscriber's session is
//! the same box a WebSocket one's is.
//!
//! A subscription is granted the QoS it asked, at most 1; QoS 1
//! deliveries, each with its own packet id, are in [`super::mqtt_qos`].
//!
//! A retained PUBLISH is relayed and kept as its channel's retained
//! message; a new subscription gets the retained messages its filters
//! match first ([`super::mqtt_retain`]).
//!
//! Where `--auth-*` or `--publish-key-file` guard the server, CONNECT's
//! password is checked and SUBSCRIBE, PUBLISH and the will follow what it
//! grants ([`super::mqtt_auth`]).

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use throng_proto::mqtt::{
    self, Ack, Connack, Decoder, Delivery, Disconnect, Packet, Properties, PropertiesBuf, Property,
    Publish, ReasonCode, RetainHandling, Suback, Subscribe, Unsuback, Unsubscribe, Version,
};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::conn::{Conn, State, TlsState};
use super::mqtt_auth::{self, MqttGrants};
use super::rejoin::Kind;
use super::state::Worker;
use super::subscribers::{Outside, SCRATCH, Subscribers};
use super::table::NONE;
use crate::addresses::Source;
use crate::channel;
use crate::control::Message;
use crate::metrics::CloseReason;
use crate::tls::stream::{Io, TlsStream};
use crate::wheel;

/// What an MQTT subscriber keeps in its [`Conn`], in the WebSocket
/// decoder's place (so neither grows): its keep-alive, its receive
/// maximum, the QoS of its first subscription, and a box for the rest,
/// made only when there is some. An idle subscriber of one channel has no
/// box at all: that subscription is its `Conn`'s channel, as a WebSocket
/// subscriber's is, and its decoder is made per read
/// ([`Decoder::server_connected`]).
pub(crate) struct Mqtt {
    /// Ticks without a packet from the client after which it is closed:
    /// 1.5 times its keep-alive, as the specification says; 0: never.
    pub(crate) keep_alive: u32,
    /// QoS 1 deliveries it may have awaiting PUBACK: its 5.0 receive
    /// maximum, at most [`super::mqtt_qos::MAX_INFLIGHT`].
    pub(crate) receive_max: u16,
    /// The QoS (0 or 1) of its subscription to its `Conn`'s channel, when
    /// it has one: a connection's only subscription is kept there
    /// ([`super::table::Channels::subscribe_mqtt`]).
    pub(crate) qos: u8,
    /// Everything else; `None` while there is nothing.
    pub(crate) more: Option<Box<MqttState>>,
}

impl Mqtt {
    /// A connection's state after CONNACK: its keep-alive in ticks (0: none).
    pub(crate) fn new(keep_alive: u32) -> Self {
        Self {
            keep_alive,
            receive_max: super::mqtt_qos::MAX_INFLIGHT,
            qos: 0,
            more: None,
        }
    }

    /// Its boxed state, if it has one.
    pub(crate) fn state(&self) -> Option<&MqttState> {
        self.more.as_deref()
    }

    /// Its boxed state, made if it has none.
    pub(crate) fn state_mut(&mut self) -> &mut MqttState {
        self.more.get_or_insert_with(Box::default)
    }

    /// Drops the box once nothing is in it, so a subscriber that is idle
    /// again costs what it did before.
    pub(crate) fn shrink(&mut self) {
        if self.more.as_deref().is_some_and(MqttState::is_empty) {
            self.more = None;
        }
    }
}

/// The rarer part of an MQTT subscriber's state, boxed ([`Mqtt::more`]).
#[derive(Default)]
pub(crate) struct MqttState {
    /// Its subscriptions, one per channel, when it has more than one
    /// subscription ([`super::table::Channels`]).
    pub(crate) subs: Vec<Sub>,
    /// Its wildcard subscriptions.
    pub(crate) wild: Vec<WildSub>,
    /// The last lookup that found it ([`super::table::Channels::for_each_mqtt`]).
    pub(crate) seen: u64,
    /// Its will: published if it ends without a DISCONNECT.
    pub(crate) will: Option<Box<Will>>,
    /// Its QoS 1 deliveries awaiting PUBACK or held; `None` when there
    /// are none ([`super::mqtt_qos`]).
    pub(crate) inflight: Option<Box<super::mqtt_qos::Inflight>>,
    /// What its credential grants where `--auth-*` or `--publish-key-file`
    /// guard the server ([`super::mqtt_auth`]); `None` elsewhere.
    pub(crate) auth: Option<Box<MqttGrants>>,
}

impl MqttState {
    fn is_empty(&self) -> bool {
        self.subs.is_empty()
            && self.wild.is_empty()
            && self.will.is_none()
            && self.inflight.is_none()
            && self.auth.is_none()
    }
}

/// A will message: a channel and a payload, and its QoS when it is to be
/// retained.
pub(crate) struct Will {
    pub(crate) channel: String,
    pub(crate) payload: Bytes,
    pub(crate) retain: Option<u8>,
}

/// One wildcard subscription: its filter, and its position in the filter's
/// list in the trie.
#[derive(Debug, Clone)]
pub(crate) struct WildSub {
    pub(crate) filter: Rc<str>,
    pub(crate) pos: u32,
}

/// One subscription of an MQTT subscriber: its channel's id, and its
/// position in that channel's MQTT list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sub {
    pub(crate) channel: u32,
    pub(crate) pos: u32,
}

/// Bytes of a packet besides a PUBLISH's payload that `--max-message`
/// leaves room for: its headers, a channel name, a few properties.
const PACKET_OVERHEAD: usize = 1024;

/// The largest packet a client may send: a PUBLISH of `--max-message`
/// bytes. A packet that arrives split is kept and read again in the
/// worker's scratch buffer, which must hold it and leave room to read.
pub(crate) fn max_packet(max_message: usize) -> usize {
    max_message.saturating_add(PACKET_OVERHEAD).min(SCRATCH / 2)
}

/// The QoS 0 PUBLISH of message `m` for a subscriber of `version`.
pub(crate) fn publish(version: Version, m: &Message) -> Bytes {
    let p = Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::AtMostOnce,
        retain: false,
        topic: &m.channel,
        properties: Properties::EMPTY,
        payload: &m.payload,
    });
    let mut out = Vec::with_capacity(m.payload.len() + m.channel.len() + 8);
    // A channel name is at most 128 bytes and a payload at most
    // --max-message: the encoder's limits (64 KiB topics, 256 MiB packets)
    // are never reached. Should one be, nothing is sent.
    match p.encode(version, &mut out) {
        Ok(()) => Bytes::from(out),
        Err(_) => Bytes::new(),
    }
}

/// The 5.0 DISCONNECT a subscriber closed for `why` gets.
pub(crate) fn disconnect(why: CloseReason) -> Bytes {
    let reason = match why {
        CloseReason::Shutdown => ReasonCode::SERVER_SHUTTING_DOWN,
        CloseReason::IdleTimeout => ReasonCode::KEEP_ALIVE_TIMEOUT,
        CloseReason::SlowConsumer => ReasonCode::QUOTA_EXCEEDED,
        CloseReason::TokenExpired => ReasonCode::NOT_AUTHORIZED,
        CloseReason::ProtocolError => ReasonCode::PROTOCOL_ERROR,
        CloseReason::PeerClose | CloseReason::PeerGone | CloseReason::TlsError => {
            ReasonCode::UNSPECIFIED
        }
    };
    encode(Version::V5, &Packet::Disconnect(Disconnect::new(reason)))
}

/// A packet the server sends; those it builds have no field near the
/// encoder's limits, so an error (none is expected) sends nothing.
fn encode(version: Version, p: &Packet<'_>) -> Bytes {
    let mut out = Vec::with_capacity(16);
    match p.encode(version, &mut out) {
        Ok(()) => Bytes::from(out),
        Err(_) => Bytes::new(),
    }
}

/// Whether MQTT subscriber `c` said nothing for longer than its keep-alive
/// allows. The tick's sweep asks, once per `--ping-interval` for each
/// connection: a silent client is closed up to one interval late (MQTT
/// servers commonly check on a period; no timer per connection).
pub(crate) fn overdue<W>(c: &Conn<W>, now: u32) -> bool {
    let proto = c.proto.borrow();
    proto
        .mqtt()
        .is_some_and(|m| m.keep_alive != 0 && wheel::expired(now, c.last_seen.get(), m.keep_alive))
}

/// The MQTT version a subscriber of `kind` speaks.
pub(crate) fn version_of(kind: Kind) -> Version {
    if kind == Kind::Mqtt5 {
        Version::V5
    } else {
        Version::V311
    }
}

impl<O: Outside> Subscribers<O> {
    /// Registers MQTT subscriber `c` after its CONNACK: in the slab and the
    /// readiness set, in no channel until it subscribes.
    pub(crate) fn add_mqtt(&self, c: Conn<O::Wire>) -> std::io::Result<()> {
        let c = Rc::new(c);
        self.conns.borrow_mut().insert(&c);
        if let Err(e) = self.outside.watch(c.wire(), c.slot.get()) {
            self.conns.borrow_mut().remove(&c);
            return Err(e);
        }
        self.counters.open.set(self.counters.open.get() + 1);
        crate::metrics::inc(&self.counters.mqtt_open);
        crate::metrics::inc(&self.counters.upgraded);
        if c.has_rest() {
            // Packets that came behind the CONNECT.
            self.on_readable(&c, false);
        }
        Ok(())
    }

    /// Handles every whole packet in `buf`, keeps a split one's bytes;
    /// false when the connection ended.
    pub(crate) fn on_mqtt_bytes(&self, c: &Rc<Conn<O::Wire>>, buf: &mut [u8]) -> bool {
        let have = buf.len();
        let mut pos = 0;
        let mut decoder = Decoder::server_connected(version_of(c.kind), self.limits.mqtt_packet);
        while pos < have {
            if !c.is_open() {
                // Closing after an answer: what follows is not read.
                return true;
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
                        return false;
                    }
                }
                Err((e, answer)) => {
                    self.counters.mqtt_refused(e.label());
                    self.fail(c, &answer);
                    return false;
                }
            }
        }
        if pos < have {
            // Bounded: the decoder refuses a packet over max_packet.
            c.set_rest(&buf[pos..have]);
        }
        true
    }

    /// Publishes `c`'s will, if it has one (its connection is ending
    /// without a DISCONNECT that dropped it).
    pub(crate) fn publish_will(&self, c: &Conn<O::Wire>) {
        let will = c
            .proto
            .borrow_mut()
            .mqtt_mut()
            .and_then(|m| m.more.as_mut()?.will.take());
        if let Some(will) = will {
            let text = std::str::from_utf8(&will.payload).is_ok();
            // A will is published at QoS 0 (its QoS is not kept).
            self.outside
                .publish(&will.channel, text, true, will.payload, will.retain);
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
        if c.has_queue() {
            c.state.set(State::Finishing);
        } else {
            self.finish(c);
        }
    }

    /// Sends a packet to `c`; false (and `c` ended) when it could not.
    fn reply(&self, c: &Rc<Conn<O::Wire>>, p: &Packet<'_>) -> bool {
        self.counters.mqtt_sent(p.packet_type().name());
        let bytes = encode(version_of(c.kind), p);
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
        let version = version_of(c.kind);
        match p {
            Packet::Pingreq => self.reply(c, &Packet::Pingresp),
            Packet::Subscribe(s) => self.on_subscribe(c, &s),
            Packet::Unsubscribe(u) => self.on_unsubscribe(c, &u),
            Packet::Publish(p) => self.on_publish(c, &p),
            Packet::Disconnect(d) => {
                // The client's clean end: nothing to answer, and its will
                // is dropped unless it asks for it (5.0's 0x04).
                if d.reason != ReasonCode::DISCONNECT_WITH_WILL
                    && let Some(m) = c.proto.borrow_mut().mqtt_mut()
                    && let Some(more) = m.more.as_mut()
                {
                    more.will = None;
                }
                self.counters.closed(CloseReason::PeerClose);
                self.unsubscribe(c);
                if c.has_queue() {
                    c.state.set(State::Finishing);
                } else {
                    self.finish(c);
                }
                false
            }
            Packet::Puback(a) => self.on_puback(c, a.packet_id),
            // Acknowledgements of QoS 2 deliveries this server does not
            // make, and 5.0 AUTH, which it does not offer.
            Packet::Pubrec(_) | Packet::Pubcomp(_) | Packet::Auth(_) => true,
            Packet::Pubrel(a) => {
                // Only answers a QoS 2 PUBLISH, which is refused: say the
                // id is unknown (5.0) and go on.
                self.reply(
                    c,
                    &Packet::Pubcomp(Ack {
                        packet_id: a.packet_id,
                        reason: ReasonCode::PACKET_ID_NOT_FOUND,
                        properties: Properties::EMPTY,
                    }),
                )
            }
            // A server's packets, or a second CONNECT: the decoder refuses
            // those before they get here.
            _ => {
                let mut out = Vec::new();
                if version == Version::V5 {
                    mqtt::Answer::Disconnect(ReasonCode::PROTOCOL_ERROR).encode(&mut out);
                }
                self.counters.mqtt_refused("unexpected_packet");
                self.fail(c, &out);
                false
            }
        }
    }

    fn on_subscribe(&self, c: &Rc<Conn<O::Wire>>, s: &Subscribe<'_>) -> bool {
        let v5 = c.kind == Kind::Mqtt5;
        let mut codes = Vec::with_capacity(s.filters.len());
        // The filters whose retained messages are sent (5.0's retain
        // handling: at every subscribe, only a new one's, or never).
        let mut retained = Vec::new();
        for (filter, options) in &s.filters {
            let wants_retained = match options.retain_handling {
                RetainHandling::OnSubscribe => true,
                RetainHandling::OnNewSubscribe => {
                    !self.channels.borrow().has_mqtt_subscription(filter, c)
                }
                RetainHandling::Never => false,
            };
            // QoS 0 or 1: what was asked, at most the server's maximum.
            let qos = (options.qos as u8).min(1);
            let granted = ReasonCode(qos);
            let code = if !self.mqtt_may_subscribe(c, filter) {
                ReasonCode::NOT_AUTHORIZED
            } else if mqtt::topic::is_wildcard(filter) {
                let ok = self.limits.wildcards
                    && self
                        .channels
                        .borrow_mut()
                        .subscribe_wild(filter, c, qos)
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
                if self.channels.borrow_mut().subscribe_mqtt(filter, c, qos) {
                    self.outside.channel_interest(filter, true);
                }
                granted
            };
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

    fn on_unsubscribe(&self, c: &Rc<Conn<O::Wire>>, u: &Unsubscribe<'_>) -> bool {
        let v5 = c.kind == Kind::Mqtt5;
        let mut codes = Vec::new();
        for filter in &u.filters {
            if mqtt::topic::is_wildcard(filter) {
                let had = self.channels.borrow_mut().unsubscribe_wild(filter, c);
                if v5 {
                    codes.push(if had {
                        ReasonCode::SUCCESS
                    } else {
                        ReasonCode::NO_SUBSCRIPTION_EXISTED
                    });
                }
                continue;
            }
            let left = self.channels.borrow_mut().unsubscribe_mqtt(filter, c);
            if let Some(Some(name)) = &left {
                self.outside.channel_interest(name, false);
            }
            if v5 {
                codes.push(if left.is_some() {
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
    /// acknowledged once it is on its way to the supervisor; QoS 2 is
    /// refused, as for a server whose maximum QoS is 1.
    fn on_publish(&self, c: &Rc<Conn<O::Wire>>, p: &Publish<'_>) -> bool {
        let v5 = c.kind == Kind::Mqtt5;
        if let Delivery::ExactlyOnce(_) = p.delivery {
            self.counters.mqtt_refused("qos2");
            let mut out = Vec::new();
            if v5 {
                mqtt::Answer::Disconnect(ReasonCode::QOS_NOT_SUPPORTED).encode(&mut out);
            }
            self.fail(c, &out);
            return false;
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
            let text = std::str::from_utf8(p.payload).is_ok();
            let at_most_once = p.delivery == Delivery::AtMostOnce;
            let retain = p.retain.then(|| p.delivery.qos() as u8);
            self.outside.publish(
                p.topic,
                text,
                at_most_once,
                Bytes::copy_from_slice(p.payload),
                retain,
            );
            ReasonCode::SUCCESS
        };
        match p.delivery {
            Delivery::AtLeastOnce(id) => self.reply(
                c,
                &Packet::Puback(Ack {
                    packet_id: id,
                    reason,
                    properties: Properties::EMPTY,
                }),
            ),
            _ => true,
        }
    }
}

thread_local! {
    // Clients given an id by this worker (5.0, empty client id), for a unique one.
    static ASSIGNED: Cell<u64> = const { Cell::new(0) };
}

/// Serves one connection from an `--mqtt-listen` listener: per-address
/// limits first (a refused connection is just closed: MQTT has no word for
/// it before CONNECT), then the handshake.
pub(crate) async fn serve(
    w: Rc<Worker>,
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let source = if w.cfg.per_address.any() {
        let source = Source::of(peer.ip());
        let verdict = w.link.admit(source).await;
        if let Some(label) = verdict.label() {
            w.counters.refused(label);
            return;
        }
        Some(source)
    } else {
        None
    };
    let ticket = Cell::new(source);
    let stream = match tls {
        None => Io::Plain(tcp),
        Some(config) => {
            let accepted =
                tokio::time::timeout(w.cfg.handshake_timeout, TlsStream::accept(tcp, config)).await;
            let failed = match accepted {
                Ok(Ok(s)) => {
                    w.counters.tls_handshake(s.handshake_label());
                    Ok(Io::Tls(Box::new(s)))
                }
                Err(_) => Err("tls_timeout"),
                Ok(Err(e)) => Err(e.label()),
            };
            match failed {
                Ok(io) => io,
                Err(label) => {
                    w.counters.handshake_failed(label);
                    if let Some(source) = ticket.take() {
                        w.link.release(source);
                    }
                    return;
                }
            }
        }
    };
    handshake(&w, stream, &ticket).await;
    if let Some(source) = ticket.take() {
        w.link.release(source);
    }
}

/// What the handshake read: the CONNECT's fields the connection keeps.
struct Connected {
    version: Version,
    keep_alive: u16,
    clean_start: bool,
    /// Empty: 5.0 gets an assigned one in CONNACK.
    client_id_empty: bool,
    /// Its will's topic and payload, and its QoS if it is retained.
    will: Option<(String, Bytes, Option<u8>)>,
    /// Its receive maximum (5.0; 3.1.1 has none).
    receive_max: Option<u16>,
    /// Its password: a token or the publish key (read, then dropped).
    password: Option<Vec<u8>>,
}

/// Reads CONNECT (within `--handshake-timeout`), answers CONNACK and hands
/// the connection to the subscribers, holding its address (`ticket`) and
/// its place under `--max-connections`.
async fn handshake(w: &Worker, mut tcp: Io, ticket: &Cell<Option<Source>>) {
    let mut decoder = Decoder::server(max_packet(w.cfg.max_message));
    let mut buf: Vec<u8> = Vec::new();
    let read = tokio::time::timeout(
        w.cfg.handshake_timeout,
        read_connect(&mut tcp, &mut decoder, &mut buf),
    )
    .await;
    let (connected, used) = match read {
        Err(_) => {
            w.counters.handshake_failed("mqtt_timeout");
            return;
        }
        Ok(Err(None)) => {
            if !buf.is_empty() {
                w.counters.handshake_failed("mqtt_incomplete");
            }
            return;
        }
        Ok(Err(Some(e))) => {
            w.counters.handshake_failed("mqtt_bad_connect");
            w.counters.mqtt_refused(e.label());
            let mut out = Vec::new();
            decoder.answer(&e).encode(&mut out);
            let _ = tokio::time::timeout(w.cfg.handshake_timeout, tcp.write_all(&out)).await;
            return;
        }
        Ok(Ok(got)) => got,
    };
    let version = connected.version;
    let refuse = |code: ReasonCode| {
        let code = match version {
            // 3.1.1 has six return codes: "server unavailable" for the rest.
            Version::V311 if code.v3_connack().is_none() => ReasonCode::SERVER_UNAVAILABLE,
            _ => code,
        };
        encode(
            version,
            &Packet::Connack(Connack {
                session_present: false,
                code,
                properties: Properties::EMPTY,
            }),
        )
    };
    if w.draining.get() {
        w.counters.handshake_failed("draining");
        let out = refuse(ReasonCode::SERVER_UNAVAILABLE);
        let _ = tokio::time::timeout(w.cfg.handshake_timeout, tcp.write_all(&out)).await;
        return;
    }
    let admitted = mqtt_auth::admit(w, connected.password.as_deref(), super::gate::unix_now());
    let admitted = match admitted {
        Ok(a) => a,
        Err(code) => {
            let out = refuse(code);
            let _ = tokio::time::timeout(w.cfg.handshake_timeout, tcp.write_all(&out)).await;
            return;
        }
    };
    let counted = &w.subs.outside.counted;
    if !counted.take_place() {
        w.counters.refused("max_connections");
        let out = refuse(ReasonCode::SERVER_BUSY);
        let _ = tokio::time::timeout(w.cfg.handshake_timeout, tcp.write_all(&out)).await;
        return;
    }
    let mut will = None;
    if let Some((channel, payload, retain)) = connected.will {
        // A will is a publish: where an MQTT client may not publish, or on
        // a topic that is not a channel, it is refused with the CONNECT.
        let why = if !w.subs.limits.mqtt_publish {
            Some(("publish_not_here", ReasonCode::NOT_AUTHORIZED))
        } else if channel::validate(&channel).is_err() {
            Some(("bad_channel", ReasonCode::TOPIC_NAME_INVALID))
        } else if !mqtt_auth::may_publish(&w.subs.limits, admitted.grants.as_deref(), &channel) {
            Some(("will_not_granted", ReasonCode::NOT_AUTHORIZED))
        } else {
            None
        };
        if let Some((label, code)) = why {
            w.counters.mqtt_refused(label);
            counted.give_place();
            let out = refuse(code);
            let _ = tokio::time::timeout(w.cfg.handshake_timeout, tcp.write_all(&out)).await;
            return;
        }
        will = Some(Box::new(Will {
            channel,
            payload,
            retain,
        }));
    }
    let mut props = PropertiesBuf::new();
    let assigned;
    if version == Version::V5 {
        // What this server offers, so a 5.0 client does not try the rest.
        let offer = [
            Property::MaximumQos(1),
            Property::RetainAvailable(1),
            Property::WildcardSubscriptionAvailable(u8::from(w.subs.limits.wildcards)),
            Property::SharedSubscriptionAvailable(0),
        ];
        for p in offer {
            let _ = props.push(p);
        }
        if connected.client_id_empty {
            let n = ASSIGNED.with(|a| {
                let n = a.get() + 1;
                a.set(n);
                n
            });
            assigned = format!("throng-{}-{n}", w.index);
            let _ = props.push(Property::AssignedClientIdentifier(&assigned));
        }
    }
    if !connected.clean_start {
        // A persistent session is not kept: this one is clean, and
        // "session present 0" tells the client so.
        w.counters.mqtt_refused("persistent_session");
    }
    let connack = encode(
        version,
        &Packet::Connack(Connack {
            session_present: false,
            code: ReasonCode::SUCCESS,
            properties: props.properties(),
        }),
    );
    let written = tokio::time::timeout(w.cfg.handshake_timeout, tcp.write_all(&connack)).await;
    if !matches!(written, Ok(Ok(()))) {
        counted.give_place();
        w.counters.handshake_failed("write_failed");
        return;
    }
    // From here on the socket lives in the worker's own epoll, not tokio's.
    let (sock, rest, tls) = match tcp {
        Io::Plain(tcp) => (tcp.into_std(), buf[used..].to_vec(), None),
        Io::Tls(s) => {
            let parts = s.into_parts();
            // Packets behind the CONNECT: what was read, then what was
            // decrypted but not read.
            let mut plain = buf[used..].to_vec();
            plain.extend_from_slice(&parts.plain_rest);
            let tls = TlsState::new(parts.conn, &parts.cipher_rest);
            (parts.tcp.into_std(), plain, Some(tls))
        }
    };
    let Ok(sock) = sock else {
        counted.give_place();
        w.counters.handshake_failed("write_failed");
        return;
    };
    // 1.5 times the keep-alive, rounded up to a tick.
    let keep_alive = match connected.keep_alive {
        0 => 0,
        s => wheel::ticks(std::time::Duration::from_millis(u64::from(s) * 1500)).max(1),
    };
    let mut state = Mqtt::new(keep_alive);
    if will.is_some() {
        state.state_mut().will = will;
    }
    if admitted.grants.is_some() {
        state.state_mut().auth = admitted.grants;
    }
    if let Some(max) = connected.receive_max {
        state.receive_max = max.min(state.receive_max);
    }

    let tag = ticket.take().map_or(NONE, |s| counted.tag(s));
    let mut c = Conn::new(sock, w.subs.now.get(), &rest)
        .with_mqtt(version, state)
        .with_expiry(admitted.expires)
        .with_tag(tag);
    if let Some(tls) = tls {
        c = c.with_tls(tls);
    }
    if let Err(e) = w.subs.add_mqtt(c) {
        counted.release(&w.link, tag);
        w.counters.handshake_failed("epoll");
        log!("throng: worker {}: cannot watch a subscriber: {e}", w.index);
    }
}

/// Reads until `decoder` gives the CONNECT; returns its fields and the
/// bytes of `buf` it used (what follows is the client's next packets).
/// `Err(None)`: the client left first; `Err(Some)`: it broke the protocol.
async fn read_connect(
    tcp: &mut Io,
    decoder: &mut Decoder,
    buf: &mut Vec<u8>,
) -> Result<(Connected, usize), Option<mqtt::DecodeError>> {
    loop {
        if let Some(d) = decoder.decode(buf).map_err(Some)? {
            let Packet::Connect(c) = d.packet else {
                // The decoder refuses anything else first.
                return Err(None);
            };
            let version = decoder.version().unwrap_or(Version::V311);
            let connected = Connected {
                version,
                keep_alive: c.keep_alive,
                clean_start: c.clean_start,
                client_id_empty: c.client_id.is_empty(),
                will: c.will.map(|w| {
                    let retain = w.retain.then_some(w.qos as u8);
                    (
                        w.topic.to_owned(),
                        Bytes::copy_from_slice(w.payload),
                        retain,
                    )
                }),
                receive_max: c.properties.receive_maximum(),
                password: c.password.map(<[u8]>::to_vec),
            };
            return Ok((connected, d.consumed));
        }
        buf.reserve(1024);
        match tcp.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(_) => {}
        }
    }
}
