//! MQTT persistent sessions and shared subscriptions on `throng serve`,
//! with paho-mqtt (Python) as the client: 3.1.1's clean session 0 and 5.0's Session Expiry Interval
//! keep the subscriptions and the QoS 1 messages published while the
//! client is away, bounded by `--mqtt-session-queue`, handed back in order
//! with session present 1 on whichever worker the client lands; a 5.0
//! connection without an expiry ends it, and an expired one is gone; a
//! shared subscription's messages go to one member each, in turn; a
//! delayed will waits, and a reconnect cancels it.

use std::io::{BufRead as _, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;
use throng_testkit::http::publish_ok;
use throng_testkit::peers::dir;
use throng_testkit::process::command;
use throng_testkit::redis::Redis;
use throng_testkit::{Peer, require};

use throng_proto::mqtt::{
    Ack, Connect, Delivery, Packet, PacketId, Properties, PropertiesBuf, Property, QoS, ReasonCode,
    Subscribe, SubscriptionOptions, Version, Will,
};

use crate::mqtt_listen::{Client, Got, mqtt_server};

/// One run of `mqtt_peer.py session` as client `id`: CONNACK's session
/// present, and the (payload, qos) of the messages it got.
fn session(mqtt: SocketAddr, id: &str, args: &[&str]) -> (bool, Vec<(String, u64)>) {
    session_on(mqtt, id, "s/+", args)
}

/// [`session`] subscribing to `filter` (with `--subscribe`).
fn session_on(
    mqtt: SocketAddr,
    id: &str,
    filter: &str,
    args: &[&str],
) -> (bool, Vec<(String, u64)>) {
    let mut child = command("python3")
        .arg(dir().join("mqtt_peer.py"))
        .args(["session", "127.0.0.1", &mqtt.port().to_string(), filter])
        .args(["--client-id", id, "--qos", "1", "--timeout", "20"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start paho");
    let out = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut present = None;
    let mut got = Vec::new();
    for line in out.lines() {
        let v: Value = serde_json::from_str(&line.expect("a line")).unwrap_or_default();
        if let Some(p) = v.get("present") {
            present = p.as_bool();
        } else if v.get("topic").is_some() {
            got.push((
                v["payload"].as_str().unwrap_or("").to_owned(),
                v["qos"].as_u64().unwrap_or(9),
            ));
        }
    }
    assert!(child.wait().expect("paho ends").success());
    (present.expect("a CONNACK"), got)
}

#[test]
fn a_session_keeps_subscriptions_and_messages_while_away_on_any_worker() {
    require!(Peer::PythonPaho);
    let (server, mqtt) = mqtt_server(&["--workers", "2", "--mqtt-session-queue", "3"]);
    let (present, _) = session(mqtt, "dev-1", &["--subscribe", "--count", "0"]);
    assert!(!present, "a first connect has no session");
    server.wait_metric("throng_mqtt_sessions_parked", |v| v == 1.0);
    // Reconnects land on either worker: each finds the session.
    for round in 0..4 {
        let mut want = Vec::new();
        for k in 0..4 {
            let body = format!("r{round}-{k}");
            publish_ok(server.addr, &format!("s/{k}"), body.as_bytes(), None);
            // The fourth is over --mqtt-session-queue.
            if k < 3 {
                want.push((body, 1));
            }
        }
        server.wait_metric("throng_mqtt_session_messages", |v| v == 3.0);
        let (present, got) = session(mqtt, "dev-1", &["--count", "3"]);
        assert!(present, "round {round}\n{}", server.log());
        assert_eq!(got, want, "round {round}");
        server.wait_metric("throng_mqtt_sessions_parked", |v| v == 1.0);
    }
    let dropped = server.metric("throng_mqtt_session_dropped_total{cause=\"queue\"}");
    assert_eq!(dropped, 4.0);
    assert_eq!(server.metric("throng_mqtt_sessions_resumed_total"), 4.0);

    // 5.0 with no Session Expiry Interval resumes it, and it ends with
    // that connection: the next resume finds none.
    let (present, _) = session(mqtt, "dev-1", &["--v5", "--count", "0"]);
    assert!(present);
    server.wait_metric("throng_mqtt_sessions_parked", |v| v == 0.0);
    let (present, _) = session(mqtt, "dev-1", &["--count", "0"]);
    assert!(!present, "the session ended with the 5.0 connection");
}

#[test]
fn a_5_0_session_lasts_its_expiry_interval() {
    require!(Peer::PythonPaho);
    let (server, mqtt) = mqtt_server(&["--workers", "1"]);
    // A minute: kept however slow the machine is to start the next client.
    let (present, _) = session(
        mqtt,
        "dev-5",
        &["--v5", "--expiry", "60", "--subscribe", "--count", "0"],
    );
    assert!(!present);
    server.wait_metric("throng_mqtt_sessions_parked", |v| v == 1.0);
    publish_ok(server.addr, "s/a", b"kept", None);
    server.wait_metric("throng_mqtt_session_messages", |v| v == 1.0);
    let (present, got) = session(mqtt, "dev-5", &["--v5", "--expiry", "1", "--count", "1"]);
    assert!(present);
    assert_eq!(got, vec![("kept".to_owned(), 1)]);
    // Parked again, now for a second (this CONNECT's interval); then gone.
    server.wait_metric("throng_mqtt_sessions_expired_total", |v| v == 1.0);
    let (present, _) = session(mqtt, "dev-5", &["--v5", "--expiry", "1", "--count", "0"]);
    assert!(!present, "expired");
}

/// Deliveries the client never acknowledged are sent again when it
/// resumes its session (MQTT-4.4.0-1), before anything newer.
#[test]
fn deliveries_never_acknowledged_come_again_on_resume() {
    let (server, mqtt) = mqtt_server(&["--workers", "2"]);
    let connack = |present| Got::Connack {
        session_present: present,
        code: 0,
        assigned_id: None,
    };
    let mut c = Client::open(mqtt, Version::V311, "unacked", 60, false);
    assert_eq!(c.next(), Some(connack(false)));
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: PacketId::MIN,
        properties: Properties::EMPTY,
        filters: vec![("u/1", SubscriptionOptions::qos(QoS::AtLeastOnce))],
    }));
    assert_eq!(c.next(), Some(Got::Suback(1, vec![1])));
    let mut ids = Vec::new();
    for p in ["one", "two"] {
        publish_ok(server.addr, "u/1", p.as_bytes(), None);
        let (text, id) = packet(&mut c);
        assert_eq!(text, format!("publish {p} qos 1 dup 0"));
        ids.push(id);
    }
    // Gone without a PUBACK.
    drop(c);
    server.wait_metric("throng_mqtt_sessions_parked", |v| v == 1.0);
    publish_ok(server.addr, "u/1", b"three", None);
    server.wait_metric("throng_mqtt_session_messages", |v| v == 3.0);
    let mut c = Client::open(mqtt, Version::V311, "unacked", 60, false);
    assert_eq!(c.next(), Some(connack(true)));
    // Sent again with their ids and DUP 1 (MQTT-4.4.0-1), then the new
    // one with an id of its own.
    for (p, id) in ["one", "two"].iter().zip(&ids) {
        assert_eq!(packet(&mut c), (format!("publish {p} qos 1 dup 1"), *id));
    }
    let (text, id) = packet(&mut c);
    assert_eq!(text, "publish three qos 1 dup 0");
    assert!(!ids.contains(&id), "{id} is in flight already");
}

/// The next packet as a line (a PUBLISH's payload, QoS and DUP, or the
/// packet's name) and its packet id (0 for none).
fn packet<S: Read + Write>(c: &mut Client<S>) -> (String, u16) {
    c.next_as(|p| match p {
        Packet::Publish(p) => (
            format!(
                "publish {} qos {} dup {}",
                String::from_utf8_lossy(p.payload),
                p.delivery.qos() as u8,
                u8::from(p.dup)
            ),
            p.delivery.packet_id().map_or(0, |id| id.get()),
        ),
        Packet::Pubrel(a) => ("pubrel".to_owned(), a.packet_id.get()),
        Packet::Pubcomp(a) => ("pubcomp".to_owned(), a.packet_id.get()),
        Packet::Pubrec(a) => ("pubrec".to_owned(), a.packet_id.get()),
        other => (other.packet_type().name().to_owned(), 0),
    })
    .expect("a packet")
}

fn ack(kind: fn(Ack<'static>) -> Packet<'static>, id: u16) -> Packet<'static> {
    kind(Ack {
        packet_id: id.try_into().unwrap(),
        reason: ReasonCode::SUCCESS,
        properties: Properties::EMPTY,
    })
}

#[test]
fn a_resumed_qos_2_delivery_is_released_or_sent_again_never_received_twice() {
    let (server, mqtt) = mqtt_server(&["--workers", "2"]);
    let mut c = connect_v5(mqtt, "twice");
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: PacketId::MIN,
        properties: Properties::EMPTY,
        filters: vec![("q/2", SubscriptionOptions::qos(QoS::ExactlyOnce))],
    }));
    assert_eq!(c.next(), Some(Got::Suback(1, vec![2])));
    let mut publisher = Client::connect(mqtt, Version::V5, "pub-2");
    let mut publish = |body: &str, id: u16| {
        let packet_id = id.try_into().unwrap();
        publisher.send(&Packet::Publish(throng_proto::mqtt::Publish {
            dup: false,
            delivery: Delivery::ExactlyOnce(packet_id),
            retain: false,
            topic: "q/2",
            properties: Properties::EMPTY,
            payload: body.as_bytes(),
        }));
        assert_eq!(packet(&mut publisher), ("pubrec".to_owned(), id));
        publisher.send(&ack(Packet::Pubrel, id));
        assert_eq!(packet(&mut publisher), ("pubcomp".to_owned(), id));
    };
    // "a" is received (PUBREC) and released (PUBREL), never completed;
    // "b" is sent and never received.
    publish("a", 1);
    let (text, a) = packet(&mut c);
    assert_eq!(text, "publish a qos 2 dup 0");
    c.send(&ack(Packet::Pubrec, a));
    assert_eq!(packet(&mut c), ("pubrel".to_owned(), a));
    publish("b", 2);
    let (text, b) = packet(&mut c);
    assert_eq!(text, "publish b qos 2 dup 0");
    drop(c);
    server.wait_metric("throng_mqtt_sessions_parked", |v| v == 1.0);
    // Back: the PUBREL of "a" again, "b" again under its id with DUP 1;
    // "a" itself is not sent again.
    let mut c = connect_v5(mqtt, "twice");
    assert_eq!(packet(&mut c), ("pubrel".to_owned(), a));
    assert_eq!(packet(&mut c), ("publish b qos 2 dup 1".to_owned(), b));
    c.send(&ack(Packet::Pubcomp, a));
    c.send(&ack(Packet::Pubrec, b));
    assert_eq!(packet(&mut c), ("pubrel".to_owned(), b));
    c.send(&ack(Packet::Pubcomp, b));
    publish("c", 3);
    let (text, _) = packet(&mut c);
    assert_eq!(text, "publish c qos 2 dup 0");
    // The PUBCOMPs of "a" and "b" freed their slots: "c" alone is in flight.
    server.wait_metric("throng_mqtt_inflight", |v| v == 1.0);
}

/// CONNECT properties with a Session Expiry Interval of `s`.
fn expiry_props(s: u32) -> PropertiesBuf {
    let mut b = PropertiesBuf::new();
    b.push(Property::SessionExpiryInterval(s)).unwrap();
    b
}

/// A 5.0 client `id` resuming (or starting) a session that lasts 10
/// minutes away: CONNACK success checked.
fn connect_v5(mqtt: SocketAddr, id: &str) -> Client {
    let s = TcpStream::connect(mqtt).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut c = Client::over(s, Version::V5);
    c.send(&Packet::Connect(Connect {
        clean_start: false,
        keep_alive: 60,
        properties: expiry_props(600).properties(),
        client_id: id,
        will: None,
        username: None,
        password: None,
    }));
    let got = c.next();
    assert!(matches!(got, Some(Got::Connack { code: 0, .. })), "{got:?}");
    c
}

/// `$share/group/filter`: each message to one member of the group, in
/// turn, wherever on the node's workers the members are; a plain
/// subscriber of the same topic gets every message.
#[test]
fn a_shared_subscription_gives_each_message_to_one_member_in_turn() {
    require!(Peer::PythonPaho);
    let (server, mqtt) = mqtt_server(&["--workers", "2"]);
    let members: Vec<Child> = (0..3)
        .map(|_| share_sub(mqtt, "$share/g/s/+", 10))
        .collect();
    let plain = share_sub(mqtt, "s/+", 30);
    server.wait_metric("throng_mqtt_shared_members", |v| v == 3.0);
    assert_eq!(server.metric("throng_mqtt_shared_groups"), 1.0);
    for k in 0..30 {
        publish_ok(
            server.addr,
            &format!("s/{}", k % 4),
            format!("m{k}").as_bytes(),
            None,
        );
    }
    let mut all = Vec::new();
    for m in members {
        let got = finish(m);
        assert_eq!(got.len(), 10, "one in three to each member: {got:?}");
        all.extend(got);
    }
    all.sort();
    let mut want: Vec<String> = (0..30).map(|k| format!("m{k}")).collect();
    want.sort();
    assert_eq!(all, want, "each message once");
    assert_eq!(finish(plain).len(), 30);
    server.wait_metric("throng_mqtt_shared_groups", |v| v == 0.0);

    // A share filter without a group or a filter is refused per filter
    // (5.0: 0x8F), and counted (a wildcard inside a level is malformed:
    // the codec's answer).
    let mut c = Client::connect(mqtt, Version::V5, "bad-share");
    let codes = c.subscribe(1, &["$share/g", "$share//x", "$share/ok/x"]);
    assert_eq!(codes, vec![0x8F, 0x8F, 0]);
    server.wait_metric("throng_mqtt_refused_total{kind=\"bad_share\"}", |v| {
        v == 2.0
    });
}

/// A paho subscriber of `filter` at QoS 1 that takes `count` messages,
/// started once its SUBACK came.
pub(crate) fn share_sub(mqtt: SocketAddr, filter: &str, count: usize) -> Child {
    let mut child = command("python3")
        .arg(dir().join("mqtt_peer.py"))
        .args(["sub", "127.0.0.1", &mqtt.port().to_string(), filter])
        .args([
            "--qos",
            "1",
            "--count",
            &count.to_string(),
            "--timeout",
            "30",
        ])
        .args(["--v5", "--lines"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start paho");
    let out = child.stdout.as_mut().expect("piped stdout");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte: nothing past "ready" is read here.
    while !line.ends_with(b"ready\n") {
        let n = out.read(&mut byte).expect("read paho");
        assert!(n > 0, "paho ended before its SUBACK");
        line.push(byte[0]);
    }
    child
}

/// The payloads a [`share_sub`] subscriber got.
fn finish(mut child: Child) -> Vec<String> {
    let out = BufReader::new(child.stdout.take().expect("piped stdout"));
    let got = out
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
        .filter(|v| v.get("topic").is_some())
        .map(|v| v["payload"].as_str().unwrap_or("").to_owned())
        .collect();
    let _ = child.wait();
    got
}

/// A 5.0 will with a Will Delay Interval is published after it (or when
/// its session ends, if sooner), unless the client connects again first.
#[test]
fn a_delayed_will_waits_and_a_reconnect_cancels_it() {
    let (server, mqtt) = mqtt_server(&["--workers", "2"]);
    let mut watch = Client::connect(mqtt, Version::V5, "watch");
    assert_eq!(watch.subscribe(1, &["w/1"]), vec![0]);
    let dying = |id: &str, delay: u32| {
        let mut props = PropertiesBuf::new();
        props.push(Property::SessionExpiryInterval(60)).unwrap();
        let mut will_props = PropertiesBuf::new();
        will_props.push(Property::WillDelayInterval(delay)).unwrap();
        let s = TcpStream::connect(mqtt).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Client::over(s, Version::V5);
        c.send(&Packet::Connect(Connect {
            clean_start: true,
            keep_alive: 60,
            properties: props.properties(),
            client_id: id,
            will: Some(Will {
                qos: QoS::AtMostOnce,
                retain: false,
                properties: will_props.properties(),
                topic: "w/1",
                payload: id.as_bytes(),
            }),
            username: None,
            password: None,
        }));
        assert!(matches!(c.next(), Some(Got::Connack { code: 0, .. })));
        // Gone without a DISCONNECT.
        drop(c);
    };
    let sent = |kind: &str| format!("throng_mqtt_packets_sent_total{{type=\"{kind}\"}}");
    dying("back-soon", 60);
    server.wait_metric(&sent("will_delayed"), |v| v == 1.0);
    let _back = Client::connect(mqtt, Version::V5, "back-soon");
    server.wait_metric(&sent("will_cancelled"), |v| v == 1.0);

    dying("gone", 1);
    assert_eq!(watch.message(), ("w/1".to_owned(), "gone".to_owned()));
    // The workers' counts reach /metrics a moment later.
    let wills = server.wait_metric(&sent("will"), |v| v >= 1.0);
    assert_eq!(wills, 1.0, "only the one not cancelled");
}

/// With `--redis` in channels mode a parked session keeps its node
/// subscribed in Redis: what another node publishes meanwhile is kept.
#[test]
fn a_session_parked_on_one_node_gets_what_another_node_publishes() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::PythonPaho);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let args = ["--redis", &url, "--redis-mode", "channels"];
    let (a, mqtt_a) = mqtt_server(&args);
    let (b, _) = mqtt_server(&args);
    a.wait_broker("up");
    b.wait_broker("up");
    // Channels mode: an exact filter (wildcards are refused there).
    let (present, _) = session_on(mqtt_a, "dev-r", "s/1", &["--subscribe", "--count", "0"]);
    assert!(!present);
    a.wait_metric("throng_mqtt_sessions_parked", |v| v == 1.0);
    // Published on B until A's session has one (Redis subscribes A to the
    // channel for the session; the first may come before).
    let mut n = 0;
    while a.metric("throng_mqtt_session_messages") < 1.0 {
        n += 1;
        assert!(n < 200, "A's session never got one\n{}", a.log());
        throng_testkit::http::publish_redis(b.addr, "s/1", &format!("r{n}"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let (present, got) = session_on(mqtt_a, "dev-r", "s/1", &["--count", "1"]);
    assert!(present);
    assert_eq!(got.len(), 1);
    assert!(got[0].0.starts_with('r'), "{got:?}");
}

/// A persistent session keeps its shared subscriptions: back, the client
/// is a member again without a SUBSCRIBE (while away, the group's other
/// members take its turns).
#[test]
fn a_session_keeps_its_shared_subscriptions() {
    let (server, mqtt) = mqtt_server(&["--workers", "2"]);
    let mut c = Client::open(mqtt, Version::V311, "sharer", 60, false);
    assert!(matches!(c.next(), Some(Got::Connack { code: 0, .. })));
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: PacketId::MIN,
        properties: Properties::EMPTY,
        filters: vec![("$share/g/q/1", SubscriptionOptions::qos(QoS::AtLeastOnce))],
    }));
    assert_eq!(c.next(), Some(Got::Suback(1, vec![1])));
    server.wait_metric("throng_mqtt_shared_members", |v| v == 1.0);
    drop(c);
    server.wait_metric("throng_mqtt_sessions_parked", |v| v == 1.0);
    server.wait_metric("throng_mqtt_shared_members", |v| v == 0.0);
    let mut c = Client::open(mqtt, Version::V311, "sharer", 60, false);
    assert_eq!(
        c.next(),
        Some(Got::Connack {
            session_present: true,
            code: 0,
            assigned_id: None
        })
    );
    server.wait_metric("throng_mqtt_shared_members", |v| v == 1.0);
    publish_ok(server.addr, "q/1", b"hi", None);
    assert_eq!(
        c.next(),
        Some(Got::Publish {
            topic: "q/1".to_owned(),
            payload: b"hi".to_vec(),
            qos: QoS::AtLeastOnce,
        })
    );
}

#[test]
fn a_resumed_session_keeps_its_own_qos_2_publish_until_pubrel_and_relays_it_once() {
    let (server, mqtt) = mqtt_server(&["--workers", "2"]);
    let mut sub = Client::connect(mqtt, Version::V5, "watcher");
    assert_eq!(sub.subscribe(1, &["own/2"]), [0]);
    let mut c = connect_v5(mqtt, "sender");
    let send = |c: &mut Client, dup: bool| {
        c.send(&Packet::Publish(throng_proto::mqtt::Publish {
            dup,
            delivery: Delivery::ExactlyOnce(5.try_into().unwrap()),
            retain: false,
            topic: "own/2",
            properties: Properties::EMPTY,
            payload: b"once",
        }));
    };
    send(&mut c, false);
    assert_eq!(packet(&mut c), ("pubrec".to_owned(), 5));
    assert_eq!(sub.message(), ("own/2".to_owned(), "once".to_owned()));
    // Gone before its PUBREL.
    drop(c);
    server.wait_metric("throng_mqtt_sessions_parked", |v| v == 1.0);
    let mut c = connect_v5(mqtt, "sender");
    // Sent again: PUBREC, not relayed again; its PUBREL is completed.
    send(&mut c, true);
    assert_eq!(packet(&mut c), ("pubrec".to_owned(), 5));
    c.send(&ack(Packet::Pubrel, 5));
    let comp = c.next_as(|p| match p {
        Packet::Pubcomp(a) => (a.packet_id.get(), a.reason.0),
        other => panic!("expected PUBCOMP, got {other:?}"),
    });
    assert_eq!(comp, Some((5, 0)));
    // The watcher's next message is the next publish: "once" came once.
    publish_ok(server.addr, "own/2", b"next", None);
    assert_eq!(sub.message(), ("own/2".to_owned(), "next".to_owned()));
}

/// A client that resumes (or starts) its session and sends SUBSCRIBE in
/// the same write as its CONNECT gets CONNACK first (MQTT-3.2.0-1), then
/// the SUBACK; on a resume, CONNACK then the queued message and the SUBACK
/// (either order): over TCP and TLS, 3.1.1 and 5.0. The server answered
/// the SUBACK first while the resume waited for its session.
#[test]
fn connack_comes_first_when_a_resume_sends_more_in_the_same_write() {
    let tls = ["--mqtts-listen", "127.0.0.1:0", "--tls-self-signed"];
    let (server, mqtt) = mqtt_server(&[&["--workers", "2"][..], &tls[..]].concat());
    let mqtts: SocketAddr = server.start["mqtts_listen"][0]
        .as_str()
        .and_then(|a| a.parse().ok())
        .expect("mqtts_listen in the start line");
    let pem = server.start["config"]["tls"]["cert_pem"].as_str().unwrap();
    let cfg = crate::serve_tls::client_config(pem, rustls::ALL_VERSIONS);
    let mut round = 0;
    for version in [Version::V311, Version::V5] {
        for over_tls in [false, true] {
            let id = format!("burst-{round}");
            let topic = format!("o/{round}");
            let open = || -> Box<dyn ReadWrite> {
                if over_tls {
                    Box::new(crate::serve_tls::connect(mqtts, &cfg))
                } else {
                    let s = TcpStream::connect(mqtt).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
                    Box::new(s)
                }
            };
            let what = format!("{version:?} tls {over_tls}");
            let mut c = Client::over(open(), version);
            let present = connect_and_subscribe(&mut c, version, &id, &topic);
            assert!(!present, "{what}");
            assert_eq!(c.next(), Some(Got::Suback(1, vec![1])), "{what}");
            drop(c);
            round += 1;
            server.wait_metric("throng_mqtt_sessions_parked", |v| v == f64::from(round));
            publish_ok(server.addr, &topic, b"queued", None);
            server.wait_metric("throng_mqtt_session_messages", |v| v == 1.0);

            let mut c = Client::over(open(), version);
            let present = connect_and_subscribe(&mut c, version, &id, &topic);
            assert!(present, "{what}");
            let mut got = [packet(&mut c), packet(&mut c)];
            got.sort();
            assert_eq!(got[0].0, "SUBACK", "{what}: {got:?}");
            assert_eq!(got[1].0, "publish queued qos 1 dup 0", "{what}: {got:?}");
            // Acknowledged, so the session parks again with nothing queued.
            c.send(&ack(Packet::Puback, got[1].1));
            c.send(&Packet::Pingreq);
            assert_eq!(packet(&mut c).0, "PINGRESP", "{what}");
            drop(c);
            server.wait_metric("throng_mqtt_sessions_parked", |v| v == f64::from(round));
        }
    }
    assert_eq!(server.metric("throng_worker_restarts_total"), 0.0);
}

/// A stream either plain or TLS.
trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Sends CONNECT (resuming: clean 0, 5.0 with a 10 minute Session Expiry
/// Interval) and a QoS 1 SUBSCRIBE to `topic` in one write; reads the
/// first packet, which must be a successful CONNACK: its session present.
fn connect_and_subscribe<S: Read + Write>(
    c: &mut Client<S>,
    version: Version,
    id: &str,
    topic: &str,
) -> bool {
    let props = expiry_props(600);
    let properties = if version == Version::V5 {
        props.properties()
    } else {
        Properties::EMPTY
    };
    c.send_all(&[
        Packet::Connect(Connect {
            clean_start: false,
            keep_alive: 60,
            properties,
            client_id: id,
            will: None,
            username: None,
            password: None,
        }),
        Packet::Subscribe(Subscribe {
            packet_id: PacketId::MIN,
            properties: Properties::EMPTY,
            filters: vec![(topic, SubscriptionOptions::qos(QoS::AtLeastOnce))],
        }),
    ]);
    match c.next() {
        Some(Got::Connack {
            session_present,
            code: 0,
            ..
        }) => session_present,
        other => panic!("the first packet must be a successful CONNACK: {other:?}"),
    }
}
