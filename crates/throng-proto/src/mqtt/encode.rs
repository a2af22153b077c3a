//! Packets to bytes, in 3.1.1 or 5.0.
//!
//! Each packet's body is written by one function over a [`Sink`], run twice:
//! once counting (which is where every length is checked), once writing. The
//! remaining length in front of a body so never disagrees with the body.

use bytes::BufMut;
use thiserror::Error;

use super::properties::field_len;
use super::wire::{VARINT_MAX, put_varint, varint_len};
use super::{
    Ack, Connack, Connect, Delivery, Packet, PacketType, Properties, Publish, ReasonCode,
    SubscriptionOptions, Version,
};

/// A packet that MQTT cannot carry.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// A string or binary field over 65,535 bytes.
    #[error("{field} of {len} bytes is longer than MQTT's 65,535")]
    TooLong {
        /// Which field.
        field: &'static str,
        /// Its length.
        len: usize,
    },
    /// A body over the largest remaining length, 268,435,455 bytes.
    #[error("packet body of {0} bytes is over MQTT's 268,435,455")]
    TooLarge(usize),
    /// AUTH in 3.1.1.
    #[error("{} does not exist in MQTT 3.1.1", .0.name())]
    NotInVersion(PacketType),
}

/// Where a body goes: counted, or written.
trait Sink {
    fn put(&mut self, b: &[u8]);
}

struct Count(usize);

impl Sink for Count {
    fn put(&mut self, b: &[u8]) {
        self.0 += b.len();
    }
}

struct Write<'o, B>(&'o mut B);

impl<B: BufMut> Sink for Write<'_, B> {
    fn put(&mut self, b: &[u8]) {
        self.0.put_slice(b);
    }
}

fn u8(s: &mut impl Sink, v: u8) {
    s.put(&[v]);
}

fn u16(s: &mut impl Sink, v: u16) {
    s.put(&v.to_be_bytes());
}

fn varint(s: &mut impl Sink, v: usize) {
    let mut b = [0u8; 4];
    let n = varint_len(v);
    put_varint(&mut &mut b[..], v);
    s.put(&b[..n]);
}

/// A string or binary field: two-byte length, then the bytes.
fn binary(s: &mut impl Sink, field: &'static str, b: &[u8]) -> Result<(), EncodeError> {
    field_len(field, b)?;
    // field_len refused anything over u16::MAX.
    u16(s, b.len() as u16);
    s.put(b);
    Ok(())
}

/// A 5.0 property list with its length; nothing in 3.1.1.
fn properties(s: &mut impl Sink, p: &Properties<'_>, v5: bool) -> Result<(), EncodeError> {
    if !v5 {
        return Ok(());
    }
    let raw = p.as_bytes();
    if raw.len() > VARINT_MAX {
        return Err(EncodeError::TooLarge(raw.len()));
    }
    varint(s, raw.len());
    s.put(raw);
    Ok(())
}

/// 5.0's optional tail of acknowledgements, DISCONNECT and AUTH, as short
/// as it can be: nothing for success without properties.
fn reason_tail(
    s: &mut impl Sink,
    reason: ReasonCode,
    p: &Properties<'_>,
    v5: bool,
) -> Result<(), EncodeError> {
    if !v5 || (reason == ReasonCode::SUCCESS && p.is_empty()) {
        return Ok(());
    }
    u8(s, reason.0);
    if !p.is_empty() {
        properties(s, p, true)?;
    }
    Ok(())
}

impl Packet<'_> {
    /// Appends the packet as `version` speaks it. What 3.1.1 cannot carry
    /// is left out: properties, reason codes of acknowledgements and
    /// DISCONNECT, subscription options beyond the QoS; a 5.0 CONNACK code
    /// without a 3.1.1 equivalent ([`ReasonCode::v3_connack`]) is sent as 3,
    /// server unavailable; SUBACK failures as 0x80. Nothing is appended when
    /// an error is returned.
    pub fn encode(&self, version: Version, out: &mut impl BufMut) -> Result<(), EncodeError> {
        let body = self.body_len(version)?;
        out.put_u8(self.first_byte());
        put_varint(out, body);
        self.body(version, &mut Write(out))
    }

    /// Bytes [`Packet::encode`] appends.
    pub fn encoded_len(&self, version: Version) -> Result<usize, EncodeError> {
        let body = self.body_len(version)?;
        Ok(1 + varint_len(body) + body)
    }

    /// The remaining length, checked against MQTT's largest.
    fn body_len(&self, version: Version) -> Result<usize, EncodeError> {
        let mut count = Count(0);
        self.body(version, &mut count)?;
        if count.0 > VARINT_MAX {
            return Err(EncodeError::TooLarge(count.0));
        }
        Ok(count.0)
    }

    fn first_byte(&self) -> u8 {
        let kind = self.packet_type() as u8;
        let flags = match self {
            Self::Publish(p) => publish_flags(p),
            Self::Pubrel(_) | Self::Subscribe(_) | Self::Unsubscribe(_) => 0b0010,
            _ => 0,
        };
        kind << 4 | flags
    }

    fn body(&self, version: Version, s: &mut impl Sink) -> Result<(), EncodeError> {
        let v5 = version == Version::V5;
        match self {
            Self::Connect(c) => connect(s, c, version)?,
            Self::Connack(c) => connack(s, c, v5)?,
            Self::Publish(p) => {
                publish_head(s, p, v5)?;
                s.put(p.payload);
            }
            Self::Puback(a) | Self::Pubrec(a) | Self::Pubrel(a) | Self::Pubcomp(a) => {
                ack(s, a, v5)?;
            }
            Self::Subscribe(sub) => {
                u16(s, sub.packet_id.get());
                properties(s, &sub.properties, v5)?;
                for (filter, options) in &sub.filters {
                    binary(s, "topic filter", filter.as_bytes())?;
                    u8(s, options_byte(options, v5));
                }
            }
            Self::Suback(sub) => {
                u16(s, sub.packet_id.get());
                properties(s, &sub.properties, v5)?;
                for code in &sub.codes {
                    u8(s, suback_code(*code, v5));
                }
            }
            Self::Unsubscribe(u) => {
                u16(s, u.packet_id.get());
                properties(s, &u.properties, v5)?;
                for filter in &u.filters {
                    binary(s, "topic filter", filter.as_bytes())?;
                }
            }
            Self::Unsuback(u) => {
                u16(s, u.packet_id.get());
                properties(s, &u.properties, v5)?;
                if v5 {
                    for code in &u.codes {
                        u8(s, code.0);
                    }
                }
            }
            Self::Pingreq | Self::Pingresp => {}
            Self::Disconnect(d) => reason_tail(s, d.reason, &d.properties, v5)?,
            Self::Auth(a) => {
                if !v5 {
                    return Err(EncodeError::NotInVersion(PacketType::Auth));
                }
                reason_tail(s, a.reason, &a.properties, v5)?;
            }
        }
        Ok(())
    }
}

impl Publish<'_> {
    /// Appends the packet without its payload: the fixed header (whose
    /// remaining length counts the payload) and the variable header. A
    /// server writes this, then the payload it shares between subscribers.
    pub fn encode_head(&self, version: Version, out: &mut impl BufMut) -> Result<(), EncodeError> {
        let v5 = version == Version::V5;
        let mut count = Count(0);
        publish_head(&mut count, self, v5)?;
        let body = count.0 + self.payload.len();
        if body > VARINT_MAX {
            return Err(EncodeError::TooLarge(body));
        }
        out.put_u8((PacketType::Publish as u8) << 4 | publish_flags(self));
        put_varint(out, body);
        publish_head(&mut Write(out), self, v5)
    }
}

fn publish_flags(p: &Publish<'_>) -> u8 {
    u8::from(p.dup) << 3 | (p.delivery.qos() as u8) << 1 | u8::from(p.retain)
}

fn publish_head(s: &mut impl Sink, p: &Publish<'_>, v5: bool) -> Result<(), EncodeError> {
    binary(s, "topic", p.topic.as_bytes())?;
    if let Delivery::AtLeastOnce(id) | Delivery::ExactlyOnce(id) = p.delivery {
        u16(s, id.get());
    }
    properties(s, &p.properties, v5)
}

fn connect(s: &mut impl Sink, c: &Connect<'_>, version: Version) -> Result<(), EncodeError> {
    let v5 = version == Version::V5;
    binary(s, "protocol name", b"MQTT")?;
    u8(s, version.level());
    let mut flags = u8::from(c.clean_start) << 1;
    if let Some(w) = &c.will {
        flags |= 0x04 | (w.qos as u8) << 3 | u8::from(w.retain) << 5;
    }
    flags |= u8::from(c.password.is_some()) << 6 | u8::from(c.username.is_some()) << 7;
    u8(s, flags);
    u16(s, c.keep_alive);
    properties(s, &c.properties, v5)?;
    binary(s, "client id", c.client_id.as_bytes())?;
    if let Some(w) = &c.will {
        properties(s, &w.properties, v5)?;
        binary(s, "will topic", w.topic.as_bytes())?;
        binary(s, "will payload", w.payload)?;
    }
    if let Some(u) = c.username {
        binary(s, "user name", u.as_bytes())?;
    }
    if let Some(p) = c.password {
        binary(s, "password", p)?;
    }
    Ok(())
}

fn connack(s: &mut impl Sink, c: &Connack<'_>, v5: bool) -> Result<(), EncodeError> {
    u8(s, u8::from(c.session_present));
    let code = if v5 {
        c.code.0
    } else {
        c.code.v3_connack().unwrap_or(3)
    };
    u8(s, code);
    properties(s, &c.properties, v5)
}

fn ack(s: &mut impl Sink, a: &Ack<'_>, v5: bool) -> Result<(), EncodeError> {
    u16(s, a.packet_id.get());
    reason_tail(s, a.reason, &a.properties, v5)
}

fn options_byte(o: &SubscriptionOptions, v5: bool) -> u8 {
    let qos = o.qos as u8;
    if !v5 {
        return qos;
    }
    qos | u8::from(o.no_local) << 2
        | u8::from(o.retain_as_published) << 3
        | (o.retain_handling as u8) << 4
}

fn suback_code(code: ReasonCode, v5: bool) -> u8 {
    if v5 || code.0 <= 2 { code.0 } else { 0x80 }
}
