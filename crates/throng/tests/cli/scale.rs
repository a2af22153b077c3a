//! What a run tells when the machine is busy (issue 13): a publish whose
//! answer comes late still counts as published and its deliveries are
//! still expected; `--messages N` publishes N whatever their spacing. A
//! publish endpoint of the test's own answers late on purpose, in front of
//! a real `throng serve`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use serde_json::Value;
use socket2::{Domain, Socket, Type};
use throng_testkit::json::count;
use throng_testkit::process::{output_within, text};
use throng_testkit::{TempDir, wait_until};

use crate::{run_json, serve, throng};

/// Reads one HTTP message (head and a `Content-Length` body) from `r`;
/// `None` at the end of the connection.
fn read_message(r: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut raw = Vec::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().ok()?;
        }
        raw.extend_from_slice(line.as_bytes());
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    raw.extend_from_slice(&body);
    Some(raw)
}

/// A publish endpoint in front of `server`: it passes each publish on at
/// once, so every subscriber gets the message, and gives the publisher the
/// server's answer only `delay` later.
fn late_answers(server: SocketAddr, delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut from_client = BufReader::new(client.try_clone().unwrap());
                let mut to_client = client;
                let upstream = TcpStream::connect(server).unwrap();
                let mut from_server = BufReader::new(upstream.try_clone().unwrap());
                let mut to_server = upstream;
                while let Some(request) = read_message(&mut from_client) {
                    to_server.write_all(&request).unwrap();
                    let answer = read_message(&mut from_server).unwrap();
                    std::thread::sleep(delay);
                    // The publisher may have given up and gone.
                    if to_client.write_all(&answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_late_publish_answer_counts_as_published_and_its_deliveries_as_expected() {
    let server = serve(&["--workers", "1"]);
    let publish = late_answers(server.addr, Duration::from_millis(800));
    let (code, s, stderr) = run_json(
        "hold",
        &[
            &format!("ws://{}/late", server.addr),
            "-c",
            "200",
            "--rate",
            "2000/s",
            "--publish",
            &format!("http://{publish}/publish/late"),
            "--publish-rate",
            "2/s",
            "--messages",
            "3",
            "--publish-timeout",
            "300ms",
        ],
    );
    assert_eq!(code, 0, "{stderr}\n{s:#}");
    assert_eq!(count(&s, &["opened"]), 200, "{s:#}");
    // Sent whole, never answered in time: published all the same.
    assert_eq!(count(&s, &["published"]), 3, "{s:#}");
    assert_eq!(count(&s, &["publish_answered"]), 0, "{s:#}");
    assert_eq!(count(&s, &["publish_unanswered", "timeout"]), 3, "{s:#}");
    assert_eq!(s["publish_errors"], serde_json::json!({}), "{s:#}");
    // Every connection got every message, as expected.
    assert_eq!(count(&s, &["expected"]), 600, "{s:#}");
    assert_eq!(count(&s, &["received"]), 600, "{s:#}");
    assert_eq!(count(&s, &["lost"]), 0, "{s:#}");
    assert!(
        stderr.contains(
            "publish of message 1: sent, but its answer: publish got no answer within 300ms"
        ),
        "{stderr}"
    );
}

/// `--messages 2 --message-every 1s` published 1 of 2 in two runs of three,
/// without a word: the hold ended on a clock, not on the count.
#[test]
fn bench_publishes_exactly_the_messages_asked_for() {
    for round in 0..3 {
        let dir = TempDir::new("bench-messages");
        let out = output_within(
            throng().args([
                "bench",
                "--connections",
                "1000",
                "--messages",
                "2",
                "--message-every",
                "1s",
                "--out-dir",
                dir.path().to_str().unwrap(),
                "--format",
                "json",
                "--quiet",
            ]),
            Duration::from_secs(120),
        );
        let r: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stderr)));
        assert_eq!(r["published"], 2, "round {round}: {r:#}");
        assert_eq!(r["received"], 2_000, "round {round}: {r:#}");
        assert_eq!(r["verdict"], "PASS", "round {round}: {r:#}");
        assert_eq!(out.status.code(), Some(0));
    }
}

/// `--max-connections 60000` capped itself at two workers' files (39,872)
/// without a word; now it runs as many workers as that needs and says so,
/// and refuses a `--workers` too few for it.
#[test]
fn attack_spreads_over_the_processes_its_connections_need() {
    let server = serve(&["--workers", "1"]);
    let url = format!("http://{}/ping", server.addr);
    let run = |extra: &[&str]| {
        output_within(
            throng()
                .args([
                    "attack",
                    "--url",
                    &url,
                    "--rate",
                    "100/s",
                    "--requests",
                    "20",
                ])
                .args(extra),
            Duration::from_secs(60),
        )
    };
    let out = run(&["--max-connections", "60000"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("workers "))
        .unwrap_or_else(|| panic!("no workers line: {stdout}"));
    assert!(
        line.contains("workers 4 (raised from") && line.contains("--max-connections 60000 fits"),
        "{line}"
    );
    // 60,000 over pairs kept under 45% of this machine's local port range
    // (where connect() stays cheap, see tests/cli/ports.rs): 5 loopback
    // sources at Linux's default 32768-60999, 3 on a range widened to
    // 1024-65535 as `throng doctor` advises.
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let (lo, hi) = range.split_once(char::is_whitespace).unwrap();
    let ports = hi.trim().parse::<u64>().unwrap() - lo.trim().parse::<u64>().unwrap() + 1;
    let cheap = (ports as f64 * throng_host::doctor::PORT_FAST) as u64;
    let sources = 60_000u64.div_ceil(cheap);
    assert!(
        stdout.contains(&format!(
            "sources 127.0.0.2-127.0.0.{} ({sources} addresses",
            sources + 1
        )),
        "{stdout}"
    );
    assert!(stdout.contains("20 (planned 20)"), "{stdout}");
    assert!(
        stdout.contains("Success       [ratio]                           100.00%"),
        "{stdout}"
    );

    let out = run(&["--max-connections", "60000", "--workers", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("use --workers 4 or more"),
        "{}",
        text(&out.stderr)
    );
}

/// Requests whose answer is slow leave their task for the worker's waiting
/// room: each is still answered whole (a chunked answer whose parts come
/// apart), counted once, and its connection reused afterwards.
#[test]
fn slow_answers_are_read_whole_from_the_waiting_room() {
    let server = serve(&["--workers", "1"]);
    let (code, s, stderr) = run_json(
        "attack",
        &[
            "--url",
            &format!("http://{}/ping", server.addr),
            "-H",
            "sleep: 600",
            "-H",
            "times: 2",
            "--rate",
            "100/s",
            "--duration",
            "2s",
            "--timeout",
            "10s",
        ],
    );
    assert_eq!(code, 0, "{stderr}\n{s:#}");
    assert_eq!(count(&s, &["requests"]), 200, "{s:#}");
    assert_eq!(count(&s, &["status", "200"]), 200, "{s:#}");
    assert_eq!(s["errors"], serde_json::json!({}), "{s:#}");
    // 3 pongs in 5 chunks of a chunked answer, each whole.
    assert_eq!(count(&s, &["bytes_in"]) % 200, 0, "{s:#}");
    let opened = count(&s, &["connections_opened"]);
    assert!(
        opened < 200,
        "connections back from the waiting room are reused: {opened}"
    );
}

/// A `/ping` request sleeping outside its task waits once per part: back
/// from the sleepers, the part is written, not waited for again (every
/// answer here comes well before the server's 1.5 s request timeout).
#[test]
fn a_sleeping_ping_waits_once_per_part() {
    let server = serve(&["--workers", "1", "--request-timeout", "1500ms"]);
    let (code, s, stderr) = run_json(
        "attack",
        &[
            "--url",
            &format!("http://{}/ping", server.addr),
            "-H",
            "sleep: 1000",
            "--rate",
            "50/s",
            "--requests",
            "50",
            "--timeout",
            "5s",
        ],
    );
    assert_eq!(code, 0, "{stderr}\n{s:#}");
    assert_eq!(count(&s, &["status", "200"]), 50, "{s:#}");
    assert_eq!(s["errors"], serde_json::json!({}), "{s:#}");
}

/// A connection to `addr` from loopback address `from`, sending `request`.
fn send_from(addr: SocketAddr, from: Ipv4Addr, request: &str) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    s.connect(&addr.into()).unwrap();
    let mut s = TcpStream::from(s);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s
}

/// The status of the answer to `GET /healthz` from `from`.
fn healthz_from(addr: SocketAddr, from: Ipv4Addr) -> u16 {
    let mut s = send_from(addr, from, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut r = BufReader::new(&mut s);
    let mut line = String::new();
    let _ = r.read_line(&mut line);
    line.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// A `/ping` request sleeping outside its task is still its address's
/// connection (`--max-connections-per-ip`) while it sleeps, and gives its
/// place back once its answer is written and the connection ends.
#[test]
fn a_sleeping_ping_keeps_its_place_under_the_address_limit() {
    let server = serve(&["--workers", "1", "--max-connections-per-ip", "1"]);
    let (x, y) = (Ipv4Addr::new(127, 0, 0, 31), Ipv4Addr::new(127, 0, 0, 32));
    // Up to a minute's sleep: past the test, outside its task after 100 ms.
    let _sleeping = send_from(
        server.addr,
        x,
        "GET /ping HTTP/1.1\r\nHost: t\r\nsleep: 60000\r\n\r\n",
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(healthz_from(server.addr, x), 429, "x holds its one place");

    let mut short = send_from(
        server.addr,
        y,
        "GET /ping HTTP/1.1\r\nHost: t\r\nsleep: 1500\r\nConnection: close\r\n\r\n",
    );
    let mut answer = String::new();
    short.read_to_string(&mut answer).unwrap();
    assert!(answer.ends_with("pong"), "{answer}");
    wait_until("y's place to come back", || {
        healthz_from(server.addr, y) == 200
    });
}

/// A back end that answers every request at once, except the second
/// request on a kept-alive connection, the first time: that connection is
/// closed 300 ms after the request came, unanswered, as a server closing
/// an idle connection just as a request arrives does on a busy machine.
fn closes_one_reused_connection() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let closed_one = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let closed_one = closed_one.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut w = conn;
                let mut n = 0;
                while read_message(&mut r).is_some() {
                    n += 1;
                    if n == 2 && !closed_one.swap(true, std::sync::atomic::Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(300));
                        return;
                    }
                    let answer = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong";
                    if w.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A request on a reused connection that ends before any byte of its
/// answer goes again on a new connection, once: in its task (the close
/// came at once) and in the waiting room too (it came after the request
/// had left its task, 100 ms on).
#[test]
fn a_stale_connection_found_in_the_waiting_room_is_retried() {
    let addr = closes_one_reused_connection();
    let (code, s, stderr) = run_json(
        "attack",
        &[
            "--url",
            &format!("http://{addr}/ping"),
            "--workers",
            "1",
            "--rate",
            "4/s",
            "--requests",
            "2",
            "--timeout",
            "10s",
        ],
    );
    assert_eq!(code, 0, "{stderr}\n{s:#}");
    assert_eq!(count(&s, &["status", "200"]), 2, "{s:#}");
    assert_eq!(s["errors"], serde_json::json!({}), "{s:#}");
    assert_eq!(count(&s, &["retried"]), 1, "{s:#}");
    assert_eq!(count(&s, &["connections_opened"]), 2, "{s:#}");
}

/// A back end whose first two connections answer their one request (the
/// first after 300 ms, the second after 50 ms) as if kept alive, then close;
/// later connections answer every request at once and stay open.
fn first_two_connections_close_after_answering() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for (i, conn) in listener.incoming().flatten().enumerate() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut w = conn;
                let delay = [300, 50].get(i).copied();
                while read_message(&mut r).is_some() {
                    if let Some(ms) = delay {
                        std::thread::sleep(Duration::from_millis(ms));
                    }
                    let answer = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong";
                    if w.write_all(answer.as_bytes()).is_err() || delay.is_some() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A request whose reused connection was stale goes again on a new
/// connection, not on the next idle one (which has been idle as long):
/// request 3 finds both idle connections closed by the server.
#[test]
fn a_retry_after_a_stale_connection_takes_a_new_one() {
    let addr = first_two_connections_close_after_answering();
    let (code, s, stderr) = run_json(
        "attack",
        &[
            "--url",
            &format!("http://{addr}/ping"),
            "--workers",
            "1",
            "--rate",
            "5/s",
            "--requests",
            "3",
            "--timeout",
            "10s",
        ],
    );
    assert_eq!(code, 0, "{stderr}\n{s:#}");
    assert_eq!(count(&s, &["status", "200"]), 3, "{s:#}");
    assert_eq!(s["errors"], serde_json::json!({}), "{s:#}");
    assert_eq!(count(&s, &["retried"]), 1, "{s:#}");
    assert_eq!(count(&s, &["connections_opened"]), 3, "{s:#}");
}
