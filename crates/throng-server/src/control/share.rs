//! The records of MQTT shared subscriptions (`$share/group/filter`): a
//! worker says when it gains or loses a member of a group, and the
//! supervisor, which picks one member of the node for each message
//! ([`crate::shares`]), sends the message to that member's worker.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{ControlError, Message, get_message, need, put_message, utf8};

/// Worker → supervisor: one of its connections joined (or left) shared
/// subscription `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareMember {
    /// `group/filter`, as after `$share/`.
    pub key: String,
    pub joined: bool,
}

/// Supervisor → worker: `message` for one of its members of `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareDeliver {
    pub key: String,
    pub message: Message,
}

pub(super) const SHARE_MEMBER: u8 = 45;
pub(super) const SHARE_DELIVER: u8 = 46;

pub(super) fn put_member(out: &mut BytesMut, m: &ShareMember) {
    out.put_u8(SHARE_MEMBER);
    out.put_u8(u8::from(m.joined));
    out.put_slice(m.key.as_bytes());
}

pub(super) fn get_member(mut rec: Bytes) -> Result<ShareMember, ControlError> {
    need(&rec, 1)?;
    let joined = rec.get_u8() != 0;
    Ok(ShareMember {
        key: utf8(rec, "share key is not UTF-8")?,
        joined,
    })
}

pub(super) fn put_deliver(out: &mut BytesMut, d: &ShareDeliver) {
    out.put_u8(SHARE_DELIVER);
    // A key is a SUBSCRIBE's filter, under 64 KiB.
    let key = &d.key.as_bytes()[..d.key.len().min(usize::from(u16::MAX))];
    out.put_u16_le(key.len() as u16);
    out.put_slice(key);
    put_message(out, &d.message);
}

pub(super) fn get_deliver(mut rec: Bytes) -> Result<ShareDeliver, ControlError> {
    need(&rec, 2)?;
    let len = usize::from(rec.get_u16_le());
    need(&rec, len)?;
    let key = utf8(rec.split_to(len), "share key is not UTF-8")?;
    Ok(ShareDeliver {
        key,
        message: get_message(rec)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Record;

    #[test]
    fn share_records_round_trip() {
        for r in [
            Record::ShareMember(ShareMember {
                key: "g/a/+".into(),
                joined: true,
            }),
            Record::ShareDeliver(ShareDeliver {
                key: "g/a/+".into(),
                message: Message {
                    exactly_once: true,
                    ..Message::sample(3, "a/b", &b"hi"[..])
                },
            }),
        ] {
            let mut buf = BytesMut::from(&r.encode()[..]);
            assert_eq!(Record::decode(&mut buf).unwrap(), Some(r));
        }
    }
}
