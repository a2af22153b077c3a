//! QoS 1 deliveries from `throng serve --mqtt-listen`: real sockets, the
//! clients of `mqtt_listen` (the proto crate's codec in the client role).
//! A subscription is granted the QoS it asked; a delivery goes at
//! the lower of its subscription's QoS and its publish's (HTTP: 1), waits
//! for its PUBACK within the subscriber's receive maximum, and a subscriber
//! that never acknowledges is a slow consumer.

use std::net::SocketAddr;
use std::time::Duration;

use throng_proto::mqtt::{
    Ack, Delivery, Packet, Properties, Property, QoS, ReasonCode, Subscribe, SubscriptionOptions,
    Version,
};
use throng_testkit::Server;
use throng_testkit::http::publish;

use crate::mqtt_listen::{Client, Got, mqtt_server, open_with};

/// What a test keeps of a packet: a PUBLISH's packet id (none at QoS 0)
/// and payload, a DISCONNECT's reason code, or anything else's name.
#[derive(Debug, PartialEq, Eq)]
enum Delivered {
    Publish(Option<u16>, String),
    Disconnect(u8),
    Other(&'static str),
}

/// Connects as `version` with CONNECT properties `props`; CONNACK checked.
fn connect(addr: SocketAddr, version: Version, id: &str, props: &[Property<'_>]) -> Client {
    let mut c = open_with(addr, version, id, props);
    let got = c.next();
    assert!(matches!(got, Some(Got::Connack { code: 0, .. })), "{got:?}");
    c
}

/// Subscribes to `filters` at `qos`; returns SUBACK's codes.
fn subscribe(c: &mut Client, id: u16, filters: &[&str], qos: QoS) -> Vec<u8> {
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: id.try_into().unwrap(),
        properties: Properties::EMPTY,
        filters: filters
            .iter()
            .map(|f| (*f, SubscriptionOptions::qos(qos)))
            .collect(),
    }));
    match c.next() {
        Some(Got::Suback(got, codes)) if got == id => codes,
        other => panic!("expected SUBACK {id}, got {other:?}"),
    }
}

/// The next packet; `None` when the server closed the connection.
fn next(c: &mut Client) -> Option<Delivered> {
    c.next_as(|p| match p {
        Packet::Publish(p) => Delivered::Publish(
            p.delivery.packet_id().map(|id| id.get()),
            String::from_utf8_lossy(p.payload).into_owned(),
        ),
        Packet::Disconnect(d) => Delivered::Disconnect(d.reason.0),
        other => Delivered::Other(other.packet_type().name()),
    })
}

/// The next packet, which must be a QoS 1 PUBLISH of `payload`: its id.
fn qos1(c: &mut Client, payload: &str) -> u16 {
    match next(c) {
        Some(Delivered::Publish(Some(id), got)) if got == payload => id,
        other => panic!("expected {payload:?} at QoS 1, got {other:?}"),
    }
}

fn puback(c: &mut Client, id: u16) {
    c.send(&Packet::Puback(Ack {
        packet_id: id.try_into().unwrap(),
        reason: ReasonCode::SUCCESS,
        properties: Properties::EMPTY,
    }));
}

fn post(s: &Server, channel: &str, body: &str) {
    let (status, answer) = publish(s.addr, channel, body.as_bytes(), None);
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn qos_1_deliveries_go_at_the_lower_qos_and_wait_for_their_puback() {
    let (s, addr) = mqtt_server(&["--workers", "1"]);
    let mut v5 = connect(addr, Version::V5, "v5", &[]);
    let mut v3 = connect(addr, Version::V311, "v3", &[]);
    let mut zero = connect(addr, Version::V5, "zero", &[]);
    assert_eq!(subscribe(&mut v5, 1, &["q/a"], QoS::AtLeastOnce), [1]);
    // 3.1.1 too; QoS 2 is granted 2, and HTTP's QoS 1 goes at 1.
    assert_eq!(subscribe(&mut v3, 1, &["q/a"], QoS::ExactlyOnce), [2]);
    assert_eq!(subscribe(&mut zero, 1, &["q/a"], QoS::AtMostOnce), [0]);

    // HTTP publishes are QoS 1 to whoever asked for it.
    post(&s, "q/a", "one");
    let (a, b) = (qos1(&mut v5, "one"), qos1(&mut v3, "one"));
    assert_eq!(
        next(&mut zero),
        Some(Delivered::Publish(None, "one".into()))
    );
    s.wait_metric("throng_mqtt_inflight", |v| v == 2.0);
    puback(&mut v5, a);
    puback(&mut v3, b);
    s.wait_metric("throng_mqtt_inflight", |v| v == 0.0);
    assert_eq!(s.metric("throng_mqtt_acked_total"), 2.0);

    // An MQTT publish goes at its own QoS: 0 stays 0, 1 is 1.
    let mut publisher = connect(addr, Version::V5, "publisher", &[]);
    publisher.publish("q/a", b"two", Delivery::AtMostOnce);
    assert_eq!(next(&mut v5), Some(Delivered::Publish(None, "two".into())));
    assert_eq!(next(&mut v3), Some(Delivered::Publish(None, "two".into())));
    publisher.publish(
        "q/a",
        b"three",
        Delivery::AtLeastOnce(9.try_into().unwrap()),
    );
    assert_eq!(publisher.next(), Some(Got::Puback(9, 0)));
    let c = qos1(&mut v5, "three");
    puback(&mut v5, c);
    let id = qos1(&mut v3, "three");
    puback(&mut v3, id);
    assert_eq!(
        next(&mut zero),
        Some(Delivered::Publish(None, "two".into()))
    );
    assert_eq!(
        next(&mut zero),
        Some(Delivered::Publish(None, "three".into()))
    );

    // Two matching subscriptions: one message, at the higher QoS, whichever
    // comes first.
    assert_eq!(subscribe(&mut zero, 2, &["q/+"], QoS::AtLeastOnce), [1]);
    assert_eq!(subscribe(&mut v5, 2, &["q/#"], QoS::AtMostOnce), [0]);
    post(&s, "q/a", "four");
    let d = qos1(&mut zero, "four");
    let e = qos1(&mut v5, "four");
    puback(&mut zero, d);
    puback(&mut v5, e);
    let id = qos1(&mut v3, "four");
    puback(&mut v3, id);
    s.wait_metric("throng_mqtt_inflight", |v| v == 0.0);
    zero.quiet(Duration::from_millis(300));
    v5.quiet(Duration::from_millis(100));
    assert_eq!(s.metric("throng_mqtt_acked_total"), 7.0);
}

#[test]
fn the_receive_maximum_holds_deliveries_until_a_puback_frees_a_slot() {
    let (s, addr) = mqtt_server(&["--workers", "1"]);
    let mut c = connect(addr, Version::V5, "two", &[Property::ReceiveMaximum(2)]);
    assert_eq!(subscribe(&mut c, 1, &["r"], QoS::AtLeastOnce), [1]);
    for m in ["m1", "m2", "m3", "m4", "m5"] {
        post(&s, "r", m);
    }
    let first = [qos1(&mut c, "m1"), qos1(&mut c, "m2")];
    c.quiet(Duration::from_millis(300));
    s.wait_metric("throng_mqtt_inflight", |v| v == 2.0);
    assert_eq!(s.metric("throng_mqtt_inflight_waiting"), 3.0);
    // The second acknowledged first: its slot goes to the next in order.
    puback(&mut c, first[1]);
    let third = qos1(&mut c, "m3");
    c.quiet(Duration::from_millis(300));
    puback(&mut c, first[0]);
    puback(&mut c, third);
    let rest = [qos1(&mut c, "m4"), qos1(&mut c, "m5")];
    s.wait_metric("throng_mqtt_inflight_waiting", |v| v == 0.0);
    for id in rest {
        puback(&mut c, id);
    }
    s.wait_metric("throng_mqtt_inflight", |v| v == 0.0);
    assert_eq!(s.metric("throng_mqtt_acked_total"), 5.0);
}

#[test]
fn a_subscriber_that_never_acknowledges_is_closed_as_a_slow_consumer() {
    let (s, addr) = mqtt_server(&["--workers", "1", "--max-queue", "4KiB"]);
    // Over --max-queue: 5.0 is told why (DISCONNECT 0x97, quota exceeded),
    // while one that acknowledges each delivery stays.
    let mut silent = connect(addr, Version::V5, "silent", &[]);
    let mut acking = connect(addr, Version::V5, "acking", &[]);
    for c in [&mut silent, &mut acking] {
        assert_eq!(subscribe(c, 1, &["slow"], QoS::AtLeastOnce), [1]);
    }
    let body = "x".repeat(300);
    let mut got = 0;
    for _ in 0..30 {
        post(&s, "slow", &body);
        let id = qos1(&mut acking, &body);
        puback(&mut acking, id);
    }
    let end = loop {
        match next(&mut silent) {
            Some(Delivered::Publish(Some(_), _)) => got += 1,
            other => break other,
        }
    };
    assert!(
        (10..=14).contains(&got),
        "{got} deliveries before the close"
    );
    assert_eq!(end, Some(Delivered::Disconnect(0x97)), "quota exceeded");
    assert_eq!(next(&mut silent), None, "closed after it");
    s.wait_metric("throng_slow_consumer_closes_total{cause=\"queue\"}", |v| {
        v == 1.0
    });
    // The acking one is still served, and nothing is in flight.
    post(&s, "slow", "still here");
    let id = qos1(&mut acking, "still here");
    puback(&mut acking, id);
    s.wait_metric("throng_mqtt_inflight", |v| v == 0.0);

    // No PUBACK within --write-timeout: a 3.1.1 subscriber is closed (it
    // has no word for why), while one that acknowledges stays.
    let (s, addr) = mqtt_server(&["--workers", "1", "--write-timeout", "1s"]);
    let mut acking = connect(addr, Version::V311, "acking", &[]);
    assert_eq!(subscribe(&mut acking, 1, &["late"], QoS::AtLeastOnce), [1]);
    let mut late = connect(addr, Version::V311, "late", &[]);
    assert_eq!(subscribe(&mut late, 1, &["late"], QoS::AtLeastOnce), [1]);
    post(&s, "late", "ack me");
    let id = qos1(&mut acking, "ack me");
    puback(&mut acking, id);
    qos1(&mut late, "ack me");
    assert_eq!(next(&mut late), None, "closed without a PUBACK");
    s.wait_metric(
        "throng_slow_consumer_closes_total{cause=\"timeout\"}",
        |v| v == 1.0,
    );
    s.wait_metric("throng_mqtt_inflight", |v| v == 0.0);
    post(&s, "late", "still here");
    let id = qos1(&mut acking, "still here");
    puback(&mut acking, id);
}

#[test]
fn a_puback_for_no_delivery_is_counted_and_the_connection_goes_on() {
    let (s, addr) = mqtt_server(&["--workers", "1"]);
    for version in [Version::V5, Version::V311] {
        let mut c = connect(addr, version, "acks", &[]);
        assert_eq!(subscribe(&mut c, 1, &["p"], QoS::AtLeastOnce), [1]);
        puback(&mut c, 77);
        c.send(&Packet::Pingreq);
        assert_eq!(c.next(), Some(Got::Pingresp), "{version:?}");
        post(&s, "p", "real");
        let id = qos1(&mut c, "real");
        puback(&mut c, id);
        // Twice: the second is for an id no longer in flight.
        puback(&mut c, id);
        c.send(&Packet::Pingreq);
        assert_eq!(c.next(), Some(Got::Pingresp), "{version:?}");
    }
    s.wait_metric("throng_mqtt_refused_total{kind=\"unknown_puback\"}", |v| {
        v == 4.0
    });
    assert_eq!(s.metric("throng_mqtt_acked_total"), 2.0);
}

/// Sends PUBREL `id` (a QoS 2 exchange's second half).
fn pubrel(c: &mut Client, id: u16) {
    c.send(&Packet::Pubrel(Ack {
        packet_id: id.try_into().unwrap(),
        reason: ReasonCode::SUCCESS,
        properties: Properties::EMPTY,
    }));
}

/// The next packet's type, packet id and reason code (an acknowledgement).
fn ack(c: &mut Client) -> Option<(&'static str, u16, u8)> {
    c.next_as(|p| match p {
        Packet::Puback(a) => ("PUBACK", a.packet_id.get(), a.reason.0),
        Packet::Pubrec(a) => ("PUBREC", a.packet_id.get(), a.reason.0),
        Packet::Pubrel(a) => ("PUBREL", a.packet_id.get(), a.reason.0),
        Packet::Pubcomp(a) => ("PUBCOMP", a.packet_id.get(), a.reason.0),
        Packet::Disconnect(d) => ("disconnect", 0, d.reason.0),
        other => (other.packet_type().name(), 0, 0),
    })
}

#[test]
fn a_qos_2_publish_is_received_once_until_its_pubrel_however_often_it_comes() {
    let (s, addr) = mqtt_server(&["--workers", "2"]);
    for version in [Version::V5, Version::V311] {
        let mut sub = connect(addr, Version::V5, "sub", &[]);
        assert_eq!(subscribe(&mut sub, 1, &["q2/a"], QoS::AtMostOnce), [0]);
        let mut p = connect(addr, version, "q2-publisher", &[]);
        let q2 = Delivery::ExactlyOnce(5.try_into().unwrap());
        p.publish("q2/a", b"once", q2);
        assert_eq!(ack(&mut p), Some(("PUBREC", 5, 0)), "{version:?}");
        // The client did not see the PUBREC, say: the same PUBLISH again.
        p.publish("q2/a", b"once", q2);
        assert_eq!(ack(&mut p), Some(("PUBREC", 5, 0)), "{version:?}");
        pubrel(&mut p, 5);
        assert_eq!(ack(&mut p), Some(("PUBCOMP", 5, 0)), "{version:?}");
        assert_eq!(
            next(&mut sub),
            Some(Delivered::Publish(None, "once".into()))
        );
        sub.quiet(Duration::from_millis(300));
        // A PUBREL for an id nobody has: 5.0 says so.
        pubrel(&mut p, 6);
        let unknown = if version == Version::V5 { 0x92 } else { 0 };
        assert_eq!(ack(&mut p), Some(("PUBCOMP", 6, unknown)), "{version:?}");
        // The same id again after PUBCOMP is a new message.
        p.publish("q2/a", b"twice", q2);
        assert_eq!(ack(&mut p), Some(("PUBREC", 5, 0)), "{version:?}");
        pubrel(&mut p, 5);
        assert_eq!(ack(&mut p), Some(("PUBCOMP", 5, 0)), "{version:?}");
        assert_eq!(
            next(&mut sub),
            Some(Delivered::Publish(None, "twice".into()))
        );
    }
    s.wait_metric("throng_mqtt_refused_total{kind=\"unknown_pubrel\"}", |v| {
        v == 2.0
    });
}

#[test]
fn a_publish_over_max_message_is_refused_as_http_refuses_it() {
    let (s, addr) = mqtt_server(&["--max-message", "1KiB"]);
    let mut sub = connect(addr, Version::V5, "sub", &[]);
    assert_eq!(subscribe(&mut sub, 1, &["big"], QoS::AtMostOnce), [0]);
    let big = vec![b'x'; 1025];
    let mut v5 = connect(addr, Version::V5, "v5", &[]);
    v5.publish("big", &big, Delivery::AtLeastOnce(1.try_into().unwrap()));
    assert_eq!(ack(&mut v5), Some(("disconnect", 0, 0x95)));
    assert_eq!(ack(&mut v5), None);
    let mut v3 = connect(addr, Version::V311, "v3", &[]);
    v3.publish("big", &big, Delivery::AtLeastOnce(1.try_into().unwrap()));
    assert_eq!(ack(&mut v3), None, "3.1.1: closed, no PUBACK");
    sub.quiet(Duration::from_millis(300));
    let (status, _) = publish(s.addr, "big", &big, None);
    assert_eq!(status, 413);
    s.wait_metric("throng_mqtt_refused_total{kind=\"too_large\"}", |v| {
        v == 2.0
    });
}

#[test]
fn with_redis_down_a_publish_is_refused_never_acknowledged() {
    use throng_testkit::redis::Redis;
    use throng_testkit::{Peer, require};
    require!(Peer::RedisServer, Peer::RedisCli);
    let mut redis = Redis::start(&[], &[]);
    let (s, addr) = mqtt_server(&["--redis", &redis.url()]);
    s.wait_broker("up");
    let mut v5 = connect(addr, Version::V5, "v5", &[]);
    v5.publish("r/a", b"kept", Delivery::AtLeastOnce(1.try_into().unwrap()));
    assert_eq!(ack(&mut v5), Some(("PUBACK", 1, 0)), "Redis took it");
    v5.publish("r/a", b"kept", Delivery::ExactlyOnce(2.try_into().unwrap()));
    assert_eq!(ack(&mut v5), Some(("PUBREC", 2, 0)), "Redis took it");
    redis.stop();
    s.wait_broker("down");
    v5.publish("r/a", b"lost", Delivery::AtLeastOnce(3.try_into().unwrap()));
    assert_eq!(ack(&mut v5), Some(("PUBACK", 3, 0x80)));
    v5.publish("r/a", b"lost", Delivery::ExactlyOnce(4.try_into().unwrap()));
    assert_eq!(ack(&mut v5), Some(("PUBREC", 4, 0x80)));
    let mut v3 = connect(addr, Version::V311, "v3", &[]);
    v3.publish("r/a", b"lost", Delivery::AtLeastOnce(1.try_into().unwrap()));
    assert_eq!(ack(&mut v3), None, "3.1.1: closed, never a PUBACK");
    s.wait_metric("throng_mqtt_refused_total{kind=\"publish_failed\"}", |v| {
        v == 3.0
    });
}

#[test]
fn qos_2_deliveries_go_to_who_asked_and_hold_their_slot_until_pubcomp() {
    let (s, addr) = mqtt_server(&["--workers", "1"]);
    let props = [Property::ReceiveMaximum(1)];
    let mut two = connect(addr, Version::V5, "two", &props);
    let mut one = connect(addr, Version::V311, "one", &[]);
    assert_eq!(subscribe(&mut two, 1, &["q2/+"], QoS::ExactlyOnce), [2]);
    assert_eq!(subscribe(&mut one, 1, &["q2/b"], QoS::AtLeastOnce), [1]);
    let mut p = connect(addr, Version::V5, "publisher", &[]);
    for (n, body) in [(1u16, "first"), (2, "second")] {
        p.publish(
            "q2/b",
            body.as_bytes(),
            Delivery::ExactlyOnce(n.try_into().unwrap()),
        );
        assert_eq!(ack(&mut p), Some(("PUBREC", n, 0)));
        pubrel(&mut p, n);
        assert_eq!(ack(&mut p), Some(("PUBCOMP", n, 0)));
    }
    // The QoS 1 subscriber gets both at 1.
    for body in ["first", "second"] {
        let id = qos1(&mut one, body);
        puback(&mut one, id);
    }
    // The QoS 2 one: the first at 2; the second waits for its slot (receive
    // maximum 1), which PUBREC does not free and PUBCOMP does.
    let first = two.next_as(|p| match p {
        Packet::Publish(p) => (p.delivery, String::from_utf8_lossy(p.payload).into_owned()),
        other => panic!("expected a PUBLISH, got {other:?}"),
    });
    let Some((Delivery::ExactlyOnce(id), body)) = first else {
        panic!("expected QoS 2, got {first:?}");
    };
    assert_eq!(body, "first");
    two.send(&Packet::Pubrec(Ack {
        packet_id: id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::EMPTY,
    }));
    assert_eq!(ack(&mut two), Some(("PUBREL", id.get(), 0)));
    two.quiet(Duration::from_millis(300));
    two.send(&Packet::Pubcomp(Ack {
        packet_id: id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::EMPTY,
    }));
    let second = two.next_as(|p| match p {
        Packet::Publish(p) => (
            p.delivery.qos(),
            String::from_utf8_lossy(p.payload).into_owned(),
        ),
        other => panic!("expected a PUBLISH, got {other:?}"),
    });
    assert_eq!(second, Some((QoS::ExactlyOnce, "second".to_owned())));
    s.wait_metric("throng_mqtt_inflight", |v| v == 1.0);
    // A PUBCOMP for an id not in flight is counted and changes nothing.
    two.send(&Packet::Pubcomp(Ack {
        packet_id: 999.try_into().unwrap(),
        reason: ReasonCode::SUCCESS,
        properties: Properties::EMPTY,
    }));
    s.wait_metric("throng_mqtt_refused_total{kind=\"unknown_pubcomp\"}", |v| {
        v == 1.0
    });
    assert_eq!(s.metric("throng_mqtt_inflight"), 1.0);
}

#[test]
fn no_local_and_retain_as_published_are_kept_per_subscription() {
    use throng_proto::mqtt::{Publish, RetainHandling};
    let (_s, addr) = mqtt_server(&["--workers", "2"]);
    let mut me = connect(addr, Version::V5, "me", &[]);
    let options = SubscriptionOptions {
        qos: QoS::AtMostOnce,
        no_local: true,
        retain_as_published: true,
        retain_handling: RetainHandling::Never,
    };
    me.send(&Packet::Subscribe(Subscribe {
        packet_id: 1.try_into().unwrap(),
        properties: Properties::EMPTY,
        filters: vec![("opts/a", options)],
    }));
    assert_eq!(me.next(), Some(Got::Suback(1, vec![0])));
    let mut other = connect(addr, Version::V5, "other", &[]);
    assert_eq!(subscribe(&mut other, 1, &["opts/a"], QoS::AtMostOnce), [0]);
    // Its own message does not come back to it; others get it.
    me.publish("opts/a", b"mine", Delivery::AtMostOnce);
    assert_eq!(
        next(&mut other),
        Some(Delivered::Publish(None, "mine".into()))
    );
    me.quiet(Duration::from_millis(300));
    // Another's retained message: the retain flag as published for "me",
    // cleared for "other".
    let retain = |c: &mut Client| {
        c.next_as(|p| match p {
            Packet::Publish(p) => (p.retain, String::from_utf8_lossy(p.payload).into_owned()),
            other => panic!("expected a PUBLISH, got {other:?}"),
        })
    };
    other.send(&Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::AtMostOnce,
        retain: true,
        topic: "opts/a",
        properties: Properties::EMPTY,
        payload: b"kept",
    }));
    assert_eq!(retain(&mut me), Some((true, "kept".to_owned())));
    assert_eq!(retain(&mut other), Some((false, "kept".to_owned())));
}
