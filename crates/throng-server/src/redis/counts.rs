//! Subscriber counts across the nodes that share a Redis (`--redis`), for
//! the server API's `GET /api/channels` and `GET /api/channels/<c>`: every
//! [`WRITE_EVERY`] a node writes its per-channel counts to a hash of its
//! own and its name, with an expiry [`TTL`] ahead, to a sorted set of
//! nodes; an API question sums this node's live counts with the hashes of
//! the other nodes whose expiry has not passed. A node that dies stops
//! counting within [`TTL`]; another node's counts are as of its last
//! write.
//!
//! The same link carries presence (`--presence`): with its counts a node
//! writes who holds its presence channels (a hash of its own beside its
//! counts', gone with them), and it publishes each join and leave on a
//! pub/sub channel every node listens to, as disconnects are relayed.
//!
//! Every key carries the hash tag `{<prefix>#counts}`, so on a Redis Cluster
//! they all live on one master (followed through `MOVED`). This link is
//! its own connection, beside the broker's: it does request and reply, the
//! broker's connections carry pub/sub.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use throng_client::link::Stream;
use throng_proto::resp::{self, Limits, Value};
use tokio::sync::mpsc;

use super::cluster::Addr;
use super::settings::RedisSettings;
use crate::api::{Part, Query};
use crate::control::PresenceEvent;

/// How often a node writes its counts.
pub(crate) const WRITE_EVERY: Duration = Duration::from_secs(5);
/// How long a node's counts count after its last write.
pub(crate) const TTL: Duration = Duration::from_secs(15);
/// Fields per `HSET` when writing many channels.
const HSET_BATCH: usize = 1000;
/// How long one exchange with Redis may take.
const TIMEOUT: Duration = Duration::from_secs(2);

/// What the supervisor asks of the counts link.
#[derive(Debug)]
pub(crate) enum CountsCmd {
    /// This node's counts now (every channel with subscribers), and who
    /// holds each of its `--presence` channels.
    Write {
        counts: Vec<(String, u64)>,
        presence: Vec<(String, Vec<(String, u64)>)>,
    },
    /// The other nodes' counts for `query` (a `Channels` or `Channel`),
    /// answered with [`CountsNews::Counts`] and request `id`; with
    /// `presence`, a `Channel`'s presence lists too.
    Read {
        id: u64,
        query: Query,
        presence: bool,
    },
    /// Relays a disconnect to the other nodes and gathers how many each
    /// closed; answered with [`CountsNews::Relayed`] and request `id`.
    Disconnect { id: u64, order: Order },
    /// This node closed `closed` subscribers for the relayed order `req`.
    Closed { req: String, closed: u64 },
    /// A presence event of this node, for the other nodes.
    Presence(PresenceEvent),
}

/// A presence event relayed through Redis, with the node it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Relayed1 {
    from: String,
    #[serde(flatten)]
    event: PresenceEvent,
}

/// What the other nodes hold of what a read asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Remote {
    /// `(channel, subscribers)`, as [`Part::channels`].
    pub channels: Vec<(String, u64)>,
    /// A `Channel` read: the subjects the other nodes list for it.
    pub presence: Vec<(String, u64)>,
}

/// A disconnect relayed to every node (`POST /api/disconnect` with Redis).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Order {
    /// The order's id: where each node pushes what it closed.
    pub req: String,
    /// The node that relayed it (it closed its own already).
    pub from: String,
    pub channel: String,
    pub code: u16,
    pub reason: String,
    /// Set: close the connections of this token subject (`channel` empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
}

/// How a relayed disconnect went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Relayed {
    /// Subscribers the other nodes closed.
    pub closed: u64,
    /// Other live nodes it was relayed to.
    pub asked: u64,
    /// Those that said how many they closed in time.
    pub answered: u64,
}

/// What the counts link tells the supervisor.
#[derive(Debug)]
pub(crate) enum CountsNews {
    /// The other nodes' counts for read `id`, or why not.
    Counts(u64, Result<Remote, String>),
    /// How relayed disconnect `id` went, or why it could not be relayed.
    Relayed(u64, Result<Relayed, String>),
    /// Another node relayed a disconnect: close here, then answer [`CountsCmd::Closed`].
    Order(Order),
    /// Another node's presence event.
    Presence(PresenceEvent),
    /// The link published a presence event handed to it (or gave up on it).
    PresenceSent,
}

/// How long a relayed disconnect waits for the other nodes' answers.
const RELAY_WAIT: Duration = Duration::from_millis(1500);

/// The keys of one node's counts.
#[derive(Debug, Clone)]
struct Keys {
    nodes: String,
    node_prefix: String,
    /// The pub/sub channel of relayed disconnects.
    orders: String,
    /// The pub/sub channel of presence events.
    presence: String,
    /// The hashes of each node's presence: `<presence_prefix><node>`.
    presence_prefix: String,
    /// Where the nodes push what they closed for an order: `<closed><req>`.
    closed: String,
}

impl Keys {
    fn new(prefix: &str) -> Self {
        let tag = format!("{{{prefix}#counts}}");
        Self {
            nodes: format!("{tag}:nodes"),
            node_prefix: format!("{tag}:node:"),
            orders: format!("{tag}:disconnect"),
            presence: format!("{tag}:presence"),
            presence_prefix: format!("{tag}:presence:"),
            closed: format!("{tag}:closed:"),
        }
    }

    fn node(&self, id: &str) -> String {
        format!("{}{id}", self.node_prefix)
    }

    fn node_presence(&self, id: &str) -> String {
        format!("{}{id}", self.presence_prefix)
    }
}

/// The commands that replace node `id`'s counts with `counts`, at Unix
/// millisecond `now`: one transaction, so a reader sees the old or the new.
fn write_commands(
    keys: &Keys,
    id: &str,
    counts: &[(String, u64)],
    presence: &[(String, Vec<(String, u64)>)],
    now_ms: u64,
) -> Vec<Vec<Vec<u8>>> {
    let node = keys.node(id);
    let expiry = (now_ms + TTL.as_millis() as u64).to_string();
    let mut cmds: Vec<Vec<Vec<u8>>> = vec![vec![b"MULTI".to_vec()]];
    cmds.push(vec![b"DEL".to_vec(), node.clone().into_bytes()]);
    for batch in counts.chunks(HSET_BATCH) {
        let mut c = vec![b"HSET".to_vec(), node.clone().into_bytes()];
        for (name, n) in batch {
            c.push(name.clone().into_bytes());
            c.push(n.to_string().into_bytes());
        }
        cmds.push(c);
    }
    let ttl = TTL.as_millis().to_string();
    cmds.push(vec![
        b"PEXPIRE".to_vec(),
        node.into_bytes(),
        ttl.into_bytes(),
    ]);
    cmds.push(vec![
        b"ZADD".to_vec(),
        keys.nodes.clone().into_bytes(),
        expiry.into_bytes(),
        id.as_bytes().to_vec(),
    ]);
    // Nodes whose counts expired leave the set.
    cmds.push(vec![
        b"ZREMRANGEBYSCORE".to_vec(),
        keys.nodes.clone().into_bytes(),
        b"-inf".to_vec(),
        format!("({now_ms}").into_bytes(),
    ]);
    presence_commands(keys, id, presence, &mut cmds);
    cmds.push(vec![b"EXEC".to_vec()]);
    cmds
}

/// The commands that replace node `id`'s presence hash (one field a
/// channel, its subjects as JSON `[["alice",2],...]`), expiring with its
/// counts: part of the counts' transaction.
fn presence_commands(
    keys: &Keys,
    id: &str,
    presence: &[(String, Vec<(String, u64)>)],
    cmds: &mut Vec<Vec<Vec<u8>>>,
) {
    let key = keys.node_presence(id).into_bytes();
    cmds.push(vec![b"DEL".to_vec(), key.clone()]);
    if presence.is_empty() {
        return;
    }
    for batch in presence.chunks(HSET_BATCH) {
        let mut c = vec![b"HSET".to_vec(), key.clone()];
        for (channel, subs) in batch {
            c.push(channel.clone().into_bytes());
            c.push(serde_json::to_vec(subs).unwrap_or_default());
        }
        cmds.push(c);
    }
    cmds.push(vec![
        b"PEXPIRE".to_vec(),
        key,
        TTL.as_millis().to_string().into_bytes(),
    ]);
}

/// Adds one node's presence for a channel (an `HMGET` reply: its JSON, or
/// nil) to `sum`.
fn add_presence(sum: &mut BTreeMap<String, u64>, reply: &Value) {
    let Value::Array(Some(v)) = reply else {
        return;
    };
    let Some(json) = v.first().and_then(Value::as_bytes) else {
        return;
    };
    let Ok(subs) = serde_json::from_slice::<Vec<(String, u64)>>(json) else {
        return;
    };
    for (sub, n) in subs {
        *sum.entry(sub).or_default() += n;
    }
}

/// Adds one node's `HGETALL` reply to `sum`, keeping the names `query` asks for.
fn add_hash(sum: &mut BTreeMap<String, u64>, reply: &Value, query: &Query) {
    let Value::Array(Some(items)) = reply else {
        return;
    };
    for pair in items.chunks_exact(2) {
        let (Some(name), Some(n)) = (pair[0].as_bytes(), pair[1].as_bytes()) else {
            continue;
        };
        let (Ok(name), Some(n)) = (
            std::str::from_utf8(name),
            std::str::from_utf8(n)
                .ok()
                .and_then(|n| n.parse::<u64>().ok()),
        ) else {
            continue;
        };
        let wanted = match query {
            Query::Channels { prefix, after, .. } => {
                name.starts_with(prefix.as_str()) && name > after.as_str()
            }
            Query::Channel { name: c } => name == c,
            Query::Disconnect { .. } | Query::DisconnectSubject { .. } => false,
        };
        if wanted {
            *sum.entry(name.to_owned()).or_default() += n;
        }
    }
}

/// Adds the other nodes' counts (`remote`) to this node's answer `local`:
/// a page stays the first `limit + 1` names of the union; a channel's
/// presence (when this node lists it) is the union of every node's.
pub(crate) fn merge(local: &mut Part, remote: Remote, query: &Query) {
    let mut all: BTreeMap<String, u64> = local.channels.drain(..).collect();
    for (name, n) in remote.channels {
        *all.entry(name).or_default() += n;
    }
    if let Some(mine) = local.presence.as_mut() {
        let mut who: BTreeMap<String, u64> = std::mem::take(&mut **mine).into_iter().collect();
        for (sub, n) in remote.presence {
            *who.entry(sub).or_default() += n;
        }
        **mine = who.into_iter().collect();
    }
    local.channels = all.into_iter().collect();
    if let Query::Channels { limit, .. } = query {
        local.channels.truncate(limit.saturating_add(1));
    }
}

/// One connection to the master that holds the counts' slot.
struct Conn {
    stream: Stream,
    buf: BytesMut,
}

/// The link's state between commands.
struct Link {
    settings: RedisSettings,
    keys: Keys,
    id: String,
    conn: Option<Conn>,
    /// Where a `MOVED` pointed (a cluster's master of the counts' slot).
    at: Option<Addr>,
    dec: resp::Decoder,
}

impl Link {
    async fn connect(&mut self) -> Result<Conn, String> {
        let addr = match (&self.at, &self.settings.topology) {
            (Some(a), _) => a.clone(),
            (None, super::Topology::Cluster(seeds)) => seeds[0].clone(),
            (None, _) => self.settings.master().await.map_err(|e| e.to_string())?,
        };
        let s = self.settings.at(&addr);
        let (stream, buf) = throng_client::redis::open(&s.url, s.tls.as_ref(), TIMEOUT)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        Ok(Conn { stream, buf })
    }

    /// Sends `cmds` in one write and reads their replies, following one
    /// `MOVED` (a cluster: the counts' slot is on another master).
    async fn exchange(&mut self, cmds: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, String> {
        for _ in 0..3 {
            let mut conn = match self.conn.take() {
                Some(c) => c,
                None => self.connect().await?,
            };
            let mut out = Vec::new();
            for c in cmds {
                let args: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
                resp::encode_command(&mut out, &args);
            }
            let replies = tokio::time::timeout(TIMEOUT, async {
                throng_client::link::write_all(&mut conn.stream, &out)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut replies = Vec::with_capacity(cmds.len());
                for _ in cmds {
                    let v = throng_client::redis::read_value(
                        &mut conn.stream,
                        &mut conn.buf,
                        &self.dec,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                    replies.push(v);
                }
                Ok::<_, String>(replies)
            })
            .await
            .map_err(|_| format!("no answer within {TIMEOUT:?}"))??;
            let moved = replies.iter().find_map(|v| match v {
                Value::Error(e) => std::str::from_utf8(e)
                    .ok()
                    .and_then(|e| e.strip_prefix("MOVED "))
                    .and_then(|rest| rest.split_whitespace().nth(1))
                    .and_then(Addr::parse),
                _ => None,
            });
            match moved {
                Some(a) => self.at = Some(a),
                None => {
                    self.conn = Some(conn);
                    return Ok(replies);
                }
            }
        }
        Err("redirected more than twice".to_owned())
    }

    async fn write(
        &mut self,
        counts: &[(String, u64)],
        presence: &[(String, Vec<(String, u64)>)],
    ) -> Result<(), String> {
        let cmds = write_commands(&self.keys, &self.id, counts, presence, unix_ms());
        let replies = self.exchange(&cmds).await?;
        match replies.last() {
            Some(Value::Array(Some(_))) => Ok(()),
            other => Err(format!("the counts' transaction answered {other:?}")),
        }
    }

    /// The other nodes whose counts have not expired.
    async fn others(&mut self) -> Result<Vec<String>, String> {
        let now = unix_ms().to_string();
        let live = self
            .exchange(&[vec![
                b"ZRANGEBYSCORE".to_vec(),
                self.keys.nodes.clone().into_bytes(),
                now.into_bytes(),
                b"+inf".to_vec(),
            ]])
            .await?;
        let Some(Value::Array(Some(nodes))) = live.first() else {
            return Err(format!("the node list answered {live:?}"));
        };
        Ok(nodes
            .iter()
            .filter_map(|n| n.as_bytes())
            .filter(|n| n.as_ref() != self.id.as_bytes())
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect())
    }

    /// Publishes `order` to the other nodes, then waits up to
    /// [`RELAY_WAIT`] for each live one to say how many it closed.
    async fn relay(&mut self, order: &Order) -> Result<Relayed, String> {
        let asked = self.others().await?.len() as u64;
        let json = serde_json::to_vec(order).map_err(|e| e.to_string())?;
        self.exchange(&[vec![
            b"PUBLISH".to_vec(),
            self.keys.orders.clone().into_bytes(),
            json,
        ]])
        .await?;
        let key = format!("{}{}", self.keys.closed, order.req).into_bytes();
        let deadline = tokio::time::Instant::now() + RELAY_WAIT;
        let mut out = Relayed {
            closed: 0,
            asked,
            answered: 0,
        };
        while out.answered < asked {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let wait = format!("{:.3}", left.as_secs_f64().max(0.01));
            let r = self
                .exchange(&[vec![b"BLPOP".to_vec(), key.clone(), wait.into_bytes()]])
                .await?;
            // [key, count], or nil when the wait ran out.
            let Some(Value::Array(Some(kv))) = r.first() else {
                break;
            };
            let n = kv
                .get(1)
                .and_then(Value::as_bytes)
                .and_then(|b| std::str::from_utf8(b).ok()?.parse::<u64>().ok())
                .unwrap_or(0);
            out.closed += n;
            out.answered += 1;
        }
        Ok(out)
    }

    /// Publishes this node's presence event `e` to the other nodes.
    async fn presence(&mut self, e: PresenceEvent) -> Result<(), String> {
        let json = serde_json::to_vec(&Relayed1 {
            from: self.id.clone(),
            event: e,
        })
        .map_err(|e| e.to_string())?;
        self.exchange(&[vec![
            b"PUBLISH".to_vec(),
            self.keys.presence.clone().into_bytes(),
            json,
        ]])
        .await
        .map(drop)
    }

    /// Tells the node that relayed order `req` how many this node closed.
    async fn closed(&mut self, req: &str, closed: u64) -> Result<(), String> {
        let key = format!("{}{req}", self.keys.closed).into_bytes();
        self.exchange(&[
            vec![
                b"RPUSH".to_vec(),
                key.clone(),
                closed.to_string().into_bytes(),
            ],
            vec![b"PEXPIRE".to_vec(), key, b"30000".to_vec()],
        ])
        .await
        .map(drop)
    }

    async fn read(&mut self, query: &Query, presence: bool) -> Result<Remote, String> {
        let mut cmds: Vec<Vec<Vec<u8>>> = Vec::new();
        for n in self.others().await? {
            let node = self.keys.node(&n);
            match query {
                Query::Channel { name } => {
                    let field = name.clone().into_bytes();
                    cmds.push(vec![b"HMGET".to_vec(), node.into_bytes(), field.clone()]);
                    if presence {
                        let key = self.keys.node_presence(&n).into_bytes();
                        cmds.push(vec![b"HMGET".to_vec(), key, field]);
                    }
                }
                _ => cmds.push(vec![b"HGETALL".to_vec(), node.into_bytes()]),
            }
        }
        if cmds.is_empty() {
            return Ok(Remote::default());
        }
        let replies = self.exchange(&cmds).await?;
        let mut sum = BTreeMap::new();
        let mut who = BTreeMap::new();
        let step = if presence { 2 } else { 1 };
        for (k, r) in replies.iter().enumerate() {
            if k % step == 1 {
                add_presence(&mut who, r);
                continue;
            }
            match (query, r) {
                // HMGET's answer: the count, or nil.
                (Query::Channel { name }, Value::Array(Some(v))) => {
                    let n = v
                        .first()
                        .and_then(Value::as_bytes)
                        .and_then(|b| std::str::from_utf8(b).ok()?.parse::<u64>().ok())
                        .unwrap_or(0);
                    *sum.entry(name.clone()).or_default() += n;
                }
                (_, Value::Error(e)) => return Err(String::from_utf8_lossy(e).into_owned()),
                _ => add_hash(&mut sum, r, query),
            }
        }
        let mut v: Vec<(String, u64)> = sum.into_iter().collect();
        if let Query::Channels { limit, .. } = query {
            v.truncate(limit.saturating_add(1));
        }
        Ok(Remote {
            channels: v,
            presence: who.into_iter().collect(),
        })
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A name for this node in the counts' keys: unique per process start.
pub(crate) fn node_id() -> String {
    format!("{}-{:016x}", std::process::id(), fastrand::u64(..))
}

/// The counts link: writes what [`CountsCmd::Write`] gives, answers each
/// [`CountsCmd::Read`] and [`CountsCmd::Disconnect`] to `news` (`Err`: why
/// the other nodes could not be reached; the API then answers for this node
/// only), and hands the disconnects other nodes relay to `news`. A failed
/// exchange drops the connection; the next command makes a new one.
pub(crate) async fn run(
    settings: RedisSettings,
    id: String,
    mut cmds: mpsc::UnboundedReceiver<CountsCmd>,
    news: impl Fn(CountsNews) + Clone + 'static,
) {
    let keys = Keys::new(&settings.prefix);
    tokio::task::spawn_local(listen(
        settings.clone(),
        [keys.orders.clone(), keys.presence.clone()],
        id.clone(),
        news.clone(),
    ));
    let mut link = Link {
        settings,
        keys,
        id,
        conn: None,
        at: None,
        // A node's hash may hold many channels: two array items each.
        dec: resp::Decoder::new(Limits {
            max_array: 8 * 1024 * 1024,
            ..Limits::default()
        }),
    };
    let mut failing = false;
    while let Some(cmd) = cmds.recv().await {
        let result = match cmd {
            CountsCmd::Write { counts, presence } => link.write(&counts, &presence).await,
            CountsCmd::Read {
                id,
                query,
                presence,
            } => {
                let got = link.read(&query, presence).await;
                let failed = got.as_ref().err().cloned();
                news(CountsNews::Counts(id, got));
                failed.map_or(Ok(()), Err)
            }
            CountsCmd::Disconnect { id, order } => {
                let got = link.relay(&order).await;
                let failed = got.as_ref().err().cloned();
                news(CountsNews::Relayed(id, got));
                failed.map_or(Ok(()), Err)
            }
            CountsCmd::Closed { req, closed } => link.closed(&req, closed).await,
            CountsCmd::Presence(e) => {
                let sent = link.presence(e).await;
                news(CountsNews::PresenceSent);
                sent
            }
        };
        match result {
            Ok(()) if failing => {
                failing = false;
                log!("throng: Redis counts link: working again");
            }
            Ok(()) => {}
            Err(e) => {
                link.conn = None;
                if !failing {
                    log!(
                        "throng: Redis counts link: {e}; API counts are this node's until it works"
                    );
                }
                failing = true;
            }
        }
    }
}

/// The subscriber connection of relayed disconnects and presence events:
/// `SUBSCRIBE` to `[orders, presence]` (plain pub/sub: on a Redis Cluster
/// a `PUBLISH` reaches every node's subscribers), each from another node
/// handed to `news`. Reconnects a second after a failure, for as long as
/// the server runs (presence events published meanwhile are missed; the
/// lists of `GET /api/channels/<c>` are rewritten every [`WRITE_EVERY`]).
async fn listen(
    settings: RedisSettings,
    channels: [String; 2],
    id: String,
    news: impl Fn(CountsNews),
) {
    let dec = resp::Decoder::default();
    loop {
        if let Err(e) = listen_once(&settings, &channels, &id, &news, &dec).await {
            log!("throng: Redis disconnect relay: {e}; listening again in 1s");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn listen_once(
    settings: &RedisSettings,
    [orders, presence]: &[String; 2],
    id: &str,
    news: &impl Fn(CountsNews),
    dec: &resp::Decoder,
) -> Result<(), String> {
    let addr = match &settings.topology {
        super::Topology::Cluster(seeds) => seeds[0].clone(),
        _ => settings.master().await.map_err(|e| e.to_string())?,
    };
    let s = settings.at(&addr);
    let (mut stream, mut buf) = throng_client::redis::open(&s.url, s.tls.as_ref(), TIMEOUT)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut out = Vec::new();
    resp::encode_command(
        &mut out,
        &[b"SUBSCRIBE", orders.as_bytes(), presence.as_bytes()],
    );
    throng_client::link::write_all(&mut stream, &out)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let v = throng_client::redis::read_value(&mut stream, &mut buf, dec)
            .await
            .map_err(|e| e.to_string())?;
        // ["message", channel, payload]; the subscribe confirmation is not one.
        let Value::Array(Some(items)) = &v else {
            continue;
        };
        let (Some(kind), Some(channel), Some(payload)) = (
            items.first().and_then(Value::as_bytes),
            items.get(1).and_then(Value::as_bytes),
            items.get(2),
        ) else {
            continue;
        };
        if kind.as_ref() != b"message" {
            continue;
        }
        if channel.as_ref() == presence.as_bytes() {
            match payload
                .as_bytes()
                .map(|p| serde_json::from_slice::<Relayed1>(p))
            {
                Some(Ok(r)) if r.from != id => news(CountsNews::Presence(r.event)),
                Some(Ok(_)) => {}
                _ => log!("throng: Redis presence relay: a message that is not an event; ignored"),
            }
            continue;
        }
        match payload
            .as_bytes()
            .map(|p| serde_json::from_slice::<Order>(p))
        {
            Some(Ok(order)) if order.from != id => news(CountsNews::Order(order)),
            Some(Ok(_)) => {}
            _ => log!("throng: Redis disconnect relay: a message that is not an order; ignored"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::Bulk(Some(bytes::Bytes::copy_from_slice(s.as_bytes())))
    }

    #[test]
    fn a_write_replaces_the_hash_in_one_transaction_tagged_to_one_slot() {
        let keys = Keys::new("throng:");
        let counts: Vec<(String, u64)> = (0..2500).map(|i| (format!("c{i}"), i)).collect();
        let cmds = write_commands(&keys, "n1", &counts, &[], 1_000);
        let names: Vec<&[u8]> = cmds.iter().map(|c| c[0].as_slice()).collect();
        assert_eq!(
            names,
            [
                &b"MULTI"[..],
                b"DEL",
                b"HSET",
                b"HSET",
                b"HSET",
                b"PEXPIRE",
                b"ZADD",
                b"ZREMRANGEBYSCORE",
                b"DEL",
                b"EXEC"
            ]
        );
        assert_eq!(cmds[1][1], b"{throng:#counts}:node:n1");
        assert_eq!(cmds[2].len(), 2 + 2 * HSET_BATCH);
        assert_eq!(cmds[4].len(), 2 + 2 * 500);
        assert_eq!(cmds[6][2], b"16000");
        assert_eq!(cmds[7][3], b"(1000");
        // Every key hashes to the same slot.
        let slot = |k: &[u8]| super::super::cluster::slot(k);
        assert_eq!(slot(&cmds[1][1]), slot(&cmds[6][1]));
        // Nothing to count: still a heartbeat, no HSET.
        let empty = write_commands(&keys, "n1", &[], &[], 1_000);
        assert!(empty.iter().all(|c| c[0] != b"HSET"));
    }

    #[test]
    fn presence_is_written_with_the_counts_and_read_back_by_subject() {
        let keys = Keys::new("throng:");
        let presence = vec![(
            "room.a".to_owned(),
            vec![("alice".to_owned(), 2), ("bob".to_owned(), 1)],
        )];
        let cmds = write_commands(&keys, "n1", &[], &presence, 1_000);
        let n = cmds.len();
        assert_eq!(cmds[n - 4][1], b"{throng:#counts}:presence:n1");
        assert_eq!(
            cmds[n - 3],
            [
                &b"HSET"[..],
                b"{throng:#counts}:presence:n1",
                b"room.a",
                br#"[["alice",2],["bob",1]]"#
            ]
        );
        assert_eq!(cmds[n - 2][0], b"PEXPIRE");
        let slot = |k: &[u8]| super::super::cluster::slot(k);
        assert_eq!(slot(&cmds[n - 3][1]), slot(&cmds[1][1]));
        let mut who = BTreeMap::new();
        add_presence(
            &mut who,
            &Value::Array(Some(vec![bulk(r#"[["alice",2],["bob",1]]"#)])),
        );
        add_presence(
            &mut who,
            &Value::Array(Some(vec![bulk(r#"[["alice",1]]"#)])),
        );
        add_presence(&mut who, &Value::Array(Some(vec![Value::Bulk(None)])));
        add_presence(&mut who, &Value::Array(Some(vec![bulk("not json")])));
        assert_eq!(
            who.into_iter().collect::<Vec<_>>(),
            [("alice".to_owned(), 3), ("bob".to_owned(), 1)]
        );
    }

    #[test]
    fn other_nodes_hashes_sum_by_name_within_the_page() {
        let q = Query::Channels {
            prefix: "room.".into(),
            after: "room.a".into(),
            limit: 1,
        };
        let mut sum = BTreeMap::new();
        let h1 = Value::Array(Some(vec![
            bulk("room.a"),
            bulk("5"),
            bulk("room.b"),
            bulk("2"),
            bulk("news"),
            bulk("9"),
        ]));
        let h2 = Value::Array(Some(vec![
            bulk("room.b"),
            bulk("3"),
            bulk("room.c"),
            bulk("x"),
        ]));
        add_hash(&mut sum, &h1, &q);
        add_hash(&mut sum, &h2, &q);
        assert_eq!(sum.into_iter().collect::<Vec<_>>(), [("room.b".into(), 5)]);
        let mut local = Part {
            channels: vec![("room.c".into(), 1), ("room.d".into(), 1)],
            ..Part::default()
        };
        let remote = Remote {
            channels: vec![("room.b".into(), 5)],
            presence: Vec::new(),
        };
        merge(&mut local, remote, &q);
        assert_eq!(
            local.channels,
            [("room.b".into(), 5), ("room.c".into(), 1)],
            "the first limit + 1 names of the union"
        );
    }
}
