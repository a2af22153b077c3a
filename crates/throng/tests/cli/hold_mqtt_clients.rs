//! `throng hold mqtt://` as an MQTT stress tool: many publishing clients
//! (`--publishers`, a topic per client with `%i`, `--publish-interval`)
//! beside the held subscribers, and persistent-session clients
//! (`--mqtt-sessions`) that go away and return, the messages published
//! while they were away measured on their return. Against Mosquitto and
//! against `throng serve --mqtt-listen`, both real brokers on real sockets.

use serde_json::Value;
use throng_testkit::json::count;
use throng_testkit::mosquitto::Mosquitto;
use throng_testkit::{Peer, TempDir, require};

use crate::mqtt_listen::mqtt_server;
use crate::run_json;

/// Subscribers held in each run.
const HELD: u64 = 40;

/// Runs `hold` on `sub_url` with `publishers` clients publishing to
/// `pub_url` at `qos` in `version`, and 8 persistent-session clients online
/// 600 ms then away 400 ms, for 4 s; the summary and the result file.
fn stress(
    sub_url: &str,
    pub_url: &str,
    publishers: &str,
    qos: &str,
    version: &str,
) -> (Value, String) {
    let dir = TempDir::new("hold-mqtt-clients");
    let output = dir.file("run.jsonl");
    let (code, s, stderr) = run_json(
        "hold",
        &[
            sub_url,
            "-c",
            &HELD.to_string(),
            "-w",
            "1",
            "--qos",
            qos,
            "--mqtt-version",
            version,
            "--publish",
            pub_url,
            "--publishers",
            publishers,
            "--publish-interval",
            "100ms",
            "--duration",
            "4s",
            "--mqtt-sessions",
            "8",
            "--mqtt-session-online",
            "600ms",
            "--mqtt-session-away",
            "400ms",
            "--output",
            output.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "hold failed: {stderr}\n{s:#}");
    (s, std::fs::read_to_string(&output).unwrap())
}

/// What every run must show: each subscriber got every message of every
/// publishing client, and every session client was given back, on each
/// return, the session and every message published while it was away.
fn check(s: &Value, file: &str) {
    let published = count(s, &["published"]);
    assert!(published > 0, "{s:#}");
    assert_eq!(count(s, &["publish_answered"]), published, "{s:#}");
    assert_eq!(count(s, &["received"]), published * HELD, "{s:#}");
    assert_eq!(count(s, &["lost"]), 0, "{s:#}");
    assert_eq!(count(s, &["duplicated"]), 0, "{s:#}");
    let q = &s["sessions"];
    assert_eq!(count(q, &["clients"]), 8, "{q:#}");
    let returns = count(q, &["returns"]);
    assert!(returns >= 8, "every client went away at least once: {q:#}");
    assert_eq!(count(q, &["present"]), returns, "{q:#}");
    assert_eq!(count(q, &["discarded"]), 0, "{q:#}");
    assert_eq!(count(q, &["lost"]), 0, "{q:#}");
    assert_eq!(count(q, &["duplicated"]), 0, "{q:#}");
    assert_eq!(q["errors"], serde_json::json!({}), "{q:#}");
    // Each session client is owed every message: the ones it got online,
    // and the ones kept while it was away.
    assert_eq!(count(q, &["received"]), published * 8, "{q:#}");
    let (owed, resumed) = (count(q, &["owed"]), count(q, &["resumed"]));
    assert!(
        owed > 0,
        "messages were published while clients were away: {q:#}"
    );
    // Each message owed on a return came once, whichever client published it.
    assert_eq!(resumed, owed, "{q:#}");
    assert_eq!(count(q, &["resume_us", "count"]), resumed, "{q:#}");
    // The result file has them per interval, and the plan in its header.
    let resumed_in_file: u64 = file
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|iv| iv["counters"]["session.resumed"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(resumed_in_file, resumed, "{file}");
    let header = file.lines().next().unwrap_or("");
    assert!(header.contains(r#""sessions":{"#), "{header}");
}

/// Mosquitto, 3.1.1 at QoS 1: five publishing clients, one topic each,
/// under the subscribers' wildcard filter.
#[test]
fn mosquitto_takes_many_publishers_and_keeps_sessions_at_qos_1() {
    require!(Peer::Mosquitto);
    let broker = Mosquitto::start();
    let (s, file) = stress(
        &broker.url("fleet/+/temp"),
        &broker.url("fleet/%i/temp"),
        "5",
        "1",
        "3.1.1",
    );
    check(&s, &file);
    assert_eq!(count(&s, &["publishers"]), 5, "{s:#}");
}

/// throng serve, 5.0 at QoS 2 (Clean Start 0, Session Expiry Interval),
/// one publishing client.
#[test]
fn throng_serve_keeps_sessions_at_qos_2_over_5_0() {
    let (_server, addr) = mqtt_server(&[]);
    let (s, file) = stress(
        &format!("mqtt://{addr}/fleet/+/temp"),
        &format!("mqtt://{addr}/fleet/%i/temp"),
        "1",
        "2",
        "5",
    );
    check(&s, &file);
}

/// throng serve, 3.1.1 at QoS 1 (clean session 0), several publishers.
#[test]
fn throng_serve_keeps_sessions_at_qos_1_over_3_1_1() {
    let (_server, addr) = mqtt_server(&[]);
    let (s, file) = stress(
        &format!("mqtt://{addr}/fleet/#"),
        &format!("mqtt://{addr}/fleet/%i"),
        "3",
        "1",
        "3.1.1",
    );
    check(&s, &file);
}

/// What cannot be measured is refused before anything starts, saying why.
#[test]
fn publishers_and_sessions_that_cannot_be_measured_are_refused() {
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "mqtt://127.0.0.1:1/fleet/1/temp",
                "--publish",
                "mqtt://127.0.0.1:1/fleet/%i/temp",
                "--publishers",
                "2",
            ],
            "publishing client 2 publishes to 'fleet/2/temp', which the subscribers' filter",
        ),
        (
            &["mqtt://127.0.0.1:1/fleet/#", "--mqtt-sessions", "3"],
            "needs --qos 1 or 2",
        ),
        (
            &["ws://127.0.0.1:1/c", "--mqtt-sessions", "3"],
            "needs an mqtt:// URL",
        ),
        (
            &[
                "mqtt://127.0.0.1:1/f",
                "--mqtt-sessions",
                "3",
                "--qos",
                "1",
                "--mqtt-version",
                "5",
                "--mqtt-session-expiry",
                "1s",
            ],
            "must outlast --mqtt-session-away",
        ),
    ];
    for (args, want) in cases {
        let (code, _, stderr) = run_json("hold", args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
