//! Retained messages, without sockets or clocks: the last retained message
//! of each channel (an MQTT PUBLISH with the retain flag, an HTTP `POST
//! /publish/<channel>?retain=1`), which every new MQTT subscription
//! matching the channel gets first. An empty retained payload clears it.
//!
//! This is the embedded relay's store (the supervisor's, beside its
//! [`crate::history::History`]); with `--redis` the store is Redis's (one
//! hash under the prefix, [`crate::redis`]) and every node answers the
//! same. A retained message is not a history entry: it survives whatever
//! `--history` keeps, and has no id on the MQTT wire. Its memory is capped
//! like the history's (`--max-retained` channels, `--max-retained-memory`
//! bytes, each entry costing its payload and [`crate::history::MESSAGE_COST`]
//! plus its channel's [`crate::history::CHANNEL_COST`]): past either, the
//! channel whose retained message was set longest ago loses it, counted.
//!
//! A subscription asks with its filters ([`Retained::matching`]): an exact
//! filter is one lookup; a wildcard filter walks the channels that hold a
//! retained message (at most `--max-retained` of them), and one answer
//! carries at most [`MAX_PER_ANSWER`] messages.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

use bytes::Bytes;
use throng_proto::mqtt::topic;

use crate::history::{CHANNEL_COST, Kept, MESSAGE_COST, MessageId};

mod handover;

/// The most retained messages one subscription is sent: a filter such as
/// `#` on a node with many retained channels gets these (the answer says
/// how many it left out, counted in `/metrics`).
pub const MAX_PER_ANSWER: usize = 1000;

/// The default `--max-retained`: channels with a retained message.
pub const DEFAULT_MAX_TOPICS: usize = 100_000;
/// The default `--max-retained-memory`.
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;

/// What the store may hold (`--max-retained`, `--max-retained-memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Channels with a retained message.
    pub max_topics: usize,
    /// Bytes of payloads and entries.
    pub max_bytes: usize,
}

/// One channel's retained message, as a subscriber is sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetainedMessage {
    /// Its channel (the PUBLISH's topic).
    pub channel: String,
    /// The QoS it was published at (0, 1 or 2): a subscriber gets it at the
    /// lower of this and its subscription's.
    pub qos: u8,
    /// Its id (as relayed live: [`MessageId::NONE`] from Redis), its
    /// framing and its payload.
    pub kept: Kept,
    /// The MQTT 5.0 properties it was published with (user properties,
    /// ...: [`crate::control::Message::properties`]); in Redis sealed
    /// with it (`redis/envelope.rs`).
    pub properties: Bytes,
}

/// The store's figures for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Channels with a retained message now.
    pub topics: u64,
    /// Bytes they take (payloads and entries).
    pub bytes: u64,
    /// Retained messages dropped over `--max-retained`.
    pub dropped_count: u64,
    /// Retained messages dropped over `--max-retained-memory`.
    pub dropped_memory: u64,
    /// Messages left out of answers over [`MAX_PER_ANSWER`].
    pub cut: u64,
}

struct Entry {
    qos: u8,
    kept: Kept,
    properties: Bytes,
    /// Its place in [`Retained::order`].
    stamp: u64,
}

/// The last retained message of each channel on one node.
pub struct Retained {
    limits: Limits,
    by_channel: HashMap<Rc<str>, Entry>,
    /// Channels by when their retained message was set, oldest first.
    order: BTreeMap<u64, Rc<str>>,
    next_stamp: u64,
    bytes: usize,
    stats: Stats,
}

fn cost(channel: &str, payload: &Bytes) -> usize {
    CHANNEL_COST + channel.len() + MESSAGE_COST + payload.len()
}

impl Retained {
    /// An empty store.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            by_channel: HashMap::new(),
            order: BTreeMap::new(),
            next_stamp: 0,
            bytes: 0,
            stats: Stats::default(),
        }
    }

    /// A retained publish on `channel`: `kept` becomes its retained
    /// message, or (an empty payload) the channel has none any more.
    pub fn set(&mut self, channel: &str, qos: u8, kept: Kept, properties: Bytes) {
        self.clear(channel);
        if kept.payload.is_empty() {
            return;
        }
        let size = cost(channel, &kept.payload) + properties.len();
        if size > self.limits.max_bytes || self.limits.max_topics == 0 {
            // Could never fit: dropped at once, as if pushed out.
            self.stats.dropped_memory += u64::from(size > self.limits.max_bytes);
            self.stats.dropped_count += u64::from(size <= self.limits.max_bytes);
            return;
        }
        let name: Rc<str> = Rc::from(channel);
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.order.insert(stamp, name.clone());
        self.by_channel.insert(
            name,
            Entry {
                qos: qos.min(2),
                kept,
                properties,
                stamp,
            },
        );
        self.bytes += size;
        while self.by_channel.len() > self.limits.max_topics {
            self.drop_oldest();
            self.stats.dropped_count += 1;
        }
        while self.bytes > self.limits.max_bytes {
            self.drop_oldest();
            self.stats.dropped_memory += 1;
        }
    }

    /// The retained messages of the channels `filters` match, each channel
    /// once (a wildcard walks every retained channel), at most
    /// [`MAX_PER_ANSWER`] of them; the rest are counted as cut.
    pub fn matching(&mut self, filters: &[String]) -> Vec<RetainedMessage> {
        let mut out: Vec<RetainedMessage> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        let mut cut = 0u64;
        let mut take = |name: &Rc<str>, e: &Entry, out: &mut Vec<RetainedMessage>| {
            if out.len() == MAX_PER_ANSWER {
                cut += 1;
                return;
            }
            out.push(RetainedMessage {
                channel: name.to_string(),
                qos: e.qos,
                kept: e.kept.clone(),
                properties: e.properties.clone(),
            });
        };
        for f in filters {
            if topic::is_wildcard(f) {
                for (name, e) in &self.by_channel {
                    if topic::matches(f, name) && seen.insert(name) {
                        take(name, e, &mut out);
                    }
                }
            } else if let Some((name, e)) = self.by_channel.get_key_value(f.as_str())
                && seen.insert(name)
            {
                take(name, e, &mut out);
            }
        }
        self.stats.cut += cut;
        out
    }

    /// The figures for `/metrics`.
    pub fn stats(&self) -> Stats {
        Stats {
            topics: self.by_channel.len() as u64,
            bytes: self.bytes as u64,
            ..self.stats
        }
    }

    fn clear(&mut self, channel: &str) {
        if let Some((name, e)) = self.by_channel.remove_entry(channel) {
            self.order.remove(&e.stamp);
            self.bytes -= cost(&name, &e.kept.payload) + e.properties.len();
        }
    }

    fn drop_oldest(&mut self) {
        if let Some((_, name)) = self.order.pop_first()
            && let Some(e) = self.by_channel.remove(&name)
        {
            self.bytes -= cost(&name, &e.kept.payload) + e.properties.len();
        }
    }
}

/// The Redis store (`--redis`): one hash `<prefix>#retained` (a field per
/// channel, its value the QoS byte and the payload) and a sorted set
/// `<prefix>#retained-order` (the channels by when their message was set,
/// for `--max-retained`). `#` is no channel byte, so neither key can be a
/// channel's stream. A wildcard reads the one hash, not a scan of the
/// keyspace.
pub mod in_redis {
    use bytes::{BufMut as _, Bytes, BytesMut};
    use throng_proto::mqtt::topic;
    use throng_proto::resp::{self, Value};

    use super::{MAX_PER_ANSWER, RetainedMessage};
    use crate::history::{Kept, MessageId};
    use crate::redis::envelope;
    use crate::redis::error::ReplyError;

    /// Sets (or, with an empty value, clears) a channel's retained
    /// message and drops the longest-set past the cap. KEYS = hash, order;
    /// ARGV = channel, value, max. Answers `[channels now, dropped]`.
    const STORE_SCRIPT: &str = r"
local dropped = 0
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], t[1] .. string.sub('000000' .. t[2], -6), ARGV[1])
  local max = tonumber(ARGV[3])
  while redis.call('ZCARD', KEYS[2]) > max do
    local old = redis.call('ZPOPMIN', KEYS[2])
    redis.call('HDEL', KEYS[1], old[1])
    dropped = dropped + 1
  end
end
return {redis.call('HLEN', KEYS[1]), dropped}
";

    /// The store's hash and sorted set. On a Redis Cluster (`sharded`)
    /// both carry the hash tag `{<prefix>#retained}`, so they share one
    /// slot and the store script runs on one master.
    fn keys(prefix: &str, sharded: bool) -> (String, String) {
        if sharded {
            let tag = slot_key(prefix);
            (tag.clone(), format!("{tag}-order"))
        } else {
            (
                format!("{prefix}#retained"),
                format!("{prefix}#retained-order"),
            )
        }
    }

    /// On a Redis Cluster: a key in the store's slot, whose master the
    /// store's commands go to.
    pub fn slot_key(prefix: &str) -> String {
        format!("{{{prefix}#retained}}")
    }

    /// Appends a retained publish: `MULTI`, the store script, `publish`
    /// (the command that publishes the message, already encoded), `EXEC`;
    /// so the store and the publish happen at one point in Redis's order.
    /// Four replies follow: `+OK`, two `+QUEUED`, then `EXEC`'s pair
    /// (read by [`stored`]).
    pub fn publish(
        out: &mut BytesMut,
        prefix: &str,
        channel: &str,
        qos: u8,
        payload: &[u8],
        max: usize,
        publish: &[u8],
    ) {
        resp::encode_command(out, &[b"MULTI"]);
        store(out, prefix, channel, qos, payload, max, false);
        out.put_slice(publish);
        resp::encode_command(out, &[b"EXEC"]);
    }

    /// Appends the store script alone: sets (or, with an empty payload,
    /// clears) `channel`'s retained message; answered `[channels now,
    /// dropped]` ([`figures`]). On a cluster the publish goes separately,
    /// to its channel's master, after this answer.
    pub fn store(
        out: &mut BytesMut,
        prefix: &str,
        channel: &str,
        qos: u8,
        payload: &[u8],
        max: usize,
        sharded: bool,
    ) {
        let mut value = Vec::with_capacity(payload.len() + 1);
        if !payload.is_empty() {
            value.push(qos.min(2));
            value.extend_from_slice(payload);
        }
        let ((hash, order), max) = (keys(prefix, sharded), max.to_string());
        resp::encode_command(
            out,
            &[
                b"EVAL",
                STORE_SCRIPT.as_bytes(),
                b"2",
                hash.as_bytes(),
                order.as_bytes(),
                channel.as_bytes(),
                &value,
                max.as_bytes(),
            ],
        );
    }

    /// Reads `EXEC`'s answer to [`publish`]: the store's figures (channels
    /// now, dropped) and the publish command's own reply.
    pub fn stored(v: Value) -> Result<((u64, u64), Value), ReplyError> {
        let mut items = match v {
            Value::Array(Some(items)) if items.len() == 2 => items,
            other => return Err(ReplyError::of(other)),
        };
        let publish = items.pop().unwrap_or(Value::Array(None));
        let figures = figures(items.pop().unwrap_or(Value::Array(None)))?;
        Ok((figures, publish))
    }

    /// Reads the store script's answer: channels in the store now, and
    /// how many this write dropped past the cap.
    pub fn figures(v: Value) -> Result<(u64, u64), ReplyError> {
        match v {
            Value::Array(Some(f)) => match f[..] {
                [Value::Integer(n), Value::Integer(d)] => {
                    Ok((u64::try_from(n).unwrap_or(0), u64::try_from(d).unwrap_or(0)))
                }
                _ => Err(ReplyError::StoreFigures),
            },
            other => Err(ReplyError::of(other)),
        }
    }

    /// Appends the command that reads the retained messages `filters`
    /// match: `HMGET` of the exact ones, or `HGETALL` when one is a
    /// wildcard (the hash holds at most `--max-retained` fields).
    pub fn ask(out: &mut BytesMut, prefix: &str, filters: &[String], sharded: bool) {
        let (hash, _) = keys(prefix, sharded);
        if filters.iter().any(|f| topic::is_wildcard(f)) {
            resp::encode_command(out, &[b"HGETALL", hash.as_bytes()]);
        } else {
            let mut args: Vec<&[u8]> = vec![b"HMGET", hash.as_bytes()];
            args.extend(filters.iter().map(String::as_bytes));
            resp::encode_command(out, &args);
        }
    }

    /// Reads the reply to [`ask`] for `filters`: each matching channel
    /// once, at most [`MAX_PER_ANSWER`]; also how many were left out.
    pub fn answer(filters: &[String], v: Value) -> Result<(Vec<RetainedMessage>, u64), ReplyError> {
        let items = match v {
            Value::Array(Some(items)) => items,
            Value::Array(None) => Vec::new(),
            other => return Err(ReplyError::of(other)),
        };
        let pairs: Vec<(String, Bytes)> = if filters.iter().any(|f| topic::is_wildcard(f)) {
            items
                .chunks(2)
                .filter_map(|kv| {
                    let name = std::str::from_utf8(kv[0].as_bytes()?).ok()?;
                    let v = kv.get(1)?.as_bytes()?.clone();
                    filters
                        .iter()
                        .any(|f| topic::matches(f, name))
                        .then(|| (name.to_owned(), v))
                })
                .collect()
        } else {
            filters
                .iter()
                .zip(items)
                .filter_map(|(f, v)| Some((f.clone(), v.as_bytes()?.clone())))
                .collect()
        };
        let mut out: Vec<RetainedMessage> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut cut = 0;
        for (channel, value) in pairs {
            if value.len() < 2 || !seen.insert(channel.clone()) {
                continue;
            }
            if out.len() == MAX_PER_ANSWER {
                cut += 1;
                continue;
            }
            // An MQTT publish is kept sealed, with its properties.
            let (text, payload, properties) = match envelope::open(value.slice(1..)) {
                Ok((Some(meta), payload)) => {
                    let waited = envelope::unix_ms().saturating_sub(meta.sent_ms);
                    let Some(properties) = envelope::expiry_left(meta.properties, waited) else {
                        continue;
                    };
                    (meta.text, payload, properties)
                }
                _ => {
                    let payload = value.slice(1..);
                    (std::str::from_utf8(&payload).is_ok(), payload, Bytes::new())
                }
            };
            out.push(RetainedMessage {
                channel,
                qos: value[0].min(2),
                kept: Kept {
                    id: MessageId::NONE,
                    text,
                    payload,
                },
                properties,
            });
        }
        Ok((out, cut))
    }
}

/// Whether retained message `r` is live message `(id, payload)` itself:
/// by id when both have one (the embedded relay numbers every message),
/// else by payload (from Redis without `--history`, messages have none).
pub fn same_message(r: &Kept, id: MessageId, payload: &[u8]) -> bool {
    if !r.id.is_none() && !id.is_none() {
        r.id == id
    } else {
        r.payload[..] == *payload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(seq: u64, body: &str) -> Kept {
        Kept {
            id: MessageId { epoch: 1, seq },
            text: true,
            payload: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    fn store(max_topics: usize) -> Retained {
        Retained::new(Limits {
            max_topics,
            max_bytes: 1 << 30,
        })
    }

    fn bodies(got: &[RetainedMessage]) -> Vec<String> {
        let mut v: Vec<String> = got
            .iter()
            .map(|r| format!("{}={}", r.channel, String::from_utf8_lossy(&r.kept.payload)))
            .collect();
        v.sort();
        v
    }

    fn filters(f: &[&str]) -> Vec<String> {
        f.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_retained_publish_replaces_and_an_empty_one_clears() {
        let mut s = store(10);
        s.set("a", 1, kept(1, "one"), Bytes::new());
        s.set("b", 0, kept(2, "two"), Bytes::new());
        assert_eq!(bodies(&s.matching(&filters(&["a"]))), ["a=one"]);
        s.set("a", 0, kept(3, "uno"), Bytes::new());
        let got = s.matching(&filters(&["a"]));
        assert_eq!(bodies(&got), ["a=uno"]);
        assert_eq!((got[0].qos, got[0].kept.id.seq), (0, 3));
        s.set("a", 1, kept(4, ""), Bytes::new());
        assert!(s.matching(&filters(&["a"])).is_empty());
        assert_eq!(s.stats().topics, 1);
        s.set("b", 1, kept(5, ""), Bytes::new());
        assert_eq!(s.stats(), Stats::default(), "nothing held, nothing costs");
    }

    #[test]
    fn wildcards_match_by_level_and_each_channel_comes_once() {
        let mut s = store(10);
        for (i, c) in ["r/a", "r/b", "r/b/c", "q/a"].iter().enumerate() {
            s.set(c, 0, kept(i as u64 + 1, c), Bytes::new());
        }
        assert_eq!(
            bodies(&s.matching(&filters(&["r/+"]))),
            ["r/a=r/a", "r/b=r/b"]
        );
        assert_eq!(
            bodies(&s.matching(&filters(&["r/#", "r/a", "+/a"]))),
            ["q/a=q/a", "r/a=r/a", "r/b/c=r/b/c", "r/b=r/b"]
        );
        assert!(s.matching(&filters(&["x/#", "r"])).is_empty());
    }

    #[test]
    fn past_the_caps_the_channel_set_longest_ago_loses_its_message() {
        let mut s = store(2);
        s.set("a", 0, kept(1, "1"), Bytes::new());
        s.set("b", 0, kept(2, "2"), Bytes::new());
        s.set("a", 0, kept(3, "3"), Bytes::new()); // a is now the newest
        s.set("c", 0, kept(4, "4"), Bytes::new());
        assert_eq!(bodies(&s.matching(&filters(&["#"]))), ["a=3", "c=4"]);
        assert_eq!(s.stats().dropped_count, 1);
        let one = cost("x", &Bytes::from_static(b"0123456789"));
        let mut s = Retained::new(Limits {
            max_topics: 100,
            max_bytes: 2 * one,
        });
        for c in ["x", "y", "z"] {
            s.set(c, 0, kept(1, "0123456789"), Bytes::new());
            assert!(s.stats().bytes as usize <= 2 * one);
        }
        assert_eq!(bodies(&s.matching(&filters(&["+"]))).len(), 2);
        assert_eq!(s.stats().dropped_memory, 1);
        s.set("big", 0, kept(9, &"x".repeat(3 * one)), Bytes::new());
        assert_eq!(s.stats().dropped_memory, 2, "one that can never fit");
        assert_eq!(s.stats().topics, 2);
    }

    #[test]
    fn an_answer_holds_at_most_its_bound_and_counts_the_rest() {
        let mut s = store(MAX_PER_ANSWER + 10);
        for i in 0..MAX_PER_ANSWER + 10 {
            s.set(&format!("t/{i}"), 0, kept(i as u64, "x"), Bytes::new());
        }
        assert_eq!(s.matching(&filters(&["t/#"])).len(), MAX_PER_ANSWER);
        assert_eq!(s.stats().cut, 10);
    }

    #[test]
    fn redis_replies_read_into_retained_messages_and_bad_ones_are_errors() {
        use throng_proto::resp::Value;
        let bulk = |b: &[u8]| Value::Bulk(Some(Bytes::copy_from_slice(b)));
        // HMGET: one reply per filter, nil where nothing is retained.
        let exact = filters(&["a", "b", "a"]);
        let reply = Value::Array(Some(vec![
            bulk(b"\x01one"),
            Value::Bulk(None),
            bulk(b"\x01one"),
        ]));
        let (got, cut) = in_redis::answer(&exact, reply).unwrap();
        assert_eq!((bodies(&got), cut), (vec!["a=one".to_owned()], 0));
        assert_eq!((got[0].qos, got[0].kept.id), (1, MessageId::NONE));
        // HGETALL: field, value pairs, kept where a filter matches.
        let wild = filters(&["r/+"]);
        let reply = Value::Array(Some(vec![
            bulk(b"r/a"),
            bulk(b"\x00x"),
            bulk(b"q/a"),
            bulk(b"\x00y"),
            bulk(b"r/b"),
            bulk(&[0, 0xff]),
        ]));
        let (got, _) = in_redis::answer(&wild, reply).unwrap();
        assert_eq!(bodies(&got), ["r/a=x", "r/b=\u{fffd}"]);
        assert!(!got.iter().find(|r| r.channel == "r/b").unwrap().kept.text);
        assert!(in_redis::answer(&wild, Value::Integer(3)).is_err());
        // EXEC's pair: the store's figures, then the publish's own reply.
        let exec = Value::Array(Some(vec![
            Value::Array(Some(vec![Value::Integer(4), Value::Integer(1)])),
            Value::Integer(2),
        ]));
        assert_eq!(in_redis::stored(exec).unwrap(), ((4, 1), Value::Integer(2)));
        let aborted = Value::Error(Bytes::from_static(b"EXECABORT"));
        assert!(in_redis::stored(aborted).is_err());
        assert!(in_redis::stored(Value::Array(Some(vec![Value::Integer(1)]))).is_err());
        // A retained publish is MULTI, the script, the publish, EXEC.
        let mut out = bytes::BytesMut::new();
        in_redis::publish(&mut out, "t:", "a", 1, b"p", 10, b"*1\r\n$4\r\nPING\r\n");
        assert!(out.starts_with(b"*1\r\n$5\r\nMULTI\r\n*8\r\n$4\r\nEVAL"));
        assert!(out.ends_with(b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nEXEC\r\n"));
    }

    #[test]
    fn the_same_message_is_known_by_id_or_else_by_payload() {
        let r = kept(5, "x");
        assert!(same_message(&r, MessageId { epoch: 1, seq: 5 }, b"y"));
        assert!(!same_message(&r, MessageId { epoch: 1, seq: 6 }, b"x"));
        assert!(same_message(&r, MessageId::NONE, b"x"));
        assert!(!same_message(&r, MessageId::NONE, b"y"));
    }
}
