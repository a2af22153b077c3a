//! Property tests of the MQTT codec and topic index: conversations encoded in
//! either version decode back packet for packet from any split of the
//! stream, in either role; no input makes the decoder panic, disagree with
//! itself over how it was split, or keep more than its limit; the trie finds
//! exactly what the matcher finds; a grant covers only what it matches.

use std::collections::BTreeSet;

use proptest::collection::vec;
use proptest::prelude::*;
use throng_proto::mqtt::topic::{self, FilterTrie};
use throng_proto::mqtt::{
    Ack, Auth, Connack, Connect, DecodeError, Decoder, Delivery, Disconnect, Packet, PacketId,
    Properties, PropertiesBuf, Property, Publish, QoS, ReasonCode, RetainHandling, Suback,
    Subscribe, SubscriptionOptions, Unsuback, Unsubscribe, Version, Will,
};

/// An owned packet, to be lent out as a [`Packet`].
#[derive(Debug, Clone)]
enum Spec {
    Connect {
        clean: bool,
        keep_alive: u16,
        props: PropertiesBuf,
        client_id: String,
        will: Option<(QoS, bool, PropertiesBuf, String, Vec<u8>)>,
        username: Option<String>,
        password: Option<Vec<u8>>,
    },
    Connack {
        session_present: bool,
        code: u8,
        props: PropertiesBuf,
    },
    Publish {
        dup: bool,
        qos: QoS,
        id: PacketId,
        retain: bool,
        topic: String,
        props: PropertiesBuf,
        payload: Vec<u8>,
    },
    /// PUBACK to PUBCOMP: the type nibble 4 to 7.
    Ack {
        kind: u8,
        id: PacketId,
        reason: u8,
        props: PropertiesBuf,
    },
    Subscribe {
        id: PacketId,
        props: PropertiesBuf,
        filters: Vec<(String, SubscriptionOptions)>,
    },
    Suback {
        id: PacketId,
        props: PropertiesBuf,
        codes: Vec<u8>,
    },
    Unsubscribe {
        id: PacketId,
        props: PropertiesBuf,
        filters: Vec<String>,
    },
    Unsuback {
        id: PacketId,
        props: PropertiesBuf,
        codes: Vec<u8>,
    },
    Pingreq,
    Pingresp,
    Disconnect {
        reason: u8,
        props: PropertiesBuf,
    },
    Auth {
        reason: u8,
        props: PropertiesBuf,
    },
}

impl Spec {
    fn packet(&self) -> Packet<'_> {
        match self {
            Self::Connect {
                clean,
                keep_alive,
                props,
                client_id,
                will,
                username,
                password,
            } => Packet::Connect(Connect {
                clean_start: *clean,
                keep_alive: *keep_alive,
                properties: props.properties(),
                client_id,
                will: will
                    .as_ref()
                    .map(|(qos, retain, props, topic, payload)| Will {
                        qos: *qos,
                        retain: *retain,
                        properties: props.properties(),
                        topic,
                        payload,
                    }),
                username: username.as_deref(),
                password: password.as_deref(),
            }),
            Self::Connack {
                session_present,
                code,
                props,
            } => Packet::Connack(Connack {
                session_present: *session_present,
                code: ReasonCode(*code),
                properties: props.properties(),
            }),
            Self::Publish {
                dup,
                qos,
                id,
                retain,
                topic,
                props,
                payload,
            } => Packet::Publish(Publish {
                dup: *dup,
                delivery: match qos {
                    QoS::AtMostOnce => Delivery::AtMostOnce,
                    QoS::AtLeastOnce => Delivery::AtLeastOnce(*id),
                    QoS::ExactlyOnce => Delivery::ExactlyOnce(*id),
                },
                retain: *retain,
                topic,
                properties: props.properties(),
                payload,
            }),
            Self::Ack {
                kind,
                id,
                reason,
                props,
            } => {
                let ack = Ack {
                    packet_id: *id,
                    reason: ReasonCode(*reason),
                    properties: props.properties(),
                };
                match kind {
                    4 => Packet::Puback(ack),
                    5 => Packet::Pubrec(ack),
                    6 => Packet::Pubrel(ack),
                    _ => Packet::Pubcomp(ack),
                }
            }
            Self::Subscribe { id, props, filters } => Packet::Subscribe(Subscribe {
                packet_id: *id,
                properties: props.properties(),
                filters: filters.iter().map(|(f, o)| (f.as_str(), *o)).collect(),
            }),
            Self::Suback { id, props, codes } => Packet::Suback(Suback {
                packet_id: *id,
                properties: props.properties(),
                codes: codes.iter().map(|&c| ReasonCode(c)).collect(),
            }),
            Self::Unsubscribe { id, props, filters } => Packet::Unsubscribe(Unsubscribe {
                packet_id: *id,
                properties: props.properties(),
                filters: filters.iter().map(String::as_str).collect(),
            }),
            Self::Unsuback { id, props, codes } => Packet::Unsuback(Unsuback {
                packet_id: *id,
                properties: props.properties(),
                codes: codes.iter().map(|&c| ReasonCode(c)).collect(),
            }),
            Self::Pingreq => Packet::Pingreq,
            Self::Pingresp => Packet::Pingresp,
            Self::Disconnect { reason, props } => Packet::Disconnect(Disconnect {
                reason: ReasonCode(*reason),
                properties: props.properties(),
            }),
            Self::Auth { reason, props } => Packet::Auth(Auth {
                reason: ReasonCode(*reason),
                properties: props.properties(),
            }),
        }
    }
}

// Property identifiers by where they may go (5.0, section 2.2.2.2).
const CONNECT: &[u8] = &[0x11, 0x21, 0x27, 0x22, 0x19, 0x17, 0x26, 0x15, 0x16];
const WILL: &[u8] = &[0x18, 0x01, 0x02, 0x03, 0x08, 0x09, 0x26];
const CONNACK: &[u8] = &[
    0x11, 0x21, 0x24, 0x25, 0x27, 0x12, 0x22, 0x1F, 0x26, 0x28, 0x29, 0x2A, 0x13, 0x1A, 0x1C, 0x15,
    0x16,
];
const PUBLISH: &[u8] = &[0x01, 0x02, 0x23, 0x08, 0x09, 0x26, 0x0B, 0x03];
const ACK: &[u8] = &[0x1F, 0x26];
const SUBSCRIBE: &[u8] = &[0x0B, 0x26];
const UNSUBSCRIBE: &[u8] = &[0x26];
const DISCONNECT: &[u8] = &[0x11, 0x1F, 0x26, 0x1C];
const AUTH: &[u8] = &[0x15, 0x16, 0x1F, 0x26];

/// The property `id` with a value in its range, drawn from `n`, `s`, `t`, `b`.
fn property<'a>(id: u8, n: u32, s: &'a str, t: &'a str, b: &'a [u8]) -> Property<'a> {
    let flag = (n % 2) as u8;
    let short = n as u16;
    let nonzero16 = short.max(1);
    match id {
        0x01 => Property::PayloadFormatIndicator(flag),
        0x02 => Property::MessageExpiryInterval(n),
        0x03 => Property::ContentType(s),
        0x08 => Property::ResponseTopic(s),
        0x09 => Property::CorrelationData(b),
        0x0B => Property::SubscriptionIdentifier(n % 268_435_455 + 1),
        0x11 => Property::SessionExpiryInterval(n),
        0x12 => Property::AssignedClientIdentifier(s),
        0x13 => Property::ServerKeepAlive(short),
        0x15 => Property::AuthenticationMethod(s),
        0x16 => Property::AuthenticationData(b),
        0x17 => Property::RequestProblemInformation(flag),
        0x18 => Property::WillDelayInterval(n),
        0x19 => Property::RequestResponseInformation(flag),
        0x1A => Property::ResponseInformation(s),
        0x1C => Property::ServerReference(s),
        0x1F => Property::ReasonString(s),
        0x21 => Property::ReceiveMaximum(nonzero16),
        0x22 => Property::TopicAliasMaximum(short),
        0x23 => Property::TopicAlias(nonzero16),
        0x24 => Property::MaximumQos(flag),
        0x25 => Property::RetainAvailable(flag),
        0x26 => Property::UserProperty(s, t),
        0x27 => Property::MaximumPacketSize(n.max(1)),
        0x28 => Property::WildcardSubscriptionAvailable(flag),
        0x29 => Property::SubscriptionIdentifierAvailable(flag),
        _ => Property::SharedSubscriptionAvailable(flag),
    }
}

/// Text without U+0000 (or any control character), short.
fn text() -> impl Strategy<Value = String> {
    "\\PC{0,6}"
}

/// A property list for the place with these identifiers; only user
/// properties (and a PUBLISH's subscription identifiers) repeat.
fn props(ids: &'static [u8], v5: bool) -> BoxedStrategy<PropertiesBuf> {
    if !v5 {
        return Just(PropertiesBuf::new()).boxed();
    }
    let one = (
        proptest::sample::select(ids),
        any::<u32>(),
        text(),
        text(),
        vec(any::<u8>(), 0..6),
    );
    vec(one, 0..4)
        .prop_map(move |list| {
            let mut buf = PropertiesBuf::new();
            let mut seen = BTreeSet::new();
            let repeats = |id| id == 0x26 || (id == 0x0B && ids == PUBLISH);
            for (id, n, s, t, b) in &list {
                if seen.insert(*id) || repeats(*id) {
                    buf.push(property(*id, *n, s, t, b))
                        .expect("short values fit");
                }
            }
            buf
        })
        .boxed()
}

fn level() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[ab]",
        "[a-z0-9é]{1,4}",
        Just("$sys".to_owned()),
    ]
}

fn topic_name() -> impl Strategy<Value = String> {
    // One empty level alone would be the empty topic, which is not one.
    vec(level(), 1..5)
        .prop_map(|l| l.join("/"))
        .prop_filter("empty", |t| !t.is_empty())
}

fn filter() -> impl Strategy<Value = String> {
    let lvl = prop_oneof![3 => level(), 1 => Just("+".to_owned())];
    (vec(lvl, 0..5), any::<bool>())
        .prop_map(|(mut l, hash)| {
            if hash {
                l.push("#".to_owned());
            }
            l.join("/")
        })
        .prop_filter("empty", |f| !f.is_empty())
}

/// Filters and topics over so few levels that they often overlap.
fn small_filter() -> impl Strategy<Value = String> {
    let lvl = proptest::sample::select(vec!["a", "b", "$s", "+"]);
    (vec(lvl, 1..4), any::<bool>()).prop_map(|(l, hash)| {
        let mut f = l.join("/");
        if hash {
            f.push_str("/#");
        }
        f
    })
}

fn small_topic() -> impl Strategy<Value = String> {
    vec(proptest::sample::select(vec!["a", "b", "$s", ""]), 1..5)
        .prop_map(|l| l.join("/"))
        .prop_filter("empty", |t| !t.is_empty())
}

fn id() -> impl Strategy<Value = PacketId> {
    (1u16..).prop_map(|n| PacketId::new(n).expect("from 1"))
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

fn options(v5: bool) -> impl Strategy<Value = SubscriptionOptions> {
    let handling = prop_oneof![
        Just(RetainHandling::OnSubscribe),
        Just(RetainHandling::OnNewSubscribe),
        Just(RetainHandling::Never)
    ];
    (qos(), any::<bool>(), any::<bool>(), handling).prop_map(move |(qos, nl, rap, rh)| {
        if v5 {
            SubscriptionOptions {
                qos,
                no_local: nl,
                retain_as_published: rap,
                retain_handling: rh,
            }
        } else {
            SubscriptionOptions::qos(qos)
        }
    })
}

/// A 5.0 reason code, or success in 3.1.1 (which has none).
fn reason(v5: bool) -> BoxedStrategy<u8> {
    if v5 {
        any::<u8>().boxed()
    } else {
        Just(0).boxed()
    }
}

fn connect(v5: bool) -> impl Strategy<Value = Spec> {
    let will = (
        qos(),
        any::<bool>(),
        props(WILL, v5),
        topic_name(),
        vec(any::<u8>(), 0..8),
    );
    (
        any::<bool>(),
        any::<u16>(),
        props(CONNECT, v5),
        "[a-zA-Z0-9]{0,8}",
        proptest::option::of(will),
        proptest::option::of(text()),
        proptest::option::of(vec(any::<u8>(), 0..8)),
    )
        .prop_map(
            move |(clean, keep_alive, props, client_id, will, username, password)| {
                // 3.1.1: an empty id needs a clean session, a password a user name.
                let clean = clean || (!v5 && client_id.is_empty());
                let password = password.filter(|_| v5 || username.is_some());
                Spec::Connect {
                    clean,
                    keep_alive,
                    props,
                    client_id,
                    will,
                    username,
                    password,
                }
            },
        )
}

fn connack(v5: bool) -> impl Strategy<Value = Spec> {
    let code = if v5 {
        any::<u8>().boxed()
    } else {
        prop_oneof![
            Just(0u8),
            Just(0x84),
            Just(0x85),
            Just(0x88),
            Just(0x86),
            Just(0x87)
        ]
        .boxed()
    };
    (any::<bool>(), code, props(CONNACK, v5)).prop_map(|(session_present, code, props)| {
        Spec::Connack {
            session_present,
            code,
            props,
        }
    })
}

fn publish(v5: bool) -> impl Strategy<Value = Spec> {
    (
        any::<bool>(),
        qos(),
        id(),
        any::<bool>(),
        topic_name(),
        props(PUBLISH, v5),
        vec(any::<u8>(), 0..300),
    )
        .prop_map(
            |(dup, qos, id, retain, topic, props, payload)| Spec::Publish {
                dup: dup && qos != QoS::AtMostOnce,
                qos,
                id,
                retain,
                topic,
                props,
                payload,
            },
        )
}

fn ack(v5: bool) -> impl Strategy<Value = Spec> {
    (4u8..=7, id(), reason(v5), props(ACK, v5)).prop_map(|(kind, id, reason, props)| Spec::Ack {
        kind,
        id,
        reason,
        props,
    })
}

fn disconnect(v5: bool) -> impl Strategy<Value = Spec> {
    (reason(v5), props(DISCONNECT, v5))
        .prop_map(|(reason, props)| Spec::Disconnect { reason, props })
}

/// What a client sends after its CONNECT.
fn from_client(v5: bool) -> BoxedStrategy<Spec> {
    let subscribe = (
        id(),
        props(SUBSCRIBE, v5),
        vec((filter(), options(v5)), 1..4),
    )
        .prop_map(|(id, props, filters)| Spec::Subscribe { id, props, filters });
    let unsubscribe = (id(), props(UNSUBSCRIBE, v5), vec(filter(), 1..4))
        .prop_map(|(id, props, filters)| Spec::Unsubscribe { id, props, filters });
    let auth =
        (reason(v5), props(AUTH, v5)).prop_map(|(reason, props)| Spec::Auth { reason, props });
    let mut kinds = vec![
        (4, publish(v5).boxed()),
        (2, ack(v5).boxed()),
        (1, subscribe.boxed()),
        (1, unsubscribe.boxed()),
        (1, Just(Spec::Pingreq).boxed()),
        (1, disconnect(v5).boxed()),
    ];
    if v5 {
        kinds.push((1, auth.boxed()));
    }
    proptest::strategy::Union::new_weighted(kinds).boxed()
}

/// What a server sends after its CONNACK.
fn from_server(v5: bool) -> BoxedStrategy<Spec> {
    let suback_code = if v5 {
        any::<u8>().boxed()
    } else {
        prop_oneof![Just(0u8), Just(1), Just(2), Just(0x80)].boxed()
    };
    let suback = (id(), props(ACK, v5), vec(suback_code, 1..4))
        .prop_map(|(id, props, codes)| Spec::Suback { id, props, codes });
    let unsuback_codes = if v5 {
        vec(any::<u8>(), 1..4).boxed()
    } else {
        Just(Vec::new()).boxed()
    };
    let unsuback = (id(), props(ACK, v5), unsuback_codes)
        .prop_map(|(id, props, codes)| Spec::Unsuback { id, props, codes });
    let mut kinds = vec![
        (4, publish(v5).boxed()),
        (2, ack(v5).boxed()),
        (1, suback.boxed()),
        (1, unsuback.boxed()),
        (1, Just(Spec::Pingresp).boxed()),
    ];
    if v5 {
        kinds.push((1, disconnect(v5).boxed()));
    }
    proptest::strategy::Union::new_weighted(kinds).boxed()
}

/// Which end decodes, in which version, and the packets it reads: CONNECT or
/// CONNACK first.
fn conversation() -> impl Strategy<Value = (bool, Version, Vec<Spec>)> {
    (any::<bool>(), any::<bool>()).prop_flat_map(|(server, v5)| {
        let version = if v5 { Version::V5 } else { Version::V311 };
        let first = if server {
            connect(v5).boxed()
        } else {
            connack(v5).boxed()
        };
        let rest = if server {
            from_client(v5)
        } else {
            from_server(v5)
        };
        (first, vec(rest, 0..8)).prop_map(move |(first, mut rest)| {
            rest.insert(0, first);
            (server, version, rest)
        })
    })
}

/// An error and the answer to it.
type Refusal = (DecodeError, Vec<u8>);

fn decoder(server: bool, version: Version, limit: usize) -> Decoder {
    if server {
        Decoder::server(limit)
    } else {
        Decoder::client(version, limit)
    }
}

/// Feeds `stream` in pieces of the given sizes (then the rest) the way a
/// read loop does: the packets (as `Debug` text), the error that stopped
/// it with the bytes of its answer, and the bytes left undecoded.
fn feed(mut dec: Decoder, stream: &[u8], sizes: &[usize]) -> (Vec<String>, Option<Refusal>, usize) {
    let limit = dec.max_packet();
    let mut pending = Vec::new();
    let mut packets = Vec::new();
    let mut sizes = sizes.iter().copied();
    let mut fed = 0;
    while fed < stream.len() {
        let n = sizes
            .next()
            .unwrap_or(stream.len())
            .clamp(1, stream.len() - fed);
        pending.extend_from_slice(&stream[fed..fed + n]);
        fed += n;
        let mut at = 0;
        loop {
            match dec.decode(&pending[at..]) {
                Ok(Some(d)) => {
                    assert!(d.consumed > 0 && d.consumed <= limit);
                    at += d.consumed;
                    packets.push(format!("{:?}", d.packet));
                }
                Ok(None) => break,
                Err(e) => {
                    let mut answer = Vec::new();
                    dec.answer(&e).encode(&mut answer);
                    assert!(answer.len() <= 5, "an answer is one short packet");
                    return (packets, Some((e, answer)), 0);
                }
            }
        }
        pending.drain(..at);
        assert!(
            pending.len() < limit.max(5),
            "kept {} bytes waiting for a packet over the limit of {limit}",
            pending.len()
        );
    }
    (packets, None, pending.len())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn conversations_round_trip_in_any_pieces(
        (server, version, specs) in conversation(),
        sizes in vec(1usize..80, 0..12),
    ) {
        let mut stream = Vec::new();
        let mut want = Vec::new();
        for s in &specs {
            let p = s.packet();
            let before = stream.len();
            p.encode(version, &mut stream).expect("generated packets fit");
            prop_assert_eq!(stream.len() - before, p.encoded_len(version).unwrap());
            want.push(format!("{p:?}"));
        }
        let dec = decoder(server, version, 1 << 16);
        let (got, err, left) = feed(dec, &stream, &sizes);
        prop_assert_eq!(err, None);
        prop_assert_eq!(left, 0);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn any_bytes_decode_alike_however_split_and_within_the_limit(
        server in any::<bool>(),
        v5 in any::<bool>(),
        connected in any::<bool>(),
        limit in 2usize..300,
        noise in vec(any::<u8>(), 0..400),
        sizes in vec(1usize..40, 0..12),
    ) {
        let version = if v5 { Version::V5 } else { Version::V311 };
        // Half the time the noise follows a good first packet, so it is read
        // as the packets of a connection rather than refused at byte one.
        let mut stream = Vec::new();
        if connected {
            let first = if server {
                Packet::Connect(Connect {
                    clean_start: true,
                    keep_alive: 0,
                    properties: Properties::EMPTY,
                    client_id: "c",
                    will: None,
                    username: None,
                    password: None,
                })
            } else {
                Packet::Connack(Connack {
                    session_present: false,
                    code: ReasonCode::SUCCESS,
                    properties: Properties::EMPTY,
                })
            };
            first.encode(version, &mut stream).expect("short");
        }
        stream.extend_from_slice(&noise);
        let whole = feed(decoder(server, version, limit), &stream, &[]);
        let split = feed(decoder(server, version, limit), &stream, &sizes);
        prop_assert_eq!(whole, split);
    }

    #[test]
    fn damaged_conversations_decode_alike_however_split(
        (server, version, specs) in conversation(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        sizes in vec(1usize..40, 0..12),
    ) {
        let mut stream = Vec::new();
        for s in &specs {
            s.packet().encode(version, &mut stream).expect("generated packets fit");
        }
        for (at, byte) in flips {
            let i = at.index(stream.len());
            stream[i] ^= byte;
        }
        stream.truncate(cut.index(stream.len() + 1));
        let whole = feed(decoder(server, version, 1 << 12), &stream, &[]);
        let split = feed(decoder(server, version, 1 << 12), &stream, &sizes);
        prop_assert_eq!(whole, split);
    }

    #[test]
    fn a_header_over_the_limit_is_refused_from_its_first_bytes(
        remaining in 0usize..268_435_455,
        limit in 1usize..1_000_000,
    ) {
        let mut dec = Decoder::server(limit);
        let mut head = vec![0x10];
        let mut n = remaining;
        loop {
            let b = (n & 0x7F) as u8;
            n >>= 7;
            head.push(if n > 0 { b | 0x80 } else { b });
            if n == 0 {
                break;
            }
        }
        let total = head.len() + remaining;
        match dec.decode(&head) {
            Err(DecodeError::TooLarge { len, .. }) => prop_assert!(len == total && total > limit),
            Ok(None) => prop_assert!(total <= limit && remaining > 0),
            other => prop_assert!(remaining == 0, "{other:?}"),
        }
    }

    #[test]
    fn the_trie_finds_exactly_what_the_matcher_finds(
        filters in vec(filter(), 0..40),
        removed in vec(any::<prop::sample::Index>(), 0..10),
        topics in vec(topic_name(), 1..20),
    ) {
        let mut trie = FilterTrie::new();
        let mut kept: BTreeSet<String> = BTreeSet::new();
        for f in &filters {
            trie.get_or_insert_with(f, || f.clone()).expect("shallow");
            kept.insert(f.clone());
        }
        prop_assert_eq!(trie.len(), kept.len());
        for i in removed {
            if filters.is_empty() {
                break;
            }
            let f = &filters[i.index(filters.len())];
            prop_assert_eq!(trie.remove(f).is_some(), kept.remove(f));
        }
        prop_assert_eq!(trie.len(), kept.len());
        for t in &topics {
            let mut got = Vec::new();
            trie.for_each_match(t, |f| got.push(f.clone()));
            got.sort();
            let want: Vec<String> = kept.iter().filter(|f| topic::matches(f, t)).cloned().collect();
            prop_assert_eq!(got, want, "topic {}", t);
        }
    }

    #[test]
    fn a_grant_that_covers_a_filter_matches_every_topic_it_matches(
        grant in small_filter(),
        wanted in small_filter(),
        topics in vec(small_topic(), 1..30),
    ) {
        if topic::covers(&grant, &wanted) {
            for t in &topics {
                if topic::matches(&wanted, t) {
                    prop_assert!(topic::matches(&grant, t), "{} covers {} but not {}", grant, wanted, t);
                }
            }
        }
        prop_assert!(topic::covers(&wanted, &wanted));
    }
}
