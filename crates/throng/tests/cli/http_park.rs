//! Plain HTTP connections waiting for their first request are parked out of
//! their task (`throng-server`'s `tls/park.rs`, as TLS ones are): what a
//! client sees must not change. A connection that connects and waits gets
//! its answer, its subscription or its event stream as before, still ends
//! after `--handshake-timeout` (counted as a timeout), and stays counted
//! under its address while it waits.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use throng_testkit::http::publish_ok;
use throng_testkit::wait_until;
use throng_testkit::ws::{next_text, upgrade_status};

use crate::{serve, tls_park};

/// Long enough for the server to have accepted and parked the connection.
const PARKED: Duration = Duration::from_millis(300);

/// A connection to `addr` that has waited [`PARKED`] before its request.
fn waited(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    std::thread::sleep(PARKED);
    s
}

/// Reads from `s` until `want` has arrived; returns everything read.
fn read_until(s: &mut TcpStream, want: &[u8]) -> String {
    String::from_utf8_lossy(&tls_park::read_until(s, want)).into_owned()
}

#[test]
fn waiting_plain_connections_wake_for_requests_and_subscriptions() {
    let server = serve(&["--workers", "1"]);
    let a = server.addr;
    // An answer, then the next request on the same connection.
    let mut s = waited(a);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(read_until(&mut s, b"\r\n\r\n").starts_with("HTTP/1.1 200"));
    std::thread::sleep(PARKED);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert!(read_until(&mut s, b"\r\n\r\n").starts_with("HTTP/1.1 200"));

    // A head that arrives in two parts, each after a wait.
    let mut split = waited(a);
    split.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
    std::thread::sleep(PARKED);
    split.write_all(b"Host: x\r\n\r\n").unwrap();
    assert!(read_until(&mut split, b"\r\n\r\n").starts_with("HTTP/1.1 200"));

    // A WebSocket and an event stream asked for after a wait.
    let (status, sub) = upgrade_status(waited(a), &format!("ws://{a}/news"));
    assert_eq!(status, 101);
    let mut sub = sub.expect("a subscription");
    let mut sse = waited(a);
    sse.write_all(b"GET /sse/news HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    read_until(&mut sse, b"retry: ");
    server.wait_metric("throng_connections_open", |v| v == 2.0);
    assert_eq!(publish_ok(a, "news", b"after a wait", None), 2);
    assert_eq!(next_text(&mut sub), "after a wait");
    read_until(&mut sse, b"data: after a wait\n");
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

#[test]
fn a_waiting_plain_connection_ends_after_the_handshake_timeout() {
    let server = serve(&["--workers", "1", "--handshake-timeout", "1s"]);
    let timeouts = "throng_handshake_failures_total{reason=\"timeout\"}";
    let t = Instant::now();
    let mut s = waited(server.addr);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("the server closes it");
    assert!(rest.is_empty());
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    server.wait_metric(timeouts, |v| v == 1.0);
    // A client that leaves while waiting is let go, not counted.
    drop(waited(server.addr));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(server.metric(timeouts), 1.0);
}

#[test]
fn a_waiting_plain_connection_stays_counted_under_its_address() {
    let server = serve(&["--workers", "1", "--max-connections-per-ip", "1"]);
    // From 127.0.0.2: the test's own /metrics requests come from 127.0.0.1.
    let from = |addr| tls_park::bound(addr).expect("connect from 127.0.0.2");
    let first = from(server.addr);
    std::thread::sleep(PARKED);
    // The address's one connection waits parked: a second is turned away.
    let mut second = from(server.addr);
    assert!(read_until(&mut second, b"\r\n\r\n").starts_with("HTTP/1.1 429"));
    // The waiting one leaves; its address is given back.
    drop(first);
    wait_until("the address is free again", || {
        let mut s = from(server.addr);
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .is_ok()
            && read_until(&mut s, b"\r\n\r\n").starts_with("HTTP/1.1 200")
    });
}
