//! `--proxy-protocol` behind a real HAProxy (`send-proxy`, `send-proxy-v2`):
//! per-address limits count each client, not the balancer; a connection
//! from an address outside `--trusted-proxies`, or one without a header,
//! is closed.

use std::io::Read as _;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use socket2::{Domain, Socket, Type};
use throng_testkit::Peer;
use throng_testkit::haproxy::Haproxy;
use throng_testkit::require;

use crate::serve;

/// A connection to `to` from `from` (any port).
fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let ip: IpAddr = from.parse().unwrap();
    s.bind(&SocketAddr::new(ip, 0).into()).unwrap();
    s.connect(&to.into()).unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s
}

/// Subscribes to `news` through `to` from `from`: the HTTP status of the answer.
fn subscribe_from(from: &str, to: SocketAddr) -> (u16, Option<throng_testkit::ws::Sub>) {
    throng_testkit::ws::upgrade_status(connect_from(from, to), &format!("ws://{to}/news"))
}

#[test]
fn limits_count_each_client_behind_haproxy_v1_and_v2() {
    require!(Peer::Haproxy);
    let server = serve(&[
        "--workers",
        "1",
        "--proxy-protocol",
        "--trusted-proxies",
        "127.0.0.1/32",
        "--max-connections-per-ip",
        "3",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    for send in ["send-proxy", "send-proxy-v2"] {
        let lb = Haproxy::proxy_protocol(server.addr, send);
        // Five clients, one address each: all are served (before, all five
        // were HAProxy's address: three served, two refused).
        let mut held = Vec::new();
        for i in 2..7 {
            let (status, ws) = subscribe_from(&format!("127.0.0.{i}"), lb.addr);
            assert_eq!(status, 101, "{send}: client 127.0.0.{i}");
            held.extend(ws);
        }
        // One client past its own limit is refused.
        for _ in 0..3 {
            let (status, ws) = subscribe_from("127.0.0.9", lb.addr);
            assert_eq!(status, 101, "{send}");
            held.extend(ws);
        }
        let (status, _) = subscribe_from("127.0.0.9", lb.addr);
        assert_eq!(status, 429, "{send}: the fourth of 127.0.0.9");
        drop(held);
        server.wait_metric("throng_connections_open", |v| v == 0.0);
    }
}

#[test]
fn x_forwarded_for_from_a_trusted_proxy_counts_each_client() {
    require!(Peer::Haproxy);
    let server = serve(&[
        "--workers",
        "1",
        "--trusted-proxies",
        "127.0.0.1",
        "--max-connections-per-ip",
        "3",
    ]);
    let lb = Haproxy::forwardfor(server.addr);
    let mut held = Vec::new();
    for i in 2..7 {
        let (status, ws) = subscribe_from(&format!("127.0.0.{i}"), lb.addr);
        assert_eq!(status, 101, "client 127.0.0.{i}");
        held.extend(ws);
    }
    for _ in 0..3 {
        let (status, ws) = subscribe_from("127.0.0.9", lb.addr);
        assert_eq!(status, 101);
        held.extend(ws);
    }
    let (status, _) = subscribe_from("127.0.0.9", lb.addr);
    assert_eq!(status, 429, "the fourth of 127.0.0.9");
    // Straight from an untrusted address, X-Forwarded-For is not believed:
    // 127.0.0.10 is counted as itself, whatever it claims.
    for _ in 0..3 {
        let (status, ws) = subscribe_from("127.0.0.10", server.addr);
        assert_eq!(status, 101);
        held.extend(ws);
    }
    let mut s = connect_from("127.0.0.10", server.addr);
    use std::io::Write as _;
    s.write_all(
        b"GET /news HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 198.51.100.1\r\nUpgrade: websocket\r\n\
          Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Version: 13\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
}

#[test]
fn connections_not_from_a_trusted_proxy_or_without_a_header_are_closed() {
    let server = serve(&[
        "--workers",
        "1",
        "--proxy-protocol",
        "--trusted-proxies",
        "127.0.0.1",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let closed_unanswered = |mut s: TcpStream| {
        use std::io::Write as _;
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        buf.is_empty()
    };
    // Untrusted: closed at once, counted.
    assert!(closed_unanswered(connect_from("127.0.0.2", server.addr)));
    server.wait_metric("throng_refused_total{reason=\"untrusted_proxy\"}", |v| {
        v == 1.0
    });
    // Trusted, but no header: closed.
    assert!(closed_unanswered(connect_from("127.0.0.1", server.addr)));
    server.wait_metric(
        "throng_handshake_failures_total{reason=\"proxy_header\"}",
        |v| v == 1.0,
    );
    // A v1 header by hand: the request behind it is served.
    let mut s = connect_from("127.0.0.1", server.addr);
    use std::io::Write as _;
    s.write_all(b"PROXY TCP4 198.51.100.7 127.0.0.1 40000 80\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn proxy_protocol_needs_trusted_proxies() {
    let out = throng_testkit::process::output_within(
        crate::throng().args(["serve", "--dry-run", "--proxy-protocol"]),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
    let out = throng_testkit::process::output_within(
        crate::throng().args(["serve", "--dry-run", "--trusted-proxies", "10.0.0.0/33"]),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
}

/// A TLS connection from a trusted proxy that says nothing at first waits
/// parked, out of its task; woken by its upgrade, it is still counted under
/// the client its `X-Forwarded-For` names (it was let in uncounted).
#[test]
fn a_parked_tls_connection_from_a_trusted_proxy_is_counted_under_its_client() {
    use std::io::Write as _;
    let (_server, tls, pem) = crate::serve_tls::start(&[
        "--workers",
        "1",
        "--trusted-proxies",
        "127.0.0.1",
        "--max-connections-per-ip",
        "1",
    ]);
    let cfg = crate::serve_tls::client_config(&pem, &[&rustls::version::TLS13]);
    let upgrade = |client: &str| {
        let mut s = crate::serve_tls::connect(tls, &cfg);
        // Parked as soon as the handshake is done and nothing follows. Had
        // it not been parked yet, its task would count it the same way: the
        // wait makes the check, it cannot fail it.
        std::thread::sleep(Duration::from_millis(300));
        let req = format!(
            "GET /news HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {client}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).is_ok_and(|n| n == 1) {
            head.push(byte[0]);
        }
        (String::from_utf8_lossy(&head).into_owned(), s)
    };
    let (first, _held) = upgrade("198.51.100.7");
    assert!(first.starts_with("HTTP/1.1 101"), "{first}");
    let (second, _) = upgrade("198.51.100.7");
    assert!(
        second.starts_with("HTTP/1.1 429"),
        "the client's second: {second}"
    );
    let (other, _held2) = upgrade("198.51.100.8");
    assert!(other.starts_with("HTTP/1.1 101"), "another client: {other}");
}
