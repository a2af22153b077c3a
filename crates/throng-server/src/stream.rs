//! Channel history in Redis (`--redis` with `--history`), without sockets:
//! the commands and the reading of their replies. Each channel's history is
//! a Redis Stream under the node's prefix (the key `<prefix><channel>`; keys
//! and pub/sub channels are apart in Redis), so every node recovers the
//! same messages, under the same ids: the stream's.
//!
//! A publish is one script, so that the stream and pub/sub agree on the
//! order: `XADD <key> MAXLEN ~ N * p <payload>` (with a TTL, also `XTRIM
//! MINID` at Redis's clock minus the TTL and a `PEXPIRE` of the key), then
//! `PUBLISH <prefix><channel>` of the payload behind an envelope that
//! carries the id ([`ENVELOPE`]). A message published by anyone else
//! (`redis-cli PUBLISH`) has no envelope: it is delivered without an id.
//!
//! A recovery is three commands on the publisher connection, in one write:
//! `XREVRANGE <key> <since> - COUNT 1` (is anything at or before `since`
//! still kept? then nothing after it was trimmed), `XRANGE <key> (<since> +`
//! (what followed), and `XINFO STREAM <key>` (was anything ever trimmed,
//! and is `since` from the future?).

use bytes::{Bytes, BytesMut};
use throng_proto::resp::{self, Value};

use crate::history::{Kept, MessageId};
use crate::redis::error::ReplyError;

/// What the history in Redis keeps (`--history`, `--history-ttl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// `MAXLEN ~` of every stream.
    pub keep: usize,
    /// Milliseconds a message is kept (0: until trimmed by count).
    pub ttl_ms: u64,
}

/// What goes before a payload published with an id: NUL (no channel
/// message of a text protocol starts with one), the word, a space; then
/// the id and a newline.
pub const ENVELOPE: &[u8] = b"\0throng ";

/// The publish script: KEYS = stream, channel; ARGV = keep, payload, ttl ms.
/// Answers `[id, receivers]`.
pub(crate) const PUBLISH_SCRIPT: &str = r"
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'p', ARGV[2])
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - ttl
  if floor > 0 then redis.call('XTRIM', KEYS[1], 'MINID', floor) end
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {id, redis.call('PUBLISH', KEYS[2], '\0throng ' .. id .. '\n' .. ARGV[2])}
";

/// Appends the command that keeps and publishes `payload` on `channel`;
/// `sharded`: with `SPUBLISH` (a Redis Cluster, where the stream and the
/// shard channel share the channel's slot).
pub fn publish(
    out: &mut BytesMut,
    prefix: &str,
    channel: &str,
    payload: &[u8],
    l: StreamLimits,
    sharded: bool,
) {
    let script: std::borrow::Cow<'_, str> = if sharded {
        PUBLISH_SCRIPT.replace("'PUBLISH'", "'SPUBLISH'").into()
    } else {
        PUBLISH_SCRIPT.into()
    };
    let key = format!("{prefix}{channel}");
    script_command(out, b"EVAL", script.as_bytes(), &key, payload, l, &[]);
}

/// Appends `<verb> <script> 2 <key> <key> <keep> <payload> <ttl> <tail...>`:
/// the publish script's command, by text (`EVAL`) or by SHA-1
/// (`EVALSHA`), with more arguments for a script that does more.
pub(crate) fn script_command(
    out: &mut BytesMut,
    verb: &[u8],
    script: &[u8],
    key: &str,
    payload: &[u8],
    l: StreamLimits,
    tail: &[&[u8]],
) {
    let keep = l.keep.to_string();
    let ttl = l.ttl_ms.to_string();
    let mut args: Vec<&[u8]> = vec![
        verb,
        script,
        b"2",
        key.as_bytes(),
        key.as_bytes(),
        keep.as_bytes(),
        payload,
        ttl.as_bytes(),
    ];
    args.extend_from_slice(tail);
    resp::encode_command(out, &args);
}

/// Reads the publish script's answer: the message's id and Redis's receivers.
pub fn published(v: Value) -> Result<(MessageId, u64), ReplyError> {
    match v {
        Value::Array(Some(items)) if items.len() == 2 => {
            let id = id_of(&items[0]).ok_or(ReplyError::StreamId)?;
            match items[1] {
                Value::Integer(n) => Ok((id, u64::try_from(n).unwrap_or(0))),
                _ => Err(ReplyError::NoReceivers),
            }
        }
        other => Err(ReplyError::of(other)),
    }
}

/// A message's id and payload out of a pub/sub payload; a payload without
/// the envelope (published by someone else) has no id.
pub fn open(payload: Bytes) -> (MessageId, Bytes) {
    let Some(rest) = payload.strip_prefix(ENVELOPE) else {
        return (MessageId::NONE, payload);
    };
    let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
        return (MessageId::NONE, payload);
    };
    let id = std::str::from_utf8(&rest[..nl])
        .ok()
        .and_then(|s| s.parse().ok());
    match id {
        Some(id) => {
            let at = ENVELOPE.len() + nl + 1;
            (id, payload.slice(at..))
        }
        None => (MessageId::NONE, payload),
    }
}

/// Appends the three commands of a recovery after `since`.
pub fn recover(out: &mut BytesMut, prefix: &str, channel: &str, since: MessageId) {
    let key = format!("{prefix}{channel}");
    let at = since.to_string();
    let after = format!("({since}");
    resp::encode_command(
        out,
        &[
            b"XREVRANGE",
            key.as_bytes(),
            at.as_bytes(),
            b"-",
            b"COUNT",
            b"1",
        ],
    );
    resp::encode_command(out, &[b"XRANGE", key.as_bytes(), after.as_bytes(), b"+"]);
    resp::encode_command(out, &[b"XINFO", b"STREAM", key.as_bytes()]);
}

/// Reads the three replies of a recovery after `since`: the messages kept
/// after it, and whether they are all that followed it.
pub fn recovered(
    since: MessageId,
    before: Value,
    after: Value,
    info: Value,
) -> Result<(bool, Vec<Kept>), ReplyError> {
    let messages = entries(after)?;
    // No stream (never published with history, or expired): nothing to
    // prove that nothing was missed.
    let Value::Array(Some(info)) = &info else {
        return Ok((false, messages));
    };
    let last = field(info, "last-generated-id").and_then(id_of);
    let added = field(info, "entries-added").and_then(integer);
    let length = field(info, "length").and_then(integer);
    let future = last.is_none_or(|l| since > l);
    let kept_before = !entries(before)?.is_empty();
    let never_trimmed = added.is_some() && added == length;
    Ok((!future && (kept_before || never_trimmed), messages))
}

/// The entries of an `XRANGE`/`XREVRANGE` reply, as kept messages.
fn entries(v: Value) -> Result<Vec<Kept>, ReplyError> {
    let items = match v {
        Value::Array(Some(items)) => items,
        Value::Array(None) => return Ok(Vec::new()),
        other => return Err(ReplyError::of(other)),
    };
    let mut out = Vec::with_capacity(items.len());
    for entry in items {
        let Value::Array(Some(pair)) = entry else {
            return Err(ReplyError::StreamEntry);
        };
        let (Some(id), Some(Value::Array(Some(f)))) = (pair.first().and_then(id_of), pair.get(1))
        else {
            return Err(ReplyError::StreamEntry);
        };
        let payload = f
            .chunks(2)
            .find(|kv| kv[0].as_bytes().is_some_and(|k| &k[..] == b"p"))
            .and_then(|kv| kv.get(1)?.as_bytes().cloned())
            .unwrap_or_default();
        // An MQTT publish kept sealed: its subscribers want the payload.
        let (text, payload) = crate::redis::envelope::payload_of(payload);
        out.push(Kept { id, text, payload });
    }
    Ok(out)
}

/// Field `name` of an `XINFO STREAM` reply (a flat list of name, value).
fn field<'a>(items: &'a [Value], name: &str) -> Option<&'a Value> {
    items
        .chunks(2)
        .find(|kv| kv[0].as_bytes().is_some_and(|k| &k[..] == name.as_bytes()))
        .and_then(|kv| kv.get(1))
}

fn id_of(v: &Value) -> Option<MessageId> {
    std::str::from_utf8(v.as_bytes()?).ok()?.parse().ok()
}

fn integer(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(n) => Some(*n),
        _ => None,
    }
}

/// The payload as Redis delivers it to the other nodes (for tests).
#[cfg(test)]
fn sealed(id: &str, payload: &[u8]) -> Bytes {
    use bytes::BufMut as _;
    let mut b = BytesMut::new();
    b.put_slice(ENVELOPE);
    b.put_slice(id.as_bytes());
    b.put_u8(b'\n');
    b.put_slice(payload);
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::Bulk(Some(Bytes::copy_from_slice(s.as_bytes())))
    }

    fn entry(id: &str, p: &str) -> Value {
        Value::Array(Some(vec![
            bulk(id),
            Value::Array(Some(vec![bulk("p"), bulk(p)])),
        ]))
    }

    fn list(v: Vec<Value>) -> Value {
        Value::Array(Some(v))
    }

    fn info(last: &str, added: i64, length: i64) -> Value {
        list(vec![
            bulk("length"),
            Value::Integer(length),
            bulk("last-generated-id"),
            bulk(last),
            bulk("entries-added"),
            Value::Integer(added),
        ])
    }

    fn id(s: &str) -> MessageId {
        s.parse().unwrap()
    }

    #[test]
    fn an_envelope_opens_to_its_id_and_payload_and_anything_else_has_no_id() {
        let (i, p) = open(sealed("17-3", b"a\nb"));
        assert_eq!((i, &p[..]), (id("17-3"), &b"a\nb"[..]));
        for raw in [&b"hello"[..], b"\0throng 17-3", b"\0throng x-1\nhi", b""] {
            let (i, p) = open(Bytes::copy_from_slice(raw));
            assert_eq!((i, &p[..]), (MessageId::NONE, raw), "{raw:?}");
        }
    }

    #[test]
    fn a_recovery_is_complete_only_when_nothing_after_since_can_have_been_trimmed() {
        let since = id("10-0");
        let after = || list(vec![entry("11-0", "x"), entry("12-0", "y")]);
        // Something at or before `since` is kept: nothing after it went.
        let (ok, kept) = recovered(
            since,
            list(vec![entry("10-0", "w")]),
            after(),
            info("12-0", 9, 3),
        )
        .unwrap();
        assert!(ok);
        assert_eq!(
            kept.iter().map(|k| k.id).collect::<Vec<_>>(),
            [id("11-0"), id("12-0")]
        );
        assert_eq!(&kept[0].payload[..], b"x");
        // Nothing before it kept, but nothing was ever trimmed.
        assert!(
            recovered(since, list(vec![]), after(), info("12-0", 2, 2))
                .unwrap()
                .0
        );
        // Nothing before it kept, and some were trimmed.
        assert!(
            !recovered(since, list(vec![]), after(), info("12-0", 5, 2))
                .unwrap()
                .0
        );
        // From the future.
        let late = id("13-0");
        assert!(
            !recovered(
                late,
                list(vec![entry("12-0", "y")]),
                list(vec![]),
                info("12-0", 2, 2)
            )
            .unwrap()
            .0
        );
        // No stream at all.
        let no_key = Value::Error(Bytes::from_static(b"ERR no such key"));
        assert_eq!(
            recovered(since, list(vec![]), list(vec![]), no_key).unwrap(),
            (false, vec![])
        );
        // A reply that is not a stream's is an error, not a panic.
        assert!(recovered(since, Value::Integer(3), list(vec![]), info("1-0", 1, 1)).is_err());
        assert!(
            recovered(
                since,
                list(vec![Value::Integer(1)]),
                list(vec![]),
                info("1-0", 1, 1)
            )
            .is_err()
        );
    }

    #[test]
    fn the_publish_answer_reads_as_id_and_receivers() {
        let v = list(vec![bulk("5-1"), Value::Integer(2)]);
        assert_eq!(published(v).unwrap(), (id("5-1"), 2));
        assert!(published(Value::Error(Bytes::from_static(b"NOSCRIPT x"))).is_err());
        assert!(published(list(vec![bulk("nope"), Value::Integer(2)])).is_err());
        let mut out = BytesMut::new();
        publish(
            &mut out,
            "t:",
            "news",
            b"hi",
            StreamLimits {
                keep: 10,
                ttl_ms: 0,
            },
            false,
        );
        assert!(out.starts_with(b"*8\r\n$4\r\nEVAL\r\n"));
        // On a cluster the script publishes to the shard channel.
        let mut sharded = BytesMut::new();
        let l = StreamLimits { keep: 1, ttl_ms: 0 };
        publish(&mut sharded, "t:", "news", b"hi", l, true);
        let has = |b: &[u8], w: &[u8]| b.windows(w.len()).any(|x| x == w);
        assert!(has(&sharded, b"'SPUBLISH'") && !has(&out, b"'SPUBLISH'"));
    }
}
