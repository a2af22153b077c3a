//! QoS 1 deliveries to MQTT subscribers: the PUBLISH encoded once per
//! fan-out and version with a hole for the packet id, each subscriber's
//! window of deliveries awaiting PUBACK, and what frees it.
//!
//! A QoS 1 PUBLISH differs between subscribers only in its two-byte packet
//! id, after the topic. [`Qos1`] is the packet encoded once, with id 0 in
//! that place; a delivery writes it as three slices (what comes before the
//! id, the connection's id, what follows) in one `writev`, and only a short
//! write copies (into the connection's queue, as for any frame).
//!
//! A delivery is then in flight until its PUBACK: its bytes count against
//! `--max-queue` beside what is queued, and a connection with its receive
//! maximum in flight (5.0's CONNECT property; at most [`MAX_INFLIGHT`],
//! which is also 3.1.1's) gets further deliveries held, not sent, until a
//! PUBACK frees a slot. A subscriber that stops acknowledging is a slow
//! consumer: over `--max-queue`, or with no PUBACK for `--write-timeout`
//! while deliveries await one, it is closed (5.0: DISCONNECT 0x97). Its
//! state is boxed (in the subscriber's own box, [`super::mqtt::Mqtt`])
//! only while something is in flight, and dies with the connection; a
//! persistent session's park takes what the client had not received,
//! with its packet ids, and the PUBRELs owed, which its resume sends
//! again under the same ids ([`Inflight::offer_again`],
//! [`Inflight::release_again`]).

use std::collections::VecDeque;

use bytes::Bytes;
use throng_proto::mqtt::{Delivery, Packet, PacketId, Properties, Publish, Version};

use crate::control::Message;

/// The most deliveries a connection has awaiting PUBACK, whatever its
/// receive maximum (5.0 allows up to 65,535; 3.1.1 sets none): past it,
/// deliveries wait in the server, where `--max-queue` bounds them.
pub(crate) const MAX_INFLIGHT: u16 = 1024;

/// A QoS 1 PUBLISH encoded once for every subscriber of one version, with
/// its packet id left to each delivery.
#[derive(Clone)]
pub(crate) struct Qos1 {
    packet: Bytes,
    /// Where the packet id's two bytes are in `packet`.
    id_at: usize,
}

impl Qos1 {
    /// The QoS 1 PUBLISH of message `m` for a subscriber of `version`;
    /// `None` if it cannot be encoded (never for a channel name and a
    /// payload under `--max-message`).
    pub(crate) fn of(version: Version, m: &Message) -> Option<Self> {
        Self::with_retain(version, m, false)
    }

    /// The same, with the RETAIN flag `retain` (a retained message sent
    /// to a new subscription).
    pub(crate) fn with_retain(version: Version, m: &Message, retain: bool) -> Option<Self> {
        let p = Packet::Publish(Publish {
            dup: false,
            delivery: Delivery::AtLeastOnce(PacketId::MIN),
            retain,
            topic: &m.channel,
            properties: properties_of(m),
            payload: &m.payload,
        });
        let mut out = Vec::with_capacity(m.payload.len() + m.channel.len() + 10);
        p.encode(version, &mut out).ok()?;
        // The id is followed by the properties (5.0: their length, then
        // them) and the payload.
        let props = match version {
            Version::V5 => {
                let n = properties_of(m).as_bytes().len();
                n + varint_len(n)
            }
            Version::V311 => 0,
        };
        let id_at = out.len().checked_sub(m.payload.len() + props + 2)?;
        Some(Self {
            packet: Bytes::from(out),
            id_at,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.packet.len()
    }

    /// The same PUBLISH at QoS 2 (its fixed header's QoS bits are 2).
    pub(crate) fn exactly_once(&self) -> Self {
        let mut packet = self.packet.to_vec();
        if let Some(first) = packet.first_mut() {
            *first = (*first & !0b0110) | 0b0100;
        }
        Self {
            packet: Bytes::from(packet),
            id_at: self.id_at,
        }
    }

    /// The same PUBLISH sent again: its DUP flag set (MQTT-3.3.1-1).
    pub(crate) fn dup(&self) -> Self {
        let mut packet = self.packet.to_vec();
        if let Some(first) = packet.first_mut() {
            *first |= 0b1000;
        }
        Self {
            packet: Bytes::from(packet),
            id_at: self.id_at,
        }
    }

    /// Whether it goes at QoS 2.
    pub(crate) fn is_exactly_once(&self) -> bool {
        self.packet.first().is_some_and(|b| b & 0b0110 == 0b0100)
    }

    /// The packet's three slices for a delivery with packet id `id`.
    pub(crate) fn parts<'a>(&'a self, id: &'a [u8; 2]) -> [&'a [u8]; 3] {
        [
            &self.packet[..self.id_at],
            id,
            &self.packet[self.id_at + 2..],
        ]
    }
}

/// The properties message `m` goes out with (those its publisher set).
pub(crate) fn properties_of(m: &Message) -> Properties<'_> {
    // Made by `mqtt::forwarded` from a checked packet: they check again.
    Properties::of_publish(&m.properties).unwrap_or(Properties::EMPTY)
}

/// The size of message `m`'s 5.0 PUBLISH at `qos`, whole.
pub(crate) fn publish_len(m: &Message, qos: u8) -> usize {
    let props = m.properties.len();
    let rest = 2
        + m.channel.len()
        + if qos > 0 { 2 } else { 0 }
        + varint_len(props)
        + props
        + m.payload.len();
    1 + varint_len(rest) + rest
}

/// Bytes of `n` as MQTT's variable byte integer.
fn varint_len(n: usize) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// A subscriber's QoS 1 deliveries: those awaiting PUBACK, and those held
/// past its receive maximum. Boxed in its [`super::mqtt::MqttState`] only
/// while there are any.
pub(crate) struct Inflight {
    /// Sent and not yet acknowledged, in the order sent.
    sent: VecDeque<Out>,
    /// Bytes of `sent`.
    bytes: usize,
    /// Held, in order, until a PUBACK frees a slot.
    waiting: VecDeque<Qos1>,
    /// Bytes of `waiting`.
    waiting_bytes: usize,
    /// The id the next delivery tries.
    next_id: u16,
    /// Ids went round once: the next one may still be in flight.
    wrapped: bool,
    /// Tick of the last PUBACK, or of the delivery that found none in
    /// flight: `--write-timeout` counts from here.
    since: u32,
    /// A persistent session's: the packets of `sent` the client has not
    /// received yet (no PUBACK or PUBREC), by id, for its session to send
    /// again when the connection ends; `None` for a clean session.
    kept: Option<VecDeque<(u16, Qos1)>>,
}

/// A delivery sent and not finished: its packet id, where its QoS 1 or 2
/// exchange is, and its bytes (0 once a QoS 2 one was received).
#[derive(Debug, Clone, Copy)]
struct Out {
    id: u16,
    phase: Phase,
    len: u32,
}

/// Where a delivery's exchange is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// QoS 1: awaiting PUBACK.
    Puback,
    /// QoS 2: awaiting PUBREC.
    Pubrec,
    /// QoS 2: PUBREL sent, awaiting PUBCOMP.
    Pubcomp,
}

/// A subscriber's acknowledgement of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeliveryAck {
    /// QoS 1's PUBACK: the slot is free.
    Puback,
    /// QoS 2's PUBREC: the message arrived; PUBREL follows, and the slot
    /// stays taken until PUBCOMP.
    Pubrec,
    /// QoS 2's PUBCOMP: the slot is free.
    Pubcomp,
    /// A PUBREC with an error reason: the subscriber refused it, the
    /// exchange ends and the slot is free.
    Refused,
}

/// What to do with a delivery ([`Inflight::offer`]).
pub(crate) enum Slot {
    /// Send it with this packet id.
    Send(u16),
    /// Held past the receive maximum.
    Held,
}

impl Inflight {
    pub(crate) fn new(now: u32) -> Self {
        Self {
            sent: VecDeque::new(),
            bytes: 0,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            next_id: 1,
            wrapped: false,
            since: now,
            kept: None,
        }
    }

    /// Keeps the packets sent from now on until the client has them
    /// (a persistent session's window).
    pub(crate) fn keep_packets(&mut self) {
        if self.kept.is_none() {
            self.kept = Some(VecDeque::new());
        }
    }

    /// The deliveries the client has not received, in order: those sent
    /// and kept ([`Self::keep_packets`]), with their packet ids, then
    /// those held (id 0: never sent).
    pub(crate) fn unreceived(&self) -> Vec<(u16, Qos1)> {
        let sent = self.kept.iter().flat_map(|k| k.iter().cloned());
        let held = self.waiting.iter().map(|p| (0, p.clone()));
        sent.chain(held).collect()
    }

    /// The QoS 2 deliveries the client received and was sent PUBREL for,
    /// awaiting PUBCOMP: their packet ids, in order.
    pub(crate) fn releasing(&self) -> Vec<u16> {
        let released = self.sent.iter().filter(|o| o.phase == Phase::Pubcomp);
        released.map(|o| o.id).collect()
    }

    /// A resumed session's delivery sent again with packet id `id`, the
    /// one it had (whatever the window: it was in flight then); a fresh
    /// id if `id` is in flight already. Returns the id.
    pub(crate) fn offer_again(&mut self, p: &Qos1, id: u16, now: u32) -> u16 {
        // Ids handed out from now on are checked against those in flight.
        self.wrapped = true;
        if self.sent.is_empty() {
            self.since = now;
        }
        if id == 0 || self.sent.iter().any(|o| o.id == id) {
            return self.push(p);
        }
        self.push_as(p, id);
        id
    }

    /// A resumed session's QoS 2 delivery whose PUBREL is owed again: in
    /// flight under `id`, awaiting PUBCOMP. False if `id` is in flight.
    pub(crate) fn release_again(&mut self, id: u16, now: u32) -> bool {
        self.wrapped = true;
        if id == 0 || self.sent.iter().any(|o| o.id == id) {
            return false;
        }
        if self.sent.is_empty() {
            self.since = now;
        }
        let phase = Phase::Pubcomp;
        self.sent.push_back(Out { id, phase, len: 0 });
        true
    }

    /// A packet id not in flight (there are at most [`MAX_INFLIGHT`], so
    /// one is found).
    fn take_id(&mut self) -> u16 {
        loop {
            let id = self.next_id;
            self.next_id = match id.checked_add(1) {
                Some(n) => n,
                None => {
                    self.wrapped = true;
                    1
                }
            };
            // Before the first wrap every id is fresh; after it, one that
            // was never acknowledged is skipped.
            if !self.wrapped || !self.sent.iter().any(|o| o.id == id) {
                return id;
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sent.is_empty() && self.waiting.is_empty()
    }

    /// The tick since which deliveries have awaited PUBACK without one
    /// coming; `None` when nothing is in flight.
    pub(crate) fn unacked_since(&self) -> Option<u32> {
        (!self.sent.is_empty()).then_some(self.since)
    }

    /// Bytes in flight or held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes + self.waiting_bytes
    }

    /// Deliveries sent and not yet acknowledged.
    pub(crate) fn sent(&self) -> usize {
        self.sent.len()
    }

    /// Deliveries held, never sent.
    pub(crate) fn held(&self) -> usize {
        self.waiting.len()
    }

    /// Takes delivery `p` at tick `now`, with `window` (the receive
    /// maximum) in flight at most: a packet id to send it with, or held.
    pub(crate) fn offer(&mut self, p: &Qos1, window: usize, now: u32) -> Slot {
        if self.sent.len() >= window {
            self.waiting.push_back(p.clone());
            self.waiting_bytes += p.len();
            return Slot::Held;
        }
        if self.sent.is_empty() {
            self.since = now;
        }
        Slot::Send(self.push(p))
    }

    /// Sends `p` with a fresh packet id, which it returns.
    fn push(&mut self, p: &Qos1) -> u16 {
        let id = self.take_id();
        self.push_as(p, id);
        id
    }

    /// Sends `p` with packet id `id` (not in flight).
    fn push_as(&mut self, p: &Qos1, id: u16) {
        let phase = if p.is_exactly_once() {
            Phase::Pubrec
        } else {
            Phase::Puback
        };
        // A packet is at most --max-message plus its headers.
        let len = p.len() as u32;
        self.sent.push_back(Out { id, phase, len });
        self.bytes += p.len();
        if let Some(kept) = self.kept.as_mut() {
            kept.push_back((id, p.clone()));
        }
    }

    /// Acknowledgement `ack` of delivery `id` at tick `now`: false when no
    /// delivery in flight awaits it. A PUBACK, a PUBCOMP or a refusal
    /// frees the slot; a PUBREC moves it on (and a PUBREC again for one
    /// released is taken too: its PUBREL is sent again).
    pub(crate) fn ack(&mut self, ack: DeliveryAck, id: u16, now: u32) -> bool {
        let awaited = |o: &Out| {
            o.id == id
                && match ack {
                    DeliveryAck::Puback => o.phase == Phase::Puback,
                    DeliveryAck::Pubrec => o.phase != Phase::Puback,
                    DeliveryAck::Pubcomp => o.phase == Phase::Pubcomp,
                    DeliveryAck::Refused => o.phase == Phase::Pubrec,
                }
        };
        let Some(k) = self.sent.iter().position(awaited) else {
            return false;
        };
        self.since = now;
        if let Some(kept) = self.kept.as_mut() {
            // Received: a PUBACK, a PUBREC, or a refusal.
            kept.retain(|(i, _)| *i != id);
        }
        if ack == DeliveryAck::Pubrec {
            let o = &mut self.sent[k];
            self.bytes -= o.len as usize;
            o.len = 0;
            o.phase = Phase::Pubcomp;
            return true;
        }
        if let Some(o) = self.sent.remove(k) {
            self.bytes -= o.len as usize;
        }
        true
    }

    /// The next held delivery, with its packet id, when `window` has a
    /// free slot.
    pub(crate) fn release(&mut self, window: usize) -> Option<(Qos1, u16)> {
        if self.sent.len() >= window {
            return None;
        }
        let p = self.waiting.pop_front()?;
        self.waiting_bytes -= p.len();
        let id = self.push(&p);
        Some((p, id))
    }
}

/// The most PUBLISHes at QoS 1 and 2 a client may have unfinished here
/// (awaiting the relay's answer, or at QoS 2 its PUBREL): the Receive
/// Maximum 5.0 CONNACK offers. Past it: 5.0 DISCONNECT 0x93, 3.1.1 close.
pub(crate) const RECEIVE_MAX: u16 = 1024;

/// A client's PUBLISHes at QoS 1 and 2 not finished yet: the QoS 1 ones
/// whose PUBACK waits for the relay's answer, and the QoS 2 ones by
/// packet id from PUBLISH to PUBREL, so that a PUBLISH sent again with
/// the same id before its PUBREL is not published twice. Boxed in the
/// client's [`super::mqtt::MqttState`] only while there are any.
#[derive(Default)]
pub(crate) struct Received {
    /// QoS 1 PUBLISHes awaiting the relay's answer.
    owed: u16,
    /// QoS 2 packet ids, each with whether the relay took it (its PUBREC
    /// went out) or its answer is awaited.
    exactly: Vec<(u16, bool)>,
}

/// What to do with a client's PUBLISH at QoS 1 or 2 ([`Received::take`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// Relay it; acknowledge it when the relay answers.
    Relay,
    /// A QoS 2 PUBLISH again before its PUBREL: not relayed again; its
    /// PUBREC is sent again if the relay took it (`true`), else it comes
    /// with the relay's answer.
    Again(bool),
    /// More than [`RECEIVE_MAX`] unfinished: a protocol error.
    TooMany,
}

impl Received {
    pub(crate) fn is_empty(&self) -> bool {
        self.owed == 0 && self.exactly.is_empty()
    }

    /// A PUBLISH at QoS 1 (`qos2` `None`) or at QoS 2 with packet id `qos2`.
    pub(crate) fn take(&mut self, qos2: Option<u16>) -> Incoming {
        if let Some(id) = qos2
            && let Some((_, took)) = self.exactly.iter().find(|(i, _)| *i == id)
        {
            return Incoming::Again(*took);
        }
        if usize::from(self.owed) + self.exactly.len() >= usize::from(RECEIVE_MAX) {
            return Incoming::TooMany;
        }
        match qos2 {
            Some(id) => self.exactly.push((id, false)),
            None => self.owed += 1,
        }
        Incoming::Relay
    }

    /// The relay's answer to a PUBLISH taken by [`Self::take`]: a QoS 2
    /// one it took now awaits PUBREL; a refused one is forgotten.
    pub(crate) fn answered(&mut self, qos2: Option<u16>, took: bool) {
        match qos2 {
            None => self.owed = self.owed.saturating_sub(1),
            Some(id) => {
                if let Some(k) = self.exactly.iter().position(|(i, _)| *i == id) {
                    if took {
                        self.exactly[k].1 = true;
                    } else {
                        self.exactly.swap_remove(k);
                    }
                }
            }
        }
    }

    /// The QoS 2 PUBLISHes the relay took, awaiting PUBREL: their ids
    /// (a persistent session keeps them, MQTT-4.3.3).
    pub(crate) fn taken(&self) -> Vec<u16> {
        let took = self.exactly.iter().filter(|(_, took)| *took);
        took.map(|(id, _)| *id).collect()
    }

    /// A resumed session's QoS 2 PUBLISHes awaiting PUBREL, by id: a
    /// PUBLISH sent again with one is not relayed again, its PUBREL is
    /// completed. At most [`RECEIVE_MAX`] are kept.
    pub(crate) fn restore(&mut self, ids: &[u16]) {
        for &id in ids {
            let known = self.exactly.iter().any(|(i, _)| *i == id);
            if !known && self.exactly.len() < usize::from(RECEIVE_MAX) {
                self.exactly.push((id, true));
            }
        }
    }

    /// PUBREL `id`: false when no QoS 2 PUBLISH the relay took has it.
    pub(crate) fn released(&mut self, id: u16) -> bool {
        match self.exactly.iter().position(|e| *e == (id, true)) {
            Some(k) => {
                self.exactly.swap_remove(k);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use throng_proto::mqtt::{Connack, Decoder, Delivery, Packet, Properties, ReasonCode, Version};

    use super::{DeliveryAck, Incoming, Inflight, Out, Phase, Qos1, RECEIVE_MAX, Received, Slot};
    use crate::control::Message;

    #[test]
    fn a_resumed_window_keeps_the_old_ids_and_never_hands_them_out_twice() {
        let q = Qos1::of(Version::V5, &Message::sample(1, "a", &b"x"[..])).unwrap();
        let two = q.exactly_once();
        assert_eq!(q.dup().parts(&[0, 1])[0][0], 0x3a, "PUBLISH, DUP, QoS 1");
        assert_eq!(two.dup().parts(&[0, 1])[0][0], 0x3c, "PUBLISH, DUP, QoS 2");
        let mut w = Inflight::new(0);
        w.keep_packets();
        assert!(w.release_again(1, 0));
        assert!(!w.release_again(1, 0), "in flight already");
        assert_eq!(w.offer_again(&two, 2, 0), 2);
        assert_eq!(w.offer_again(&q, 2, 0), 3, "2 is taken: a fresh id");
        // Fresh ids skip those the resume took.
        let Slot::Send(id) = w.offer(&q, 10, 0) else {
            panic!("held")
        };
        assert_eq!(id, 4);
        assert_eq!(w.releasing(), [1]);
        let ids: Vec<u16> = w.unreceived().iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [2, 3, 4]);
        // The PUBCOMP of the owed PUBREL frees it; a PUBREC moves 2 on.
        assert!(w.ack(DeliveryAck::Pubcomp, 1, 1));
        assert!(w.ack(DeliveryAck::Pubrec, 2, 1));
        assert_eq!(w.releasing(), [2]);
    }

    #[test]
    fn a_qos1_publish_encoded_once_takes_any_packet_id() {
        let m = Message::sample(1, "sensors/1", &b"21.5"[..]);
        for version in [Version::V311, Version::V5] {
            let q = Qos1::of(version, &m).unwrap();
            for id in [1u16, 0x1234, u16::MAX] {
                let wire = q.parts(&id.to_be_bytes()).concat();
                // A client's decoder reads CONNACK first.
                let mut d = Decoder::client(version, 1 << 16);
                let mut connack = Vec::new();
                Packet::Connack(Connack {
                    session_present: false,
                    code: ReasonCode::SUCCESS,
                    properties: Properties::EMPTY,
                })
                .encode(version, &mut connack)
                .unwrap();
                d.decode(&connack).unwrap().unwrap();
                let got = d.decode(&wire).unwrap().unwrap();
                assert_eq!(got.consumed, wire.len());
                let Packet::Publish(p) = got.packet else {
                    panic!("{:?}", got.packet);
                };
                assert_eq!(p.delivery, Delivery::AtLeastOnce(id.try_into().unwrap()));
                assert_eq!((p.topic, p.payload), ("sensors/1", &b"21.5"[..]));
            }
        }
    }

    #[test]
    fn packet_ids_skip_zero_and_those_still_in_flight_after_a_wrap() {
        let mut i = Inflight::new(0);
        assert_eq!(i.take_id(), 1);
        i.sent.push_back(Out {
            id: 1,
            phase: Phase::Puback,
            len: 10,
        });
        i.next_id = u16::MAX;
        assert_eq!(i.take_id(), u16::MAX);
        assert_eq!(i.take_id(), 2, "0 is no id, and 1 is in flight");
        assert_eq!(i.take_id(), 3);
    }

    #[test]
    fn a_qos2_publish_is_relayed_once_until_its_pubrel_and_the_count_is_bounded() {
        let mut r = Received::default();
        assert_eq!(r.take(Some(7)), Incoming::Relay);
        assert_eq!(r.take(Some(7)), Incoming::Again(false), "answer awaited");
        r.answered(Some(7), true);
        assert_eq!(r.take(Some(7)), Incoming::Again(true), "PUBREC again");
        assert!(!r.released(8));
        assert!(r.released(7));
        assert!(r.is_empty());
        assert_eq!(r.take(Some(7)), Incoming::Relay, "a new message");
        r.answered(Some(7), false);
        assert!(r.is_empty(), "refused: forgotten");
        for _ in 0..RECEIVE_MAX {
            assert_eq!(r.take(None), Incoming::Relay);
        }
        assert_eq!(r.take(None), Incoming::TooMany);
        assert_eq!(r.take(Some(1)), Incoming::TooMany);
        r.answered(None, true);
        assert_eq!(r.take(Some(1)), Incoming::Relay);
    }

    #[test]
    fn a_qos2_delivery_keeps_its_slot_from_pubrec_to_pubcomp() {
        let m = Message {
            exactly_once: true,
            ..Message::sample(1, "c", &b"x"[..])
        };
        let q2 = Qos1::of(Version::V5, &m).unwrap().exactly_once();
        assert!(q2.is_exactly_once());
        let mut i = Inflight::new(0);
        assert!(matches!(i.offer(&q2, 1, 0), Slot::Send(1)));
        assert!(matches!(i.offer(&q2, 1, 0), Slot::Held));
        assert!(!i.ack(DeliveryAck::Puback, 1, 1), "a QoS 2 delivery");
        assert!(!i.ack(DeliveryAck::Pubcomp, 1, 1), "before its PUBREC");
        assert!(i.ack(DeliveryAck::Pubrec, 1, 1));
        assert!(i.ack(DeliveryAck::Pubrec, 1, 1), "again: PUBREL again");
        assert_eq!(i.bytes(), q2.len(), "the held one only");
        assert!(i.release(1).is_none(), "the slot is still taken");
        assert!(i.ack(DeliveryAck::Pubcomp, 1, 2));
        assert_eq!(i.release(1).map(|(_, id)| id), Some(2));
        assert!(i.ack(DeliveryAck::Refused, 2, 3), "refused by PUBREC");
        assert!(i.is_empty());
    }
}
