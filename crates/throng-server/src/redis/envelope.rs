//! What an MQTT publish carries through Redis beside its payload: its QoS,
//! retain flag, framing, publisher and MQTT 5.0 properties, so a
//! subscriber on another node gets it as a subscriber on this node does.
//!
//! A message whose relay record says nothing more than a plain publish
//! (QoS 1, no properties, not retained, no MQTT publisher: every HTTP
//! publish but a retained one) goes to Redis as its bare payload, as before, so other Redis
//! clients and nodes of earlier versions read it as ever. Any other is
//! sealed: [`MAGIC`], a fixed header, the properties, then the payload.
//! A bare payload that happens to start with [`MAGIC`] is sealed too, so
//! what a node opens is always what was published.
//!
//! Header, after [`MAGIC`] (all big-endian): flags (1 byte: bits 0-1 the
//! QoS, bit 2 retained, bit 3 a text frame), the publishing node (8 bytes;
//! its random tag) and connection (8 bytes, 0 for none), the Unix
//! millisecond it was sealed (8 bytes), the properties' length (4 bytes).
//! The properties are the 5.0 encoding the relay record holds.

use bytes::{BufMut as _, Bytes, BytesMut};
use throng_proto::mqtt::{Properties, PropertiesBuf, Property};

/// What starts a sealed message: NUL (no text protocol's message starts
/// with one), then a word no history envelope (`\0throng `) shares.
pub(crate) const MAGIC: &[u8] = b"\0throng-mqtt ";

/// Bytes after [`MAGIC`] before the properties.
const HEADER: usize = 1 + 8 + 8 + 8 + 4;

/// How much longer than its payload a sealed message may be: the header
/// and properties (an MQTT client's packet is at most `--max-message` plus
/// 1 KiB, properties included).
pub(crate) const SLACK: usize = MAGIC.len() + HEADER + 1024;

const RETAINED: u8 = 0b100;
const TEXT: u8 = 0b1000;

/// A sealed message's header, opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    /// The QoS it was published at (0, 1 or 2).
    pub(crate) qos: u8,
    /// Published with the retain flag.
    pub(crate) retained: bool,
    /// A text frame for WebSocket subscribers (else binary).
    pub(crate) text: bool,
    /// The node that sealed it (its [`node_tag`]).
    pub(crate) node: u64,
    /// Its publishing connection there ([`Message::origin`]).
    pub(crate) origin: u64,
    /// The Unix millisecond it was sealed.
    pub(crate) sent_ms: u64,
    /// Its MQTT 5.0 properties, encoded ([`Message::properties`]).
    pub(crate) properties: Bytes,
}

/// The Redis channel (after the prefix) where a node says an MQTT client
/// id connected to it, so the others close their connection with it
/// (MQTT-3.1.4-2 across nodes). `#` is no channel byte: no throng channel
/// is named so, and a node of an older version drops what comes on it.
pub(crate) const CLAIMS: &str = "#claims";

/// The Redis channel (after the prefix) where each node says its members
/// of MQTT shared subscriptions ([`crate::shares::cluster`]).
pub(crate) const SHARES: &str = "#shares";

/// The channels every node hears whatever its subscribers (subscribed
/// on their own in `--redis-mode channels` and on a cluster; pattern mode's
/// pattern takes them in).
pub(crate) const CONTROL: [&str; 2] = [CLAIMS, SHARES];

/// A claim's payload: the claiming node's tag, the client id's hash, and
/// when it was claimed (Unix nanoseconds, by the claiming node's clock).
pub(crate) fn claim(node: u64, hash: u64, unix_ns: u64) -> [u8; 24] {
    let mut out = [0; 24];
    out[..8].copy_from_slice(&node.to_be_bytes());
    out[8..16].copy_from_slice(&hash.to_be_bytes());
    out[16..].copy_from_slice(&unix_ns.to_be_bytes());
    out
}

/// A claim's node, hash and time; `None` if it is not 24 bytes.
pub(crate) fn open_claim(payload: &[u8]) -> Option<(u64, u64, u64)> {
    let b: &[u8; 24] = payload.try_into().ok()?;
    let word = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().unwrap_or_default());
    Some((word(0), word(8), word(16)))
}

/// A sealed message that does not open.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
#[error("a sealed MQTT message from Redis is malformed: {0}")]
pub(crate) struct Malformed(&'static str);

/// A node's tag in what it seals: random, never 0, so a message comes back
/// to its own node's publisher (No Local) and to nobody else's.
pub(crate) fn node_tag() -> u64 {
    fastrand::u64(1..)
}

/// The Unix time in milliseconds.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Meta {
    /// Whether a bare payload says all of it: QoS 1, not retained, no
    /// properties, no MQTT publisher (an HTTP publish).
    fn is_plain(&self) -> bool {
        self.qos == 1 && !self.retained && self.origin == 0 && self.properties.is_empty()
    }
}

/// What goes to Redis for a message of `meta` and `payload`: the payload
/// as it is when a plain publish says all of it, else sealed.
pub(crate) fn seal(meta: &Meta, payload: &Bytes) -> Bytes {
    if meta.is_plain() && !payload.starts_with(MAGIC) {
        return payload.clone();
    }
    let flags = meta.qos.min(2)
        | if meta.retained { RETAINED } else { 0 }
        | if meta.text { TEXT } else { 0 };
    let mut out =
        BytesMut::with_capacity(MAGIC.len() + HEADER + meta.properties.len() + payload.len());
    out.put_slice(MAGIC);
    out.put_u8(flags);
    out.put_u64(meta.node);
    out.put_u64(meta.origin);
    out.put_u64(meta.sent_ms);
    // Properties come from one MQTT packet: far below 4 GiB.
    out.put_u32(u32::try_from(meta.properties.len()).unwrap_or(u32::MAX));
    out.put_slice(&meta.properties);
    out.put_slice(payload);
    out.freeze()
}

/// Opens what came from Redis: the header and payload of a sealed
/// message, or `None` and the bytes as they are for anything else.
pub(crate) fn open(raw: Bytes) -> Result<(Option<Meta>, Bytes), Malformed> {
    if !raw.starts_with(MAGIC) {
        return Ok((None, raw));
    }
    let h = &raw[MAGIC.len()..];
    if h.len() < HEADER {
        return Err(Malformed("shorter than its header"));
    }
    let flags = h[0];
    let qos = flags & 0b11;
    if qos > 2 || flags & !(0b11 | RETAINED | TEXT) != 0 {
        return Err(Malformed("unknown flags"));
    }
    let word = |at: usize| u64::from_be_bytes(h[at..at + 8].try_into().unwrap_or_default());
    let (node, origin, sent_ms) = (word(1), word(9), word(17));
    let len = u32::from_be_bytes(h[25..29].try_into().unwrap_or_default());
    let start = MAGIC.len() + HEADER;
    let end = usize::try_from(len)
        .ok()
        .and_then(|n| start.checked_add(n))
        .filter(|&e| e <= raw.len())
        .ok_or(Malformed("properties past its end"))?;
    let meta = Meta {
        qos,
        retained: flags & RETAINED != 0,
        text: flags & TEXT != 0,
        node,
        origin,
        sent_ms,
        properties: raw.slice(start..end),
    };
    Ok((Some(meta), raw.slice(end..)))
}

/// The payload and framing of what came from Redis, for a reader that
/// wants no more (a recovery, a history read): a sealed message's inner
/// payload, anything else as it is (a malformed seal too, rather than
/// nothing).
pub(crate) fn payload_of(raw: Bytes) -> (bool, Bytes) {
    match open(raw.clone()) {
        Ok((Some(meta), payload)) => (meta.text, payload),
        _ => (std::str::from_utf8(&raw).is_ok(), raw),
    }
}

/// A PUBLISH's `properties` as they go out `waited` ms after it was
/// published: the Message Expiry Interval, if any, less the whole seconds
/// waited; `None` once that interval is over. Properties that do not
/// decode go as they are.
pub(crate) fn expiry_left(properties: Bytes, waited: u64) -> Option<Bytes> {
    let Ok(props) = Properties::of_publish(&properties) else {
        return Some(properties);
    };
    let Some(interval) = props.iter().find_map(|p| match p {
        Property::MessageExpiryInterval(s) => Some(s),
        _ => None,
    }) else {
        return Some(properties);
    };
    let waited = u32::try_from(waited / 1000).unwrap_or(u32::MAX);
    let left = interval.checked_sub(waited).filter(|&s| s > 0)?;
    if left == interval {
        return Some(properties);
    }
    let mut out = PropertiesBuf::new();
    for p in props.iter() {
        let p = match p {
            Property::MessageExpiryInterval(_) => Property::MessageExpiryInterval(left),
            other => other,
        };
        // The same properties, one value changed: they fit as they did.
        let _ = out.push(p);
    }
    Some(Bytes::copy_from_slice(out.properties().as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(qos: u8) -> Meta {
        Meta {
            qos,
            retained: false,
            text: true,
            node: 7,
            origin: 0,
            sent_ms: 1000,
            properties: Bytes::new(),
        }
    }

    #[test]
    fn a_plain_publish_goes_bare_and_opens_to_itself() {
        let body = Bytes::from_static(b"hello");
        let raw = seal(&meta(1), &body);
        assert_eq!(raw, body);
        assert_eq!(open(raw).unwrap(), (None, body));
    }

    #[test]
    fn what_a_plain_publish_cannot_say_is_sealed_and_comes_back_whole() {
        let body = Bytes::from_static(b"\xff\x00");
        let all = Meta {
            retained: true,
            text: false,
            origin: 42,
            properties: Bytes::from_static(&[0x02, 0, 0, 0, 60]),
            ..meta(2)
        };
        assert_eq!(open(seal(&all, &body)).unwrap(), (Some(all), body));
        for one in [
            meta(0),
            Meta {
                origin: 1,
                ..meta(1)
            },
            Meta {
                retained: true,
                ..meta(1)
            },
        ] {
            let (back, payload) = open(seal(&one, &Bytes::new())).unwrap();
            assert_eq!((back, payload.len()), (Some(one), 0));
        }
    }

    #[test]
    fn a_bare_payload_that_looks_sealed_is_sealed_so_it_is_not_misread() {
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(b"not a header at all, only a payload");
        let body = Bytes::from(body);
        let (back, payload) = open(seal(&meta(1), &body)).unwrap();
        assert_eq!((back, payload), (Some(meta(1)), body));
    }

    #[test]
    fn a_broken_seal_is_refused_with_its_reason_and_never_read_past_its_end() {
        let m = Meta {
            properties: Bytes::from_static(b"pp"),
            ..meta(0)
        };
        let raw = seal(&m, &Bytes::from_static(b"x"));
        for cut in MAGIC.len()..raw.len() - 1 {
            // Any prefix is malformed or a shorter payload, never a panic.
            let _ = open(raw.slice(..cut));
        }
        assert_eq!(
            open(raw.slice(..MAGIC.len() + 3)).unwrap_err(),
            Malformed("shorter than its header")
        );
        let mut bad = raw.to_vec();
        bad[MAGIC.len()] = 3;
        assert_eq!(open(bad.into()).unwrap_err(), Malformed("unknown flags"));
        let mut long = raw.to_vec();
        long[MAGIC.len() + 25..MAGIC.len() + 29].copy_from_slice(&[0xff; 4]);
        assert_eq!(
            open(long.into()).unwrap_err(),
            Malformed("properties past its end")
        );
        assert_eq!(payload_of(raw).1, Bytes::from_static(b"x"));
    }

    #[test]
    fn a_claim_opens_to_its_node_and_hash_and_nothing_else_does() {
        assert_eq!(open_claim(&claim(7, u64::MAX, 9)), Some((7, u64::MAX, 9)));
        assert_eq!(open_claim(b"short"), None);
        assert_eq!(open_claim(&[0; 25]), None);
    }

    #[test]
    fn a_message_expiry_counts_down_by_whole_seconds_and_runs_out() {
        let mut b = PropertiesBuf::new();
        b.push(Property::MessageExpiryInterval(3)).unwrap();
        b.push(Property::UserProperty("k", "v")).unwrap();
        let props = Bytes::copy_from_slice(b.properties().as_bytes());
        assert_eq!(expiry_left(props.clone(), 999), Some(props.clone()));
        let left = expiry_left(props.clone(), 2500).unwrap();
        let left = Properties::of_publish(&left).unwrap();
        let got: Vec<Property<'_>> = left.iter().collect();
        assert_eq!(
            got,
            [
                Property::MessageExpiryInterval(1),
                Property::UserProperty("k", "v")
            ]
        );
        assert_eq!(expiry_left(props, 3000), None);
        assert_eq!(expiry_left(Bytes::new(), 1 << 40), Some(Bytes::new()));
    }
}
