//! The server API (docs/api.md), served where publishing is, with the
//! same credentials:
//!
//! - `GET /api/channels?prefix=&limit=&after=`: channels and their subscribers, by name.
//! - `GET /api/channels/<c>`: one channel's subscribers and last message id.
//! - `GET /api/history/<c>?since=&limit=`: what the history kept.
//! - `POST /api/disconnect`: close a channel's subscribers, or a token
//!   subject's connections, with a close code.
//! - `POST /api/publish`: one message to several channels.
//!
//! Counts are this node's: the supervisor asks every worker
//! ([`crate::api`]). Every answer is JSON; a bad request gets
//! `{"error": ...}` with a 4xx that says what to change.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use throng_proto::http::{BodyKind, Request};

use super::publish::read_message;
use super::reply;
use crate::api::{MAX_LIMIT, Part, Query};
use crate::channel;
use crate::history::MessageId;
use crate::tls::stream::Io;
use crate::worker::gate::{self, Caller};
use crate::worker::state::Worker;
use crate::worker::supervisor_link::PublishError;

/// Where the API's paths start.
pub(crate) const PREFIX: &str = "/api/";

/// Page size when `?limit=` is not given.
const DEFAULT_LIMIT: usize = 100;

/// The most channels one `POST /api/publish` names.
const MAX_BATCH: usize = 1000;

/// The longest close reason: a close frame's payload is at most 125 bytes.
const MAX_REASON: usize = 123;

/// A request the API refuses: its status and why.
type Bad = (u16, String);

fn bad(status: u16, why: impl Into<String>) -> Bad {
    (status, why.into())
}

/// Any request under `/api/`. Returns whether the connection stays open.
pub(crate) async fn serve(w: &Worker, stream: &mut Io, req: &Request, buf: &mut Vec<u8>) -> bool {
    w.counters.http_request("api");
    let caller = match gate::caller(w, req) {
        Ok(c) => c,
        Err(why) => {
            gate::refuse(w, stream, why).await;
            return false;
        }
    };
    // A body this request carries but the route does not read would be
    // taken for the next request: such a connection closes after the answer.
    let mut read = matches!(req.body_kind(), Ok(BodyKind::Empty | BodyKind::Length(0)));
    let (path, query) = req.target.split_once('?').unwrap_or((&req.target, ""));
    let rest = &path[PREFIX.len()..];
    let answer = match (req.method.as_str(), rest) {
        ("GET", "channels") => channels(w, &caller, query).await,
        ("GET", r) if r.starts_with("channels/") => one_channel(w, &caller, path).await,
        ("GET", r) if r.starts_with("history/") => history(w, &caller, path, query).await,
        ("POST", "disconnect" | "publish") => {
            let m = match read_message(w, stream, req, buf, PREFIX).await {
                Ok(m) => m,
                Err(keep) => return keep,
            };
            read = true;
            match rest {
                "disconnect" => disconnect(w, &caller, &m.body).await,
                _ => publish(w, &caller, &m.body).await,
            }
        }
        (_, "disconnect" | "publish") => Err(bad(405, format!("use POST for /api/{rest}"))),
        (_, r) if r == "channels" || r.starts_with("channels/") || r.starts_with("history/") => {
            Err(bad(405, format!("use GET for /api/{rest}")))
        }
        _ => Err(bad(
            404,
            "no such API endpoint: GET /api/channels, GET /api/channels/<c>, GET /api/history/<c>, \
             POST /api/disconnect, POST /api/publish (docs/api.md)",
        )),
    };
    let (status, body) = match answer {
        Ok(v) => (200, v),
        Err((status, why)) => {
            w.counters.handshake_failed("api_bad_request");
            (status, json!({ "error": why }))
        }
    };
    let body = body.to_string() + "\n";
    reply(
        w,
        stream,
        status,
        "application/json",
        body.as_bytes(),
        req.keep_alive() && read,
    )
    .await
}

/// The value of `key` in a query string, if given.
fn param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|p| p.split_once('=').or(Some((p, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// `?limit=`: 1 to [`MAX_LIMIT`], [`DEFAULT_LIMIT`] when absent.
fn limit(query: &str) -> Result<usize, Bad> {
    match param(query, "limit") {
        None => Ok(DEFAULT_LIMIT),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(bad(
                400,
                format!("limit takes a number from 1 to {MAX_LIMIT}, not {v:?}"),
            )),
        },
    }
}

/// A channel name from a query parameter or path (as a publish names it).
fn channel_name(name: &str, what: &str) -> Result<String, Bad> {
    if name.is_empty() {
        return Ok(String::new());
    }
    channel::validate(name)
        .map(str::to_owned)
        .map_err(|e| bad(400, format!("{what}: {e}")))
}

/// Asks the supervisor `q`; 503 when it does not answer.
async fn ask(w: &Worker, q: &Query) -> Result<Part, Bad> {
    let body = serde_json::to_vec(q).unwrap_or_default();
    let answer = w.supervisor.api(Bytes::from(body)).await;
    answer
        .and_then(|a| serde_json::from_slice(&a).ok())
        .ok_or_else(|| bad(503, "supervisor unavailable"))
}

/// What the counts cover when the supervisor did not say `"cluster"`: with
/// Redis, other nodes' subscribers are then not in them.
fn scope(w: &Worker) -> &'static str {
    if w.cfg.redis_mode.is_some() {
        "node"
    } else {
        "server"
    }
}

/// `GET /api/channels`.
async fn channels(w: &Worker, caller: &Caller, query: &str) -> Result<Value, Bad> {
    let limit = limit(query)?;
    let prefix = channel_name(param(query, "prefix").unwrap_or(""), "prefix")?;
    let after = channel_name(param(query, "after").unwrap_or(""), "after")?;
    let q = Query::Channels {
        prefix,
        after,
        limit,
    };
    let part = ask(w, &q).await?;
    let more = part.channels.len() > limit;
    let page = &part.channels[..part.channels.len().min(limit)];
    // A token lists only the channels it may publish to; the page's cursor
    // still moves past the others.
    let list: Vec<Value> = page
        .iter()
        .filter(|(name, _)| caller.may_publish(name).is_ok())
        .map(|(name, n)| json!({ "name": name, "subscribers": n }))
        .collect();
    let next = if more {
        page.last().map(|(n, _)| n.clone())
    } else {
        None
    };
    let scope = part.scope.as_deref().unwrap_or(scope(w));
    Ok(json!({ "channels": list, "next": next, "scope": scope }))
}

/// The channel named after `prefix` in `path`, if the caller may see it.
fn path_channel(caller: &Caller, path: &str, prefix: &str) -> Result<String, Bad> {
    let name = channel::from_target(path, prefix).map_err(|e| bad(400, e.to_string()))?;
    caller
        .may_publish(name)
        .map_err(|why| bad(why.status(), why.to_string()))?;
    Ok(name.to_owned())
}

/// The most subjects `GET /api/channels/<c>` lists in `presence`.
const MAX_PRESENCE: usize = 1000;

/// Adds a channel's presence to its answer: this node's subjects (first
/// [`MAX_PRESENCE`] by name, `presence_truncated` when there were more).
fn presence(v: &mut Value, mut who: Vec<(String, u64)>, scope: &str) {
    let truncated = who.len() > MAX_PRESENCE;
    who.truncate(MAX_PRESENCE);
    let list: Vec<Value> = who
        .into_iter()
        .map(|(sub, n)| json!({ "sub": sub, "connections": n }))
        .collect();
    v["presence"] = list.into();
    v["presence_scope"] = scope.into();
    v["presence_truncated"] = truncated.into();
}

/// `GET /api/channels/<c>`.
async fn one_channel(w: &Worker, caller: &Caller, path: &str) -> Result<Value, Bad> {
    let name = path_channel(caller, path, "/api/channels/")?;
    let part = ask(w, &Query::Channel { name: name.clone() }).await?;
    let subscribers: u64 = part.channels.iter().map(|(_, n)| n).sum();
    let scope = part.scope.as_deref().unwrap_or(scope(w));
    let mut v = json!({ "name": name, "subscribers": subscribers, "scope": scope });
    if crate::worker::api::presence_on(w, &name) {
        // With Redis: every node's subjects, as of each one's last write.
        let who = if scope == "cluster" {
            "cluster"
        } else {
            "node"
        };
        presence(&mut v, part.presence.map(|p| *p).unwrap_or_default(), who);
    }
    if w.cfg.history > 0 {
        let (_, kept) = w
            .supervisor
            .history(&name, MessageId::NONE)
            .await
            .ok_or_else(|| bad(503, "supervisor unavailable"))?;
        v["last_id"] = kept.last().map(|k| k.id.to_string()).into();
    }
    Ok(v)
}

/// `GET /api/history/<c>?since=&limit=`: the kept messages after `since`
/// (all when absent), oldest first, at most `limit`; `next` is the
/// `since` of the next page.
async fn history(w: &Worker, caller: &Caller, path: &str, query: &str) -> Result<Value, Bad> {
    let name = path_channel(caller, path, "/api/history/")?;
    if w.cfg.history == 0 {
        return Err(bad(
            404,
            "this server keeps no history (start it with --history N)",
        ));
    }
    let limit = limit(query)?;
    let since = match param(query, "since") {
        None | Some("") => MessageId::NONE,
        Some(s) => s
            .parse()
            .map_err(|e: crate::history::BadId| bad(400, e.to_string()))?,
    };
    let (complete, kept) = w
        .supervisor
        .history(&name, since)
        .await
        .ok_or_else(|| bad(503, "supervisor unavailable"))?;
    let more = kept.len() > limit;
    let messages: Vec<Value> = kept
        .iter()
        .take(limit)
        .map(|k| match std::str::from_utf8(&k.payload) {
            Ok(text) if k.text => json!({ "id": k.id.to_string(), "data": text }),
            _ => {
                use base64::Engine as _;
                let b64 = base64::engine::general_purpose::STANDARD.encode(&k.payload);
                json!({ "id": k.id.to_string(), "data_base64": b64 })
            }
        })
        .collect();
    let next = more
        .then(|| messages.last().map(|m| m["id"].clone()))
        .flatten();
    // `complete` says whether `since` was still in the history: when it
    // is false, messages after it were dropped before these.
    let complete = since.is_none() || complete;
    Ok(json!({ "channel": name, "messages": messages, "next": next, "complete": complete }))
}

/// `POST /api/disconnect`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DisconnectBody {
    channel: Option<String>,
    /// The token subject whose connections close, whatever their channels.
    sub: Option<String>,
    #[serde(default = "normal_close")]
    code: u16,
    #[serde(default)]
    reason: String,
}

fn normal_close() -> u16 {
    1000
}

/// Whether a server may send `code` in a close frame (RFC 6455 section 7.4).
fn sendable(code: u16) -> bool {
    matches!(code, 1000 | 1001 | 1008 | 1011..=1013 | 3000..=4999)
}

/// `POST /api/disconnect`: by channel or by token subject.
async fn disconnect(w: &Worker, caller: &Caller, body: &[u8]) -> Result<Value, Bad> {
    let d: DisconnectBody = serde_json::from_slice(body)
        .map_err(|e| bad(400, format!("the body is not a disconnect request: {e}")))?;
    if !sendable(d.code) {
        return Err(bad(
            400,
            format!(
                "code {} cannot be sent: use 1000, 1001, 1008, 1011-1013 or 3000-4999",
                d.code
            ),
        ));
    }
    if d.reason.len() > MAX_REASON {
        return Err(bad(400, format!("reason is over {MAX_REASON} bytes")));
    }
    let (q, mut v) = match (d.channel, d.sub) {
        (Some(c), None) => {
            let channel = channel_name(&c, "channel")?;
            if channel.is_empty() {
                return Err(bad(400, "channel: empty name"));
            }
            caller
                .may_publish(&channel)
                .map_err(|why| bad(why.status(), why.to_string()))?;
            let v = json!({ "channel": channel });
            let q = Query::Disconnect {
                channel,
                code: d.code,
                reason: d.reason,
            };
            (q, v)
        }
        (None, Some(sub)) => {
            subject(caller, &sub)?;
            let v = json!({ "sub": sub });
            let q = Query::DisconnectSubject {
                sub,
                code: d.code,
                reason: d.reason,
            };
            (q, v)
        }
        (Some(_), Some(_)) => {
            return Err(bad(400, "name the channel or the sub, not both"));
        }
        (None, None) => {
            return Err(bad(
                400,
                "name the channel or the token subject: {\"channel\":\"a\"} or {\"sub\":\"alice\"}",
            ));
        }
    };
    let part = ask(w, &q).await?;
    v["closed"] = json!(part.closed);
    v["scope"] = json!(part.scope.as_deref().unwrap_or(scope(w)));
    if let Some(n) = part.nodes {
        v["nodes"] = json!(n);
    }
    Ok(v)
}

/// Checks a disconnect by subject: a subject a token can carry, asked by
/// the publish key (or where publishing is open): a token's grants name
/// channels, not users, so none may close another user's connections.
fn subject(caller: &Caller, sub: &str) -> Result<(), Bad> {
    if sub.is_empty() || sub.len() > crate::auth::MAX_SUBJECT {
        return Err(bad(
            400,
            format!("sub: 1 to {} bytes", crate::auth::MAX_SUBJECT),
        ));
    }
    match caller {
        Caller::Any => Ok(()),
        Caller::Token(_) => Err(bad(
            403,
            "disconnecting by sub takes the publish key, not a token",
        )),
    }
}

/// `POST /api/publish`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishBody {
    channels: Vec<String>,
    data: Value,
}

/// `POST /api/publish`: every channel is checked before any is published.
async fn publish(w: &Worker, caller: &Caller, body: &[u8]) -> Result<Value, Bad> {
    let p: PublishBody = serde_json::from_slice(body)
        .map_err(|e| bad(400, format!("the body is not a publish request: {e}")))?;
    if p.channels.is_empty() || p.channels.len() > MAX_BATCH {
        return Err(bad(400, format!("channels takes 1 to {MAX_BATCH} names")));
    }
    for c in &p.channels {
        let c = channel_name(c, "channels")?;
        if c.is_empty() {
            return Err(bad(400, "channels: empty name"));
        }
        caller
            .may_publish(&c)
            .map_err(|why| bad(why.status(), format!("{c}: {why}")))?;
    }
    // A string is sent as it is; any other JSON value as its JSON text.
    let data = match p.data {
        Value::String(s) => s,
        other => other.to_string(),
    };
    if data.len() > w.cfg.max_message {
        return Err(bad(
            413,
            format!("data is over --max-message ({} bytes)", w.cfg.max_message),
        ));
    }
    let payload = Bytes::from(data);
    let mut results = Vec::with_capacity(p.channels.len());
    for c in &p.channels {
        let r = match w.supervisor.publish(c, true, payload.clone(), None).await {
            Ok(r) => {
                let mut v = json!({ "channel": c });
                let key = if w.cfg.redis_mode.is_some() {
                    "redis_receivers"
                } else {
                    "subscribers"
                };
                v[key] = r.subscribers.into();
                if !r.message.is_none() {
                    v["id"] = r.message.to_string().into();
                }
                v
            }
            Err(PublishError::Gone) => return Err(bad(503, "supervisor unavailable")),
            Err(e @ PublishError::Refused(_)) => json!({ "channel": c, "error": e.to_string() }),
        };
        results.push(r);
    }
    Ok(json!({ "results": results }))
}
