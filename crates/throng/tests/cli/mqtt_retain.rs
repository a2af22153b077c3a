//! Retained messages in `throng serve --mqtt-listen`: real sockets, a
//! client on the proto crate's MQTT codec that keeps each PUBLISH's retain
//! flag. A retained publish (MQTT, or HTTP `?retain=1`) replaces its
//! channel's retained message and an empty one clears it; each new
//! subscription gets those its filter matches first, flagged retained,
//! while live deliveries carry retain 0; with Redis every node answers the
//! same; `--max-retained` drops the longest-set first. (Against
//! independent clients and Mosquitto: `mqtt_serve`.)

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use throng_proto::mqtt::{
    Connect, Decoder, Delivery, Packet, Properties, Property, Publish, QoS, RetainHandling,
    Subscribe, SubscriptionOptions, Version,
};
use throng_testkit::http::publish;
use throng_testkit::redis::Redis;
use throng_testkit::redis_cluster::Cluster;
use throng_testkit::{Peer, Server, require};

use crate::mqtt_listen::mqtt_server as server;

/// A PUBLISH as a subscriber saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Msg {
    topic: String,
    payload: String,
    retain: bool,
}

fn msg(topic: &str, payload: &str, retain: bool) -> Msg {
    Msg {
        topic: topic.to_owned(),
        payload: payload.to_owned(),
        retain,
    }
}

/// One MQTT client.
struct Client {
    s: TcpStream,
    version: Version,
    dec: Decoder,
    buf: Vec<u8>,
    next_id: u16,
    /// What the 5.0 CONNACK said of retained messages.
    retain_available: Option<u8>,
}

/// What the client read: a PUBLISH, or an acknowledgement's packet id.
#[derive(Debug)]
enum Got {
    Publish(Msg),
    Ack(u16),
    Suback(u16, Vec<u8>),
}

impl Client {
    fn connect(addr: SocketAddr, version: Version) -> Self {
        let s = TcpStream::connect(addr).expect("connect to the MQTT listener");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Self {
            s,
            version,
            dec: Decoder::client(version, 1 << 20),
            buf: Vec::new(),
            next_id: 1,
            retain_available: None,
        };
        c.send(&Packet::Connect(Connect {
            clean_start: true,
            keep_alive: 60,
            properties: Properties::EMPTY,
            client_id: "",
            will: None,
            username: None,
            password: None,
        }));
        c.read(|p| match p {
            Packet::Connack(a) => {
                assert_eq!(a.code.0, 0, "CONNACK");
                a.properties.iter().find_map(|p| match p {
                    Property::RetainAvailable(b) => Some(b),
                    _ => None,
                })
            }
            other => panic!("expected CONNACK, got {other:?}"),
        })
        .map(|r| c.retain_available = r)
        .expect("a CONNACK");
        c
    }

    fn send(&mut self, p: &Packet<'_>) {
        let mut out = Vec::new();
        p.encode(self.version, &mut out).expect("encode");
        self.s.write_all(&out).expect("write to the server");
    }

    /// Reads the next packet and hands it to `f`; `None`: the server closed.
    fn read<T>(&mut self, f: impl FnOnce(Packet<'_>) -> T) -> Option<T> {
        loop {
            if let Some(d) = self.dec.decode(&self.buf).expect("a packet we read") {
                let n = d.consumed;
                let out = f(d.packet);
                self.buf.drain(..n);
                return Some(out);
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    fn next(&mut self) -> Got {
        self.read(|p| match p {
            Packet::Publish(p) => Got::Publish(Msg {
                topic: p.topic.to_owned(),
                payload: String::from_utf8_lossy(p.payload).into_owned(),
                retain: p.retain,
            }),
            Packet::Puback(a) => Got::Ack(a.packet_id.get()),
            Packet::Suback(s) => {
                Got::Suback(s.packet_id.get(), s.codes.iter().map(|c| c.0).collect())
            }
            other => panic!("unexpected {other:?}"),
        })
        .expect("the server closed the connection")
    }

    fn id(&mut self) -> u16 {
        self.next_id += 1;
        self.next_id
    }

    /// Subscribes to `filters` with 5.0 retain handling `rh`; waits for SUBACK.
    fn subscribe_with(&mut self, filters: &[&str], rh: RetainHandling) {
        let id = self.id();
        let options = SubscriptionOptions {
            retain_handling: rh,
            ..SubscriptionOptions::qos(QoS::AtMostOnce)
        };
        self.send(&Packet::Subscribe(Subscribe {
            packet_id: id.try_into().unwrap(),
            properties: Properties::EMPTY,
            filters: filters.iter().map(|f| (*f, options)).collect(),
        }));
        match self.next() {
            Got::Suback(got, codes) if got == id => {
                assert!(codes.iter().all(|&c| c == 0), "{filters:?}: {codes:?}");
            }
            other => panic!("expected SUBACK {id}, got {other:?}"),
        }
    }

    fn subscribe(&mut self, filters: &[&str]) {
        self.subscribe_with(filters, RetainHandling::OnSubscribe);
    }

    /// Publishes at QoS 1 and waits for the PUBACK: the worker has handed
    /// it to the supervisor, which may not have relayed (nor stored) it
    /// yet ([`relayed`] waits for that).
    fn publish(&mut self, topic: &str, payload: &str, retain: bool) {
        let id = self.id();
        self.send(&Packet::Publish(Publish {
            dup: false,
            delivery: Delivery::AtLeastOnce(id.try_into().unwrap()),
            retain,
            topic,
            properties: Properties::EMPTY,
            payload: payload.as_bytes(),
        }));
        match self.next() {
            Got::Ack(got) if got == id => {}
            other => panic!("expected PUBACK {id}, got {other:?}"),
        }
    }

    /// The next `n` PUBLISHes.
    fn messages(&mut self, n: usize) -> Vec<Msg> {
        (0..n)
            .map(|_| match self.next() {
                Got::Publish(m) => m,
                other => panic!("expected a PUBLISH, got {other:?}"),
            })
            .collect()
    }

    /// The next `n` PUBLISHes, sorted (retained messages of several
    /// channels come in no set order).
    fn sorted(&mut self, n: usize) -> Vec<Msg> {
        let mut v = self.messages(n);
        v.sort();
        v
    }

    /// Nothing arrives within a moment.
    fn quiet(&mut self) {
        self.s
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut chunk = [0u8; 256];
        match self.s.read(&mut chunk) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            other => panic!("expected nothing, got {other:?} {:?}", &chunk[..16]),
        }
        self.s
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
    }
}

/// Waits until `s` has relayed `n` messages in all: a subscription asked
/// for after that finds them in the store, not on their way.
fn relayed(s: &Server, n: u64) {
    s.wait_metric("throng_messages_published_total", |v| v >= n as f64);
}

#[test]
fn a_retained_publish_replaces_the_last_and_an_empty_one_clears_it() {
    let (s, mqtt) = server(&["--workers", "2"]);
    for (round, version) in [Version::V311, Version::V5].into_iter().enumerate() {
        let before = 5 * round as u64;
        let mut p = Client::connect(mqtt, version);
        if version == Version::V5 {
            assert_eq!(p.retain_available, Some(1), "5.0 CONNACK offers retain");
        }
        let t = if version == Version::V5 {
            "v5/a"
        } else {
            "v3/a"
        };
        p.publish(t, "one", true);
        relayed(&s, before + 1);
        let mut first = Client::connect(mqtt, version);
        first.subscribe(&[t]);
        assert_eq!(first.messages(1), [msg(t, "one", true)], "{version:?}");

        // Replaced; live it carries retain 0.
        p.publish(t, "two", true);
        assert_eq!(first.messages(1), [msg(t, "two", false)]);
        // A publish without the flag replaces nothing.
        p.publish(t, "plain", false);
        assert_eq!(first.messages(1), [msg(t, "plain", false)]);
        let mut second = Client::connect(mqtt, version);
        second.subscribe(&[t]);
        assert_eq!(second.messages(1), [msg(t, "two", true)], "{version:?}");

        // An empty retained payload clears it, and is delivered as usual.
        p.publish(t, "", true);
        assert_eq!(first.messages(1), [msg(t, "", false)]);
        assert_eq!(second.messages(1), [msg(t, "", false)]);
        let mut third = Client::connect(mqtt, version);
        third.subscribe(&[t]);
        third.quiet();
        p.publish(t, "after", false);
        assert_eq!(third.messages(1), [msg(t, "after", false)]);
    }
    s.wait_metric("throng_mqtt_retained_topics", |v| v == 0.0);
    s.wait_metric("throng_mqtt_retained_sent_total", |v| v == 4.0);
}

#[test]
fn a_wildcard_gets_every_matching_retained_channel_once() {
    let (s, mqtt) = server(&[]);
    let mut p = Client::connect(mqtt, Version::V5);
    for t in ["r/a", "r/b", "r/b/c", "q/a"] {
        p.publish(t, t, true);
    }
    s.wait_metric("throng_mqtt_retained_topics", |v| v == 4.0);
    let mut sub = Client::connect(mqtt, Version::V311);
    sub.subscribe(&["r/+", "r/a"]);
    assert_eq!(
        sub.sorted(2),
        [msg("r/a", "r/a", true), msg("r/b", "r/b", true)],
        "r/a once, though two filters match it; not r/b/c nor q/a"
    );
    sub.quiet();
    let mut all = Client::connect(mqtt, Version::V5);
    all.subscribe(&["#"]);
    let got: Vec<String> = all.sorted(4).into_iter().map(|m| m.topic).collect();
    assert_eq!(got, ["q/a", "r/a", "r/b", "r/b/c"]);

    // 5.0 retain handling: 2 never sends them, 1 only for a new
    // subscription, 0 at every SUBSCRIBE.
    let mut v5 = Client::connect(mqtt, Version::V5);
    v5.subscribe_with(&["r/+"], RetainHandling::Never);
    v5.quiet();
    v5.subscribe_with(&["r/+"], RetainHandling::OnNewSubscribe);
    v5.quiet();
    v5.subscribe_with(&["q/+"], RetainHandling::OnNewSubscribe);
    assert_eq!(v5.messages(1), [msg("q/a", "q/a", true)]);
    v5.subscribe_with(&["r/+"], RetainHandling::OnSubscribe);
    assert_eq!(
        v5.sorted(2),
        [msg("r/a", "r/a", true), msg("r/b", "r/b", true)]
    );
}

#[test]
fn an_http_publish_with_retain_1_sets_and_an_empty_body_clears() {
    let (s, mqtt) = server(&[]);
    let (status, body) = publish(s.addr, "h/1?retain=1", b"kept", None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"retained\":\"set\""), "{body}");
    let mut sub = Client::connect(mqtt, Version::V5);
    sub.subscribe(&["h/1"]);
    assert_eq!(sub.messages(1), [msg("h/1", "kept", true)]);
    let (_, body) = publish(s.addr, "h/1?retain=1", b"", None);
    assert!(body.contains("\"retained\":\"cleared\""), "{body}");
    assert_eq!(sub.messages(1), [msg("h/1", "", false)]);
    let mut late = Client::connect(mqtt, Version::V5);
    late.subscribe(&["h/1"]);
    late.quiet();
    let (status, body) = publish(s.addr, "h/1?retain=yes", b"x", None);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("retain takes 1 or 0"), "{body}");
    // A plain HTTP publish keeps nothing.
    let (status, _) = publish(s.addr, "h/2", b"gone", None);
    assert_eq!(status, 200);
    late.subscribe(&["h/2"]);
    late.quiet();
}

#[test]
fn past_max_retained_the_channel_set_longest_ago_loses_its_message() {
    let (s, mqtt) = server(&["--max-retained", "2"]);
    assert_eq!(
        s.start["config"]["max_retained"], 2,
        "the cap is in the start line"
    );
    let mut p = Client::connect(mqtt, Version::V311);
    p.publish("c/a", "1", true);
    p.publish("c/b", "2", true);
    p.publish("c/a", "3", true); // c/a is the newest now
    p.publish("c/c", "4", true);
    relayed(&s, 4);
    let mut sub = Client::connect(mqtt, Version::V311);
    sub.subscribe(&["c/#"]);
    assert_eq!(
        sub.sorted(2),
        [msg("c/a", "3", true), msg("c/c", "4", true)]
    );
    sub.quiet();
    s.wait_metric(
        "throng_mqtt_retained_dropped_total{reason=\"count\"}",
        |v| v == 1.0,
    );
    s.wait_metric("throng_mqtt_retained_topics", |v| v == 2.0);
}

#[test]
fn with_redis_every_node_answers_with_the_same_retained_messages() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    for mode in ["pattern", "channels"] {
        let prefix = format!("t-{mode}:");
        let args = [
            "--redis",
            &url,
            "--redis-mode",
            mode,
            "--redis-prefix",
            &prefix,
        ];
        let (a, _) = server(&args);
        let (b, mqtt_b) = server(&args);
        a.wait_broker("up");
        b.wait_broker("up");
        // Set on A (its answer comes once Redis has it), read on B.
        let (status, body) = publish(a.addr, "door/1?retain=1", b"open", None);
        assert_eq!(status, 200, "{mode}: {body}");
        // Pattern mode: B gets every message; had it not yet, B's
        // subscriber would get this one live, not retained.
        let pattern = mode == "pattern";
        if pattern {
            relayed(&b, 1);
        }
        let mut sub = Client::connect(mqtt_b, Version::V5);
        sub.subscribe(&["door/1"]);
        assert_eq!(sub.messages(1), [msg("door/1", "open", true)], "{mode}");
        if mode == "pattern" {
            let (status, _) = publish(a.addr, "door/2?retain=1", b"shut", None);
            assert_eq!(status, 200);
            relayed(&b, 2);
            let mut wild = Client::connect(mqtt_b, Version::V311);
            wild.subscribe(&["door/+"]);
            assert_eq!(
                wild.sorted(2),
                [msg("door/1", "open", true), msg("door/2", "shut", true)]
            );
        }
        // Cleared on A: B's next subscriber gets nothing.
        let (status, _) = publish(a.addr, "door/1?retain=1", b"", None);
        assert_eq!(status, 200);
        assert_eq!(sub.messages(1), [msg("door/1", "", false)], "{mode}");
        relayed(&b, if pattern { 3 } else { 1 });
        let mut late = Client::connect(mqtt_b, Version::V5);
        late.subscribe(&["door/1"]);
        late.quiet();
        b.wait_metric("throng_mqtt_retained_sent_total", |v| {
            v == if pattern { 3.0 } else { 1.0 }
        });
        assert!(
            redis
                .cli(&["HKEYS", &format!("{prefix}#retained")])
                .iter()
                .all(|k| k != "door/1"),
            "{mode}: cleared in Redis"
        );
    }
    // The cap holds in Redis too: the channel set longest ago goes.
    let (c, _) = server(&[
        "--redis",
        &url,
        "--redis-prefix",
        "cap:",
        "--max-retained",
        "1",
    ]);
    c.wait_broker("up");
    for (channel, body) in [("x/1?retain=1", "a"), ("x/2?retain=1", "b")] {
        assert_eq!(publish(c.addr, channel, body.as_bytes(), None).0, 200);
    }
    assert_eq!(redis.cli(&["HKEYS", "cap:#retained"]), ["x/2"]);
    c.wait_metric("throng_mqtt_retained_topics", |v| v == 1.0);
    c.wait_metric(
        "throng_mqtt_retained_dropped_total{reason=\"count\"}",
        |v| v == 1.0,
    );
}

#[test]
fn on_a_redis_cluster_the_store_is_one_slot_and_every_node_answers_the_same() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let c = Cluster::start(3, 0);
    let seeds = c.seeds();
    let args = ["--redis-cluster", &seeds];
    let (a, _) = server(&args);
    let (b, mqtt_b) = server(&args);
    a.wait_broker("up");
    b.wait_broker("up");
    // Channels on different masters, their retained messages in one slot.
    let doors = ["door/1", "door/2", "door/3", "door/4"];
    for d in doors {
        let (status, body) = publish(a.addr, &format!("{d}?retain=1"), d.as_bytes(), None);
        assert_eq!(status, 200, "{body}");
    }
    let masters: std::collections::BTreeSet<u16> = doors
        .iter()
        .map(|d| c.master_of(&format!("throng:{d}")))
        .collect();
    assert!(masters.len() >= 2, "{masters:?}");
    let key = "{throng:#retained}";
    let mut keys = c.node(c.master_of(key)).cli(&["HKEYS", key]);
    keys.sort();
    assert_eq!(keys, doors);
    let mut sub = Client::connect(mqtt_b, Version::V5);
    sub.subscribe(&doors);
    let want: Vec<Msg> = doors.iter().map(|d| msg(d, d, true)).collect();
    assert_eq!(sub.sorted(4), want);
    // Cleared on A: delivered live, and gone for B's next subscriber.
    let (status, _) = publish(a.addr, "door/1?retain=1", b"", None);
    assert_eq!(status, 200);
    assert_eq!(sub.messages(1), [msg("door/1", "", false)]);
    let mut late = Client::connect(mqtt_b, Version::V5);
    late.subscribe(&["door/1"]);
    late.quiet();
    a.wait_metric("throng_mqtt_retained_topics", |v| v == 3.0);
}

#[test]
fn serve_teaches_retain_and_prints_its_caps() {
    let out = crate::throng().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("?retain=1"), "{help}");
    assert!(help.contains("--max-retained <N>"), "{help}");
    assert!(help.contains("--max-retained-memory <SIZE>"), "{help}");
    let out = crate::throng()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--mqtt-listen",
            "127.0.0.1:0",
        ])
        .args([
            "--max-retained",
            "7",
            "--max-retained-memory",
            "1MiB",
            "--dry-run",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("at most 7 channels and 1MiB"), "{text}");
}
