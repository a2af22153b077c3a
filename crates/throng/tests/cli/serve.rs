//! `throng serve` end to end: the real binary, real sockets, independent
//! WebSocket peers (tungstenite, Python `websockets`, Node `ws`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use throng_proto::ws::{self, OpCode};
use throng_testkit::http::{publish, publish_ok, raw};
use throng_testkit::process::signal;
use throng_testkit::ws::{
    Got, client_frame, close_code_then_end, close_expecting_echo, next_frame, raw_subscribe,
    subscribe,
};
use throng_testkit::{Peer, Server, peers, require, wait_until};
use tungstenite::Message;

use crate::{serve, throng};

/// The messages the ordering tests publish: text, binary by content, binary
/// by Content-Type, empty, multi-byte UTF-8.
fn messages(n: usize) -> Vec<(Vec<u8>, Option<&'static str>, bool)> {
    (0..n)
        .map(|i| match i % 4 {
            0 => (format!("text message {i} ✓").into_bytes(), None, false),
            1 => (vec![0xff, 0x00, i as u8, 0xfe], None, true),
            2 => (
                format!("{i}").into_bytes(),
                Some("application/octet-stream"),
                true,
            ),
            _ => (
                format!("{{\"n\":{i}}}").into_bytes(),
                Some("application/json"),
                false,
            ),
        })
        .collect()
}

#[test]
fn every_subscriber_gets_every_message_in_order() {
    let server = serve(&["--workers", "2"]);
    let mut subs: Vec<_> = (0..40).map(|_| subscribe(server.addr, "room.a")).collect();
    let mut others: Vec<_> = (0..5).map(|_| subscribe(server.addr, "room-b")).collect();
    server.wait_metric("throng_connections_open", |v| v == 45.0);

    let msgs = messages(60);
    for (body, ctype, _) in &msgs {
        assert_eq!(publish_ok(server.addr, "room.a", body, *ctype), 40);
    }
    assert_eq!(publish_ok(server.addr, "room-b", b"only b", None), 5);
    assert_eq!(publish_ok(server.addr, "nobody", b"x", None), 0);

    for s in &mut subs {
        for (i, (body, _, binary)) in msgs.iter().enumerate() {
            let got = s.read().unwrap();
            let want = if *binary {
                Message::Binary(body.clone().into())
            } else {
                Message::text(String::from_utf8(body.clone()).unwrap())
            };
            assert_eq!(got, want, "message {i}");
        }
    }
    for s in &mut others {
        assert_eq!(s.read().unwrap(), Message::text("only b"));
    }
    // Clean close handshake started by the client: the server echoes 1000.
    for s in subs.iter_mut().chain(others.iter_mut()) {
        close_expecting_echo(s);
    }
    server.wait_metric("throng_connections_open", |v| v == 0.0);
    server.wait_metric(
        "throng_connections_closed_total{reason=\"peer_close\"}",
        |v| v == 45.0,
    );
    assert_eq!(server.metric("throng_messages_published_total"), 62.0);
    server.wait_metric("throng_frames_delivered_total", |v| v == 40.0 * 60.0 + 5.0);
}

/// Starts a peer subscriber script (`tests/peers/serve_sub.*`) on
/// `/<channel>`, expecting `count` messages.
fn run_peer(mut peer: Command, server: &Server, channel: &str, count: usize) -> Child {
    peer.arg(format!("ws://{}/{channel}", server.addr))
        .arg(count.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {peer:?}: {e}"))
}

#[test]
fn python_and_node_peers_get_every_message_byte_for_byte() {
    require!(Peer::PythonWebsockets, Peer::NodeWs);
    let server = serve(&["--workers", "2"]);
    let msgs = messages(40);
    let mut subscribers = Vec::new();
    for script in ["serve_sub.py", "serve_sub.mjs"] {
        for _ in 0..3 {
            let peer = if script.ends_with(".py") {
                peers::python(script)
            } else {
                peers::node(script)
            };
            let mut child = run_peer(peer, &server, "interop", msgs.len());
            let mut out = BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "ready", "{script} did not subscribe");
            subscribers.push((script, child, out));
        }
    }
    server.wait_metric("throng_connections_open", |v| v == 6.0);
    for (body, ctype, _) in &msgs {
        assert_eq!(publish_ok(server.addr, "interop", body, *ctype), 6);
    }
    for (script, mut child, out) in subscribers {
        let lines: Vec<String> = out.lines().map(Result::unwrap).collect();
        assert!(
            child.wait().unwrap().success(),
            "{script} failed: {lines:?}"
        );
        assert_eq!(lines.len(), msgs.len() + 1, "{script}: {lines:?}");
        for (i, (body, _, binary)) in msgs.iter().enumerate() {
            let v: serde_json::Value = serde_json::from_str(&lines[i]).unwrap();
            assert_eq!(v["binary"], *binary, "{script} message {i}");
            assert_eq!(v["hex"], hex(body), "{script} message {i}");
        }
        let close: serde_json::Value = serde_json::from_str(&lines[msgs.len()]).unwrap();
        assert_eq!(close["closed"], 1000, "{script} close handshake");
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const UPGRADE: &str = "GET /chan HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                       Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

#[test]
fn bad_requests_get_the_right_status_and_reason() {
    let server = serve(&[
        "--workers",
        "1",
        "--max-message",
        "1KiB",
        "--handshake-timeout",
        "1s",
    ]);
    let a = server.addr;
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("no upgrade header", b"GET /chan HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400, "Upgrade"),
        ("wrong version", format!("{UPGRADE}Sec-WebSocket-Version: 8\r\n\r\n").into_bytes(), 426, "13"),
        ("no key", b"GET /chan HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n".to_vec(), 400, "Key"),
        ("POST upgrade", format!("{}Sec-WebSocket-Version: 13\r\n\r\n", UPGRADE.replacen("GET", "POST", 1)).into_bytes(), 400, "GET"),
        ("bad channel", format!("{}Sec-WebSocket-Version: 13\r\n\r\n", UPGRADE.replacen("/chan", "/a/+", 1)).into_bytes(), 400, "channel"),
        ("empty channel", format!("{}Sec-WebSocket-Version: 13\r\n\r\n", UPGRADE.replacen("/chan", "/", 1)).into_bytes(), 400, "channel"),
        ("long channel", format!("{}Sec-WebSocket-Version: 13\r\n\r\n", UPGRADE.replacen("chan", &"c".repeat(129), 1)).into_bytes(), 400, "128"),
        ("huge head", format!("GET /chan HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n", "a".repeat(9000)).into_bytes(), 431, ""),
        ("garbage", b"\x16\x03\x01 hello\r\n\r\n".to_vec(), 400, ""),
        ("publish too big", format!("POST /publish/x HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n{}", "a".repeat(2000)).into_bytes(), 413, "max-message"),
        ("publish chunked too big", format!("POST /publish/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n{}\r\n0\r\n\r\n", "a".repeat(2000)).into_bytes(), 413, ""),
        ("publish bad channel", b"POST /publish/a%20b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx".to_vec(), 400, "channel"),
        ("publish with GET", b"GET /publish/x HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 405, "POST"),
        ("no Host", b"GET /publish/x HTTP/1.1\r\n\r\n".to_vec(), 400, "Host"),
        ("two Hosts", b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".to_vec(), 400, "Host"),
        ("HTTP/1.0 without Host", b"GET /healthz HTTP/1.0\r\n\r\n".to_vec(), 200, "ok"),
        ("text that is not UTF-8", b"POST /publish/x HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\n\xff".to_vec(), 400, "UTF-8"),
    ];
    for (name, req, status, reason) in cases {
        let (got, head, body) = raw(a, &req);
        assert_eq!(got, status, "{name}: {head}{body}");
        assert!(
            head.contains(reason) || body.contains(reason),
            "{name}: reason {reason:?} missing from {head}{body}"
        );
        if status == 426 {
            assert!(head.contains("Sec-WebSocket-Version: 13"), "{head}");
        }
    }
    // A chunked publish within the limit works.
    let (got, _, body) = raw(a, b"POST /publish/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
    assert_eq!(got, 200, "{body}");

    // Slowloris: half a head, then nothing: closed after the handshake timeout.
    let mut s = TcpStream::connect(a).unwrap();
    s.write_all(b"GET /chan HTTP/1.1\r\nHost: x\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let n = s
        .read_to_end(&mut rest)
        .expect("server closes the connection");
    assert_eq!(n, 0);
    server.wait_metric("throng_handshake_failures_total{reason=\"timeout\"}", |v| {
        v >= 1.0
    });
    server.wait_metric("throng_handshake_failures_total{reason=\"version\"}", |v| {
        v == 1.0
    });
    server.wait_metric(
        "throng_handshake_failures_total{reason=\"head_too_large\"}",
        |v| v == 1.0,
    );
    server.wait_metric(
        "throng_handshake_failures_total{reason=\"too_large\"}",
        |v| v == 2.0,
    );
}

#[test]
fn protocol_errors_close_with_the_rfc_code() {
    let server = serve(&["--workers", "1"]);
    let unmasked = {
        let mut f = Vec::new();
        ws::encode_into(&mut f, true, OpCode::Text, b"hi", None);
        f
    };
    let mut reserved = client_frame(true, OpCode::Text, b"hi");
    reserved[0] |= 0x40;
    let mut unknown_op = client_frame(true, OpCode::Text, b"hi");
    unknown_op[0] = (unknown_op[0] & 0xf0) | 0x3;
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("unmasked frame", unmasked, 1002),
        ("reserved bits", reserved, 1002),
        ("unknown opcode", unknown_op, 1002),
        (
            "control frame over 125 bytes",
            client_frame(true, OpCode::Ping, &[0; 126]),
            1002,
        ),
        (
            "fragmented control frame",
            client_frame(false, OpCode::Ping, b"x"),
            1002,
        ),
        (
            "invalid UTF-8 text",
            client_frame(true, OpCode::Text, &[0xc3, 0x28]),
            1007,
        ),
        (
            "message over the limit",
            client_frame(true, OpCode::Binary, &[0; 5000]),
            1009,
        ),
        (
            "continuation without a message",
            client_frame(true, OpCode::Continuation, b"x"),
            1002,
        ),
    ];
    for (name, frame, code) in cases {
        let (mut s, mut buf) = raw_subscribe(server.addr, "proto");
        s.write_all(&frame).unwrap();
        let mut dec = ws::Decoder::new(ws::Role::Client, 1 << 20);
        assert_eq!(
            next_frame(&mut s, &mut buf, &mut dec),
            Got::Close(Some(code)),
            "{name}"
        );
        // The server then ends the TCP connection.
        assert_eq!(next_frame(&mut s, &mut buf, &mut dec), Got::Eof, "{name}");
    }
    server.wait_metric(
        "throng_connections_closed_total{reason=\"protocol_error\"}",
        |v| v == 8.0,
    );

    // A ping is answered with a pong carrying the same payload; a frame
    // split across writes is reassembled.
    let (mut s, mut buf) = raw_subscribe(server.addr, "proto");
    let ping = client_frame(true, OpCode::Ping, b"are you there");
    for b in &ping {
        s.write_all(&[*b]).unwrap();
        s.flush().unwrap();
    }
    let mut dec = ws::Decoder::new(ws::Role::Client, 1 << 20);
    assert_eq!(next_frame(&mut s, &mut buf, &mut dec), Got::Pong);
}

#[test]
fn heartbeat_pings_and_idle_timeout() {
    let server = serve(&[
        "--workers",
        "1",
        "--ping-interval",
        "200ms",
        "--idle-timeout",
        "1s",
    ]);
    // A client that never answers: pinged, then closed with 1008.
    let (mut s, mut buf) = raw_subscribe(server.addr, "idle");
    let mut dec = ws::Decoder::new(ws::Role::Client, 1 << 20);
    assert_eq!(next_frame(&mut s, &mut buf, &mut dec), Got::Ping);
    let mut pings = 1;
    let close = loop {
        match next_frame(&mut s, &mut buf, &mut dec) {
            Got::Ping => pings += 1,
            other => break other,
        }
    };
    assert_eq!(close, Got::Close(Some(1008)));
    assert!(pings >= 2, "pinged {pings} times before the idle close");
    // It answers our close reply by closing the connection.
    s.write_all(&client_frame(true, OpCode::Close, &1008u16.to_be_bytes()))
        .unwrap();
    assert_eq!(next_frame(&mut s, &mut buf, &mut dec), Got::Eof);
    server.wait_metric(
        "throng_connections_closed_total{reason=\"idle_timeout\"}",
        |v| v == 1.0,
    );

    // A client that answers pings (tungstenite pongs as it reads) stays.
    let mut live = subscribe(server.addr, "idle");
    live.get_mut()
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        match live.read() {
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("a live client was dropped: {e}"),
        }
    }
    assert_eq!(
        server.metric("throng_connections_closed_total{reason=\"idle_timeout\"}"),
        1.0
    );
    assert!(server.metric("throng_pings_sent_total") >= 5.0);
}

#[test]
fn slow_consumer_is_closed_and_counted() {
    let server = serve(&[
        "--workers",
        "1",
        "--max-queue",
        "64KiB",
        "--max-message",
        "64KiB",
    ]);
    // A subscriber that never reads, with a small receive buffer.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&server.addr.into()).unwrap();
    let mut slow: TcpStream = sock.into();
    let key = ws::client_key([3; 16]);
    let mut req = Vec::new();
    ws::write_upgrade_request(&mut req, &server.addr.to_string(), "/firehose", &key);
    slow.write_all(&req).unwrap();
    // A reading subscriber on the same channel keeps getting everything.
    let mut reader = subscribe(server.addr, "firehose");
    server.wait_metric("throng_connections_open", |v| v == 2.0);

    let body = vec![b'z'; 32 * 1024];
    let reader_thread = std::thread::spawn(move || {
        let mut n = 0;
        loop {
            match reader.read() {
                Ok(Message::Text(t)) if t.as_str() == "end" => return (n, reader),
                Ok(Message::Text(_)) => n += 1,
                Ok(_) => {}
                Err(e) => panic!("reader: {e}"),
            }
        }
    });
    let mut sent = 0;
    while sent < 2000 && server.metric("throng_slow_consumer_closes_total{cause=\"queue\"}") < 1.0 {
        for _ in 0..20 {
            publish_ok(server.addr, "firehose", &body, Some("text/plain"));
            sent += 1;
        }
    }
    publish_ok(server.addr, "firehose", b"end", None);
    let (got, _reader) = reader_thread.join().unwrap();
    assert_eq!(got, sent, "the reading subscriber got every message");
    assert_eq!(
        server.metric("throng_slow_consumer_closes_total{cause=\"queue\"}"),
        1.0
    );
    assert_eq!(
        server.metric("throng_connections_closed_total{reason=\"slow_consumer\"}"),
        1.0
    );
    assert!(server.metric("throng_frames_dropped_total") >= 1.0);
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    // The slow client's socket ends (after whatever was already in flight).
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sink = Vec::new();
    let _ = slow.read_to_end(&mut sink);
}

#[test]
fn a_killed_worker_is_restarted() {
    let server = serve(&["--workers", "2"]);
    let mut pids = Vec::new();
    wait_until("both workers report", || {
        pids = server.worker_pids();
        pids.len() == 2
    });
    signal(pids[0], "KILL");
    server.wait_metric("throng_worker_restarts_total", |v| v == 1.0);
    wait_until("the new worker reports", || {
        let now = server.worker_pids();
        now.len() == 2 && !now.contains(&pids[0])
    });
    assert!(server.log().contains("restarting"), "{}", server.log());
    // Still serving: subscribers land on either worker and get messages.
    let mut subs: Vec<_> = (0..10).map(|_| subscribe(server.addr, "after")).collect();
    server.wait_metric("throng_connections_open", |v| v == 10.0);
    assert_eq!(publish_ok(server.addr, "after", b"still here", None), 10);
    for s in &mut subs {
        assert_eq!(s.read().unwrap(), Message::text("still here"));
    }
}

#[test]
fn sigterm_drains_with_1001_and_exits() {
    let mut server = serve(&["--workers", "2", "--drain-timeout", "5s"]);
    let mut subs: Vec<_> = (0..20).map(|_| subscribe(server.addr, "bye")).collect();
    server.wait_metric("throng_connections_open", |v| v == 20.0);
    server.signal("TERM");
    for s in &mut subs {
        assert_eq!(close_code_then_end(s), Some(1001));
    }
    let start = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "server did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", server.log());
    assert!(
        TcpStream::connect(server.addr).is_err(),
        "still accepting after drain"
    );
}

#[test]
fn help_teaches_the_defaults() {
    let out = throng().args(["serve", "--help"]).output().unwrap();
    // Collapse clap's line wrapping before searching.
    let help = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for want in [
        "--listen",
        "[default: 127.0.0.1:8080]",
        "[default: 30s]",
        "[default: 256KiB]",
        "[default: 64KiB]",
        "[default: 10s]",
        "1008",
        "/publish/",
    ] {
        assert!(help.contains(want), "--help lacks {want:?}:\n{help}");
    }
    assert!(!help.contains("worker-index"), "internal flags stay hidden");
}

#[test]
fn bad_flags_are_clear_errors() {
    let out = throng()
        .args(["serve", "--listen", "127.0.0.1:9-3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("range ends before it starts"));
    let out = throng()
        .args(["serve", "--ping-interval", "soon"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid duration"));
}

#[test]
fn publish_reports_the_subscribers_it_reached() {
    let server = serve(&["--workers", "1"]);
    let (status, body) = publish(server.addr, "empty", b"x", None);
    assert_eq!(status, 200);
    // The id is the message's (docs/clients.md): EPOCH-SEQ, the first here;
    // the count is taken as the message is relayed, before it is written.
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["channel"].as_str(), v["subscribers"].as_u64()),
        (Some("empty"), Some(0))
    );
    assert_eq!(v["counted"], "at relay, before delivery", "{body}");
    assert!(
        v["id"].as_str().is_some_and(|id| id.ends_with("-1")),
        "{body}"
    );

    // Keep-alive: two publishes on one connection, answered in order.
    let mut sub = subscribe(server.addr, "kept");
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.write_all(b"POST /publish/kept HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirstPOST /publish/kept HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecond").unwrap();
    let mut replies = String::new();
    s.read_to_string(&mut replies).unwrap();
    assert_eq!(
        replies
            .matches(r#""counted":"at relay, before delivery","id":"#)
            .count(),
        2,
        "{replies}"
    );
    assert_eq!(
        replies.matches(r#","subscribers":1}"#).count(),
        2,
        "{replies}"
    );
    assert_eq!(sub.read().unwrap(), Message::text("first"));
    assert_eq!(sub.read().unwrap(), Message::text("second"));
}

#[test]
fn a_write_that_makes_no_progress_times_out() {
    let server = serve(&[
        "--workers",
        "1",
        "--max-queue",
        "64MiB",
        "--write-timeout",
        "1s",
    ]);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&server.addr.into()).unwrap();
    let mut stuck: TcpStream = sock.into();
    let mut req = Vec::new();
    ws::write_upgrade_request(
        &mut req,
        &server.addr.to_string(),
        "/stuck",
        &ws::client_key([5; 16]),
    );
    stuck.write_all(&req).unwrap();
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    // Fill the socket buffers until the server has to queue.
    let body = vec![b'q'; 32 * 1024];
    let mut sent = 0;
    while sent < 2000 && server.metric("throng_connections_queued") < 1.0 {
        publish_ok(server.addr, "stuck", &body, None);
        sent += 1;
    }
    server.wait_metric(
        "throng_slow_consumer_closes_total{cause=\"timeout\"}",
        |v| v == 1.0,
    );
    server.wait_metric("throng_connections_open", |v| v == 0.0);
    assert_eq!(
        server.metric("throng_slow_consumer_closes_total{cause=\"queue\"}"),
        0.0
    );
}
