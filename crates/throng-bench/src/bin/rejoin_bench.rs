//! The committed benchmark of recovery (issue 18): M messages are published
//! on a channel nobody listens to, then N `throng.v1` subscribers connect
//! at once with `?since=` the id before the first of them, and each reads
//! until it has all M. Printed: the wall time until every subscriber had
//! every message, each subscriber's own time (median, max), and the
//! server's CPU over that time (supervisor and workers, from `/proc`; with
//! `--redis`, Redis's own CPU is not in it).
//!
//! ```text
//! cargo build --release -p throng -p throng-bench
//! target/release/rejoin_bench --throng target/release/throng --subs 1000 --messages 1000 [--redis redis://127.0.0.1:6379]
//! ```

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use throng_bench::served::{self, cpu_ticks, request};
use throng_proto::{http, ws};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Opts {
    throng: String,
    subs: usize,
    messages: usize,
    payload: usize,
    redis: Option<String>,
}

fn opts() -> Opts {
    let mut o = Opts {
        throng: "target/release/throng".into(),
        subs: 1000,
        messages: 1000,
        payload: 64,
        redis: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut v = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--throng" => o.throng = v(),
            "--subs" => o.subs = v().parse().expect("--subs N"),
            "--messages" => o.messages = v().parse().expect("--messages N"),
            "--payload" => o.payload = v().parse().expect("--payload BYTES"),
            "--redis" => o.redis = Some(v()),
            _ => panic!(
                "unknown argument {a} (--throng PATH --subs N --messages N --payload BYTES --redis URL)"
            ),
        }
    }
    o
}

/// Publishes one message; its id.
async fn publish(addr: SocketAddr, body: &[u8]) -> String {
    let (status, reply) = request(addr, "POST", "/publish/bench", body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    let v: serde_json::Value = serde_json::from_slice(&reply).expect("JSON reply");
    v["id"]
        .as_str()
        .expect("an id (is --history on?)")
        .to_owned()
}

/// A `throng.v1` subscriber after `since`, read until `want` messages (the
/// last of them `last`); its time from connect.
async fn rejoin(addr: SocketAddr, since: Rc<str>, want: usize, last: Rc<str>) -> Duration {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let key = ws::client_key(fastrand::u128(..).to_le_bytes());
    let host = addr.to_string();
    let req = format!(
        "GET /bench?since={since} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: throng.v1\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("upgrade");
    let mut buf = Vec::with_capacity(64 * 1024);
    let used = loop {
        assert!(s.read_buf(&mut buf).await.expect("read") > 0, "closed");
        if let Some((resp, used)) = http::parse_response(&buf, http::MAX_HEAD).expect("a head") {
            ws::client_verify(&resp, &key).expect("a 101");
            break used;
        }
    };
    buf.drain(..used);
    let mut dec = ws::Decoder::new(ws::Role::Client, 1 << 20);
    let mut got = 0;
    loop {
        let mut pos = 0;
        while let Some(d) = dec.decode(&mut buf[pos..]).expect("frames") {
            pos += d.consumed;
            if let Some(ws::Frame::Text(text)) = d.frame {
                assert!(!text.starts_with(b"!incomplete"), "recovery was incomplete");
                got += 1;
                if got == want {
                    let head = text.split(|&b| b == b'\n').next().unwrap_or_default();
                    assert_eq!(head, last.as_bytes(), "the last message last");
                    return t.elapsed();
                }
            }
        }
        buf.drain(..pos);
        assert!(
            s.read_buf(&mut buf).await.expect("read") > 0,
            "closed after {got} of {want}"
        );
    }
}

fn main() {
    let o = opts();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&rt, bench(o));
}

async fn bench(o: Opts) {
    let _ = throng_host::limits::raise_nofile();
    let history = o.messages.to_string();
    let mut args = vec![
        "--workers",
        "1",
        "--history",
        &history,
        "--max-queue",
        "64MiB",
    ];
    if let Some(r) = &o.redis {
        args.extend(["--redis", r]);
    }
    let (mut server, addr) = served::start(&o.throng, &args);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let worker = served::worker_pid(addr).await;
    let supervisor = server.id();

    let since: Rc<str> = publish(addr, b"before").await.into();
    let payload = vec![b'x'; o.payload];
    let mut last = String::new();
    for _ in 0..o.messages {
        last = publish(addr, &payload).await;
    }
    let last: Rc<str> = last.into();

    let (sup0, work0) = (cpu_ticks(supervisor), cpu_ticks(worker));
    let t = Instant::now();
    let done = Rc::new(Cell::new(0usize));
    let mut tasks = Vec::new();
    for _ in 0..o.subs {
        let (since, last, done) = (since.clone(), last.clone(), done.clone());
        let want = o.messages;
        tasks.push(tokio::task::spawn_local(async move {
            let took = rejoin(addr, since, want, last).await;
            done.set(done.get() + 1);
            took.as_secs_f64()
        }));
    }
    let mut each = Vec::new();
    for h in tasks {
        each.push(h.await.expect("a subscriber"));
    }
    let wall = t.elapsed().as_secs_f64();
    let (sup1, work1) = (cpu_ticks(supervisor), cpu_ticks(worker));
    each.sort_by(f64::total_cmp);
    let hz = 100.0; // USER_HZ on Linux
    let report = serde_json::json!({
        "broker": if o.redis.is_some() { "redis" } else { "embedded" },
        "subscribers": o.subs,
        "messages": o.messages,
        "payload_bytes": o.payload,
        "seconds_until_all_recovered": wall,
        "messages_recovered_per_sec": (o.subs * o.messages) as f64 / wall,
        "subscriber_seconds_median": each[each.len() / 2],
        "subscriber_seconds_max": each[each.len() - 1],
        "server_cpu_seconds": (sup1 + work1 - sup0 - work0) as f64 / hz,
        "supervisor_cpu_seconds": (sup1 - sup0) as f64 / hz,
        "worker_cpu_seconds": (work1 - work0) as f64 / hz,
        "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    });
    println!("{}", serde_json::to_string_pretty(&report).expect("json"));
    let _ = throng_host::process::signal(server.id(), throng_host::process::Signal::Term);
    let _ = server.wait();
}
