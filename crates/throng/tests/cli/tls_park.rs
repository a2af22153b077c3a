//! TLS connections waiting for a request are parked out of their task
//! (`throng-server`'s `tls/park.rs`): what a client sees must not change.
//! A parked connection wakes for its next request (an answer, an SSE or
//! WebSocket subscription), still ends after `--handshake-timeout` with a
//! close_notify, and stays counted under its address while parked.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use throng_proto::{http, ws};

use crate::serve_tls::{Tls, client_config, connect, https, start};

/// Long enough for the server to have answered and parked the connection.
const PARKED: Duration = Duration::from_millis(300);

fn tls13(pem: &str) -> Arc<rustls::ClientConfig> {
    client_config(pem, &[&rustls::version::TLS13, &rustls::version::TLS12])
}

/// Reads from `s` until `want` has arrived; returns everything read.
pub(crate) fn read_until(s: &mut impl Read, want: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !got.windows(want.len()).any(|w| w == want) {
        let n = s.read(&mut chunk).expect("read");
        assert!(n > 0, "closed before {:?}", String::from_utf8_lossy(want));
        got.extend_from_slice(&chunk[..n]);
    }
    got
}

#[test]
fn parked_connections_wake_for_requests_and_subscriptions() {
    let (server, tls, pem) = start(&["--workers", "1"]);
    let cfg = tls13(&pem);
    // Waiting for its first request, then between requests.
    let mut s = connect(tls, &cfg);
    std::thread::sleep(PARKED);
    assert_eq!(https(&mut s, "GET", "/healthz", &[], b"").0, 200);
    std::thread::sleep(PARKED);
    let (status, body) = https(&mut s, "POST", "/publish/nobody", &[], b"hello");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));

    // An event stream asked for after a wait, and a WebSocket after a request.
    let mut sse = connect(tls, &cfg);
    std::thread::sleep(PARKED);
    sse.write_all(b"GET /sse/news HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    read_until(&mut sse, b"retry: ");
    let mut sub = connect(tls, &cfg);
    assert_eq!(https(&mut sub, "GET", "/healthz", &[], b"").0, 200);
    std::thread::sleep(PARKED);
    let key = ws::client_key([7; 16]);
    let mut up = Vec::new();
    ws::write_upgrade_request(&mut up, "localhost", "/news", &key);
    sub.write_all(&up).unwrap();
    read_until(&mut sub, b"\r\n\r\n");
    server.wait_metric("throng_connections_open", |v| v == 2.0);

    // A message published over a parked https connection reaches both.
    std::thread::sleep(PARKED);
    let (status, body) = https(&mut s, "POST", "/publish/news", &[], b"after a wait");
    assert_eq!(status, 200);
    assert!(
        String::from_utf8_lossy(&body).contains("\"subscribers\":2"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    read_until(&mut sse, b"data: after a wait\n");
    let frame = ws::server_frame(ws::OpCode::Text, b"after a wait");
    read_until(&mut sub, &frame);
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

#[test]
fn a_parked_connection_ends_after_the_handshake_timeout_with_close_notify() {
    let (server, tls, pem) = start(&["--workers", "1", "--handshake-timeout", "1s"]);
    let cfg = tls13(&pem);
    let timeouts = "throng_handshake_failures_total{reason=\"timeout\"}";
    // No request: a clean end, counted as a handshake that timed out.
    let t = Instant::now();
    let mut waiting = connect(tls, &cfg);
    let mut rest = Vec::new();
    waiting.read_to_end(&mut rest).expect("a clean TLS end");
    assert!(rest.is_empty());
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    server.wait_metric(timeouts, |v| v == 1.0);
    // One request, then silence: a clean end too, not counted.
    let mut kept = connect(tls, &cfg);
    assert_eq!(https(&mut kept, "GET", "/healthz", &[], b"").0, 200);
    let mut rest = Vec::new();
    kept.read_to_end(&mut rest).expect("a clean TLS end");
    assert!(rest.is_empty());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.metric(timeouts), 1.0);
}

#[test]
fn a_parked_connection_stays_counted_under_its_address_until_it_ends() {
    let (_server, tls, pem) = start(&["--workers", "1", "--max-connections-per-ip", "1"]);
    let cfg = tls13(&pem);
    // From 127.0.0.2: the test's own /metrics requests come from 127.0.0.1.
    let mut first = connect_from(tls, &cfg).expect("the first connection");
    assert_eq!(https(&mut first, "GET", "/healthz", &[], b"").0, 200);
    std::thread::sleep(PARKED);
    // The address's one connection is parked: a second one is turned away
    // (closed at once, before its handshake).
    let t = Instant::now();
    assert!(connect_from(tls, &cfg).is_err());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The parked one leaves; its address is given back.
    drop(first);
    throng_testkit::wait_until("the address is free again", || {
        let Ok(mut s) = connect_from(tls, &cfg) else {
            return false;
        };
        let mut req = Vec::new();
        http::write_request(&mut req, "GET", "/healthz", &[("Host", b"x")], b"");
        s.write_all(&req).is_ok() && s.read(&mut [0u8; 64]).is_ok_and(|n| n > 0)
    });
}

/// A TCP connection to `addr` from 127.0.0.2.
pub(crate) fn bound(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::from(([127, 0, 0, 2], 0)).into())?;
    s.connect(&addr.into())?;
    let s = TcpStream::from(s);
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// A TLS connection from 127.0.0.2 with its handshake done.
fn connect_from(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> std::io::Result<Tls> {
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("a name");
    let conn = rustls::ClientConnection::new(cfg.clone(), name).map_err(std::io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, bound(addr)?);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}
