//! MQTT 5.0 properties (section 2.2.2): what each packet may carry, checked
//! once when the packet is decoded, then read from the packet's own bytes.
//!
//! A [`Properties`] is the encoded property list itself, borrowed: decoding
//! one allocates nothing, and whatever property a caller does not ask for
//! costs nothing more. [`PropertiesBuf`] writes one.

use bytes::BufMut;

use super::wire::{Reader, put_binary, put_varint, varint_len};
use super::{DecodeError, EncodeError};

/// One property, by its name in the specification (section 2.2.2.2); each
/// variant holds the property's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property<'a> {
    PayloadFormatIndicator(u8),
    MessageExpiryInterval(u32),
    ContentType(&'a str),
    ResponseTopic(&'a str),
    CorrelationData(&'a [u8]),
    SubscriptionIdentifier(u32),
    SessionExpiryInterval(u32),
    AssignedClientIdentifier(&'a str),
    ServerKeepAlive(u16),
    AuthenticationMethod(&'a str),
    AuthenticationData(&'a [u8]),
    RequestProblemInformation(u8),
    WillDelayInterval(u32),
    RequestResponseInformation(u8),
    ResponseInformation(&'a str),
    ServerReference(&'a str),
    ReasonString(&'a str),
    ReceiveMaximum(u16),
    TopicAliasMaximum(u16),
    TopicAlias(u16),
    MaximumQos(u8),
    RetainAvailable(u8),
    UserProperty(&'a str, &'a str),
    MaximumPacketSize(u32),
    WildcardSubscriptionAvailable(u8),
    SubscriptionIdentifierAvailable(u8),
    SharedSubscriptionAvailable(u8),
}

/// Where a property list sits, for the table of which property goes where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    Connect,
    Will,
    Connack,
    Publish,
    /// PUBACK, PUBREC, PUBREL, PUBCOMP.
    Ack,
    Subscribe,
    Suback,
    Unsubscribe,
    Unsuback,
    Disconnect,
    Auth,
}

/// The shape of a property's value on the wire.
#[derive(Clone, Copy)]
enum Kind {
    Byte,
    Two,
    Four,
    Varint,
    Str,
    Bin,
    Pair,
}

/// Identifier, value shape, where it may appear, and whether it may appear
/// more than once there.
fn spec(id: u8) -> Option<(Kind, &'static [Place], bool)> {
    use Kind::*;
    use Place::*;
    const MESSAGE: &[Place] = &[Publish, Will];
    const ALL: &[Place] = &[
        Connect,
        Will,
        Connack,
        Publish,
        Ack,
        Subscribe,
        Suback,
        Unsubscribe,
        Unsuback,
        Disconnect,
        Auth,
    ];
    Some(match id {
        0x01 => (Byte, MESSAGE, false),
        0x02 => (Four, MESSAGE, false),
        0x03 => (Str, MESSAGE, false),
        0x08 => (Str, MESSAGE, false),
        0x09 => (Bin, MESSAGE, false),
        // Repeatable only in a PUBLISH (one per matching subscription):
        // checked where the table is read.
        0x0B => (Varint, &[Publish, Subscribe], true),
        0x11 => (Four, &[Connect, Connack, Disconnect], false),
        0x12 => (Str, &[Connack], false),
        0x13 => (Two, &[Connack], false),
        0x15 => (Str, &[Connect, Connack, Auth], false),
        0x16 => (Bin, &[Connect, Connack, Auth], false),
        0x17 => (Byte, &[Connect], false),
        0x18 => (Four, &[Will], false),
        0x19 => (Byte, &[Connect], false),
        0x1A => (Str, &[Connack], false),
        0x1C => (Str, &[Connack, Disconnect], false),
        0x1F => (
            Str,
            &[Connack, Ack, Suback, Unsuback, Disconnect, Auth],
            false,
        ),
        0x21 => (Two, &[Connect, Connack], false),
        0x22 => (Two, &[Connect, Connack], false),
        0x23 => (Two, &[Publish], false),
        0x24 => (Byte, &[Connack], false),
        0x25 => (Byte, &[Connack], false),
        0x26 => (Pair, ALL, true),
        0x27 => (Four, &[Connect, Connack], false),
        0x28..=0x2A => (Byte, &[Connack], false),
        _ => return None,
    })
}

impl<'a> Property<'a> {
    fn id(&self) -> u8 {
        match self {
            Self::PayloadFormatIndicator(_) => 0x01,
            Self::MessageExpiryInterval(_) => 0x02,
            Self::ContentType(_) => 0x03,
            Self::ResponseTopic(_) => 0x08,
            Self::CorrelationData(_) => 0x09,
            Self::SubscriptionIdentifier(_) => 0x0B,
            Self::SessionExpiryInterval(_) => 0x11,
            Self::AssignedClientIdentifier(_) => 0x12,
            Self::ServerKeepAlive(_) => 0x13,
            Self::AuthenticationMethod(_) => 0x15,
            Self::AuthenticationData(_) => 0x16,
            Self::RequestProblemInformation(_) => 0x17,
            Self::WillDelayInterval(_) => 0x18,
            Self::RequestResponseInformation(_) => 0x19,
            Self::ResponseInformation(_) => 0x1A,
            Self::ServerReference(_) => 0x1C,
            Self::ReasonString(_) => 0x1F,
            Self::ReceiveMaximum(_) => 0x21,
            Self::TopicAliasMaximum(_) => 0x22,
            Self::TopicAlias(_) => 0x23,
            Self::MaximumQos(_) => 0x24,
            Self::RetainAvailable(_) => 0x25,
            Self::UserProperty(..) => 0x26,
            Self::MaximumPacketSize(_) => 0x27,
            Self::WildcardSubscriptionAvailable(_) => 0x28,
            Self::SubscriptionIdentifierAvailable(_) => 0x29,
            Self::SharedSubscriptionAvailable(_) => 0x2A,
        }
    }

    /// Reads one property; checks its shape and UTF-8 but not where it is.
    fn read(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        // Identifiers are variable byte integers; all defined ones fit one byte.
        let id = r.varint()?;
        let id = u8::try_from(id)
            .ok()
            .filter(|&id| spec(id).is_some())
            .ok_or(DecodeError::Property {
                id: u8::try_from(id).unwrap_or(u8::MAX),
                why: "unknown property",
            })?;
        let byte = |r: &mut Reader<'a>| r.u8();
        let two = |r: &mut Reader<'a>| r.u16();
        let four = |r: &mut Reader<'a>| r.u32();
        let s = |r: &mut Reader<'a>| r.string();
        let bin = |r: &mut Reader<'a>| r.binary();
        Ok(match id {
            0x01 => Self::PayloadFormatIndicator(byte(r)?),
            0x02 => Self::MessageExpiryInterval(four(r)?),
            0x03 => Self::ContentType(s(r)?),
            0x08 => Self::ResponseTopic(s(r)?),
            0x09 => Self::CorrelationData(bin(r)?),
            // A varint is at most 2^28 - 1: it fits a u32.
            0x0B => Self::SubscriptionIdentifier(r.varint()? as u32),
            0x11 => Self::SessionExpiryInterval(four(r)?),
            0x12 => Self::AssignedClientIdentifier(s(r)?),
            0x13 => Self::ServerKeepAlive(two(r)?),
            0x15 => Self::AuthenticationMethod(s(r)?),
            0x16 => Self::AuthenticationData(bin(r)?),
            0x17 => Self::RequestProblemInformation(byte(r)?),
            0x18 => Self::WillDelayInterval(four(r)?),
            0x19 => Self::RequestResponseInformation(byte(r)?),
            0x1A => Self::ResponseInformation(s(r)?),
            0x1C => Self::ServerReference(s(r)?),
            0x1F => Self::ReasonString(s(r)?),
            0x21 => Self::ReceiveMaximum(two(r)?),
            0x22 => Self::TopicAliasMaximum(two(r)?),
            0x23 => Self::TopicAlias(two(r)?),
            0x24 => Self::MaximumQos(byte(r)?),
            0x25 => Self::RetainAvailable(byte(r)?),
            0x26 => Self::UserProperty(s(r)?, s(r)?),
            0x27 => Self::MaximumPacketSize(four(r)?),
            0x28 => Self::WildcardSubscriptionAvailable(byte(r)?),
            0x29 => Self::SubscriptionIdentifierAvailable(byte(r)?),
            _ => Self::SharedSubscriptionAvailable(byte(r)?),
        })
    }

    /// Values the specification rules out: booleans other than 0 and 1, a
    /// maximum QoS over 1, and zeros where zero means nothing.
    fn check_value(&self) -> Result<(), &'static str> {
        match *self {
            Self::PayloadFormatIndicator(b)
            | Self::RequestProblemInformation(b)
            | Self::RequestResponseInformation(b)
            | Self::MaximumQos(b)
            | Self::RetainAvailable(b)
            | Self::WildcardSubscriptionAvailable(b)
            | Self::SubscriptionIdentifierAvailable(b)
            | Self::SharedSubscriptionAvailable(b)
                if b > 1 =>
            {
                Err("value must be 0 or 1")
            }
            Self::SubscriptionIdentifier(0) => Err("subscription identifier 0"),
            Self::ReceiveMaximum(0) => Err("receive maximum 0"),
            Self::TopicAlias(0) => Err("topic alias 0"),
            Self::MaximumPacketSize(0) => Err("maximum packet size 0"),
            _ => Ok(()),
        }
    }

    /// Bytes it takes on the wire, or which string or binary is too long.
    fn encoded_len(&self) -> Result<usize, EncodeError> {
        let field = |b: &[u8]| field_len("property", b);
        Ok(1 + match *self {
            Self::PayloadFormatIndicator(_)
            | Self::RequestProblemInformation(_)
            | Self::RequestResponseInformation(_)
            | Self::MaximumQos(_)
            | Self::RetainAvailable(_)
            | Self::WildcardSubscriptionAvailable(_)
            | Self::SubscriptionIdentifierAvailable(_)
            | Self::SharedSubscriptionAvailable(_) => 1,
            Self::ServerKeepAlive(_)
            | Self::ReceiveMaximum(_)
            | Self::TopicAliasMaximum(_)
            | Self::TopicAlias(_) => 2,
            Self::MessageExpiryInterval(_)
            | Self::SessionExpiryInterval(_)
            | Self::WillDelayInterval(_)
            | Self::MaximumPacketSize(_) => 4,
            Self::SubscriptionIdentifier(v) => {
                let v = v as usize;
                if v > super::wire::VARINT_MAX {
                    return Err(EncodeError::TooLong {
                        field: "subscription identifier",
                        len: v,
                    });
                }
                varint_len(v)
            }
            Self::ContentType(s)
            | Self::ResponseTopic(s)
            | Self::AssignedClientIdentifier(s)
            | Self::AuthenticationMethod(s)
            | Self::ResponseInformation(s)
            | Self::ServerReference(s)
            | Self::ReasonString(s) => field(s.as_bytes())?,
            Self::CorrelationData(b) | Self::AuthenticationData(b) => field(b)?,
            Self::UserProperty(k, v) => field(k.as_bytes())? + field(v.as_bytes())?,
        })
    }

    /// Appends it; [`Property::encoded_len`] said it fits.
    fn put(&self, out: &mut impl BufMut) {
        out.put_u8(self.id());
        match *self {
            Self::PayloadFormatIndicator(b)
            | Self::RequestProblemInformation(b)
            | Self::RequestResponseInformation(b)
            | Self::MaximumQos(b)
            | Self::RetainAvailable(b)
            | Self::WildcardSubscriptionAvailable(b)
            | Self::SubscriptionIdentifierAvailable(b)
            | Self::SharedSubscriptionAvailable(b) => out.put_u8(b),
            Self::ServerKeepAlive(v)
            | Self::ReceiveMaximum(v)
            | Self::TopicAliasMaximum(v)
            | Self::TopicAlias(v) => out.put_u16(v),
            Self::MessageExpiryInterval(v)
            | Self::SessionExpiryInterval(v)
            | Self::WillDelayInterval(v)
            | Self::MaximumPacketSize(v) => out.put_u32(v),
            Self::SubscriptionIdentifier(v) => put_varint(out, v as usize),
            Self::ContentType(s)
            | Self::ResponseTopic(s)
            | Self::AssignedClientIdentifier(s)
            | Self::AuthenticationMethod(s)
            | Self::ResponseInformation(s)
            | Self::ServerReference(s)
            | Self::ReasonString(s) => put_binary(out, s.as_bytes()),
            Self::CorrelationData(b) | Self::AuthenticationData(b) => put_binary(out, b),
            Self::UserProperty(k, v) => {
                put_binary(out, k.as_bytes());
                put_binary(out, v.as_bytes());
            }
        }
    }
}

/// Bytes a string or binary field takes (its two-byte length included), or
/// [`EncodeError::TooLong`] past 65,535 bytes.
pub(super) fn field_len(field: &'static str, b: &[u8]) -> Result<usize, EncodeError> {
    if b.len() > usize::from(u16::MAX) {
        return Err(EncodeError::TooLong {
            field,
            len: b.len(),
        });
    }
    Ok(2 + b.len())
}

/// The properties of one packet (or will), as encoded.
///
/// Invariant: `raw` is a sequence of well-formed properties (each known, of
/// the right shape, UTF-8 checked); either the decoder checked it
/// or a [`PropertiesBuf`] wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Properties<'a> {
    raw: &'a [u8],
}

impl<'a> Properties<'a> {
    /// No properties (what every 3.1.1 packet has).
    pub const EMPTY: Properties<'static> = Properties { raw: &[] };

    /// The encoded list, without its length.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.raw
    }

    /// No property at all.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Every property, in order.
    pub fn iter(&self) -> impl Iterator<Item = Property<'a>> + use<'a> {
        let mut r = Reader::new(self.raw, "properties");
        // The invariant says each read succeeds; an error ends the walk.
        std::iter::from_fn(move || {
            if r.is_empty() {
                None
            } else {
                Property::read(&mut r).ok()
            }
        })
    }

    /// Reads the property list (its length first) at the reader's position
    /// and checks every property for `place`: known, allowed there, not
    /// repeated unless the specification allows, value in range.
    pub(super) fn decode(r: &mut Reader<'a>, place: Place) -> Result<Self, DecodeError> {
        let len = r.varint()?;
        let raw = r.bytes(len)?;
        Self::check(raw, place)
    }

    /// The properties a server passes on from a PUBLISH or a will to the
    /// subscribers' PUBLISH (payload format, message expiry, content type,
    /// response topic, correlation data, user properties), in order.
    pub fn forwarded(&self) -> impl Iterator<Item = Property<'a>> + use<'a> {
        self.iter()
            .filter(|p| matches!(p.id(), 0x01 | 0x02 | 0x03 | 0x08 | 0x09 | 0x26))
    }

    /// A PUBLISH's properties from their encoding ([`Self::as_bytes`]),
    /// checked as the decoder checks those of a PUBLISH it reads.
    pub fn of_publish(raw: &'a [u8]) -> Result<Self, DecodeError> {
        Self::check(raw, Place::Publish)
    }

    /// Checks `raw`, the encoded properties of a packet in `place`.
    fn check(raw: &'a [u8], place: Place) -> Result<Self, DecodeError> {
        let mut inner = Reader::new(raw, "properties");
        let mut seen = 0u64;
        while !inner.is_empty() {
            let p = Property::read(&mut inner)?;
            let id = p.id();
            let bad = |why| DecodeError::Property { id, why };
            // spec() knows every id Property::read returns.
            let (_, places, repeatable) = spec(id).ok_or(bad("unknown property"))?;
            if !places.contains(&place) {
                return Err(bad("not allowed in this packet"));
            }
            let repeatable = repeatable && !(id == 0x0B && place == Place::Subscribe);
            if seen & (1 << id) != 0 && !repeatable {
                return Err(bad("appears twice"));
            }
            seen |= 1 << id;
            p.check_value().map_err(bad)?;
        }
        Ok(Self { raw })
    }

    fn find<T>(&self, pick: impl Fn(Property<'a>) -> Option<T>) -> Option<T> {
        self.iter().find_map(pick)
    }

    /// Session Expiry Interval, seconds (CONNECT, CONNACK, DISCONNECT).
    pub fn session_expiry_interval(&self) -> Option<u32> {
        self.find(|p| match p {
            Property::SessionExpiryInterval(v) => Some(v),
            _ => None,
        })
    }

    /// Receive Maximum: QoS 1 and 2 publishes the sender of it takes at once.
    pub fn receive_maximum(&self) -> Option<u16> {
        self.find(|p| match p {
            Property::ReceiveMaximum(v) => Some(v),
            _ => None,
        })
    }

    /// Maximum Packet Size the sender of it accepts.
    pub fn maximum_packet_size(&self) -> Option<u32> {
        self.find(|p| match p {
            Property::MaximumPacketSize(v) => Some(v),
            _ => None,
        })
    }

    /// Maximum QoS (CONNACK): 0 or 1; absent means 2.
    pub fn maximum_qos(&self) -> Option<u8> {
        self.find(|p| match p {
            Property::MaximumQos(v) => Some(v),
            _ => None,
        })
    }

    /// Topic Alias (PUBLISH).
    pub fn topic_alias(&self) -> Option<u16> {
        self.find(|p| match p {
            Property::TopicAlias(v) => Some(v),
            _ => None,
        })
    }

    /// Server Keep Alive (CONNACK): seconds the client must use instead of its own.
    pub fn server_keep_alive(&self) -> Option<u16> {
        self.find(|p| match p {
            Property::ServerKeepAlive(v) => Some(v),
            _ => None,
        })
    }

    /// Assigned Client Identifier (CONNACK).
    pub fn assigned_client_identifier(&self) -> Option<&'a str> {
        self.find(|p| match p {
            Property::AssignedClientIdentifier(v) => Some(v),
            _ => None,
        })
    }

    /// Authentication Method (CONNECT, CONNACK, AUTH).
    pub fn authentication_method(&self) -> Option<&'a str> {
        self.find(|p| match p {
            Property::AuthenticationMethod(v) => Some(v),
            _ => None,
        })
    }

    /// Reason String.
    pub fn reason_string(&self) -> Option<&'a str> {
        self.find(|p| match p {
            Property::ReasonString(v) => Some(v),
            _ => None,
        })
    }

    /// Will Delay Interval, seconds (will properties).
    pub fn will_delay_interval(&self) -> Option<u32> {
        self.find(|p| match p {
            Property::WillDelayInterval(v) => Some(v),
            _ => None,
        })
    }
}

/// Writes a property list, to be lent out as [`Properties`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PropertiesBuf {
    raw: Vec<u8>,
}

impl PropertiesBuf {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `p`; a string or binary value over 65,535 bytes is refused.
    /// Whether `p` belongs in the packet it will go in is the caller's
    /// business (a decoder checks that on the other end).
    pub fn push(&mut self, p: Property<'_>) -> Result<&mut Self, EncodeError> {
        let len = p.encoded_len()?;
        self.raw.reserve(len);
        p.put(&mut self.raw);
        Ok(self)
    }

    /// The list as written so far.
    pub fn properties(&self) -> Properties<'_> {
        Properties { raw: &self.raw }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(ps: &[Property<'_>]) -> Vec<u8> {
        let mut b = PropertiesBuf::new();
        for &p in ps {
            b.push(p).unwrap();
        }
        let mut out = Vec::new();
        put_varint(&mut out, b.raw.len());
        out.extend_from_slice(&b.raw);
        out
    }

    fn decode(bytes: &[u8], place: Place) -> Result<Vec<Property<'_>>, DecodeError> {
        let mut r = Reader::new(bytes, "test");
        let props = Properties::decode(&mut r, place)?;
        r.finish()?;
        Ok(props.iter().collect())
    }

    #[test]
    fn every_shape_round_trips() {
        let ps = [
            Property::PayloadFormatIndicator(1),
            Property::MessageExpiryInterval(70_000),
            Property::ContentType("text/plain"),
            Property::ResponseTopic("r/1"),
            Property::CorrelationData(&[0, 1, 2]),
            Property::SubscriptionIdentifier(268_435_455),
            Property::SubscriptionIdentifier(3),
            Property::TopicAlias(9),
            Property::UserProperty("k", "v"),
            Property::UserProperty("k", "w"),
        ];
        let bytes = list(&ps);
        assert_eq!(decode(&bytes, Place::Publish).unwrap(), ps);
        let connack = [
            Property::SessionExpiryInterval(0),
            Property::AssignedClientIdentifier("auto-1"),
            Property::ServerKeepAlive(30),
            Property::ReceiveMaximum(20),
            Property::MaximumQos(1),
            Property::MaximumPacketSize(1 << 20),
            Property::WildcardSubscriptionAvailable(1),
            Property::SharedSubscriptionAvailable(0),
            Property::ReasonString("ok"),
        ];
        let bytes = list(&connack);
        let got = decode(&bytes, Place::Connack).unwrap();
        assert_eq!(got, connack);
        let mut r = Reader::new(&bytes, "test");
        let p = Properties::decode(&mut r, Place::Connack).unwrap();
        assert_eq!(p.maximum_qos(), Some(1));
        assert_eq!(p.receive_maximum(), Some(20));
        assert_eq!(p.assigned_client_identifier(), Some("auto-1"));
        assert_eq!(p.server_keep_alive(), Some(30));
        assert_eq!(p.topic_alias(), None);
    }

    #[test]
    fn misplaced_repeated_unknown_or_out_of_range_properties_are_refused() {
        let bad = |ps: &[Property<'_>], place| decode(&list(ps), place).unwrap_err();
        assert!(matches!(
            bad(&[Property::TopicAlias(1)], Place::Connect),
            DecodeError::Property {
                id: 0x23,
                why: "not allowed in this packet"
            }
        ));
        assert!(matches!(
            bad(
                &[Property::ReceiveMaximum(1), Property::ReceiveMaximum(2)],
                Place::Connect
            ),
            DecodeError::Property {
                id: 0x21,
                why: "appears twice"
            }
        ));
        assert!(matches!(
            bad(
                &[
                    Property::SubscriptionIdentifier(1),
                    Property::SubscriptionIdentifier(2)
                ],
                Place::Subscribe
            ),
            DecodeError::Property { id: 0x0B, .. }
        ));
        for p in [
            Property::ReceiveMaximum(0),
            Property::MaximumPacketSize(0),
            Property::RequestProblemInformation(2),
        ] {
            assert!(matches!(
                bad(&[p], Place::Connect),
                DecodeError::Property { .. }
            ));
        }
        assert!(matches!(
            bad(&[Property::MaximumQos(2)], Place::Connack),
            DecodeError::Property { id: 0x24, .. }
        ));
        assert_eq!(
            decode(&[2, 0x07, 0], Place::Connect),
            Err(DecodeError::Property {
                id: 7,
                why: "unknown property"
            })
        );
        // Length says 3, one byte follows.
        assert!(matches!(
            decode(&[3, 0x24], Place::Connack),
            Err(DecodeError::Malformed { .. })
        ));
        // A string property with invalid UTF-8.
        assert_eq!(
            decode(&[4, 0x1F, 0, 1, 0xFF], Place::Ack),
            Err(DecodeError::InvalidUtf8)
        );
    }

    #[test]
    fn a_value_too_long_for_its_length_is_refused_when_written() {
        let long = "x".repeat(70_000);
        let mut b = PropertiesBuf::new();
        assert!(matches!(
            b.push(Property::ReasonString(&long)),
            Err(EncodeError::TooLong { .. })
        ));
        assert!(b.properties().is_empty(), "nothing half-written");
    }

    #[test]
    fn a_publishs_forwarded_properties_leave_out_the_hop_by_hop_ones_and_read_back() {
        let mut b = PropertiesBuf::new();
        b.push(Property::TopicAlias(3)).unwrap();
        b.push(Property::UserProperty("a", "1")).unwrap();
        b.push(Property::MessageExpiryInterval(9)).unwrap();
        b.push(Property::SubscriptionIdentifier(2)).unwrap();
        b.push(Property::CorrelationData(b"c")).unwrap();
        let mut kept = PropertiesBuf::new();
        for p in b.properties().forwarded() {
            kept.push(p).unwrap();
        }
        let raw = kept.properties().as_bytes().to_vec();
        let back = Properties::of_publish(&raw).unwrap();
        let ids: Vec<u8> = back.iter().map(|p| p.id()).collect();
        assert_eq!(ids, [0x26, 0x02, 0x09]);
        assert!(Properties::of_publish(&[0x26, 0x00]).is_err(), "cut short");
    }
}
