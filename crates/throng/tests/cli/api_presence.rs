//! Presence events (`--presence`, docs/channels.md) against a real `throng
//! serve` guarded by PyJWT tokens: a `throng.v1` WebSocket (and an event
//! stream of several channels) that asks for a
//! channel's joins and leaves (at connect with `presence=`, or in-band)
//! sees every user who joins or leaves it on any worker and, through a
//! real Redis, on another node, whose subjects `GET /api/channels/<c>`
//! then lists too; asking where presence is off is refused.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use throng_testkit::jwt::Mint;
use throng_testkit::{Peer, TempDir, require};
use tungstenite::Message;

use crate::api::{call, sse};
use crate::api_sub::{KEY, join, key_file};
use crate::channels::{Ws, answer, ask, open, refused};
use crate::serve;

/// Tokens of `watch`, `alice` and `bob`, each granted `room.*` and `feed`.
fn tokens(mint: &Mint) -> [String; 3] {
    let spec = |sub: &str| {
        json!({"alg": "HS256", "claims": {
            "sub": sub, "exp_in": 300, "channels": ["room.*", "feed"],
        }})
    };
    let t = mint.tokens(&[spec("watch"), spec("alice"), spec("bob")]);
    [t[0].clone(), t[1].clone(), t[2].clone()]
}

fn joined(channel: &str, sub: &str) -> Value {
    json!({"join": {"channel": channel, "sub": sub}})
}

fn left(channel: &str, sub: &str) -> Value {
    json!({"leave": {"channel": channel, "sub": sub}})
}

/// The next event of an event stream: its lines (the `retry:` hint and
/// keep-alive comments skipped).
fn event(s: &mut BufReader<TcpStream>) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            s.read_line(&mut line).expect("a line") > 0,
            "the stream ended"
        );
        let line = line.trim_end().to_owned();
        if line.is_empty() && !lines.is_empty() {
            return lines;
        }
        if !line.is_empty() && !line.starts_with("retry:") && !line.starts_with(':') {
            lines.push(line);
        }
    }
}

/// `GET /api/channels/<channel>` (with the key) until `ok` holds.
fn wait_channel(addr: SocketAddr, channel: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let path = format!("/api/channels/{channel}");
    let start = Instant::now();
    loop {
        let (status, v) = call(addr, "GET", &path, None, Some(KEY));
        assert_eq!(status, 200, "{v}");
        if ok(&v) {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{path}: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_watcher_sees_who_joins_and_leaves_on_every_worker() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let secret = mint.key("hs256.key");
    let server = serve(&[
        "--workers",
        "2",
        "--auth-hs256-secret-file",
        &secret,
        "--presence",
        "room.*",
    ]);
    let addr = server.addr;
    let [watch, alice, bob] = tokens(&mint);
    let proto = format!("Sec-WebSocket-Protocol: throng.v1, bearer.{watch}\r\n");
    for (target, why) in [
        ("/?channel=feed&presence=feed", "--presence"),
        ("/?channel=room.a&presence=room.b", "the query does not"),
    ] {
        let no = refused(addr, target, &proto);
        assert!(no.starts_with("HTTP/1.1 400"), "{target}: {no}");
        assert!(no.contains(why), "{target}: {no}");
    }
    let mut w = open(addr, "/?channel=room.a&presence=room.a", Some(&watch));
    assert_eq!(answer(&mut w), joined("room.a", "watch"), "its own join");
    // An event stream of several channels asks the same way.
    let target = format!("sse/?channel=room.a&presence=room.a&token={watch}");
    let mut events = BufReader::new(sse(addr, &target));
    let join_event =
        |sub: &str| ["event: join", "data: room.a", &format!("data: {sub}")].map(String::from);
    assert_eq!(event(&mut events), join_event("watch"));
    assert_eq!(answer(&mut w), joined("room.a", "watch"));
    // Alice on two sockets (most likely one on each worker), Bob on one of
    // several channels (feed has no presence).
    let mut a = [join(addr, "room.a", &alice), join(addr, "room.a", &alice)];
    assert_eq!(answer(&mut w), joined("room.a", "alice"));
    assert_eq!(answer(&mut w), joined("room.a", "alice"));
    let mut b = open(addr, "/?channel=room.a&channel=feed", Some(&bob));
    assert_eq!(answer(&mut w), joined("room.a", "bob"));
    for sub in ["alice", "alice", "bob"] {
        assert_eq!(event(&mut events), join_event(sub));
    }
    a[0].close(None).expect("close");
    assert_eq!(answer(&mut w), left("room.a", "alice"));
    assert_eq!(
        ask(&mut b, &json!({"unsubscribe": "room.a"})),
        json!({"unsubscribed": "room.a"})
    );
    assert_eq!(answer(&mut w), left("room.a", "bob"));
    let leave_event =
        |sub: &str| ["event: leave", "data: room.a", &format!("data: {sub}")].map(String::from);
    assert_eq!(event(&mut events), leave_event("alice"));
    assert_eq!(event(&mut events), leave_event("bob"));
    // In-band: refused where presence is off, and nothing else changes.
    let no = ask(&mut w, &json!({"subscribe": "feed", "presence": true}));
    assert_eq!(
        (&no["op"], &no["channel"]),
        (&json!("subscribe"), &json!("feed"))
    );
    assert!(
        no["error"].as_str().unwrap_or("").contains("--presence"),
        "{no}"
    );
    assert_eq!(
        ask(&mut w, &json!({"subscribe": "room.b", "presence": true})),
        json!({"subscribed": "room.b"})
    );
    assert_eq!(answer(&mut w), joined("room.b", "watch"));
    let mut on_b = join(addr, "room.b", &bob);
    assert_eq!(answer(&mut w), joined("room.b", "bob"));
    on_b.close(None).expect("close");
    assert_eq!(answer(&mut w), left("room.b", "bob"));
    // 10 to the WebSocket watcher, 6 to the event stream.
    server.wait_metric("throng_presence_events_total", |v| v == 16.0);
    drop(a);
}

#[test]
fn with_redis_presence_events_and_lists_cover_every_node() {
    require!(Peer::PythonJwt, Peer::RedisServer, Peer::RedisCli);
    let mint = Mint::new();
    let dir = TempDir::new("api-presence-redis");
    let key = key_file(&dir);
    let secret = mint.key("hs256.key");
    let redis = throng_testkit::redis::Redis::start(&[], &[]);
    let url = redis.url();
    let node = || {
        let s = serve(&[
            "--redis",
            &url,
            "--auth-hs256-secret-file",
            &secret,
            "--publish-key-file",
            &key,
            "--presence",
            "room.*",
        ]);
        s.wait_broker("up");
        s
    };
    let (a, b) = (node(), node());
    let [watch, alice, bob] = tokens(&mint);
    let mut w: Ws = open(a.addr, "/?channel=room.x&presence=room.x", Some(&watch));
    assert_eq!(answer(&mut w), joined("room.x", "watch"));
    // Joins on node B reach the watcher on node A.
    let on_b = join(b.addr, "room.x", &alice);
    assert_eq!(answer(&mut w), joined("room.x", "alice"));
    let mut bob_b = open(b.addr, "/?channel=feed", Some(&bob));
    assert_eq!(
        ask(&mut bob_b, &json!({"subscribe": "room.x"})),
        json!({"subscribed": "room.x"})
    );
    assert_eq!(answer(&mut w), joined("room.x", "bob"));
    // Both nodes list every node's subjects, once each has written them.
    let all = json!([
        {"sub": "alice", "connections": 1},
        {"sub": "bob", "connections": 1},
        {"sub": "watch", "connections": 1},
    ]);
    for n in [&a, &b] {
        let v = wait_channel(n.addr, "room.x", |v| v["presence"] == all);
        assert_eq!(
            (&v["presence_scope"], &v["subscribers"]),
            (&json!("cluster"), &json!(3)),
            "{v}"
        );
    }
    drop(on_b);
    assert_eq!(answer(&mut w), left("room.x", "alice"));
    bob_b
        .send(Message::text(json!({"unsubscribe": "room.x"}).to_string()))
        .expect("send");
    assert_eq!(answer(&mut w), left("room.x", "bob"));
    let only = json!([{"sub": "watch", "connections": 1}]);
    wait_channel(b.addr, "room.x", |v| v["presence"] == only);
    // A node that dies leaves the lists when its entries expire (15 s).
    let _again = join(b.addr, "room.x", &alice);
    assert_eq!(answer(&mut w), joined("room.x", "alice"));
    let two = json!([
        {"sub": "alice", "connections": 1},
        {"sub": "watch", "connections": 1},
    ]);
    wait_channel(a.addr, "room.x", |v| v["presence"] == two);
    drop(b); // SIGKILL: no leave is told, node B's entries expire
    wait_channel(a.addr, "room.x", |v| v["presence"] == only);
}
