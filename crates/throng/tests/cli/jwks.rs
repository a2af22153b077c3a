//! `serve --auth-jwks-url`: keys from a JSON Web Key Set served over HTTPS
//! by Python's `ssl` (`tests/peers/jwks_server.py`), written and signed by
//! PyJWT, rotated while the server runs.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::json;
use throng_testkit::certs::Certs;
use throng_testkit::jwt::{JwksServer, Mint};
use throng_testkit::process::{output_within, text};
use throng_testkit::{Peer, TempDir, require};

use crate::auth::{exchange, upgrade_request};
use crate::{serve, throng};

/// The status of an upgrade to `/news` with `token`.
fn upgrade(addr: SocketAddr, token: &str) -> (u16, String) {
    let a = exchange(
        addr,
        Ipv4Addr::LOCALHOST,
        &upgrade_request(&format!("/news?token={token}"), &[]),
    );
    (a.status, a.head)
}

/// Tries the upgrade until it gets `want` (the key set is read again in
/// the background), within a generous minute.
fn until_status(addr: SocketAddr, token: &str, want: u16) {
    let start = Instant::now();
    loop {
        let (status, head) = upgrade(addr, token);
        if status == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "still {status}, not {want}: {head}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn keys_come_from_an_https_key_set_and_a_rotation_is_picked_up_on_an_unknown_kid() {
    require!(Peer::PythonJwt, Peer::Openssl);
    let (old, new) = (Mint::new(), Mint::new());
    let certs = Certs::generate("jwks");
    let dir = TempDir::new("jwks");
    let set = dir.file("jwks.json");
    std::fs::write(&set, old.jwks(&["a=rsa", "e=ec", "d=ed"])).expect("write the set");
    let mut provider = JwksServer::start(&certs, &set);
    let server = serve(&[
        "--workers",
        "2",
        "--auth-jwks-url",
        &provider.url("/.well-known/jwks.json"),
        "--auth-jwks-ca",
        certs.ca(),
        "--auth-jwks-refresh",
        "1h",
    ]);
    let grant = json!({"exp_in": 600, "channels": ["news"]});
    let token = |mint: &Mint, alg: &str, kid: &str| {
        mint.token(json!({"alg": alg, "kid": kid, "claims": grant}))
    };
    for (alg, kid) in [("RS256", "a"), ("ES256", "e"), ("EdDSA", "d")] {
        let (status, head) = upgrade(server.addr, &token(&old, alg, kid));
        assert_eq!(status, 101, "{alg} kid {kid}: {head}");
    }
    // A key the set does not hold, and a known kid signed by another key.
    let rotated = token(&new, "RS256", "b");
    assert_eq!(upgrade(server.addr, &rotated).0, 401);
    assert_eq!(upgrade(server.addr, &token(&new, "RS256", "a")).0, 401);
    // The provider rotates: "b" in, "a" out. The next token naming "b"
    // makes the server read the set again.
    std::fs::write(&set, new.jwks(&["b=rsa"])).expect("rotate the set");
    until_status(server.addr, &rotated, 101);
    assert_eq!(upgrade(server.addr, &token(&old, "RS256", "a")).0, 401);
    assert!(
        server
            .log()
            .contains("the key set changed: kids b (were a, e, d)"),
        "{}",
        server.log()
    );
    // A flood of made-up kids: the provider is asked at most once per 5 s.
    let made_up: Vec<String> = new.tokens(
        &(0..300)
            .map(|i| json!({"alg": "RS256", "kid": format!("nobody-{}", i % 3), "claims": grant}))
            .collect::<Vec<_>>(),
    );
    let before = provider.gets();
    let start = Instant::now();
    for t in &made_up {
        assert_eq!(upgrade(server.addr, t).0, 401);
    }
    let gets = provider.gets() - before;
    let allowed = start.elapsed().as_secs() / 5 + 2;
    assert!(gets <= allowed, "{gets} reads in {:?}", start.elapsed());
    assert_eq!(upgrade(server.addr, &rotated).0, 101, "the keys were kept");
    // SIGHUP reads the set again, before any token names the new key.
    std::fs::write(&set, new.jwks(&["b=rsa", "c=ec"])).expect("add a key");
    server.signal("HUP");
    // At most once per 5 s: a minute is generous on a loaded machine.
    let start = Instant::now();
    while !server.log().contains("kids b, c (were b)") {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(upgrade(server.addr, &token(&new, "ES256", "c")).0, 101);
}

#[test]
fn a_key_set_that_cannot_be_read_stops_the_start_with_why() {
    require!(Peer::PythonJwt, Peer::Openssl);
    let certs = Certs::generate("jwks-bad");
    let dir = TempDir::new("jwks-bad");
    let set = dir.file("jwks.json");
    std::fs::write(&set, "<html>not a key set</html>").expect("write");
    let provider = JwksServer::start(&certs, &set);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let closed_port = closed.local_addr().expect("addr").port();
    drop(closed);
    let other_ca = certs.new_ca("other");
    let url = provider.url("/jwks");
    for (args, code, says) in [
        (
            vec![url.clone(), "--auth-jwks-ca".into(), certs.ca().into()],
            2,
            "not a JSON Web Key Set",
        ),
        (
            vec![url.clone(), "--auth-jwks-ca".into(), other_ca],
            2,
            "not signed by a trusted CA",
        ),
        (
            vec![format!("http://127.0.0.1:{closed_port}/jwks")],
            2,
            "cannot connect",
        ),
        (
            vec!["http://id.example.com/jwks".into()],
            2,
            "only for a loopback address",
        ),
    ] {
        let out = output_within(
            throng()
                .args(["serve", "--listen", "127.0.0.1:0", "--auth-jwks-url"])
                .args(&args),
            Duration::from_secs(60),
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // A set whose keys are all unusable names each.
    std::fs::write(&set, r#"{"keys":[{"kty":"oct","kid":"h","k":"c2VjcmV0"}]}"#).expect("write");
    let out = output_within(
        throng().args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--auth-jwks-url",
            &url,
            "--auth-jwks-ca",
            certs.ca(),
        ]),
        Duration::from_secs(60),
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("no key this server can verify") && err.contains("kid \"h\""),
        "{err}"
    );
}
