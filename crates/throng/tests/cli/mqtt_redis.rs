//! MQTT between nodes through a real Redis: what a publish carries (QoS,
//! retain flag, 5.0 properties, its publisher for No Local) reaches a
//! subscriber on another node as it reaches one on the publisher's node.

use std::net::SocketAddr;

use throng_proto::mqtt::{
    Ack, Delivery, Packet, Properties, PropertiesBuf, Property, Publish, QoS, ReasonCode,
    RetainHandling, Subscribe, SubscriptionOptions, Version,
};
use throng_testkit::redis::Redis;
use throng_testkit::{Peer, Server, require};

use crate::mqtt_listen::{Client, Got, mqtt_server};

/// A PUBLISH as a test compares it: QoS, retain flag, payload, and its
/// properties (the message expiry apart, as it counts down).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    qos: u8,
    id: Option<u16>,
    retain: bool,
    payload: String,
    properties: Vec<String>,
    expiry: Option<u32>,
}

fn seen(c: &mut Client) -> Seen {
    let got = c.next_as(|p| match p {
        Packet::Publish(p) => Some(Seen {
            qos: p.delivery.qos() as u8,
            id: p.delivery.packet_id().map(|id| id.get()),
            retain: p.retain,
            payload: String::from_utf8_lossy(p.payload).into_owned(),
            properties: p
                .properties
                .iter()
                .filter(|p| !matches!(p, Property::MessageExpiryInterval(_)))
                .map(|p| format!("{p:?}"))
                .collect(),
            expiry: p.properties.iter().find_map(|p| match p {
                Property::MessageExpiryInterval(s) => Some(s),
                _ => None,
            }),
        }),
        _ => None,
    });
    got.flatten().expect("a PUBLISH")
}

/// Two nodes on one Redis (pattern mode: each has every channel once up).
fn two_nodes(redis: &Redis) -> ((Server, SocketAddr), (Server, SocketAddr)) {
    let url = redis.url();
    let args = ["--redis", &url, "--workers", "1"];
    let (a, b) = (mqtt_server(&args), mqtt_server(&args));
    a.0.wait_broker("up");
    b.0.wait_broker("up");
    (a, b)
}

fn subscribe(c: &mut Client, filter: &str, options: SubscriptionOptions) {
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: 1.try_into().unwrap(),
        properties: Properties::EMPTY,
        filters: vec![(filter, options)],
    }));
    let granted = options.qos as u8;
    assert_eq!(c.next(), Some(Got::Suback(1, vec![granted])));
}

fn options(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions {
        qos,
        no_local: false,
        retain_as_published: false,
        retain_handling: RetainHandling::OnSubscribe,
    }
}

fn ack(kind: fn(Ack<'static>) -> Packet<'static>, id: u16) -> Packet<'static> {
    kind(Ack {
        packet_id: id.try_into().unwrap(),
        reason: ReasonCode::SUCCESS,
        properties: Properties::EMPTY,
    })
}

/// Publishes and finishes the publisher's side of its QoS.
fn publish(c: &mut Client, delivery: Delivery, retain: bool, props: &PropertiesBuf, body: &str) {
    c.send(&Packet::Publish(Publish {
        dup: false,
        delivery,
        retain,
        topic: "r/x",
        properties: props.properties(),
        payload: body.as_bytes(),
    }));
    match delivery {
        Delivery::AtMostOnce => {}
        Delivery::AtLeastOnce(id) => assert_eq!(c.next(), Some(Got::Puback(id.get(), 0))),
        Delivery::ExactlyOnce(id) => {
            let rec = c.next_as(|p| format!("{p:?}"));
            assert!(
                rec.as_deref().is_some_and(|r| r.starts_with("Pubrec")),
                "{rec:?}"
            );
            c.send(&ack(Packet::Pubrel, id.get()));
            let comp = c.next_as(|p| matches!(p, Packet::Pubcomp(a) if a.packet_id == id));
            assert_eq!(comp, Some(true), "PUBCOMP {id:?}");
        }
    }
}

fn props(list: &[Property<'_>]) -> PropertiesBuf {
    let mut b = PropertiesBuf::new();
    for p in list {
        b.push(*p).unwrap();
    }
    b
}

#[test]
fn through_redis_a_publish_keeps_its_qos_retain_flag_properties_and_publisher() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let ((a, mqtt_a), (_b, mqtt_b)) = two_nodes(&redis);
    let mut sub = Client::connect(mqtt_b, Version::V5, "sub-b");
    subscribe(
        &mut sub,
        "r/x",
        SubscriptionOptions {
            retain_as_published: true,
            ..options(QoS::ExactlyOnce)
        },
    );
    let mut me = Client::connect(mqtt_a, Version::V5, "me-a");
    subscribe(
        &mut me,
        "r/x",
        SubscriptionOptions {
            no_local: true,
            ..options(QoS::ExactlyOnce)
        },
    );
    let full = [
        Property::PayloadFormatIndicator(1),
        Property::MessageExpiryInterval(100),
        Property::ContentType("text/plain"),
        Property::ResponseTopic("r/reply"),
        Property::CorrelationData(b"c-1"),
        Property::UserProperty("k", "v"),
        Property::UserProperty("k", "w"),
    ];
    let expected: Vec<String> = full
        .iter()
        .filter(|p| !matches!(p, Property::MessageExpiryInterval(_)))
        .map(|p| format!("{p:?}"))
        .collect();
    // QoS 0 with every property a subscriber sees: on B as sent.
    publish(&mut me, Delivery::AtMostOnce, false, &props(&full), "p0");
    let got = seen(&mut sub);
    assert!(
        got.expiry.is_some_and(|s| (90..=100).contains(&s)),
        "{got:?}"
    );
    assert_eq!(
        (got.qos, got.id, got.retain, got.payload.as_str()),
        (0, None, false, "p0")
    );
    assert_eq!(got.properties, expected);
    // QoS 2 stays 2: B's subscriber finishes it with PUBREC and PUBCOMP.
    let id = 1.try_into().unwrap();
    publish(&mut me, Delivery::ExactlyOnce(id), false, &props(&[]), "p2");
    let got = seen(&mut sub);
    assert_eq!((got.qos, got.payload.as_str()), (2, "p2"), "{got:?}");
    let delivered = got.id.expect("a QoS 2 delivery's id");
    sub.send(&ack(Packet::Pubrec, delivered));
    let rel = sub.next_as(|p| matches!(p, Packet::Pubrel(a) if a.packet_id.get() == delivered));
    assert_eq!(rel, Some(true));
    sub.send(&ack(Packet::Pubcomp, delivered));
    // Retained at QoS 1: Retain As Published keeps the flag on B.
    let kept = [Property::UserProperty("kept", "yes")];
    let id = 2.try_into().unwrap();
    publish(
        &mut me,
        Delivery::AtLeastOnce(id),
        true,
        &props(&kept),
        "p1",
    );
    let got = seen(&mut sub);
    assert_eq!(
        (got.qos, got.retain, got.payload.as_str()),
        (1, true, "p1"),
        "{got:?}"
    );
    sub.send(&ack(Packet::Puback, got.id.unwrap()));
    // An HTTP publish on A goes bare: QoS 1, no properties. It is the
    // first thing A's own subscriber gets, so none of its own messages
    // came back to it through Redis (No Local).
    let (status, body) = throng_testkit::http::publish(a.addr, "r/x", b"http", None);
    assert_eq!(status, 200, "{body}");
    let got = seen(&mut me);
    assert_eq!(
        (got.qos, got.payload.as_str(), got.properties.len()),
        (1, "http", 0),
        "{got:?}"
    );
    let got = seen(&mut sub);
    assert_eq!((got.qos, got.payload.as_str()), (1, "http"), "{got:?}");
    // A late subscriber on B reads the retained message from Redis with
    // its properties.
    let mut late = Client::connect(mqtt_b, Version::V5, "late-b");
    subscribe(&mut late, "r/x", options(QoS::ExactlyOnce));
    let got = seen(&mut late);
    assert_eq!(
        (got.qos, got.retain, got.payload.as_str()),
        (1, true, "p1"),
        "{got:?}"
    );
    assert_eq!(got.properties, [format!("{:?}", kept[0])]);
}

#[test]
fn with_history_in_redis_a_sealed_publish_is_read_back_as_its_payload() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let args = ["--redis", &url, "--history", "10", "--redis-prefix", "hx:"];
    let ((a, mqtt_a), (b, _)) = (mqtt_server(&args), mqtt_server(&args));
    a.wait_broker("up");
    b.wait_broker("up");
    let mut ws = throng_testkit::ws::subscribe(b.addr, "h/x");
    let mut me = Client::connect(mqtt_a, Version::V5, "pub-a");
    let user = [Property::UserProperty("k", "v")];
    me.send(&Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::AtMostOnce,
        retain: false,
        topic: "h/x",
        properties: props(&user).properties(),
        payload: b"h1",
    }));
    // Live on B's WebSocket, and from the stream in B's history: the
    // payload alone, not the seal.
    assert_eq!(throng_testkit::ws::next_text(&mut ws), "h1");
    let (status, body) = throng_testkit::http::get(b.addr, "/api/history/h/x");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["messages"][0]["data"], "h1", "{v}");
    // Redis keeps it sealed (so a node reading it gets the properties).
    let kept = redis.cli(&["XRANGE", "hx:h/x", "-", "+"]);
    assert!(kept.iter().any(|f| f.contains("throng-mqtt")), "{kept:?}");
}

#[test]
fn a_client_id_connecting_to_another_node_takes_it_over_there() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let ((a, mqtt_a), (b, mqtt_b)) = two_nodes(&redis);
    let mut first = Client::connect(mqtt_a, Version::V5, "roamer");
    let mut second = Client::connect(mqtt_b, Version::V5, "roamer");
    // MQTT-3.1.4-2 across nodes: A closes its connection, 5.0's 0x8E.
    assert_eq!(first.next(), Some(Got::Disconnect(0x8E)));
    assert_eq!(first.next(), None);
    a.wait_metric(
        "throng_connections_closed_total{reason=\"taken_over\"}",
        |v| v == 1.0,
    );
    // B's own claim came back to it through Redis and closed nothing.
    second.send(&Packet::Pingreq);
    assert_eq!(second.next(), Some(Got::Pingresp));
    // And back to A: B's is closed in turn, A's new one stays.
    let mut third = Client::connect(mqtt_a, Version::V5, "roamer");
    assert_eq!(second.next(), Some(Got::Disconnect(0x8E)));
    third.send(&Packet::Pingreq);
    assert_eq!(third.next(), Some(Got::Pingresp));
    assert!(
        b.metric("throng_connections_closed_total{reason=\"taken_over\"}") == 1.0,
        "{}",
        b.log()
    );
}
