//! MQTT 3.1.1 and 5.0, both roles: the packets, their codec, and the protocol's
//! answer to bad input. Topic names, filters and the subscription index that
//! matches them are in [`topic`].
//!
//! Decoding is incremental and borrows from the caller's buffer: hand
//! [`Decoder::decode`] what has arrived, get a whole [`Packet`] whose strings
//! and payloads point into it, or "not yet". A decoder is a few bytes of
//! state with no buffer of its own (an idle connection holds nothing), and
//! it knows the connection's phase: a server's first packet must be CONNECT,
//! which fixes the version the rest is decoded in; a client's first must be
//! CONNACK. The size of a packet is checked from its fixed header, before
//! any more of it arrives, so a peer costs at most the limit in memory.
//!
//! Every [`DecodeError`] is fatal and has an answer ([`Decoder::answer`]):
//! a CONNACK refusing the CONNECT with a reason code, a 5.0 DISCONNECT with
//! one, or (in 3.1.1, which has no way to say why) closing the connection.
//!
//! Encoding ([`Packet::encode`]) writes 3.1.1 or 5.0. What 3.1.1 cannot
//! carry (properties, most reason codes) is left out; the one mapping it
//! needs, 5.0 CONNACK reason codes to 3.1.1 return codes, is
//! [`ReasonCode::v3_connack`].

mod decode;
mod encode;
mod properties;
pub mod topic;
mod wire;

use std::num::NonZeroU16;

use thiserror::Error;

pub use decode::{Decoded, Decoder};
pub use encode::EncodeError;
pub use properties::{Properties, PropertiesBuf, Property};
pub use topic::TopicError;

/// The protocol versions spoken: 3.1.1 (protocol level 4) and 5.0 (level 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// MQTT 3.1.1.
    V311,
    /// MQTT 5.0.
    V5,
}

impl Version {
    /// The protocol level byte of CONNECT.
    pub fn level(self) -> u8 {
        match self {
            Self::V311 => 4,
            Self::V5 => 5,
        }
    }
}

/// Which end of the connection a [`Decoder`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reads what clients send: CONNECT first.
    Server,
    /// Reads what a server sends: CONNACK first.
    Client,
}

/// Quality of service of a message or a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QoS {
    /// 0: sent once, never acknowledged.
    AtMostOnce = 0,
    /// 1: acknowledged with PUBACK, may arrive twice.
    AtLeastOnce = 1,
    /// 2: the four-packet exchange; throng decodes it but does not offer it.
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS of two bits (0, 1, 2); 3 is not one.
    pub fn from_bits(bits: u8) -> Option<Self> {
        match bits {
            0 => Some(Self::AtMostOnce),
            1 => Some(Self::AtLeastOnce),
            2 => Some(Self::ExactlyOnce),
            _ => None,
        }
    }
}

/// A packet identifier: never 0 on the wire.
pub type PacketId = NonZeroU16;

/// How a PUBLISH is delivered: its QoS, with the packet identifier that QoS 1
/// and 2 carry (and QoS 0 does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// QoS 0.
    AtMostOnce,
    /// QoS 1, answered with a PUBACK for this id.
    AtLeastOnce(PacketId),
    /// QoS 2, answered with a PUBREC for this id.
    ExactlyOnce(PacketId),
}

impl Delivery {
    /// The QoS alone.
    pub fn qos(self) -> QoS {
        match self {
            Self::AtMostOnce => QoS::AtMostOnce,
            Self::AtLeastOnce(_) => QoS::AtLeastOnce,
            Self::ExactlyOnce(_) => QoS::ExactlyOnce,
        }
    }

    /// The packet identifier, for QoS 1 and 2.
    pub fn packet_id(self) -> Option<PacketId> {
        match self {
            Self::AtMostOnce => None,
            Self::AtLeastOnce(id) | Self::ExactlyOnce(id) => Some(id),
        }
    }
}

/// The control packet types (the high nibble of the first byte).
/// (Each variant is the packet of that name.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketType {
    Connect = 1,
    Connack = 2,
    Publish = 3,
    Puback = 4,
    Pubrec = 5,
    Pubrel = 6,
    Pubcomp = 7,
    Subscribe = 8,
    Suback = 9,
    Unsubscribe = 10,
    Unsuback = 11,
    Pingreq = 12,
    Pingresp = 13,
    Disconnect = 14,
    /// 5.0 only (enhanced authentication).
    Auth = 15,
}

impl PacketType {
    /// The type of the high nibble `nibble`; 0 is reserved.
    pub fn from_nibble(nibble: u8) -> Option<Self> {
        Some(match nibble {
            1 => Self::Connect,
            2 => Self::Connack,
            3 => Self::Publish,
            4 => Self::Puback,
            5 => Self::Pubrec,
            6 => Self::Pubrel,
            7 => Self::Pubcomp,
            8 => Self::Subscribe,
            9 => Self::Suback,
            10 => Self::Unsubscribe,
            11 => Self::Unsuback,
            12 => Self::Pingreq,
            13 => Self::Pingresp,
            14 => Self::Disconnect,
            15 => Self::Auth,
            _ => return None,
        })
    }

    /// The name the specifications use (`CONNECT`, `PUBACK`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Connect => "CONNECT",
            Self::Connack => "CONNACK",
            Self::Publish => "PUBLISH",
            Self::Puback => "PUBACK",
            Self::Pubrec => "PUBREC",
            Self::Pubrel => "PUBREL",
            Self::Pubcomp => "PUBCOMP",
            Self::Subscribe => "SUBSCRIBE",
            Self::Suback => "SUBACK",
            Self::Unsubscribe => "UNSUBSCRIBE",
            Self::Unsuback => "UNSUBACK",
            Self::Pingreq => "PINGREQ",
            Self::Pingresp => "PINGRESP",
            Self::Disconnect => "DISCONNECT",
            Self::Auth => "AUTH",
        }
    }

    /// Whether a client may send it (and so a server's decoder accepts it).
    fn sent_by_client(self) -> bool {
        !matches!(
            self,
            Self::Connack | Self::Suback | Self::Unsuback | Self::Pingresp
        )
    }

    /// Whether a server may send it in `version` (3.1.1 servers never send
    /// DISCONNECT or AUTH).
    fn sent_by_server(self, version: Version) -> bool {
        match self {
            Self::Connect | Self::Subscribe | Self::Unsubscribe | Self::Pingreq => false,
            Self::Disconnect | Self::Auth => version == Version::V5,
            _ => true,
        }
    }
}

/// A 5.0 reason code. CONNACK return codes of 3.1.1 are expressed in these
/// too ([`ReasonCode::v3_connack`]), so callers have one vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReasonCode(pub u8);

/// The codes of the 5.0 specification, section 2.4, by their names there.
impl ReasonCode {
    pub const SUCCESS: Self = Self(0x00);
    pub const GRANTED_QOS_1: Self = Self(0x01);
    pub const GRANTED_QOS_2: Self = Self(0x02);
    pub const DISCONNECT_WITH_WILL: Self = Self(0x04);
    pub const NO_MATCHING_SUBSCRIBERS: Self = Self(0x10);
    pub const NO_SUBSCRIPTION_EXISTED: Self = Self(0x11);
    pub const UNSPECIFIED: Self = Self(0x80);
    pub const MALFORMED_PACKET: Self = Self(0x81);
    pub const PROTOCOL_ERROR: Self = Self(0x82);
    pub const IMPLEMENTATION_SPECIFIC: Self = Self(0x83);
    pub const UNSUPPORTED_PROTOCOL_VERSION: Self = Self(0x84);
    pub const CLIENT_ID_NOT_VALID: Self = Self(0x85);
    pub const BAD_USERNAME_OR_PASSWORD: Self = Self(0x86);
    pub const NOT_AUTHORIZED: Self = Self(0x87);
    pub const SERVER_UNAVAILABLE: Self = Self(0x88);
    pub const SERVER_BUSY: Self = Self(0x89);
    pub const BANNED: Self = Self(0x8A);
    pub const SERVER_SHUTTING_DOWN: Self = Self(0x8B);
    pub const BAD_AUTHENTICATION_METHOD: Self = Self(0x8C);
    pub const KEEP_ALIVE_TIMEOUT: Self = Self(0x8D);
    pub const SESSION_TAKEN_OVER: Self = Self(0x8E);
    pub const TOPIC_FILTER_INVALID: Self = Self(0x8F);
    pub const TOPIC_NAME_INVALID: Self = Self(0x90);
    pub const PACKET_ID_IN_USE: Self = Self(0x91);
    pub const PACKET_ID_NOT_FOUND: Self = Self(0x92);
    pub const RECEIVE_MAXIMUM_EXCEEDED: Self = Self(0x93);
    pub const TOPIC_ALIAS_INVALID: Self = Self(0x94);
    pub const PACKET_TOO_LARGE: Self = Self(0x95);
    pub const MESSAGE_RATE_TOO_HIGH: Self = Self(0x96);
    pub const QUOTA_EXCEEDED: Self = Self(0x97);
    pub const ADMINISTRATIVE_ACTION: Self = Self(0x98);
    pub const PAYLOAD_FORMAT_INVALID: Self = Self(0x99);
    pub const RETAIN_NOT_SUPPORTED: Self = Self(0x9A);
    pub const QOS_NOT_SUPPORTED: Self = Self(0x9B);
    pub const USE_ANOTHER_SERVER: Self = Self(0x9C);
    pub const SERVER_MOVED: Self = Self(0x9D);
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: Self = Self(0x9E);
    pub const CONNECTION_RATE_EXCEEDED: Self = Self(0x9F);
    pub const MAXIMUM_CONNECT_TIME: Self = Self(0xA0);
    pub const SUBSCRIPTION_IDS_NOT_SUPPORTED: Self = Self(0xA1);
    pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: Self = Self(0xA2);
}

impl ReasonCode {
    /// Whether it reports a failure (0x80 and above).
    pub fn is_error(self) -> bool {
        self.0 >= 0x80
    }

    /// The 3.1.1 CONNACK return code with the same meaning, if 3.1.1 has one:
    /// 0 accepted, 1 unacceptable protocol version, 2 identifier rejected,
    /// 3 server unavailable, 4 bad user name or password, 5 not authorized.
    pub fn v3_connack(self) -> Option<u8> {
        Some(match self {
            Self::SUCCESS => 0,
            Self::UNSUPPORTED_PROTOCOL_VERSION => 1,
            Self::CLIENT_ID_NOT_VALID => 2,
            Self::SERVER_UNAVAILABLE | Self::SERVER_BUSY => 3,
            Self::BAD_USERNAME_OR_PASSWORD => 4,
            Self::NOT_AUTHORIZED => 5,
            _ => return None,
        })
    }

    /// The reason code of a 3.1.1 CONNACK return code (0 to 5).
    pub fn from_v3_connack(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::SUCCESS,
            1 => Self::UNSUPPORTED_PROTOCOL_VERSION,
            2 => Self::CLIENT_ID_NOT_VALID,
            3 => Self::SERVER_UNAVAILABLE,
            4 => Self::BAD_USERNAME_OR_PASSWORD,
            5 => Self::NOT_AUTHORIZED,
            _ => return None,
        })
    }
}

/// One MQTT control packet. Strings and payloads borrow from the decoded
/// buffer (or from whatever the encoding caller holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    /// The client's first packet.
    Connect(Connect<'a>),
    /// The server's answer to CONNECT.
    Connack(Connack<'a>),
    /// A message, in either direction.
    Publish(Publish<'a>),
    /// Acknowledges a QoS 1 PUBLISH.
    Puback(Ack<'a>),
    /// QoS 2, step 2.
    Pubrec(Ack<'a>),
    /// QoS 2, step 3.
    Pubrel(Ack<'a>),
    /// QoS 2, step 4.
    Pubcomp(Ack<'a>),
    /// Subscribes to one or more filters.
    Subscribe(Subscribe<'a>),
    /// The granted QoS (or a failure) per filter.
    Suback(Suback<'a>),
    /// Removes subscriptions.
    Unsubscribe(Unsubscribe<'a>),
    /// Acknowledges UNSUBSCRIBE.
    Unsuback(Unsuback<'a>),
    /// A client's keep-alive.
    Pingreq,
    /// The answer to PINGREQ.
    Pingresp,
    /// Ends the connection (from either end in 5.0, from the client in 3.1.1).
    Disconnect(Disconnect<'a>),
    /// 5.0 enhanced authentication.
    Auth(Auth<'a>),
}

impl Packet<'_> {
    /// Its type.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Self::Connect(_) => PacketType::Connect,
            Self::Connack(_) => PacketType::Connack,
            Self::Publish(_) => PacketType::Publish,
            Self::Puback(_) => PacketType::Puback,
            Self::Pubrec(_) => PacketType::Pubrec,
            Self::Pubrel(_) => PacketType::Pubrel,
            Self::Pubcomp(_) => PacketType::Pubcomp,
            Self::Subscribe(_) => PacketType::Subscribe,
            Self::Suback(_) => PacketType::Suback,
            Self::Unsubscribe(_) => PacketType::Unsubscribe,
            Self::Unsuback(_) => PacketType::Unsuback,
            Self::Pingreq => PacketType::Pingreq,
            Self::Pingresp => PacketType::Pingresp,
            Self::Disconnect(_) => PacketType::Disconnect,
            Self::Auth(_) => PacketType::Auth,
        }
    }
}

/// CONNECT. The protocol version is not a field: a decoder reports it
/// ([`Decoder::version`]) and an encoder is told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect<'a> {
    /// Clean Session (3.1.1) / Clean Start (5.0).
    pub clean_start: bool,
    /// Seconds; 0 turns keep-alive off.
    pub keep_alive: u16,
    /// 5.0 properties (session expiry, receive maximum, ...).
    pub properties: Properties<'a>,
    /// May be empty: the server then assigns one (and 3.1.1 requires a clean
    /// session for that; a decoder refuses the other case).
    pub client_id: &'a str,
    /// The message the server publishes if the connection ends without a
    /// DISCONNECT.
    pub will: Option<Will<'a>>,
    /// User name.
    pub username: Option<&'a str>,
    /// Password (binary; throng's servers read a token here).
    pub password: Option<&'a [u8]>,
}

/// A CONNECT's will message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will<'a> {
    /// QoS to publish it with.
    pub qos: QoS,
    /// Publish it as retained.
    pub retain: bool,
    /// 5.0 will properties (will delay, message expiry, ...).
    pub properties: Properties<'a>,
    /// A topic name (no wildcards).
    pub topic: &'a str,
    /// The message.
    pub payload: &'a [u8],
}

/// CONNACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connack<'a> {
    /// The server kept a session for this client id.
    pub session_present: bool,
    /// Success, or why the connection is refused (3.1.1 return codes are
    /// mapped: [`ReasonCode::v3_connack`]).
    pub code: ReasonCode,
    /// 5.0 properties (maximum QoS, receive maximum, assigned client id, ...).
    pub properties: Properties<'a>,
}

/// PUBLISH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish<'a> {
    /// A redelivery of an earlier attempt (never set with QoS 0).
    pub dup: bool,
    /// QoS and packet identifier.
    pub delivery: Delivery,
    /// Retained (server to client: sent because it was retained; client to
    /// server: keep it as the topic's retained message).
    pub retain: bool,
    /// A topic name, no wildcards; empty only in 5.0 with a topic alias.
    pub topic: &'a str,
    /// 5.0 properties (topic alias, message expiry, subscription ids, ...).
    pub properties: Properties<'a>,
    /// The message.
    pub payload: &'a [u8],
}

/// PUBACK, PUBREC, PUBREL or PUBCOMP: the same three fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack<'a> {
    /// The PUBLISH (or PUBREC, PUBREL) acknowledged.
    pub packet_id: PacketId,
    /// 5.0 only; 3.1.1 acknowledgements are all successes.
    pub reason: ReasonCode,
    /// 5.0 properties (reason string, user properties).
    pub properties: Properties<'a>,
}

/// SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe<'a> {
    /// Echoed in the SUBACK.
    pub packet_id: PacketId,
    /// 5.0 properties (subscription identifier, user properties).
    pub properties: Properties<'a>,
    /// At least one topic filter, each checked ([`topic::check_filter`]).
    pub filters: Vec<(&'a str, SubscriptionOptions)>,
}

/// What a subscriber asks of one filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubscriptionOptions {
    /// The highest QoS it wants messages at.
    pub qos: QoS,
    /// 5.0: not its own publishes.
    pub no_local: bool,
    /// 5.0: keep the retain flag as the publisher set it.
    pub retain_as_published: bool,
    /// 5.0: when retained messages are sent.
    pub retain_handling: RetainHandling,
}

impl SubscriptionOptions {
    /// The 3.1.1 options: a QoS and nothing else.
    pub fn qos(qos: QoS) -> Self {
        Self {
            qos,
            no_local: false,
            retain_as_published: false,
            retain_handling: RetainHandling::OnSubscribe,
        }
    }
}

/// 5.0's Retain Handling option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetainHandling {
    /// 0: send retained messages at every subscribe (3.1.1's behaviour).
    OnSubscribe = 0,
    /// 1: only if the subscription did not exist.
    OnNewSubscribe = 1,
    /// 2: never.
    Never = 2,
}

/// SUBACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suback<'a> {
    /// The SUBSCRIBE answered.
    pub packet_id: PacketId,
    /// 5.0 properties (reason string, user properties).
    pub properties: Properties<'a>,
    /// One per filter, in order: the granted QoS (0, 1, 2) or a failure
    /// (3.1.1 has one failure code, 0x80).
    pub codes: Vec<ReasonCode>,
}

/// UNSUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe<'a> {
    /// Echoed in the UNSUBACK.
    pub packet_id: PacketId,
    /// 5.0 properties (user properties).
    pub properties: Properties<'a>,
    /// At least one topic filter.
    pub filters: Vec<&'a str>,
}

/// UNSUBACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsuback<'a> {
    /// The UNSUBSCRIBE answered.
    pub packet_id: PacketId,
    /// 5.0 properties (reason string, user properties).
    pub properties: Properties<'a>,
    /// 5.0: one per filter; empty in 3.1.1, which has none.
    pub codes: Vec<ReasonCode>,
}

/// DISCONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect<'a> {
    /// 5.0 only; 3.1.1 has no reason.
    pub reason: ReasonCode,
    /// 5.0 properties (session expiry, reason string, server reference).
    pub properties: Properties<'a>,
}

impl Disconnect<'_> {
    /// A DISCONNECT with `reason` and no properties.
    pub fn new(reason: ReasonCode) -> Self {
        Self {
            reason,
            properties: Properties::EMPTY,
        }
    }
}

/// AUTH (5.0 only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth<'a> {
    /// 0x00 success, 0x18 continue, 0x19 re-authenticate.
    pub reason: ReasonCode,
    /// The authentication method and data.
    pub properties: Properties<'a>,
}

/// A peer broke the protocol; [`Decoder::answer`] says what to send back.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// A server's first packet was not CONNECT.
    #[error("first packet is {}, not CONNECT", .0.name())]
    NotConnect(PacketType),
    /// A client's first packet from the server was not CONNACK.
    #[error("first packet is {}, not CONNACK", .0.name())]
    NotConnack(PacketType),
    /// A second CONNECT (or CONNACK).
    #[error("second {}", .0.name())]
    Repeated(PacketType),
    /// Packet type 0, or 15 (AUTH) in 3.1.1.
    #[error("reserved packet type {0}")]
    ReservedType(u8),
    /// A packet only the other end may send.
    #[error("{} sent in the wrong direction", .0.name())]
    WrongDirection(PacketType),
    /// The fixed header's flags are not the ones its type requires.
    #[error("wrong fixed-header flags {flags:#06b} on {}", .packet.name())]
    BadFlags {
        /// The packet's type.
        packet: PacketType,
        /// The low nibble of its first byte.
        flags: u8,
    },
    /// A variable byte integer (the remaining length, a property length or a
    /// subscription identifier) over 4 bytes, or longer than it needs to be.
    #[error("variable byte integer over 4 bytes or not minimal")]
    BadLength,
    /// The packet (fixed header included) is over the decoder's limit.
    #[error("packet of {len} bytes is over the limit of {limit}")]
    TooLarge {
        /// The packet's size from its fixed header.
        len: usize,
        /// The limit given to the decoder.
        limit: usize,
    },
    /// Fields that run past the packet's end, or bytes left after them.
    #[error("malformed {packet}: {why}")]
    Malformed {
        /// The packet's type name.
        packet: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// A string that is not UTF-8 or contains U+0000.
    #[error("invalid UTF-8 (or U+0000) in a string")]
    InvalidUtf8,
    /// CONNECT's protocol name is not `MQTT`.
    #[error("protocol name is not MQTT")]
    ProtocolName {
        /// The protocol level that followed it, if any.
        level: Option<u8>,
    },
    /// CONNECT's protocol level is neither 4 (3.1.1) nor 5 (5.0).
    #[error("unsupported protocol level {0} (3.1.1 is 4, 5.0 is 5)")]
    ProtocolLevel(u8),
    /// CONNECT's flags are inconsistent (reserved bit, will options without a
    /// will, in 3.1.1 a password without a user name).
    #[error("invalid CONNECT flags {0:#010b}")]
    ConnectFlags(u8),
    /// 3.1.1: an empty client id with Clean Session 0.
    #[error("empty client id without a clean session")]
    EmptyClientId,
    /// A bad topic name in a PUBLISH or a will.
    #[error("topic name: {0}")]
    TopicName(TopicError),
    /// A bad topic filter in a SUBSCRIBE or UNSUBSCRIBE.
    #[error("topic filter: {0}")]
    TopicFilter(TopicError),
    /// QoS 3.
    #[error("QoS 3 does not exist")]
    BadQos,
    /// A QoS 0 PUBLISH with DUP set.
    #[error("DUP set on a QoS 0 PUBLISH")]
    DupAtQos0,
    /// A packet identifier of 0.
    #[error("packet identifier 0 on {}", .0.name())]
    PacketIdZero(PacketType),
    /// A SUBSCRIBE or UNSUBSCRIBE without a filter.
    #[error("{} without a topic filter", .0.name())]
    NoFilters(PacketType),
    /// Subscription options with reserved bits set or retain handling 3.
    #[error("invalid subscription options {0:#010b}")]
    SubscriptionOptions(u8),
    /// A reason or return code the packet cannot carry.
    #[error("invalid {} code {code:#04x}", .packet.name())]
    ReasonCode {
        /// The packet's type.
        packet: PacketType,
        /// The code.
        code: u8,
    },
    /// A 5.0 property that is unknown, not allowed in this packet, repeated,
    /// or has a value out of its range.
    #[error("property {id:#04x}: {why}")]
    Property {
        /// The property identifier.
        id: u8,
        /// What is wrong.
        why: &'static str,
    },
}

impl DecodeError {
    /// The 5.0 reason code for it: 0x81 malformed packet, 0x82 protocol
    /// error, 0x84 unsupported protocol version, 0x85 client identifier not
    /// valid, 0x90 topic name invalid, 0x95 packet too large.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            Self::ReservedType(_)
            | Self::BadFlags { .. }
            | Self::BadLength
            | Self::Malformed { .. }
            | Self::InvalidUtf8
            | Self::ConnectFlags(_)
            | Self::TopicFilter(_)
            | Self::BadQos
            | Self::SubscriptionOptions(_)
            | Self::ReasonCode { .. } => ReasonCode::MALFORMED_PACKET,
            Self::NotConnect(_)
            | Self::NotConnack(_)
            | Self::Repeated(_)
            | Self::WrongDirection(_)
            | Self::DupAtQos0
            | Self::PacketIdZero(_)
            | Self::NoFilters(_)
            | Self::Property { .. } => ReasonCode::PROTOCOL_ERROR,
            Self::ProtocolName { .. } | Self::ProtocolLevel(_) => {
                ReasonCode::UNSUPPORTED_PROTOCOL_VERSION
            }
            Self::EmptyClientId => ReasonCode::CLIENT_ID_NOT_VALID,
            Self::TopicName(TopicError::Wildcard) => ReasonCode::TOPIC_NAME_INVALID,
            Self::TopicName(TopicError::Empty) => ReasonCode::PROTOCOL_ERROR,
            Self::TopicName(_) => ReasonCode::MALFORMED_PACKET,
            Self::TooLarge { .. } => ReasonCode::PACKET_TOO_LARGE,
        }
    }

    /// A short stable label for metrics (`not_connect`, `too_large`, ...).
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotConnect(_) => "not_connect",
            Self::NotConnack(_) => "not_connack",
            Self::Repeated(_) => "repeated",
            Self::ReservedType(_) => "reserved_type",
            Self::WrongDirection(_) => "wrong_direction",
            Self::BadFlags { .. } => "flags",
            Self::BadLength => "length",
            Self::TooLarge { .. } => "too_large",
            Self::Malformed { .. } => "malformed",
            Self::InvalidUtf8 => "utf8",
            Self::ProtocolName { .. } => "protocol_name",
            Self::ProtocolLevel(_) => "protocol_level",
            Self::ConnectFlags(_) => "connect_flags",
            Self::EmptyClientId => "client_id",
            Self::TopicName(_) => "topic_name",
            Self::TopicFilter(_) => "topic_filter",
            Self::BadQos => "qos",
            Self::DupAtQos0 => "dup",
            Self::PacketIdZero(_) => "packet_id_zero",
            Self::NoFilters(_) => "no_filters",
            Self::SubscriptionOptions(_) => "subscription_options",
            Self::ReasonCode { .. } => "reason_code",
            Self::Property { .. } => "property",
        }
    }
}

/// What to send before closing a connection whose peer broke the protocol
/// (or that a server refuses); from [`Decoder::answer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Close without a word: the version is unknown, or 3.1.1 has no packet
    /// that says why.
    Close,
    /// Refuse the CONNECT with this code, in this version's CONNACK.
    Connack(Version, ReasonCode),
    /// A 5.0 DISCONNECT with this reason.
    Disconnect(ReasonCode),
}

impl Answer {
    /// Appends the packet to send (nothing for [`Answer::Close`]); close the
    /// connection once it is written.
    pub fn encode(self, out: &mut Vec<u8>) {
        let (version, packet) = match self {
            Self::Close => return,
            Self::Connack(version, code) => (
                version,
                Packet::Connack(Connack {
                    session_present: false,
                    code,
                    properties: Properties::EMPTY,
                }),
            ),
            Self::Disconnect(reason) => (Version::V5, Packet::Disconnect(Disconnect::new(reason))),
        };
        // Both packets are 3 to 5 bytes with no strings: encoding cannot fail.
        let _ = packet.encode(version, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn connect(version: Version) -> Vec<u8> {
        let mut out = Vec::new();
        Packet::Connect(Connect {
            clean_start: true,
            keep_alive: 60,
            properties: Properties::EMPTY,
            client_id: "c",
            will: None,
            username: None,
            password: None,
        })
        .encode(version, &mut out)
        .unwrap();
        out
    }

    /// A server decoder after `version`'s CONNECT (if any) is fed `input`:
    /// the error it refuses it with and the bytes of its answer.
    fn refused(version: Option<Version>, limit: usize, input: &[u8]) -> (DecodeError, Vec<u8>) {
        let mut dec = Decoder::server(limit);
        if let Some(v) = version {
            let c = connect(v);
            assert_eq!(dec.decode(&c).unwrap().unwrap().consumed, c.len());
        }
        let err = dec.decode(input).expect_err("accepted");
        let mut answer = Vec::new();
        dec.answer(&err).encode(&mut answer);
        (err, answer)
    }

    /// What is sent, after a CONNECT in which version (if any), to a decoder
    /// with which limit; the input, the error's label and the answer (hex).
    type Case = (
        &'static str,
        Option<Version>,
        usize,
        &'static str,
        &'static str,
        &'static str,
    );

    /// Each bad input the issue lists, and more, with the protocol's answer.
    #[test]
    fn bad_input_gets_the_protocols_answer() {
        use Version::{V5, V311};
        let big = 1 << 20;
        #[rustfmt::skip]
        let cases: &[Case] = &[
            ("first packet PINGREQ", None, big, "c0", "not_connect", ""),
            ("first packet PUBLISH", None, big, "30 05 00 01 61 68 69", "not_connect", ""),
            ("protocol level 6", None, big, "10 0d 00 04 4d515454 06 02 003c 0001 63", "protocol_level", "20 02 00 01"),
            ("3.1's MQIsdp", None, big, "10 0f 00 06 4d5149736470 03 02 003c 0001 63", "protocol_name", "20 02 00 01"),
            ("name MQTX, level 5", None, big, "10 0e 00 04 4d515458 05 02 003c 00 0001 63", "protocol_name", "20 03 00 84 00"),
            ("name MQTX, level 4", None, big, "10 0d 00 04 4d515458 04 02 003c 0001 63", "protocol_name", "20 02 00 01"),
            ("remaining length of 5 bytes, 5.0", Some(V5), big, "30 ff ff ff ff", "length", "e0 01 81"),
            ("remaining length of 5 bytes, 3.1.1", Some(V311), big, "30 ff ff ff ff", "length", ""),
            ("remaining length of 5 bytes, first", None, big, "10 80 80 80 80", "length", ""),
            ("over the limit, 5.0", Some(V5), 1024, "30 80 08", "too_large", "e0 01 95"),
            ("over the limit, 3.1.1", Some(V311), 1024, "30 80 08", "too_large", ""),
            ("CONNECT over the limit", None, 1024, "10 80 08", "too_large", ""),
            ("topic not UTF-8, 5.0", Some(V5), big, "30 06 0002 61ff 00 78", "utf8", "e0 01 81"),
            ("topic not UTF-8, 3.1.1", Some(V311), big, "30 05 0002 61ff 78", "utf8", ""),
            ("topic with U+0000", Some(V5), big, "30 06 0002 6100 00 78", "utf8", "e0 01 81"),
            ("wildcard in a PUBLISH topic", Some(V5), big, "30 06 0002 612b 00 78", "topic_name", "e0 01 90"),
            ("# in a PUBLISH topic", Some(V311), big, "30 05 0002 6123 78", "topic_name", ""),
            ("packet id 0 at QoS 1", Some(V5), big, "32 07 0001 61 0000 00 78", "packet_id_zero", "e0 01 82"),
            ("packet id 0 at QoS 1, 3.1.1", Some(V311), big, "32 06 0001 61 0000 78", "packet_id_zero", ""),
            ("SUBSCRIBE without filters", Some(V5), big, "82 03 0001 00", "no_filters", "e0 01 82"),
            ("SUBSCRIBE without filters, 3.1.1", Some(V311), big, "82 02 0001", "no_filters", ""),
            ("UNSUBSCRIBE without filters", Some(V5), big, "a2 03 0001 00", "no_filters", "e0 01 82"),
            ("QoS 3", Some(V5), big, "36", "qos", "e0 01 81"),
            ("DUP at QoS 0", Some(V5), big, "38", "dup", "e0 01 82"),
            ("SUBSCRIBE flags 0", Some(V5), big, "80", "flags", "e0 01 81"),
            ("second CONNECT", Some(V5), big, "10", "repeated", "e0 01 82"),
            ("a server's packet from a client", Some(V5), big, "90 03 0001 00", "wrong_direction", "e0 01 82"),
            ("AUTH in 3.1.1", Some(V311), big, "f0 00", "reserved_type", ""),
            ("type 0", Some(V5), big, "00 00", "reserved_type", "e0 01 81"),
            ("bad filter", Some(V5), big, "82 09 0001 00 0003 61232f 00", "topic_filter", "e0 01 81"),
            ("subscription options reserved bits", Some(V5), big, "82 07 0001 00 0001 61 c0", "subscription_options", "e0 01 81"),
            ("3.1.1 subscription options", Some(V311), big, "82 06 0001 0001 61 04", "subscription_options", ""),
            ("PINGREQ with a body", Some(V5), big, "c0 01 00", "malformed", "e0 01 81"),
            ("PUBACK cut short", Some(V5), big, "40 01 00", "malformed", "e0 01 81"),
            ("unknown property", Some(V5), big, "30 07 0001 61 02 07 00 78", "property", "e0 01 82"),
            ("empty client id without a clean session", None, big, "10 0c 00 04 4d515454 04 00 003c 0000", "client_id", "20 02 00 02"),
            ("reserved CONNECT flag", None, big, "10 0d 00 04 4d515454 04 03 003c 0001 63", "connect_flags", ""),
            ("reserved CONNECT flag, 5.0", None, big, "10 0e 00 04 4d515454 05 03 003c 00 0001 63", "connect_flags", "20 03 00 81 00"),
            ("3.1.1 password without user name", None, big, "10 10 00 04 4d515454 04 42 003c 0001 63 0001 70", "connect_flags", ""),
            ("will topic with a wildcard, 5.0", None, big, "10 16 00 04 4d515454 05 06 003c 00 0001 63 00 0002 2f23 0001 78", "topic_name", "20 03 00 90 00"),
            ("bytes after CONNECT", None, big, "10 0e 00 04 4d515454 04 02 003c 0001 63 ff", "malformed", ""),
        ];
        for &(what, version, limit, input, label, answer) in cases {
            let (err, got) = refused(version, limit, &hex(input));
            assert_eq!(err.label(), label, "{what}: {err}");
            assert_eq!(got, hex(answer), "{what}: answer to {err}");
        }
    }

    #[test]
    fn a_header_is_judged_before_the_rest_arrives() {
        // A 2 MiB PUBLISH is refused from its 4 header bytes.
        let (err, _) = refused(Some(Version::V5), 1 << 20, &hex("30 80 80 80 01"));
        assert_eq!(
            err,
            DecodeError::TooLarge {
                len: 5 + (1 << 21),
                limit: 1 << 20
            }
        );
        // And the fifth length byte is not waited for.
        let (err, _) = refused(Some(Version::V5), 1 << 20, &hex("30 80 80 80 80"));
        assert_eq!(err, DecodeError::BadLength);
        // A packet that fits waits for its bytes.
        let mut dec = Decoder::server(1 << 20);
        let c = connect(Version::V5);
        assert!(dec.decode(&c[..c.len() - 1]).unwrap().is_none());
        assert!(dec.decode(&c).unwrap().is_some());
    }

    #[test]
    fn every_packet_round_trips_in_both_versions() {
        let id = PacketId::new(7).unwrap();
        let mut props = PropertiesBuf::new();
        props.push(Property::UserProperty("k", "v")).unwrap();
        let p5 = props.properties();
        let packets = |v5: bool| {
            let props = if v5 { p5 } else { Properties::EMPTY };
            vec![
                Packet::Connack(Connack {
                    session_present: true,
                    code: ReasonCode::SUCCESS,
                    properties: props,
                }),
                Packet::Publish(Publish {
                    dup: true,
                    delivery: Delivery::AtLeastOnce(id),
                    retain: true,
                    topic: "a/b",
                    properties: props,
                    payload: b"x",
                }),
                Packet::Puback(Ack {
                    packet_id: id,
                    reason: if v5 {
                        ReasonCode::QUOTA_EXCEEDED
                    } else {
                        ReasonCode::SUCCESS
                    },
                    properties: props,
                }),
                Packet::Suback(Suback {
                    packet_id: id,
                    properties: props,
                    codes: vec![ReasonCode::GRANTED_QOS_1, ReasonCode::UNSPECIFIED],
                }),
                Packet::Unsuback(Unsuback {
                    packet_id: id,
                    properties: props,
                    codes: if v5 {
                        vec![ReasonCode::SUCCESS]
                    } else {
                        vec![]
                    },
                }),
                Packet::Pingresp,
            ]
        };
        for (version, v5) in [(Version::V311, false), (Version::V5, true)] {
            let mut dec = Decoder::client(version, 1 << 20);
            for packet in packets(v5) {
                let mut out = Vec::new();
                packet.encode(version, &mut out).unwrap();
                assert_eq!(out.len(), packet.encoded_len(version).unwrap());
                let d = dec.decode(&out).unwrap().unwrap();
                assert_eq!((d.consumed, &d.packet), (out.len(), &packet), "{version:?}");
            }
        }
    }

    #[test]
    fn what_3_1_1_cannot_say_is_left_out_or_mapped() {
        let mut out = Vec::new();
        let refusal = Connack {
            session_present: false,
            code: ReasonCode::QUOTA_EXCEEDED,
            properties: Properties::EMPTY,
        };
        Packet::Connack(refusal)
            .encode(Version::V311, &mut out)
            .unwrap();
        assert_eq!(out, [0x20, 0x02, 0x00, 0x03], "server unavailable");
        out.clear();
        Packet::Disconnect(Disconnect::new(ReasonCode::SERVER_SHUTTING_DOWN))
            .encode(Version::V311, &mut out)
            .unwrap();
        assert_eq!(out, [0xE0, 0x00]);
        out.clear();
        Packet::Disconnect(Disconnect::new(ReasonCode::SERVER_SHUTTING_DOWN))
            .encode(Version::V5, &mut out)
            .unwrap();
        assert_eq!(out, [0xE0, 0x01, 0x8B]);
        let auth = Packet::Auth(Auth {
            reason: ReasonCode::SUCCESS,
            properties: Properties::EMPTY,
        });
        assert_eq!(
            auth.encode(Version::V311, &mut out),
            Err(EncodeError::NotInVersion(PacketType::Auth))
        );
    }

    #[test]
    fn a_publish_head_and_its_payload_make_the_packet() {
        let p = Publish {
            dup: false,
            delivery: Delivery::AtLeastOnce(PacketId::new(300).unwrap()),
            retain: false,
            topic: "sensors/1",
            properties: Properties::EMPTY,
            payload: &[7; 200],
        };
        for version in [Version::V311, Version::V5] {
            let mut whole = Vec::new();
            Packet::Publish(p.clone())
                .encode(version, &mut whole)
                .unwrap();
            let mut head = Vec::new();
            p.encode_head(version, &mut head).unwrap();
            head.extend_from_slice(p.payload);
            assert_eq!(head, whole);
        }
    }

    #[test]
    fn fields_too_long_for_mqtt_are_refused_before_anything_is_written() {
        let topic = "t".repeat(70_000);
        let p = Packet::Publish(Publish {
            dup: false,
            delivery: Delivery::AtMostOnce,
            retain: false,
            topic: &topic,
            properties: Properties::EMPTY,
            payload: b"",
        });
        let mut out = Vec::new();
        assert_eq!(
            p.encode(Version::V5, &mut out),
            Err(EncodeError::TooLong {
                field: "topic",
                len: 70_000
            })
        );
        assert!(out.is_empty());
    }
}
