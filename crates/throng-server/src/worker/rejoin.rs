//! What a subscriber receives, by how it subscribed, and how a reconnecting
//! subscriber rejoins its channel without a gap or a repeat.
//!
//! Three kinds of subscriber ([`Kind`]): a plain WebSocket gets each payload
//! bare (the seed's behaviour); one that asked for the `throng.v1`
//! subprotocol gets `<id>\n<payload>` in a frame of the payload's type; an
//! SSE subscriber gets an event with `id:`. docs/clients.md has the framing.
//!
//! A rejoin (`?since=ID`, `Last-Event-ID`) joins two streams: what the
//! channel's history kept after `ID`, and what is published meanwhile. The
//! subscriber is in its channel's table from the start, so nothing
//! published after it asked can pass it by; until the history arrives what
//! is published is held, not sent. [`join`] then orders the two: the
//! incomplete-recovery marker first when the history says so, the history,
//! then what was held, each message once (by id: the history may already
//! hold what was held, as it does whenever the supervisor numbered the
//! message before it answered).

use bytes::Bytes;
use throng_proto::sse;
use throng_proto::ws::{self, OpCode};

use crate::control::Message;
use crate::history::{Kept, MessageId};

/// How a subscriber takes its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// WebSocket, bare payloads.
    Ws,
    /// WebSocket with the `throng.v1` subprotocol: ids on the wire.
    WsIds,
    /// Server-Sent Events.
    Sse,
    /// MQTT 3.1.1 (a PUBLISH per message, no ids: clean sessions never rejoin).
    Mqtt311,
    /// MQTT 5.0.
    Mqtt5,
    /// WebSocket with `throng.v1` opened at `/` (`?channel=a&channel=b`):
    /// any number of channels, each message saying its channel, and the
    /// client's in-band requests ([`super::multi`]).
    WsMulti,
    /// Server-Sent Events of several channels (`/sse/?channel=a&channel=b`).
    SseMulti,
}

impl Kind {
    pub(crate) fn is_mqtt(self) -> bool {
        matches!(self, Self::Mqtt311 | Self::Mqtt5)
    }

    /// An event stream, of one channel or several.
    pub(crate) fn is_sse(self) -> bool {
        matches!(self, Self::Sse | Self::SseMulti)
    }

    /// A connection of several channels, whose messages say their channel.
    pub(crate) fn is_multi(self) -> bool {
        matches!(self, Self::WsMulti | Self::SseMulti)
    }
}

/// The first line of a `throng.v1` frame that is not a message: the
/// history no longer holds everything after the id the client gave.
pub(crate) const INCOMPLETE: &str = "!incomplete";

/// The SSE event type of that marker.
pub(crate) const SSE_INCOMPLETE: &str = "incomplete";

/// What a rejoining subscriber is sent, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Joined {
    /// The history does not hold everything after its id.
    Incomplete,
    Message(Kept),
}

/// Orders a rejoin: the marker when `complete` is false, then the history
/// after `since` merged with what was held, each id once, ascending (both
/// come in ascending order). When incomplete, `since` is not trusted as a
/// bound (it may be another epoch's, or from the future): everything kept
/// is sent, and what was held that the history already dropped too.
pub(crate) fn join(
    since: MessageId,
    complete: bool,
    history: Vec<Kept>,
    held: Vec<Kept>,
) -> Vec<Joined> {
    let mut out = Vec::with_capacity(history.len() + held.len() + 1);
    let mut last = if complete { since } else { MessageId::NONE };
    if !complete {
        out.push(Joined::Incomplete);
    }
    let (mut a, mut b) = (history.into_iter().peekable(), held.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.id <= y.id => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => break,
        };
        if let Some(k) = next
            && k.id > last
        {
            last = k.id;
            out.push(Joined::Message(k));
        }
    }
    out
}

thread_local! {
    /// The worker thread's compressor, reset for every message.
    static DEFLATER: std::cell::RefCell<throng_proto::deflate::Deflater> =
        std::cell::RefCell::new(throng_proto::deflate::Deflater::new());
}

/// `frame` (a WebSocket data frame) compressed for subscribers that
/// negotiated permessage-deflate, or itself when its payload is under
/// `min` bytes. Made once per message and kind, like `frame` itself.
pub(crate) fn deflated(frame: &Bytes, min: usize) -> Bytes {
    DEFLATER.with(|z| z.borrow_mut().frame(frame, min))
}

/// A message as a subscriber of `kind` receives it.
pub(crate) fn frame(kind: Kind, m: &Message) -> Bytes {
    encode(kind, &m.channel, m.message, m.text, &m.payload)
}

/// A kept message of `channel` as a subscriber of `kind` receives it.
pub(crate) fn kept(kind: Kind, channel: &str, k: &Kept) -> Bytes {
    encode(kind, channel, k.id, k.text, &k.payload)
}

fn encode(kind: Kind, channel: &str, id: MessageId, text: bool, payload: &[u8]) -> Bytes {
    let op = if text { OpCode::Text } else { OpCode::Binary };
    match kind {
        Kind::Ws => ws::server_frame(op, payload),
        Kind::WsMulti => {
            // `<channel>\n<id>\n<payload>`: a channel name never starts
            // with `{`, which every answer to the client's requests does.
            let mut body = Vec::with_capacity(channel.len() + payload.len() + 32);
            body.extend_from_slice(channel.as_bytes());
            body.push(b'\n');
            if !id.is_none() {
                body.extend_from_slice(id.to_string().as_bytes());
            }
            body.push(b'\n');
            body.extend_from_slice(payload);
            ws::server_frame(op, &body)
        }
        Kind::SseMulti => {
            // The channel is the event's first data line; a binary payload
            // (or one not UTF-8) is base64 after it, in a `binary` event.
            let mut out = Vec::with_capacity(channel.len() + payload.len() + 48);
            let id = (!id.is_none()).then(|| id.to_string());
            match std::str::from_utf8(payload) {
                Ok(s) if text => {
                    sse::event(&mut out, id.as_deref(), None, &format!("{channel}\n{s}"))
                }
                _ => {
                    use base64::Engine as _;
                    let b64 = base64::engine::general_purpose::STANDARD.encode(payload);
                    let data = format!("{channel}\n{b64}");
                    sse::event(&mut out, id.as_deref(), Some("binary"), &data);
                }
            }
            Bytes::from(out)
        }
        Kind::WsIds => {
            // A message without an id (published into Redis by another
            // client) has an empty first line.
            let mut body = if id.is_none() {
                Vec::with_capacity(payload.len() + 1)
            } else {
                id.to_string().into_bytes()
            };
            body.push(b'\n');
            body.extend_from_slice(payload);
            ws::server_frame(op, &body)
        }
        Kind::Sse => {
            let mut out = Vec::with_capacity(payload.len() + 48);
            let id = (!id.is_none()).then(|| id.to_string());
            sse::message(&mut out, id.as_deref(), payload, text);
            Bytes::from(out)
        }
        // An MQTT subscriber never rejoins (clean sessions only), and its
        // fan-out encodes the PUBLISH itself (it needs the topic).
        Kind::Mqtt311 | Kind::Mqtt5 => Bytes::new(),
    }
}

/// The incomplete-recovery marker for a subscriber of `kind` that gave
/// `since` for `channel`.
pub(crate) fn marker(kind: Kind, channel: &str, since: MessageId) -> Bytes {
    match kind {
        Kind::WsMulti => {
            let body = serde_json::json!({ "incomplete": channel, "since": since.to_string() });
            ws::server_frame(OpCode::Text, body.to_string().as_bytes())
        }
        Kind::SseMulti => {
            let mut out = Vec::new();
            let data = format!("{channel}\n{since}");
            sse::event(&mut out, None, Some(SSE_INCOMPLETE), &data);
            Bytes::from(out)
        }
        Kind::Ws | Kind::WsIds => {
            ws::server_frame(OpCode::Text, format!("{INCOMPLETE}\n{since}").as_bytes())
        }
        Kind::Sse => {
            let mut out = Vec::new();
            sse::event(&mut out, None, Some(SSE_INCOMPLETE), &since.to_string());
            Bytes::from(out)
        }
        Kind::Mqtt311 | Kind::Mqtt5 => Bytes::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(seq: u64) -> Kept {
        Kept {
            id: MessageId { epoch: 9, seq },
            text: true,
            payload: Bytes::from(seq.to_string()),
        }
    }

    fn ids(j: &[Joined]) -> Vec<i64> {
        j.iter()
            .map(|x| match x {
                Joined::Incomplete => -1,
                Joined::Message(k) => k.id.seq as i64,
            })
            .collect()
    }

    #[test]
    fn every_overlap_of_history_and_held_gives_each_id_once_in_order() {
        // The history holds a..=b, what was held c..=d, since = 2: every
        // arrangement of the two ranges.
        let since = MessageId { epoch: 9, seq: 2 };
        let mut tried = 0;
        for a in 1..=6u64 {
            for b in a - 1..=6 {
                for c in 1..=7u64 {
                    for d in c - 1..=7 {
                        tried += 1;
                        let history = (a..=b).map(k).collect();
                        let held = (c..=d).map(k).collect();
                        let got = ids(&join(since, true, history, held));
                        let mut want: Vec<i64> = (a..=b).chain(c..=d).map(|x| x as i64).collect();
                        want.retain(|&x| x > 2);
                        want.sort_unstable();
                        want.dedup();
                        assert_eq!(got, want, "history {a}..={b}, held {c}..={d}");
                    }
                }
            }
        }
        assert!(tried > 100, "{tried}");
    }

    #[test]
    fn incomplete_comes_first_and_sends_all_kept() {
        let since = MessageId { epoch: 9, seq: 50 };
        let got = ids(&join(since, false, vec![k(3), k(4)], vec![k(4), k(5)]));
        assert_eq!(got, [-1, 3, 4, 5]);
        // Held while the history dropped it: still sent, in its place.
        let got = ids(&join(
            since,
            false,
            vec![k(6), k(7)],
            vec![k(5), k(6), k(7)],
        ));
        assert_eq!(got, [-1, 5, 6, 7]);
    }

    #[test]
    fn each_kind_frames_a_message_its_own_way() {
        let m = Message {
            id: 1,
            message: MessageId { epoch: 5, seq: 6 },
            text: true,
            at_most_once: false,
            exactly_once: false,
            properties: Bytes::new(),
            retained: false,
            origin: 0,
            channel: "c".into(),
            payload: Bytes::from_static(b"hi\nthere"),
        };
        assert_eq!(
            frame(Kind::Ws, &m),
            ws::server_frame(OpCode::Text, b"hi\nthere")
        );
        assert_eq!(
            frame(Kind::WsIds, &m),
            ws::server_frame(OpCode::Text, b"5-6\nhi\nthere")
        );
        assert_eq!(
            &frame(Kind::Sse, &m)[..],
            b"id: 5-6\ndata: hi\ndata: there\n\n"
        );
        let bin = Message {
            text: false,
            payload: Bytes::from_static(&[0, 1]),
            ..m
        };
        assert_eq!(
            frame(Kind::WsIds, &bin),
            ws::server_frame(OpCode::Binary, b"5-6\n\x00\x01")
        );
        assert_eq!(
            &frame(Kind::Sse, &bin)[..],
            b"id: 5-6\nevent: binary\ndata: AAE=\n\n"
        );
        let plain = Message {
            message: MessageId::NONE,
            ..bin
        };
        assert_eq!(
            frame(Kind::WsIds, &plain),
            ws::server_frame(OpCode::Binary, b"\n\x00\x01"),
            "no id: an empty first line"
        );
        assert_eq!(
            &frame(Kind::Sse, &plain)[..],
            b"event: binary\ndata: AAE=\n\n"
        );
        let since = MessageId { epoch: 1, seq: 2 };
        assert_eq!(
            marker(Kind::WsIds, "c", since),
            ws::server_frame(OpCode::Text, b"!incomplete\n1-2")
        );
        assert_eq!(
            &marker(Kind::Sse, "c", since)[..],
            b"event: incomplete\ndata: 1-2\n\n"
        );
    }
}
