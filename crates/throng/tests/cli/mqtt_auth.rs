//! Who gets in on `throng serve --mqtt-listen` when tokens or a publish key
//! guard the server: the token in CONNECT's password field (from an
//! independent library, PyJWT), its grants on SUBSCRIBE, PUBLISH and the
//! will, its expiry, and the per-address limits, with real sockets and
//! three clients: the proto crate's codec (`mqtt_listen`'s client),
//! `throng hold mqtt://` and `mosquitto_sub`.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::json;
use throng_proto::mqtt::{Connect, Delivery, Packet, Properties, QoS, Version, Will};
use throng_testkit::json::count;
use throng_testkit::jwt::Mint;
use throng_testkit::process::{command, output_within, text};
use throng_testkit::{Peer, Server, TempDir, require, wait_until};

use crate::auth::{closed_after, connect_from, unix_now};
use crate::mqtt_listen::{Client, Got, mqtt_server, pair, puback_and_message};
use crate::run_json;

/// The CONNACK codes of a refusal on the wire, 3.1.1 and 5.0: not
/// authorized, and bad user name or password.
const NOT_AUTHORIZED: [u8; 2] = [5, 0x87];
const BAD_PASSWORD: [u8; 2] = [4, 0x86];

fn code(codes: [u8; 2], version: Version) -> u8 {
    codes[usize::from(version == Version::V5)]
}

/// A refused SUBSCRIBE filter's code: 3.1.1 has one failure code.
fn not_granted(version: Version) -> u8 {
    if version == Version::V5 { 0x87 } else { 0x80 }
}

fn at_least_once(id: u16) -> Delivery {
    Delivery::AtLeastOnce(id.try_into().expect("not 0"))
}

/// CONNECT with `password` (and a user name beside it, which 3.1.1
/// requires and the server does not read) and a will on `will`.
fn connect_packet<'a>(password: Option<&'a str>, will: Option<&'a str>) -> Packet<'a> {
    Packet::Connect(Connect {
        clean_start: true,
        keep_alive: 60,
        properties: Properties::EMPTY,
        client_id: "",
        will: will.map(|topic| Will {
            qos: QoS::AtMostOnce,
            retain: false,
            properties: Properties::EMPTY,
            topic,
            payload: b"gone",
        }),
        username: password.map(|_| "anyone"),
        password: password.map(str::as_bytes),
    })
}

/// Sends [`connect_packet`] over `s`; the CONNACK is the first [`Client::next`].
fn open_over(s: TcpStream, version: Version, password: Option<&str>, will: Option<&str>) -> Client {
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("read timeout");
    let mut c = Client::over(s, version);
    c.send(&connect_packet(password, will));
    c
}

/// Sends [`connect_packet`] and reads what comes back to the server's
/// close: a CONNACK refusing it, whose code it returns as sent (byte 3 in
/// both versions: 3.1.1's return code, 5.0's reason code).
fn refused(addr: SocketAddr, version: Version, password: Option<&str>, will: Option<&str>) -> u8 {
    let mut s = TcpStream::connect(addr).expect("connect to the MQTT listener");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("read timeout");
    let mut out = Vec::new();
    connect_packet(password, will)
        .encode(version, &mut out)
        .expect("encode");
    s.write_all(&out).expect("send CONNECT");
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("the server closes after its CONNACK");
    assert!(got.len() >= 4 && got[0] == 0x20, "not a CONNACK: {got:?}");
    assert_eq!(
        usize::from(got[1]) + 2,
        got.len(),
        "one CONNACK, then the close"
    );
    assert_ne!(got[3], 0, "refused");
    got[3]
}

fn open(addr: SocketAddr, version: Version, password: Option<&str>, will: Option<&str>) -> Client {
    open_over(
        TcpStream::connect(addr).expect("connect to the MQTT listener"),
        version,
        password,
        will,
    )
}

/// The CONNACK's code.
fn connack(c: &mut Client) -> u8 {
    match c.next() {
        Some(Got::Connack { code, .. }) => code,
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

/// Connected with `password`: CONNACK success checked.
pub(crate) fn connected(addr: SocketAddr, version: Version, password: Option<&str>) -> Client {
    let mut c = open(addr, version, password, None);
    assert_eq!(connack(&mut c), 0, "{version:?} with {password:?}");
    c
}

/// An MQTT listener on a server whose tokens are checked with `mint`'s
/// HS256 secret.
pub(crate) fn guarded(mint: &Mint, extra: &[&str]) -> (Server, SocketAddr) {
    let secret = mint.key("hs256.key");
    let mut args = vec!["--auth-hs256-secret-file", &secret];
    args.extend_from_slice(extra);
    mqtt_server(&args)
}

#[test]
fn connect_takes_a_token_in_the_password_and_refuses_a_bad_or_missing_one() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let rsa = format!("rsa={}", mint.key("rsa.pub.pem"));
    let (s, mqtt) = guarded(&mint, &["--workers", "2", "--auth-public-key", &rsa]);
    let tokens = mint.tokens(&[
        json!({"alg": "HS256", "claims": {
            "exp_in": 300,
            "channels": ["news", "sensors/#"],
            "publish": ["news", "sport", "sensors/+/temp"],
        }}),
        json!({"alg": "HS256-wrong", "claims": {"exp_in": 300, "channels": ["*"]}}),
        json!({"alg": "HS256", "claims": {"exp_in": -30, "channels": ["*"]}}),
        json!({"alg": "HS256-rsa-pub", "claims": {"exp_in": 300, "channels": ["*"]}}),
        json!({"alg": "RS256", "claims": {"exp_in": 300, "channels": ["news"]}}),
    ]);
    let [good, forged, expired, confused, rs256] = [0, 1, 2, 3, 4].map(|i| tokens[i].as_str());
    let mut by_rsa = connected(mqtt, Version::V5, Some(rs256));
    assert_eq!(by_rsa.subscribe(1, &["news", "sport"]), [0, 0x87]);
    for version in [Version::V311, Version::V5] {
        for (what, password, codes) in [
            ("no password", None, NOT_AUTHORIZED),
            ("another secret", Some(forged), BAD_PASSWORD),
            (
                "HS256 keyed with the RSA public key",
                Some(confused),
                BAD_PASSWORD,
            ),
            ("expired", Some(expired), BAD_PASSWORD),
            ("not a token", Some("not.a-token"), BAD_PASSWORD),
        ] {
            let got = refused(mqtt, version, password, None);
            assert_eq!(got, code(codes, version), "{version:?}: {what}");
        }
        let mut sub = connected(mqtt, version, Some(good));
        let no = not_granted(version);
        assert_eq!(
            sub.subscribe(1, &["news", "sport", "sensors/+/temp", "#", "sensors/#"]),
            [0, no, 0, no, 0],
            "{version:?}: an exact filter its grant allows, a wildcard one a grant covers"
        );
        let mut p = connected(mqtt, Version::V5, Some(good));
        for (id, topic) in [(1, "sport"), (2, "news"), (3, "sensors/7/temp")] {
            p.publish(topic, topic.as_bytes(), at_least_once(id));
            assert_eq!(p.next(), Some(Got::Puback(id, 0)), "{topic}");
        }
        // Not "sport": its filter was refused. "sensors/7/temp" once,
        // though two of its filters match.
        assert_eq!(sub.message(), pair("news", "news"));
        assert_eq!(by_rsa.message(), pair("news", "news"));
        assert_eq!(sub.message(), pair("sensors/7/temp", "sensors/7/temp"));
        sub.quiet(Duration::from_millis(300));
    }
    for (reason, n) in [
        ("token_missing", 2.0),
        ("token_signature", 4.0),
        ("token_expired", 2.0),
        ("token_malformed", 2.0),
    ] {
        s.wait_metric(
            &format!("throng_refused_total{{reason=\"{reason}\"}}"),
            |v| v == n,
        );
    }
    s.wait_metric(
        "throng_mqtt_refused_total{kind=\"subscribe_not_granted\"}",
        |v| v == 5.0,
    );
}

#[test]
fn publish_and_the_will_follow_the_publish_grant() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let (s, mqtt) = guarded(&mint, &["--workers", "2"]);
    let token = mint.token(json!({"alg": "HS256", "claims": {
        "exp_in": 300, "channels": ["#"], "publish": ["up/+"],
    }}));
    let token = token.as_str();
    let mut watcher = connected(mqtt, Version::V311, Some(token));
    assert_eq!(watcher.subscribe(1, &["#"]), [0]);

    let mut v5 = connected(mqtt, Version::V5, Some(token));
    v5.publish("up/1", b"1", at_least_once(1));
    assert_eq!(v5.next(), Some(Got::Puback(1, 0)));
    v5.publish("down", b"x", at_least_once(2));
    assert_eq!(v5.next(), Some(Got::Puback(2, 0x87)), "not authorized");
    v5.publish("down", b"x", Delivery::AtMostOnce);
    v5.publish("up/2", b"2", Delivery::AtMostOnce);
    assert_eq!(watcher.message(), pair("up/1", "1"));
    assert_eq!(watcher.message(), pair("up/2", "2"));

    // 3.1.1's PUBACK has no reason code: the refused message is acknowledged
    // (or the client would send it again) and dropped.
    let mut v3 = connected(mqtt, Version::V311, Some(token));
    v3.publish("down", b"x", at_least_once(3));
    assert_eq!(v3.next(), Some(Got::Puback(3, 0)));
    v3.publish("down", b"x", Delivery::AtMostOnce);
    v3.publish("up/3", b"3", Delivery::AtMostOnce);
    assert_eq!(watcher.message(), pair("up/3", "3"));
    watcher.quiet(Duration::from_millis(300));
    s.wait_metric(
        "throng_mqtt_refused_total{kind=\"publish_not_granted\"}",
        |v| v == 4.0,
    );

    // A will is a publish: refused with the CONNECT where the token may not
    // publish it, published when its client is lost where it may.
    for version in [Version::V311, Version::V5] {
        let got = refused(mqtt, version, Some(token), Some("down"));
        assert_eq!(got, code(NOT_AUTHORIZED, version), "{version:?}");
    }
    s.wait_metric(
        "throng_mqtt_refused_total{kind=\"will_not_granted\"}",
        |v| v == 2.0,
    );
    let mut willing = open(mqtt, Version::V5, Some(token), Some("up/will"));
    assert_eq!(connack(&mut willing), 0);
    drop(willing);
    assert_eq!(watcher.message(), pair("up/will", "gone"));
}

#[test]
fn the_publish_key_publishes_anywhere_and_subscribes_only_where_anyone_may() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let dir = TempDir::new("mqtt-publish-key");
    let key = "an-mqtt-publish-key-of-some-length";
    std::fs::write(dir.file("key"), format!("{key}\n")).expect("write the key");
    let wrong = format!("{key}x");

    // The key alone: anyone subscribes, only the key publishes, and a
    // wrong key is refused at CONNECT.
    let (s, mqtt) = mqtt_server(&["--publish-key-file", &dir.arg("key")]);
    let mut sub = connected(mqtt, Version::V311, None);
    assert_eq!(sub.subscribe(1, &["#"]), [0]);
    let mut anyone = connected(mqtt, Version::V5, None);
    anyone.publish("news", b"x", at_least_once(1));
    assert_eq!(anyone.next(), Some(Got::Puback(1, 0x87)));
    for version in [Version::V311, Version::V5] {
        let got = refused(mqtt, version, Some(wrong.as_str()), None);
        assert_eq!(got, code(BAD_PASSWORD, version), "{version:?}");
    }
    let mut keyed = connected(mqtt, Version::V5, Some(key));
    keyed.publish("news", b"keyed", at_least_once(2));
    assert_eq!(keyed.next(), Some(Got::Puback(2, 0)));
    assert_eq!(sub.message(), pair("news", "keyed"));
    s.wait_metric("throng_refused_total{reason=\"publish_key\"}", |v| v == 2.0);

    // With tokens too: the key publishes but does not subscribe, and no
    // password gets no connection.
    let (_t, mqtt) = guarded(&mint, &["--publish-key-file", &dir.arg("key")]);
    let got = refused(mqtt, Version::V311, None, None);
    assert_eq!(got, code(NOT_AUTHORIZED, Version::V311));
    let mut keyed = connected(mqtt, Version::V311, Some(key));
    assert_eq!(keyed.subscribe(1, &["news", "#"]), [0x80, 0x80]);
    keyed.publish("news", b"x", at_least_once(3));
    assert_eq!(keyed.next(), Some(Got::Puback(3, 0)));
}

#[test]
fn an_expired_token_closes_its_connection_5_0_with_0x87_and_another_keeps_going() {
    require!(Peer::PythonJwt);
    let mint = Mint::new();
    let (s, mqtt) = guarded(&mint, &["--workers", "1", "--ping-interval", "1s"]);
    let short_exp = unix_now().ceil() + 3.0;
    let tokens = mint.tokens(&[
        json!({"alg": "HS256", "claims": {"exp": short_exp, "channels": ["news"]}}),
        json!({"alg": "HS256", "claims": {
            "exp_in": 300, "channels": ["news"], "publish": ["news"],
        }}),
    ]);
    let [short, long] = [0, 1].map(|i| tokens[i].as_str());
    let mut v5 = connected(mqtt, Version::V5, Some(short));
    let mut v3 = connected(mqtt, Version::V311, Some(short));
    let mut kept = connected(mqtt, Version::V5, Some(long));
    for c in [&mut v5, &mut v3, &mut kept] {
        assert_eq!(c.subscribe(1, &["news"]), [0]);
    }
    assert_eq!(v5.next(), Some(Got::Disconnect(0x87)), "not authorized");
    assert_eq!(v5.next(), None, "closed after the DISCONNECT");
    assert_eq!(v3.next(), None, "3.1.1 has no word for it: closed");
    closed_after(short_exp);
    s.wait_metric(
        "throng_connections_closed_total{reason=\"token_expired\"}",
        |v| v == 2.0,
    );
    kept.publish("news", b"after", at_least_once(2));
    assert_eq!(puback_and_message(&mut kept), pair("news", "after"));
}

#[test]
fn throng_hold_and_mosquitto_sub_carry_the_token_as_their_password() {
    require!(Peer::PythonJwt, Peer::MosquittoClients);
    let mint = Mint::new();
    let (s, mqtt) = guarded(&mint, &["--workers", "2"]);
    let tokens = mint.tokens(&[
        json!({"alg": "HS256", "claims": {
            "exp_in": 300, "channels": ["news"], "publish": ["news"],
        }}),
        json!({"alg": "HS256-wrong", "claims": {"exp_in": 300, "channels": ["news"]}}),
    ]);
    let [good, forged] = [0, 1].map(|i| tokens[i].as_str());
    let url = format!("mqtt://{mqtt}/news");
    let (code, summary, stderr) = run_json(
        "hold",
        &[
            &url,
            "-c",
            "20",
            "--username",
            "throng",
            "--password",
            good,
            "--publish",
            &url,
            "--publish-rate",
            "20/s",
            "--messages",
            "5",
        ],
    );
    assert_eq!(code, 0, "{stderr}\n{}", s.log());
    assert_eq!(count(&summary, &["opened"]), 20, "{summary:#}");
    assert_eq!(count(&summary, &["received"]), 100, "{summary:#}");
    assert_eq!(count(&summary, &["lost"]), 0, "{summary:#}");
    let (code, summary, stderr) = run_json(
        "hold",
        &[
            &url,
            "-c",
            "5",
            "--mqtt-version",
            "5",
            "--username",
            "throng",
            "--password",
            forged,
            "--duration",
            "1s",
        ],
    );
    assert_eq!(code, 1, "{summary:#}\n{stderr}");
    assert_eq!(count(&summary, &["failed", "bad_status"]), 5, "{summary:#}");
    assert!(stderr.contains("CONNACK refused"), "{stderr}");

    let port = mqtt.port().to_string();
    let sub = |password: &str| {
        let mut c = command("stdbuf");
        c.args(["-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", &port])
            .args(["-t", "news", "-C", "1", "-W", "20", "-d"])
            .args(["-u", "anyone", "-P", password]);
        c
    };
    let out = output_within(&mut sub(forged), Duration::from_secs(30));
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let said = text(&out.stderr).to_lowercase();
    assert!(
        said.contains("bad user") || said.contains("username"),
        "mosquitto_sub: {said}"
    );
    let mut child = sub(good)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start mosquitto_sub");
    // -d prints the packets it receives: publish once its SUBACK came.
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let mut said = Vec::new();
    while !said.last().is_some_and(|l: &String| l.contains("SUBACK")) {
        match lines.next() {
            Some(Ok(line)) => said.push(line),
            _ => panic!("mosquitto_sub ended before its SUBACK: {said:?}"),
        }
    }
    let mut p = connected(mqtt, Version::V5, Some(good));
    p.publish("news", b"for mosquitto_sub", at_least_once(1));
    assert_eq!(p.next(), Some(Got::Puback(1, 0)));
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        rest.iter().any(|l| l == "for mosquitto_sub"),
        "mosquitto_sub printed {rest:?}"
    );
    let status = child.wait().expect("mosquitto_sub's end");
    assert!(status.success(), "{status}");
}

/// Connects from `from` and says whether CONNACK came (a refused address
/// is closed with no word: MQTT has none before CONNECT).
fn admitted_from(addr: SocketAddr, from: Ipv4Addr) -> Option<Client> {
    let mut c = open_over(connect_from(addr, from), Version::V5, None, None);
    match c.next() {
        Some(Got::Connack { code: 0, .. }) => Some(c),
        None => None,
        other => panic!("from {from}: {other:?}"),
    }
}

#[test]
fn per_address_limits_count_mqtt_connections_as_websocket_ones() {
    let (s, mqtt) = mqtt_server(&["--workers", "2", "--max-connections-per-ip", "2"]);
    let [a, b] = [Ipv4Addr::new(127, 0, 0, 12), Ipv4Addr::new(127, 0, 0, 13)];
    let mut held: Vec<Client> = (0..2)
        .map(|i| admitted_from(mqtt, a).unwrap_or_else(|| panic!("{a}'s connection {i}")))
        .collect();
    assert!(admitted_from(mqtt, a).is_none(), "a third from {a}");
    let others: Vec<Client> = (0..2)
        .map(|_| admitted_from(mqtt, b).expect("another address has its own"))
        .collect();
    s.wait_metric("throng_refused_total{reason=\"per_ip_connections\"}", |v| {
        v == 1.0
    });
    // One of a's leaves: a may come back.
    drop(held.pop());
    wait_until("a's place to come back", || {
        admitted_from(mqtt, a).is_some()
    });
    drop(others);

    let (s, mqtt) = mqtt_server(&[
        "--workers",
        "2",
        "--handshakes-per-ip",
        "1/s",
        "--handshake-burst",
        "2",
    ]);
    let [c, d] = [Ipv4Addr::new(127, 0, 0, 14), Ipv4Addr::new(127, 0, 0, 15)];
    let burst: Vec<Client> = (0..2)
        .map(|_| admitted_from(mqtt, c).expect("within the burst"))
        .collect();
    assert!(admitted_from(mqtt, c).is_none(), "past the burst from {c}");
    assert!(admitted_from(mqtt, d).is_some(), "another address");
    s.wait_metric("throng_refused_total{reason=\"per_ip_rate\"}", |v| v >= 1.0);
    drop(burst);
}

#[test]
fn serve_help_says_where_an_mqtt_client_puts_its_token() {
    let out = crate::throng().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("is CONNECT's password"), "{help}");
    assert!(help.contains("DISCONNECT 0x87"), "{help}");
}
