//! The record of presence events (`--presence`, docs/channels.md): a
//! worker says a token subject joined or left a channel here; the
//! supervisor hands it to every worker (and, with `--redis`, to every
//! node), each of which tells the connections there that asked for the
//! channel's events.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{ControlError, need, utf8};

/// Worker → supervisor → every worker: `sub` joined (or left) `channel`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PresenceEvent {
    pub join: bool,
    pub channel: String,
    pub sub: String,
}

pub(super) const PRESENCE: u8 = 60;

pub(super) fn put(out: &mut BytesMut, e: &PresenceEvent) {
    out.put_u8(PRESENCE);
    out.put_u8(u8::from(e.join));
    // A channel name is at most 255 bytes (`channel::validate`).
    let channel = &e.channel.as_bytes()[..e.channel.len().min(usize::from(u16::MAX))];
    out.put_u16_le(channel.len() as u16);
    out.put_slice(channel);
    out.put_slice(e.sub.as_bytes());
}

pub(super) fn get(mut rec: Bytes) -> Result<PresenceEvent, ControlError> {
    need(&rec, 3)?;
    let join = rec.get_u8() != 0;
    let len = usize::from(rec.get_u16_le());
    need(&rec, len)?;
    let channel = utf8(rec.split_to(len), "channel is not UTF-8")?;
    Ok(PresenceEvent {
        join,
        channel,
        sub: utf8(rec, "subject is not UTF-8")?,
    })
}
