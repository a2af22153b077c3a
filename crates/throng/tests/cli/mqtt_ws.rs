//! MQTT over WebSocket on `throng serve`'s HTTP listener (subprotocol
//! `mqtt`): Python paho-mqtt's websockets transport and Node `mqtt` (what
//! MQTT.js in a browser uses) subscribe and publish at QoS 0, 1 and 2; a
//! packet split over frames and frames holding several packets are read
//! as one stream; a text frame and a first packet that is not CONNECT are
//! answered as MQTT-6.0.0-1 and MQTT-3.1.0-1 say.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use throng_testkit::peers::dir;
use throng_testkit::process::command;
use throng_testkit::{Peer, require};

use crate::serve;

/// The path the clients connect to (any path is served).
const PATH: &str = "/mqtt";

/// `mqtt_peer.<py|mjs> MODE` over WebSocket to `port`.
fn peer(node: bool, mode: &str, port: u16, topic: &str, qos: u8) -> Command {
    let mut c = if node {
        let mut c = command("node");
        c.arg(dir().join("mqtt_peer.mjs")).current_dir(dir());
        c
    } else {
        let mut c = command("python3");
        c.arg(dir().join("mqtt_peer.py"));
        c
    };
    c.args([mode, "127.0.0.1", &port.to_string(), topic]).args([
        "--qos",
        &qos.to_string(),
        "--ws",
        PATH,
    ]);
    c
}

/// A subscriber that said its SUBACK came.
struct Sub {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Sub {
    fn start(node: bool, port: u16, topic: &str, qos: u8, count: usize) -> Self {
        let mut cmd = peer(node, "sub", port, topic, qos);
        cmd.args(["--count", &count.to_string(), "--timeout", "20"]);
        if !node {
            cmd.arg("--lines");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a subscriber");
        let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        while line.trim() != "ready" {
            line.clear();
            let n = out.read_line(&mut line).expect("read a subscriber");
            assert!(n > 0, "a subscriber (node: {node}) ended before its SUBACK");
        }
        Self { child, out }
    }

    /// (payload, qos) of each message, and the QoS its SUBACK granted.
    fn finish(mut self) -> (Vec<(String, u64)>, Value) {
        let mut got = Vec::new();
        let mut last = Value::Null;
        for line in (&mut self.out).lines() {
            let v: Value = serde_json::from_str(&line.expect("a line")).unwrap_or_default();
            if v.get("topic").is_some() {
                got.push((
                    v["payload"].as_str().unwrap_or("").to_owned(),
                    v["qos"].as_u64().unwrap_or(9),
                ));
            } else if v.get("granted").is_some() {
                last = v["granted"].clone();
            }
        }
        let _ = self.child.wait();
        (got, last)
    }
}

/// Publishes `payloads` at `qos`; how many were acknowledged.
fn send(node: bool, port: u16, topic: &str, payloads: &[String], qos: u8) -> u64 {
    let mut child = peer(node, "send", port, topic, qos)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a publisher");
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        for p in payloads {
            writeln!(stdin, "{p}").expect("write a payload");
        }
    }
    let out = child.wait_with_output().expect("wait for a publisher");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "publishing failed: {text}");
    let v: Value = serde_json::from_str(text.lines().last().unwrap_or("")).expect("a summary");
    v["acked"].as_u64().expect("acked")
}

/// Both clients subscribe and publish over WebSocket at each QoS, through
/// two workers: every message reaches every subscriber once, in order, at
/// the QoS asked, and every QoS 1 and 2 publish is acknowledged.
#[test]
fn paho_and_mqtt_js_over_websocket_at_qos_0_1_and_2() {
    require!(Peer::PythonPaho, Peer::NodeMqtt);
    let server = serve(&["--workers", "2"]);
    let port = server.addr.port();
    for qos in 0..=2u8 {
        let topic = format!("ws/q{qos}");
        let subs = [
            Sub::start(false, port, &topic, qos, 4),
            Sub::start(true, port, &topic, qos, 4),
        ];
        let mut want = Vec::new();
        for (i, node) in [false, true].into_iter().enumerate() {
            let payloads: Vec<String> = (0..2).map(|k| format!("q{qos}-{i}-{k}")).collect();
            let acked = send(node, port, &topic, &payloads, qos);
            assert_eq!(
                acked,
                if qos > 0 { 2 } else { 0 },
                "node: {node} at QoS {qos}"
            );
            want.extend(payloads.into_iter().map(|p| (p, u64::from(qos))));
        }
        for sub in subs {
            let (got, granted) = sub.finish();
            let (_, metrics) = throng_testkit::http::get(server.ops, "/metrics");
            assert_eq!(
                granted,
                serde_json::json!([qos]),
                "one SUBACK each\n{}\n{metrics}",
                server.log()
            );
            assert_eq!(got, want, "QoS {qos}\n{}", server.log());
        }
    }
}

/// A masked client frame of `opcode` carrying `payload`.
fn frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mask = [7u8, 1, 9, 3];
    let mut out = vec![opcode | if fin { 0x80 } else { 0 }];
    match payload.len() {
        n @ 0..=125 => out.push(0x80 | n as u8),
        n => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// A raw connection upgraded to MQTT over WebSocket at `path`.
fn upgraded(port: u16, path: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: mqtt\r\n\r\n"
    )
    .expect("write the upgrade");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut byte).expect("read the 101");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.contains("Sec-WebSocket-Protocol: mqtt"), "{head}");
    tcp
}

/// Everything the server sends until it closes.
fn to_the_end(mut tcp: TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let _ = tcp.read_to_end(&mut all);
    all
}

/// A 3.1.1 CONNECT with client id "raw" and no keep-alive.
const CONNECT: &[u8] = &[
    0x10, 15, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 0, 0, 3, b'r', b'a', b'w',
];

#[test]
fn packets_span_frames_and_bad_input_is_answered_per_the_spec() {
    let server = serve(&[]);
    let port = server.addr.port();

    // CONNECT split over a fragment and its continuation, the second frame
    // also holding a PINGREQ: CONNACK, then PINGRESP, each in a binary frame.
    let mut tcp = upgraded(port, "/any/path");
    let mut tail = CONNECT[5..].to_vec();
    tail.extend_from_slice(&[0xC0, 0]);
    tcp.write_all(&frame(2, false, &CONNECT[..5]))
        .expect("write");
    tcp.write_all(&frame(0, true, &tail)).expect("write");
    let mut got = [0u8; 8];
    tcp.read_exact(&mut got).expect("CONNACK and PINGRESP");
    assert_eq!(got, [0x82, 4, 0x20, 2, 0, 0, 0x82, 2], "{got:?}");
    let mut pingresp = [0u8; 2];
    tcp.read_exact(&mut pingresp).expect("PINGRESP");
    assert_eq!(pingresp, [0xD0, 0]);

    // A text frame once connected: close 1003 (MQTT-6.0.0-1).
    tcp.write_all(&frame(1, true, b"hello")).expect("write");
    let rest = to_the_end(tcp);
    assert_eq!(&rest[..4], &[0x88, rest[1], 0x03, 0xEB], "{rest:?}");

    // A text frame first: the same.
    let mut tcp = upgraded(port, "/mqtt");
    tcp.write_all(&frame(1, true, CONNECT)).expect("write");
    let rest = to_the_end(tcp);
    assert_eq!(&rest[2..4], &[0x03, 0xEB], "{rest:?}");

    // A first packet that is not CONNECT: closed without a CONNACK
    // (MQTT-3.1.0-1).
    let mut tcp = upgraded(port, "/mqtt");
    tcp.write_all(&frame(2, true, &[0xC0, 0])).expect("write");
    let rest = to_the_end(tcp);
    assert!(!rest.windows(4).any(|w| w == [0x20, 2, 0, 0]), "{rest:?}");
}

/// A client that sends CONNECT, a PUBLISH and DISCONNECT in one write (a
/// busy client's packets coalesce, as paho's did in a loaded CI run): the
/// connection ends after the message is relayed, over TCP and over
/// WebSocket alike, and no worker dies (one did: the client id was
/// claimed for a connection that had already ended).
#[test]
fn connect_publish_and_disconnect_in_one_write_end_cleanly() {
    let (server, mqtt) = crate::mqtt_listen::mqtt_server(&["--workers", "1"]);
    let port = server.addr.port();
    // Client id "raw", 3.1.1, clean, no keep-alive.
    let mut burst = CONNECT.to_vec();
    burst.extend_from_slice(&[0x30, 9, 0, 3, b'a', b'/', b'b', b'h', b'e', b'y', b'!']);
    burst.extend_from_slice(&[0xE0, 0]);
    for round in 0..3 {
        let mut tcp = TcpStream::connect(mqtt).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        tcp.write_all(&burst).expect("write");
        let got = to_the_end(tcp);
        assert_eq!(&got[..4], &[0x20, 2, 0, 0], "round {round}: {got:?}");

        let mut ws = upgraded(port, "/mqtt");
        ws.write_all(&frame(2, true, &burst)).expect("write");
        let got = to_the_end(ws);
        assert_eq!(&got[..4], &[0x82, 4, 0x20, 2], "round {round}: {got:?}");
    }
    let published = server.wait_metric(
        "throng_mqtt_packets_received_total{type=\"PUBLISH\"}",
        |v| v >= 6.0,
    );
    assert_eq!(published, 6.0);
    let restarts = server.metric("throng_worker_restarts_total");
    assert_eq!(restarts, 0.0, "{}", server.log());
}
