//! A Redis in memory for tests: one node's two connections and just the
//! commands a [`super::Session`] sends (pub/sub, the history script and the
//! stream reads, the retained store's script and reads, `MULTI`/`EXEC`),
//! answered as redis-server answers them. What it has to send waits in a
//! queue per connection, so a test decides which connection is heard first.

use std::collections::{HashMap, HashSet, VecDeque};

use bytes::{BufMut as _, Bytes, BytesMut};
use throng_proto::resp::{self, Value};

use super::error::Conn;
use super::settings::{RedisMode, RedisSettings, Trust};
use crate::stream::StreamLimits;

/// Settings for a session with the fake: prefix `t:`, `history` messages
/// kept per channel (0: no history), 10 retained channels.
pub(crate) fn settings(mode: RedisMode, history: usize) -> RedisSettings {
    RedisSettings {
        url: "redis://127.0.0.1".parse().expect("a URL"),
        prefix: "t:".into(),
        mode,
        wait: true,
        trust: Trust::default(),
        tls: None,
        history: (history > 0).then_some(StreamLimits {
            keep: history,
            ttl_ms: 0,
        }),
        max_retained: 10,
        topology: super::settings::Topology::Single,
        session_queue: 0,
    }
}

/// One stream entry: its id (`ms`, `seq`) and its payload.
type Entry = ((u64, u64), Bytes);

/// A stream: what it keeps, and how many were ever added.
#[derive(Default)]
struct Stream {
    entries: Vec<Entry>,
    added: i64,
}

/// The fake Redis server.
#[derive(Default)]
pub(crate) struct FakeRedis {
    dec: resp::Decoder,
    sub_in: BytesMut,
    pub_in: BytesMut,
    /// Bytes for the session, per connection, in order.
    to_sub: VecDeque<Bytes>,
    to_pub: VecDeque<Bytes>,
    channels: HashSet<Bytes>,
    patterns: Vec<Bytes>,
    /// Shard channels (`SSUBSCRIBE`, a cluster's master).
    sharded: HashSet<Bytes>,
    /// Commands queued since `MULTI`.
    multi: Option<Vec<Vec<Bytes>>>,
    streams: HashMap<Bytes, Stream>,
    /// The retained store (`<prefix>#retained`), field to value.
    hash: HashMap<Bytes, Bytes>,
    /// Redis's clock for stream ids, in ms.
    clock: u64,
    /// Every `PUBLISH` run, with the receivers it found.
    pub(crate) published: Vec<(Bytes, i64)>,
}

impl FakeRedis {
    /// The session wrote `bytes` on `conn`.
    pub(crate) fn on_bytes(&mut self, conn: Conn, bytes: &[u8]) {
        let buf = match conn {
            Conn::Subscriber => &mut self.sub_in,
            Conn::Publisher => &mut self.pub_in,
        };
        buf.extend_from_slice(bytes);
        loop {
            let buf = match conn {
                Conn::Subscriber => &mut self.sub_in,
                Conn::Publisher => &mut self.pub_in,
            };
            let Some(v) = self.dec.decode(buf).expect("the session writes RESP") else {
                return;
            };
            let Value::Array(Some(items)) = v else {
                panic!("a command is an array: {v:?}");
            };
            let args: Vec<Bytes> = items
                .iter()
                .map(|a| a.as_bytes().expect("bulk arguments").clone())
                .collect();
            match conn {
                Conn::Subscriber => self.subscriber(&args),
                Conn::Publisher => self.publisher(args),
            }
        }
    }

    /// What `conn` has for the session, all of it.
    pub(crate) fn take(&mut self, conn: Conn) -> Option<Bytes> {
        let q = match conn {
            Conn::Subscriber => &mut self.to_sub,
            Conn::Publisher => &mut self.to_pub,
        };
        let mut out = BytesMut::new();
        for b in q.drain(..) {
            out.put_slice(&b);
        }
        (!out.is_empty()).then(|| out.freeze())
    }

    /// Another Redis client publishes `payload` on `channel`.
    pub(crate) fn publish_elsewhere(&mut self, channel: &[u8], payload: &[u8]) {
        let (channel, payload) = (
            Bytes::copy_from_slice(channel),
            Bytes::copy_from_slice(payload),
        );
        self.publish(&channel, &payload);
    }

    /// As a cluster master whose slot of `channel` moved to another: the
    /// shard subscription ends with an unasked `sunsubscribe`.
    pub(crate) fn slot_moved_away(&mut self, channel: &[u8]) {
        let name = Bytes::copy_from_slice(channel);
        if self.sharded.remove(&name) {
            let count = (self.channels.len() + self.patterns.len() + self.sharded.len()) as i64;
            let v = list(vec![
                bulk(b"sunsubscribe"),
                Value::Bulk(Some(name)),
                Value::Integer(count),
            ]);
            self.send(Conn::Subscriber, &v);
        }
    }

    /// Both connections break: what was not yet sent is lost, the
    /// subscriptions go; the data stays.
    pub(crate) fn disconnect(&mut self) {
        self.sub_in.clear();
        self.pub_in.clear();
        self.to_sub.clear();
        self.to_pub.clear();
        self.channels.clear();
        self.patterns.clear();
        self.sharded.clear();
        self.multi = None;
    }

    fn send(&mut self, conn: Conn, v: &Value) {
        let mut out = BytesMut::new();
        v.encode(&mut out);
        match conn {
            Conn::Subscriber => self.to_sub.push_back(out.freeze()),
            Conn::Publisher => self.to_pub.push_back(out.freeze()),
        }
    }

    fn subscriber(&mut self, args: &[Bytes]) {
        let kind = args[0].to_ascii_lowercase();
        for name in &args[1..] {
            match &kind[..] {
                b"subscribe" => {
                    self.channels.insert(name.clone());
                }
                b"unsubscribe" => {
                    self.channels.remove(name);
                }
                b"psubscribe" => self.patterns.push(name.clone()),
                b"ssubscribe" => {
                    self.sharded.insert(name.clone());
                }
                b"sunsubscribe" => {
                    self.sharded.remove(name);
                }
                _ => {}
            }
            let count = (self.channels.len() + self.patterns.len() + self.sharded.len()) as i64;
            let v = list(vec![
                bulk(&kind),
                Value::Bulk(Some(name.clone())),
                Value::Integer(count),
            ]);
            self.send(Conn::Subscriber, &v);
        }
        if &kind[..] == b"ping" {
            let v = if self.channels.is_empty() && self.patterns.is_empty() {
                Value::Simple(Bytes::from_static(b"PONG"))
            } else {
                list(vec![bulk(b"pong"), bulk(b"")])
            };
            self.send(Conn::Subscriber, &v);
        }
    }

    fn publisher(&mut self, args: Vec<Bytes>) {
        let name = args[0].to_ascii_uppercase();
        let reply = match (&name[..], &mut self.multi) {
            (b"MULTI", _) => {
                self.multi = Some(Vec::new());
                ok()
            }
            (b"EXEC", _) => {
                let queued = self.multi.take().unwrap_or_default();
                list(queued.into_iter().map(|c| self.run(c)).collect())
            }
            (_, Some(queued)) => {
                queued.push(args);
                Value::Simple(Bytes::from_static(b"QUEUED"))
            }
            (_, None) => self.run(args),
        };
        self.send(Conn::Publisher, &reply);
    }

    /// Runs one command and gives its reply.
    fn run(&mut self, args: Vec<Bytes>) -> Value {
        match &args[0].to_ascii_uppercase()[..] {
            b"PING" => Value::Simple(Bytes::from_static(b"PONG")),
            b"PUBLISH" | b"SPUBLISH" => Value::Integer(self.publish(&args[1], &args[2])),
            b"EVAL" if args[1].windows(4).any(|w| w == b"XADD") => self.history_publish(&args),
            b"EVAL" => self.store(&args),
            b"XREVRANGE" => {
                let since = id_of(&args[2]);
                let before = self.entries(&args[1], |id| id <= since);
                list(before.into_iter().last().into_iter().collect())
            }
            b"XRANGE" => {
                let since = id_of(&args[2][1..]);
                list(self.entries(&args[1], |id| id > since))
            }
            b"XINFO" => match self.streams.get(&args[2]) {
                None => Value::Error(Bytes::from_static(b"ERR no such key")),
                Some(s) => {
                    let last = s.entries.last().map_or((0, 0), |e| e.0);
                    list(vec![
                        bulk(b"length"),
                        Value::Integer(s.entries.len() as i64),
                        bulk(b"last-generated-id"),
                        bulk(format!("{}-{}", last.0, last.1).as_bytes()),
                        bulk(b"entries-added"),
                        Value::Integer(s.added),
                    ])
                }
            },
            b"HMGET" => list(
                args[2..]
                    .iter()
                    .map(|f| Value::Bulk(self.hash.get(f).cloned()))
                    .collect(),
            ),
            b"HGETALL" => list(
                self.hash
                    .iter()
                    .flat_map(|(k, v)| [Value::Bulk(Some(k.clone())), Value::Bulk(Some(v.clone()))])
                    .collect(),
            ),
            other => Value::Error(Bytes::from(format!(
                "ERR the fake Redis has no {}",
                String::from_utf8_lossy(other)
            ))),
        }
    }

    /// `PUBLISH`: pushed to the node's subscriber connection when it
    /// subscribed to the channel or a pattern that matches it.
    fn publish(&mut self, channel: &Bytes, payload: &Bytes) -> i64 {
        let push = if self.sharded.contains(channel) {
            Some(list(vec![
                bulk(b"smessage"),
                Value::Bulk(Some(channel.clone())),
                Value::Bulk(Some(payload.clone())),
            ]))
        } else if self.channels.contains(channel) {
            Some(list(vec![
                bulk(b"message"),
                Value::Bulk(Some(channel.clone())),
                Value::Bulk(Some(payload.clone())),
            ]))
        } else {
            self.patterns.iter().find(|p| glob(p, channel)).map(|p| {
                list(vec![
                    bulk(b"pmessage"),
                    Value::Bulk(Some(p.clone())),
                    Value::Bulk(Some(channel.clone())),
                    Value::Bulk(Some(payload.clone())),
                ])
            })
        };
        let receivers = i64::from(push.is_some());
        if let Some(v) = push {
            self.send(Conn::Subscriber, &v);
        }
        self.published.push((payload.clone(), receivers));
        receivers
    }

    /// The history script: `XADD` (trimmed to `MAXLEN`), then `PUBLISH`
    /// of the payload in its envelope; answers `[id, receivers]`.
    fn history_publish(&mut self, args: &[Bytes]) -> Value {
        let (key, channel, keep, payload) = (&args[3], &args[4], &args[5], &args[6]);
        let keep: usize = std::str::from_utf8(keep).unwrap().parse().unwrap();
        self.clock += 1;
        let id = (self.clock, 0);
        let s = self.streams.entry(key.clone()).or_default();
        s.entries.push((id, payload.clone()));
        s.added += 1;
        let over = s.entries.len().saturating_sub(keep);
        s.entries.drain(..over);
        let text = format!("{}-{}", id.0, id.1);
        let mut sealed = BytesMut::new();
        sealed.put_slice(crate::stream::ENVELOPE);
        sealed.put_slice(text.as_bytes());
        sealed.put_u8(b'\n');
        sealed.put_slice(payload);
        let n = self.publish(channel, &sealed.freeze());
        list(vec![bulk(text.as_bytes()), Value::Integer(n)])
    }

    /// The retained store's script (no cap: the tests stay under it).
    fn store(&mut self, args: &[Bytes]) -> Value {
        let (channel, value) = (&args[5], &args[6]);
        if value.is_empty() {
            self.hash.remove(channel);
        } else {
            self.hash.insert(channel.clone(), value.clone());
        }
        list(vec![
            Value::Integer(self.hash.len() as i64),
            Value::Integer(0),
        ])
    }

    /// The entries of stream `key` whose ids pass `keep`, as `XRANGE` gives them.
    fn entries(&self, key: &Bytes, keep: impl Fn((u64, u64)) -> bool) -> Vec<Value> {
        let Some(s) = self.streams.get(key) else {
            return Vec::new();
        };
        s.entries
            .iter()
            .filter(|(id, _)| keep(*id))
            .map(|(id, p)| {
                list(vec![
                    bulk(format!("{}-{}", id.0, id.1).as_bytes()),
                    list(vec![bulk(b"p"), Value::Bulk(Some(p.clone()))]),
                ])
            })
            .collect()
    }
}

fn ok() -> Value {
    Value::Simple(Bytes::from_static(b"OK"))
}

fn bulk(b: &[u8]) -> Value {
    Value::Bulk(Some(Bytes::copy_from_slice(b)))
}

fn list(v: Vec<Value>) -> Value {
    Value::Array(Some(v))
}

fn id_of(b: &[u8]) -> (u64, u64) {
    let s = std::str::from_utf8(b).expect("an id");
    let (ms, seq) = s.split_once('-').expect("ms-seq");
    (ms.parse().expect("ms"), seq.parse().expect("seq"))
}

/// Redis's glob, as far as a throng pattern goes: escaped characters and
/// `*`.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match pattern {
        [] => name.is_empty(),
        [b'*', rest @ ..] => (0..=name.len()).any(|i| glob(rest, &name[i..])),
        [b'\\', c, rest @ ..] | [c, rest @ ..] => name.first() == Some(c) && glob(rest, &name[1..]),
    }
}
