//! `throng serve --redis` as a cluster: real `redis-server`, two real nodes,
//! real HAProxy in front, publishing through a node's HTTP API and through
//! `redis-cli PUBLISH`; Redis stopped and restarted under live subscribers;
//! channels mode checked with `PUBSUB NUMSUB`.

use std::io::Write as _;
use std::process::Stdio;

use throng_testkit::haproxy::Haproxy;
use throng_testkit::http::{get, publish, publish_redis};
use throng_testkit::redis::Redis;
use throng_testkit::ws::{Sub, next_text, subscribe};
use throng_testkit::{Peer, Server, free_port, require, wait_until};

use crate::{serve, throng};

/// Redis with an ACL user (and the default user locked behind a password),
/// so every node must AUTH as `alice` to get anywhere.
fn redis_with_acl() -> (Redis, String) {
    let redis = Redis::start(
        &[
            "--requirepass",
            "not-for-throng",
            "--user",
            "alice",
            "on",
            ">s3cret:p@ss",
            "~*",
            "&*",
            "+@all",
        ],
        &["--user", "alice", "--pass", "s3cret:p@ss"],
    );
    // ':' and '@' in the password travel %-escaped; DB 1 is SELECTed.
    let url = format!("redis://alice:s3cret%3Ap%40ss@127.0.0.1:{}/1", redis.port);
    (redis, url)
}

/// A node routing through Redis; returns once its broker link is up.
fn node(url: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--redis", url];
    args.extend_from_slice(extra);
    let s = serve(&args);
    s.wait_broker("up");
    s
}

fn open_on(s: &Server) -> f64 {
    s.metric("throng_connections_open")
}

#[test]
fn two_nodes_behind_haproxy_deliver_every_message_once_in_order() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::Haproxy);
    let (redis, url) = redis_with_acl();
    let a = node(&url, &["--workers", "2"]);
    let b = node(&url, &["--workers", "1"]);
    let lb = Haproxy::balance(&[a.addr, b.addr]);

    let mut subs: Vec<Sub> = (0..20).map(|_| subscribe(lb.addr, "room.1")).collect();
    wait_until("20 subscribers over both nodes", || {
        open_on(&a) + open_on(&b) == 20.0
    });
    let (on_a, on_b) = (open_on(&a), open_on(&b));
    assert!(
        on_a >= 1.0 && on_b >= 1.0,
        "HAProxy spread them: {on_a} on A, {on_b} on B"
    );

    // Alternate node A's HTTP API and redis-cli; each call returns after
    // Redis took the PUBLISH, so the sequence is one order for everyone.
    let mut sent = Vec::new();
    for i in 0..30 {
        let body = format!("message {i} ✓");
        if i % 2 == 0 {
            assert_eq!(publish_redis(a.addr, "room.1", &body), 2, "both nodes");
        } else {
            let out = redis.cli(&["PUBLISH", "throng:room.1", &body]);
            assert_eq!(out, vec!["2".to_owned()], "both nodes");
        }
        sent.push(body);
    }
    // A marker last: nothing (no duplicate) may come between the 30 and it.
    assert_eq!(publish_redis(b.addr, "room.1", "end"), 2);
    sent.push("end".into());
    for (k, s) in subs.iter_mut().enumerate() {
        for (i, want) in sent.iter().enumerate() {
            assert_eq!(&next_text(s), want, "subscriber {k}, message {i}");
        }
    }
    for n in [&a, &b] {
        n.wait_metric("throng_broker_messages_received_total", |v| v == 31.0);
        assert_eq!(n.metric("throng_broker_up"), 1.0);
        assert_eq!(n.metric("throng_broker_subscriptions"), 1.0);
        assert_eq!(n.metric("throng_broker_reconnects_total"), 0.0);
    }
    a.wait_metric("throng_frames_delivered_total", |v| v == 31.0 * on_a);
    b.wait_metric("throng_frames_delivered_total", |v| v == 31.0 * on_b);
}

#[test]
fn redis_restart_keeps_subscribers_and_publishing_fails_cleanly_meanwhile() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::Haproxy);
    let (mut redis, url) = redis_with_acl();
    let a = node(&url, &["--workers", "2"]);
    let b = node(&url, &["--workers", "1", "--redis-mode", "channels"]);
    let lb = Haproxy::balance(&[a.addr, b.addr]);
    let mut subs: Vec<Sub> = (0..10).map(|_| subscribe(lb.addr, "live")).collect();
    wait_until("10 subscribers", || open_on(&a) + open_on(&b) == 10.0);
    let (on_a, on_b) = (open_on(&a), open_on(&b));
    wait_until("node B subscribed to throng:live", || {
        redis.numsub("throng:live") == 1
    });
    assert_eq!(publish_redis(a.addr, "live", "before"), 2);
    for s in &mut subs {
        assert_eq!(next_text(s), "before");
    }

    redis.stop();
    a.wait_broker("down");
    b.wait_broker("down");
    for n in [&a, &b] {
        let (status, body) = publish(n.addr, "live", b"lost", None);
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains("cannot publish") && body.contains("127.0.0.1"),
            "{body}"
        );
        assert!(!body.contains("s3cret"), "the password never shows: {body}");
        n.wait_metric("throng_broker_up", |v| v == 0.0);
        assert_eq!(n.metric("throng_broker_subscriptions"), 0.0);
        n.wait_metric("throng_broker_outage_seconds", |v| v > 0.0);
        assert!(n.metric("throng_broker_publish_failures_total") >= 1.0);
    }
    assert_eq!(
        (open_on(&a), open_on(&b)),
        (on_a, on_b),
        "no subscriber dropped because of the broker"
    );

    redis.restart();
    a.wait_broker("up");
    b.wait_broker("up");
    // B (channels mode) subscribed again to what its subscribers need.
    assert_eq!(redis.numsub("throng:live"), 1);
    assert_eq!(publish_redis(b.addr, "live", "after"), 2);
    let out = redis.cli(&["PUBLISH", "throng:live", "after 2"]);
    assert_eq!(out, vec!["2".to_owned()]);
    for s in &mut subs {
        assert_eq!(next_text(s), "after", "the failed publishes never arrive");
        assert_eq!(next_text(s), "after 2");
    }
    for n in [&a, &b] {
        assert_eq!(n.metric("throng_broker_reconnects_total"), 1.0);
        assert_eq!(n.metric("throng_broker_outage_seconds"), 0.0);
        n.wait_metric("throng_broker_subscriptions", |v| v == 1.0);
        assert!(n.metric("throng_broker_outage_seconds_total") > 0.0);
        // The line reaches the test through a reader thread: give it time.
        wait_until("the node to say Redis is back", || {
            n.log().contains("is back after")
        });
    }
    assert_eq!((open_on(&a), open_on(&b)), (on_a, on_b));
}

#[test]
fn channels_mode_subscribes_only_to_channels_with_local_subscribers() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let (redis, url) = redis_with_acl();
    let a = node(&url, &["--workers", "2", "--redis-mode", "channels"]);
    let b = node(&url, &["--workers", "1", "--redis-mode", "channels"]);
    // Beside the control channels every node hears (MQTT client id
    // claims, shared subscriptions' members), nothing yet.
    assert_eq!(
        redis.channels("throng:#*"),
        ["throng:#claims", "throng:#shares"]
    );
    assert_eq!(redis.numsub("throng:#claims"), 2, "both nodes");
    assert!(redis.channels("throng:[^#]*").is_empty(), "nothing yet");

    let mut alpha: Vec<Sub> = (0..4).map(|_| subscribe(a.addr, "alpha")).collect();
    let mut beta = subscribe(b.addr, "beta");
    wait_until("PUBSUB CHANNELS shows alpha and beta", || {
        redis.channels("throng:[^#]*") == ["throng:alpha", "throng:beta"]
    });
    // One subscription per node, whatever its workers and subscribers.
    assert_eq!(redis.numsub("throng:alpha"), 1);
    assert_eq!(redis.numsub("throng:beta"), 1);
    a.wait_metric("throng_broker_subscriptions", |v| v == 1.0);
    b.wait_metric("throng_broker_subscriptions", |v| v == 1.0);

    // Published on B, delivered by A only: B is not subscribed to alpha.
    assert_eq!(publish_redis(b.addr, "alpha", "a1"), 1);
    assert_eq!(publish_redis(a.addr, "beta", "b1"), 1);
    for s in &mut alpha {
        assert_eq!(next_text(s), "a1");
    }
    assert_eq!(next_text(&mut beta), "b1");
    a.wait_metric("throng_broker_messages_received_total", |v| v == 1.0);
    b.wait_metric("throng_broker_messages_received_total", |v| v == 1.0);
    assert_eq!(publish_redis(a.addr, "nobody", "x"), 0);

    // The last subscriber of alpha leaves: A unsubscribes.
    for mut s in alpha.drain(..3) {
        s.close(None).unwrap();
        while s.read().is_ok() {}
    }
    a.wait_metric("throng_connections_open", |v| v == 1.0);
    assert_eq!(redis.numsub("throng:alpha"), 1, "one subscriber is left");
    let mut last = alpha.pop().unwrap();
    last.close(None).unwrap();
    while last.read().is_ok() {}
    wait_until("A to UNSUBSCRIBE throng:alpha", || {
        redis.numsub("throng:alpha") == 0
    });
    assert_eq!(redis.channels("throng:[^#]*"), ["throng:beta"]);
    a.wait_metric("throng_broker_subscriptions", |v| v == 0.0);
}

#[test]
fn unreachable_redis_is_an_error_at_start_unless_redis_wait() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let out = throng()
        .args(["serve", "--listen", "127.0.0.1:0", "--redis", &url])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("cannot use Redis at redis://127.0.0.1:{port}/0"))
            && err.contains("--redis-wait"),
        "{err}"
    );

    let (redis, _) = redis_with_acl();
    let wrong = format!("redis://alice:nope@127.0.0.1:{}", redis.port);
    let out = throng()
        .args(["serve", "--listen", "127.0.0.1:0", "--redis", &wrong])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("WRONGPASS") && !err.contains("nope"), "{err}");
    drop(redis);

    // --redis-wait: serves at once, subscribers welcome, publishing refused
    // until Redis appears on that port.
    let mut late = Redis::start(&[], &[]);
    late.stop();
    let url = format!("redis://127.0.0.1:{}", late.port);
    let s = serve(&["--redis", &url, "--redis-wait"]);
    s.wait_broker("down");
    let mut sub = subscribe(s.addr, "early");
    let (status, body) = publish(s.addr, "early", b"too soon", None);
    assert_eq!(status, 503, "{body}");
    late.restart();
    s.wait_broker("up");
    assert_eq!(publish_redis(s.addr, "early", "now"), 1);
    assert_eq!(next_text(&mut sub), "now");
    assert_eq!(s.metric("throng_broker_reconnects_total"), 0.0);
}

/// Regression: more messages at once than the node keeps in flight (256):
/// it holds back reading, and must still relay what it already read.
#[test]
fn a_burst_beyond_the_in_flight_window_arrives_whole_and_in_order() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let (redis, url) = redis_with_acl();
    let a = node(&url, &["--workers", "2"]);
    let mut subs: Vec<Sub> = (0..6).map(|_| subscribe(a.addr, "burst")).collect();
    a.wait_metric("throng_connections_open", |v| v == 6.0);
    let n = 3000;
    let script: String = (0..n)
        .map(|i| format!("PUBLISH throng:burst m{i}\n"))
        .collect();
    let mut cli = redis
        .cli_command()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    cli.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(cli.wait().unwrap().success());
    for s in &mut subs {
        for i in 0..n {
            assert_eq!(next_text(s), format!("m{i}"));
        }
    }
    a.wait_metric("throng_broker_messages_received_total", |v| {
        v == f64::from(n)
    });
    assert_eq!(a.metric("throng_broker_reconnects_total"), 0.0);
}

/// A Redis that hangs (SIGSTOP: connections open, no answers) is noticed by
/// the node's pings and treated as an outage, and the node comes back after.
#[test]
fn a_hung_redis_counts_as_an_outage() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let (redis, url) = redis_with_acl();
    let a = node(&url, &["--workers", "1"]);
    let mut sub = subscribe(a.addr, "hang");
    a.wait_metric("throng_connections_open", |v| v == 1.0);
    redis.signal("STOP");
    a.wait_broker("down");
    assert!(
        get(a.addr, "/healthz").1.contains("answer within"),
        "{}",
        get(a.addr, "/healthz").1
    );
    let (status, body) = publish(a.addr, "hang", b"lost", None);
    assert_eq!(status, 503, "{body}");
    redis.signal("CONT");
    a.wait_broker("up");
    assert_eq!(publish_redis(a.addr, "hang", "back"), 1);
    assert_eq!(next_text(&mut sub), "back");
    assert_eq!(a.metric("throng_broker_reconnects_total"), 1.0);
}
