//! `serve --takeover`: a second serve takes the ports of a running one
//! while a client connects in a loop (none refused), the old one closes its
//! subscribers with 1012 spread over `--drain-spread` and exits, and with
//! `--redis` history the subscribers that rejoin the new one with
//! `?since=` miss nothing a steady publisher sent meanwhile.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use throng_testkit::http::{publish, try_raw};
use throng_testkit::redis::Redis;
use throng_testkit::ws::{Got, next_frame, raw_subscribe, subscribe};
use throng_testkit::{Peer, Server, require, wait_until};
use tungstenite::Message;

use crate::history::subscribe_v1;
use crate::{serve, throng};

/// Connects (and asks `/healthz`) in a loop until `stop`; returns
/// (attempts, failures: refused, reset or unanswered).
fn connect_loop(addr: SocketAddr, stop: Arc<AtomicBool>) -> JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let (mut tries, mut failed) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            tries += 1;
            let req = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            if try_raw(addr, req.as_bytes()).is_err() {
                failed += 1;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        (tries, failed)
    })
}

/// The close code a subscriber got and when.
fn closed_at(mut ws: throng_testkit::ws::Sub) -> (Option<u16>, Instant) {
    loop {
        match ws.read() {
            Ok(Message::Close(f)) => return (f.map(|f| u16::from(f.code)), Instant::now()),
            Ok(_) => {}
            Err(_) => return (None, Instant::now()),
        }
    }
}

/// Waits (up to `limit`) for `child` to exit.
fn exits_within(child: &mut std::process::Child, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().ok().flatten().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// `serve --takeover` of `old`'s address, with `extra` options.
fn take_over(old: &Server, extra: &[&str]) -> Server {
    let addr = old.addr.to_string();
    let mut args = vec!["--listen", &addr, "--takeover", "--workers", "2"];
    args.extend_from_slice(extra);
    serve(&args)
}

#[test]
fn a_takeover_refuses_no_one_and_the_old_serve_closes_with_1012_spread_then_exits() {
    let mut old = serve(&["--workers", "2", "--drain-spread", "2s"]);
    let addr = old.addr;
    let subs: Vec<_> = (0..20)
        .map(|_| {
            let ws = subscribe(addr, "room");
            std::thread::spawn(move || closed_at(ws))
        })
        .collect();
    old.wait_metric("throng_connections_open", |v| v == 20.0);
    let stop = Arc::new(AtomicBool::new(false));
    let looping = connect_loop(addr, stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let new = take_over(&old, &[]);
    let closes: Vec<_> = subs.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        exits_within(&mut old.child, Duration::from_secs(15)),
        "the old serve exits"
    );
    let gone = started.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (tries, failed) = looping.join().unwrap();
    assert_eq!(
        failed, 0,
        "{failed} of {tries} connections failed during the takeover"
    );
    assert!(tries > 50, "the loop ran ({tries})");
    assert!(closes.iter().all(|c| c.0 == Some(1012)), "{closes:?}");
    let first = closes.iter().map(|c| c.1).min().unwrap();
    let last = closes.iter().map(|c| c.1).max().unwrap();
    assert!(
        last - first >= Duration::from_millis(1200),
        "spread over --drain-spread 2s: {:?}",
        last - first
    );
    assert!(gone < Duration::from_secs(10), "{gone:?}");
    assert!(old.log().contains("taken over"), "{}", old.log());
    assert!(new.log().contains("received"), "{}", new.log());
    // The new one serves on the port.
    let ws = subscribe(addr, "room");
    drop(ws);
}

/// Subscribers that take the server's close frame and then say nothing
/// and keep their sockets open (a client that forked and left a copy of
/// its socket behind, a host gone dark): their close codes, the sockets
/// held until the caller drops them.
fn silent_subscribers(addr: SocketAddr, n: usize) -> JoinHandle<Vec<(Got, std::net::TcpStream)>> {
    let subs: Vec<_> = (0..n).map(|_| raw_subscribe(addr, "room")).collect();
    std::thread::spawn(move || {
        subs.into_iter()
            .map(|(mut s, mut buf)| {
                let mut dec =
                    throng_proto::ws::Decoder::new(throng_proto::ws::Role::Client, 1 << 20);
                loop {
                    match next_frame(&mut s, &mut buf, &mut dec) {
                        Got::Ping | Got::Pong | Got::Text(_) | Got::Binary(_) => {}
                        got => return (got, s),
                    }
                }
            })
            .collect()
    })
}

/// The subscribers the old serve's workers logged as drained, of how many.
fn drained(log: &str) -> (u64, u64) {
    log.lines()
        .filter_map(|l| l.split_once(": drained ")?.1.strip_suffix(" subscribers"))
        .filter_map(|t| {
            let (done, of) = t.split_once(" of ")?;
            Some((done.parse::<u64>().ok()?, of.parse::<u64>().ok()?))
        })
        .fold((0, 0), |(a, b), (d, o)| (a + d, b + o))
}

/// 12 silent subscribers of a serve started with `args`; `stop` makes it
/// drain (a takeover, SIGTERM): each gets close `code`, and the serve is
/// gone with every subscriber counted as drained long before its
/// `--drain-timeout` (10 minutes).
fn drains_past_silent_subscribers(args: &[&str], stop: impl FnOnce(&Server), code: u16) {
    let mut args = args.to_vec();
    args.extend(["--workers", "2", "--drain-timeout", "10m"]);
    let mut s = serve(&args);
    let subs = silent_subscribers(s.addr, 12);
    s.wait_metric("throng_connections_open", |v| v == 12.0);
    stop(&s);
    let got = subs.join().unwrap();
    let codes: Vec<_> = got.iter().map(|g| &g.0).collect();
    assert!(
        codes.iter().all(|g| **g == Got::Close(Some(code))),
        "{codes:?}"
    );
    assert!(
        exits_within(&mut s.child, Duration::from_secs(90)),
        "the serve still runs, waiting for closes nobody answers: {}",
        s.log()
    );
    assert_eq!(drained(&s.log()), (12, 12), "{}", s.log());
    drop(got);
}

#[test]
fn taken_over_the_old_serve_exits_when_its_last_close_ends_not_at_the_drain_timeout() {
    // The new serve lives until the end of the test.
    let new = std::cell::RefCell::new(None);
    let take = |old: &Server| *new.borrow_mut() = Some(take_over(old, &[]));
    drains_past_silent_subscribers(&["--drain-spread", "1s"], take, 1012);
}

#[test]
fn sigterm_drain_ends_when_the_last_close_is_over_not_at_the_drain_timeout() {
    drains_past_silent_subscribers(&[], |s| s.signal("TERM"), 1001);
}

#[test]
fn takeover_without_a_running_serve_says_so_and_starts() {
    let s = serve(&["--takeover", "--workers", "1"]);
    wait_until("the log line", || s.log().contains("no running serve"));
}

/// A `throng.v1` subscriber of `channel` that rejoins `addr` with
/// `?since=` after every close until it has seen `last`; returns the
/// sequence numbers it got and how many times it rejoined.
fn follow(addr: SocketAddr, channel: &'static str, last: u64) -> JoinHandle<(Vec<u64>, u32)> {
    let mut ws = subscribe_v1(addr, channel, None);
    std::thread::spawn(move || {
        let (mut got, mut since, mut rejoins) = (Vec::new(), None::<String>, 0);
        loop {
            match ws.read() {
                Ok(Message::Text(t)) => {
                    let (id, body) = t.split_once('\n').expect("id\\npayload");
                    since = Some(id.to_owned());
                    let n: u64 = body.parse().expect("a number");
                    got.push(n);
                    if n == last {
                        return (got, rejoins);
                    }
                }
                Ok(Message::Close(_)) | Err(_) => {
                    rejoins += 1;
                    assert!(rejoins < 5, "rejoined too often");
                    ws = subscribe_v1(addr, channel, since.as_deref());
                }
                Ok(_) => {}
            }
        }
    })
}

#[test]
fn with_redis_history_subscribers_that_rejoin_with_since_miss_nothing() {
    require!(Peer::RedisServer);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let node = ["--redis", &url, "--history", "1000", "--drain-spread", "2s"];
    let (_, new) = rejoiners_miss_nothing(&node, |s| s.wait_broker("up"));
    assert!(!new.log().contains("adopted"), "{}", new.log());
}

#[test]
fn with_the_embedded_history_handed_over_subscribers_that_rejoin_with_since_miss_nothing() {
    let node = ["--history", "1000", "--drain-spread", "2s"];
    let (old, new) = rejoiners_miss_nothing(&node, |_| {});
    assert!(
        old.log().contains("handed the history over"),
        "{}",
        old.log()
    );
    assert!(
        new.log().contains("adopted the history of pid"),
        "{}",
        new.log()
    );
}

/// 10 `throng.v1` subscribers of a serve with `node` options, a steady
/// publisher (each message until one serve takes it), a takeover: every
/// subscriber rejoins and has every message once, in order. `ready`
/// waits for a serve to be ready to publish. Returns both serves.
fn rejoiners_miss_nothing(node: &[&str], ready: impl Fn(&Server)) -> (Server, Server) {
    let mut args = vec!["--workers", "2"];
    args.extend_from_slice(node);
    let mut old = serve(&args);
    ready(&old);
    let addr = old.addr;
    const LAST: u64 = 200;
    let subs: Vec<_> = (0..10).map(|_| follow(addr, "feed", LAST)).collect();
    old.wait_metric("throng_connections_open", |v| v == 10.0);
    // A steady publisher (50 a second), each message until it is taken.
    let sent = Arc::new(AtomicU64::new(0));
    let publisher = {
        let sent = sent.clone();
        std::thread::spawn(move || {
            for n in 0..=LAST {
                let deadline = Instant::now() + Duration::from_secs(10);
                while publish(addr, "feed", n.to_string().as_bytes(), None).0 != 200 {
                    assert!(Instant::now() < deadline, "publishing {n}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                sent.store(n, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    wait_until("some messages out", || sent.load(Ordering::Relaxed) > 20);
    let new = take_over(&old, node);
    ready(&new);
    publisher.join().unwrap();
    for t in subs {
        let (got, rejoins) = t.join().unwrap();
        assert!(rejoins >= 1, "taken over, every subscriber rejoined");
        let mut seen = got.clone();
        seen.dedup();
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order: {got:?}");
        assert_eq!(seen, (0..=LAST).collect::<Vec<_>>(), "nothing missed");
    }
    assert!(exits_within(&mut old.child, Duration::from_secs(15)));
    (old, new)
}

/// The user the other-user tests run a serve as (`nobody`), when this
/// test runs as root and that user can run the binary (a checkout under
/// a private home cannot be); else why the test is skipped.
fn other_user() -> Option<u32> {
    use std::os::unix::process::CommandExt as _;
    const NOBODY: u32 = 65_534;
    if throng_host::fdpass::euid() != 0 {
        eprintln!("skipped: a takeover across users needs root to start the other user's serve");
        return None;
    }
    let mut probe = throng();
    probe.arg("--version").uid(NOBODY).gid(NOBODY);
    let ok = throng_testkit::process::output_within(&mut probe, Duration::from_secs(30));
    if !ok.status.success() {
        eprintln!("skipped: uid {NOBODY} cannot run {}: {ok:?}", crate::THRONG);
        return None;
    }
    Some(NOBODY)
}

/// `serve --takeover` of `addr` as `uid` (root: None): exit code, stderr.
fn take_over_as(addr: SocketAddr, uid: Option<u32>) -> (Option<i32>, String) {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = throng();
    let listen = addr.to_string();
    cmd.args(["serve", "--listen", &listen, "--takeover", "--workers", "1"]);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let out = throng_testkit::process::output_within(&mut cmd, Duration::from_secs(60));
    (
        out.status.code(),
        throng_testkit::process::text(&out.stderr),
    )
}

/// A `serve --takeover` as `uid` (root: None) of `old` exits 2 naming
/// `holder` and the user to run it as (`sudo -u <user>`); `old` serves on,
/// untouched.
fn refused_across_users(old: &Server, uid: Option<u32>, holder: &str, user: &str) {
    let (code, err) = take_over_as(old.addr, uid);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("a server of another user ({holder})"))
            && err.contains("--takeover works between serves of the same user only")
            && err.contains(&format!("sudo -u {user} throng serve")),
        "{err}"
    );
    let healthy = throng_testkit::http::healthy(old.addr);
    assert!(healthy, "the old serve serves on");
    assert!(!old.log().contains("taken over"), "{}", old.log());
}

#[test]
fn another_user_cannot_take_over_and_is_told_to_run_as_the_serves_user() {
    let Some(nobody) = other_user() else { return };
    let old = serve(&["--workers", "1"]);
    refused_across_users(&old, Some(nobody), "root (uid 0)", "root");
}

#[test]
fn root_cannot_take_over_another_users_serve_either() {
    use std::os::unix::process::CommandExt as _;
    let Some(nobody) = other_user() else { return };
    let old = Server::start_with(crate::THRONG, &["--workers", "1"], |c| {
        c.uid(nobody).gid(nobody);
    });
    let (holder, user) = match throng_host::portlock::user_name(nobody) {
        Some(name) => (format!("{name} (uid {nobody})"), name),
        None => (format!("uid {nobody}"), format!("#{nobody}")),
    };
    refused_across_users(&old, None, &holder, &user);
}
