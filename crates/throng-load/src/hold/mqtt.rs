//! MQTT in `throng hold`: what a held MQTT subscriber and the MQTT publisher
//! say, on any broker (`mqtt://HOST:PORT/<topic filter>`, `mqtts://`).
//!
//! A subscriber sends CONNECT and SUBSCRIBE in one write (a client may send
//! packets before CONNACK arrives, so this is one round trip, not two), then
//! reads CONNACK and SUBACK ([`Joining`]). From then on it is held like a
//! WebSocket connection (`held.rs`): its decoder is a few bytes with no
//! buffer, a PUBLISH is checked against its sequence, a QoS 1 PUBLISH is
//! answered with PUBACK at once (QoS 2: PUBREC, and PUBCOMP for the
//! broker's PUBREL), and PINGREQ goes out on the worker's
//! one-second sweep ([`ping_due`]). The packets themselves are
//! `throng-proto`'s; this module only decides which to send.

use std::num::NonZeroU16;

use serde::{Deserialize, Serialize};
use throng_proto::mqtt::{
    Ack, Connect, Delivery, Disconnect, Packet, PacketId, Properties, PropertiesBuf, Property,
    Publish, QoS, ReasonCode, Subscribe, SubscriptionOptions, Version,
};

/// The packet id of the one SUBSCRIBE a held connection sends.
const SUBSCRIBE_ID: PacketId = NonZeroU16::MIN;

/// How held MQTT connections and the MQTT publisher connect and subscribe;
/// every field is printed at start (but the password).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MqttOptions {
    /// The protocol level: 4 (3.1.1) or 5 (5.0).
    pub level: u8,
    /// The QoS subscribed and published at: 0, 1 or 2.
    pub qos: u8,
    /// CONNECT's keep-alive, seconds (0: none, no PINGREQ).
    pub keep_alive_s: u16,
    /// Each client id is this followed by the connection's number.
    pub client_id_prefix: String,
    /// CONNECT's user name.
    pub username: Option<String>,
    /// CONNECT's password.
    pub password: Option<String>,
    /// Connections send CONNECT and no SUBSCRIBE: a broker's cost of
    /// connected, idle devices (emqtt-bench's `conn`).
    #[serde(default)]
    pub connect_only: bool,
}

impl Default for MqttOptions {
    fn default() -> Self {
        Self {
            level: 4,
            qos: 0,
            keep_alive_s: 60,
            client_id_prefix: "throng-".to_owned(),
            username: None,
            password: None,
            connect_only: false,
        }
    }
}

impl MqttOptions {
    /// The version of [`Self::level`] (3.1.1 unless it is 5).
    pub fn version(&self) -> Version {
        if self.level == 5 {
            Version::V5
        } else {
            Version::V311
        }
    }

    /// The QoS of [`Self::qos`] (0 unless it is 1 or 2).
    pub fn qos(&self) -> QoS {
        match self.qos {
            1 => QoS::AtLeastOnce,
            2 => QoS::ExactlyOnce,
            _ => QoS::AtMostOnce,
        }
    }

    /// How a PUBLISH with packet id `id` goes at [`Self::qos`] (`id` unused at 0).
    pub fn delivery(&self, id: PacketId) -> Delivery {
        match self.qos() {
            QoS::AtMostOnce => Delivery::AtMostOnce,
            QoS::AtLeastOnce => Delivery::AtLeastOnce(id),
            QoS::ExactlyOnce => Delivery::ExactlyOnce(id),
        }
    }

    /// The start line: version, QoS, keep-alive, client ids, credentials.
    pub fn describe(&self) -> String {
        format!(
            "mqtt: version {}, {}, keep-alive {} s (PINGREQ every {}), client ids {}<n>{}",
            if self.level == 5 { "5.0" } else { "3.1.1" },
            if self.connect_only {
                "connect only (no SUBSCRIBE)".to_owned()
            } else {
                format!("QoS {}", self.qos)
            },
            self.keep_alive_s,
            match ping_every(self.keep_alive_s) {
                0 => "never".to_owned(),
                s => format!("{s} s"),
            },
            self.client_id_prefix,
            match (&self.username, &self.password) {
                (None, None) => String::new(),
                (Some(u), None) => format!(", user {u}"),
                (u, Some(_)) => format!(", user {}, password ***", u.as_deref().unwrap_or("")),
            }
        )
    }

    /// Appends CONNECT (clean session) for client `client_id`, with
    /// `keep_alive_s`.
    pub fn connect(&self, client_id: &str, keep_alive_s: u16, out: &mut Vec<u8>) {
        let packet = Packet::Connect(Connect {
            clean_start: true,
            keep_alive: keep_alive_s,
            properties: Properties::EMPTY,
            client_id,
            will: None,
            username: self.username.as_deref(),
            password: self.password.as_deref().map(str::as_bytes),
        });
        // Invariant: the strings come from a URL or a command line, far under
        // the 65,535-byte limit (checked when the request is made).
        let _ = packet.encode(self.version(), out);
    }

    /// Appends the CONNECT of a persistent-session client `client_id`,
    /// at this keep-alive: 3.1.1 clean session 0; 5.0 Clean Start
    /// `!resume` (a fresh session the first time) and a Session Expiry
    /// Interval of `expiry_s`.
    pub fn connect_session(&self, client_id: &str, resume: bool, expiry_s: u32, out: &mut Vec<u8>) {
        let mut props = PropertiesBuf::new();
        let v5 = self.version() == Version::V5;
        if v5 {
            // A four-byte integer: pushing cannot fail.
            let _ = props.push(Property::SessionExpiryInterval(expiry_s));
        }
        let packet = Packet::Connect(Connect {
            clean_start: v5 && !resume,
            keep_alive: self.keep_alive_s,
            properties: props.properties(),
            client_id,
            will: None,
            username: self.username.as_deref(),
            password: self.password.as_deref().map(str::as_bytes),
        });
        // Invariant: as for [`Self::connect`].
        let _ = packet.encode(self.version(), out);
    }

    /// Where a connection's start begins: CONNACK, then SUBACK unless
    /// [`Self::connect_only`].
    pub fn joining(&self) -> Joining {
        if self.connect_only {
            Joining::ConnackOnly
        } else {
            Joining::Connack
        }
    }

    /// Appends SUBSCRIBE to `filter` at the QoS asked (nothing for a
    /// connect-only connection).
    pub fn subscribe(&self, filter: &str, out: &mut Vec<u8>) {
        if self.connect_only {
            return;
        }
        let packet = Packet::Subscribe(Subscribe {
            packet_id: SUBSCRIBE_ID,
            properties: Properties::EMPTY,
            filters: vec![(filter, SubscriptionOptions::qos(self.qos()))],
        });
        // Invariant: as for CONNECT, a checked filter from the URL.
        let _ = packet.encode(self.version(), out);
    }
}

/// Seconds between two PINGREQs of a connection: half its keep-alive (at
/// least 1), so one lost or late PINGRESP is seen well before the broker's
/// 1.5 times the keep-alive runs out; 0 with no keep-alive.
pub fn ping_every(keep_alive_s: u16) -> u64 {
    match keep_alive_s {
        0 => 0,
        k => u64::from(k / 2).max(1),
    }
}

/// Whether connection `key` (any number that spreads connections, such as
/// its file descriptor) sends its PINGREQ at sweep `tick` (one a second):
/// each connection once every [`ping_every`] seconds, connections spread
/// evenly over them so the broker does not get them all in one second.
pub fn ping_due(key: u64, tick: u64, every: u64) -> bool {
    every != 0 && key % every == tick % every
}

/// Why CONNECT or SUBSCRIBE did not end in a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// CONNACK refused the connection with this code.
    Connack(ReasonCode),
    /// SUBACK refused the filter with this code.
    Suback(ReasonCode),
    /// A packet other than the one awaited, or a SUBACK for another id.
    Unexpected(&'static str),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connack(c) => write!(f, "CONNACK refused the connection: reason {:#04x}", c.0),
            Self::Suback(c) => write!(f, "SUBACK refused the filter: reason {:#04x}", c.0),
            Self::Unexpected(what) => write!(f, "{what}"),
        }
    }
}

/// Where a subscriber is in its CONNECT and SUBSCRIBE exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joining {
    /// CONNACK not read yet.
    Connack,
    /// CONNACK not read yet, and no SUBSCRIBE was sent.
    ConnackOnly,
    /// SUBACK not read yet.
    Suback,
    /// Subscribed.
    Done,
}

impl Joining {
    /// The next step after `packet`, or why it ends the connection.
    pub fn on(self, packet: &Packet<'_>) -> Result<Self, Refusal> {
        match (self, packet) {
            (Self::Connack | Self::ConnackOnly, Packet::Connack(c)) if c.code.is_error() => {
                Err(Refusal::Connack(c.code))
            }
            (Self::ConnackOnly, Packet::Connack(_)) => Ok(Self::Done),
            (Self::Connack, Packet::Connack(_)) => Ok(Self::Suback),
            (Self::Suback, Packet::Suback(s)) if s.packet_id != SUBSCRIBE_ID => Err(
                Refusal::Unexpected("SUBACK for a SUBSCRIBE that was not sent"),
            ),
            (Self::Suback, Packet::Suback(s)) => match s.codes.first() {
                Some(code) if code.is_error() => Err(Refusal::Suback(*code)),
                Some(_) => Ok(Self::Done),
                None => Err(Refusal::Unexpected("SUBACK without a code")),
            },
            (Self::Suback, Packet::Disconnect(d)) => Err(Refusal::Suback(d.reason)),
            // Anything else before SUBACK (a broker's PINGRESP, say) changes nothing.
            (Self::Suback, _) => Ok(self),
            (_, _) => Err(Refusal::Unexpected("a packet before CONNACK")),
        }
    }
}

/// Appends the answer a `delivery` is owed: PUBACK at QoS 1, PUBREC at
/// QoS 2 (its PUBREL gets [`handshake_step`]), nothing at QoS 0.
pub fn acknowledge(delivery: Delivery, version: Version, out: &mut Vec<u8>) {
    let ack = |packet_id| Ack {
        packet_id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::EMPTY,
    };
    let packet = match delivery {
        Delivery::AtMostOnce => return,
        Delivery::AtLeastOnce(id) => Packet::Puback(ack(id)),
        Delivery::ExactlyOnce(id) => Packet::Pubrec(ack(id)),
    };
    // A 2-to-4-byte packet with no strings: encoding cannot fail.
    let _ = packet.encode(version, out);
}

/// Appends the second half of QoS 2's handshake for packet `id`: PUBREL
/// (`release`, the publisher's answer to PUBREC) or PUBCOMP (the
/// subscriber's answer to PUBREL).
pub fn handshake_step(release: bool, id: PacketId, version: Version, out: &mut Vec<u8>) {
    let ack = Ack {
        packet_id: id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::EMPTY,
    };
    let packet = if release {
        Packet::Pubrel(ack)
    } else {
        Packet::Pubcomp(ack)
    };
    // A 2-to-4-byte packet with no strings: encoding cannot fail.
    let _ = packet.encode(version, out);
}

/// Appends PINGREQ.
pub fn pingreq(version: Version, out: &mut Vec<u8>) {
    // Two bytes, no fields: encoding cannot fail.
    let _ = Packet::Pingreq.encode(version, out);
}

/// Appends the DISCONNECT that ends a connection cleanly.
pub fn disconnect(version: Version, out: &mut Vec<u8>) {
    let packet = Packet::Disconnect(Disconnect::new(ReasonCode::SUCCESS));
    // A 2-to-4-byte packet with no strings: encoding cannot fail.
    let _ = packet.encode(version, out);
}

/// Appends a PUBLISH of `payload` to `topic`, delivered as `delivery`
/// (its QoS and packet id).
pub fn publish(
    version: Version,
    topic: &str,
    delivery: Delivery,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), throng_proto::mqtt::EncodeError> {
    Packet::Publish(Publish {
        dup: false,
        delivery,
        retain: false,
        topic,
        properties: Properties::EMPTY,
        payload,
    })
    .encode(version, out)
}

#[cfg(test)]
mod tests {
    use throng_proto::mqtt::{Connack, Decoder, Suback};

    use super::*;

    fn connack(code: ReasonCode) -> Packet<'static> {
        Packet::Connack(Connack {
            session_present: false,
            code,
            properties: Properties::EMPTY,
        })
    }

    fn suback(id: u16, code: ReasonCode) -> Packet<'static> {
        Packet::Suback(Suback {
            packet_id: PacketId::new(id).unwrap(),
            properties: Properties::EMPTY,
            codes: vec![code],
        })
    }

    #[test]
    fn connect_then_subscribe_is_what_a_broker_reads() {
        for level in [4, 5] {
            let opts = MqttOptions {
                level,
                qos: 1,
                username: Some("u".into()),
                password: Some("p".into()),
                ..MqttOptions::default()
            };
            let mut out = Vec::new();
            opts.connect("throng-7", 30, &mut out);
            opts.subscribe("a/+/c", &mut out);
            let mut dec = Decoder::server(1 << 16);
            let first = dec.decode(&out).unwrap().unwrap();
            let Packet::Connect(c) = first.packet else {
                panic!("{:?}", first.packet)
            };
            assert!(c.clean_start);
            assert_eq!(
                (c.client_id, c.keep_alive, c.username, c.password),
                ("throng-7", 30, Some("u"), Some(&b"p"[..]))
            );
            assert_eq!(dec.version(), Some(opts.version()));
            let second = dec.decode(&out[first.consumed..]).unwrap().unwrap();
            let Packet::Subscribe(s) = second.packet else {
                panic!("{:?}", second.packet)
            };
            assert_eq!(s.filters[0].0, "a/+/c");
            assert_eq!(s.filters[0].1.qos, QoS::AtLeastOnce);
        }
    }

    #[test]
    fn joining_takes_connack_then_our_suback_and_says_each_refusal() {
        let ok = Joining::Connack.on(&connack(ReasonCode::SUCCESS)).unwrap();
        assert_eq!(ok, Joining::Suback);
        assert_eq!(
            ok.on(&suback(1, ReasonCode::GRANTED_QOS_1)),
            Ok(Joining::Done)
        );
        assert_eq!(ok.on(&Packet::Pingresp), Ok(Joining::Suback));
        assert_eq!(
            Joining::Connack.on(&connack(ReasonCode::NOT_AUTHORIZED)),
            Err(Refusal::Connack(ReasonCode::NOT_AUTHORIZED))
        );
        assert_eq!(
            ok.on(&suback(1, ReasonCode::UNSPECIFIED)),
            Err(Refusal::Suback(ReasonCode::UNSPECIFIED))
        );
        assert!(matches!(
            ok.on(&suback(2, ReasonCode::SUCCESS)),
            Err(Refusal::Unexpected(_))
        ));
        assert!(Joining::Connack.on(&Packet::Pingresp).is_err());
    }

    #[test]
    fn pings_are_spread_and_each_connection_pings_every_half_keep_alive() {
        assert_eq!(ping_every(0), 0);
        assert_eq!(ping_every(1), 1);
        assert_eq!(ping_every(60), 30);
        let every = ping_every(10);
        for key in 0..20u64 {
            let due: Vec<u64> = (0..15).filter(|&t| ping_due(key, t, every)).collect();
            assert_eq!(due.len(), 3, "key {key}: {due:?}");
            assert!(due.windows(2).all(|w| w[1] - w[0] == every));
        }
        let first: Vec<u64> = (0..10).filter(|&k| ping_due(k, 0, every)).collect();
        assert_eq!(first, [0, 5], "a fifth of them in one second, not all");
        assert!(!(0..100).any(|t| ping_due(3, t, 0)));
    }

    #[test]
    fn qos1_deliveries_get_their_puback_and_qos0_nothing() {
        let mut out = Vec::new();
        acknowledge(Delivery::AtMostOnce, Version::V311, &mut out);
        assert!(out.is_empty());
        let id = PacketId::new(513).unwrap();
        acknowledge(Delivery::AtLeastOnce(id), Version::V311, &mut out);
        assert_eq!(out, [0x40, 2, 2, 1]);
    }

    #[test]
    fn qos2_deliveries_get_pubrec_then_pubcomp_and_the_publisher_pubrel() {
        let id = PacketId::new(513).unwrap();
        let mut out = Vec::new();
        acknowledge(Delivery::ExactlyOnce(id), Version::V311, &mut out);
        assert_eq!(out, [0x50, 2, 2, 1]);
        out.clear();
        handshake_step(false, id, Version::V311, &mut out);
        assert_eq!(out, [0x70, 2, 2, 1]);
        out.clear();
        handshake_step(true, id, Version::V311, &mut out);
        assert_eq!(out, [0x62, 2, 2, 1]);
        let two = MqttOptions {
            qos: 2,
            ..MqttOptions::default()
        };
        assert_eq!(two.delivery(id), Delivery::ExactlyOnce(id));
        assert_eq!(MqttOptions::default().delivery(id), Delivery::AtMostOnce);
    }
}
