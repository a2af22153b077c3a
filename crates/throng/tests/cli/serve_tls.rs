//! `throng serve` over TLS end to end: the real binary on `--tls-listen`,
//! real TLS peers (Python `websockets` over `ssl`, tungstenite over a rustls
//! stream, a rustls HTTPS client, `openssl` for certificates), and the bad
//! inputs a TLS port meets.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConnection, StreamOwned};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use throng_proto::http;
use throng_testkit::certs::{Key, self_signed};
use throng_testkit::http::{get, metric_in};
use throng_testkit::process::command;
use throng_testkit::ws::{close_code_then_end, close_expecting_echo};
use throng_testkit::{Peer, Server, TempDir, peers, require, wait_until};
use tungstenite::Message;

use crate::{serve, throng};

pub(crate) type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A server with one plain and one TLS listener and a self-signed certificate.
pub(crate) fn start(extra: &[&str]) -> (Server, SocketAddr, String) {
    let mut args = vec!["--tls-listen", "127.0.0.1:0", "--tls-self-signed"];
    args.extend_from_slice(extra);
    let server = serve(&args);
    let tls = server.tls_addr();
    let pem = server.start["config"]["tls"]["cert_pem"]
        .as_str()
        .expect("the self-signed certificate in the start line")
        .to_owned();
    let line = server.start.to_string();
    assert!(!line.contains("PRIVATE KEY"), "the key leaked: {line}");
    assert!(!line.contains("ticket"), "the ticket key leaked: {line}");
    (server, tls, pem)
}

/// A client config trusting only `pem`, for `versions`.
pub(crate) fn client_config(
    pem: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// A TLS connection to `addr` with its handshake done.
pub(crate) fn connect(addr: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> Tls {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut s = StreamOwned::new(ClientConnection::new(cfg.clone(), name).unwrap(), tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).expect("TLS handshake");
    }
    assert_eq!(s.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    s
}

/// One HTTP request on a kept-alive TLS stream; returns status and body.
pub(crate) fn https(
    s: &mut Tls,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> (u16, Vec<u8>) {
    let mut req = Vec::new();
    let mut all: Vec<(&str, &[u8])> = vec![("Host", b"localhost")];
    all.extend_from_slice(headers);
    http::write_request(&mut req, method, path, &all, body);
    s.write_all(&req).unwrap();
    s.flush().unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some((resp, used)) = http::parse_response(&buf, http::MAX_HEAD).unwrap() {
            let mut dec = http::BodyDecoder::new(resp.body_kind(method).unwrap(), 1 << 24);
            let mut body = Vec::new();
            buf.drain(..used);
            loop {
                let step = dec.decode(&buf, false).unwrap();
                body.extend_from_slice(&buf[step.data.0..step.data.1]);
                buf.drain(..step.consumed);
                if step.done {
                    return (resp.status, body);
                }
                if step.consumed == 0 || buf.is_empty() {
                    let n = s.read(&mut chunk).unwrap();
                    assert!(n > 0, "closed mid-body");
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed before a response");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn publish(
    addr: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
    channel: &str,
    body: &[u8],
    ctype: Option<&str>,
) -> u64 {
    let mut s = connect(addr, cfg);
    let mut headers: Vec<(&str, &[u8])> = vec![("Connection", b"close")];
    if let Some(ct) = ctype {
        headers.push(("Content-Type", ct.as_bytes()));
    }
    let (status, reply) = https(
        &mut s,
        "POST",
        &format!("/publish/{channel}"),
        &headers,
        body,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    let v: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    v["subscribers"].as_u64().unwrap()
}

/// A tungstenite subscriber over a rustls stream this test wraps itself.
fn subscribe(
    addr: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
    channel: &str,
) -> tungstenite::WebSocket<Tls> {
    let s = connect(addr, cfg);
    let url = format!("wss://localhost:{}/{channel}", addr.port());
    let (ws, resp) = tungstenite::client(url, s).expect("upgrade over TLS");
    assert_eq!(resp.status(), 101);
    ws
}

/// Messages that cross TLS record boundaries (16 KiB) and frame-header sizes.
fn messages() -> Vec<(Vec<u8>, Option<&'static str>, bool)> {
    (0..30)
        .map(|i| match i % 5 {
            0 => (format!("text {i} ✓").into_bytes(), None, false),
            1 => (vec![0xff, 0, i as u8], None, true),
            2 => (
                (0..20_000).map(|j| (j % 251) as u8).collect(),
                Some("application/octet-stream"),
                true,
            ),
            3 => (
                format!("{{\"n\":{i},\"pad\":\"{}\"}}", "p".repeat(300)).into_bytes(),
                Some("application/json"),
                false,
            ),
            _ => (Vec::new(), Some("text/plain"), false),
        })
        .collect()
}

#[test]
fn wss_subscribers_from_python_and_tungstenite_get_every_message_in_order() {
    require!(Peer::PythonWebsockets);
    let (server, tls, pem) = start(&["--workers", "2"]);
    let dir = TempDir::new("serve-tls-wss");
    let ca = dir.file("cert.pem");
    std::fs::write(&ca, &pem).unwrap();
    let msgs = messages();

    let mut subscribers = Vec::new();
    for _ in 0..3 {
        let mut child = peers::python("serve_sub_wss.py")
            .arg(format!("wss://localhost:{}/interop", tls.port()))
            .arg(&ca)
            .arg(msgs.len().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start serve_sub_wss.py");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the Python peer did not subscribe");
        subscribers.push((child, out));
    }
    let cfg13 = client_config(&pem, &[&rustls::version::TLS13]);
    let cfg12 = client_config(&pem, &[&rustls::version::TLS12]);
    let mut subs: Vec<_> = (0..10)
        .map(|i| subscribe(tls, if i % 2 == 0 { &cfg13 } else { &cfg12 }, "interop"))
        .collect();
    // A plain subscriber on the same channel gets the same frames.
    let mut plain = throng_testkit::ws::subscribe(server.addr, "interop");
    server.wait_metric("throng_connections_open", |v| v == 14.0);

    for (body, ctype, _) in &msgs {
        assert_eq!(publish(tls, &cfg13, "interop", body, *ctype), 14);
    }
    let want = |body: &Vec<u8>, binary: bool| {
        if binary {
            Message::Binary(body.clone().into())
        } else {
            Message::text(String::from_utf8(body.clone()).unwrap())
        }
    };
    for s in &mut subs {
        for (i, (body, _, binary)) in msgs.iter().enumerate() {
            assert_eq!(s.read().unwrap(), want(body, *binary), "message {i}");
        }
    }
    for (i, (body, _, binary)) in msgs.iter().enumerate() {
        assert_eq!(
            plain.read().unwrap(),
            want(body, *binary),
            "plain message {i}"
        );
    }
    for (mut child, out) in subscribers {
        let lines: Vec<String> = out.lines().map(Result::unwrap).collect();
        assert!(child.wait().unwrap().success(), "python peer: {lines:?}");
        assert_eq!(lines.len(), msgs.len() + 1, "{lines:?}");
        for (i, (body, _, binary)) in msgs.iter().enumerate() {
            let v: serde_json::Value = serde_json::from_str(&lines[i]).unwrap();
            assert_eq!(v["binary"], *binary, "python message {i}");
            let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(v["hex"], hex, "python message {i}");
        }
        let end: serde_json::Value = serde_json::from_str(&lines[msgs.len()]).unwrap();
        assert_eq!(end["closed"], 1000, "close handshake over TLS");
        assert_eq!(end["tls"], "TLSv1.3");
    }
    // A ping over TLS is answered, and the client's close is echoed.
    for s in &mut subs {
        s.send(Message::Ping(b"hi".to_vec().into())).unwrap();
        assert_eq!(s.read().unwrap(), Message::Pong(b"hi".to_vec().into()));
        close_expecting_echo(s);
    }
    drop(plain);
    server.wait_metric("throng_connections_open", |v| v == 0.0);
    // Metrics are up to 0.5 s old; a client config reused resumes its sessions.
    let handshakes = |v: &str| {
        let text = get(server.addr, "/metrics").1;
        let kind = |k: &str| {
            metric_in(
                &text,
                &format!("throng_tls_handshakes_total{{kind=\"tls{v}_{k}\"}}"),
            )
            .unwrap_or(0.0)
        };
        kind("full") + kind("resumed")
    };
    wait_until("every handshake counted", || {
        handshakes("1.2") >= 5.0 && handshakes("1.3") >= 8.0
    });
    assert_eq!(
        server.metric("throng_connections_closed_total{reason=\"tls_error\"}"),
        0.0
    );
}

#[test]
fn https_serves_health_metrics_publish_and_ping_on_one_kept_alive_connection() {
    let (_server, tls, pem) = start(&["--workers", "1"]);
    let cfg = client_config(&pem, &[&rustls::version::TLS13, &rustls::version::TLS12]);
    let mut s = connect(tls, &cfg);
    let (status, body) = https(&mut s, "GET", "/healthz", &[], b"");
    assert_eq!((status, &body[..]), (200, &b"ok\n"[..]));
    let (status, body) = https(&mut s, "POST", "/publish/nobody", &[], b"hello");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("\"subscribers\":0"));
    let (status, body) = https(&mut s, "POST", "/ping", &[("times", b"3")], b"");
    assert_eq!((status, &body[..]), (200, &b"pongpongpongpong"[..]));
    let (status, body) = https(&mut s, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    assert_eq!(
        metric_in(&text, "throng_http_requests_total{endpoint=\"ping\"}"),
        Some(1.0)
    );
    // A body larger than one TLS record.
    let big = vec![b'x'; 40_000];
    let (status, _) = https(&mut s, "POST", "/publish/nobody", &[], &big);
    assert_eq!(status, 200);
    // The last answer is followed by close_notify: rustls reports a clean
    // end, not a truncation.
    let (status, _) = https(&mut s, "GET", "/healthz", &[("Connection", b"close")], b"");
    assert_eq!(status, 200);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("a clean TLS end");
    assert!(rest.is_empty());
}

#[test]
fn a_second_connection_resumes_on_either_worker() {
    let (server, tls, pem) = start(&["--workers", "2"]);
    for (version, label) in [
        (&rustls::version::TLS13, "tls1.3_resumed"),
        (&rustls::version::TLS12, "tls1.2_resumed"),
    ] {
        // One client config keeps its session store across connections.
        let cfg = client_config(&pem, &[version]);
        let mut first = connect(tls, &cfg);
        assert_eq!(
            first.conn.handshake_kind(),
            Some(rustls::HandshakeKind::Full)
        );
        // TLS 1.3 tickets come after the handshake: read the answer first.
        assert_eq!(https(&mut first, "GET", "/healthz", &[], b"").0, 200);
        drop(first);
        // The kernel spreads these over both workers; each resumes with
        // the ticket key the workers share.
        for i in 0..6 {
            let mut again = connect(tls, &cfg);
            assert_eq!(https(&mut again, "GET", "/healthz", &[], b"").0, 200);
            assert_eq!(
                again.conn.handshake_kind(),
                Some(rustls::HandshakeKind::Resumed),
                "{label}: connection {i} did not resume"
            );
        }
        server.wait_metric(
            &format!("throng_tls_handshakes_total{{kind=\"{label}\"}}"),
            |v| v >= 6.0,
        );
    }
}

/// Connects, sends `bytes`, and reads until the server closes (or 10 s).
fn send_and_read_to_close(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

#[test]
fn bad_clients_on_a_tls_port_are_closed_and_counted() {
    require!(Peer::Openssl);
    let (server, tls, pem) = start(&["--workers", "1", "--handshake-timeout", "1s"]);
    let failures = |reason: &str| {
        metric_in(
            &get(server.addr, "/metrics").1,
            &format!("throng_handshake_failures_total{{reason=\"{reason}\"}}"),
        )
        .unwrap_or(0.0)
    };

    // Plain HTTP on the TLS port: a plain 400 that says why, then close.
    let out = send_and_read_to_close(tls, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("https://"), "{text}");
    // Bytes that are no TLS at all.
    let out = send_and_read_to_close(tls, &[0u8; 64]);
    assert!(out.is_empty(), "{out:?}");
    // A handshake record announcing a message of megabytes: refused at
    // once (this once panicked the worker, an abort in release builds).
    let out = send_and_read_to_close(tls, b"\x16\x03\x01\x00\x05hello");
    assert!(out.is_empty() || out[0] == 0x15, "{out:?}");
    // A ClientHello that stops halfway, then silence: the handshake timeout ends it.
    let out = send_and_read_to_close(tls, &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]);
    assert!(out.is_empty(), "{out:?}");
    // A client that does not trust the certificate sends an alert.
    let untrusting = client_config(&other_cert(), &[&rustls::version::TLS13]);
    let tcp = TcpStream::connect(tls).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut s = StreamOwned::new(
        ClientConnection::new(untrusting, ServerName::try_from("localhost").unwrap()).unwrap(),
        tcp,
    );
    let mut refused = false;
    while s.conn.is_handshaking() {
        if s.conn.complete_io(&mut s.sock).is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused, "the client should refuse an unknown certificate");
    drop(s);

    // A subscriber whose next record is forged: the server's decryption
    // fails, it sends its alert and closes.
    let cfg = client_config(&pem, &[&rustls::version::TLS13]);
    let mut sub = subscribe(tls, &cfg, "forged");
    let mut forged = vec![0x17, 0x03, 0x03, 0x00, 0x20];
    forged.extend_from_slice(&[0x5a; 32]);
    sub.get_mut().sock.write_all(&forged).unwrap();
    let mut tail = Vec::new();
    let _ = sub.get_mut().sock.read_to_end(&mut tail);
    assert!(!tail.is_empty(), "an alert before the close");
    server.wait_metric(
        "throng_connections_closed_total{reason=\"tls_error\"}",
        |v| v == 1.0,
    );

    wait_until("every failure counted", || {
        failures("tls_plain_http") == 1.0
            && failures("tls_bad_message") == 1.0
            && failures("tls_not_tls") == 1.0
            && failures("tls_timeout") == 1.0
            && failures("tls_peer_alert") == 1.0
    });
    // The server still serves good clients.
    let cfg = client_config(&pem, &[&rustls::version::TLS13]);
    assert_eq!(publish(tls, &cfg, "after", b"x", None), 0);
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

/// Another self-signed certificate (not the server's), made with openssl.
fn other_cert() -> String {
    let dir = TempDir::new("serve-tls-other");
    let (cert, _) = self_signed(dir.path(), Key::Ec);
    std::fs::read_to_string(cert).unwrap()
}

/// Runs `throng serve` with `args`, expecting it to refuse to start.
fn refused(args: &[&str]) -> String {
    let out = throng()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-listen",
            "127.0.0.1:0",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn certificates_from_files_work_and_bad_ones_stop_the_start_with_a_clear_error() {
    require!(Peer::Openssl);
    let dir = TempDir::new("serve-tls-files");
    let (ec_cert, ec_key) = self_signed(dir.path(), Key::Ec);
    let (rsa_cert, rsa_key) = self_signed(dir.path(), Key::Rsa);
    let s = |p: &Path| p.to_str().unwrap().to_owned();

    // Good files, RSA and ECDSA: a client trusting them completes a handshake.
    for (cert, key) in [(&rsa_cert, &rsa_key), (&ec_cert, &ec_key)] {
        let server = serve(&[
            "--workers",
            "1",
            "--tls-listen",
            "127.0.0.1:0",
            "--tls-cert",
            &s(cert),
            "--tls-key",
            &s(key),
        ]);
        let tls = server.tls_addr();
        let cfg = client_config(
            &std::fs::read_to_string(cert).unwrap(),
            &[&rustls::version::TLS13, &rustls::version::TLS12],
        );
        assert_eq!(publish(tls, &cfg, "files", b"x", None), 0);
        // The fingerprint shown at start is the one openssl computes.
        let fp = command("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(cert)
            .output()
            .unwrap();
        let fp = String::from_utf8_lossy(&fp.stdout);
        let fp = fp.trim().rsplit('=').next().unwrap();
        assert_eq!(server.start["config"]["tls"]["sha256"], fp);
        // The key's kind is shown, so an RSA one's cost can be pointed at.
        let kind = if cert == &rsa_cert { "RSA" } else { "ECDSA" };
        assert_eq!(server.start["config"]["tls"]["key"], kind);
    }

    let missing = refused(&[
        "--tls-cert",
        "/nonexistent/cert.pem",
        "--tls-key",
        &s(&ec_key),
    ]);
    assert!(
        missing.contains("/nonexistent/cert.pem") && missing.contains("--tls-cert"),
        "{missing}"
    );
    let junk = dir.file("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let e = refused(&["--tls-cert", &s(&junk), "--tls-key", &s(&ec_key)]);
    assert!(e.contains("BEGIN CERTIFICATE"), "{e}");
    // The key given as the certificate, and the certificate as the key.
    let e = refused(&["--tls-cert", &s(&ec_key), "--tls-key", &s(&ec_cert)]);
    assert!(
        e.contains("BEGIN CERTIFICATE") || e.contains("private key"),
        "{e}"
    );
    // A key that belongs to another certificate.
    let e = refused(&["--tls-cert", &s(&ec_cert), "--tls-key", &s(&rsa_key)]);
    assert!(e.contains("refused") && e.contains("key"), "{e}");
    // TLS listeners with no certificate at all.
    let e = refused(&[]);
    assert!(
        e.contains("--tls-cert") && e.contains("--tls-self-signed"),
        "{e}"
    );
}

#[test]
fn a_tls_subscriber_that_falls_behind_is_queued_ciphertext_and_gets_every_frame_in_order() {
    let (server, tls, pem) = start(&["--workers", "1", "--max-queue", "16MiB"]);
    let cfg = client_config(&pem, &[&rustls::version::TLS13]);
    // A small receive buffer and no reading: the kernel's buffers fill
    // (send side at most 4 MiB here) and the server queues the rest.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&tls.into()).unwrap();
    let tcp: TcpStream = sock.into();
    tcp.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut s = StreamOwned::new(ClientConnection::new(cfg.clone(), name).unwrap(), tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    let url = format!("wss://localhost:{}/behind", tls.port());
    let (mut lagging, _) = tungstenite::client(url, s).expect("upgrade over TLS");
    server.wait_metric("throng_connections_open", |v| v == 1.0);

    let n = 300;
    for i in 0..n {
        let mut body = vec![b'a' + (i % 26) as u8; 20_000];
        body[..8].copy_from_slice(format!("{i:08}").as_bytes());
        assert_eq!(publish(tls, &cfg, "behind", &body, Some("text/plain")), 1);
    }
    server.wait_metric("throng_connections_queued", |v| v == 1.0);
    for i in 0..n {
        match lagging.read().unwrap() {
            Message::Text(t) => {
                assert_eq!(t.len(), 20_000);
                assert_eq!(&t.as_str()[..8], format!("{i:08}"), "message {i} in order");
            }
            other => panic!("message {i}: {other:?}"),
        }
    }
    server.wait_metric("throng_connections_queued", |v| v == 0.0);
    assert_eq!(server.metric("throng_frames_dropped_total"), 0.0);
}

#[test]
fn heartbeat_pings_reach_tls_subscribers_and_their_pongs_count() {
    let (server, tls, pem) = start(&[
        "--workers",
        "1",
        "--ping-interval",
        "300ms",
        "--idle-timeout",
        "1s",
    ]);
    let cfg = client_config(&pem, &[&rustls::version::TLS12]);
    let mut sub = subscribe(tls, &cfg, "beat");
    // tungstenite answers each ping with a pong as it reads; the pongs,
    // decrypted by the server, are all it hears for over twice the idle
    // timeout, and the subscriber stays.
    for _ in 0..8 {
        assert!(matches!(sub.read().unwrap(), Message::Ping(_)));
        sub.flush().unwrap();
    }
    server.wait_metric("throng_pings_sent_total", |v| v >= 8.0);
    assert_eq!(publish(tls, &cfg, "beat", b"still here", None), 1);
    loop {
        match sub.read().unwrap() {
            Message::Ping(_) => sub.flush().unwrap(),
            m => {
                assert_eq!(m, Message::text("still here"));
                break;
            }
        }
    }
}

#[test]
fn sigterm_sends_1001_and_close_notify_to_tls_subscribers() {
    let (mut server, tls, pem) = start(&["--workers", "2", "--drain-timeout", "5s"]);
    let cfg = client_config(&pem, &[&rustls::version::TLS13]);
    let mut subs: Vec<_> = (0..6).map(|_| subscribe(tls, &cfg, "bye")).collect();
    server.wait_metric("throng_connections_open", |v| v == 6.0);
    server.signal("TERM");
    for s in &mut subs {
        assert_eq!(close_code_then_end(s), Some(1001));
    }
    wait_until("the server exits after SIGTERM", || {
        server.child.try_wait().unwrap().is_some()
    });
    assert!(server.child.wait().unwrap().success());
}

#[test]
fn a_key_update_from_a_subscriber_is_answered_and_frames_keep_flowing() {
    let (server, tls, pem) = start(&["--workers", "1"]);
    let cfg = client_config(&pem, &[&rustls::version::TLS13]);
    let mut sub = subscribe(tls, &cfg, "rekey");
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    for round in 0..3 {
        // key_update with update_requested: the server must switch its
        // receiving keys and send its own key_update before its next record.
        sub.get_mut().conn.refresh_traffic_keys().unwrap();
        sub.send(Message::Ping(vec![round].into())).unwrap();
        assert_eq!(sub.read().unwrap(), Message::Pong(vec![round].into()));
        let body = format!("after key update {round}");
        assert_eq!(publish(tls, &cfg, "rekey", body.as_bytes(), None), 1);
        assert_eq!(sub.read().unwrap(), Message::text(body));
    }
    assert_eq!(
        server.metric("throng_connections_closed_total{reason=\"tls_error\"}"),
        0.0
    );
}
