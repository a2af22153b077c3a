//! Who may subscribe and publish, and how much one address may take:
//! `throng serve` with tokens from an independent library (PyJWT), a
//! browser-like client (Node `ws`), real sockets from several loopback
//! source addresses, and whole process groups signalled as systemd does.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use socket2::{Domain, Socket, Type};
use throng_proto::http;
use throng_testkit::http::{get, metric_in, publish};
use throng_testkit::jwt::Mint;
use throng_testkit::process::{command, output_within, text};
use throng_testkit::{Peer, Server, TempDir, peers, require, wait_until};

use crate::{THRONG, serve, throng};

/// An answer read off a raw connection: status, head, body, and the
/// connection (still open after a 101).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
    /// Open while the answer lives (a subscriber, after a 101).
    _conn: TcpStream,
}

/// A connection to `addr` from loopback address `from`.
pub(crate) fn connect_from(addr: SocketAddr, from: Ipv4Addr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.bind(&SocketAddr::from((from, 0)).into())
        .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    s.connect(&addr.into())
        .unwrap_or_else(|e| panic!("connect {addr} from {from}: {e}"));
    let s = TcpStream::from(s);
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    s
}

/// Sends `request` from `from` and reads the answer's head (and, unless
/// it is a 101, its body to the end).
pub(crate) fn exchange(addr: SocketAddr, from: Ipv4Addr, request: &str) -> Answer {
    let mut stream = connect_from(addr, from);
    stream.write_all(request.as_bytes()).expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (resp, used) = loop {
        if let Some(parsed) = http::parse_response(&buf, http::MAX_HEAD).expect("an HTTP answer") {
            break parsed;
        }
        let n = stream.read(&mut chunk).unwrap_or(0);
        assert!(n > 0, "closed before an answer: {:?}", text(&buf));
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = text(&buf[..used]);
    let mut body = buf[used..].to_vec();
    if resp.status != 101 {
        let _ = stream.read_to_end(&mut body);
    }
    Answer {
        status: resp.status,
        head,
        body: text(&body),
        _conn: stream,
    }
}

/// A WebSocket upgrade request for `path` with `headers`.
pub(crate) fn upgrade_request(path: &str, headers: &[(&str, &str)]) -> String {
    let mut r = format!(
        "GET {path} HTTP/1.1\r\nHost: throng\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r
}

/// `GET /healthz`, kept short: one request per connection.
const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: throng\r\nConnection: close\r\n\r\n";

/// The one `WWW-Authenticate` line of a head, if any.
fn challenge(head: &str) -> Option<&str> {
    head.lines()
        .find_map(|l| l.strip_prefix("WWW-Authenticate: "))
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(": ")?;
        k.eq_ignore_ascii_case(name).then_some(v)
    })
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

const LOCAL: Ipv4Addr = Ipv4Addr::LOCALHOST;

#[test]
fn tokens_from_pyjwt_are_accepted_or_refused_with_their_status_before_the_upgrade() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let server = serve(&[
        "--workers",
        "1",
        "--auth-hs256-secret-file",
        &mint.key("hs256.key"),
        "--auth-public-key",
        &format!("rsa={}", mint.key("rsa.pub.pem")),
        "--auth-public-key",
        &format!("ec={}", mint.key("ec.pub.pem")),
        "--auth-public-key",
        &mint.key("ed.pub.pem"),
    ]);
    let grant = json!({"exp_in": 300, "channels": ["news", "room.*"]});
    let with = |alg: &str, kid: Option<&str>, claims: &Value| {
        let mut spec = json!({"alg": alg, "claims": claims});
        if let Some(k) = kid {
            spec["kid"] = json!(k);
        }
        spec
    };
    // (what, token spec or a raw token, channel, status, WWW-Authenticate holds)
    let cases: Vec<(&str, Value, &str, u16, &str)> = vec![
        ("HS256", with("HS256", None, &grant), "news", 101, ""),
        (
            "RS256 by its kid",
            with("RS256", Some("rsa"), &grant),
            "news",
            101,
            "",
        ),
        (
            "ES256 by its kid",
            with("ES256", Some("ec"), &grant),
            "news",
            101,
            "",
        ),
        (
            "EdDSA, no kid",
            with("EdDSA", None, &grant),
            "news",
            101,
            "",
        ),
        (
            "a prefix grant",
            with("ES256", Some("ec"), &grant),
            "room.lobby",
            101,
            "",
        ),
        (
            "a channel not granted",
            with("HS256", None, &grant),
            "sport",
            403,
            "error=\"insufficient_scope\"",
        ),
        (
            "alg none",
            with("none", None, &grant),
            "news",
            401,
            "unsigned tokens (alg none) are not accepted",
        ),
        (
            "HS256 signed with the RSA public key, kid of the RSA key",
            with("HS256-rsa-pub", Some("rsa"), &grant),
            "news",
            401,
            "no key for the token's algorithm",
        ),
        (
            "HS256 signed with the RSA public key, no kid",
            with("HS256-rsa-pub", None, &grant),
            "news",
            401,
            "invalid signature",
        ),
        (
            "another secret",
            with("HS256-wrong", None, &grant),
            "news",
            401,
            "invalid signature",
        ),
        (
            "expired",
            with("HS256", None, &json!({"exp_in": -30, "channels": ["*"]})),
            "news",
            401,
            "token expired",
        ),
        (
            "not valid yet",
            with(
                "HS256",
                None,
                &json!({"exp_in": 300, "nbf_in": 200, "channels": ["*"]}),
            ),
            "news",
            401,
            "token not valid yet",
        ),
        (
            "no exp",
            with("HS256", None, &json!({"channels": ["*"]})),
            "news",
            401,
            "token has no expiry (exp)",
        ),
        (
            "malformed",
            json!("not.a-token"),
            "news",
            401,
            "malformed token",
        ),
        (
            "no token",
            json!(""),
            "news",
            401,
            "Bearer realm=\"throng\"",
        ),
    ];
    let specs: Vec<Value> = cases
        .iter()
        .filter(|c| c.1.is_object())
        .map(|c| c.1.clone())
        .collect();
    let mut minted = mint.tokens(&specs).into_iter();
    let secret = std::fs::read_to_string(mint.key("hs256.key")).expect("the secret");
    for (i, (what, spec, channel, status, why)) in cases.iter().enumerate() {
        let token = match spec.as_str() {
            Some(raw) => raw.to_owned(),
            None => minted.next().expect("a token per spec"),
        };
        // Each carrier in turn: the header, the protocol entry, the query.
        let (path, headers) = match (i % 3, token.is_empty()) {
            (_, true) => (format!("/{channel}"), vec![]),
            (0, _) => (
                format!("/{channel}"),
                vec![("Authorization", format!("Bearer {token}"))],
            ),
            (1, _) => (
                format!("/{channel}"),
                vec![("Sec-WebSocket-Protocol", format!("bearer.{token}"))],
            ),
            _ => (format!("/{channel}?token={token}"), vec![]),
        };
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let a = exchange(server.addr, LOCAL, &upgrade_request(&path, &headers));
        assert_eq!(a.status, *status, "{what}: {}{}", a.head, a.body);
        let all = format!("{}{}", a.head, a.body);
        if !token.is_empty() {
            let sig = token.rsplit('.').next().unwrap_or_default();
            assert!(
                sig.len() < 8 || !all.contains(sig),
                "{what}: the answer echoes the token: {all}"
            );
        }
        assert!(
            !all.contains(secret.trim()),
            "{what}: the answer echoes the key"
        );
        if *status == 101 {
            assert_eq!(challenge(&a.head), None, "{what}");
            assert_eq!(header(&a.head, "Sec-WebSocket-Protocol"), None, "{what}");
        } else {
            let c = challenge(&a.head).unwrap_or_else(|| panic!("{what}: no WWW-Authenticate"));
            assert!(c.contains(why), "{what}: {c}");
        }
    }
    for (reason, n) in [
        ("token_expired", 1.0),
        ("token_alg_none", 1.0),
        ("token_algorithm", 1.0),
        ("token_signature", 2.0),
        ("not_granted", 1.0),
        ("token_missing", 1.0),
    ] {
        server.wait_metric(
            &format!("throng_refused_total{{reason=\"{reason}\"}}"),
            |v| v == n,
        );
    }

    // A server with the RSA key alone: the forged HS256 finds no key, and
    // a kid naming no key is refused as such.
    let rsa_only = serve(&[
        "--workers",
        "1",
        "--auth-public-key",
        &format!("rsa={}", mint.key("rsa.pub.pem")),
    ]);
    let forged = mint.token(with("HS256-rsa-pub", None, &grant));
    let unknown = mint.token(with("RS256", Some("someone-else"), &grant));
    for (token, why) in [
        (forged, "no key for the token's algorithm"),
        (unknown, "no key with the token's key id"),
    ] {
        let a = exchange(
            rsa_only.addr,
            LOCAL,
            &upgrade_request(&format!("/news?token={token}"), &[]),
        );
        assert_eq!(a.status, 401, "{}", a.head);
        assert!(
            challenge(&a.head).is_some_and(|c| c.contains(why)),
            "{}",
            a.head
        );
    }
}

/// `node auth_ws.mjs URL PROTOCOLS ORIGIN`, and its stdout lines.
fn browser(
    url: &str,
    protocols: &str,
    origin: &str,
) -> (Child, impl Iterator<Item = Value> + use<>) {
    let mut child = peers::node("auth_ws.mjs")
        .args([url, protocols, origin])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start node");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    let lines = out
        .lines()
        .map_while(Result::ok)
        .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l}: {e}")));
    (child, lines)
}

#[test]
fn a_browser_carries_its_token_in_the_protocol_and_other_origins_are_refused() {
    require!(Peer::PythonJwt, Peer::NodeWs);
    let mint = Mint::new();
    let server = serve(&[
        "--workers",
        "1",
        "--auth-hs256-secret-file",
        &mint.key("hs256.key"),
        "--allowed-origins",
        "https://app.example,https://www.example",
    ]);
    let token = mint.token(json!({"alg": "HS256", "claims": {
        "exp_in": 300, "channels": ["news"], "publish": ["news"],
    }}));
    let url = format!("ws://{}/news", server.addr);
    let offered = format!("throng,bearer.{token}");

    let (mut child, mut lines) = browser(&url, &offered, "https://app.example");
    assert_eq!(
        lines.next(),
        Some(json!({"open": true, "protocol": "throng"}))
    );
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    let auth = format!("Bearer {token}");
    let mut req = Vec::new();
    http::write_request(
        &mut req,
        "POST",
        "/publish/news",
        &[
            ("Host", b"x"),
            ("Authorization", auth.as_bytes()),
            ("Connection", b"close"),
        ],
        b"hello browser",
    );
    let a = exchange(server.addr, LOCAL, &text(&req));
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(lines.next(), Some(json!({"message": "hello browser"})));
    let _ = child.wait();

    // Like a browser, ws fails a handshake that names no protocol it offered:
    // the server never answers with the bearer entry, so offer "throng" too.
    let (mut child, mut lines) = browser(&url, &format!("bearer.{token}"), "https://app.example");
    let got = lines.next().expect("a line");
    assert!(
        got["error"]
            .as_str()
            .is_some_and(|e| e.contains("subprotocol")),
        "{got}"
    );
    let _ = child.wait();

    // Another site's page (cross-site WebSocket hijacking), even with a token.
    let (mut child, mut lines) = browser(&url, &offered, "https://evil.example");
    assert_eq!(lines.next(), Some(json!({"status": 403})));
    let _ = child.wait();
    server.wait_metric("throng_refused_total{reason=\"origin\"}", |v| v == 1.0);

    // No Origin at all: not a browser page, not checked.
    let (mut child, mut lines) = browser(&url, &offered, "");
    assert_eq!(lines.next().map(|v| v["open"].clone()), Some(json!(true)));
    let _ = child.kill();
    let _ = child.wait();

    // The answer carries only the protocol the server speaks.
    let a = exchange(
        server.addr,
        LOCAL,
        &upgrade_request(
            "/news",
            &[
                ("Sec-WebSocket-Protocol", &offered),
                ("Origin", "https://www.example"),
            ],
        ),
    );
    assert_eq!(a.status, 101, "{}", a.head);
    assert_eq!(header(&a.head, "Sec-WebSocket-Protocol"), Some("throng"));
    assert!(!a.head.contains("bearer"), "{}", a.head);
}

#[test]
fn a_subscriber_is_closed_4001_once_its_token_expires_and_another_keeps_receiving() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let server = serve(&[
        "--workers",
        "1",
        "--ping-interval",
        "1s",
        // The long-lived subscriber is not read (nor answers pings) meanwhile.
        "--idle-timeout",
        "60s",
        "--auth-hs256-secret-file",
        &mint.key("hs256.key"),
    ]);
    let short_exp = unix_now().ceil() + 3.0;
    let tokens = mint.tokens(&[
        json!({"alg": "HS256", "claims": {"exp": short_exp, "channels": ["news"]}}),
        json!({"alg": "HS256", "claims": {"exp_in": 300, "channels": ["news"]}}),
    ]);
    let connect = |t: &str| {
        let s = TcpStream::connect(server.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        let (ws, resp) = tungstenite::client(format!("ws://{}/news?token={t}", server.addr), s)
            .expect("upgrade");
        assert_eq!(resp.status(), 101);
        ws
    };
    let mut short = connect(&tokens[0]);
    let mut long = connect(&tokens[1]);
    // tungstenite answers the heartbeat pings while it waits.
    let code = loop {
        match short.read() {
            Ok(tungstenite::Message::Close(f)) => break f.map(|f| u16::from(f.code)),
            Ok(_) => {}
            Err(e) => panic!("expected a close frame: {e}"),
        }
    };
    closed_after(short_exp);
    assert_eq!(code, Some(4001));
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    assert_eq!(
        server.metric("throng_connections_closed_total{reason=\"token_expired\"}"),
        1.0
    );
    // With token keys configured publishing needs a token too.
    let (status, _) = publish(server.addr, "news", b"x", None);
    assert_eq!(status, 401);
    let publisher =
        mint.token(json!({"alg": "HS256", "claims": {"exp_in": 60, "publish": ["news"]}}));
    let auth = format!("Bearer {publisher}");
    let mut req = Vec::new();
    http::write_request(
        &mut req,
        "POST",
        "/publish/news",
        &[
            ("Host", b"x"),
            ("Authorization", auth.as_bytes()),
            ("Connection", b"close"),
        ],
        b"after the expiry",
    );
    let a = exchange(server.addr, LOCAL, &text(&req));
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("\"subscribers\":1"), "{}", a.body);
    assert_eq!(throng_testkit::ws::next_text(&mut long), "after the expiry");
}

/// Checks that a connection whose token expires at `exp` (Unix seconds)
/// was closed just now: after `exp`, within a ping interval (1 s) of it.
pub(crate) fn closed_after(exp: f64) {
    let closed_at = unix_now();
    assert!(closed_at >= exp, "closed before exp: {closed_at} < {exp}");
    // Enforced by the sweep within one ping interval of exp; the slack is
    // for a busy machine, not a figure.
    assert!(
        closed_at < exp + 1.0 + 4.0,
        "closed {:.1} s after exp",
        closed_at - exp
    );
}

/// `POST /publish/<channel>` with an optional `Authorization` value.
fn publish_with(addr: SocketAddr, channel: &str, auth: Option<&str>, body: &str) -> Answer {
    let mut req = Vec::new();
    let mut headers: Vec<(&str, &[u8])> = vec![("Host", b"x"), ("Connection", b"close")];
    if let Some(a) = auth {
        headers.push(("Authorization", a.as_bytes()));
    }
    http::write_request(
        &mut req,
        "POST",
        &format!("/publish/{channel}"),
        &headers,
        body.as_bytes(),
    );
    exchange(addr, LOCAL, &text(&req))
}

#[test]
fn publishing_takes_the_key_or_a_token_with_a_publish_grant() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let dir = TempDir::new("publish-key");
    let key = "a-publish-key-of-some-length";
    std::fs::write(dir.file("key"), format!("{key}\n")).expect("write the key");
    let server = serve(&[
        "--workers",
        "2",
        "--auth-hs256-secret-file",
        &mint.key("hs256.key"),
        "--publish-key-file",
        &dir.arg("key"),
    ]);
    let tokens = mint.tokens(&[
        json!({"alg": "HS256", "claims": {"exp_in": 60, "channels": ["news"]}}),
        json!({"alg": "HS256", "claims": {"exp_in": 60, "publish": ["news", "alerts.*"]}}),
    ]);
    let (sub, publisher) = (&tokens[0], &tokens[1]);
    let s = TcpStream::connect(server.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let (mut ws, _) =
        tungstenite::client(format!("ws://{}/news?token={sub}", server.addr), s).expect("upgrade");
    server.wait_metric("throng_connections_open", |v| v == 1.0);

    let wrong_key = format!("Bearer {key}x");
    let right_key = format!("Bearer {key}");
    let no_grant = format!("Bearer {sub}");
    let grant = format!("Bearer {publisher}");
    for (what, auth, channel, status) in [
        ("no credential", None, "news", 401),
        ("a wrong key", Some(wrong_key.as_str()), "news", 401),
        (
            "a token without a publish grant",
            Some(no_grant.as_str()),
            "news",
            403,
        ),
        (
            "a token granting another channel",
            Some(grant.as_str()),
            "sport",
            403,
        ),
        ("the key", Some(right_key.as_str()), "news", 200),
        (
            "a token with a publish grant",
            Some(grant.as_str()),
            "news",
            200,
        ),
        (
            "a token with a pattern grant",
            Some(grant.as_str()),
            "alerts.fire",
            200,
        ),
    ] {
        let a = publish_with(server.addr, channel, auth, what);
        assert_eq!(a.status, status, "{what}: {}{}", a.head, a.body);
        if status != 200 {
            assert!(challenge(&a.head).is_some(), "{what}: {}", a.head);
        }
    }
    // Only the granted publishes reached the subscriber, in order.
    assert_eq!(throng_testkit::ws::next_text(&mut ws), "the key");
    assert_eq!(
        throng_testkit::ws::next_text(&mut ws),
        "a token with a publish grant"
    );

    // The key alone: subscribing is open, publishing is not.
    let keyed = serve(&["--workers", "1", "--publish-key-file", &dir.arg("key")]);
    let a = exchange(keyed.addr, LOCAL, &upgrade_request("/news", &[]));
    assert_eq!(a.status, 101);
    let a = publish_with(keyed.addr, "news", Some(&wrong_key), "x");
    assert_eq!(a.status, 401);
    assert!(a.body.contains("invalid publish key"), "{}", a.body);
    assert_eq!(
        publish_with(keyed.addr, "news", Some(&right_key), "x").status,
        200
    );
    keyed.wait_metric("throng_refused_total{reason=\"publish_key\"}", |v| v == 1.0);
}

#[test]
fn publish_listen_and_metrics_listen_serve_what_the_public_port_refuses() {
    let server = serve(&[
        "--workers",
        "2",
        "--publish-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let internal = |key: &str| -> SocketAddr {
        server.start[key][0]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {}", server.start))
    };
    let (publish_at, metrics_at) = (internal("publish_listen"), internal("metrics_listen"));
    let mut sub = throng_testkit::ws::subscribe(server.addr, "news");

    let (status, body) = publish(server.addr, "news", b"from outside", None);
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("publishing is not served on this address"),
        "{body}"
    );
    let (status, body) = get(server.addr, "/metrics");
    assert_eq!(status, 403, "{body}");

    let (status, body) = publish(publish_at, "news", b"from inside", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(throng_testkit::ws::next_text(&mut sub), "from inside");
    // Metrics are up to half a second old.
    wait_until("the metrics address to count the refusals", || {
        let (status, page) = get(metrics_at, "/metrics");
        status == 200
            && metric_in(&page, "throng_connections_open") == Some(1.0)
            && metric_in(
                &page,
                "throng_refused_total{reason=\"not_on_this_address\"}",
            ) == Some(2.0)
    });
    // The internal addresses serve nothing else but /healthz.
    for addr in [publish_at, metrics_at, server.addr] {
        assert_eq!(get(addr, "/healthz").0, 200);
    }
    assert_eq!(get(publish_at, "/metrics").0, 403);
    let a = exchange(publish_at, LOCAL, &upgrade_request("/news", &[]));
    assert_eq!(a.status, 403, "no subscribers on an internal address");
}

#[test]
fn the_n_plus_first_connection_of_an_address_is_refused_and_others_are_not() {
    let server = serve(&["--workers", "2", "--max-connections-per-ip", "3"]);
    let [a, b] = [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)];
    let up = |from| exchange(server.addr, from, &upgrade_request("/news", &[]));
    let mut held: Vec<Answer> = (0..3).map(|_| up(a)).collect();
    assert!(held.iter().all(|h| h.status == 101));
    let refused = up(a);
    assert_eq!(refused.status, 429, "{}", refused.head);
    assert!(
        refused.body.contains("--max-connections-per-ip"),
        "{}",
        refused.body
    );
    // HTTP requests count too: the address holds its three.
    assert_eq!(exchange(server.addr, a, HEALTHZ).status, 429);
    let others: Vec<Answer> = (0..3).map(|_| up(b)).collect();
    assert!(
        others.iter().all(|h| h.status == 101),
        "another address has its own three"
    );
    assert_eq!(exchange(server.addr, LOCAL, HEALTHZ).status, 200);
    // One of a's leaves: a may come back.
    drop(held.pop());
    wait_until("a's place to come back", || up(a).status == 101);
    server.wait_metric("throng_refused_total{reason=\"per_ip_connections\"}", |v| {
        v >= 2.0
    });
    drop(others);
}

#[test]
fn new_connections_past_the_handshake_rate_get_429_with_retry_after() {
    let server = serve(&[
        "--workers",
        "2",
        "--handshakes-per-ip",
        "1/s",
        "--handshake-burst",
        "3",
    ]);
    let [a, b] = [Ipv4Addr::new(127, 0, 0, 4), Ipv4Addr::new(127, 0, 0, 5)];
    for _ in 0..3 {
        assert_eq!(exchange(server.addr, a, HEALTHZ).status, 200);
    }
    let refused = exchange(server.addr, a, HEALTHZ);
    assert_eq!(refused.status, 429, "{}", refused.head);
    assert_eq!(header(&refused.head, "Retry-After"), Some("1"));
    assert_eq!(
        exchange(server.addr, b, HEALTHZ).status,
        200,
        "another address"
    );
    wait_until("a token to come back", || {
        exchange(server.addr, a, HEALTHZ).status == 200
    });
    server.wait_metric("throng_refused_total{reason=\"per_ip_rate\"}", |v| v >= 1.0);
}

#[test]
fn past_max_connections_an_upgrade_gets_503_with_retry_after_over_every_worker() {
    let server = serve(&["--workers", "2", "--max-connections", "4"]);
    let up = |i: u8| {
        exchange(
            server.addr,
            Ipv4Addr::new(127, 0, 1, i),
            &upgrade_request("/news", &[]),
        )
    };
    let mut held: Vec<Answer> = (1..=4).map(up).collect();
    assert!(held.iter().all(|h| h.status == 101));
    for i in 5..8 {
        let refused = up(i);
        assert_eq!(refused.status, 503, "{}", refused.head);
        assert_eq!(header(&refused.head, "Retry-After"), Some("5"));
    }
    assert_eq!(
        get(server.addr, "/healthz").0,
        200,
        "HTTP requests are not capped"
    );
    drop(held.pop());
    wait_until("a place to come back", || {
        let a = up(9);
        let back = a.status == 101;
        if back {
            held.push(a);
        }
        back
    });
    server.wait_metric("throng_refused_total{reason=\"max_connections\"}", |v| {
        v >= 3.0
    });
    // Each worker's figures reach /metrics with its next snapshot.
    server.wait_metric("throng_connections_open", |v| v == 4.0);
}

#[test]
fn the_address_table_forgets_a_flood_of_thousands_of_addresses() {
    let server = serve(&[
        "--workers",
        "2",
        "--max-connections-per-ip",
        "2",
        "--handshakes-per-ip",
        "20/s",
        "--handshake-burst",
        "2",
    ]);
    let n = 3000u32;
    for i in 0..n {
        let from = Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 1, 0, 1)) + i);
        assert_eq!(exchange(server.addr, from, HEALTHZ).status, 200, "{from}");
    }
    let seen = server.metric("throng_address_table_entries");
    assert!(seen <= f64::from(n) + 1.0, "{seen}");
    // Each bucket is full again 0.1 s after its one handshake: pruned
    // within a second, and the table is back to (about) nothing.
    server.wait_metric("throng_address_table_entries", |v| v <= 1.0);
}

/// How the whole process group is signalled: at once, or (as systemd's
/// `cg_kill` may, walking the group's processes one by one under load) the
/// workers a moment before the supervisor.
#[derive(Debug, Clone, Copy)]
enum GroupStop {
    AtOnce,
    WorkersFirst,
}

/// Starts `throng serve` in a process group of its own with subscribers
/// that never answer a close, stops the group as `how` says, and returns
/// how long it took, its exit status, its log and its workers' pids.
fn stop_the_group(how: GroupStop) -> (Duration, std::process::ExitStatus, String, Vec<u32>) {
    use std::os::unix::process::CommandExt as _;
    let mut server =
        Server::start_with(THRONG, &["--workers", "2", "--drain-timeout", "2s"], |c| {
            c.process_group(0);
        });
    let addr = server.addr;
    let pids = |addr| -> Vec<u32> {
        get(addr, "/metrics")
            .1
            .lines()
            .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect()
    };
    wait_until("both workers answer", || {
        TcpStream::connect(addr).is_ok() && pids(addr).len() == 2
    });
    let workers = pids(addr);
    // Subscribers that never answer the close: a worker waits the whole
    // drain timeout, unless it has none.
    let held: Vec<Answer> = (2..8)
        .map(|i| {
            exchange(
                addr,
                Ipv4Addr::new(127, 0, 2, i),
                &upgrade_request("/news", &[]),
            )
        })
        .collect();
    assert!(held.iter().all(|h| h.status == 101));
    // Whether the process (or group) was there to signal.
    let kill = |target: String| {
        command("kill")
            .args(["-s", "TERM", "--", &target])
            .stderr(Stdio::null())
            .status()
            .expect("kill")
            .success()
    };
    let t = Instant::now();
    if let GroupStop::WorkersFirst = how {
        drop(held);
        // The first one's clean exit may stop the other before its turn.
        for pid in &workers {
            kill(pid.to_string());
        }
        wait_until("the workers to exit", || {
            workers
                .iter()
                .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        });
        // Past the 200 ms a dead worker waits before its restart.
        std::thread::sleep(Duration::from_millis(500));
    }
    // Workers first: the supervisor may have stopped already.
    let group_there = kill(format!("-{}", server.child.id()));
    assert!(group_there || matches!(how, GroupStop::WorkersFirst));
    let status = loop {
        if let Some(s) = server.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the server did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let stopped = t.elapsed();
    // Its last lines, read by the log thread once the pipe closed.
    wait_until("the log to end", || {
        server.log().contains("throng: stopped")
    });
    (stopped, status, server.log(), workers)
}

#[test]
fn a_group_sigterm_stops_every_process_within_the_drain_timeout_and_restarts_none() {
    for how in [GroupStop::AtOnce, GroupStop::WorkersFirst] {
        let (stopped, status, log, workers) = stop_the_group(how);
        assert!(status.success(), "{how:?}: {status}: {log}");
        assert!(!log.contains("restarting"), "{how:?}: {log}");
        assert!(!log.contains("died"), "{how:?}: {log}");
        // The drain timeout, plus the supervisor's own wind-down.
        assert!(
            stopped < Duration::from_secs(2 + 2),
            "{how:?}: stopped after {stopped:?}: {log}"
        );
        for pid in workers {
            assert!(
                !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "{how:?}: worker {pid} is still there"
            );
        }
    }
}

#[test]
fn accept_failing_for_lack_of_files_is_logged_once_then_counted() {
    // A throng whose open-file limit is 200 (soft and hard), started the
    // way the test kit starts any throng.
    let dir = TempDir::new("nofile");
    let wrapper = dir.file("throng");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nulimit -n 200 || exit 1\nexec {THRONG} \"$@\"\n"),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let server = Server::start(&wrapper.to_string_lossy(), &["--workers", "1"]);
    // More connections than the worker has files; they wait in the backlog
    // and every accept fails.
    let idle: Vec<TcpStream> = (0..300)
        .map(|i| connect_from(server.addr, Ipv4Addr::new(127, 0, 3, 1 + (i % 200) as u8)))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("Too many open files"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let first = lines(&server.log());
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].contains("open-file limit reached"), "{first:?}");
    drop(idle);
    // After the interval, one line with the count of the rest.
    wait_until("the count of the failures", || {
        lines(&server.log()).len() == 2
    });
    let summary = &lines(&server.log())[1];
    let count: u64 = summary
        .split("(x")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {summary}"));
    assert!(count >= 5, "{summary}");
    let failed = server.metric("throng_handshake_failures_total{reason=\"accept_error\"}");
    assert!(failed >= count as f64, "{failed} < {count}");
}

#[test]
fn a_public_address_without_auth_prints_a_loud_warning_even_with_json() {
    let server = serve(&["--listen", "0.0.0.0:0", "--workers", "1"]);
    let log = server.log();
    let warning: Vec<&str> = log.lines().filter(|l| l.contains("WARNING")).collect();
    assert!(
        warning
            .iter()
            .any(|l| l.contains("0.0.0.0:") && l.contains("no authentication")),
        "{log}"
    );
    for open in [
        "subscribe to any channel",
        "publish to every subscriber",
        "/metrics",
    ] {
        assert!(warning.iter().any(|l| l.contains(open)), "{open}: {log}");
    }
    let dir = TempDir::new("warn-key");
    std::fs::write(dir.file("key"), "0123456789abcdef0123").expect("key");
    let guarded = serve(&[
        "--listen",
        "0.0.0.0:0",
        "--workers",
        "1",
        "--publish-key-file",
        &dir.arg("key"),
    ]);
    assert!(!guarded.log().contains("WARNING"), "{}", guarded.log());
}

#[test]
fn bad_keys_stop_the_start_with_what_to_do() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let dir = TempDir::new("bad-keys");
    std::fs::write(dir.file("short"), "too short\n").expect("write");
    for (args, says) in [
        (
            vec!["--auth-public-key".to_owned(), mint.key("rsa.pem")],
            "this is a private key",
        ),
        (
            vec!["--auth-hs256-secret-file".to_owned(), dir.arg("short")],
            "at least 32 bytes",
        ),
        (
            vec!["--auth-public-key".to_owned(), dir.arg("missing.pem")],
            "cannot read",
        ),
        (
            vec!["--auth-issuer".to_owned(), "https://id.example".to_owned()],
            "give the key they are signed with",
        ),
        (
            vec!["--allowed-origins".to_owned(), "app.example.com".to_owned()],
            "is not an origin",
        ),
    ] {
        let out = output_within(
            throng()
                .args(["serve", "--listen", "127.0.0.1:0"])
                .args(&args),
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
