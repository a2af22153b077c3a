//! The server API (docs/api.md) against a real `throng serve`: tungstenite
//! and raw Server-Sent Events subscribers on several channels and workers,
//! counts read back, a disconnect seen from the clients' side, the
//! history read back, a batch publish delivered, and bad requests each
//! answered with a clear 4xx.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use throng_testkit::TempDir;
use throng_testkit::http::{get, raw};
use throng_testkit::ws::{Sub, next_text, subscribe};

use crate::serve;

/// `method path` with an optional JSON body and `Authorization`; the
/// status and the body parsed as JSON (`Null` when it is not JSON).
pub(crate) fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    auth: Option<&str>,
) -> (u16, Value) {
    let body = body.map_or(String::new(), Value::to_string);
    let auth = auth.map_or(String::new(), |a| format!("Authorization: Bearer {a}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (status, _, text) = raw(addr, req.as_bytes());
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `POST path` with a JSON body and no credential.
pub(crate) fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    call(addr, "POST", path, Some(body), None)
}

fn api(addr: SocketAddr, path: &str) -> Value {
    let (status, v) = call(addr, "GET", path, None, None);
    assert_eq!(status, 200, "{path}: {v}");
    v
}

/// Asks `path` until `ok` holds of its answer (a subscriber is counted
/// once its worker has it in its table, just after the upgrade's answer).
fn wait_api(addr: SocketAddr, path: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let v = api(addr, path);
        if ok(&v) {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{path} still {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The internal (publishing) address from the start line.
fn internal(server: &throng_testkit::Server) -> SocketAddr {
    server.start["publish_listen"][0]
        .as_str()
        .and_then(|a| a.parse().ok())
        .expect("a --publish-listen address")
}

fn names(v: &Value) -> Vec<(String, u64)> {
    v["channels"]
        .as_array()
        .expect("a channel list")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["subscribers"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn subs(addr: SocketAddr, channel: &str, n: usize) -> Vec<Sub> {
    (0..n).map(|_| subscribe(addr, channel)).collect()
}

#[test]
fn counts_over_every_worker_by_prefix_and_page() {
    let server = serve(&["--workers", "3", "--publish-listen", "127.0.0.1:0"]);
    let (public, inside) = (server.addr, internal(&server));
    let _a = subs(public, "room.a", 4);
    let _b = subs(public, "room.b", 2);
    let _f = subs(public, "feed", 1);
    let all = wait_api(inside, "/api/channels", |v| names(v).len() == 3);
    assert_eq!(
        names(&all),
        [
            ("feed".into(), 1),
            ("room.a".into(), 4),
            ("room.b".into(), 2)
        ]
    );
    assert_eq!(all["next"], Value::Null);
    assert_eq!(all["scope"], "server");
    let rooms = api(inside, "/api/channels?prefix=room.");
    assert_eq!(names(&rooms), [("room.a".into(), 4), ("room.b".into(), 2)]);
    // A page of one, then the next after its cursor, then the end.
    let first = api(inside, "/api/channels?limit=1");
    assert_eq!(names(&first), [("feed".into(), 1)]);
    assert_eq!(first["next"], "feed");
    let second = api(inside, "/api/channels?limit=2&after=feed");
    assert_eq!(names(&second), [("room.a".into(), 4), ("room.b".into(), 2)]);
    assert_eq!(second["next"], Value::Null);
    let one = api(inside, "/api/channels/room.a");
    assert_eq!(one["subscribers"], 4, "{one}");
    assert_eq!(one.get("last_id"), None, "no history, no last id: {one}");
    assert_eq!(api(inside, "/api/channels/nobody")["subscribers"], 0);
    // The API is where publishing is, not on the public address.
    let (status, body) = get(public, "/api/channels");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--publish-listen"), "{body}");
    // Bad paging and names: a 400 that says what to change.
    for path in [
        "/api/channels?limit=0",
        "/api/channels?limit=1001",
        "/api/channels?limit=ten",
        "/api/channels?prefix=a%20b",
        "/api/channels/",
    ] {
        let (status, v) = call(inside, "GET", path, None, None);
        assert_eq!(status, 400, "{path}: {v}");
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{path}: {v}"
        );
    }
}

/// A raw Server-Sent Events subscriber of `channel`, past its head.
pub(crate) fn sse(addr: SocketAddr, channel: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let req = format!("GET /{channel} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n");
    s.write_all(req.as_bytes()).expect("send");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).expect("the head"), 1, "ended in the head");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// The server's close frame (code and reason), after reading up to the
/// end of the connection (tungstenite answers the close).
pub(crate) fn close_frame_then_end(ws: &mut Sub) -> (u16, String) {
    let mut got = None;
    loop {
        match ws.read() {
            Ok(tungstenite::Message::Close(Some(f))) => {
                got = Some((u16::from(f.code), f.reason.to_string()));
            }
            Ok(_) => {}
            Err(tungstenite::Error::ConnectionClosed) => return got.expect("a close frame"),
            Err(e) => panic!("expected a close frame, then the end: {e}"),
        }
    }
}

#[test]
fn disconnect_closes_a_channels_subscribers_with_the_code_and_no_others() {
    let server = serve(&["--workers", "2", "--publish-listen", "127.0.0.1:0"]);
    let (public, inside) = (server.addr, internal(&server));
    let mut gone = subs(public, "revoked", 3);
    let mut stream = sse(public, "revoked");
    let mut kept = subscribe(public, "kept");
    wait_api(inside, "/api/channels/revoked", |v| v["subscribers"] == 4);
    let (status, v) = post(
        inside,
        "/api/disconnect",
        &json!({"channel": "revoked", "code": 4000, "reason": "access revoked"}),
    );
    assert_eq!((status, &v["closed"]), (200, &json!(4)), "{v}");
    for ws in &mut gone {
        assert_eq!(
            close_frame_then_end(ws),
            (4000, "access revoked".to_owned())
        );
    }
    // The event stream ends (its client reconnects, as after any end).
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).expect("the stream ends");
    wait_api(inside, "/api/channels/revoked", |v| v["subscribers"] == 0);
    // The other channel's subscriber is still there and still served.
    let (status, v) = post(
        inside,
        "/api/publish",
        &json!({"channels": ["kept"], "data": "still here"}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(next_text(&mut kept), "still here");
    server.wait_metric(
        "throng_connections_closed_total{reason=\"api_disconnect\"}",
        |v| v == 4.0,
    );
    // A channel nobody holds: nothing closed, not an error.
    let (status, v) = post(inside, "/api/disconnect", &json!({"channel": "empty"}));
    assert_eq!((status, &v["closed"]), (200, &json!(0)), "{v}");
    for (body, why) in [
        ("{\"channel\":", "not a disconnect request"),
        ("{\"channel\":\"a\",\"colour\":1}", "unknown field"),
        ("{\"sub\":\"\"}", "sub: 1 to 255 bytes"),
        ("{\"sub\":\"u\",\"channel\":\"a\"}", "not both"),
        ("{}", "name the channel"),
        ("{\"channel\":\"a\",\"code\":1005}", "cannot be sent"),
        ("{\"channel\":\"bad name\"}", "channel"),
    ] {
        let req = format!(
            "POST /api/disconnect HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (status, _, text) = raw(inside, req.as_bytes());
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(why), "{body}: {text}");
    }
}

#[test]
fn batch_publish_reaches_every_channel_and_the_history_reads_back() {
    let server = serve(&[
        "--workers",
        "2",
        "--history",
        "5",
        "--publish-listen",
        "127.0.0.1:0",
    ]);
    let (public, inside) = (server.addr, internal(&server));
    let mut a = subscribe(public, "a");
    let mut b = subscribe(public, "b");
    wait_api(inside, "/api/channels", |v| names(v).len() == 2);
    let (status, v) = post(
        inside,
        "/api/publish",
        &json!({"channels": ["a", "b", "c"], "data": "to all"}),
    );
    assert_eq!(status, 200, "{v}");
    let results = v["results"].as_array().expect("results");
    let counts: Vec<(&str, u64)> = results
        .iter()
        .map(|r| {
            (
                r["channel"].as_str().unwrap(),
                r["subscribers"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(counts, [("a", 1), ("b", 1), ("c", 0)]);
    assert!(results.iter().all(|r| r["id"].is_string()), "{v}");
    assert_eq!(next_text(&mut a), "to all");
    assert_eq!(next_text(&mut b), "to all");
    // JSON data goes as its JSON text.
    let (status, _) = post(
        inside,
        "/api/publish",
        &json!({"channels": ["a"], "data": {"n": 2}}),
    );
    assert_eq!(status, 200);
    assert_eq!(next_text(&mut a), "{\"n\":2}");
    let first = results[0]["id"].as_str().unwrap().to_owned();
    let h = api(inside, "/api/history/a");
    let ids: Vec<&str> = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{h}");
    assert_eq!(ids[0], first);
    assert_eq!(h["messages"][1]["data"], "{\"n\":2}");
    assert_eq!(api(inside, "/api/channels/a")["last_id"], ids[1]);
    // A page of one, then what follows its `next`.
    let page = api(inside, "/api/history/a?limit=1");
    assert_eq!(page["messages"].as_array().unwrap().len(), 1);
    assert_eq!(page["next"], first.as_str());
    let after = api(inside, &format!("/api/history/a?since={first}"));
    assert_eq!(after["messages"][0]["id"], ids[1]);
    assert_eq!(
        (after["complete"].as_bool(), after["next"].is_null()),
        (Some(true), true)
    );
    assert_eq!(api(inside, "/api/history/never")["messages"], json!([]));
    for (method, path, body, status) in [
        ("GET", "/api/history/a?since=yesterday", None, 400),
        ("GET", "/api/history/a?limit=0", None, 400),
        (
            "POST",
            "/api/publish",
            Some(json!({"channels": [], "data": "x"})),
            400,
        ),
        (
            "POST",
            "/api/publish",
            Some(json!({"channels": ["a b"], "data": "x"})),
            400,
        ),
        (
            "POST",
            "/api/publish",
            Some(json!({"channel": "a", "data": "x"})),
            400,
        ),
        ("GET", "/api/publish", None, 405),
        ("POST", "/api/channels", None, 405),
        ("GET", "/api/presence/a", None, 404),
    ] {
        let (got, v) = call(inside, method, path, body.as_ref(), None);
        assert_eq!(got, status, "{method} {path}: {v}");
        assert!(v["error"].is_string(), "{method} {path}: {v}");
    }
    // The API's reads are not subscribers' recoveries.
    for result in ["complete", "incomplete"] {
        let sample = format!("throng_recoveries_total{{result=\"{result}\"}}");
        assert_eq!(server.metric(&sample), 0.0, "{sample}");
    }
    // Nothing was published by the refused requests.
    assert_eq!(
        api(inside, "/api/history/a")["messages"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    drop(server);
    let plain = serve(&["--workers", "1"]);
    let (status, v) = call(plain.addr, "GET", "/api/history/a", None, None);
    assert_eq!(status, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("--history"), "{v}");
}

#[test]
fn the_api_takes_the_publish_key() {
    let dir = TempDir::new("api-key");
    let key = "an-api-and-publish-key-of-some-length";
    std::fs::write(dir.file("key"), format!("{key}\n")).expect("write the key");
    let server = serve(&["--workers", "1", "--publish-key-file", &dir.arg("key")]);
    let addr = server.addr;
    for auth in [None, Some("not-the-key")] {
        for (method, path) in [
            ("GET", "/api/channels"),
            ("GET", "/api/history/a"),
            ("POST", "/api/disconnect"),
        ] {
            let body = json!({"channel": "a"});
            let (status, _) = call(addr, method, path, Some(&body), auth);
            assert!(
                status == 401 || status == 403,
                "{method} {path} with {auth:?}: {status}"
            );
        }
    }
    let (status, v) = call(addr, "GET", "/api/channels", None, Some(key));
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(
        addr,
        "POST",
        "/api/disconnect",
        Some(&json!({"channel": "a"})),
        Some(key),
    );
    assert_eq!((status, &v["closed"]), (200, &json!(0)), "{v}");
}

#[test]
fn with_redis_counts_cover_every_node_and_the_history_is_the_stream() {
    throng_testkit::require!(
        throng_testkit::Peer::RedisServer,
        throng_testkit::Peer::RedisCli
    );
    let redis = throng_testkit::redis::Redis::start(&[], &[]);
    let url = redis.url();
    let node = |workers: &str| {
        let s = serve(&["--redis", &url, "--workers", workers, "--history", "10"]);
        s.wait_broker("up");
        s
    };
    let (a, b) = (node("2"), node("1"));
    let _on_a = subs(a.addr, "room", 3);
    let mut on_b = subscribe(b.addr, "room");
    let _hall_on_b = subscribe(b.addr, "hall");
    // Each node counts the other's subscribers too, through Redis.
    for n in [&a, &b] {
        wait_api(n.addr, "/api/channels/room", |v| v["subscribers"] == 4);
        let listed = wait_api(n.addr, "/api/channels", |v| {
            names(v) == [("hall".to_owned(), 1), ("room".to_owned(), 4)]
        });
        assert_eq!(listed["scope"], "cluster", "{listed}");
    }
    let one = api(a.addr, "/api/channels/room");
    assert_eq!(one["scope"], "cluster", "{one}");
    let page = api(a.addr, "/api/channels?limit=1");
    assert_eq!(
        (names(&page), &page["next"]),
        (vec![("hall".into(), 1)], &json!("hall"))
    );
    // Published through node A, delivered on node B, read back from the
    // stream on node B.
    let (status, v) = post(
        a.addr,
        "/api/publish",
        &json!({"channels": ["room", "hall"], "data": "via redis"}),
    );
    assert_eq!(status, 200, "{v}");
    assert!(v["results"][0]["redis_receivers"].as_u64().is_some(), "{v}");
    assert_eq!(next_text(&mut on_b), "via redis");
    let h = wait_api(b.addr, "/api/history/room", |v| {
        v["messages"].as_array().is_some_and(|m| m.len() == 1)
    });
    assert_eq!(h["messages"][0]["data"], "via redis");
    let last = api(b.addr, "/api/channels/room")["last_id"].clone();
    assert_eq!(last, h["messages"][0]["id"], "{h}");
    let sample = "throng_recoveries_total{result=\"complete\"}";
    assert_eq!(b.metric(sample), 0.0, "API reads are not recoveries");
    // A disconnect on node A is relayed to node B: 3 closed there, 1 here.
    let (status, v) = post(
        a.addr,
        "/api/disconnect",
        &json!({"channel": "room", "code": 4001, "reason": "revoked"}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["closed"], &v["scope"], &v["nodes"]),
        (
            &json!(4),
            &json!("cluster"),
            &json!({"asked": 1, "answered": 1})
        ),
        "{v}"
    );
    assert_eq!(close_frame_then_end(&mut on_b), (4001, "revoked".into()));
    wait_api(b.addr, "/api/channels/room", |v| v["subscribers"] == 0);
    // A node that dies stops counting once its counts expire in Redis.
    b.signal("KILL");
    let start = Instant::now();
    while api(a.addr, "/api/channels/hall")["subscribers"] != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "node B still counted"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(on_b);
}

#[test]
fn disconnect_sends_mqtt_5_clients_administrative_action() {
    use crate::mqtt_listen::{Client, Got, mqtt_server};
    use throng_proto::mqtt::Version;
    let (s, mqtt) = mqtt_server(&["--workers", "2"]);
    let mut v5 = Client::connect(mqtt, Version::V5, "v5");
    let mut v3 = Client::connect(mqtt, Version::V311, "v3");
    assert_eq!(v5.subscribe(1, &["plant/1", "plant/2"]), [0, 0]);
    assert_eq!(v3.subscribe(1, &["plant/1"]), [0]);
    wait_api(s.addr, "/api/channels/plant/1", |v| v["subscribers"] == 2);
    let (status, v) = post(
        s.addr,
        "/api/disconnect",
        &json!({"channel": "plant/1", "code": 4000}),
    );
    assert_eq!((status, &v["closed"]), (200, &json!(2)), "{v}");
    assert_eq!(
        v5.next(),
        Some(Got::Disconnect(0x98)),
        "Administrative action"
    );
    assert_eq!(v5.next(), None, "then closed");
    // 3.1.1 has no DISCONNECT from a server: closed without a word.
    assert_eq!(v3.next(), None);
    // The closed 5.0 client's other subscription went with it.
    wait_api(s.addr, "/api/channels", |v| names(v).is_empty());
}

#[test]
fn a_token_sees_and_acts_on_the_channels_its_publish_claim_grants() {
    use throng_testkit::jwt::Mint;
    throng_testkit::require!(throng_testkit::Peer::PythonJwt);
    let mint = Mint::new();
    let server = serve(&[
        "--workers",
        "2",
        "--auth-hs256-secret-file",
        &mint.key("hs256.key"),
    ]);
    let tokens = mint.tokens(&[
        json!({"alg": "HS256", "claims": {"exp_in": 60, "channels": ["room.*", "other"]}}),
        json!({"alg": "HS256", "claims": {"exp_in": 60, "publish": ["room.*"]}}),
    ]);
    let (reader, admin) = (&tokens[0], &tokens[1]);
    let join = |channel: &str| {
        let s = TcpStream::connect(server.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        let url = format!("ws://{}/{channel}?token={reader}", server.addr);
        tungstenite::client(url, s).expect("upgrade").0
    };
    let _held = [join("room.a"), join("other")];
    let mut room = join("room.b");
    let addr = server.addr;
    let list = |auth: &str| {
        let (status, v) = call(addr, "GET", "/api/channels", None, Some(auth));
        assert_eq!(status, 200, "{v}");
        v
    };
    // The admin token lists room.* only (`other` is held too, not shown).
    let start = Instant::now();
    while names(&list(admin)).len() < 2 {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", list(admin));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        names(&list(admin)),
        [("room.a".into(), 1), ("room.b".into(), 1)]
    );
    for (method, path, body) in [
        ("GET", "/api/channels/other", None),
        ("GET", "/api/channels", None),
        ("POST", "/api/disconnect", Some(json!({"channel": "other"}))),
        (
            "POST",
            "/api/publish",
            Some(json!({"channels": ["room.b", "other"], "data": "no"})),
        ),
    ] {
        // A subscribe-only token may not; the admin token may not outside its grant.
        let token = if path == "/api/channels" {
            reader
        } else {
            admin
        };
        let (status, v) = call(addr, method, path, body.as_ref(), Some(token));
        if path == "/api/channels" {
            assert_eq!(
                names(&v),
                [],
                "a token without publish grants lists nothing: {v}"
            );
            continue;
        }
        assert_eq!(status, 403, "{method} {path}: {v}");
    }
    let (status, v) = call(addr, "GET", "/api/channels/room.b", None, None);
    assert_eq!(status, 401, "{v}");
    // The refused batch published nothing: the next message room.b gets is this one.
    let (status, v) = call(
        addr,
        "POST",
        "/api/publish",
        Some(&json!({"channels": ["room.b"], "data": "yes"})),
        Some(admin),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(next_text(&mut room), "yes");
}

#[test]
fn keep_alive_holds_unless_a_body_was_left_unread() {
    let server = serve(&["--workers", "1"]);
    let two = |first: &str| {
        let mut s = TcpStream::connect(server.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        let second = "GET /api/channels/b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        s.write_all(format!("{first}{second}").as_bytes())
            .expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out.matches("HTTP/1.1 ").count()
    };
    assert_eq!(two("GET /api/channels HTTP/1.1\r\nHost: x\r\n\r\n"), 2);
    let post =
        "POST /api/disconnect HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\n{\"channel\":\"a\"}";
    assert_eq!(two(post), 2, "a body read: the next request is answered");
    // A body the route refused without reading: closed after the answer.
    let unread = "POST /api/channels HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    assert_eq!(two(unread), 1);
}
