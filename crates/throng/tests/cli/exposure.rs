//! The smaller guards of issue 28: a warning for every unauthenticated
//! listener outside loopback, `/ping` (the test back end) only on loopback
//! unless `--test-backend`, and the publish key only in the Authorization
//! header.

use std::time::Duration;

use throng_testkit::TempDir;
use throng_testkit::http::raw;
use throng_testkit::process::{output_within, text};

use crate::{serve, throng};

#[test]
fn every_unauthenticated_listener_outside_loopback_warns() {
    for (flag, what) in [
        ("--mqtt-listen", "subscribe to any channel"),
        ("--publish-listen", "publish to every subscriber"),
    ] {
        let out = output_within(
            throng().args(["serve", "--dry-run", flag, "0.0.0.0:0"]),
            Duration::from_secs(20),
        );
        let err = text(&out.stderr);
        assert!(out.status.success(), "{err}");
        let warned = err.lines().any(|l| {
            l.contains("WARNING") && l.contains("0.0.0.0:") && l.contains("no authentication")
        });
        assert!(warned && err.contains(what), "{flag}: {err}");
    }
}

#[test]
fn ping_is_served_on_loopback_only_unless_asked_for() {
    let ping = b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let local = serve(&["--workers", "1"]);
    assert_eq!(raw(local.addr, ping).0, 200);
    // 0.0.0.0 is not loopback, even when reached over 127.0.0.1.
    let public = serve(&["--workers", "1", "--listen", "0.0.0.0:0"]);
    let wildcard = public.start["listen"][1].as_str().unwrap();
    let port: u16 = wildcard.rsplit(':').next().unwrap().parse().unwrap();
    let at = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (status, _, body) = raw(at, ping);
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("--test-backend"), "{body}");
    let asked = serve(&["--workers", "1", "--listen", "0.0.0.0:0", "--test-backend"]);
    let port: u16 = asked.start["listen"][1]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let at = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(raw(at, ping).0, 200);
}

#[test]
fn the_publish_key_counts_only_in_the_authorization_header() {
    let dir = TempDir::new("key-in-url");
    let key = "a-publish-key-of-some-length";
    std::fs::write(dir.file("key"), key).unwrap();
    let server = serve(&["--workers", "1", "--publish-key-file", &dir.arg("key")]);
    let in_url = format!(
        "POST /publish/news?token={key} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
    );
    assert_eq!(raw(server.addr, in_url.as_bytes()).0, 401);
    let in_header = format!(
        "POST /publish/news HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
    );
    assert_eq!(raw(server.addr, in_header.as_bytes()).0, 200);
}
