//! An MQTT subscriber's state in its `Conn`, sans I/O: its keep-alive,
//! receive maximum, subscriptions, will, QoS 1 window and grants
//! ([`Mqtt`], boxed parts in [`MqttState`]), and the packets the server
//! encodes for it. The packets it sends are handled by the worker's
//! subscribers ([`super::subscribers`]); its handshake (CONNECT within
//! `--handshake-timeout`, CONNACK) is the accept step
//! [`super::mqtt_accept`].
//!
//! A topic is a channel: an MQTT subscriber of `sensors/42` gets what any
//! route publishes there (HTTP, Redis, another MQTT client), and what it
//! publishes reaches WebSocket and SSE subscribers too. A persistent
//! session is kept by the supervisor while its client is away
//! ([`crate::sessions`], [`super::mqtt_session`]); a connection knows only
//! its names ([`Persist`]). Messages go out at QoS 0 as one
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

use std::rc::Rc;

use bytes::Bytes;
use throng_proto::mqtt::{
    Delivery, Disconnect, Packet, Properties, PropertiesBuf, Publish, ReasonCode, Version,
};

use super::mqtt_auth::MqttGrants;
use super::mqtt_qos::{
    DeliveryAck, Incoming, Inflight, MAX_INFLIGHT, Qos1, Received, Slot, properties_of,
};
use super::rejoin::Kind;
use crate::control::Message;
use crate::metrics::CloseReason;
use crate::wheel;

/// What an MQTT subscriber keeps in its [`Conn`](super::conn::Conn), in the WebSocket
/// decoder's place (so neither grows): its keep-alive, its receive
/// maximum, the QoS of its first subscription, and a box for the rest,
/// made only when there is some. An idle subscriber of one channel has no
/// box at all: that subscription is its `Conn`'s channel, as a WebSocket
/// subscriber's is, and its decoder is made per read
/// ([`Decoder::server_connected`](throng_proto::mqtt::Decoder::server_connected)).
pub(crate) struct Mqtt {
    /// Ticks without a packet from the client after which it is closed:
    /// 1.5 times its keep-alive, as the specification says; 0: never.
    keep_alive: u32,
    /// QoS 1 deliveries it may have awaiting PUBACK: its 5.0 receive
    /// maximum, at most [`MAX_INFLIGHT`].
    receive_max: u16,
    /// The QoS (0, 1 or 2) and options ([`QOS`], [`NO_LOCAL`],
    /// [`RETAIN_AS_PUBLISHED`]) of its subscription to its `Conn`'s
    /// channel, when it has one: a connection's only subscription is kept there
    /// ([`super::table::Channels::subscribe_mqtt`]).
    pub(crate) qos: u8,
    /// Carried in WebSocket frames (subprotocol `mqtt`, [`super::mqtt_ws`]):
    /// in a byte the struct had spare, so a subscriber does not grow.
    pub(crate) ws: bool,
    /// Everything else; `None` while there is nothing.
    pub(crate) more: Option<Box<MqttState>>,
}

impl Mqtt {
    /// A connection's state after CONNACK: its keep-alive in ticks (0: none).
    pub(crate) fn new(keep_alive: u32) -> Self {
        Self {
            keep_alive,
            receive_max: MAX_INFLIGHT,
            qos: 0,
            ws: false,
            more: None,
        }
    }

    /// A session after CONNACK: its keep-alive in ticks (0: none), the
    /// client's receive maximum (5.0), its will and its credential's
    /// grants.
    pub(crate) fn session(
        keep_alive: u32,
        receive_max: Option<u16>,
        will: Option<Box<Will>>,
        grants: Option<Box<MqttGrants>>,
        max_packet: Option<u32>,
    ) -> Self {
        let mut m = Self::new(keep_alive);
        if max_packet.is_some() {
            m.state_mut().max_packet = max_packet;
        }
        if will.is_some() {
            m.state_mut().will = will;
        }
        if grants.is_some() {
            m.state_mut().auth = grants;
        }
        if let Some(max) = receive_max {
            m.receive_max = max.min(m.receive_max);
        }
        m
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

/// A subscription's byte in the tables (its channel's MQTT list, the
/// trie's lists, [`Mqtt::qos`]): its QoS in the low two bits ([`QOS`]),
/// then its 5.0 options, so that they cost no memory of their own.
pub(crate) const QOS: u8 = 0b0011;
/// 5.0 No Local: not the connection's own messages.
pub(crate) const NO_LOCAL: u8 = 0b0100;
/// 5.0 Retain As Published: live messages keep their retain flag.
pub(crate) const RETAIN_AS_PUBLISHED: u8 = 0b1000;

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
    will: Option<Box<Will>>,
    /// Its QoS 1 deliveries awaiting PUBACK or held; `None` when there
    /// are none ([`super::mqtt_qos`]).
    inflight: Option<Box<Inflight>>,
    /// What its credential grants where `--auth-*` or `--publish-key-file`
    /// guard the server ([`super::mqtt_auth`]); `None` elsewhere.
    auth: Option<Box<MqttGrants>>,
    /// Its own PUBLISHes at QoS 1 and 2 not finished yet; `None` when
    /// there are none ([`super::mqtt_qos::Received`]).
    received: Option<Box<Received>>,
    /// The largest packet it takes (5.0's Maximum Packet Size), when it
    /// set one: a delivery larger is skipped for it.
    max_packet: Option<u32>,
    /// Its session outlives it (persistent sessions): what the supervisor
    /// knows it by; `None` for a clean session.
    pub(crate) persist: Option<Box<Persist>>,
    /// Its shared subscriptions' keys (`group/filter`, [`super::mqtt_share`]).
    pub(crate) shares: Vec<Rc<str>>,
}

/// A persistent session's names and expiry ([`MqttState::persist`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Persist {
    /// Its client id's hash.
    pub(crate) hash: u64,
    /// The connection's id in the session records
    /// ([`crate::control::SessionOpen::conn`]).
    pub(crate) id: u64,
    /// Seconds the session is kept once the connection ends; 0: not
    /// kept after all (a 5.0 DISCONNECT can say so).
    pub(crate) expiry: u32,
    /// Parked already: the connection's end parks it once.
    pub(crate) parked: bool,
}

impl MqttState {
    fn is_empty(&self) -> bool {
        self.subs.is_empty()
            && self.wild.is_empty()
            && self.will.is_none()
            && self.inflight.is_none()
            && self.auth.is_none()
            && self.received.is_none()
            && self.max_packet.is_none()
            && self.persist.is_none()
            && self.shares.is_empty()
    }
}

/// A will message: a channel and a payload, and its QoS when it is to be
/// retained.
pub(crate) struct Will {
    pub(crate) channel: String,
    pub(crate) payload: Bytes,
    /// Its 5.0 properties its subscribers get ([`forwarded`]).
    pub(crate) properties: Bytes,
    pub(crate) retain: Option<u8>,
    /// 5.0's Will Delay Interval, in seconds (0: at once).
    pub(crate) delay: u32,
    /// Its client id's hash (0: none): a reconnect with it cancels a
    /// delayed will.
    pub(crate) client: u64,
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

/// The properties of a client's PUBLISH or will that its subscribers get
/// ([`Properties::forwarded`]), encoded for [`Message::properties`].
pub(crate) fn forwarded(p: Properties<'_>) -> Bytes {
    let mut buf = PropertiesBuf::new();
    for property in p.forwarded() {
        // Each was read from a packet within the size limits: it fits.
        let _ = buf.push(property);
    }
    Bytes::copy_from_slice(buf.properties().as_bytes())
}

/// The QoS 0 PUBLISH of message `m` for a subscriber of `version`.
pub(crate) fn publish(version: Version, m: &Message) -> Bytes {
    publish_as(version, m, false)
}

/// The same, with the RETAIN flag `retain` (Retain As Published).
pub(crate) fn publish_as(version: Version, m: &Message, retain: bool) -> Bytes {
    let p = Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::AtMostOnce,
        retain,
        topic: &m.channel,
        properties: properties_of(m),
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
        CloseReason::TakenOver => ReasonCode::SESSION_TAKEN_OVER,
        CloseReason::Disconnected => ReasonCode::ADMINISTRATIVE_ACTION,
        CloseReason::ProtocolError => ReasonCode::PROTOCOL_ERROR,
        CloseReason::PeerClose | CloseReason::PeerGone | CloseReason::TlsError => {
            ReasonCode::UNSPECIFIED
        }
    };
    encode(Version::V5, &Packet::Disconnect(Disconnect::new(reason)))
}

/// A packet the server sends; those it builds have no field near the
/// encoder's limits, so an error (none is expected) sends nothing.
pub(crate) fn encode(version: Version, p: &Packet<'_>) -> Bytes {
    let mut out = Vec::with_capacity(16);
    match p.encode(version, &mut out) {
        Ok(()) => Bytes::from(out),
        Err(_) => Bytes::new(),
    }
}

/// The MQTT version a subscriber of `kind` speaks.
pub(crate) fn version_of(kind: Kind) -> Version {
    if kind == Kind::Mqtt5 {
        Version::V5
    } else {
        Version::V311
    }
}

/// The QoS 1 window and the rest an MQTT subscriber's packets act on:
/// each method changes this connection's state only and says what
/// follows; the subscribers do the writing.
impl Mqtt {
    /// Whether it said nothing since tick `last_seen` for longer than its
    /// keep-alive allows at tick `now`.
    pub(crate) fn overdue(&self, last_seen: u32, now: u32) -> bool {
        self.keep_alive != 0 && wheel::expired(now, last_seen, self.keep_alive)
    }

    /// Whether a packet of `len` bytes is over its Maximum Packet Size.
    pub(crate) fn too_large(&self, len: usize) -> bool {
        self.state()
            .and_then(|s| s.max_packet)
            .is_some_and(|max| len > max as usize)
    }

    /// What its credential grants, where one is needed.
    pub(crate) fn grants(&self) -> Option<&MqttGrants> {
        self.state()?.auth.as_deref()
    }

    /// Takes its will, to publish it (the connection is ending without a
    /// DISCONNECT that dropped it).
    pub(crate) fn take_will(&mut self) -> Option<Box<Will>> {
        self.more.as_mut()?.will.take()
    }

    /// Drops its will: the client ended cleanly.
    pub(crate) fn drop_will(&mut self) {
        if let Some(more) = self.more.as_mut() {
            more.will = None;
        }
    }

    /// The tick since which it has had deliveries awaiting PUBACK without
    /// one coming; `None` when nothing is in flight.
    pub(crate) fn unacked_since(&self) -> Option<u32> {
        self.state()?.inflight.as_ref()?.unacked_since()
    }

    /// Bytes of its deliveries in flight or held: they count against
    /// `--max-queue` as queued bytes do.
    pub(crate) fn inflight_bytes(&self) -> usize {
        self.state()
            .and_then(|s| s.inflight.as_ref())
            .map_or(0, |i| i.bytes())
    }

    /// Takes a QoS 1 delivery of `p` at tick `now`: a packet id to send it
    /// with, or held while its receive maximum is in flight; `None` when
    /// it and what is `queued` would pass `max_queue` (a slow consumer).
    pub(crate) fn deliver(
        &mut self,
        p: &Qos1,
        queued: usize,
        max_queue: usize,
        now: u32,
    ) -> Option<Slot> {
        let window = usize::from(self.receive_max);
        let inflight = self.window_for(p, queued, max_queue, now)?;
        Some(inflight.offer(p, window, now))
    }

    /// Its window (made at tick `now` if none), when `p` fits in it
    /// beside what is `queued` under `max_queue`; a persistent session's
    /// keeps the packets it sends.
    fn window_for(
        &mut self,
        p: &Qos1,
        queued: usize,
        max_queue: usize,
        now: u32,
    ) -> Option<&mut Inflight> {
        let state = self.state_mut();
        let persistent = state.persist.is_some();
        let inflight = state
            .inflight
            .get_or_insert_with(|| Box::new(Inflight::new(now)));
        if persistent {
            inflight.keep_packets();
        }
        (queued + inflight.bytes() + p.len() <= max_queue).then_some(&mut **inflight)
    }

    /// Its acknowledgement `ack` (PUBACK, PUBREC, PUBCOMP) of delivery
    /// `id` at tick `now`: false when no delivery in flight awaits it.
    pub(crate) fn acked(&mut self, ack: DeliveryAck, id: u16, now: u32) -> bool {
        self.more
            .as_mut()
            .and_then(|s| s.inflight.as_mut())
            .is_some_and(|i| i.ack(ack, id, now))
    }

    /// The next held delivery a free slot takes, with its packet id; once
    /// nothing is in flight, the window's box goes (an idle subscriber
    /// keeps none).
    pub(crate) fn next_held(&mut self) -> Option<(Qos1, u16)> {
        let window = usize::from(self.receive_max);
        let more = self.more.as_mut()?;
        let inflight = more.inflight.as_mut()?;
        if let Some(next) = inflight.release(window) {
            return Some(next);
        }
        if inflight.is_empty() {
            more.inflight = None;
            self.shrink();
        }
        None
    }

    /// Its PUBLISH at QoS 1 (`qos2` `None`) or 2 (its packet id): relay
    /// it, or not again, or too many are unfinished.
    pub(crate) fn receive(&mut self, qos2: Option<u16>) -> Incoming {
        self.state_mut()
            .received
            .get_or_insert_with(Box::default)
            .take(qos2)
    }

    /// The relay took (or refused) its PUBLISH at QoS 1 or 2.
    pub(crate) fn answered(&mut self, qos2: Option<u16>, took: bool) {
        if let Some(r) = self.more.as_mut().and_then(|s| s.received.as_mut()) {
            r.answered(qos2, took);
        }
        self.drop_received();
    }

    /// Its QoS 2 PUBLISHes the relay took, awaiting PUBREL: their ids.
    pub(crate) fn received_ids(&self) -> Vec<u16> {
        self.state()
            .and_then(|s| s.received.as_ref())
            .map_or_else(Vec::new, |r| r.taken())
    }

    /// A resumed session's QoS 2 PUBLISHes awaiting PUBREL ([`Received::restore`]).
    pub(crate) fn restore_received(&mut self, ids: &[u16]) {
        if ids.is_empty() {
            return;
        }
        let received = self.state_mut().received.get_or_insert_with(Box::default);
        received.restore(ids);
    }

    /// Its PUBREL for QoS 2 PUBLISH `id`: false when none the relay took
    /// has that id.
    pub(crate) fn released(&mut self, id: u16) -> bool {
        let found = self
            .more
            .as_mut()
            .and_then(|s| s.received.as_mut())
            .is_some_and(|r| r.released(id));
        self.drop_received();
        found
    }

    /// Drops the box of its unfinished PUBLISHes once there are none.
    fn drop_received(&mut self) {
        if let Some(more) = self.more.as_mut()
            && more.received.as_deref().is_some_and(Received::is_empty)
        {
            more.received = None;
            self.shrink();
        }
    }

    /// Its deliveries the client has not received (a persistent
    /// session's, for its park), in order, with their packet ids (0:
    /// never sent).
    pub(crate) fn unreceived(&self) -> Vec<(u16, Qos1)> {
        self.state()
            .and_then(|s| s.inflight.as_ref())
            .map_or_else(Vec::new, |i| i.unreceived())
    }

    /// Its QoS 2 deliveries awaiting PUBCOMP after PUBREL: their ids.
    pub(crate) fn releasing(&self) -> Vec<u16> {
        self.state()
            .and_then(|s| s.inflight.as_ref())
            .map_or_else(Vec::new, |i| i.releasing())
    }

    /// A resumed session's delivery `p`, sent before as `id` (0: never),
    /// sent again with it: the id to send with, or `None` past
    /// `max_queue` with what is `queued` (a slow consumer).
    pub(crate) fn deliver_again(
        &mut self,
        p: &Qos1,
        id: u16,
        queued: usize,
        max_queue: usize,
        now: u32,
    ) -> Option<u16> {
        let inflight = self.window_for(p, queued, max_queue, now)?;
        Some(inflight.offer_again(p, id, now))
    }

    /// A resumed session's PUBREL owed for delivery `id`: in flight again,
    /// awaiting PUBCOMP. False if `id` is in flight already.
    pub(crate) fn release_again(&mut self, id: u16, now: u32) -> bool {
        let inflight = self
            .state_mut()
            .inflight
            .get_or_insert_with(|| Box::new(Inflight::new(now)));
        inflight.release_again(id, now)
    }

    /// Takes its QoS 1 window: the connection is ending.
    pub(crate) fn take_inflight(&mut self) -> Option<Box<Inflight>> {
        self.more.as_mut()?.inflight.take()
    }
}

#[cfg(test)]
mod tests {
    //! An MQTT session's QoS 1 window, without a connection: what each
    //! delivery and PUBACK does to it.

    use throng_proto::mqtt::Version;

    use super::{DeliveryAck, Mqtt, Slot};
    use crate::control::Message;
    use crate::worker::mqtt_qos::Qos1;

    fn qos1(payload: &'static [u8]) -> Qos1 {
        let m = Message::sample(1, "c", payload);
        Qos1::of(Version::V5, &m).expect("a small PUBLISH encodes")
    }

    fn sent(slot: Option<Slot>) -> Option<u16> {
        match slot {
            Some(Slot::Send(id)) => Some(id),
            Some(Slot::Held) => Some(0),
            None => None,
        }
    }

    #[test]
    fn a_full_window_holds_and_each_puback_sends_the_next_held_in_order() {
        let mut m = Mqtt::new(0);
        m.receive_max = 2;
        let p = qos1(b"x");
        assert_eq!(sent(m.deliver(&p, 0, 1 << 20, 5)), Some(1));
        assert_eq!(sent(m.deliver(&p, 0, 1 << 20, 6)), Some(2));
        assert_eq!(sent(m.deliver(&p, 0, 1 << 20, 7)), Some(0), "held");
        assert_eq!(sent(m.deliver(&p, 0, 1 << 20, 7)), Some(0), "held");
        assert_eq!(m.unacked_since(), Some(5), "since the first went out");
        assert_eq!(m.inflight_bytes(), 4 * p.len());
        assert!(!m.acked(DeliveryAck::Puback, 9, 8), "an id not in flight");
        assert!(m.acked(DeliveryAck::Puback, 1, 8));
        assert_eq!(m.unacked_since(), Some(8), "a PUBACK is progress");
        let (_, id) = m.next_held().expect("the held one takes the slot");
        assert_eq!(id, 3);
        assert!(m.next_held().is_none(), "the window is full again");
        assert!(m.acked(DeliveryAck::Puback, 2, 9) && m.acked(DeliveryAck::Puback, 3, 9));
        assert_eq!(m.next_held().map(|(_, id)| id), Some(4));
        assert!(m.next_held().is_none());
        assert!(m.acked(DeliveryAck::Puback, 4, 9));
        assert!(m.next_held().is_none());
        assert!(m.more.is_none(), "an idle session keeps no box");
        assert_eq!((m.unacked_since(), m.inflight_bytes()), (None, 0));
    }

    #[test]
    fn a_delivery_past_max_queue_with_what_is_queued_is_refused() {
        let mut m = Mqtt::new(0);
        let p = qos1(b"0123456789");
        let max = 2 * p.len() + 5;
        assert_eq!(sent(m.deliver(&p, 0, max, 0)), Some(1));
        assert_eq!(sent(m.deliver(&p, 5, max, 0)), Some(2));
        assert_eq!(sent(m.deliver(&p, 0, max, 0)), None, "over --max-queue");
        let i = m.take_inflight().expect("two in flight");
        assert_eq!((i.sent(), i.held()), (2, 0));
    }

    #[test]
    fn keep_alive_is_checked_against_the_last_packet() {
        let m = Mqtt::new(3);
        assert!(!m.overdue(10, 12));
        assert!(m.overdue(10, 13));
        assert!(!Mqtt::new(0).overdue(0, u32::MAX), "0: no keep-alive");
    }
}
