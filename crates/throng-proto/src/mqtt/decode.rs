//! The incremental packet decoder, for either role, and the answer to a
//! packet it refuses.

use std::num::NonZeroU16;

use super::properties::Place;
use super::topic::{self, TopicError};
use super::wire::{Reader, varint};
use super::{
    Ack, Answer, Auth, Connack, Connect, DecodeError, Delivery, Disconnect, Packet, PacketId,
    PacketType, Properties, Publish, QoS, ReasonCode, RetainHandling, Role, Suback, Subscribe,
    SubscriptionOptions, Unsuback, Unsubscribe, Version, Will,
};

/// What one call to [`Decoder::decode`] consumed and produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// Bytes consumed from the front of the buffer: one whole packet.
    pub consumed: usize,
    /// The packet; it borrows from the buffer.
    pub packet: Packet<'a>,
}

/// Incremental packet decoder for one connection.
///
/// It holds no buffer: the caller keeps the bytes of a packet that has not
/// all arrived (at most the packet limit, which the fixed header is checked
/// against first) and hands them in again with more.
///
/// Every [`DecodeError`] is fatal: send what [`Decoder::answer`] says, close
/// the connection and drop the decoder.
///
/// A server's read loop over what one read returned:
///
/// ```
/// use throng_proto::mqtt::{Connect, Decoder, Packet, Properties, Version};
///
/// // A 3.1.1 CONNECT followed by the first byte of a PINGREQ.
/// let mut read = Vec::new();
/// let connect = Connect {
///     clean_start: true,
///     keep_alive: 30,
///     properties: Properties::EMPTY,
///     client_id: "sensor-1",
///     will: None,
///     username: None,
///     password: None,
/// };
/// Packet::Connect(connect).encode(Version::V311, &mut read)?;
/// read.push(0xC0);
///
/// let mut dec = Decoder::server(64 * 1024);
/// let mut at = 0;
/// while let Some(d) = dec.decode(&read[at..]).map_err(|e| e.to_string())? {
///     at += d.consumed;
///     assert!(matches!(d.packet, Packet::Connect(c) if c.client_id == "sensor-1"));
/// }
/// assert_eq!(dec.version(), Some(Version::V311));
/// // Keep the incomplete packet for the next read.
/// assert_eq!(&read[at..], &[0xC0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Decoder {
    role: Role,
    /// Largest packet, fixed header included (5.0's Maximum Packet Size).
    max_packet: usize,
    /// The connection's version: a client's from the start; a server's from
    /// CONNECT's protocol level, as soon as that byte was read (so a CONNECT
    /// refused after it is answered in its version).
    version: Option<Version>,
    /// The first packet (CONNECT or CONNACK) was decoded.
    connected: bool,
}

impl Decoder {
    /// A server's decoder: packets over `max_packet` bytes (fixed header
    /// included) are refused.
    pub fn server(max_packet: usize) -> Self {
        Self {
            role: Role::Server,
            max_packet,
            version: None,
            connected: false,
        }
    }

    /// A client's decoder, for a connection that sent a CONNECT in `version`.
    pub fn client(version: Version, max_packet: usize) -> Self {
        Self {
            role: Role::Client,
            max_packet,
            version: Some(version),
            connected: false,
        }
    }

    /// A server's decoder for a connection whose CONNECT (in `version`) was
    /// read: what [`Decoder::server`] is after it. A server holding many
    /// connections need not keep a decoder per connection: it makes this
    /// one per read from what it keeps anyway.
    pub fn server_connected(version: Version, max_packet: usize) -> Self {
        Self {
            role: Role::Server,
            max_packet,
            version: Some(version),
            connected: true,
        }
    }

    /// The connection's version (a server's: once CONNECT's level is read).
    pub fn version(&self) -> Option<Version> {
        self.version
    }

    /// The packet limit.
    pub fn max_packet(&self) -> usize {
        self.max_packet
    }

    /// Decodes the packet at the front of `buf`.
    ///
    /// `Ok(None)`: `buf` holds less than one whole packet; keep the bytes and
    /// call again with more. What the first bytes alone show is checked at
    /// once: the packet type against the role and the phase, the header
    /// flags, and the remaining length against the limit, so a packet that
    /// will be refused is refused before the rest of it is waited for.
    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> Result<Option<Decoded<'a>>, DecodeError> {
        let Some(&first) = buf.first() else {
            return Ok(None);
        };
        let kind = self.check_first_byte(first)?;
        let Some((remaining, len_len)) = varint(&buf[1..])? else {
            return Ok(None);
        };
        let consumed = 1 + len_len + remaining;
        if consumed > self.max_packet {
            return Err(DecodeError::TooLarge {
                len: consumed,
                limit: self.max_packet,
            });
        }
        let Some(body) = buf.get(1 + len_len..consumed) else {
            return Ok(None);
        };
        let packet = self.parse(kind, first & 0x0F, body)?;
        Ok(Some(Decoded { consumed, packet }))
    }

    /// What to send before closing after `err`: a CONNACK refusing a CONNECT
    /// (in the CONNECT's version, 3.1.1 only where it has a return code for
    /// the reason), a 5.0 DISCONNECT once connected, or nothing.
    pub fn answer(&self, err: &DecodeError) -> Answer {
        let code = err.reason_code();
        let asked = match *err {
            DecodeError::ProtocolName { level } => Some(level),
            DecodeError::ProtocolLevel(level) => Some(Some(level)),
            _ => None,
        };
        if let Some(level) = asked {
            // The client reads the refusal in the version it asked for;
            // anything but 5 is told in 3.1.1's form, which 3.1 reads too.
            let version = if level == Some(5) {
                Version::V5
            } else {
                Version::V311
            };
            return Answer::Connack(version, code);
        }
        match (self.role, self.connected, self.version) {
            (_, _, None) => Answer::Close,
            (Role::Server, false, Some(Version::V5)) => Answer::Connack(Version::V5, code),
            (Role::Server, false, Some(Version::V311)) => match code.v3_connack() {
                Some(_) => Answer::Connack(Version::V311, code),
                None => Answer::Close,
            },
            (_, _, Some(Version::V5)) => Answer::Disconnect(code),
            (_, _, Some(Version::V311)) => Answer::Close,
        }
    }

    /// Checks the first byte: a packet type that exists in this version, is
    /// sent in this direction, fits the phase, and carries its flags.
    fn check_first_byte(&self, first: u8) -> Result<PacketType, DecodeError> {
        let nibble = first >> 4;
        let kind = PacketType::from_nibble(nibble).ok_or(DecodeError::ReservedType(nibble))?;
        match (self.role, self.connected) {
            (Role::Server, false) if kind != PacketType::Connect => {
                return Err(DecodeError::NotConnect(kind));
            }
            (Role::Client, false) if kind != PacketType::Connack => {
                return Err(DecodeError::NotConnack(kind));
            }
            (Role::Server, true) if kind == PacketType::Connect => {
                return Err(DecodeError::Repeated(kind));
            }
            (Role::Client, true) if kind == PacketType::Connack => {
                return Err(DecodeError::Repeated(kind));
            }
            _ => {}
        }
        if kind == PacketType::Auth && self.version == Some(Version::V311) {
            return Err(DecodeError::ReservedType(nibble));
        }
        let allowed = match self.role {
            Role::Server => kind.sent_by_client(),
            // A client's version is known from the start.
            Role::Client => kind.sent_by_server(self.version.unwrap_or(Version::V5)),
        };
        if !allowed {
            return Err(DecodeError::WrongDirection(kind));
        }
        let flags = first & 0x0F;
        match kind {
            PacketType::Publish => {
                let qos = QoS::from_bits((flags >> 1) & 3).ok_or(DecodeError::BadQos)?;
                if qos == QoS::AtMostOnce && flags & 0x08 != 0 {
                    return Err(DecodeError::DupAtQos0);
                }
            }
            PacketType::Pubrel | PacketType::Subscribe | PacketType::Unsubscribe
                if flags != 0b0010 =>
            {
                return Err(DecodeError::BadFlags {
                    packet: kind,
                    flags,
                });
            }
            PacketType::Pubrel | PacketType::Subscribe | PacketType::Unsubscribe => {}
            _ if flags != 0 => {
                return Err(DecodeError::BadFlags {
                    packet: kind,
                    flags,
                });
            }
            _ => {}
        }
        Ok(kind)
    }

    fn parse<'a>(
        &mut self,
        kind: PacketType,
        flags: u8,
        body: &'a [u8],
    ) -> Result<Packet<'a>, DecodeError> {
        let mut r = Reader::new(body, kind.name());
        if kind == PacketType::Connect {
            let connect = self.connect(&mut r)?;
            self.connected = true;
            return Ok(Packet::Connect(connect));
        }
        // Every other packet comes after CONNECT or on a client's decoder:
        // the version is known.
        let v5 = self.version == Some(Version::V5);
        let packet = match kind {
            PacketType::Connack => {
                let c = connack(&mut r, v5)?;
                self.connected = true;
                Packet::Connack(c)
            }
            PacketType::Publish => Packet::Publish(publish(&mut r, flags, v5)?),
            PacketType::Puback => Packet::Puback(ack(&mut r, kind, v5)?),
            PacketType::Pubrec => Packet::Pubrec(ack(&mut r, kind, v5)?),
            PacketType::Pubrel => Packet::Pubrel(ack(&mut r, kind, v5)?),
            PacketType::Pubcomp => Packet::Pubcomp(ack(&mut r, kind, v5)?),
            PacketType::Subscribe => Packet::Subscribe(subscribe(&mut r, v5)?),
            PacketType::Suback => Packet::Suback(suback(&mut r, v5)?),
            PacketType::Unsubscribe => Packet::Unsubscribe(unsubscribe(&mut r, v5)?),
            PacketType::Unsuback => Packet::Unsuback(unsuback(&mut r, v5)?),
            PacketType::Pingreq => Packet::Pingreq,
            PacketType::Pingresp => Packet::Pingresp,
            PacketType::Disconnect => {
                let (reason, properties) = reason_and_properties(&mut r, v5, Place::Disconnect)?;
                Packet::Disconnect(Disconnect { reason, properties })
            }
            PacketType::Auth | PacketType::Connect => {
                // check_first_byte let AUTH through in 5.0 only; CONNECT
                // was handled above.
                let (reason, properties) = reason_and_properties(&mut r, v5, Place::Auth)?;
                Packet::Auth(Auth { reason, properties })
            }
        };
        r.finish()?;
        Ok(packet)
    }

    fn connect<'a>(&mut self, r: &mut Reader<'a>) -> Result<Connect<'a>, DecodeError> {
        let name = r.binary()?;
        if name != b"MQTT" {
            return Err(DecodeError::ProtocolName { level: r.u8().ok() });
        }
        let version = match r.u8()? {
            4 => Version::V311,
            5 => Version::V5,
            level => return Err(DecodeError::ProtocolLevel(level)),
        };
        self.version = Some(version);
        let v5 = version == Version::V5;
        let flags = r.u8()?;
        let will_flag = flags & 0x04 != 0;
        let will_bits = (flags >> 3) & 3;
        let will_retain = flags & 0x20 != 0;
        let has_password = flags & 0x40 != 0;
        let has_username = flags & 0x80 != 0;
        let reserved = flags & 0x01 != 0;
        let stray_will = !will_flag && (will_bits != 0 || will_retain);
        let password_alone = !v5 && has_password && !has_username;
        if reserved || stray_will || password_alone {
            return Err(DecodeError::ConnectFlags(flags));
        }
        let will_qos = QoS::from_bits(will_bits).ok_or(DecodeError::BadQos)?;
        let clean_start = flags & 0x02 != 0;
        let keep_alive = r.u16()?;
        let properties = read_properties(r, v5, Place::Connect)?;
        let client_id = r.string()?;
        if !v5 && client_id.is_empty() && !clean_start {
            return Err(DecodeError::EmptyClientId);
        }
        let will = if will_flag {
            let properties = read_properties(r, v5, Place::Will)?;
            let topic = r.string()?;
            topic::check_name(topic).map_err(DecodeError::TopicName)?;
            let payload = r.binary()?;
            Some(Will {
                qos: will_qos,
                retain: will_retain,
                properties,
                topic,
                payload,
            })
        } else {
            None
        };
        let username = has_username.then(|| r.string()).transpose()?;
        let password = has_password.then(|| r.binary()).transpose()?;
        r.finish()?;
        Ok(Connect {
            clean_start,
            keep_alive,
            properties,
            client_id,
            will,
            username,
            password,
        })
    }
}

/// A 5.0 property list at the reader, or none in 3.1.1.
fn read_properties<'a>(
    r: &mut Reader<'a>,
    v5: bool,
    place: Place,
) -> Result<Properties<'a>, DecodeError> {
    if v5 {
        Properties::decode(r, place)
    } else {
        Ok(Properties::EMPTY)
    }
}

fn packet_id(r: &mut Reader<'_>, kind: PacketType) -> Result<PacketId, DecodeError> {
    NonZeroU16::new(r.u16()?).ok_or(DecodeError::PacketIdZero(kind))
}

fn connack<'a>(r: &mut Reader<'a>, v5: bool) -> Result<Connack<'a>, DecodeError> {
    let flags = r.u8()?;
    if flags & 0xFE != 0 {
        return Err(r.malformed("reserved acknowledge flags set"));
    }
    let raw = r.u8()?;
    let code = if v5 {
        ReasonCode(raw)
    } else {
        ReasonCode::from_v3_connack(raw).ok_or(DecodeError::ReasonCode {
            packet: PacketType::Connack,
            code: raw,
        })?
    };
    Ok(Connack {
        session_present: flags & 1 != 0,
        code,
        properties: read_properties(r, v5, Place::Connack)?,
    })
}

fn publish<'a>(r: &mut Reader<'a>, flags: u8, v5: bool) -> Result<Publish<'a>, DecodeError> {
    let topic = r.string()?;
    // check_first_byte refused QoS 3.
    let delivery = match (flags >> 1) & 3 {
        0 => Delivery::AtMostOnce,
        1 => Delivery::AtLeastOnce(packet_id(r, PacketType::Publish)?),
        _ => Delivery::ExactlyOnce(packet_id(r, PacketType::Publish)?),
    };
    let properties = read_properties(r, v5, Place::Publish)?;
    match topic::check_name(topic) {
        Ok(()) => {}
        // 5.0: an empty topic stands for the one a topic alias names.
        Err(TopicError::Empty) if v5 && properties.topic_alias().is_some() => {}
        Err(e) => return Err(DecodeError::TopicName(e)),
    }
    Ok(Publish {
        dup: flags & 0x08 != 0,
        delivery,
        retain: flags & 0x01 != 0,
        topic,
        properties,
        payload: r.rest(),
    })
}

fn ack<'a>(r: &mut Reader<'a>, kind: PacketType, v5: bool) -> Result<Ack<'a>, DecodeError> {
    let packet_id = packet_id(r, kind)?;
    let (reason, properties) = reason_and_properties(r, v5, Place::Ack)?;
    Ok(Ack {
        packet_id,
        reason,
        properties,
    })
}

/// 5.0's optional tail of acknowledgements, DISCONNECT and AUTH: a reason
/// code (success when absent) and properties (none when absent).
fn reason_and_properties<'a>(
    r: &mut Reader<'a>,
    v5: bool,
    place: Place,
) -> Result<(ReasonCode, Properties<'a>), DecodeError> {
    if !v5 || r.is_empty() {
        return Ok((ReasonCode::SUCCESS, Properties::EMPTY));
    }
    let reason = ReasonCode(r.u8()?);
    if r.is_empty() {
        return Ok((reason, Properties::EMPTY));
    }
    Ok((reason, Properties::decode(r, place)?))
}

fn subscribe<'a>(r: &mut Reader<'a>, v5: bool) -> Result<Subscribe<'a>, DecodeError> {
    let packet_id = packet_id(r, PacketType::Subscribe)?;
    let properties = read_properties(r, v5, Place::Subscribe)?;
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string()?;
        topic::check_filter(filter).map_err(DecodeError::TopicFilter)?;
        filters.push((filter, options(r.u8()?, v5)?));
    }
    if filters.is_empty() {
        return Err(DecodeError::NoFilters(PacketType::Subscribe));
    }
    Ok(Subscribe {
        packet_id,
        properties,
        filters,
    })
}

/// A subscription options byte: 3.1.1 has only the QoS bits.
fn options(byte: u8, v5: bool) -> Result<SubscriptionOptions, DecodeError> {
    let reserved = if v5 { 0xC0 } else { 0xFC };
    let retain_handling = match (byte >> 4) & 3 {
        0 => RetainHandling::OnSubscribe,
        1 => RetainHandling::OnNewSubscribe,
        2 => RetainHandling::Never,
        _ => return Err(DecodeError::SubscriptionOptions(byte)),
    };
    if byte & reserved != 0 {
        return Err(DecodeError::SubscriptionOptions(byte));
    }
    Ok(SubscriptionOptions {
        qos: QoS::from_bits(byte & 3).ok_or(DecodeError::BadQos)?,
        no_local: byte & 0x04 != 0,
        retain_as_published: byte & 0x08 != 0,
        retain_handling,
    })
}

fn suback<'a>(r: &mut Reader<'a>, v5: bool) -> Result<Suback<'a>, DecodeError> {
    let packet_id = packet_id(r, PacketType::Suback)?;
    let properties = read_properties(r, v5, Place::Suback)?;
    let raw = r.rest();
    if raw.is_empty() {
        return Err(r.malformed("no return codes"));
    }
    let codes = raw
        .iter()
        .map(|&code| {
            if v5 || matches!(code, 0 | 1 | 2 | 0x80) {
                Ok(ReasonCode(code))
            } else {
                Err(DecodeError::ReasonCode {
                    packet: PacketType::Suback,
                    code,
                })
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Suback {
        packet_id,
        properties,
        codes,
    })
}

fn unsubscribe<'a>(r: &mut Reader<'a>, v5: bool) -> Result<Unsubscribe<'a>, DecodeError> {
    let packet_id = packet_id(r, PacketType::Unsubscribe)?;
    let properties = read_properties(r, v5, Place::Unsubscribe)?;
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string()?;
        topic::check_filter(filter).map_err(DecodeError::TopicFilter)?;
        filters.push(filter);
    }
    if filters.is_empty() {
        return Err(DecodeError::NoFilters(PacketType::Unsubscribe));
    }
    Ok(Unsubscribe {
        packet_id,
        properties,
        filters,
    })
}

fn unsuback<'a>(r: &mut Reader<'a>, v5: bool) -> Result<Unsuback<'a>, DecodeError> {
    let packet_id = packet_id(r, PacketType::Unsuback)?;
    let properties = read_properties(r, v5, Place::Unsuback)?;
    let codes: Vec<ReasonCode> = r.rest().iter().map(|&c| ReasonCode(c)).collect();
    if v5 && codes.is_empty() {
        return Err(r.malformed("no reason codes"));
    }
    if !v5 && !codes.is_empty() {
        return Err(r.malformed("bytes left after its fields"));
    }
    Ok(Unsuback {
        packet_id,
        properties,
        codes,
    })
}
