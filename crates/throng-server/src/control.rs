//! The records a supervisor and its workers exchange over each worker's Unix
//! socket: small length-prefixed binary records.
//!
//! Layout: `u32` length (little endian, of what follows), a tag byte, then the
//! record's fields. Strings are length-prefixed; a payload runs to the end of
//! the record, so a published message is copied once into a record and the
//! same `Bytes` is written to every worker.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::addresses::{Source, Verdict};
use crate::history::{Kept, MessageId};
use crate::retained::RetainedMessage;

mod api;
mod presence;
mod session;
mod share;
pub use api::{API_READ, ApiRecord, Leg};
pub use presence::PresenceEvent;
pub use session::{SessionOpen, SessionPark, SessionResumed, SessionSub};
pub use share::{ShareDeliver, ShareMember};

/// The largest record accepted; far above any `--max-message`.
pub const MAX_RECORD: usize = 64 * 1024 * 1024;

/// One record on a control socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Supervisor → worker, first record: the worker's [`crate::Config`] as JSON.
    Config(Bytes),
    /// Worker → supervisor: a `POST /publish/<channel>` arrived.
    Publish(Message),
    /// Supervisor → worker: fan this message out to your subscribers.
    Deliver(Message),
    /// Worker → supervisor: message `id` went to this many subscribers here.
    Delivered {
        /// The id of the [`Record::Deliver`].
        id: u64,
        /// Subscribers of the channel in this worker.
        subscribers: u64,
    },
    /// Supervisor → worker: publish request `id` reached this many subscribers in all.
    Published {
        /// The id of the [`Record::Publish`].
        id: u64,
        /// Sum over workers.
        subscribers: u64,
        /// The message's id ([`MessageId::NONE`] when the node did not number it).
        message: MessageId,
    },
    /// Worker → supervisor: a subscriber of `channel` reconnected after
    /// message `since`; what followed it?
    Recover {
        /// Echoed in the answer.
        id: u64,
        /// The last message id the subscriber saw.
        since: MessageId,
        /// The channel.
        channel: String,
    },
    /// Supervisor → worker: the answer to [`Record::Recover`] `id`: the
    /// kept messages after `since`, and whether nothing else was missed.
    Recovered {
        /// The id of the [`Record::Recover`].
        id: u64,
        /// No message after `since` was dropped from the history.
        complete: bool,
        /// The kept messages after `since`, oldest first.
        messages: Vec<Kept>,
    },
    /// Worker → supervisor: the worker's counters as JSON ([`crate::metrics::Snapshot`]).
    Snapshot(Bytes),
    /// Worker → supervisor: someone asked this worker for `/metrics`.
    MetricsRequest {
        /// Echoed in the answer.
        id: u64,
    },
    /// Supervisor → worker: the Prometheus text for request `id`.
    Metrics {
        /// The id of the [`Record::MetricsRequest`].
        id: u64,
        /// Prometheus text exposition.
        text: Bytes,
    },
    /// Worker → supervisor (Redis channels mode): this worker now has
    /// subscribers of `channel` (its first arrived), or none (its last left).
    Interest {
        /// The channel.
        channel: String,
        /// `true`: first subscriber; `false`: last one gone.
        subscribed: bool,
    },
    /// Supervisor → worker: publish request `id` could not be published (503).
    PublishFailed {
        /// The id of the [`Record::Publish`].
        id: u64,
        /// Why, in words for the publisher.
        reason: Bytes,
    },
    /// Supervisor → worker: the broker's state, for `/healthz`.
    Broker {
        /// The broker link works.
        up: bool,
        /// How long it has been down, when it is.
        down_ms: u64,
        /// One line describing the state.
        text: Bytes,
    },
    /// Worker → supervisor (per-address limits): may a new connection from
    /// `source` be served?
    Admit {
        /// Echoed in the answer.
        id: u64,
        /// The client's address as the limits count it.
        source: Source,
    },
    /// Supervisor → worker: the answer to [`Record::Admit`] `id`.
    Admitted {
        /// The id of the [`Record::Admit`].
        id: u64,
        /// Served, or why not.
        verdict: Verdict,
    },
    /// Worker → supervisor: an admitted connection from `source` ended.
    Release {
        /// The client's address.
        source: Source,
    },
    /// Worker → supervisor: a publish that also becomes its channel's
    /// retained message (an empty payload clears it); relayed and answered
    /// as [`Record::Publish`].
    PublishRetained {
        /// The QoS it was published at (HTTP: 1).
        qos: u8,
        /// The message, as in `Publish`.
        message: Message,
    },
    /// Worker → supervisor: a new MQTT subscription; what are the retained
    /// messages of the channels these filters match?
    RetainedAsk {
        /// Echoed in the answer.
        id: u64,
        /// The filters (exact or wildcard).
        filters: Vec<String>,
    },
    /// Supervisor → worker: the answer to [`Record::RetainedAsk`] `id`,
    /// sent after every message relayed before the store was read.
    Retained {
        /// The id of the [`Record::RetainedAsk`].
        id: u64,
        /// One per matching channel.
        messages: Vec<RetainedMessage>,
    },
    /// Supervisor → worker: the settings again after SIGHUP re-read the
    /// certificate and keys ([`crate::reload`]), as JSON like
    /// [`Record::Config`]; the worker takes their TLS and auth material.
    Reload(Bytes),
    /// Worker → supervisor: an MQTT client connected with a client id
    /// (its hash); supervisor → every other worker: close your connection
    /// with that client id, it was taken over (MQTT-3.1.4-2).
    ClientId {
        /// The client id's hash ([`crate::worker`]'s takeover table).
        hash: u64,
        /// When and where it was claimed: a worker closes its own
        /// connection only for a later claim, so a record that arrives
        /// after a newer local CONNECT cannot close the newer one.
        claim: Claim,
    },
    /// Worker → supervisor: an MQTT client with a client id connected
    /// (persistent sessions, [`crate::sessions`]).
    SessionOpen(SessionOpen),
    /// Worker → supervisor: a persistent session's connection ended.
    SessionPark(SessionPark),
    /// Supervisor → worker: the session a CONNECT without clean start resumes.
    SessionResumed(SessionResumed),
    /// Worker → supervisor: a member of an MQTT shared subscription joined or left.
    ShareMember(ShareMember),
    /// Supervisor → worker: a message for one of its shared subscription's members.
    ShareDeliver(ShareDeliver),
    /// One leg of a server API request (`/api/...`), [`ApiRecord`].
    Api(ApiRecord),
    /// Worker → supervisor: a token subject joined or left a channel of
    /// `--presence`; supervisor → every worker: tell its watchers.
    Presence(PresenceEvent),
    /// Worker → supervisor: a token named a `kid` no key has; with
    /// `--auth-jwks-url` the key set may have rotated (read it again).
    KeysStale,
}

/// When and on which worker an MQTT client id was claimed: later claims
/// order after earlier ones (the host's monotonic clock, one time line for
/// every worker process), a tie goes to the higher worker index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Claim {
    /// CLOCK_MONOTONIC in nanoseconds.
    pub at_ns: u64,
    /// The claiming worker's index.
    pub worker: u32,
}

/// A message on its way to subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Publish request id (in `Publish`) or relay sequence number (in `Deliver`).
    pub id: u64,
    /// The message's id in its channel's history (in `Deliver`; [`MessageId::NONE`] in `Publish`).
    pub message: MessageId,
    /// Send as a text frame (else binary).
    pub text: bool,
    /// Published at QoS 0 (an MQTT client's PUBLISH, or its will): MQTT
    /// subscribers get it at QoS 0 whatever they asked. Every other
    /// publish is QoS 1 to those who asked for it.
    pub at_most_once: bool,
    /// Published at QoS 2 (an MQTT client's PUBLISH): MQTT subscribers
    /// that asked for QoS 2 get it at 2 (others at what they asked).
    pub exactly_once: bool,
    /// An MQTT 5.0 PUBLISH's (or will's) properties its subscribers get
    /// (user properties, message expiry, content type, payload format,
    /// response topic, correlation data), encoded; empty for the rest.
    pub properties: Bytes,
    /// Published with MQTT's retain flag (an MQTT PUBLISH or an HTTP
    /// `?retain=1`): a 5.0 subscription with Retain As Published gets it
    /// with the flag set.
    pub retained: bool,
    /// Which MQTT connection of this node published it (its worker and
    /// slot, [`crate::worker`]'s `origin`), 0 for any other publisher: a
    /// 5.0 subscription with No Local does not get its own messages.
    pub origin: u64,
    /// The channel, already validated.
    pub channel: String,
    /// The message body.
    pub payload: Bytes,
}

#[cfg(test)]
impl Message {
    /// A text message `id` on `channel`, QoS 1 to MQTT, no properties and
    /// no publisher: what tests start from, changing what they test.
    pub(crate) fn sample(id: u64, channel: &str, payload: impl Into<Bytes>) -> Self {
        Self {
            id,
            message: MessageId::NONE,
            text: true,
            at_most_once: false,
            exactly_once: false,
            properties: Bytes::new(),
            retained: false,
            origin: 0,
            channel: channel.to_owned(),
            payload: payload.into(),
        }
    }
}

/// A control socket carried something that is not a record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// A record announced more than [`MAX_RECORD`] bytes.
    #[error("control record of {0} bytes is over the limit")]
    TooBig(usize),
    /// A record was cut short or had an unknown tag.
    #[error("malformed control record: {0}")]
    Malformed(&'static str),
    /// Reading the socket failed.
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
}

const CONFIG: u8 = 1;
const PUBLISH: u8 = 2;
const DELIVER: u8 = 3;
const DELIVERED: u8 = 4;
const PUBLISHED: u8 = 5;
const SNAPSHOT: u8 = 6;
const METRICS_REQUEST: u8 = 7;
const METRICS: u8 = 8;
const INTEREST: u8 = 9;
const PUBLISH_FAILED: u8 = 10;
const BROKER: u8 = 11;
const ADMIT: u8 = 12;
const ADMITTED: u8 = 13;
const RELEASE: u8 = 14;
const RECOVER: u8 = 15;
const RECOVERED: u8 = 16;
const PUBLISH_RETAINED: u8 = 17;
const RETAINED_ASK: u8 = 18;
const RETAINED: u8 = 19;
// Far from the others: kinds added beside it by other work stay apart.
const RELOAD: u8 = 40;
const CLIENT_ID: u8 = 41;
const KEYS_STALE: u8 = 80;

/// Bytes a retained message takes in a [`Record::Retained`] besides its
/// channel and payload.
pub const RETAINED_FRAMING: usize = 23;

impl Record {
    /// Encodes the record, length prefix included.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(32 + self.payload_len());
        out.put_u32_le(0);
        match self {
            Self::Config(json) => {
                out.put_u8(CONFIG);
                out.put_slice(json);
            }
            Self::Reload(json) => {
                out.put_u8(RELOAD);
                out.put_slice(json);
            }
            Self::Publish(m) | Self::Deliver(m) => {
                out.put_u8(if matches!(self, Self::Publish(_)) {
                    PUBLISH
                } else {
                    DELIVER
                });
                put_message(&mut out, m);
            }
            Self::PublishRetained { qos, message } => {
                out.put_u8(PUBLISH_RETAINED);
                out.put_u8(*qos);
                put_message(&mut out, message);
            }
            Self::RetainedAsk { id, filters } => put_retained_ask(&mut out, *id, filters),
            Self::Retained { id, messages } => put_retained(&mut out, *id, messages),
            Self::Delivered { id, subscribers } => {
                out.put_u8(DELIVERED);
                out.put_u64_le(*id);
                out.put_u64_le(*subscribers);
            }
            Self::Published {
                id,
                subscribers,
                message,
            } => {
                out.put_u8(PUBLISHED);
                out.put_u64_le(*id);
                out.put_u64_le(*subscribers);
                put_id(&mut out, *message);
            }
            Self::Recover { id, since, channel } => {
                out.put_u8(RECOVER);
                out.put_u64_le(*id);
                put_id(&mut out, *since);
                out.put_slice(channel.as_bytes());
            }
            Self::Recovered {
                id,
                complete,
                messages,
            } => put_recovered(&mut out, *id, *complete, messages),
            Self::Snapshot(json) => {
                out.put_u8(SNAPSHOT);
                out.put_slice(json);
            }
            Self::MetricsRequest { id } => {
                out.put_u8(METRICS_REQUEST);
                out.put_u64_le(*id);
            }
            Self::Metrics { id, text } => {
                out.put_u8(METRICS);
                out.put_u64_le(*id);
                out.put_slice(text);
            }
            Self::Interest {
                channel,
                subscribed,
            } => {
                out.put_u8(INTEREST);
                out.put_u8(u8::from(*subscribed));
                out.put_slice(channel.as_bytes());
            }
            Self::PublishFailed { id, reason } => {
                out.put_u8(PUBLISH_FAILED);
                out.put_u64_le(*id);
                out.put_slice(reason);
            }
            Self::Broker { up, down_ms, text } => {
                out.put_u8(BROKER);
                out.put_u8(u8::from(*up));
                out.put_u64_le(*down_ms);
                out.put_slice(text);
            }
            Self::Admit { id, source } => {
                out.put_u8(ADMIT);
                out.put_u64_le(*id);
                let mut s = Vec::with_capacity(9);
                source.encode(&mut s);
                out.put_slice(&s);
            }
            Self::Admitted { id, verdict } => {
                out.put_u8(ADMITTED);
                out.put_u64_le(*id);
                let (code, retry_after) = verdict.code();
                out.put_u8(code);
                out.put_u32_le(retry_after);
            }
            Self::ClientId { hash, claim } => {
                out.put_u8(CLIENT_ID);
                out.put_u64_le(*hash);
                out.put_u64_le(claim.at_ns);
                out.put_u32_le(claim.worker);
            }
            Self::SessionOpen(o) => session::put_open(&mut out, o),
            Self::SessionPark(p) => session::put_park(&mut out, p),
            Self::SessionResumed(r) => session::put_resumed(&mut out, r),
            Self::ShareMember(m) => share::put_member(&mut out, m),
            Self::ShareDeliver(d) => share::put_deliver(&mut out, d),
            Self::Api(r) => api::put(&mut out, r),
            Self::Presence(e) => presence::put(&mut out, e),
            Self::KeysStale => out.put_u8(KEYS_STALE),
            Self::Release { source } => put_release(&mut out, *source),
        }
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&len.to_le_bytes());
        out.freeze()
    }

    fn payload_len(&self) -> usize {
        match self {
            Self::Config(b)
            | Self::Reload(b)
            | Self::Snapshot(b)
            | Self::Metrics { text: b, .. }
            | Self::PublishFailed { reason: b, .. }
            | Self::Broker { text: b, .. } => b.len(),
            Self::Interest { channel, .. } => channel.len(),
            Self::Publish(m) | Self::Deliver(m) | Self::PublishRetained { message: m, .. } => {
                m.channel.len() + m.payload.len()
            }
            Self::RetainedAsk { filters, .. } => filters.iter().map(|f| 2 + f.len()).sum(),
            Self::Retained { messages, .. } => messages
                .iter()
                .map(|r| RETAINED_FRAMING + r.channel.len() + r.kept.payload.len())
                .sum(),
            Self::Recover { channel, .. } => channel.len(),
            Self::Api(r) => r.body.len(),
            Self::Presence(e) => 3 + e.channel.len() + e.sub.len(),
            Self::Recovered { messages, .. } => messages.iter().map(|k| 21 + k.payload.len()).sum(),
            Self::SessionPark(p) => session::payload_len(&p.subs, &p.pending),
            Self::SessionResumed(r) => session::payload_len(&r.subs, &r.messages),
            Self::ShareDeliver(d) => {
                d.key.len() + d.message.channel.len() + d.message.payload.len() + 64
            }
            _ => 0,
        }
    }

    /// Takes one whole record off the front of `buf`; `Ok(None)` when `buf`
    /// does not yet hold a whole record.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Self>, ControlError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len > MAX_RECORD {
            return Err(ControlError::TooBig(len));
        }
        if buf.len() < 4 + len {
            buf.reserve(4 + len - buf.len());
            return Ok(None);
        }
        buf.advance(4);
        let mut rec = buf.split_to(len).freeze();
        if rec.is_empty() {
            return Err(ControlError::Malformed("empty record"));
        }
        let tag = rec.get_u8();
        Self::decode_body(tag, rec).map(Some)
    }

    /// The record of kind `tag` whose body is `rec`.
    fn decode_body(tag: u8, mut rec: Bytes) -> Result<Self, ControlError> {
        Ok(match tag {
            CONFIG => Self::Config(rec),
            RELOAD => Self::Reload(rec),
            SNAPSHOT => Self::Snapshot(rec),
            PUBLISH | DELIVER => {
                let m = get_message(rec)?;
                if tag == PUBLISH {
                    Self::Publish(m)
                } else {
                    Self::Deliver(m)
                }
            }
            PUBLISH_RETAINED => {
                need(&rec, 1)?;
                let qos = rec.get_u8();
                Self::PublishRetained {
                    qos,
                    message: get_message(rec)?,
                }
            }
            RETAINED_ASK => get_retained_ask(rec)?,
            RETAINED => get_retained(rec)?,
            DELIVERED => {
                need(&rec, 16)?;
                let id = rec.get_u64_le();
                let subscribers = rec.get_u64_le();
                Self::Delivered { id, subscribers }
            }
            PUBLISHED => get_published(rec)?,
            RECOVER => get_recover(rec)?,
            RECOVERED => get_recovered(rec)?,
            METRICS_REQUEST => {
                need(&rec, 8)?;
                Self::MetricsRequest {
                    id: rec.get_u64_le(),
                }
            }
            METRICS => {
                need(&rec, 8)?;
                let id = rec.get_u64_le();
                Self::Metrics { id, text: rec }
            }
            INTEREST => {
                need(&rec, 1)?;
                let subscribed = rec.get_u8() != 0;
                let channel = String::from_utf8(rec.to_vec())
                    .map_err(|_| ControlError::Malformed("channel is not UTF-8"))?;
                Self::Interest {
                    channel,
                    subscribed,
                }
            }
            session::SESSION_OPEN => Self::SessionOpen(session::get_open(rec)?),
            session::SESSION_PARK => Self::SessionPark(session::get_park(rec)?),
            session::SESSION_RESUMED => Self::SessionResumed(session::get_resumed(rec)?),
            share::SHARE_MEMBER => Self::ShareMember(share::get_member(rec)?),
            share::SHARE_DELIVER => Self::ShareDeliver(share::get_deliver(rec)?),
            CLIENT_ID => {
                need(&rec, 20)?;
                Self::ClientId {
                    hash: rec.get_u64_le(),
                    claim: Claim {
                        at_ns: rec.get_u64_le(),
                        worker: rec.get_u32_le(),
                    },
                }
            }
            PUBLISH_FAILED => {
                need(&rec, 8)?;
                let id = rec.get_u64_le();
                Self::PublishFailed { id, reason: rec }
            }
            ADMIT => {
                need(&rec, 8)?;
                let id = rec.get_u64_le();
                let (source, _) =
                    Source::decode(&rec).ok_or(ControlError::Malformed("bad source address"))?;
                Self::Admit { id, source }
            }
            ADMITTED => {
                need(&rec, 13)?;
                let id = rec.get_u64_le();
                let code = rec.get_u8();
                let retry_after = rec.get_u32_le();
                Self::Admitted {
                    id,
                    verdict: Verdict::from_code(code, retry_after),
                }
            }
            RELEASE => {
                let (source, _) =
                    Source::decode(&rec).ok_or(ControlError::Malformed("bad source address"))?;
                Self::Release { source }
            }
            BROKER => {
                need(&rec, 9)?;
                let up = rec.get_u8() != 0;
                let down_ms = rec.get_u64_le();
                Self::Broker {
                    up,
                    down_ms,
                    text: rec,
                }
            }
            api::API => Self::Api(api::get(rec)?),
            presence::PRESENCE => Self::Presence(presence::get(rec)?),
            KEYS_STALE => Self::KeysStale,
            _ => return Err(ControlError::Malformed("unknown tag")),
        })
    }
}

/// Writes a [`Record::Release`].
fn put_release(out: &mut BytesMut, source: Source) {
    out.put_u8(RELEASE);
    let mut s = Vec::with_capacity(9);
    source.encode(&mut s);
    out.put_slice(&s);
}

/// Writes a [`Record::RetainedAsk`].
fn put_retained_ask(out: &mut BytesMut, id: u64, filters: &[String]) {
    out.put_u8(RETAINED_ASK);
    out.put_u64_le(id);
    // A SUBSCRIBE's filters fit its packet (at most 128 KiB),
    // each at most 64 KiB: the codec's limits.
    out.put_u32_le(filters.len() as u32);
    for f in filters {
        out.put_u16_le(f.len().min(usize::from(u16::MAX)) as u16);
        out.put_slice(&f.as_bytes()[..f.len().min(usize::from(u16::MAX))]);
    }
}

/// Writes a [`Record::Retained`].
fn put_retained(out: &mut BytesMut, id: u64, messages: &[RetainedMessage]) {
    out.put_u8(RETAINED);
    out.put_u64_le(id);
    out.put_u32_le(messages.len() as u32);
    for r in messages {
        // Channel names are at most 128 bytes.
        out.put_u8(r.channel.len().min(255) as u8);
        out.put_slice(&r.channel.as_bytes()[..r.channel.len().min(255)]);
        put_id(out, r.kept.id);
        // The QoS's high bit: properties follow the payload (they are
        // at most a packet's, under 64 KiB; larger ones are not sent).
        let props = u16::try_from(r.properties.len()).map_or(&[][..], |_| &r.properties[..]);
        out.put_u8(r.qos | if props.is_empty() { 0 } else { 0x80 });
        out.put_u8(u8::from(r.kept.text));
        out.put_u32_le(r.kept.payload.len() as u32);
        out.put_slice(&r.kept.payload);
        if !props.is_empty() {
            out.put_u16_le(props.len() as u16);
            out.put_slice(props);
        }
    }
}

/// Writes a [`Record::Recovered`].
fn put_recovered(out: &mut BytesMut, id: u64, complete: bool, messages: &[Kept]) {
    out.put_u8(RECOVERED);
    out.put_u64_le(id);
    out.put_u8(u8::from(complete));
    out.put_u32_le(messages.len() as u32);
    for k in messages {
        put_id(out, k.id);
        out.put_u8(u8::from(k.text));
        out.put_u32_le(k.payload.len() as u32);
        out.put_slice(&k.payload);
    }
}

/// Writes a message id.
fn put_id(out: &mut BytesMut, id: MessageId) {
    out.put_u64_le(id.epoch);
    out.put_u64_le(id.seq);
}

/// Reads a message id; the caller checked that its 16 bytes are there.
fn get_id(rec: &mut Bytes) -> MessageId {
    MessageId {
        epoch: rec.get_u64_le(),
        seq: rec.get_u64_le(),
    }
}

/// Reads a payload after its length (4 bytes, checked by the caller).
fn get_payload(rec: &mut Bytes) -> Result<Bytes, ControlError> {
    let len = rec.get_u32_le() as usize;
    need(rec, len)?;
    Ok(rec.split_to(len))
}

/// Fails unless `rec` holds `n` more bytes.
fn need(rec: &Bytes, n: usize) -> Result<(), ControlError> {
    if rec.len() < n {
        Err(ControlError::Malformed("record cut short"))
    } else {
        Ok(())
    }
}

/// Reads the count of the items that follow, each at least `min` bytes:
/// a count beyond what `rec` holds is a lie.
fn count(rec: &mut Bytes, min: usize) -> Result<usize, ControlError> {
    let n = rec.get_u32_le() as usize;
    if n > rec.len() / min {
        return Err(ControlError::Malformed("record cut short"));
    }
    Ok(n)
}

/// Reads a [`Record::RetainedAsk`].
fn get_retained_ask(mut rec: Bytes) -> Result<Record, ControlError> {
    need(&rec, 12)?;
    let id = rec.get_u64_le();
    // Each filter takes at least 2 bytes.
    let n = count(&mut rec, 2)?;
    let mut filters = Vec::with_capacity(n);
    for _ in 0..n {
        need(&rec, 2)?;
        let len = usize::from(rec.get_u16_le());
        need(&rec, len)?;
        filters.push(utf8(rec.split_to(len), "filter is not UTF-8")?);
    }
    Ok(Record::RetainedAsk { id, filters })
}

/// Reads a [`Record::Retained`].
fn get_retained(mut rec: Bytes) -> Result<Record, ControlError> {
    need(&rec, 12)?;
    let id = rec.get_u64_le();
    let n = count(&mut rec, RETAINED_FRAMING)?;
    let mut messages = Vec::with_capacity(n);
    for _ in 0..n {
        need(&rec, 1)?;
        let clen = usize::from(rec.get_u8());
        need(&rec, clen + RETAINED_FRAMING - 1)?;
        let channel = utf8(rec.split_to(clen), "channel is not UTF-8")?;
        let kid = get_id(&mut rec);
        let qos = rec.get_u8();
        let text = rec.get_u8() != 0;
        let payload = get_payload(&mut rec)?;
        let mut properties = Bytes::new();
        if qos & 0x80 != 0 {
            need(&rec, 2)?;
            let plen = usize::from(rec.get_u16_le());
            need(&rec, plen)?;
            properties = rec.split_to(plen);
        }
        messages.push(RetainedMessage {
            channel,
            qos: qos & 0x7F,
            kept: Kept {
                id: kid,
                text,
                payload,
            },
            properties,
        });
    }
    Ok(Record::Retained { id, messages })
}

/// Reads a [`Record::Published`].
fn get_published(mut rec: Bytes) -> Result<Record, ControlError> {
    need(&rec, 32)?;
    let id = rec.get_u64_le();
    let subscribers = rec.get_u64_le();
    let message = get_id(&mut rec);
    Ok(Record::Published {
        id,
        subscribers,
        message,
    })
}

/// Reads a [`Record::Recover`].
fn get_recover(mut rec: Bytes) -> Result<Record, ControlError> {
    need(&rec, 24)?;
    let id = rec.get_u64_le();
    let since = get_id(&mut rec);
    let channel = String::from_utf8(rec.to_vec())
        .map_err(|_| ControlError::Malformed("channel is not UTF-8"))?;
    Ok(Record::Recover { id, since, channel })
}

/// Reads a [`Record::Recovered`].
fn get_recovered(mut rec: Bytes) -> Result<Record, ControlError> {
    need(&rec, 13)?;
    let id = rec.get_u64_le();
    let complete = rec.get_u8() != 0;
    // Each message takes at least 21 bytes.
    let n = count(&mut rec, 21)?;
    let mut messages = Vec::with_capacity(n);
    for _ in 0..n {
        need(&rec, 21)?;
        let id = get_id(&mut rec);
        let text = rec.get_u8() != 0;
        let payload = get_payload(&mut rec)?;
        messages.push(Kept { id, text, payload });
    }
    Ok(Record::Recovered {
        id,
        complete,
        messages,
    })
}

/// Writes a `Publish` or `Deliver` message's fields.
fn put_message(out: &mut BytesMut, m: &Message) {
    out.put_u64_le(m.id);
    put_id(out, m.message);
    // MQTT properties are at most a packet's: --max-message plus 1 KiB,
    // itself at most 128 KiB; past 64 KiB of them none are sent.
    let props = u16::try_from(m.properties.len()).map_or(&[][..], |_| &m.properties[..]);
    out.put_u8(
        u8::from(m.text)
            | u8::from(m.at_most_once) << 1
            | u8::from(m.exactly_once) << 2
            | u8::from(!props.is_empty()) << 3
            | u8::from(m.retained) << 4
            | u8::from(m.origin != 0) << 5,
    );
    // Channel names are at most 128 bytes (validated before any record is made).
    out.put_u8(m.channel.len().min(255) as u8);
    out.put_slice(&m.channel.as_bytes()[..m.channel.len().min(255)]);
    if !props.is_empty() {
        out.put_u16_le(props.len() as u16);
        out.put_slice(props);
    }
    if m.origin != 0 {
        out.put_u64_le(m.origin);
    }
    out.put_slice(&m.payload);
}

/// Reads what [`put_message`] wrote: the payload runs to the record's end.
fn get_message(mut rec: Bytes) -> Result<Message, ControlError> {
    if rec.len() < 26 {
        return Err(ControlError::Malformed("record cut short"));
    }
    let id = rec.get_u64_le();
    let message = get_id(&mut rec);
    let flags = rec.get_u8();
    let (text, at_most_once) = (flags & 1 != 0, flags & 2 != 0);
    let exactly_once = flags & 4 != 0;
    let clen = usize::from(rec.get_u8());
    if rec.len() < clen {
        return Err(ControlError::Malformed("record cut short"));
    }
    let channel = utf8(rec.split_to(clen), "channel is not UTF-8")?;
    let mut properties = Bytes::new();
    if flags & 8 != 0 {
        need(&rec, 2)?;
        let plen = usize::from(rec.get_u16_le());
        need(&rec, plen)?;
        properties = rec.split_to(plen);
    }
    let mut origin = 0;
    if flags & 32 != 0 {
        need(&rec, 8)?;
        origin = rec.get_u64_le();
    }
    Ok(Message {
        id,
        message,
        text,
        at_most_once,
        exactly_once,
        properties,
        retained: flags & 16 != 0,
        origin,
        channel,
        payload: rec,
    })
}

fn utf8(b: Bytes, what: &'static str) -> Result<String, ControlError> {
    String::from_utf8(b.to_vec()).map_err(|_| ControlError::Malformed(what))
}

/// Reads the next record from `r`, using `buf` for what arrived beyond it.
/// `Ok(None)` at a clean end of stream.
pub async fn read_record<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
) -> Result<Option<Record>, ControlError> {
    loop {
        if let Some(rec) = Record::decode(buf)? {
            return Ok(Some(rec));
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
        if r.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(ControlError::Malformed("stream ended inside a record"))
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Record> {
        let m = Message {
            id: 7,
            message: MessageId { epoch: 1, seq: 2 },
            text: true,
            at_most_once: false,
            exactly_once: false,
            properties: Bytes::new(),
            retained: false,
            origin: 0,
            channel: "news".into(),
            payload: Bytes::from_static(b"hello"),
        };
        vec![
            Record::Config(Bytes::from_static(b"{}")),
            Record::Reload(Bytes::from_static(b"{\"tls\":null}")),
            Record::Publish(m.clone()),
            Record::Deliver(Message {
                text: false,
                at_most_once: true,
                exactly_once: false,
                properties: Bytes::new(),
                retained: false,
                origin: 0,
                payload: Bytes::new(),
                ..m.clone()
            }),
            Record::Deliver(Message {
                exactly_once: true,
                retained: true,
                origin: 7 << 32 | 3,
                // A 5.0 user property ("k", "v").
                properties: Bytes::from_static(&[0x26, 0, 1, b'k', 0, 1, b'v']),
                ..m.clone()
            }),
            Record::ClientId {
                hash: u64::MAX - 1,
                claim: Claim {
                    at_ns: u64::MAX - 2,
                    worker: 3,
                },
            },
            Record::Delivered {
                id: 1,
                subscribers: u64::MAX,
            },
            Record::Published {
                id: 2,
                subscribers: 3,
                message: MessageId { epoch: 4, seq: 5 },
            },
            Record::Recover {
                id: 6,
                since: MessageId { epoch: 7, seq: 8 },
                channel: "news".into(),
            },
            Record::Recovered {
                id: 6,
                complete: false,
                messages: vec![
                    Kept {
                        id: MessageId { epoch: 7, seq: 9 },
                        text: true,
                        payload: Bytes::from_static(b"one"),
                    },
                    Kept {
                        id: MessageId { epoch: 7, seq: 10 },
                        text: false,
                        payload: Bytes::new(),
                    },
                ],
            },
            Record::Snapshot(Bytes::from_static(b"{\"open\":1}")),
            Record::MetricsRequest { id: 9 },
            Record::Metrics {
                id: 9,
                text: Bytes::from_static(b"# text\n"),
            },
            Record::Interest {
                channel: "news".into(),
                subscribed: true,
            },
            Record::PublishFailed {
                id: 4,
                reason: Bytes::from_static(b"Redis is down"),
            },
            Record::Broker {
                up: false,
                down_ms: 1500,
                text: Bytes::from_static(b"down"),
            },
            Record::Admit {
                id: 5,
                source: Source::V6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 1]),
            },
            Record::Admitted {
                id: 5,
                verdict: Verdict::TooFast { retry_after: 3 },
            },
            Record::Release {
                source: Source::V4([127, 0, 0, 9]),
            },
            Record::PublishRetained { qos: 1, message: m },
            Record::RetainedAsk {
                id: 11,
                filters: vec!["a/+".into(), "b".into(), String::new()],
            },
            Record::Retained {
                id: 11,
                messages: vec![
                    RetainedMessage {
                        channel: "a/b".into(),
                        qos: 1,
                        kept: Kept {
                            id: MessageId { epoch: 3, seq: 4 },
                            text: true,
                            payload: Bytes::from_static(b"on"),
                        },
                        properties: Bytes::from_static(&[0x26, 0, 1, b'k', 0, 1, b'v']),
                    },
                    RetainedMessage {
                        channel: "b".into(),
                        qos: 0,
                        kept: Kept {
                            id: MessageId::NONE,
                            text: false,
                            payload: Bytes::from_static(&[0, 1]),
                        },
                        properties: Bytes::new(),
                    },
                ],
            },
            Record::Retained {
                id: 12,
                messages: Vec::new(),
            },
            Record::Api(ApiRecord {
                leg: Leg::Part,
                id: 13,
                body: Bytes::from_static(b"{\"closed\":2}"),
            }),
            Record::Api(ApiRecord {
                leg: Leg::Answer,
                id: u64::MAX,
                body: Bytes::new(),
            }),
            Record::Presence(PresenceEvent {
                join: true,
                channel: "room.a".into(),
                sub: "alice".into(),
            }),
            Record::Presence(PresenceEvent {
                join: false,
                channel: "b".into(),
                sub: String::new(),
            }),
            Record::KeysStale,
        ]
    }

    #[test]
    fn round_trip_every_record_split_anywhere() {
        let mut stream = Vec::new();
        for r in all() {
            stream.extend_from_slice(&r.encode());
        }
        for cut in 0..stream.len() {
            let mut buf = BytesMut::from(&stream[..cut]);
            let mut got = Vec::new();
            while let Some(r) = Record::decode(&mut buf).unwrap() {
                got.push(r);
            }
            buf.extend_from_slice(&stream[cut..]);
            while let Some(r) = Record::decode(&mut buf).unwrap() {
                got.push(r);
            }
            assert_eq!(got, all(), "cut at {cut}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn refuses_bad_records() {
        let mut buf = BytesMut::from(&((MAX_RECORD + 1) as u32).to_le_bytes()[..]);
        assert!(matches!(
            Record::decode(&mut buf),
            Err(ControlError::TooBig(_))
        ));
        let mut buf = BytesMut::from(&[1, 0, 0, 0, 99][..]);
        assert!(matches!(
            Record::decode(&mut buf),
            Err(ControlError::Malformed(_))
        ));
        let mut buf = BytesMut::from(&[3, 0, 0, 0, DELIVERED, 1, 2][..]);
        assert!(matches!(
            Record::decode(&mut buf),
            Err(ControlError::Malformed(_))
        ));
        let mut buf = BytesMut::from(&[0, 0, 0, 0][..]);
        assert!(matches!(
            Record::decode(&mut buf),
            Err(ControlError::Malformed(_))
        ));
        // Counts that promise more than the record holds.
        for tag in [RETAINED_ASK, RETAINED] {
            let mut rec = vec![13, 0, 0, 0, tag];
            rec.extend_from_slice(&[0; 8]);
            rec.extend_from_slice(&u32::MAX.to_le_bytes());
            let mut buf = BytesMut::from(&rec[..]);
            assert!(
                matches!(Record::decode(&mut buf), Err(ControlError::Malformed(_))),
                "tag {tag}"
            );
        }
    }
}
