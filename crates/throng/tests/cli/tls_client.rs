//! The TLS client of `throng hold` (`wss://`) and `throng attack`
//! (`https://`) against real TLS servers: HAProxy (Debian) terminating TLS
//! in front of a plain `throng serve`, and Python `websockets` with its own
//! `ssl` module. The certificates are made here with the `openssl` CLI: a CA,
//! a server certificate it signs (for `localhost` and 127.0.0.1), and a
//! second, unrelated CA. Every run is bounded (hundreds of connections,
//! seconds) and uses free loopback ports only.

use std::net::TcpListener;
use std::time::Duration;

use throng_testkit::certs::Certs;
use throng_testkit::haproxy::Haproxy;
use throng_testkit::hold_server::HoldServer;
use throng_testkit::json::count as n;
use throng_testkit::process::text;
use throng_testkit::{Peer, TempDir, require};

use crate::{run_json as throng, serve};

/// The acceptance case: wss:// through HAProxy to `throng serve`, two worker
/// processes, the CA given; every published message reaches every
/// subscriber, every handshake is a full one (resumption is off by
/// default), and the result file and `throng report` show the TLS figures.
#[test]
fn hold_wss_through_haproxy_delivers_every_message() {
    require!(Peer::Haproxy, Peer::Openssl);
    let certs = Certs::generate("tls-client");
    let server = serve(&["--workers", "2"]);
    let proxy = Haproxy::tls(server.addr, certs.cert_and_key(), "");
    let dir = TempDir::new("tls-client");
    let out = dir.file("hold-wss.jsonl");
    let (code, s, stderr) = throng(
        "hold",
        &[
            &format!("wss://localhost:{}/news", proxy.port()),
            "-c",
            "600",
            "--rate",
            "1500/s",
            "-w",
            "2",
            "--tls-ca",
            certs.ca(),
            "--duration",
            "2s",
            "--publish",
            &format!("http://{}/publish/news", server.addr),
            "--publish-rate",
            "10/s",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(n(&s, &["workers"]), 2);
    assert_eq!(n(&s, &["opened"]), 600, "{s:#}\n{stderr}");
    let published = n(&s, &["published"]);
    assert!(published >= 10, "{s:#}");
    assert_eq!(n(&s, &["received"]), published * 600, "{s:#}");
    assert_eq!(n(&s, &["lost"]), 0, "{s:#}");
    assert_eq!(n(&s, &["closed", "clean"]), 600, "{s:#}");
    assert_eq!(n(&s, &["tls_full"]), 600, "{s:#}");
    assert_eq!(n(&s, &["tls_resumed"]), 0, "{s:#}");
    for phase in ["connect_tcp_us", "connect_tls_us", "connect_upgrade_us"] {
        assert_eq!(n(&s, &[phase, "count"]), 600, "{phase}: {s:#}");
    }

    let report = crate::throng().arg("report").arg(&out).output().unwrap();
    let text = text(&report.stdout);
    assert!(report.status.success(), "{text}");
    for line in ["connect.tls", "connect.tcp", "connect.upgrade"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(line)),
            "report has no {line} line:\n{text}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("tls.handshakes.full") && l.contains("600")),
        "{text}"
    );
}

/// The two halves together: `throng hold wss://` against `throng serve`'s own
/// TLS listener (self-signed; its certificate from the start line as the CA)
/// on two server workers, with resumption on, publishing over https to the
/// same listener: every message reaches every connection, and session
/// tickets issued by one worker resume on the other (the workers share the
/// ticket key).
#[test]
fn hold_wss_against_throng_serve_tls_resumes_across_workers() {
    let server = serve(&[
        "--workers",
        "2",
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-self-signed",
    ]);
    let tls = server.tls_addr();
    let dir = TempDir::new("tls-client");
    let ca = dir.file("serve-self-signed.pem");
    let pem = server.start["config"]["tls"]["cert_pem"]
        .as_str()
        .expect("the certificate in the start line");
    std::fs::write(&ca, pem).unwrap();
    let (code, s, stderr) = throng(
        "hold",
        &[
            &format!("wss://localhost:{}/news", tls.port()),
            "-c",
            "400",
            // Slow enough that a loaded machine's first handshakes (and
            // their tickets) end before most connections start.
            "--rate",
            "100/s",
            "-w",
            "2",
            "--tls-ca",
            ca.to_str().unwrap(),
            "--tls-resume",
            "--duration",
            "2s",
            "--publish",
            &format!("https://localhost:{}/publish/news", tls.port()),
            "--publish-tls-ca",
            ca.to_str().unwrap(),
            "--publish-rate",
            "10/s",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(n(&s, &["opened"]), 400, "{s:#}\n{stderr}");
    let published = n(&s, &["published"]);
    assert!(published >= 10, "{s:#}");
    assert_eq!(n(&s, &["received"]), published * 400, "{s:#}");
    assert_eq!(n(&s, &["lost"]), 0, "{s:#}");
    assert_eq!(n(&s, &["tls_full"]) + n(&s, &["tls_resumed"]), 400, "{s:#}");
    // Only the connections a client worker opens before its first ticket
    // arrives are full (a few of 400 on an idle machine, 160 at 1000/s on
    // a loaded one); the rest resume on whichever server worker the
    // kernel picks.
    assert!(n(&s, &["tls_resumed"]) >= 300, "{s:#}");
    let resumed = server.metric("throng_tls_handshakes_total{kind=\"tls1.3_resumed\"}");
    assert!(
        resumed >= 300.0,
        "server counted {resumed} resumed handshakes"
    );
}

/// Every record format the client takes over from rustls after the
/// handshake: TLS 1.3 and TLS 1.2, AES-GCM and ChaCha20-Poly1305. Messages
/// of 40 KB arrive whole (decryption, records split across reads), the server's pings are answered (encryption: the
/// server drops a connection whose pongs it cannot read) and our close is
/// answered.
#[test]
fn every_record_format_delivers_and_answers_pings() {
    require!(Peer::Haproxy, Peer::Openssl);
    let certs = Certs::generate("tls-client");
    let server = serve(&["--ping-interval", "300ms"]);
    for opts in [
        " ssl-min-ver TLSv1.3 ciphersuites TLS_AES_256_GCM_SHA384",
        " ssl-min-ver TLSv1.3 ciphersuites TLS_CHACHA20_POLY1305_SHA256",
        " ssl-max-ver TLSv1.2 ciphers ECDHE-ECDSA-AES128-GCM-SHA256",
        " ssl-max-ver TLSv1.2 ciphers ECDHE-ECDSA-CHACHA20-POLY1305",
    ] {
        let proxy = Haproxy::tls(server.addr, certs.cert_and_key(), opts);
        let (code, s, stderr) = throng(
            "hold",
            &[
                &format!("wss://localhost:{}/fmt", proxy.port()),
                "-c",
                "100",
                "--rate",
                "1000/s",
                "--tls-ca",
                certs.ca(),
                "--duration",
                "2500ms",
                "--publish",
                &format!("http://{}/publish/fmt", server.addr),
                "--publish-rate",
                "10/s",
                // Each message spans three TLS records and several reads.
                "--message-size",
                "40k",
            ],
        );
        assert_eq!(code, 0, "{opts}: {stderr}");
        assert_eq!(n(&s, &["opened"]), 100, "{opts}: {s:#}\n{stderr}");
        let published = n(&s, &["published"]);
        assert!(published >= 10, "{opts}: {s:#}");
        assert_eq!(n(&s, &["received"]), published * 100, "{opts}: {s:#}");
        // Idle timeout 3 × 300 ms, held 2.5 s: without readable pongs every
        // connection would be closed by the server.
        assert_eq!(n(&s, &["closed", "clean"]), 100, "{opts}: {s:#}");
    }
}

/// `--tls-resume` resumes: after a worker's first full handshake, later
/// connections present its tickets, on TLS 1.3 and on TLS 1.2.
#[test]
fn tls_resume_actually_resumes_on_tls13_and_tls12() {
    require!(Peer::Haproxy, Peer::Openssl);
    let certs = Certs::generate("tls-client");
    let server = serve(&[]);
    for (max_ver, bind_options) in [(None, ""), (Some("TLSv1.2"), "ssl-max-ver TLSv1.2")] {
        let proxy = Haproxy::tls(server.addr, certs.cert_and_key(), bind_options);
        let (code, s, stderr) = throng(
            "hold",
            &[
                &format!("wss://127.0.0.1:{}/chan", proxy.port()),
                "-c",
                "200",
                "--rate",
                "400/s",
                "-w",
                "2",
                "--tls-ca",
                certs.ca(),
                "--tls-resume",
                "--duration",
                "1s",
            ],
        );
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(n(&s, &["opened"]), 200, "{max_ver:?}: {s:#}\n{stderr}");
        let (full, resumed) = (n(&s, &["tls_full"]), n(&s, &["tls_resumed"]));
        assert_eq!(full + resumed, 200, "{max_ver:?}: {s:#}");
        // Each worker needs one full handshake before it holds a ticket;
        // a few more may start before the first ticket arrives.
        assert!(resumed >= 150, "{max_ver:?}: only {resumed} resumed: {s:#}");

        let (code, a, stderr) = throng(
            "attack",
            &[
                "--url",
                &format!("https://localhost:{}/ping", proxy.port()),
                "--tls-ca",
                certs.ca(),
                "--tls-resume",
                "--no-keepalive",
                "--max",
                "--connections",
                "16",
                "--requests",
                "200",
                "-w",
                "1",
            ],
        );
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(
            n(&a, &["status", "200"]),
            200,
            "{max_ver:?}: {a:#}\n{stderr}"
        );
        assert_eq!(n(&a, &["connections_opened"]), 200, "{a:#}");
        let (full, resumed) = (n(&a, &["tls_full"]), n(&a, &["tls_resumed"]));
        assert_eq!(full + resumed, 200, "{max_ver:?}: {a:#}");
        // 16 connections at a time, each TLS 1.3 ticket used once: only the
        // first few may be full (a cache of 8 tickets would fall back often).
        assert!(resumed >= 180, "{max_ver:?}: only {resumed} resumed: {a:#}");
    }
}

/// `throng attack https://` at a set rate through HAProxy: every request of
/// the schedule is answered, on keep-alive connections (a targets file) and
/// with a new connection and full handshake per request.
#[test]
fn attack_https_through_haproxy_answers_every_request() {
    require!(Peer::Haproxy, Peer::Openssl);
    let certs = Certs::generate("tls-client");
    let server = serve(&[]);
    let proxy = Haproxy::tls(server.addr, certs.cert_and_key(), "");
    let dir = TempDir::new("tls-client");
    let targets = dir.file("targets.txt");
    std::fs::write(
        &targets,
        format!(
            "GET https://localhost:{p}/ping\n\nPOST https://127.0.0.1:{p}/ping\nsleep: 1\n",
            p = proxy.port()
        ),
    )
    .unwrap();
    let ca = certs.ca();
    let (code, a, stderr) = throng(
        "attack",
        &[
            "--targets",
            targets.to_str().unwrap(),
            "--tls-ca",
            ca,
            "--rate",
            "300/s",
            "--duration",
            "2s",
            "-w",
            "2",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(n(&a, &["requests"]), 600, "{a:#}");
    assert_eq!(n(&a, &["status", "200"]), 600, "{a:#}\n{stderr}");
    assert!(
        a["errors"].as_object().is_none_or(|e| e.is_empty()),
        "{a:#}"
    );
    // Keep-alive: a few connections (two SNI names, two workers), each one full handshake.
    let opened = n(&a, &["connections_opened"]);
    assert!((2..100).contains(&opened), "{a:#}");
    assert_eq!(n(&a, &["tls_full"]), opened, "{a:#}");

    let (code, a, stderr) = throng(
        "attack",
        &[
            "--url",
            &format!("https://localhost:{}/ping", proxy.port()),
            "--tls-ca",
            ca,
            "--no-keepalive",
            "--rate",
            "200/s",
            "--duration",
            "1s",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(n(&a, &["status", "200"]), 200, "{a:#}\n{stderr}");
    assert_eq!(n(&a, &["tls_full"]), 200, "{a:#}");
    assert_eq!(n(&a, &["connect_tls_us", "count"]), 200, "{a:#}");
}

/// A CA that did not sign the server's certificate: every connection fails,
/// counted as the TLS kind with rustls's reason; nothing panics. A plain
/// server behind a wss:// URL fails as a TLS protocol error.
#[test]
fn wrong_ca_and_non_tls_servers_fail_as_tls_errors() {
    require!(Peer::Haproxy, Peer::Openssl);
    let certs = Certs::generate("tls-client");
    let server = serve(&[]);
    let proxy = Haproxy::tls(server.addr, certs.cert_and_key(), "");
    let other = certs.new_ca("other");
    let (code, s, stderr) = throng(
        "hold",
        &[
            &format!("wss://localhost:{}/chan", proxy.port()),
            "-c",
            "50",
            "--rate",
            "500/s",
            "-w",
            "2",
            "--tls-ca",
            &other,
            "--duration",
            "1s",
        ],
    );
    assert_eq!(code, 1, "every connection failed: {stderr}");
    assert_eq!(n(&s, &["opened"]), 0, "{s:#}");
    assert_eq!(n(&s, &["failed", "tls.unknown_issuer"]), 50, "{s:#}");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");

    let (code, a, stderr) = throng(
        "attack",
        &[
            "--url",
            &format!("https://localhost:{}/ping", proxy.port()),
            "--tls-ca",
            &other,
            "--rate",
            "100/s",
            "--requests",
            "40",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(n(&a, &["errors", "tls.unknown_issuer"]), 40, "{a:#}");

    // The right CA but the wrong name: 127.0.0.2 is not in the certificate.
    let (code, s, stderr) = throng(
        "hold",
        &[
            &format!("wss://127.0.0.2:{}/chan", proxy.port()),
            "-c",
            "20",
            "--tls-ca",
            certs.ca(),
            "--duration",
            "1s",
        ],
    );
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        n(&s, &["failed", "tls.name_mismatch"]),
        20,
        "{s:#}\n{stderr}"
    );

    // throng serve's plain port behind a wss:// URL.
    let (code, s, stderr) = throng(
        "hold",
        &[
            &format!("wss://{}/chan", server.addr),
            "-c",
            "20",
            "--tls-insecure",
            "--duration",
            "1s",
        ],
    );
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(n(&s, &["failed", "tls.protocol"]), 20, "{s:#}\n{stderr}");
}

/// Setup mistakes stop the run at once with a message that says what to do.
#[test]
fn tls_setup_errors_are_clear() {
    require!(Peer::Openssl);
    let certs = Certs::generate("tls-client");
    let (code, _, stderr) = throng(
        "hold",
        &["wss://127.0.0.1:9/chan", "--tls-ca", "/nonexistent/ca.pem"],
    );
    assert_ne!(code, 0);
    assert!(stderr.contains("--tls-ca /nonexistent/ca.pem"), "{stderr}");
    let (code, _, stderr) = throng("hold", &["ws://127.0.0.1:9/chan", "--tls-insecure"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("need a TLS target"), "{stderr}");
    let (code, _, stderr) = throng(
        "attack",
        &[
            "--url",
            "https://127.0.0.1:9/",
            "--tls-ca",
            certs.key(),
            "--rate",
            "1/s",
            "-n",
            "1",
        ],
    );
    assert_ne!(code, 0);
    assert!(stderr.contains("no certificate"), "{stderr}");
}

/// An independent TLS server: Python `websockets` with the `ssl` module
/// (OpenSSL). `--tls-insecure` accepts its certificate without the CA.
#[test]
fn python_websockets_tls_peer_receives_every_message() {
    require!(Peer::PythonWebsockets, Peer::Openssl);
    let certs = Certs::generate("tls-client");
    let peer = HoldServer::python(&["--tls-cert", certs.cert(), "--tls-key", certs.key()]);
    let (ws_port, http_port) = (peer.ws_ports.0, peer.http_port);
    for trust in [["--tls-ca", certs.ca()], ["--tls-insecure", ""]] {
        let mut args = vec![
            format!("wss://127.0.0.1:{ws_port}/chan"),
            "-c".into(),
            "300".into(),
            "--rate".into(),
            "1000/s".into(),
            "-w".into(),
            "2".into(),
            "--duration".into(),
            "2s".into(),
            "--publish".into(),
            format!("http://127.0.0.1:{http_port}/publish/chan"),
            "--publish-rate".into(),
            "10/s".into(),
        ];
        args.extend(
            trust
                .iter()
                .filter(|a| !a.is_empty())
                .map(|a| a.to_string()),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, s, stderr) = throng("hold", &args);
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(n(&s, &["opened"]), 300, "{trust:?}: {s:#}\n{stderr}");
        let published = n(&s, &["published"]);
        assert!(published >= 10, "{s:#}");
        assert_eq!(n(&s, &["received"]), published * 300, "{s:#}");
        assert_eq!(n(&s, &["lost"]), 0, "{s:#}");
        assert_eq!(n(&s, &["closed", "clean"]), 300, "{s:#}");
    }
}

/// What the rustls test server does once the upgrade is answered.
#[derive(Debug, Clone, Copy)]
enum Misbehave {
    /// Sends a record that does not decrypt.
    Garbage,
    /// Starts a TLS 1.3 key update, then sends a message under the new key.
    KeyUpdate,
}

/// A WebSocket server on rustls (a second, independent TLS implementation
/// on the server side) that answers `conns` upgrades, then misbehaves.
fn rustls_server(certs: &Certs, conns: usize, how: Misbehave) -> u16 {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read as _, Write as _};
    use std::sync::Arc;
    use throng_proto::{http, ws};

    let chain = CertificateDer::pem_file_iter(certs.cert())
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(certs.key()).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for tcp in listener.incoming().take(conns) {
            let Ok(tcp) = tcp else { return };
            let config = config.clone();
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                let req_len = loop {
                    let Ok(n) = tls.read(&mut buf) else { return };
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..n]);
                    if let Ok(Some((_, used))) = http::parse_request(&head, http::MAX_HEAD) {
                        break used;
                    }
                };
                let (req, _) = http::parse_request(&head[..req_len], http::MAX_HEAD)
                    .unwrap()
                    .unwrap();
                let accept = ws::server_accept(&req).unwrap();
                let mut out = Vec::new();
                ws::write_accept(&mut out, &accept);
                tls.write_all(&out).unwrap();
                tls.flush().unwrap();
                std::thread::sleep(Duration::from_millis(300));
                match how {
                    Misbehave::Garbage => {
                        let mut junk = vec![23, 3, 3, 0, 40];
                        junk.extend_from_slice(&[0x5a; 40]);
                        let _ = tls.sock.write_all(&junk);
                    }
                    Misbehave::KeyUpdate => {
                        tls.conn.refresh_traffic_keys().unwrap();
                        let frame = ws::server_frame(ws::OpCode::Text, b"after the update");
                        let _ = tls.write_all(&frame);
                        let _ = tls.flush();
                    }
                }
                std::thread::sleep(Duration::from_secs(5));
            });
        }
    });
    port
}

/// Bad input on an established connection (a record that does not decrypt,
/// a key update, which held connections do not follow) ends that
/// connection, counted as `closed.tls`; nothing panics or hangs.
#[test]
fn broken_records_and_key_updates_close_as_tls() {
    require!(Peer::Openssl);
    let certs = Certs::generate("tls-client");
    for how in [Misbehave::Garbage, Misbehave::KeyUpdate] {
        let port = rustls_server(&certs, 10, how);
        let (code, s, stderr) = throng(
            "hold",
            &[
                &format!("wss://localhost:{port}/chan"),
                "-c",
                "10",
                "--rate",
                "100/s",
                "--tls-ca",
                certs.ca(),
                "--duration",
                "1s",
            ],
        );
        assert_eq!(code, 0, "{how:?}: {stderr}");
        assert_eq!(n(&s, &["opened"]), 10, "{how:?}: {s:#}\n{stderr}");
        assert_eq!(n(&s, &["closed", "tls"]), 10, "{how:?}: {s:#}");
    }
}
