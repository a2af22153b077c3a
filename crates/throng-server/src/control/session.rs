//! The records of MQTT persistent sessions: a worker says when a client
//! with a client id connects ([`SessionOpen`]) and when a persistent
//! session's connection ends ([`SessionPark`]); the supervisor, which
//! keeps sessions while their clients are away ([`crate::sessions`]),
//! answers a CONNECT that asked to resume ([`SessionResumed`]).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{ControlError, Message, count, get_message, need, put_message, utf8};

/// A subscription a session keeps: its filter and its options byte (QoS
/// in the low two bits, then 5.0's No Local and Retain As Published, as
/// the worker's tables keep them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSub {
    pub filter: String,
    pub options: u8,
}

/// Worker → supervisor: an MQTT client with a client id connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOpen {
    /// Its client id's hash.
    pub hash: u64,
    /// Its connection (the worker's slot), named again by its park.
    pub conn: u64,
    /// Clean start: a kept session is dropped, and no answer comes.
    pub clean: bool,
    /// Its session outlives the connection (3.1.1: clean session 0; 5.0:
    /// a Session Expiry Interval): its park is to be expected.
    pub persistent: bool,
}

/// Worker → supervisor: a persistent session's connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPark {
    pub hash: u64,
    pub conn: u64,
    /// Seconds the session is kept ([`u32::MAX`]: as long as the server's
    /// cap allows).
    pub expiry: u32,
    /// The last relayed message whose fan-out this worker had finished
    /// when the connection ended: later ones are matched again.
    pub through: u64,
    pub subs: Vec<SessionSub>,
    /// Its deliveries never acknowledged, in order (their QoS in their
    /// flags: `exactly_once` for 2, else 1).
    pub pending: Vec<Message>,
    /// The packet id each of `pending` was sent with (0: never sent), to
    /// be sent again with it, DUP 1 (MQTT-4.4.0-1).
    pub ids: Vec<u16>,
    /// Its QoS 2 deliveries received and released (PUBREL sent), awaiting
    /// PUBCOMP: their packet ids, whose PUBREL is sent again.
    pub releases: Vec<u16>,
    /// The client's own QoS 2 PUBLISHes relayed and awaiting its PUBREL:
    /// their packet ids (MQTT-4.3.3: not relayed again if sent again).
    pub received: Vec<u16>,
}

/// Supervisor → worker: the answer to a [`SessionOpen`] without clean
/// start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionResumed {
    /// The connection it answers.
    pub conn: u64,
    /// A session was kept (CONNACK's session present).
    pub present: bool,
    /// The last message relayed before the answer: one up to it that the
    /// connection met live is in `messages` already.
    pub through: u64,
    pub subs: Vec<SessionSub>,
    /// What came while the client was away, in order, each at the QoS it
    /// is delivered at (as in [`SessionPark::pending`]).
    pub messages: Vec<Message>,
    /// The packet id each of `messages` was sent with before (0: never
    /// sent; as [`SessionPark::ids`]).
    pub ids: Vec<u16>,
    /// PUBRELs owed ([`SessionPark::releases`]).
    pub releases: Vec<u16>,
    /// The client's QoS 2 PUBLISHes awaiting PUBREL ([`SessionPark::received`]).
    pub received: Vec<u16>,
}

pub(super) const SESSION_OPEN: u8 = 42;
pub(super) const SESSION_PARK: u8 = 43;
pub(super) const SESSION_RESUMED: u8 = 44;

pub(super) fn put_open(out: &mut BytesMut, o: &SessionOpen) {
    out.put_u8(SESSION_OPEN);
    out.put_u64_le(o.hash);
    out.put_u64_le(o.conn);
    out.put_u8(u8::from(o.clean) | u8::from(o.persistent) << 1);
}

pub(super) fn get_open(mut rec: Bytes) -> Result<SessionOpen, ControlError> {
    need(&rec, 17)?;
    let hash = rec.get_u64_le();
    let conn = rec.get_u64_le();
    let flags = rec.get_u8();
    Ok(SessionOpen {
        hash,
        conn,
        clean: flags & 1 != 0,
        persistent: flags & 2 != 0,
    })
}

pub(super) fn put_park(out: &mut BytesMut, p: &SessionPark) {
    out.put_u8(SESSION_PARK);
    out.put_u64_le(p.hash);
    out.put_u64_le(p.conn);
    out.put_u32_le(p.expiry);
    out.put_u64_le(p.through);
    put_subs(out, &p.subs);
    put_messages(out, &p.pending);
    put_ids(out, &p.ids, &p.releases, &p.received);
}

pub(super) fn get_park(mut rec: Bytes) -> Result<SessionPark, ControlError> {
    need(&rec, 28)?;
    let hash = rec.get_u64_le();
    let conn = rec.get_u64_le();
    let expiry = rec.get_u32_le();
    let through = rec.get_u64_le();
    let subs = get_subs(&mut rec)?;
    let pending = get_messages(&mut rec)?;
    let [ids, releases, received] = get_ids(&mut rec, pending.len())?;
    Ok(SessionPark {
        hash,
        conn,
        expiry,
        through,
        subs,
        pending,
        ids,
        releases,
        received,
    })
}

pub(super) fn put_resumed(out: &mut BytesMut, r: &SessionResumed) {
    out.put_u8(SESSION_RESUMED);
    out.put_u64_le(r.conn);
    out.put_u8(u8::from(r.present));
    out.put_u64_le(r.through);
    put_subs(out, &r.subs);
    put_messages(out, &r.messages);
    put_ids(out, &r.ids, &r.releases, &r.received);
}

pub(super) fn get_resumed(mut rec: Bytes) -> Result<SessionResumed, ControlError> {
    need(&rec, 17)?;
    let conn = rec.get_u64_le();
    let present = rec.get_u8() != 0;
    let through = rec.get_u64_le();
    let subs = get_subs(&mut rec)?;
    let messages = get_messages(&mut rec)?;
    let [ids, releases, received] = get_ids(&mut rec, messages.len())?;
    Ok(SessionResumed {
        conn,
        present,
        through,
        subs,
        messages,
        ids,
        releases,
        received,
    })
}

/// Bytes the lists of a session record take besides filters and messages.
pub(super) fn payload_len(subs: &[SessionSub], messages: &[Message]) -> usize {
    let s: usize = subs.iter().map(|s| 3 + s.filter.len()).sum();
    let m: usize = messages
        .iter()
        .map(|m| 64 + m.channel.len() + m.properties.len() + m.payload.len())
        .sum();
    8 + s + m
}

fn put_subs(out: &mut BytesMut, subs: &[SessionSub]) {
    out.put_u32_le(subs.len() as u32);
    for s in subs {
        // A filter is at most a SUBSCRIBE's, under 64 KiB.
        let f = &s.filter.as_bytes()[..s.filter.len().min(usize::from(u16::MAX))];
        out.put_u16_le(f.len() as u16);
        out.put_slice(f);
        out.put_u8(s.options);
    }
}

fn get_subs(rec: &mut Bytes) -> Result<Vec<SessionSub>, ControlError> {
    need(rec, 4)?;
    let n = count(rec, 3)?;
    let mut subs = Vec::with_capacity(n);
    for _ in 0..n {
        need(rec, 2)?;
        let len = usize::from(rec.get_u16_le());
        need(rec, len + 1)?;
        let filter = utf8(rec.split_to(len), "filter is not UTF-8")?;
        subs.push(SessionSub {
            filter,
            options: rec.get_u8(),
        });
    }
    Ok(subs)
}

/// A message list's packet ids (one per message), the PUBRELs owed, then
/// the client's PUBLISHes awaiting PUBREL.
fn put_ids(out: &mut BytesMut, ids: &[u16], releases: &[u16], received: &[u16]) {
    for list in [ids, releases, received] {
        out.put_u32_le(list.len() as u32);
        for &id in list {
            out.put_u16_le(id);
        }
    }
}

/// What [`put_ids`] wrote for a list of `n` messages: one id each.
fn get_ids(rec: &mut Bytes, n: usize) -> Result<[Vec<u16>; 3], ControlError> {
    let mut lists = [Vec::new(), Vec::new(), Vec::new()];
    for list in &mut lists {
        need(rec, 4)?;
        let k = count(rec, 2)?;
        need(rec, 2 * k)?;
        *list = (0..k).map(|_| rec.get_u16_le()).collect();
    }
    if lists[0].len() != n {
        return Err(ControlError::Malformed("a packet id per session message"));
    }
    Ok(lists)
}

/// Each message as its length, then what [`put_message`] writes.
fn put_messages(out: &mut BytesMut, messages: &[Message]) {
    out.put_u32_le(messages.len() as u32);
    let mut one = BytesMut::new();
    for m in messages {
        one.clear();
        put_message(&mut one, m);
        out.put_u32_le(one.len() as u32);
        out.put_slice(&one);
    }
}

fn get_messages(rec: &mut Bytes) -> Result<Vec<Message>, ControlError> {
    need(rec, 4)?;
    // Each message takes at least its length and 26 bytes.
    let n = count(rec, 30)?;
    let mut messages = Vec::with_capacity(n);
    for _ in 0..n {
        need(rec, 4)?;
        let len = rec.get_u32_le() as usize;
        need(rec, len)?;
        messages.push(get_message(rec.split_to(len))?);
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Record;

    fn message(channel: &str, payload: &'static [u8], exactly_once: bool) -> Message {
        Message {
            text: false,
            exactly_once,
            ..Message::sample(7, channel, payload)
        }
    }

    fn round_trip(r: Record) {
        let mut buf = BytesMut::from(&r.encode()[..]);
        assert_eq!(Record::decode(&mut buf).unwrap(), Some(r));
        assert!(buf.is_empty());
    }

    #[test]
    fn session_records_round_trip_and_a_cut_one_is_refused() {
        let subs = vec![
            SessionSub {
                filter: "a/+".into(),
                options: 1,
            },
            SessionSub {
                filter: "b".into(),
                options: 2 | 4,
            },
        ];
        round_trip(Record::SessionOpen(SessionOpen {
            hash: 9,
            conn: 3,
            clean: false,
            persistent: true,
        }));
        let park = SessionPark {
            hash: 9,
            conn: 3,
            expiry: u32::MAX,
            through: 41,
            subs: subs.clone(),
            pending: vec![message("a/1", b"x", false), message("b", b"", true)],
            ids: vec![7, 0],
            releases: vec![9, 65535],
            received: vec![3],
        };
        round_trip(Record::SessionPark(park.clone()));
        round_trip(Record::SessionResumed(SessionResumed {
            conn: 3,
            present: true,
            through: 44,
            subs,
            messages: park.pending.clone(),
            ids: park.ids.clone(),
            releases: vec![],
            received: vec![4, 5],
        }));
        let whole = Record::SessionPark(park).encode();
        let mut cut = BytesMut::from(&whole[..whole.len() - 3]);
        let len = (cut.len() - 4) as u32;
        cut[..4].copy_from_slice(&len.to_le_bytes());
        assert!(Record::decode(&mut cut).is_err());
    }
}
