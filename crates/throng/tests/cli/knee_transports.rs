//! `throng knee hold` with subscribers other than WebSocket: Server-Sent
//! Events against `throng serve`, MQTT against Mosquitto with the level's
//! messages published over MQTT too. Each target holds a few hundred
//! connections without effort, so every level passes and what is judged is
//! that every connection was opened and reached.

use serde_json::Value;
use throng_testkit::mosquitto::Mosquitto;
use throng_testkit::{Peer, TempDir, require};

use crate::knee::{QUICK, Searched, knee};
use crate::serve;

/// Every level of `s` passed, opened all its connections and delivered at
/// least 3 messages to each.
fn every_level_reached_every_connection(s: &Searched, levels: &[f64]) {
    assert_eq!(s.code, 1, "{}\n{}", s.stdout, s.stderr);
    assert_eq!(s.knee["outcome"]["kind"], "no_knee", "{}", s.stdout);
    let runs = s.knee["runs"].as_array().cloned().unwrap_or_default();
    let got: Vec<f64> = runs.iter().filter_map(|r| r["level"].as_f64()).collect();
    assert_eq!(got, levels, "{}\n{}", s.stdout, s.stderr);
    for r in &runs {
        assert_eq!(r["verdict"], "pass", "{r}");
        assert_eq!(r["achieved"], r["level"], "{r}");
        assert_eq!(r["lost"], 0, "{r}");
        let connections = r["level"].as_f64().unwrap_or(0.0) as u64;
        let deliveries = r["delivery_us"]["count"].as_u64().unwrap_or(0);
        assert!(
            connections > 0 && deliveries >= 3 * connections,
            "{deliveries} deliveries to {connections} connections: {r}"
        );
    }
}

/// A hold search of `url` from 100 to 200 connections, 5 messages a second.
fn search(dir: &TempDir, url: &str, extra: &[&str]) -> Searched {
    knee(
        dir,
        &[
            &["hold", url, "--from", "100", "--to", "200"][..],
            &["--publish-rate", "5/s", "--step-duration", "2s"],
            &["--slo-p99", "2s"],
            extra,
            &QUICK,
        ]
        .concat(),
    )
}

#[test]
fn sse_subscribers_are_held_and_reached_at_every_level() {
    let server = serve(&["--workers", "1"]);
    let dir = TempDir::new("knee-sse");
    let s = search(&dir, &format!("sse://{}/room", server.addr), &[]);
    every_level_reached_every_connection(&s, &[100.0, 200.0]);
}

/// MQTT subscribers at QoS 1, the level's messages published to the
/// broker over MQTT (the default publish endpoint of an mqtt:// target)
/// (up to 4 connections, each with a client id of its own).
#[test]
fn mqtt_subscribers_get_messages_published_over_mqtt_at_every_level() {
    require!(Peer::Mosquitto);
    let broker = Mosquitto::start();
    let dir = TempDir::new("knee-mqtt");
    let s = search(
        &dir,
        &broker.url("room"),
        &["--qos", "1", "--publish-connections", "4"],
    );
    every_level_reached_every_connection(&s, &[100.0, 200.0]);
}

#[test]
fn an_mqtt_filter_with_wildcards_needs_a_publish_topic() {
    let dir = TempDir::new("knee-mqtt-bad");
    let s = knee(&dir, &["hold", "mqtt://127.0.0.1:9/a/+", "--to", "10"]);
    assert_eq!(s.code, 2, "{}", s.stderr);
    assert!(
        s.stderr.contains("wildcards") && s.stderr.contains("--publish mqtt://"),
        "{}",
        s.stderr
    );
    let s = knee(&dir, &["hold", "ws://127.0.0.1:9/a", "--qos", "1"]);
    assert_eq!(s.code, 2, "{}", s.stderr);
    assert!(s.stderr.contains("are for mqtt://"), "{}", s.stderr);
    assert!(matches!(s.knee, Value::Null));
}
