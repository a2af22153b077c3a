//! `POST /api/disconnect {"sub":..}` (docs/api.md) against a real `throng
//! serve` guarded by PyJWT tokens: one user's WebSocket (one channel and
//! `throng.v1` of several), event stream and MQTT connections closed, on
//! every worker and, through a real Redis, on another node; another
//! user's connections untouched; bad requests each answered; and the
//! presence `--presence` lists for a channel.

use std::io::Read;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use throng_proto::mqtt::Version;
use throng_testkit::jwt::Mint;
use throng_testkit::ws::next_text;
use throng_testkit::{Peer, TempDir, require};

use crate::api::{call, close_frame_then_end, sse};
use crate::channels::open;
use crate::mqtt_auth::{connected, guarded};
use crate::mqtt_listen::Got;
use crate::serve;

/// The publish key: disconnecting by subject takes it.
pub(crate) const KEY: &str = "the-publish-and-api-key-of-this-test";

/// `--publish-key-file` with [`KEY`], in `dir`.
pub(crate) fn key_file(dir: &TempDir) -> String {
    std::fs::write(dir.file("key"), format!("{KEY}\n")).expect("write the key");
    dir.arg("key")
}

/// Tokens of `alice` and `bob`, each granted `room.*` and `feed`.
fn tokens(mint: &Mint) -> (String, String) {
    let spec = |sub: &str| {
        json!({"alg": "HS256", "claims": {
            "sub": sub, "exp_in": 300, "channels": ["room.*", "feed"],
        }})
    };
    let mut t = mint.tokens(&[spec("alice"), spec("bob")]);
    let bob = t.pop().expect("two tokens");
    (t.pop().expect("two tokens"), bob)
}

/// A WebSocket subscriber of `channel` with `token`.
pub(crate) fn join(addr: SocketAddr, channel: &str, token: &str) -> throng_testkit::ws::Sub {
    let s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let url = format!("ws://{addr}/{channel}?token={token}");
    tungstenite::client(url, s).expect("upgrade").0
}

/// `POST /api/disconnect` with the key.
fn disconnect(addr: SocketAddr, body: &Value) -> (u16, Value) {
    call(addr, "POST", "/api/disconnect", Some(body), Some(KEY))
}

/// Asks `GET /api/channels/<channel>` (with the key) until it counts `n`.
fn wait_count(addr: SocketAddr, channel: &str, n: u64) {
    let path = format!("/api/channels/{channel}");
    let start = Instant::now();
    loop {
        let (status, v) = call(addr, "GET", &path, None, Some(KEY));
        assert_eq!(status, 200, "{v}");
        if v["subscribers"] == n {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{path}: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET /api/channels/<channel>`'s `presence` (`Null` when not listed).
fn presence(addr: SocketAddr, channel: &str) -> Value {
    let path = format!("/api/channels/{channel}");
    let (status, v) = call(addr, "GET", &path, None, Some(KEY));
    assert_eq!(status, 200, "{v}");
    if v.get("presence").is_some() {
        assert_eq!(
            (&v["presence_scope"], &v["presence_truncated"]),
            (&json!("node"), &json!(false)),
            "{v}"
        );
    }
    v["presence"].clone()
}

#[test]
fn disconnect_by_sub_closes_every_connection_of_that_user_and_no_other() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let dir = TempDir::new("api-sub");
    let key = key_file(&dir);
    let (server, mqtt) = guarded(
        &mint,
        &[
            "--workers",
            "2",
            "--publish-key-file",
            &key,
            "--presence",
            "room.*",
        ],
    );
    let addr = server.addr;
    let (alice, bob) = tokens(&mint);
    // Alice: two WebSockets (so on both workers, most likely), one of
    // several channels, an event stream and an MQTT 5.0 client.
    let mut ws = [join(addr, "room.a", &alice), join(addr, "room.a", &alice)];
    let mut many = open(addr, "/?channel=room.a&channel=feed", Some(&alice));
    let mut stream = sse(addr, &format!("room.a?token={alice}"));
    let mut m = connected(mqtt, Version::V5, Some(&alice));
    assert_eq!(m.subscribe(1, &["room.a"]), [0]);
    let mut kept = join(addr, "room.a", &bob);
    wait_count(addr, "room.a", 6);
    // Presence: who holds room.a (summed over the workers); feed is not
    // named by --presence.
    assert_eq!(
        presence(addr, "room.a"),
        json!([{"sub": "alice", "connections": 5}, {"sub": "bob", "connections": 1}])
    );
    assert_eq!(presence(addr, "feed"), Value::Null);
    let (status, v) = disconnect(
        addr,
        &json!({"sub": "alice", "code": 4003, "reason": "user removed"}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["sub"], &v["closed"], &v["scope"]),
        (&json!("alice"), &json!(5), &json!("server")),
        "{v}"
    );
    let why = (4003, "user removed".to_owned());
    for w in &mut ws {
        assert_eq!(close_frame_then_end(w), why);
    }
    assert_eq!(close_frame_then_end(&mut many), why, "all its channels");
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).expect("the stream ends");
    assert_eq!(
        m.next(),
        Some(Got::Disconnect(0x98)),
        "Administrative action"
    );
    assert_eq!(m.next(), None, "then closed");
    wait_count(addr, "room.a", 1);
    wait_count(addr, "feed", 0);
    assert_eq!(
        presence(addr, "room.a"),
        json!([{"sub": "bob", "connections": 1}])
    );
    // Bob is still subscribed and served.
    let (status, v) = call(
        addr,
        "POST",
        "/api/publish",
        Some(&json!({"channels": ["room.a"], "data": "still here"})),
        Some(KEY),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(next_text(&mut kept), "still here");
    server.wait_metric(
        "throng_connections_closed_total{reason=\"api_disconnect\"}",
        |v| v == 5.0,
    );
    // Alice is gone: a second order closes nothing; nor does a stranger's.
    for sub in ["alice", "carol"] {
        let (status, v) = disconnect(addr, &json!({ "sub": sub }));
        assert_eq!((status, &v["closed"]), (200, &json!(0)), "{v}");
    }
    // A token names channels, not users: it may not disconnect anyone.
    let body = json!({"sub": "bob"});
    let (status, v) = call(addr, "POST", "/api/disconnect", Some(&body), Some(&bob));
    assert_eq!(status, 403, "{v}");
    let long = "x".repeat(256);
    for (body, why) in [
        (json!({ "sub": long }), "1 to 255 bytes"),
        (json!({"sub": "bob", "channel": "room.a"}), "not both"),
        (json!({"sub": "bob", "code": 1005}), "cannot be sent"),
    ] {
        let (status, v) = disconnect(addr, &body);
        assert_eq!(status, 400, "{body}: {v}");
        assert!(v.to_string().contains(why), "{body}: {v}");
    }
    wait_count(addr, "room.a", 1);
}

#[test]
fn with_redis_a_disconnect_by_sub_reaches_the_other_node() {
    require!(Peer::PythonJwt, Peer::RedisServer, Peer::RedisCli);
    let mint = Mint::new();
    let dir = TempDir::new("api-sub-redis");
    let key = key_file(&dir);
    let secret = mint.key("hs256.key");
    let redis = throng_testkit::redis::Redis::start(&[], &[]);
    let url = redis.url();
    let node = |workers: &str| {
        let s = serve(&[
            "--redis",
            &url,
            "--workers",
            workers,
            "--auth-hs256-secret-file",
            &secret,
            "--publish-key-file",
            &key,
        ]);
        s.wait_broker("up");
        s
    };
    let (a, b) = (node("2"), node("1"));
    let (alice, bob) = tokens(&mint);
    let mut on_a = join(a.addr, "room.x", &alice);
    let mut on_b = [join(b.addr, "room.x", &alice), join(b.addr, "feed", &alice)];
    let mut bob_b = join(b.addr, "room.x", &bob);
    // Counted across the nodes (each writes its counts to Redis).
    for n in [&a, &b] {
        wait_count(n.addr, "room.x", 3);
        wait_count(n.addr, "feed", 1);
    }
    let (status, v) = disconnect(
        a.addr,
        &json!({"sub": "alice", "code": 4000, "reason": "bye"}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["closed"], &v["scope"], &v["nodes"]),
        (
            &json!(3),
            &json!("cluster"),
            &json!({"asked": 1, "answered": 1})
        ),
        "{v}"
    );
    let why = (4000, "bye".to_owned());
    assert_eq!(close_frame_then_end(&mut on_a), why);
    for w in &mut on_b {
        assert_eq!(close_frame_then_end(w), why);
    }
    for n in [&a, &b] {
        wait_count(n.addr, "room.x", 1);
        wait_count(n.addr, "feed", 0);
    }
    // Bob, on node B, still gets what node A publishes.
    let body = json!({"channels": ["room.x"], "data": "via redis"});
    let (status, v) = call(a.addr, "POST", "/api/publish", Some(&body), Some(KEY));
    assert_eq!(status, 200, "{v}");
    assert_eq!(next_text(&mut bob_b), "via redis");
}
