//! `throng hold mqtt://...` and `--publish mqtt://...` against a broker that
//! is not ours (Mosquitto), beside a client that is not ours (paho-mqtt):
//! every message to every subscriber, at QoS 0 and 1, 3.1.1 and 5.0, plain
//! and TLS; keep-alive kept up; a broker's refusal counted by kind.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Stdio};

use serde_json::Value;
use throng_testkit::certs::Certs;
use throng_testkit::json::count;
use throng_testkit::mosquitto::Mosquitto;
use throng_testkit::peers::dir;
use throng_testkit::process::command;
use throng_testkit::{Peer, TempDir, require};

use crate::run_json;

/// Runs `throng hold --json -q` with `args`: the summary, the exit code, stderr.
fn hold(args: &[&str]) -> (Value, i32, String) {
    let (code, summary, stderr) = run_json("hold", args);
    (summary, code, stderr)
}

/// `tests/peers/mqtt_peer.py sub` on `port`, once it has its SUBACK.
fn paho_subscriber(port: u16, filter: &str, qos: &str, count: u64, extra: &[&str]) -> Child {
    let mut child = command("python3")
        .arg(dir().join("mqtt_peer.py"))
        .args(["sub", "127.0.0.1", &port.to_string(), filter, "--qos", qos])
        .args(["--count", &count.to_string(), "--timeout", "60"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start mqtt_peer.py");
    let mut line = String::new();
    let out = child.stdout.as_mut().expect("piped stdout");
    BufReader::new(out).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "ready", "paho subscriber: {line}");
    child
}

/// What the paho subscriber printed at its end.
fn paho_result(child: Child) -> Value {
    let out = child.wait_with_output().expect("wait for mqtt_peer.py");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or("")).expect("paho's JSON line")
}

/// The acceptance case: 2,000 subscribers on a wildcard filter at QoS 1,
/// two workers, messages published over MQTT at a rate; every subscriber
/// gets every message, once, in order, and so does paho beside them.
#[test]
fn mosquitto_delivers_every_message_to_every_held_subscriber_at_qos_1() {
    require!(Peer::Mosquitto, Peer::PythonPaho);
    let broker = Mosquitto::start();
    let messages = 30;
    let paho = paho_subscriber(broker.port, "sensors/#", "1", messages, &[]);
    let dir = TempDir::new("mqtt");
    let output = dir.file("mqtt.jsonl");
    let (s, code, stderr) = hold(&[
        &broker.url("sensors/+/temp"),
        "-c",
        "2000",
        "--rate",
        "2000/s",
        "-w",
        "2",
        "--qos",
        "1",
        "--publish",
        &broker.url("sensors/7/temp"),
        "--publish-rate",
        "10/s",
        "--messages",
        &messages.to_string(),
        "--output",
        output.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "hold failed: {stderr}\n{}", broker.log());
    assert_eq!(count(&s, &["opened"]), 2000, "{s:#}");
    assert_eq!(s["failed"], serde_json::json!({}), "{s:#}");
    assert_eq!(count(&s, &["published"]), messages, "{s:#}");
    assert_eq!(count(&s, &["received"]), messages * 2000, "{s:#}");
    assert_eq!(count(&s, &["lost"]), 0, "{s:#}");
    assert_eq!(count(&s, &["duplicated"]), 0, "{s:#}");
    assert_eq!(count(&s, &["out_of_order"]), 0, "{s:#}");
    assert_eq!(count(&s, &["closed", "clean"]), 2000, "{s:#}");
    // Our publisher, read by a client that is not ours.
    let p = paho_result(paho);
    assert_eq!(p["received"], messages, "{p}");
    assert_eq!(p["in_order"], true, "{p}");

    // The result file has the MQTT options in its header, and the
    // subscribe round trips as connect.upgrade.
    let text = std::fs::read_to_string(&output).unwrap();
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let run = header.to_string();
    assert!(
        run.contains(r#""qos":1"#) && run.contains(r#""level":4"#),
        "{run}"
    );
    assert!(count(&s, &["connect_upgrade_us", "count"]) == 2000, "{s:#}");
}

/// 5.0 over TLS at QoS 0; the publisher is paho, so the subscribers are
/// checked against a publisher that is not ours.
#[test]
fn mqtts_v5_subscribers_get_what_paho_publishes() {
    require!(Peer::Mosquitto, Peer::PythonPaho, Peer::Openssl);
    let certs = Certs::generate("mqtts");
    let broker = Mosquitto::start_tls(certs);
    let ca = broker.certs().ca().to_owned();
    let url = broker.url("alerts");
    let port = broker.port.to_string();
    let publisher = std::thread::spawn(move || {
        // Once the subscribers are in (300 at 1000/s: well under a second).
        std::thread::sleep(std::time::Duration::from_secs(3));
        command("python3")
            .arg(dir().join("mqtt_peer.py"))
            .args(["pub", "localhost", &port, "alerts", "--qos", "0"])
            .args(["--count", "10", "--rate", "20", "--cafile", &ca, "--v5"])
            .output()
            .expect("run mqtt_peer.py pub")
    });
    let (s, code, stderr) = hold(&[
        &url,
        "-c",
        "300",
        "--rate",
        "1000/s",
        "--mqtt-version",
        "5",
        "--tls-ca",
        broker.certs().ca(),
        "--duration",
        "5s",
    ]);
    let published = publisher.join().unwrap();
    assert!(published.status.success(), "{published:?}");
    assert_eq!(code, 0, "hold failed: {stderr}\n{}", broker.log());
    assert_eq!(count(&s, &["opened"]), 300, "{s:#}");
    assert_eq!(count(&s, &["connect_tls_us", "count"]), 300, "{s:#}");
    assert_eq!(count(&s, &["received"]), 10 * 300, "{s:#}");
    assert_eq!(count(&s, &["out_of_order"]), 0, "{s:#}");
    assert_eq!(count(&s, &["closed", "clean"]), 300, "{s:#}");
}

/// With a 2 s keep-alive, a subscriber that never sent PINGREQ would be
/// dropped by the broker after 3 s; held for 6 s, every one stays and
/// closes cleanly.
#[test]
fn keep_alive_holds_subscribers_past_the_brokers_limit() {
    require!(Peer::Mosquitto);
    let broker = Mosquitto::start();
    let (s, code, stderr) = hold(&[
        &broker.url("quiet"),
        "-c",
        "200",
        "--mqtt-keepalive",
        "2s",
        "--duration",
        "6s",
    ]);
    assert_eq!(code, 0, "hold failed: {stderr}\n{}", broker.log());
    assert_eq!(count(&s, &["opened"]), 200, "{s:#}");
    assert_eq!(s["closed"], serde_json::json!({"clean": 200}), "{s:#}");
}

/// A broker that refuses the CONNECT: each connection is counted as a
/// refusal (`bad_status`), the first said with its reason, and the run fails.
#[test]
fn a_refused_connect_is_counted_and_fails_the_run() {
    require!(Peer::Mosquitto);
    let broker = Mosquitto::start_with("allow_anonymous false\n");
    let (s, code, stderr) = hold(&[&broker.url("t"), "-c", "50", "--duration", "1s"]);
    assert_eq!(code, 1, "{s:#}\n{stderr}");
    assert_eq!(count(&s, &["failed", "bad_status"]), 50, "{s:#}");
    assert!(stderr.contains("CONNACK refused"), "{stderr}");
}

/// MQTT options with no MQTT URL, and URLs that are not MQTT, are refused
/// before anything starts, saying what to do.
#[test]
fn mqtt_options_and_urls_are_checked_first() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["ws://127.0.0.1:1/c", "--qos", "1"],
            "are for mqtt:// or mqtts:// URLs",
        ),
        (&["mqtt://127.0.0.1:1/"], "no topic in the path"),
        (&["mqtt://127.0.0.1:1/a/#/b"], "not an MQTT topic filter"),
        (
            &[
                "mqtt://127.0.0.1:1/a",
                "--publish",
                "mqtt://127.0.0.1:1/a/+",
            ],
            "not an MQTT topic name",
        ),
    ];
    for (args, want) in cases {
        let (_, code, stderr) = hold(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
