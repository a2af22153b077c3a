//! `serve --takeover` without Redis hands the embedded retained MQTT
//! messages over: set with `mosquitto_pub` (and an HTTP `?retain=1`) on
//! the old serve, each one (its QoS, payload and 5.0 user property, the
//! replaced and cleared ones not) reaches a fresh `mosquitto_sub` of the
//! new serve once the old one is gone.

use std::process::Command;
use std::time::Duration;

use throng_testkit::http::publish;
use throng_testkit::process::{output_within, text};
use throng_testkit::{Peer, Server, require};

use crate::mqtt_listen::mqtt_server;
use crate::takeover::{exits_within, take_over};

/// `mosquitto_pub` of a retained message (MQTT 5.0; `extra`: its QoS,
/// payload, properties) on `port`, then waits until `s` has relayed
/// `n` messages in all, so the next one comes after it.
fn retain(s: &Server, port: u16, topic: &str, extra: &[&str], n: u64) {
    let port = port.to_string();
    let out = output_within(
        Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port, "-V", "mqttv5", "-r"])
            .args(["-t", topic])
            .args(extra),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "mosquitto_pub: {}", text(&out.stderr));
    s.wait_metric("throng_messages_published_total", |v| v >= n as f64);
}

/// A fresh `mosquitto_sub` (MQTT 5.0, QoS 2) of `filter` on `port`: the
/// first `n` messages as `retain qos topic payload user-properties`,
/// sorted (retained messages of several channels come in no set order).
fn first_messages(port: u16, filter: &str, n: usize) -> Vec<String> {
    let (port, n) = (port.to_string(), n.to_string());
    let out = output_within(
        Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port, "-V", "mqttv5", "-q", "2"])
            .args(["-t", filter, "-C", &n, "-W", "30"])
            .args(["-F", "%r %q %t %p %P"]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "mosquitto_sub: {}", text(&out.stderr));
    let mut lines: Vec<String> = text(&out.stdout)
        .lines()
        .map(|l| l.trim().to_owned())
        .collect();
    lines.sort();
    lines
}

#[test]
fn without_redis_the_retained_messages_are_handed_over_to_the_new_serve() {
    require!(Peer::MosquittoClients);
    let (mut old, mqtt) = mqtt_server(&["--workers", "2", "--drain-spread", "1s"]);
    let port = mqtt.port();
    let alpha = [
        "-q",
        "1",
        "-m",
        "alpha",
        "-D",
        "publish",
        "user-property",
        "k",
        "v",
    ];
    retain(&old, port, "t/a", &alpha, 1);
    retain(&old, port, "t/b", &["-q", "0", "-m", "beta"], 2);
    retain(&old, port, "t/b", &["-q", "2", "-m", "beta2"], 3);
    retain(&old, port, "t/c", &["-q", "1", "-m", "gone"], 4);
    retain(&old, port, "t/c", &["-q", "1", "-n"], 5);
    let (status, body) = publish(old.addr, "t/h?retain=1", b"http", None);
    assert_eq!(status, 200, "{body}");
    old.wait_metric("throng_mqtt_retained_topics", |v| v == 3.0);

    let mqtt_listen = mqtt.to_string();
    let new = take_over(&old, &["--mqtt-listen", &mqtt_listen]);
    // Both logs when it does not come: what each side said of the handover.
    let asked = std::time::Instant::now();
    while !new.log().contains("adopted the retained messages of pid") {
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "the new serve did not adopt the retained messages in 60 s\n-- new:\n{}\n-- old:\n{}",
            new.log(),
            old.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        exits_within(&mut old.child, Duration::from_secs(30)),
        "the old serve exits"
    );
    assert!(
        old.log()
            .contains("handed the retained messages over (3 channels"),
        "{}",
        old.log()
    );
    assert!(new.log().contains("3 channels hold one"), "{}", new.log());
    new.wait_metric("throng_mqtt_retained_topics", |v| v == 3.0);
    // Each at the QoS it was published at (HTTP's being 1), with its
    // user property; t/b's replaced one and t/c's cleared one not at all.
    assert_eq!(
        first_messages(port, "t/#", 3),
        ["1 1 t/a alpha k:v", "1 1 t/h http", "1 2 t/b beta2"]
    );
    // The new serve's own retained publish replaces an adopted one.
    retain(&new, port, "t/a", &["-q", "0", "-m", "omega"], 1);
    assert_eq!(first_messages(port, "t/a", 1), ["1 0 t/a omega"]);
}
