//! `throng serve --mqtt-listen` against MQTT clients that are not ours:
//! Python paho-mqtt, `mosquitto_sub`/`mosquitto_pub` and Node `mqtt`.
//! Every message reaches every subscriber once and in order, MQTT and
//! WebSocket subscribers of one channel alike; wildcards, retained messages
//! and QoS 1 behave as the MQTT specification says; `throng hold mqtt://`
//! gets every message from throng as from Mosquitto.
//!
//! The rules about wildcards, retained messages and QoS run against
//! Mosquitto first, then against throng: the expectations written here are
//! the specification's, and the reference broker shows they are read right.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdout, Command, Stdio};

use serde_json::Value;
use throng_testkit::Server;
use throng_testkit::http::publish_ok;
use throng_testkit::json::count;
use throng_testkit::mosquitto::Mosquitto;
use throng_testkit::peers::{self, dir};
use throng_testkit::process::command;
use throng_testkit::{Peer, TempDir, free_port, require, wait_until};

use crate::{run_json, serve};

/// How long a client waits for the messages it expects before it gives up.
const CLIENT_TIMEOUT_S: &str = "20";

/// The broker under test.
enum Broker {
    /// `throng serve` and the port of its MQTT listener.
    Throng(Server, u16),
    /// The reference.
    Mosquitto(Mosquitto),
}

impl Broker {
    /// `throng serve --mqtt-listen 127.0.0.1:<free port>` plus `args`, once
    /// the MQTT listener accepts.
    fn throng(args: &[&str]) -> Self {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut all = vec!["--mqtt-listen", &listen];
        all.extend_from_slice(args);
        let server = serve(&all);
        wait_until("the MQTT listener to accept", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Self::Throng(server, port)
    }

    fn mosquitto() -> Self {
        Self::Mosquitto(Mosquitto::start())
    }

    /// Both, the reference first: the rules a test checks hold on each.
    fn both() -> [fn() -> Self; 2] {
        [Self::mosquitto, || Self::throng(&["--workers", "2"])]
    }

    fn port(&self) -> u16 {
        match self {
            Self::Throng(_, port) => *port,
            Self::Mosquitto(m) => m.port,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Throng(..) => "throng serve",
            Self::Mosquitto(_) => "mosquitto",
        }
    }

    /// What the broker logged, for a failure's message.
    fn log(&self) -> String {
        match self {
            Self::Throng(s, _) => s.log(),
            Self::Mosquitto(m) => m.log(),
        }
    }
}

/// One message as a client saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Got {
    topic: String,
    payload: String,
    qos: u64,
    retain: bool,
}

fn got(topic: &str, payload: &str, qos: u64, retain: bool) -> Got {
    Got {
        topic: topic.to_owned(),
        payload: payload.to_owned(),
        qos,
        retain,
    }
}

impl Got {
    /// From a client's JSON line (mosquitto_sub's `%j`: `retain` is 0 or 1
    /// and an empty payload is `null`).
    fn parse(v: &Value) -> Self {
        Self {
            topic: v["topic"].as_str().expect("a topic").to_owned(),
            payload: v["payload"].as_str().unwrap_or("").to_owned(),
            qos: v["qos"].as_u64().expect("a QoS"),
            retain: v["retain"].as_bool().unwrap_or(v["retain"] == 1),
        }
    }
}

/// The three MQTT clients that are not ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Paho,
    Mosquitto,
    Node,
}

const CLIENTS: [Client; 3] = [Client::Paho, Client::Mosquitto, Client::Node];

/// Every client's peer, for `require!`.
macro_rules! require_clients {
    ($($more:expr),* $(,)?) => {
        require!(Peer::PythonPaho, Peer::MosquittoClients, Peer::NodeMqtt, Peer::Mosquitto $(, $more)*)
    };
}

impl Client {
    /// `tests/peers/mqtt_peer.<py|mjs> MODE 127.0.0.1 PORT TOPIC`.
    fn peer_script(self, mode: &str, port: u16, topic: &str) -> Command {
        let mut c = match self {
            Self::Paho => {
                let mut c = command("python3");
                c.arg(dir().join("mqtt_peer.py"));
                c
            }
            Self::Node => {
                let mut c = command("node");
                c.arg(dir().join("mqtt_peer.mjs")).current_dir(dir());
                c
            }
            Self::Mosquitto => unreachable!("mosquitto_sub and _pub are not scripts"),
        };
        c.args([mode, "127.0.0.1", &port.to_string(), topic]);
        c
    }

    /// A subscriber to `filters` at `qos`, once its SUBACK came; it ends
    /// after `count` messages (or the client timeout).
    fn subscribe(self, port: u16, filters: &[&str], qos: u8, count: usize) -> Subscriber {
        let (qos, count) = (qos.to_string(), count.to_string());
        let cmd = match self {
            Self::Mosquitto => {
                let mut c = mosquitto_sub(port);
                c.args(["-q", &qos, "-C", &count]);
                for f in filters {
                    c.args(["-t", f]);
                }
                c
            }
            Self::Paho | Self::Node => {
                let mut c = self.peer_script("sub", port, filters[0]);
                for f in &filters[1..] {
                    c.args(["--and", f]);
                }
                c.args([
                    "--qos",
                    &qos,
                    "--count",
                    &count,
                    "--timeout",
                    CLIENT_TIMEOUT_S,
                ]);
                if self == Self::Paho {
                    c.arg("--lines");
                }
                c
            }
        };
        Subscriber::start(self, cmd)
    }

    /// Publishes `payloads` in order to `topic` at `qos` (each waits for
    /// its PUBACK at QoS 1); returns how many PUBACKs came.
    fn send(self, port: u16, topic: &str, payloads: &[String], qos: u8, retain: bool) -> u64 {
        let qos = qos.to_string();
        let mut cmd = match self {
            Self::Mosquitto => {
                let mut c = command("mosquitto_pub");
                c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", topic])
                    .args(["-q", &qos, "-l", "-d"]);
                if retain {
                    c.arg("-r");
                }
                c
            }
            Self::Paho | Self::Node => {
                let mut c = self.peer_script("send", port, topic);
                c.args(["--qos", &qos]);
                if retain {
                    c.arg("--retain");
                }
                c
            }
        };
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {self:?}'s publisher: {e}"));
        {
            let mut stdin = child.stdin.take().expect("piped stdin");
            for p in payloads {
                writeln!(stdin, "{p}").expect("write a payload");
            }
        }
        let out = child.wait_with_output().expect("wait for a publisher");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{self:?} publishing failed: {text}");
        match self {
            Self::Mosquitto => text.matches("received PUBACK").count() as u64,
            Self::Paho | Self::Node => {
                let v: Value = serde_json::from_str(text.lines().last().unwrap_or(""))
                    .unwrap_or_else(|e| panic!("{self:?}'s last line in {text:?}: {e}"));
                assert_eq!(count(&v, &["sent"]), payloads.len() as u64, "{v}");
                count(&v, &["acked"])
            }
        }
    }
}

/// `mosquitto_sub` on `port`, printing each message as JSON and what it
/// sends and receives (`-d`), giving up after the client timeout. Its
/// output to a pipe is line-buffered by `stdbuf`: its `-d` lines are not
/// flushed otherwise, and its SUBACK line would come only at its end.
fn mosquitto_sub(port: u16) -> Command {
    let mut c = command("stdbuf");
    c.args([
        "-oL",
        "mosquitto_sub",
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ])
    .args(["-W", CLIENT_TIMEOUT_S, "-F", "%j", "-d"]);
    c
}

/// A running subscriber.
struct Subscriber {
    client: Client,
    child: Child,
    out: BufReader<ChildStdout>,
    /// Every line it printed that was not a message.
    debug: Vec<String>,
    /// Messages it printed before it said its SUBACK came (Node's `mqtt`
    /// reports a retained message that came behind the SUBACK first).
    early: Vec<Got>,
}

/// What a subscriber saw by its end.
struct Seen {
    client: Client,
    messages: Vec<Got>,
    /// The QoS of each filter, as SUBACK granted it.
    granted: Vec<u64>,
    /// Lines that were not messages (mosquitto_sub's `-d`: the PUBACKs it sent).
    debug: Vec<String>,
}

impl Subscriber {
    /// Runs `cmd`, `client`'s subscriber, until it says its SUBACK came.
    fn start(client: Client, mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {client:?}'s subscriber: {e}"));
        let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut debug = Vec::new();
        let mut early = Vec::new();
        loop {
            let mut line = String::new();
            let n = out
                .read_line(&mut line)
                .expect("read a subscriber's output");
            assert!(n > 0, "{client:?} ended before its SUBACK: {debug:?}");
            let line = line.trim_end().to_owned();
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && v.get("topic").is_some()
            {
                early.push(Got::parse(&v));
                continue;
            }
            // mosquitto_sub -d: "Subscribed (mid: 1): 1, 0" (the QoS granted).
            let ready = line == "ready" || line.starts_with("Subscribed (mid:");
            debug.push(line);
            if ready {
                break;
            }
        }
        Self {
            client,
            child,
            out,
            debug,
            early,
        }
    }

    /// Waits for the subscriber to end and reads what it saw.
    fn finish(mut self) -> Seen {
        let mut messages = std::mem::take(&mut self.early);
        let mut granted = Vec::new();
        for line in (&mut self.out).lines() {
            let line = line.expect("read a subscriber's output");
            match serde_json::from_str::<Value>(&line) {
                Ok(v) if v.get("topic").is_some() => messages.push(Got::parse(&v)),
                Ok(v) if v.get("granted").is_some() => {
                    granted = v["granted"]
                        .as_array()
                        .expect("granted is a list")
                        .iter()
                        .filter_map(Value::as_u64)
                        .collect();
                }
                _ => self.debug.push(line),
            }
        }
        let _ = self.child.wait();
        if self.client == Client::Mosquitto
            && let Some(line) = self
                .debug
                .iter()
                .find(|l| l.starts_with("Subscribed (mid:"))
        {
            granted = line
                .split("): ")
                .nth(1)
                .unwrap_or("")
                .split(", ")
                .filter_map(|q| q.trim().parse().ok())
                .collect();
        }
        Seen {
            client: self.client,
            messages,
            granted,
            debug: self.debug,
        }
    }
}

/// Numbered payloads `m<first>`..`m<first + n - 1>`.
fn numbered(first: usize, n: usize) -> Vec<String> {
    (first..first + n).map(|i| format!("m{i:03}")).collect()
}

/// The acceptance case: one channel, subscribers over MQTT (each client)
/// and WebSocket (Node `ws`, Python `websockets`), two workers; fifty
/// messages published in turn over HTTP and by each MQTT client. Every
/// subscriber gets every message once, in publish order. (QoS has its own
/// test below.)
#[test]
fn every_message_reaches_mqtt_and_websocket_subscribers_once_in_order() {
    require_clients!(Peer::NodeWs, Peer::PythonWebsockets);
    let broker = Broker::throng(&["--workers", "2"]);
    let Broker::Throng(server, port) = &broker else {
        unreachable!()
    };
    let channel = "feed/main";
    let total = 50;
    // The WebSocket subscribers first: their "ready" comes before the
    // server registered them, so wait for its count before the rest.
    let url = format!("ws://{}/{channel}", server.addr);
    let mut websockets = Vec::new();
    for mut peer in [peers::node("serve_sub.mjs"), peers::python("serve_sub.py")] {
        let mut child = peer
            .arg(&url)
            .arg(total.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a WebSocket subscriber");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "a WebSocket peer did not subscribe");
        websockets.push((child, out));
    }
    server.wait_metric("throng_connections_open", |v| v >= 2.0);
    let subscribers: Vec<Subscriber> = CLIENTS
        .iter()
        .map(|c| c.subscribe(*port, &[channel], 0, total))
        .collect();

    // Each publisher's batch is acknowledged (HTTP 200, PUBACK) before the
    // next starts, so the publish order is one order. The QoS 0 batch goes
    // last: nothing says when the server has it.
    for i in 1..=10 {
        publish_ok(server.addr, channel, format!("m{i:03}").as_bytes(), None);
    }
    assert_eq!(
        Client::Paho.send(*port, channel, &numbered(11, 10), 1, false),
        10
    );
    assert_eq!(
        Client::Mosquitto.send(*port, channel, &numbered(21, 10), 1, false),
        10
    );
    for i in 31..=40 {
        publish_ok(server.addr, channel, format!("m{i:03}").as_bytes(), None);
    }
    assert_eq!(
        Client::Node.send(*port, channel, &numbered(41, 10), 0, false),
        0
    );

    let payloads = numbered(1, total);
    let want: Vec<Got> = payloads.iter().map(|p| got(channel, p, 0, false)).collect();
    for sub in subscribers {
        let seen = sub.finish();
        assert_eq!(seen.messages, want, "{:?}\n{}", seen.client, broker.log());
    }
    for (mut child, out) in websockets {
        let lines: Vec<String> = out.lines().map(Result::unwrap).collect();
        assert!(child.wait().unwrap().success(), "{lines:?}");
        let texts: Vec<String> = lines[..total]
            .iter()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                let hex = v["hex"].as_str().unwrap();
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap() as char)
                    .collect()
            })
            .collect();
        assert_eq!(texts, payloads);
    }
}

/// The topics the wildcard test publishes to, in this order.
const TOPICS: [&str; 7] = [
    "sensors/1/temp",
    "sensors/2/humidity",
    "sensors",
    "sensors/1/temp/raw",
    "other/1/temp",
    "sensors//temp",
    "/leading",
];
/// Published last: every subscriber has it (its filter or its own subscription
/// to it), so it ends each one's expected list.
const END: &str = "end/of/test";

/// `+` matches one level (an empty one too), `#` the rest of the topic and
/// its parent, an exact filter itself only (MQTT 3.1.1, 4.7). Each filter
/// by one client (the clients take turns), each topic published by one.
#[test]
fn wildcards_match_topics_level_by_level() {
    require_clients!();
    // Filter, then the indexes in TOPICS it matches.
    let cases: [(&str, &[usize]); 7] = [
        ("sensors/+/temp", &[0, 5]),
        ("sensors/#", &[0, 1, 2, 3, 5]),
        ("+/+/temp", &[0, 4, 5]),
        ("+", &[2]),
        ("#", &[0, 1, 2, 3, 4, 5, 6]),
        ("+/leading", &[6]),
        ("sensors/1/temp", &[0]),
    ];
    for start in Broker::both() {
        let broker = start();
        let port = broker.port();
        let subs: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, (filter, matched))| {
                // `#` has END already: a second subscription matching it would
                // ask for one copy or two, which 3.1.1 leaves to the server.
                let filters: &[&str] = if *filter == "#" {
                    &[filter]
                } else {
                    &[filter, END]
                };
                let client = CLIENTS[i % CLIENTS.len()];
                (i, client.subscribe(port, filters, 0, matched.len() + 1))
            })
            .collect();
        for (i, topic) in TOPICS.iter().chain([&END]).enumerate() {
            CLIENTS[i % CLIENTS.len()].send(port, topic, &[format!("to {topic}")], 1, false);
        }
        for (i, sub) in subs {
            let seen = sub.finish();
            let (filter, matched) = cases[i];
            let mut want: Vec<Got> = matched
                .iter()
                .map(|&t| got(TOPICS[t], &format!("to {}", TOPICS[t]), 0, false))
                .collect();
            want.push(got(END, &format!("to {END}"), 0, false));
            assert_eq!(
                seen.messages,
                want,
                "{}: {:?} subscribed to {filter}\n{:?}\n{}",
                broker.name(),
                seen.client,
                seen.debug,
                broker.log()
            );
        }
    }
}

/// A retained message goes to each new matching subscriber with RETAIN 1;
/// a later retained publish replaces it; a plain publish does not; an empty
/// retained payload clears it (and is delivered as usual); live deliveries
/// carry RETAIN 0 (MQTT 3.1.1, 3.3.1.3). Each client publishes and
/// subscribes in turn.
#[test]
fn retained_messages_go_to_new_subscribers_until_cleared() {
    require_clients!();
    for start in Broker::both() {
        let broker = start();
        let port = broker.port();
        let name = broker.name();
        let (a, b, c) = (Client::Paho, Client::Mosquitto, Client::Node);
        let one = |s: &str| vec![s.to_owned()];
        a.send(port, "r/a", &one("one"), 1, true);
        b.send(port, "r/b", &one("two"), 0, true);
        c.send(port, "r/c", &one("three"), 1, false);

        let mut firsts = Vec::new();
        for client in CLIENTS {
            firsts.push(client.subscribe(port, &["r/#", END], 1, 6));
        }
        c.send(port, "r/a", &one("uno"), 1, true);
        a.send(port, "r/b", &one("dos"), 1, false);
        b.send(port, "r/b", &one(""), 1, true);
        a.send(port, END, &one("end"), 1, false);
        for sub in firsts {
            let seen = sub.finish();
            let mut messages = seen.messages.clone();
            // The order of two topics' retained messages is not the spec's.
            messages[..2].sort();
            // Each at the lower of its publish's QoS and the one SUBACK
            // granted (a server may grant less than the 1 asked for).
            let q = seen.granted.first().copied().unwrap_or(0).min(1);
            assert_eq!(
                messages,
                [
                    got("r/a", "one", q, true),
                    got("r/b", "two", 0, true),
                    got("r/a", "uno", q, false),
                    got("r/b", "dos", q, false),
                    got("r/b", "", q, false),
                    got(END, "end", q, false),
                ],
                "{name}: {:?} subscribed before the changes\n{}",
                seen.client,
                broker.log()
            );
        }

        // After them: r/a holds "uno", r/b nothing, r/c never held anything.
        let mut lates = Vec::new();
        for client in CLIENTS {
            lates.push((
                client.subscribe(port, &["r/+", END], 0, 2),
                client.subscribe(port, &["r/b", "r/c", END], 0, 1),
            ));
        }
        b.send(port, END, &one("end"), 0, false);
        for (wildcard, exact) in lates {
            let seen = wildcard.finish();
            assert_eq!(
                seen.messages,
                [got("r/a", "uno", 0, true), got(END, "end", 0, false)],
                "{name}: {:?} on r/+ after the changes",
                seen.client
            );
            let seen = exact.finish();
            assert_eq!(
                seen.messages,
                [got(END, "end", 0, false)],
                "{name}: {:?} on r/b and r/c after the changes",
                seen.client
            );
        }
    }
}

/// QoS 1 both ways: each client's QoS 1 publish gets its PUBACK; a QoS 1
/// subscription is granted QoS 1 and gets QoS 1 deliveries (which the
/// client acknowledges: mosquitto_sub says so), a QoS 0 publish arrives at
/// QoS 0, and a QoS 0 subscriber gets everything at QoS 0.
#[test]
fn qos_1_is_acknowledged_both_ways() {
    require_clients!();
    for start in Broker::both() {
        let broker = start();
        let port = broker.port();
        let name = broker.name();
        let mut subs: Vec<(u8, Subscriber)> = CLIENTS
            .iter()
            .map(|c| (1, c.subscribe(port, &["q/one"], 1, 12)))
            .collect();
        subs.push((0, Client::Node.subscribe(port, &["q/one"], 0, 12)));
        for (i, client) in CLIENTS.iter().enumerate() {
            let acks = client.send(port, "q/one", &numbered(i * 3 + 1, 3), 1, false);
            assert_eq!(acks, 3, "{name}: {client:?}'s PUBACKs");
        }
        let acks = Client::Mosquitto.send(port, "q/one", &numbered(10, 3), 0, false);
        assert_eq!(acks, 0, "{name}: a QoS 0 publish has no PUBACK");
        for (qos, sub) in subs {
            let seen = sub.finish();
            assert_eq!(
                seen.granted,
                [u64::from(qos)],
                "{name}: {:?}'s SUBACK",
                seen.client
            );
            let want: Vec<Got> = numbered(1, 12)
                .iter()
                .enumerate()
                .map(|(i, p)| got("q/one", p, u64::from(qos).min(u64::from(i < 9)), false))
                .collect();
            assert_eq!(
                seen.messages,
                want,
                "{name}: {:?} at QoS {qos}\n{}",
                seen.client,
                broker.log()
            );
            if seen.client == Client::Mosquitto {
                let pubacks = seen
                    .debug
                    .iter()
                    .filter(|l| l.contains("sending PUBACK"))
                    .count();
                assert_eq!(pubacks, 9, "{name}: {:?}", seen.debug);
            }
        }
    }
}

/// `throng hold mqtt://` on a wildcard filter with `--publish mqtt://`
/// (QoS 0: throng serve grants no more yet), against Mosquitto and
/// against throng serve (where a WebSocket hold on the same channel runs
/// beside it): every message to every subscriber, once, in order, and the
/// result file's counters and histograms add up to it.
#[test]
fn hold_gets_every_message_from_throng_as_from_mosquitto() {
    require!(Peer::Mosquitto);
    let (conns, messages) = (1000, 20);
    for start in Broker::both() {
        let broker = start();
        let name = broker.name();
        let url = |topic: &str| format!("mqtt://127.0.0.1:{}/{topic}", broker.port());
        // Beside it on throng: WebSocket subscribers of the same channel.
        let websocket = match &broker {
            Broker::Throng(server, _) => {
                let ws = format!("ws://{}/feed/7/temp", server.addr);
                let hold = std::thread::spawn(move || {
                    run_json("hold", &[&ws, "-c", "300", "-w", "1", "--duration", "8s"])
                });
                server.wait_metric("throng_connections_open", |v| v >= 300.0);
                Some(hold)
            }
            Broker::Mosquitto(_) => None,
        };
        let dir = TempDir::new("mqtt-serve");
        let output = dir.file("hold.jsonl");
        let (code, s, stderr) = run_json(
            "hold",
            &[
                &url("feed/+/temp"),
                "-c",
                &conns.to_string(),
                "--rate",
                "2000/s",
                "-w",
                "2",
                "--publish",
                &url("feed/7/temp"),
                "--publish-rate",
                "20/s",
                "--messages",
                &messages.to_string(),
                "--output",
                output.to_str().unwrap(),
            ],
        );
        assert_eq!(code, 0, "{name}: hold failed: {stderr}\n{}", broker.log());
        assert_eq!(count(&s, &["opened"]), conns, "{name}: {s:#}");
        assert_eq!(count(&s, &["published"]), messages, "{name}: {s:#}");
        assert_eq!(count(&s, &["received"]), conns * messages, "{name}: {s:#}");
        for bad in ["lost", "duplicated", "out_of_order", "foreign"] {
            assert_eq!(count(&s, &[bad]), 0, "{name}: {bad}: {s:#}");
        }
        assert_eq!(count(&s, &["closed", "clean"]), conns, "{name}: {s:#}");

        // The result file says the same: its intervals' counters add up,
        // and the delivery histograms hold every delivery.
        let text = std::fs::read_to_string(&output).unwrap();
        let (mut received, mut opened, mut deliveries) = (0, 0, 0);
        for line in text.lines().skip(1) {
            if let throng_report::format::Record::Interval(iv) =
                throng_report::format::decode_record(line).unwrap()
            {
                received += iv.counters.get("messages.received").copied().unwrap_or(0);
                opened += iv.counters.get("connect.ok").copied().unwrap_or(0);
                deliveries += iv.histograms.get("delivery").map_or(0, |h| h.len());
            }
        }
        assert_eq!((opened, received), (conns, conns * messages), "{name}");
        assert_eq!(deliveries, conns * messages, "{name}");

        if let Some(ws) = websocket {
            let (code, s, stderr) = ws.join().unwrap();
            assert_eq!(code, 0, "{name}: the WebSocket hold: {stderr}");
            assert_eq!(count(&s, &["received"]), 300 * messages, "{s:#}");
            assert_eq!(count(&s, &["out_of_order"]), 0, "{s:#}");
        }
    }
}

/// A client that drops without DISCONNECT has its will published; one that
/// disconnects cleanly does not (MQTT 3.1.1, 3.1.2.5).
#[test]
fn a_will_is_published_when_its_client_drops_and_not_otherwise() {
    require_clients!();
    for start in Broker::both() {
        let broker = start();
        let port = broker.port();
        let name = broker.name();
        // At QoS 0, so a QoS 1 will arrives at 0: this test is about wills.
        let watcher = Client::Paho.subscribe(port, &["w/#"], 0, 1);
        let will = |topic: &str, payload: &str, count: &str| {
            let mut c = mosquitto_sub(port);
            c.args(["-t", "x/quiet", "-C", count, "--will-topic", topic])
                .args(["--will-payload", payload, "--will-qos", "1"]);
            Subscriber::start(Client::Mosquitto, c)
        };
        let clean = will("w/clean", "clean will", "1");
        let mut dropped = will("w/dropped", "dropped will", "1000");
        // The first disconnects cleanly once it has one message...
        Client::Node.send(port, "x/quiet", &["go".to_owned()], 1, false);
        let seen = clean.finish();
        assert_eq!(seen.messages.len(), 1, "{name}: {:?}", seen.debug);
        // ...then the second's process dies, its TCP connection with it.
        dropped.child.kill().expect("kill mosquitto_sub");
        let _ = dropped.child.wait();
        let seen = watcher.finish();
        assert_eq!(
            seen.messages,
            [got("w/dropped", "dropped will", 0, false)],
            "{name}\n{}",
            broker.log()
        );
    }
}

/// `throng hold mqtt:// --qos 2` with `--publish mqtt://` at QoS 2, against
/// Mosquitto and throng serve: every message reaches every subscriber
/// exactly once, each delivery completed with PUBREC, PUBREL, PUBCOMP
/// (throng serve counts the PUBCOMPs it got and the publisher's PUBRELs).
#[test]
fn hold_at_qos_2_gets_every_message_exactly_once() {
    require!(Peer::Mosquitto);
    let (conns, messages) = (50u64, 20u64);
    for start in Broker::both() {
        let broker = start();
        let name = broker.name();
        let url = |topic: &str| format!("mqtt://127.0.0.1:{}/{topic}", broker.port());
        let (code, s, stderr) = run_json(
            "hold",
            &[
                &url("two/+"),
                "-c",
                &conns.to_string(),
                "--qos",
                "2",
                "--publish",
                &url("two/x"),
                "--publish-rate",
                "40/s",
                "--messages",
                &messages.to_string(),
            ],
        );
        assert_eq!(code, 0, "{name}: hold failed: {stderr}\n{}", broker.log());
        assert_eq!(count(&s, &["published"]), messages, "{name}: {s:#}");
        assert_eq!(count(&s, &["received"]), conns * messages, "{name}: {s:#}");
        for bad in ["lost", "duplicated", "out_of_order", "foreign"] {
            assert_eq!(count(&s, &[bad]), 0, "{name}: {bad}: {s:#}");
        }
        if let Broker::Throng(server, _) = &broker {
            let got = |t: &str| {
                server.metric(&format!(
                    "throng_mqtt_packets_received_total{{type=\"{t}\"}}"
                ))
            };
            assert_eq!(got("PUBCOMP"), (conns * messages) as f64, "{name}");
            assert_eq!(got("PUBREL"), messages as f64, "{name}");
        }
    }
}

/// `--mqtt-connect-only`: connections that CONNECT and send no SUBSCRIBE
/// (idle devices), held open on throng serve and Mosquitto alike; with
/// `--publish` it is refused.
#[test]
fn hold_can_connect_without_subscribing() {
    require!(Peer::Mosquitto);
    for start in Broker::both() {
        let broker = start();
        let name = broker.name();
        let url = format!("mqtt://127.0.0.1:{}/idle", broker.port());
        let (code, s, stderr) = run_json(
            "hold",
            &[&url, "-c", "40", "--mqtt-connect-only", "--duration", "2s"],
        );
        assert_eq!(code, 0, "{name}: hold failed: {stderr}\n{}", broker.log());
        assert_eq!(count(&s, &["opened"]), 40, "{name}: {s:#}");
        assert_eq!(count(&s, &["closed", "clean"]), 40, "{name}: {s:#}");
        if let Broker::Throng(server, _) = &broker {
            // hold ends once its DISCONNECTs are written; the workers may
            // count them a moment later on a loaded machine.
            let disconnects = server.wait_metric(
                "throng_mqtt_packets_received_total{type=\"DISCONNECT\"}",
                |v| v >= 40.0,
            );
            assert_eq!(disconnects, 40.0, "{name}");
            let (_, metrics) = throng_testkit::http::get(server.ops, "/metrics");
            assert!(!metrics.contains("type=\"SUBSCRIBE\""), "{name}: {metrics}");
        }
        let (code, _, stderr) = run_json(
            "hold",
            &[
                &url,
                "--mqtt-connect-only",
                "--publish",
                &url,
                "--messages",
                "1",
            ],
        );
        assert_ne!(code, 0, "{name}: {stderr}");
        assert!(stderr.contains("--mqtt-connect-only"), "{stderr}");
    }
}
