//! The MQTT codec against implementations it shares no code with: packets
//! written by mqttbytes (rumqtt's codec) decode here with the same fields,
//! and ours decode there; and the bytes Mosquitto 2.0.11 and its
//! `mosquitto_pub` / `mosquitto_sub` exchanged (recorded through a relay, see
//! `capture_mosquitto.py` beside this file) decode in both roles to what
//! the clients asked for.

use bytes::{Bytes, BytesMut};
use mqttbytes::{v4, v5};
use proptest::collection::vec;
use proptest::prelude::*;
use throng_proto::mqtt::{
    Ack, Connack, Connect, Decoder, Delivery, Packet, PacketId, Properties, PropertiesBuf,
    Property, Publish, QoS, ReasonCode, RetainHandling, Suback, Subscribe, SubscriptionOptions,
    Unsubscribe, Version, Will,
};

fn their_qos(q: QoS) -> mqttbytes::QoS {
    match q {
        QoS::AtMostOnce => mqttbytes::QoS::AtMostOnce,
        QoS::AtLeastOnce => mqttbytes::QoS::AtLeastOnce,
        QoS::ExactlyOnce => mqttbytes::QoS::ExactlyOnce,
    }
}

fn delivery(q: QoS, id: u16) -> Delivery {
    let id = PacketId::new(id).expect("generated from 1");
    match q {
        QoS::AtMostOnce => Delivery::AtMostOnce,
        QoS::AtLeastOnce => Delivery::AtLeastOnce(id),
        QoS::ExactlyOnce => Delivery::ExactlyOnce(id),
    }
}

fn encode(p: &Packet<'_>, version: Version) -> BytesMut {
    let mut out = BytesMut::new();
    p.encode(version, &mut out).expect("fits");
    out
}

/// A decoder for `version` past its first packet: a server's after a
/// CONNECT, a client's after a CONNACK.
fn connected(server: bool, version: Version) -> Decoder {
    let (mut dec, first) = if server {
        let c = Packet::Connect(Connect {
            clean_start: true,
            keep_alive: 0,
            properties: Properties::EMPTY,
            client_id: "c",
            will: None,
            username: None,
            password: None,
        });
        (Decoder::server(1 << 20), encode(&c, version))
    } else {
        let c = Packet::Connack(Connack {
            session_present: false,
            code: ReasonCode::SUCCESS,
            properties: Properties::EMPTY,
        });
        (Decoder::client(version, 1 << 20), encode(&c, version))
    };
    dec.decode(&first).expect("valid").expect("whole");
    dec
}

/// Decodes exactly one packet filling `bytes`.
fn one<'a>(dec: &mut Decoder, bytes: &'a [u8]) -> Packet<'a> {
    let d = dec.decode(bytes).expect("valid").expect("whole");
    assert_eq!(d.consumed, bytes.len());
    d.packet
}

fn topic() -> impl Strategy<Value = String> {
    let level = prop_oneof!["[a-z0-9]{0,5}", "[é水$]{1,2}"];
    vec(level, 1..5)
        .prop_map(|l| l.join("/"))
        .prop_filter("empty", |t| !t.is_empty())
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn publishes_cross_both_ways_in_both_versions(
        topic in topic(),
        payload in vec(any::<u8>(), 0..2000),
        qos in qos(),
        id in 1u16..,
        retain in any::<bool>(),
        dup in any::<bool>(),
        expiry in proptest::option::of(any::<u32>()),
        user in proptest::option::of(("[a-z]{1,5}", "\\PC{0,5}")),
    ) {
        let dup = dup && qos != QoS::AtMostOnce;
        let mut props = PropertiesBuf::new();
        if let Some(e) = expiry {
            props.push(Property::MessageExpiryInterval(e)).unwrap();
        }
        if let Some((k, v)) = &user {
            props.push(Property::UserProperty(k, v)).unwrap();
        }
        for (version, props) in [(Version::V311, Properties::EMPTY), (Version::V5, props.properties())] {
            let ours = Publish {
                dup,
                delivery: delivery(qos, id),
                retain,
                topic: &topic,
                properties: props,
                payload: &payload,
            };
            let mut bytes = encode(&Packet::Publish(ours.clone()), version);
            let want_id = if qos == QoS::AtMostOnce { 0 } else { id };
            // Ours, read by mqttbytes.
            if version == Version::V311 {
                let v4::Packet::Publish(p) = v4::read(&mut bytes, 1 << 20).unwrap() else {
                    panic!("not a publish");
                };
                prop_assert_eq!((&p.topic, &p.payload[..], p.pkid), (&topic, &payload[..], want_id));
                prop_assert_eq!((p.qos, p.retain, p.dup), (their_qos(qos), retain, dup));
            } else {
                let v5::Packet::Publish(p) = v5::read(&mut bytes, 1 << 20).unwrap() else {
                    panic!("not a publish");
                };
                prop_assert_eq!((&p.topic, &p.payload[..], p.pkid), (&topic, &payload[..], want_id));
                prop_assert_eq!((p.qos, p.retain, p.dup), (their_qos(qos), retain, dup));
                // mqttbytes reads an empty list as none.
                let theirs = p.properties.map(|t| (t.message_expiry_interval, t.user_properties));
                let users: Vec<(String, String)> = user.iter().cloned().collect();
                prop_assert_eq!(theirs.unwrap_or_default(), (expiry, users));
            }
            // Theirs, read by ours, in both roles.
            let mut theirs = BytesMut::new();
            if version == Version::V311 {
                let mut p = v4::Publish::from_bytes(topic.clone(), their_qos(qos), Bytes::from(payload.clone()));
                (p.pkid, p.retain, p.dup) = (want_id, retain, dup);
                p.write(&mut theirs).unwrap();
            } else {
                let mut p = v5::Publish::from_bytes(topic.clone(), their_qos(qos), Bytes::from(payload.clone()));
                (p.pkid, p.retain, p.dup) = (want_id, retain, dup);
                p.properties = Some(v5::PublishProperties {
                    payload_format_indicator: None,
                    message_expiry_interval: expiry,
                    topic_alias: None,
                    response_topic: None,
                    correlation_data: None,
                    user_properties: user.iter().cloned().collect(),
                    subscription_identifiers: vec![],
                    content_type: None,
                });
                p.write(&mut theirs).unwrap();
            }
            for server in [true, false] {
                let mut dec = connected(server, version);
                let Packet::Publish(p) = one(&mut dec, &theirs) else {
                    panic!("not a publish");
                };
                prop_assert_eq!(p.topic, &topic[..]);
                prop_assert_eq!(p.payload, &payload[..]);
                prop_assert_eq!((p.delivery, p.retain, p.dup), (ours.delivery, retain, dup));
                prop_assert_eq!(p.properties.iter().collect::<Vec<_>>(), ours.properties.iter().collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn connects_cross_both_ways_in_both_versions(
        client_id in "[a-zA-Z0-9-]{1,23}",
        keep_alive in any::<u16>(),
        clean in any::<bool>(),
        will in proptest::option::of((topic(), vec(any::<u8>(), 0..40), qos(), any::<bool>())),
        // mqttbytes leaves an empty password out.
        login in proptest::option::of(("[a-z]{1,8}", "[ -~]{1,12}")),
        receive_maximum in proptest::option::of(1u16..),
    ) {
        let mut props = PropertiesBuf::new();
        if let Some(r) = receive_maximum {
            props.push(Property::ReceiveMaximum(r)).unwrap();
        }
        for version in [Version::V311, Version::V5] {
            let ours = Connect {
                clean_start: clean,
                keep_alive,
                properties: if version == Version::V5 { props.properties() } else { Properties::EMPTY },
                client_id: &client_id,
                will: will.as_ref().map(|(topic, payload, qos, retain)| Will {
                    qos: *qos,
                    retain: *retain,
                    properties: Properties::EMPTY,
                    topic,
                    payload,
                }),
                username: login.as_ref().map(|(u, _)| u.as_str()),
                password: login.as_ref().map(|(_, p)| p.as_bytes()),
            };
            let mut bytes = encode(&Packet::Connect(ours.clone()), version);
            // What mqttbytes reads, in its own words.
            let (id, ka, cs, their_will, their_login) = if version == Version::V311 {
                let v4::Packet::Connect(c) = v4::read(&mut bytes, 1 << 20).unwrap() else {
                    panic!("not a connect");
                };
                (c.client_id, c.keep_alive, c.clean_session,
                 c.last_will.map(|w| (w.topic, w.message.to_vec(), w.qos, w.retain)),
                 c.login.map(|l| (l.username, l.password)))
            } else {
                let v5::Packet::Connect(c) = v5::read(&mut bytes, 1 << 20).unwrap() else {
                    panic!("not a connect");
                };
                let r = c.properties.as_ref().and_then(|p| p.receive_maximum);
                prop_assert_eq!(r, receive_maximum);
                (c.client_id, c.keep_alive, c.clean_session,
                 c.last_will.map(|w| (w.topic, w.message.to_vec(), w.qos, w.retain)),
                 c.login.map(|l| (l.username, l.password)))
            };
            prop_assert_eq!((id.as_str(), ka, cs), (client_id.as_str(), keep_alive, clean));
            let want_will = will.as_ref().map(|(t, p, q, r)| (t.clone(), p.clone(), their_qos(*q), *r));
            prop_assert_eq!(their_will, want_will);
            prop_assert_eq!(their_login, login.clone());
            // mqttbytes's own CONNECT, read here.
            let mut theirs = BytesMut::new();
            if version == Version::V311 {
                let mut c = v4::Connect::new(client_id.clone());
                (c.keep_alive, c.clean_session) = (keep_alive, clean);
                c.last_will = will.as_ref().map(|(t, p, q, r)| v4::LastWill::new(t.clone(), p.clone(), their_qos(*q), *r));
                if let Some((u, p)) = &login {
                    c.set_login(u.clone(), p.clone());
                }
                c.write(&mut theirs).unwrap();
            } else {
                let mut c = v5::Connect::new(client_id.clone());
                (c.keep_alive, c.clean_session) = (keep_alive, clean);
                c.last_will = will.as_ref().map(|(t, p, q, r)| v5::LastWill::new(t.clone(), p.clone(), their_qos(*q), *r));
                if let Some((u, p)) = &login {
                    c.set_login(u.clone(), p.clone());
                }
                c.properties = Some(v5::ConnectProperties {
                    session_expiry_interval: None,
                    receive_maximum,
                    max_packet_size: None,
                    topic_alias_max: None,
                    request_response_info: None,
                    request_problem_info: None,
                    user_properties: vec![],
                    authentication_method: None,
                    authentication_data: None,
                });
                c.write(&mut theirs).unwrap();
            }
            let mut dec = Decoder::server(1 << 20);
            let Packet::Connect(c) = one(&mut dec, &theirs) else {
                panic!("not a connect");
            };
            prop_assert_eq!(dec.version(), Some(version));
            prop_assert_eq!((c.client_id, c.keep_alive, c.clean_start), (client_id.as_str(), keep_alive, clean));
            prop_assert_eq!(c.will.map(|w| (w.topic, w.payload, w.qos, w.retain)),
                ours.will.map(|w| (w.topic, w.payload, w.qos, w.retain)));
            prop_assert_eq!((c.username, c.password), (ours.username, ours.password));
            prop_assert_eq!(c.properties.receive_maximum(), if version == Version::V5 { receive_maximum } else { None });
        }
    }
}

#[test]
fn the_other_packets_cross_in_3_1_1() {
    let id = PacketId::new(513).unwrap();
    // Ours, read by mqttbytes.
    let sub = Packet::Subscribe(Subscribe {
        packet_id: id,
        properties: Properties::EMPTY,
        filters: vec![
            ("sensors/+/temp", SubscriptionOptions::qos(QoS::AtLeastOnce)),
            ("#", SubscriptionOptions::qos(QoS::AtMostOnce)),
        ],
    });
    let v4::Packet::Subscribe(s) = v4::read(&mut encode(&sub, Version::V311), 1 << 20).unwrap()
    else {
        panic!("not a subscribe");
    };
    assert_eq!(s.pkid, 513);
    let filters: Vec<_> = s.filters.iter().map(|f| (f.path.as_str(), f.qos)).collect();
    assert_eq!(
        filters,
        [
            ("sensors/+/temp", mqttbytes::QoS::AtLeastOnce),
            ("#", mqttbytes::QoS::AtMostOnce)
        ]
    );
    let unsub = Packet::Unsubscribe(Unsubscribe {
        packet_id: id,
        properties: Properties::EMPTY,
        filters: vec!["a/#", "b"],
    });
    let v4::Packet::Unsubscribe(u) = v4::read(&mut encode(&unsub, Version::V311), 1 << 20).unwrap()
    else {
        panic!("not an unsubscribe");
    };
    assert_eq!(
        (u.pkid, u.topics),
        (513, vec!["a/#".to_owned(), "b".to_owned()])
    );
    for (code, theirs) in [
        (ReasonCode::SUCCESS, v4::ConnectReturnCode::Success),
        (
            ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
            v4::ConnectReturnCode::RefusedProtocolVersion,
        ),
        (
            ReasonCode::CLIENT_ID_NOT_VALID,
            v4::ConnectReturnCode::BadClientId,
        ),
        (
            ReasonCode::SERVER_UNAVAILABLE,
            v4::ConnectReturnCode::ServiceUnavailable,
        ),
        (
            ReasonCode::BAD_USERNAME_OR_PASSWORD,
            v4::ConnectReturnCode::BadUserNamePassword,
        ),
        (
            ReasonCode::NOT_AUTHORIZED,
            v4::ConnectReturnCode::NotAuthorized,
        ),
    ] {
        let connack = Packet::Connack(Connack {
            session_present: false,
            code,
            properties: Properties::EMPTY,
        });
        let v4::Packet::ConnAck(c) =
            v4::read(&mut encode(&connack, Version::V311), 1 << 20).unwrap()
        else {
            panic!("not a connack");
        };
        assert_eq!(c.code, theirs);
        // And theirs, read here.
        let mut b = BytesMut::new();
        v4::ConnAck::new(theirs, false).write(&mut b).unwrap();
        let mut dec = Decoder::client(Version::V311, 1 << 20);
        assert!(matches!(one(&mut dec, &b), Packet::Connack(c) if c.code == code));
    }
    // Theirs, read by ours.
    let mut b = BytesMut::new();
    v4::SubAck::new(
        513,
        vec![
            v4::SubscribeReasonCode::Success(mqttbytes::QoS::AtLeastOnce),
            v4::SubscribeReasonCode::Failure,
        ],
    )
    .write(&mut b)
    .unwrap();
    v4::PubAck::new(7).write(&mut b).unwrap();
    v4::UnsubAck::new(9).write(&mut b).unwrap();
    v4::PingResp.write(&mut b).unwrap();
    let mut dec = connected(false, Version::V311);
    let mut got = Vec::new();
    let mut at = 0;
    while let Some(d) = dec.decode(&b[at..]).unwrap() {
        at += d.consumed;
        got.push(format!("{:?}", d.packet));
    }
    let want = [
        Packet::Suback(Suback {
            packet_id: id,
            properties: Properties::EMPTY,
            codes: vec![ReasonCode::GRANTED_QOS_1, ReasonCode::UNSPECIFIED],
        }),
        Packet::Puback(Ack {
            packet_id: PacketId::new(7).unwrap(),
            reason: ReasonCode::SUCCESS,
            properties: Properties::EMPTY,
        }),
        Packet::Unsuback(throng_proto::mqtt::Unsuback {
            packet_id: PacketId::new(9).unwrap(),
            properties: Properties::EMPTY,
            codes: vec![],
        }),
        Packet::Pingresp,
    ];
    assert_eq!(got, want.map(|p| format!("{p:?}")));
    let mut b = BytesMut::new();
    v4::PingReq.write(&mut b).unwrap();
    v4::Disconnect.write(&mut b).unwrap();
    let mut dec = connected(true, Version::V311);
    assert_eq!(one(&mut dec, &b[..2]), Packet::Pingreq);
    assert!(matches!(one(&mut dec, &b[2..]), Packet::Disconnect(_)));
}

#[test]
fn the_other_packets_cross_in_5() {
    // A CONNACK with what a throng server says of itself, read by mqttbytes.
    let mut props = PropertiesBuf::new();
    props
        .push(Property::MaximumQos(1))
        .unwrap()
        .push(Property::ReceiveMaximum(32))
        .unwrap()
        .push(Property::AssignedClientIdentifier("auto-1"))
        .unwrap();
    let connack = Packet::Connack(Connack {
        session_present: false,
        code: ReasonCode::SUCCESS,
        properties: props.properties(),
    });
    let v5::Packet::ConnAck(c) = v5::read(&mut encode(&connack, Version::V5), 1 << 20).unwrap()
    else {
        panic!("not a connack");
    };
    let p = c.properties.unwrap();
    assert_eq!((p.max_qos, p.receive_max), (Some(1), Some(32)));
    assert_eq!(p.assigned_client_identifier.as_deref(), Some("auto-1"));
    // A SUBSCRIBE with 5.0's options, read by mqttbytes.
    let options = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        no_local: true,
        retain_as_published: true,
        retain_handling: RetainHandling::Never,
    };
    let sub = Packet::Subscribe(Subscribe {
        packet_id: PacketId::new(3).unwrap(),
        properties: Properties::EMPTY,
        filters: vec![("a/+", options)],
    });
    let v5::Packet::Subscribe(s) = v5::read(&mut encode(&sub, Version::V5), 1 << 20).unwrap()
    else {
        panic!("not a subscribe");
    };
    let f = &s.filters[0];
    assert_eq!(
        (f.path.as_str(), f.nolocal, f.preserve_retain),
        ("a/+", true, true)
    );
    assert_eq!(f.retain_forward_rule, v5::RetainForwardRule::Never);
    // A PUBACK refusing a message, both ways.
    let refusal = Packet::Puback(Ack {
        packet_id: PacketId::new(9).unwrap(),
        reason: ReasonCode::QUOTA_EXCEEDED,
        properties: Properties::EMPTY,
    });
    let v5::Packet::PubAck(a) = v5::read(&mut encode(&refusal, Version::V5), 1 << 20).unwrap()
    else {
        panic!("not a puback");
    };
    assert_eq!((a.pkid, a.reason), (9, v5::PubAckReason::QuotaExceeded));
    let mut b = BytesMut::new();
    a.write(&mut b).unwrap();
    assert_eq!(one(&mut connected(true, Version::V5), &b), refusal);
    // Their SUBACK and DISCONNECT, read here.
    let mut b = BytesMut::new();
    v5::SubAck::new(
        3,
        vec![
            v5::SubscribeReasonCode::QoS1,
            v5::SubscribeReasonCode::NotAuthorized,
        ],
    )
    .write(&mut b)
    .unwrap();
    let mut dec = connected(false, Version::V5);
    let Packet::Suback(s) = one(&mut dec, &b) else {
        panic!("not a suback");
    };
    assert_eq!(
        s.codes,
        [ReasonCode::GRANTED_QOS_1, ReasonCode::NOT_AUTHORIZED]
    );
    let mut d = v5::Disconnect::new();
    d.reason_code = v5::DisconnectReasonCode::ServerShuttingDown;
    let mut b = BytesMut::new();
    d.write(&mut b).unwrap();
    let Packet::Disconnect(d) = one(&mut dec, &b) else {
        panic!("not a disconnect");
    };
    assert_eq!(d.reason, ReasonCode::SERVER_SHUTTING_DOWN);
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Decodes every chunk of one direction of a recorded connection.
fn decode_all(mut dec: Decoder, chunks: &[&str]) -> Vec<String> {
    let stream: Vec<u8> = chunks.iter().flat_map(|c| hex(c)).collect();
    let mut got = Vec::new();
    let mut at = 0;
    while let Some(d) = dec
        .decode(&stream[at..])
        .expect("Mosquitto's bytes are valid")
    {
        at += d.consumed;
        got.push(format!("{:?}", d.packet));
    }
    assert_eq!(at, stream.len(), "all of it decoded");
    got
}

/// `mosquitto_sub -V mqttv311 -i sub311 -k 30 -q 1 -t 'sensors/+/temp' -C 2`
/// through Mosquitto 2.0.11, which relayed two QoS 1 publishes to it.
#[test]
fn a_mosquitto_sub_311_session_decodes_in_both_roles() {
    let from_client = decode_all(
        Decoder::server(1 << 20),
        &[
            "101200044d5154540402001e0006737562333131",
            "82130001000e73656e736f72732f2b2f74656d7001",
            "40020001",
            "40020002",
            "e000",
        ],
    );
    let from_broker = decode_all(
        Decoder::client(Version::V311, 1 << 20),
        &[
            "20020000",
            "9003000101",
            "3217000e73656e736f72732f312f74656d70000168656c6c6f",
            "3216000e73656e736f72732f322f74656d70000268692035",
        ],
    );
    let id = |n| PacketId::new(n).unwrap();
    let want_client = [
        Packet::Connect(Connect {
            clean_start: true,
            keep_alive: 30,
            properties: Properties::EMPTY,
            client_id: "sub311",
            will: None,
            username: None,
            password: None,
        }),
        Packet::Subscribe(Subscribe {
            packet_id: id(1),
            properties: Properties::EMPTY,
            filters: vec![("sensors/+/temp", SubscriptionOptions::qos(QoS::AtLeastOnce))],
        }),
        Packet::Puback(Ack {
            packet_id: id(1),
            reason: ReasonCode::SUCCESS,
            properties: Properties::EMPTY,
        }),
        Packet::Puback(Ack {
            packet_id: id(2),
            reason: ReasonCode::SUCCESS,
            properties: Properties::EMPTY,
        }),
        Packet::Disconnect(throng_proto::mqtt::Disconnect::new(ReasonCode::SUCCESS)),
    ];
    assert_eq!(from_client, want_client.map(|p| format!("{p:?}")));
    let publish = |n, topic, payload| {
        Packet::Publish(Publish {
            dup: false,
            delivery: Delivery::AtLeastOnce(id(n)),
            retain: false,
            topic,
            properties: Properties::EMPTY,
            payload,
        })
    };
    let want_broker = [
        Packet::Connack(Connack {
            session_present: false,
            code: ReasonCode::SUCCESS,
            properties: Properties::EMPTY,
        }),
        Packet::Suback(Suback {
            packet_id: id(1),
            properties: Properties::EMPTY,
            codes: vec![ReasonCode::GRANTED_QOS_1],
        }),
        publish(1, "sensors/1/temp", b"hello"),
        publish(2, "sensors/2/temp", b"hi 5"),
    ];
    assert_eq!(from_broker, want_broker.map(|p| format!("{p:?}")));
}

/// `mosquitto_sub -V mqttv5 -i sub5 -k 45 -q 1 -t 'sensors/#' -t
/// '$SYS/broker/uptime' -C 2`: Mosquitto's CONNACK properties, a retained
/// `$SYS` message with a message expiry, and a publish.
#[test]
fn a_mosquitto_sub_5_session_decodes_in_both_roles() {
    let from_client = decode_all(
        Decoder::server(1 << 20),
        &[
            "101400044d5154540502002d03210002000473756235",
            "8224000100000973656e736f72732f23010012245359532f62726f6b65722f757074696d6501",
            "40020001",
            "40020002e000",
        ],
    );
    assert_eq!(from_client.len(), 5);
    assert!(
        from_client[0].contains("client_id: \"sub5\"") && from_client[0].contains("keep_alive: 45")
    );
    assert!(
        from_client[1].contains("\"sensors/#\"")
            && from_client[1].contains("\"$SYS/broker/uptime\"")
    );
    let mut dec = Decoder::client(Version::V5, 1 << 20);
    let connack = hex("200900000622000a210014");
    let Packet::Connack(c) = one(&mut dec, &connack) else {
        panic!("not a connack");
    };
    assert_eq!(c.code, ReasonCode::SUCCESS);
    assert_eq!(c.properties.receive_maximum(), Some(20));
    assert_eq!(
        c.properties.iter().collect::<Vec<_>>(),
        [
            Property::TopicAliasMaximum(10),
            Property::ReceiveMaximum(20)
        ]
    );
    let suback = hex("90050001000101");
    let Packet::Suback(s) = one(&mut dec, &suback) else {
        panic!("not a suback");
    };
    assert_eq!(s.codes, [ReasonCode::GRANTED_QOS_1; 2]);
    let retained =
        hex("33250012245359532f62726f6b65722f757074696d65000105020000003830207365636f6e6473");
    let Packet::Publish(p) = one(&mut dec, &retained) else {
        panic!("not a publish");
    };
    assert_eq!(
        (p.topic, p.payload, p.retain),
        ("$SYS/broker/uptime", &b"0 seconds"[..], true)
    );
    assert_eq!(
        p.properties.iter().collect::<Vec<_>>(),
        [Property::MessageExpiryInterval(56)]
    );
    let publish = hex("3218000e73656e736f72732f312f74656d7000020068656c6c6f");
    let Packet::Publish(p) = one(&mut dec, &publish) else {
        panic!("not a publish");
    };
    assert_eq!((p.topic, p.payload), ("sensors/1/temp", &b"hello"[..]));
    assert_eq!(p.delivery, Delivery::AtLeastOnce(PacketId::new(2).unwrap()));
}

/// `mosquitto_pub -V mqttv5 -i pub5 -q 1 -t sensors/2/temp -m 'hi 5' -D
/// publish user-property k v -D publish message-expiry-interval 60`, and
/// `mosquitto_pub -V mqttv311 -u alice -P secret -r --will-topic wills/x
/// --will-payload gone --will-qos 1 --will-retain`.
#[test]
fn mosquitto_pub_publishes_decode_as_a_server_reads_them() {
    let v5 = decode_all(
        Decoder::server(1 << 20),
        &[
            "101400044d5154540502003c03210014000470756235",
            "3223000e73656e736f72732f322f74656d7000010c2600016b000176020000003c68692035",
            "e000",
        ],
    );
    let mut props = PropertiesBuf::new();
    props
        .push(Property::UserProperty("k", "v"))
        .unwrap()
        .push(Property::MessageExpiryInterval(60))
        .unwrap();
    let want = Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::AtLeastOnce(PacketId::new(1).unwrap()),
        retain: false,
        topic: "sensors/2/temp",
        properties: props.properties(),
        payload: b"hi 5",
    });
    assert_eq!(v5[1], format!("{want:?}"));
    let mut dec = Decoder::server(1 << 20);
    let connect = hex(
        "103100044d51545404ee003c000777696c6c333131000777696c6c732f780004676f6e650005616c6963650006736563726574",
    );
    let Packet::Connect(c) = one(&mut dec, &connect) else {
        panic!("not a connect");
    };
    assert_eq!(
        (c.username, c.password),
        (Some("alice"), Some(&b"secret"[..]))
    );
    let w = c.will.expect("a will");
    assert_eq!(
        (w.topic, w.payload, w.qos, w.retain),
        ("wills/x", &b"gone"[..], QoS::AtLeastOnce, true)
    );
    let publish = hex("3118000e73656e736f72732f332f74656d7072657461696e6564e000");
    let Packet::Publish(p) = one(&mut dec, &publish[..publish.len() - 2]) else {
        panic!("not a publish");
    };
    assert_eq!(
        (p.topic, p.payload, p.retain),
        ("sensors/3/temp", &b"retained"[..], true)
    );
}
