//! MQTT persistent sessions in Redis (`--redis`, pattern mode, one Redis),
//! without sockets: the scripts and the reading of their replies, so a
//! client that comes back to any node finds its session, and a node that
//! dies loses none.
//!
//! A session away is three things under the node's prefix (`#` is no
//! channel byte, so no channel's stream shares a key):
//!
//! - `#s:<hash>`, a hash: `r` its record ([`encode_record`]: subscriptions,
//!   owed PUBRELs, the client's QoS 2 ids awaiting PUBREL), `n` the nonce
//!   of the park that wrote it, `ready` (`1` once the parking node added
//!   what its connection had not received), `o` the token of the
//!   connection that parked it, and one `f:<filter>` field per
//!   subscription with its options. Its TTL is the Session Expiry
//!   Interval. While a connection holds the session the key holds its
//!   token `o` alone (a take's or a clean start's nonce), so a resume
//!   elsewhere waits for its park and a stale park is refused.
//! - `#sq:<hash>`, a list: the messages queued for it, in order, each
//!   [`entry`]'s bytes. Same TTL.
//! - the index every publish reads: `#sf:<filter>`, a hash of the sessions
//!   away subscribed to that filter (field the hash, value the options),
//!   and `#sw:<n>:<levels>`, the wildcard filters among them by their
//!   first `n` literal levels (before their first wildcard).
//!
//! Who queues: the node that publishes, in the same script as its
//! `PUBLISH` ([`publish_script`]), so a message is queued for every
//! session away the moment Redis publishes it, whichever node is alive,
//! and the publisher's answer (PUBACK, HTTP 200) comes after both. A park
//! and a take publish a mark on [`MARKS`] in the same script: on the node
//! that asked, the mark's place among the relayed messages tells which
//! came before (the connection's, or the queue's) and which after.

use bytes::{BufMut, Bytes, BytesMut};
use throng_proto::resp::{self, Value};

use super::error::ReplyError;

/// The Redis channel (after the prefix) of park and take marks: `p` or
/// `t`, then the nonce in decimal.
pub(crate) const MARKS: &str = "#sessions";

/// Lua: the subscription index, shared by every script. A wildcard
/// filter is listed in the set of its literal levels (those before its
/// first wildcard: `#sw:<count>:<levels>`), so a publish reads one set per
/// level of its topic, whatever the number of filters elsewhere.
const INDEX: &str = r"
local function split(s)
  local r = {}
  for p in string.gmatch(s .. '/', '([^/]*)/') do r[#r+1] = p end
  return r
end
local function wset(pfx, levels, k)
  return pfx .. '#sw:' .. k .. ':' .. table.concat(levels, '/', 1, k)
end
local function wkey(pfx, f)
  local l = split(f)
  for k = 1, #l do
    if l[k] == '+' or l[k] == '#' then return wset(pfx, l, k - 1) end
  end
  return nil
end
local function unlist(pfx, f)
  if redis.call('EXISTS', pfx .. '#sf:' .. f) == 0 then
    local w = wkey(pfx, f)
    if w then redis.call('SREM', w, f) end
  end
end
local function unindex(pfx, sid, rec)
  local h = redis.call('HGETALL', rec)
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 2) == 'f:' then
      local f = string.sub(h[i], 3)
      redis.call('HDEL', pfx .. '#sf:' .. f, sid)
      unlist(pfx, f)
    end
  end
end
";

/// Lua run after a publish whose payload is `P`: the filters that could
/// match its topic (the last four arguments: prefix, topic, QoS, limit),
/// read with no table or function made, as most publishes match none.
const SCAN: &str = r"
local pfx, topic = ARGV[#ARGV-3], ARGV[#ARGV-2]
local exact = redis.call('HGETALL', pfx .. '#sf:' .. topic)
local wild = redis.call('SMEMBERS', pfx .. '#sw:0:')
local k, at = 0, 0
while true do
  local e = string.find(topic, '/', at + 1, true)
  k = k + 1
  for _, f in ipairs(redis.call('SMEMBERS', pfx .. '#sw:' .. k .. ':' .. string.sub(topic, 1, (e or 0) - 1))) do
    wild[#wild+1] = f
  end
  if not e then break end
  at = e
end
";

/// Lua run when [`SCAN`] found filters, after [`INDEX`]: queues the
/// message for every session away that one matches (at the lower of the
/// two QoS), up to the queue limit. An index entry whose session is gone
/// (expired) is removed on the way.
const QUEUE: &str = r"
  local qos, limit = tonumber(ARGV[#ARGV-1]), tonumber(ARGV[#ARGV])
  local function matches(f, t)
    local a, b = split(f), split(t)
    if string.byte(t, 1) == 36 and (a[1] == '+' or a[1] == '#') then return false end
    for i = 1, #a do
      if a[i] == '#' then return true end
      if b[i] == nil or (a[i] ~= '+' and a[i] ~= b[i]) then return false end
    end
    return #a == #b
  end
  local hits = {}
  local function add(f, h)
    for i = 1, #h, 2 do
      if redis.call('HEXISTS', pfx .. '#s:' .. h[i], 'f:' .. f) == 1 then
        local o = tonumber(h[i+1]) % 4
        if hits[h[i]] == nil or hits[h[i]] < o then hits[h[i]] = o end
      else
        redis.call('HDEL', pfx .. '#sf:' .. f, h[i])
        unlist(pfx, f)
      end
    end
  end
  add(topic, exact)
  for _, f in ipairs(wild) do
    if f ~= topic and matches(f, topic) then add(f, redis.call('HGETALL', pfx .. '#sf:' .. f)) end
  end
  for sid, o in pairs(hits) do
    local q = math.min(o, qos)
    local key = pfx .. '#sq:' .. sid
    if q > 0 and redis.call('LLEN', key) < limit then
      redis.call('RPUSH', key, string.char(q, 0, 0) .. topic .. '\n' .. P)
      redis.call('PEXPIRE', key, redis.call('PTTL', pfx .. '#s:' .. sid))
    end
  end
";

/// A publish script's text and its SHA-1 in hex (what `EVALSHA` names).
struct Script {
    text: String,
    sha: String,
}

impl Script {
    fn new(text: String) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, text.as_bytes());
        let sha = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        Self { text, sha }
    }
}

/// The publish script that queues, with history or without: made once.
fn script(history: bool) -> &'static Script {
    static PLAIN: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    static HISTORY: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    if history {
        HISTORY.get_or_init(|| Script::new(history_script()))
    } else {
        PLAIN.get_or_init(|| Script::new(plain_script()))
    }
}

/// Appends `SCRIPT LOAD` of the publish script (with history or
/// without): sent once per connection before the first publish that
/// queues, which then names it by its SHA-1 (`EVALSHA`), so its text does
/// not go with every publish.
pub(crate) fn load(out: &mut BytesMut, history: bool) {
    resp::encode_command(out, &[b"SCRIPT", b"LOAD", script(history).text.as_bytes()]);
}

/// Whether a reply says Redis no longer has the script (`SCRIPT FLUSH`):
/// the connection loads it again before its next publish.
pub(crate) fn lost_script(v: &Value) -> bool {
    match v {
        Value::Error(e) => e.starts_with(b"NOSCRIPT"),
        Value::Array(Some(items)) => items.iter().any(lost_script),
        _ => false,
    }
}

/// [`SCAN`], then [`INDEX`] and [`QUEUE`] when it found filters.
fn queue() -> String {
    format!("{SCAN}if #exact > 0 or #wild > 0 then\n{INDEX}{QUEUE}end\n")
}

/// A plain publish that queues: KEYS = the channel; ARGV = payload,
/// prefix, topic, QoS, limit. Answers `PUBLISH`'s receiver count.
fn plain_script() -> String {
    format!(
        "local n = redis.call('PUBLISH', KEYS[1], ARGV[1])\nlocal P = ARGV[1]\n{}return n\n",
        queue()
    )
}

/// The history script ([`crate::stream`]) that queues too: its
/// arguments, then prefix, topic, QoS, limit; its answer.
fn history_script() -> String {
    let base = crate::stream::PUBLISH_SCRIPT.replacen("return {", "local r = {", 1);
    format!("{base}\nlocal P = ARGV[2]\n{}return r\n", queue())
}

/// Appends the command that publishes `payload` (as it goes to Redis) on
/// `channel` at `qos` and queues it for the sessions away: the plain or
/// the history publish as a script ([`crate::stream::publish`]'s
/// arguments when `history` holds them), by its SHA-1 ([`load`] first).
pub(crate) fn publish(
    out: &mut BytesMut,
    prefix: &str,
    channel: &str,
    payload: &[u8],
    qos: u8,
    limit: usize,
    history: Option<crate::stream::StreamLimits>,
) {
    let key = format!("{prefix}{channel}");
    let (qos, limit) = (qos.to_string(), limit.to_string());
    let tail: [&[u8]; 4] = [
        prefix.as_bytes(),
        channel.as_bytes(),
        qos.as_bytes(),
        limit.as_bytes(),
    ];
    match history {
        Some(l) => {
            let sha = script(true).sha.as_bytes();
            crate::stream::script_command(out, b"EVALSHA", sha, &key, payload, l, &tail);
        }
        None => {
            let sha = script(false).sha.as_bytes();
            let mut args: Vec<&[u8]> = vec![b"EVALSHA", sha, b"1", key.as_bytes(), payload];
            args.extend(tail);
            resp::encode_command(out, &args);
        }
    }
}

/// One subscription of a session, as kept: its filter and its options
/// byte (QoS in the low two bits).
pub(crate) type Filter = (String, u8);

/// A session's record: what it needs on its return besides its queue.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// Its subscriptions (shared ones too).
    pub(crate) subs: Vec<Filter>,
    /// PUBRELs owed (QoS 2 deliveries received, awaiting PUBCOMP).
    pub(crate) releases: Vec<u16>,
    /// The client's QoS 2 PUBLISHes relayed, awaiting its PUBREL.
    pub(crate) received: Vec<u16>,
}

/// Version byte in front of a record.
const RECORD_V1: u8 = 1;

/// A record's bytes: the version, then each list with a 16-bit count; a
/// filter is its options, a 16-bit length and its bytes.
pub(crate) fn encode_record(r: &Record) -> Bytes {
    let mut out = BytesMut::new();
    out.put_u8(RECORD_V1);
    let n = |len: usize| u16::try_from(len).unwrap_or(u16::MAX);
    out.put_u16(n(r.subs.len()));
    for (f, o) in r.subs.iter().take(usize::from(u16::MAX)) {
        out.put_u8(*o);
        out.put_u16(n(f.len()));
        out.put_slice(&f.as_bytes()[..usize::from(n(f.len()))]);
    }
    for ids in [&r.releases, &r.received] {
        out.put_u16(n(ids.len()));
        for id in ids.iter().take(usize::from(u16::MAX)) {
            out.put_u16(*id);
        }
    }
    out.freeze()
}

/// The record in `b`; `None` when it is not one this version wrote.
pub(crate) fn decode_record(b: &[u8]) -> Option<Record> {
    let mut at = 0;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = b.get(at..at + n)?;
        at += n;
        Some(s)
    };
    let word = |s: &[u8]| u16::from_be_bytes([s[0], s[1]]);
    if take(1)? != [RECORD_V1] {
        return None;
    }
    let mut r = Record::default();
    for _ in 0..word(take(2)?) {
        let o = take(1)?[0];
        let len = usize::from(word(take(2)?));
        let f = std::str::from_utf8(take(len)?).ok()?.to_owned();
        r.subs.push((f, o));
    }
    for _ in 0..word(take(2)?) {
        r.releases.push(word(take(2)?));
    }
    for _ in 0..word(take(2)?) {
        r.received.push(word(take(2)?));
    }
    Some(r)
}

/// A queued message's bytes: the QoS it goes at, the packet id it was
/// sent with (0: never), the channel, a newline (no channel holds one),
/// then what was published to Redis (sealed or bare).
pub(crate) fn entry(qos: u8, id: u16, channel: &str, raw: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(4 + channel.len() + raw.len());
    out.put_u8(qos);
    out.put_u16(id);
    out.put_slice(channel.as_bytes());
    out.put_u8(b'\n');
    out.put_slice(raw);
    out.freeze()
}

/// An [`entry`] opened: QoS, packet id, channel, what was published.
pub(crate) fn open_entry(b: &Bytes) -> Option<(u8, u16, String, Bytes)> {
    let qos = *b.first()?;
    let id = u16::from_be_bytes([*b.get(1)?, *b.get(2)?]);
    let nl = b.get(3..)?.iter().position(|&c| c == b'\n')? + 3;
    let channel = std::str::from_utf8(&b[3..nl]).ok()?.to_owned();
    Some((qos, id, channel, b.slice(nl + 1..)))
}

/// The park script: ARGV = prefix, hash, nonce, TTL ms, record, owner,
/// then each indexed filter and its options. Ends any older session of
/// the hash, unless another connection owns it now (`o`, a later
/// connect's token): then this park is stale and dropped (its mark
/// still goes, so its node stops waiting).
const PARK: &str = r"
local pfx, sid, nonce, ttl, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6]
local rec, key = pfx .. '#s:' .. sid, pfx .. '#sq:' .. sid
local o = redis.call('HGET', rec, 'o')
if o and o ~= owner then
  redis.call('PUBLISH', pfx .. '#sessions', 'p' .. nonce)
  return 0
end
unindex(pfx, sid, rec)
redis.call('DEL', rec, key)
redis.call('HSET', rec, 'r', ARGV[5], 'n', nonce, 'ready', '0', 'o', owner)
for i = 7, #ARGV, 2 do
  redis.call('HSET', rec, 'f:' .. ARGV[i], ARGV[i+1])
  redis.call('HSET', pfx .. '#sf:' .. ARGV[i], sid, ARGV[i+1])
  local w = wkey(pfx, ARGV[i])
  if w then redis.call('SADD', w, ARGV[i]) end
end
redis.call('PEXPIRE', rec, ttl)
redis.call('PUBLISH', pfx .. '#sessions', 'p' .. nonce)
return 1
";

/// What the parking node adds in front of the queue once its mark came
/// (the deliveries its connection had not received): ARGV = prefix, hash,
/// nonce, limit, entries. Only onto its own park; the session is ready.
const FRONT: &str = r"
local pfx, sid, nonce, limit = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local rec, key = pfx .. '#s:' .. sid, pfx .. '#sq:' .. sid
if redis.call('HGET', rec, 'n') ~= nonce then return 0 end
for i = #ARGV, 5, -1 do redis.call('LPUSH', key, ARGV[i]) end
redis.call('LTRIM', key, 0, limit - 1)
redis.call('HSET', rec, 'ready', '1')
if redis.call('EXISTS', key) == 1 then redis.call('PEXPIRE', key, redis.call('PTTL', rec)) end
return 1
";

/// The take script: ARGV = prefix, hash, nonce, force, TTL ms. `{0}`: no
/// session; `{1}`: another connection holds it (an owner mark without a
/// record) or its park is not ready, and not forced; `{2, record,
/// queue}`: taken out of Redis, with a mark. Either way the taker owns
/// the session from then on (`o`: its nonce, for the TTL), so the park
/// of a connection it took over is refused.
const TAKE: &str = r"
local pfx, sid, nonce, force, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local rec, key = pfx .. '#s:' .. sid, pfx .. '#sq:' .. sid
local function own()
  if tonumber(ttl) > 0 then
    redis.call('HSET', rec, 'o', nonce)
    redis.call('PEXPIRE', rec, ttl)
  end
end
local r = redis.call('HGET', rec, 'r')
if not r then
  if redis.call('EXISTS', rec) == 1 and force ~= '1' then return {1} end
  redis.call('DEL', rec, key)
  own()
  return {0}
end
if redis.call('HGET', rec, 'ready') ~= '1' and force ~= '1' then return {1} end
local q = redis.call('LRANGE', key, 0, -1)
unindex(pfx, sid, rec)
redis.call('DEL', rec, key)
own()
redis.call('PUBLISH', pfx .. '#sessions', 't' .. nonce)
return {2, r, q}
";

/// The drop script: ARGV = prefix, hash, token, mode, TTL ms. Mode `c` (a
/// clean start) ends the session whoever owns it, and with a TTL the
/// token owns it from then on; mode `e` (the end of a connection whose
/// session ends with it) only if the token owns it.
const DROP: &str = r"
local pfx, sid, token, mode, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local rec = pfx .. '#s:' .. sid
local o = redis.call('HGET', rec, 'o')
if mode == 'e' and o and o ~= token then return 0 end
unindex(pfx, sid, rec)
redis.call('DEL', rec, pfx .. '#sq:' .. sid)
if ttl > 0 then
  redis.call('HSET', rec, 'o', token)
  redis.call('PEXPIRE', rec, ttl)
end
return 1
";

/// A session's hash as its keys spell it.
fn sid(hash: u64) -> String {
    format!("{hash:016x}")
}

fn eval(out: &mut BytesMut, body: &str, args: &[&[u8]]) {
    let script = format!("{INDEX}{body}");
    let mut all: Vec<&[u8]> = vec![b"EVAL", script.as_bytes(), b"0"];
    all.extend_from_slice(args);
    resp::encode_command(out, &all);
}

/// A park's arguments.
pub(crate) struct Park<'a> {
    /// The session.
    pub(crate) hash: u64,
    /// The park's own nonce (its mark's).
    pub(crate) nonce: u64,
    /// How long it is kept.
    pub(crate) ttl_ms: u64,
    /// The token of the connection that parks it (its take's nonce).
    pub(crate) owner: u64,
    pub(crate) record: &'a Record,
    /// The filters publishes look up (not shared subscriptions').
    pub(crate) indexed: &'a [Filter],
}

/// Appends a park.
pub(crate) fn park(out: &mut BytesMut, prefix: &str, p: &Park<'_>) {
    let (sid, nonce, ttl) = (
        sid(p.hash),
        p.nonce.to_string(),
        p.ttl_ms.max(1).to_string(),
    );
    let owner = p.owner.to_string();
    let rec = encode_record(p.record);
    let indexed = p.indexed;
    let opts: Vec<String> = indexed.iter().map(|(_, o)| o.to_string()).collect();
    let mut args: Vec<&[u8]> = vec![
        prefix.as_bytes(),
        sid.as_bytes(),
        nonce.as_bytes(),
        ttl.as_bytes(),
        &rec,
        owner.as_bytes(),
    ];
    for ((f, _), o) in indexed.iter().zip(&opts) {
        args.push(f.as_bytes());
        args.push(o.as_bytes());
    }
    eval(out, PARK, &args);
}

/// Appends what goes in front of park `nonce`'s queue.
pub(crate) fn front(
    out: &mut BytesMut,
    prefix: &str,
    hash: u64,
    nonce: u64,
    limit: usize,
    entries: &[Bytes],
) {
    let (sid, nonce, limit) = (sid(hash), nonce.to_string(), limit.to_string());
    let mut args: Vec<&[u8]> = vec![
        prefix.as_bytes(),
        sid.as_bytes(),
        nonce.as_bytes(),
        limit.as_bytes(),
    ];
    args.extend(entries.iter().map(|e| &e[..]));
    eval(out, FRONT, &args);
}

/// Appends a take of session `hash`, owned for `ttl_ms` by `nonce` then
/// (0: not at all, the session ends with the connection); `force`: even
/// if another connection holds it or its park is not ready (that
/// connection's worker or node died).
pub(crate) fn take(
    out: &mut BytesMut,
    prefix: &str,
    hash: u64,
    nonce: u64,
    force: bool,
    ttl_ms: u64,
) {
    let (sid, nonce, ttl) = (sid(hash), nonce.to_string(), ttl_ms.to_string());
    let force: &[u8] = if force { b"1" } else { b"0" };
    let args = [
        prefix.as_bytes(),
        sid.as_bytes(),
        nonce.as_bytes(),
        force,
        ttl.as_bytes(),
    ];
    eval(out, TAKE, &args);
}

/// Appends the end of session `hash`: `clean` (a clean start) whoever
/// owns it, `token` owning it for `ttl_ms` then (0: nobody); else only
/// if `token` owns it.
pub(crate) fn drop_session(
    out: &mut BytesMut,
    prefix: &str,
    hash: u64,
    token: u64,
    clean: bool,
    ttl_ms: u64,
) {
    let (sid, token, ttl) = (sid(hash), token.to_string(), ttl_ms.to_string());
    let mode: &[u8] = if clean { b"c" } else { b"e" };
    let args = [
        prefix.as_bytes(),
        sid.as_bytes(),
        token.as_bytes(),
        mode,
        ttl.as_bytes(),
    ];
    eval(out, DROP, &args);
}

/// A mark's kind and nonce.
pub(crate) fn open_mark(payload: &[u8]) -> Option<(u8, u64)> {
    let (&kind, rest) = payload.split_first()?;
    let nonce = std::str::from_utf8(rest).ok()?.parse().ok()?;
    matches!(kind, b'p' | b't').then_some((kind, nonce))
}

/// What a take found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// No session in Redis.
    Nothing,
    /// Its park has not added its connection's deliveries yet.
    NotReady,
    /// The session, out of Redis now: its record and its queue's entries.
    Session(Record, Vec<Bytes>),
}

/// Reads a take's reply; any other script's reply is `Ok(None)`.
pub(crate) fn taken(v: Value) -> Result<Option<Taken>, ReplyError> {
    let items = match v {
        Value::Array(Some(items)) => items,
        Value::Error(e) => {
            return Err(ReplyError::Refused(
                String::from_utf8_lossy(&e).into_owned(),
            ));
        }
        _ => return Ok(None),
    };
    let mut it = items.into_iter();
    match it.next() {
        Some(Value::Integer(0)) => Ok(Some(Taken::Nothing)),
        Some(Value::Integer(1)) => Ok(Some(Taken::NotReady)),
        Some(Value::Integer(2)) => {
            let record = match it.next() {
                Some(Value::Bulk(Some(b))) => decode_record(&b),
                _ => None,
            };
            let Some(record) = record else {
                return Err(ReplyError::Unexpected(
                    "a session record this version cannot read".into(),
                ));
            };
            let entries = match it.next() {
                Some(Value::Array(Some(q))) => q
                    .into_iter()
                    .filter_map(|e| match e {
                        Value::Bulk(Some(b)) => Some(b),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            Ok(Some(Taken::Session(record, entries)))
        }
        other => Err(ReplyError::Unexpected(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_and_an_entry_come_back_as_they_went() {
        let r = Record {
            subs: vec![("a/+".into(), 1), ("$share/g/b".into(), 2)],
            releases: vec![7, 65_535],
            received: vec![1],
        };
        assert_eq!(decode_record(&encode_record(&r)), Some(r));
        assert_eq!(decode_record(b"\x02"), None, "a later version");
        assert_eq!(
            decode_record(b"\x01\x00\x01\x01\x00\x09a"),
            None,
            "cut short"
        );
        let e = entry(2, 513, "a/b", b"x\ny");
        assert_eq!(
            open_entry(&e),
            Some((2, 513, "a/b".to_owned(), Bytes::from_static(b"x\ny")))
        );
        assert_eq!(open_entry(&Bytes::from_static(b"\x01\x00")), None);
    }

    #[test]
    fn marks_and_take_replies_are_read_and_bad_ones_refused() {
        assert_eq!(open_mark(b"p42"), Some((b'p', 42)));
        assert_eq!(open_mark(b"x42"), None);
        assert_eq!(open_mark(b"t"), None);
        let int = |n| Value::Integer(n);
        assert_eq!(taken(int(1)).unwrap(), None, "a park's or front's reply");
        assert_eq!(
            taken(Value::Array(Some(vec![int(1)]))).unwrap(),
            Some(Taken::NotReady)
        );
        let rec = encode_record(&Record::default());
        let got = taken(Value::Array(Some(vec![
            int(2),
            Value::Bulk(Some(rec)),
            Value::Array(Some(vec![Value::Bulk(Some(Bytes::from_static(b"e")))])),
        ])))
        .unwrap();
        assert_eq!(
            got,
            Some(Taken::Session(
                Record::default(),
                vec![Bytes::from_static(b"e")]
            ))
        );
        assert!(taken(Value::Array(Some(vec![int(2), Value::Bulk(None)]))).is_err());
    }
}
