//! `rediss://`: the Redis links over TLS, against a real `redis-server`
//! listening only on a TLS port with a certificate the test makes with the
//! `openssl` CLI. A node delivers what is published over HTTP and with
//! `redis-cli --tls`, survives a restart of Redis under live subscribers,
//! refuses a certificate it cannot check with a clear error, and
//! `throng hold --publish rediss://user:password@...` authenticates and
//! reaches every held connection.

use std::process::Stdio;

use throng_testkit::certs::Certs;
use throng_testkit::http::{get, publish, publish_redis};
use throng_testkit::redis::Redis;
use throng_testkit::ws::{Sub, next_text, subscribe};
use throng_testkit::{Peer, Server, require, wait_until};

use crate::{serve, throng};

/// TLS-only Redis where only the ACL user `alice` gets anywhere.
fn tls_redis(name: &str) -> Redis {
    Redis::start_tls(
        Certs::generate(name),
        &[
            "--requirepass",
            "not-for-throng",
            "--user",
            "alice",
            "on",
            ">s3cret",
            "~*",
            "&*",
            "+@all",
        ],
        &["--user", "alice", "--pass", "s3cret"],
    )
}

/// A node with `--redis <url> --redis-tls-ca <the test CA>`, once its link is up.
fn node(redis: &Redis, url: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--redis", url, "--redis-tls-ca", redis.certs().ca()];
    args.extend_from_slice(extra);
    let s = serve(&args);
    s.wait_broker("up");
    s
}

/// `throng serve` with `args` that must fail at start: its stderr.
fn serve_fails(args: &[&str]) -> String {
    let out = throng()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "should fail: {args:?}\n{err}");
    err
}

#[test]
fn nodes_over_tls_deliver_everything_and_survive_a_redis_restart() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::Openssl);
    let mut redis = tls_redis("rediss-nodes");
    // A by IP address (no SNI; the certificate names 127.0.0.1), B by name
    // (SNI localhost) in channels mode.
    let a = node(
        &redis,
        &format!("rediss://alice:s3cret@127.0.0.1:{}/1", redis.port),
        &["--workers", "2"],
    );
    let b = node(
        &redis,
        &format!("rediss://alice:s3cret@localhost:{}", redis.port),
        &["--workers", "1", "--redis-mode", "channels"],
    );
    assert!(
        a.log().contains("connected to Redis at rediss://"),
        "{}",
        a.log()
    );
    let mut subs: Vec<Sub> = (0..6)
        .map(|i| subscribe(if i % 2 == 0 { a.addr } else { b.addr }, "tls.room"))
        .collect();
    a.wait_metric("throng_connections_open", |v| v == 3.0);
    b.wait_metric("throng_connections_open", |v| v == 3.0);
    wait_until("B subscribed to throng:tls.room", || {
        redis.numsub("throng:tls.room") == 1
    });
    let mut sent = Vec::new();
    for i in 0..10 {
        let body = format!("secret {i}");
        if i % 2 == 0 {
            assert_eq!(publish_redis(a.addr, "tls.room", &body), 2, "both nodes");
        } else {
            let out = redis.cli(&["PUBLISH", "throng:tls.room", &body]);
            assert_eq!(out, vec!["2".to_owned()], "both nodes");
        }
        sent.push(body);
    }
    for s in &mut subs {
        for want in &sent {
            assert_eq!(&next_text(s), want);
        }
    }

    redis.stop();
    a.wait_broker("down");
    b.wait_broker("down");
    let (status, body) = publish(a.addr, "tls.room", b"lost", None);
    assert_eq!(status, 503, "{body}");
    redis.restart();
    a.wait_broker("up");
    b.wait_broker("up");
    // Resubscribed over the new TLS connections: B to its channel again.
    assert_eq!(redis.numsub("throng:tls.room"), 1);
    assert_eq!(publish_redis(b.addr, "tls.room", "after"), 2);
    let out = redis.cli(&["PUBLISH", "throng:tls.room", "after 2"]);
    assert_eq!(out, vec!["2".to_owned()]);
    for s in &mut subs {
        assert_eq!(next_text(s), "after", "the refused publish never arrives");
        assert_eq!(next_text(s), "after 2");
    }
    for n in [&a, &b] {
        assert_eq!(n.metric("throng_broker_reconnects_total"), 1.0);
        n.wait_metric("throng_connections_open", |v| v == 3.0);
    }
}

#[test]
fn certificates_that_cannot_be_checked_are_clear_errors() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::Openssl);
    let redis = tls_redis("rediss-errors");
    let url = format!("rediss://alice:s3cret@127.0.0.1:{}", redis.port);
    let shown = format!(
        "cannot use Redis at rediss://alice:***@127.0.0.1:{}/0",
        redis.port
    );

    // A CA that did not sign Redis's certificate.
    let other = redis.certs().new_ca("other");
    let other = other.as_str();
    let err = serve_fails(&["--redis", &url, "--redis-tls-ca", other]);
    assert!(err.contains(&shown) && err.contains("certificate"), "{err}");
    assert!(!err.contains("s3cret"), "the password never shows: {err}");
    // No CA given: the system bundle, which does not know the test CA either.
    let err = serve_fails(&["--redis", &url]);
    assert!(err.contains(&shown) && err.contains("certificate"), "{err}");
    // A CA file that is not there.
    let err = serve_fails(&["--redis", &url, "--redis-tls-ca", "/nonexistent/ca.pem"]);
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    // TLS options on a plain URL.
    let plain = format!("redis://127.0.0.1:{}", redis.port);
    let err = serve_fails(&["--redis", &plain, "--redis-tls-insecure"]);
    assert!(err.contains("rediss://"), "{err}");
    // A plain Redis behind a rediss:// URL: the handshake fails, said so.
    let plain_redis = Redis::start(&[], &[]);
    let ca = redis.certs().ca();
    let err = serve_fails(&[
        "--redis",
        &format!("rediss://127.0.0.1:{}", plain_redis.port),
        "--redis-tls-ca",
        ca,
    ]);
    assert!(
        err.contains("TLS handshake") && err.contains("TLS port"),
        "{err}"
    );

    // --redis-wait: serves, and /healthz shows why the link is down.
    let s = serve(&["--redis", &url, "--redis-tls-ca", other, "--redis-wait"]);
    s.wait_broker("down");
    // Down from the start, first as "connecting", then with the reason
    // once the handshake fails: wait for the reason.
    wait_until("/healthz names the certificate", || {
        get(s.addr, "/healthz").1.contains("certificate")
    });
    assert_eq!(publish(s.addr, "x", b"no", None).0, 503);

    // --redis-tls-insecure: no check, a loud warning, and it works.
    let s = serve(&["--redis", &url, "--redis-tls-insecure"]);
    s.wait_broker("up");
    assert!(s.log().contains("WARNING"), "{}", s.log());
    let mut sub = subscribe(s.addr, "ins");
    s.wait_metric("throng_connections_open", |v| v == 1.0);
    assert_eq!(publish_redis(s.addr, "ins", "ok"), 1);
    assert_eq!(next_text(&mut sub), "ok");
}

#[test]
fn hold_publishes_over_tls_with_auth_to_every_connection() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::Openssl);
    let redis = tls_redis("rediss-hold");
    let a = node(
        &redis,
        &format!("rediss://alice:s3cret@127.0.0.1:{}", redis.port),
        &["--workers", "1"],
    );
    let ca = redis.certs().ca();
    let hold = |publish: &str, extra: &[&str]| {
        throng()
            .arg("hold")
            .arg(format!("ws://{}/held", a.addr))
            .args([
                "-c",
                "200",
                "--rate",
                "2000/s",
                "-w",
                "1",
                "--duration",
                "3s",
            ])
            .args([
                "--publish",
                publish,
                "--publish-rate",
                "5/s",
                "--json",
                "--quiet",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .expect("run throng hold")
    };
    let out = hold(
        &format!("rediss://alice:s3cret@127.0.0.1:{}", redis.port),
        &["--publish-tls-ca", ca],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("s3cret"),
        "the password never shows: {stderr}"
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    assert_eq!(n("opened"), 200, "{s:#}");
    // Publishing starts a settle time after the last connection is open.
    assert!(n("published") >= 3, "{s:#}");
    assert_eq!(n("received"), n("published") * 200, "{s:#}");
    assert_eq!(n("lost"), 0, "{s:#}");

    // Without the password Redis refuses every publish, and hold says why.
    let out = hold(
        &format!("rediss://127.0.0.1:{}", redis.port),
        &["--publish-tls-ca", ca],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(s["published"].as_u64().unwrap_or(0), 0, "{s:#}");
    assert_eq!(s["received"].as_u64().unwrap_or(0), 0, "{s:#}");
    assert!(
        s["publish_errors"]["refused"].as_u64().unwrap_or(0) >= 1,
        "{s:#}"
    );
    assert!(stderr.contains("NOAUTH"), "{stderr}");
}
