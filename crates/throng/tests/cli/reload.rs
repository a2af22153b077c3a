//! SIGHUP reloads: the certificate, the token keys and the publish key
//! are read again and used by every worker; a bad file is logged and the
//! old material kept; the server keeps serving either way.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use throng_proto::http;
use throng_testkit::certs::Certs;
use throng_testkit::temp::TempDir;
use throng_testkit::wait_until;

use crate::serve;

/// `POST /publish/news` with `Authorization: Bearer <key>`: the status.
fn publish_with_key(addr: SocketAddr, key: &str) -> u16 {
    let mut req = Vec::new();
    let bearer = format!("Bearer {key}");
    let headers: Vec<(&str, &[u8])> = vec![
        ("Host", b"x"),
        ("Connection", b"close"),
        ("Authorization", bearer.as_bytes()),
    ];
    http::write_request(&mut req, "POST", "/publish/news", &headers, b"hi");
    throng_testkit::http::raw(addr, &req).0
}

/// What `openssl x509 -fingerprint -sha256` says of the certificate
/// `source` pipes into it: the certificate served on an address, or a file.
fn fingerprint(source: &str) -> String {
    let script = format!("{source} | openssl x509 -noout -fingerprint -sha256");
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.trim()
        .rsplit('=')
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn served_fingerprint(addr: SocketAddr) -> String {
    fingerprint(&format!(
        "timeout 10 openssl s_client -connect {addr} </dev/null 2>/dev/null"
    ))
}

fn file_fingerprint(pem: &str) -> String {
    fingerprint(&format!("cat {pem}"))
}

#[test]
fn sighup_reloads_certificate_and_keys_and_keeps_the_old_on_a_bad_file() {
    let (first, second) = (Certs::generate("reload-a"), Certs::generate("reload-b"));
    let dir = TempDir::new("reload");
    let (cert, key) = (dir.arg("cert.pem"), dir.arg("key.pem"));
    std::fs::copy(first.cert(), &cert).unwrap();
    std::fs::copy(first.key(), &key).unwrap();
    std::fs::write(dir.file("publish"), "the-first-publish-key\n").unwrap();
    std::fs::write(dir.file("secret"), "s".repeat(40)).unwrap();
    let server = serve(&[
        "--workers",
        "2",
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--auth-hs256-secret-file",
        &dir.arg("secret"),
        "--publish-key-file",
        &dir.arg("publish"),
    ]);
    assert_eq!(publish_with_key(server.addr, "the-first-publish-key"), 200);
    assert_eq!(
        served_fingerprint(server.tls_addr()),
        file_fingerprint(first.cert())
    );

    // Good files: every worker takes them.
    std::fs::copy(second.cert(), &cert).unwrap();
    std::fs::copy(second.key(), &key).unwrap();
    std::fs::write(dir.file("publish"), "the-second-publish-key\n").unwrap();
    server.signal("HUP");
    wait_until("the reload is logged", || {
        server.log().contains("SIGHUP: reloaded publish key")
    });
    let log = server.log();
    assert!(log.contains("SIGHUP: reloaded tls certificate"), "{log}");
    assert!(log.contains("SIGHUP: reloaded token keys"), "{log}");
    // Both workers (the kernel picks one per connection): try a few times.
    for _ in 0..6 {
        assert_eq!(publish_with_key(server.addr, "the-second-publish-key"), 200);
        assert_eq!(publish_with_key(server.addr, "the-first-publish-key"), 401);
        assert_eq!(
            served_fingerprint(server.tls_addr()),
            file_fingerprint(second.cert())
        );
    }

    // A bad file: logged, the old material stays, the server serves on.
    std::fs::write(dir.file("secret"), "short").unwrap();
    std::fs::write(&cert, "not a certificate").unwrap();
    server.signal("HUP");
    wait_until("the failed reload is logged", || {
        server.log().contains("SIGHUP: ERROR: token keys")
    });
    std::thread::sleep(Duration::from_millis(200));
    let log = server.log();
    assert!(log.contains("SIGHUP: ERROR: tls certificate"), "{log}");
    assert!(log.contains("the old keys stay in use"), "{log}");
    assert_eq!(publish_with_key(server.addr, "the-second-publish-key"), 200);
    assert_eq!(
        served_fingerprint(server.tls_addr()),
        file_fingerprint(second.cert())
    );
    assert!(server.worker_pids().len() == 2, "no worker died: {log}");
}

#[test]
fn sighup_without_files_is_logged_and_harmless() {
    let server = serve(&["--workers", "1"]);
    server.signal("HUP");
    wait_until("the reload is logged", || {
        server.log().contains("SIGHUP: nothing to reload")
    });
    assert!(throng_testkit::http::healthy(server.addr));
}
