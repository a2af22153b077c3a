//! Who gets in over HTTP: where a request carries its token, which browser
//! origins may open a subscription, the checks an upgrade and a publish
//! pass, and the answers for those refused. The token check itself is
//! [`crate::auth`]'s, the same for every transport.
//!
//! A token may come in (first found wins):
//!
//! - `Authorization: Bearer <token>`;
//! - a `Sec-WebSocket-Protocol` entry `bearer.<token>`, the one header a
//!   browser's `WebSocket` can set; the answer never echoes it, only the
//!   protocol the server speaks ([`PROTOCOL`]) when the client offered it;
//! - `?token=<token>` in the request target (JWTs are URL-safe; such URLs
//!   end up in proxies' logs, so prefer the others).

use throng_proto::http::Request;

use super::mqtt_auth;
use super::routes::reply_with;
use super::state::Worker;
use crate::auth::{self, Access, Action, Refusal};
use crate::tls::stream::Io;

/// The subprotocol a client may offer beside its `bearer.<token>` entry so
/// that a browser, which requires the server to pick one of those it
/// offered, gets one back: plain messages, as without any protocol.
pub(crate) const PROTOCOL: &str = "throng";

/// The subprotocol of a client that wants each message with its id
/// (`<id>\n<payload>`, docs/clients.md), and may reconnect with `?since=`.
pub(crate) const PROTOCOL_IDS: &str = "throng.v1";

/// The `Sec-WebSocket-Protocol` entry prefix that carries a token.
const BEARER_PROTOCOL: &str = "bearer.";

/// The credential of an `Authorization: Bearer` header, if any: the one
/// place the publish key is taken from (a URL's `?token=` ends up in logs).
fn authorization(req: &Request) -> Option<&[u8]> {
    let v = req.header("authorization")?.trim_ascii();
    (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| v[7..].trim_ascii())
}

/// The token a request carries, if any.
pub(crate) fn bearer(req: &Request) -> Option<&[u8]> {
    if let Some(t) = authorization(req) {
        return Some(t);
    }
    if let Some(t) = protocols(req).find_map(|p| p.strip_prefix(BEARER_PROTOCOL.as_bytes())) {
        return Some(t);
    }
    let (_, query) = req.target.split_once('?')?;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
        .map(str::as_bytes)
}

/// Every entry of every `Sec-WebSocket-Protocol` header, trimmed.
fn protocols(req: &Request) -> impl Iterator<Item = &[u8]> {
    req.headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("sec-websocket-protocol"))
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
}

/// The subprotocol to answer with: [`PROTOCOL_IDS`] when the client
/// offered it, else [`PROTOCOL`] when it offered that.
pub(crate) fn protocol(req: &Request) -> Option<&'static str> {
    [PROTOCOL_IDS, PROTOCOL]
        .into_iter()
        .find(|want| protocols(req).any(|p| p == want.as_bytes()))
}

/// Whether `req` offered the subprotocol `name`.
pub(crate) fn offers(req: &Request, name: &str) -> bool {
    protocols(req).any(|p| p == name.as_bytes())
}

/// Whether a browser from `req`'s `Origin` may subscribe. Without
/// `--allowed-origins` every origin may; a request without `Origin` is not
/// from a browser page, which is what the check guards against.
pub(crate) fn origin_allowed(w: &Worker, req: &Request) -> bool {
    let (Some(allowed), Some(origin)) = (&w.cfg.allowed_origins, req.header("origin")) else {
        return true;
    };
    let origin = origin.trim_ascii();
    allowed
        .iter()
        .any(|a| a.as_bytes().eq_ignore_ascii_case(origin))
}

/// What the credential of an upgrade to several channels grants
/// (docs/channels.md), by MQTT's rules ([`mqtt_auth::check`]): a token's
/// `channels` and `publish` claims; the publish key (only in the
/// `Authorization` header, as for `/publish`) publishes anywhere; nothing
/// kept where nothing is guarded.
pub(crate) fn admitted(w: &Worker, req: &Request) -> Result<mqtt_auth::Admitted, Refusal> {
    let key = w.publish_key.get();
    let keyed = authorization(req).filter(|k| key.as_ref().is_some_and(|p| p.matches(k)));
    let verifier = w.verifier.get();
    let presented = match keyed.or_else(|| bearer(req)) {
        Some(p) => p,
        None if verifier.is_some() => return Err(Refusal::Missing),
        None => b"",
    };
    let key = keyed.and(key.as_deref());
    mqtt_auth::check(
        w.cfg.auth.publish_guarded(),
        verifier.as_deref(),
        key,
        presented,
        unix_now(),
    )
}

/// Unix seconds now, the `now` tokens are checked at.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// May this upgrade subscribe to `channel`? With no key configured,
/// anyone may (and nothing expires).
pub(crate) fn may_subscribe(w: &Worker, req: &Request, channel: &str) -> Result<Access, Refusal> {
    let Some(v) = w.verifier.get() else {
        return Ok(Access {
            expires: None,
            subject: None,
        });
    };
    let token = bearer(req).ok_or(Refusal::Missing)?;
    v.check(token, Action::Subscribe, channel, unix_now())
}

/// May this request publish to `channel`? Either the publish key or a
/// token granting the channel; with neither configured, anyone may.
pub(crate) fn may_publish(w: &Worker, req: &Request, channel: &str) -> Result<(), Refusal> {
    caller(w, req)?.may_publish(channel)
}

/// Who sent a publishing request (or a server API request, which takes the
/// same credentials): anyone may publish anywhere, or a token's grants say.
pub(crate) enum Caller {
    /// Publishing is not guarded, or the publish key was presented.
    Any,
    /// A verified token: it may publish where its `publish` claim grants.
    Token(auth::Token),
}

impl Caller {
    /// May this caller publish to (or manage) `channel`?
    pub(crate) fn may_publish(&self, channel: &str) -> Result<(), Refusal> {
        match self {
            Self::Any => Ok(()),
            Self::Token(t) if t.allows(Action::Publish, channel) => Ok(()),
            Self::Token(_) => Err(Refusal::NotGranted),
        }
    }
}

/// The caller of a publishing request: the token is verified once, the
/// channels it names are checked with [`Caller::may_publish`].
pub(crate) fn caller(w: &Worker, req: &Request) -> Result<Caller, Refusal> {
    if !w.cfg.auth.publish_guarded() {
        return Ok(Caller::Any);
    }
    let presented = bearer(req).ok_or(Refusal::Missing)?;
    // The key counts only in the Authorization header: a key in `?token=`
    // would be in every proxy's and server's access log.
    if let Some(key) = authorization(req)
        && w.publish_key.get().is_some_and(|k| k.matches(key))
    {
        return Ok(Caller::Any);
    }
    match w.verifier.get() {
        Some(v) => v.verify(presented, unix_now()).map(Caller::Token),
        None => Err(Refusal::PublishKey),
    }
}

/// The `Retry-After` of a 503 for a full node: long enough for others to
/// leave, short enough to come back soon.
pub(crate) const RETRY_AFTER: u32 = 5;

/// Refuses an upgrade past `--max-connections`: 503 with `Retry-After`.
pub(crate) async fn full(w: &Worker, stream: &mut Io) {
    let retry = RETRY_AFTER.to_string();
    let why = "the server holds --max-connections subscribers; try again later\n";
    reply_with(
        w,
        stream,
        503,
        "text/plain",
        &[("Retry-After", &retry)],
        why.as_bytes(),
        false,
    )
    .await;
}

/// Answers a refused request (401 with `WWW-Authenticate`, or 403), counts
/// it, and closes. The body is the refusal's fixed text.
pub(crate) async fn refuse(w: &Worker, stream: &mut Io, why: Refusal) {
    w.counters.refused(why.label());
    let challenge = why.www_authenticate();
    let body = format!("{why}\n");
    reply_with(
        w,
        stream,
        why.status(),
        "text/plain",
        &[("WWW-Authenticate", &challenge)],
        body.as_bytes(),
        false,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use throng_proto::http::parse_request;

    use super::*;

    fn req(head: &str) -> Request {
        let text = format!("{head}\r\n\r\n");
        parse_request(text.as_bytes(), 16 * 1024)
            .unwrap()
            .unwrap()
            .0
    }

    #[test]
    fn a_token_comes_from_the_header_then_the_protocol_then_the_query() {
        let r = req("GET /news?token=q.q.q HTTP/1.1\r\nAuthorization: bearer  h.h.h ");
        assert_eq!(bearer(&r), Some(&b"h.h.h"[..]));
        let r = req(
            "GET /news?token=q.q.q HTTP/1.1\r\nSec-WebSocket-Protocol: throng\r\nSec-WebSocket-Protocol: x, bearer.p.p.p",
        );
        assert_eq!(bearer(&r), Some(&b"p.p.p"[..]));
        assert_eq!(protocol(&r), Some("throng"));
        let r = req("GET /news?a=1&token=q.q.q&b=2 HTTP/1.1");
        assert_eq!(bearer(&r), Some(&b"q.q.q"[..]));
        assert_eq!(protocol(&r), None);
        let r =
            req("GET /news HTTP/1.1\r\nAuthorization: Basic abc\r\nSec-WebSocket-Protocol: bearer");
        assert_eq!(
            bearer(&r),
            None,
            "neither a bearer header nor a bearer. entry"
        );
        let r = req("GET /news?tokens=x HTTP/1.1");
        assert_eq!(bearer(&r), None);
    }
}
