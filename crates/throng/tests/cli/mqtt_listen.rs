//! `throng serve --mqtt-listen`: real sockets, a client written on the
//! proto crate's MQTT codec (client role). A topic is a channel: MQTT,
//! WebSocket and HTTP meet on it, on one node or through Redis; CONNECT,
//! SUBSCRIBE, UNSUBSCRIBE, PINGREQ, keep-alive, drain and bad first packets
//! get the protocol's answers. Independent clients (paho, mosquitto_sub,
//! Node mqtt) are in `mqtt_serve`.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use throng_proto::mqtt::{
    Connect, Decoder, Delivery, Disconnect, Packet, Properties, Publish, QoS, ReasonCode,
    Subscribe, SubscriptionOptions, Unsubscribe, Version, Will,
};
use throng_testkit::http::publish;
use throng_testkit::redis::Redis;
use throng_testkit::ws::{next_text, subscribe};
use throng_testkit::{Peer, Server, require, wait_until};

use crate::serve;

/// A server with one MQTT listener on a free port.
pub(crate) fn mqtt_server(extra: &[&str]) -> (Server, SocketAddr) {
    let mut args = vec!["--mqtt-listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let s = serve(&args);
    let addr = s.start["mqtt_listen"][0]
        .as_str()
        .and_then(|a| a.parse().ok())
        .expect("mqtt_listen in the start line");
    (s, addr)
}

/// A packet as the test keeps it (the codec's borrow the read buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Got {
    Connack {
        session_present: bool,
        code: u8,
        assigned_id: Option<String>,
    },
    Publish {
        topic: String,
        payload: Vec<u8>,
        qos: QoS,
    },
    Puback(u16, u8),
    Suback(u16, Vec<u8>),
    Unsuback(u16, Vec<u8>),
    Pingresp,
    Disconnect(u8),
    Other(String),
}

fn own(p: Packet<'_>) -> Got {
    match p {
        Packet::Connack(c) => Got::Connack {
            session_present: c.session_present,
            code: c.code.0,
            assigned_id: c.properties.assigned_client_identifier().map(str::to_owned),
        },
        Packet::Publish(p) => Got::Publish {
            topic: p.topic.to_owned(),
            payload: p.payload.to_vec(),
            qos: p.delivery.qos(),
        },
        Packet::Puback(a) => Got::Puback(a.packet_id.get(), a.reason.0),
        Packet::Suback(s) => Got::Suback(s.packet_id.get(), s.codes.iter().map(|c| c.0).collect()),
        Packet::Unsuback(u) => {
            Got::Unsuback(u.packet_id.get(), u.codes.iter().map(|c| c.0).collect())
        }
        Packet::Pingresp => Got::Pingresp,
        Packet::Disconnect(d) => Got::Disconnect(d.reason.0),
        other => Got::Other(format!("{other:?}")),
    }
}

/// One MQTT client over a blocking stream (a socket, or TLS over one).
pub(crate) struct Client<S = TcpStream> {
    s: S,
    version: Version,
    dec: Decoder,
    buf: Vec<u8>,
}

impl<S: Read + Write> Client<S> {
    /// A client of `version` over `s`, which sent nothing yet.
    pub(crate) fn over(s: S, version: Version) -> Self {
        Self {
            s,
            version,
            dec: Decoder::client(version, 1 << 20),
            buf: Vec::new(),
        }
    }

    pub(crate) fn send(&mut self, p: &Packet<'_>) {
        self.send_all(std::slice::from_ref(p));
    }

    /// Sends `packets` in one write (as a busy client's coalesce).
    pub(crate) fn send_all(&mut self, packets: &[Packet<'_>]) {
        let mut out = Vec::new();
        for p in packets {
            p.encode(self.version, &mut out).expect("encode");
        }
        self.s.write_all(&out).expect("write to the server");
    }

    /// The next packet; `None` when the server closed the connection.
    pub(crate) fn next(&mut self) -> Option<Got> {
        self.next_as(own)
    }

    /// The next packet as `keep` keeps it (what [`Got`] leaves out, such
    /// as a PUBLISH's packet id); `None` when the server closed the connection.
    pub(crate) fn next_as<T>(&mut self, keep: impl FnOnce(Packet<'_>) -> T) -> Option<T> {
        loop {
            if let Some(d) = self
                .dec
                .decode(&self.buf)
                .expect("a packet the codec reads")
            {
                let (n, got) = (d.consumed, keep(d.packet));
                self.buf.drain(..n);
                return Some(got);
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
                // A socket read with a timeout is not restarted after a
                // handled signal or a stop and continue (signal(7)): once
                // seen in a run, so read again.
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    pub(crate) fn subscribe(&mut self, id: u16, filters: &[&str]) -> Vec<u8> {
        let filters = filters
            .iter()
            .map(|f| (*f, SubscriptionOptions::qos(QoS::AtMostOnce)))
            .collect();
        self.send(&Packet::Subscribe(Subscribe {
            packet_id: id.try_into().unwrap(),
            properties: Properties::EMPTY,
            filters,
        }));
        match self.next() {
            Some(Got::Suback(got, codes)) if got == id => codes,
            other => panic!("expected SUBACK {id}, got {other:?}"),
        }
    }

    pub(crate) fn publish(&mut self, topic: &str, payload: &[u8], delivery: Delivery) {
        self.send(&Packet::Publish(Publish {
            dup: false,
            delivery,
            retain: false,
            topic,
            properties: Properties::EMPTY,
            payload,
        }));
    }

    /// The next packet, which must be a PUBLISH: its topic and payload.
    pub(crate) fn message(&mut self) -> (String, String) {
        match self.next() {
            Some(Got::Publish {
                topic,
                payload,
                qos,
            }) => {
                assert_eq!(qos, QoS::AtMostOnce);
                (topic, String::from_utf8(payload).unwrap())
            }
            other => panic!("expected a PUBLISH, got {other:?}"),
        }
    }
}

impl Client {
    /// Connects and sends CONNECT; the CONNACK is the first [`Client::next`].
    pub(crate) fn open(
        addr: SocketAddr,
        version: Version,
        id: &str,
        keep_alive: u16,
        clean: bool,
    ) -> Self {
        let s = TcpStream::connect(addr).expect("connect to the MQTT listener");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Self::over(s, version);
        c.send(&Packet::Connect(Connect {
            clean_start: clean,
            keep_alive,
            properties: Properties::EMPTY,
            client_id: id,
            will: None,
            username: None,
            password: None,
        }));
        c
    }

    /// Connects with a will on `topic`; the CONNACK is the first [`Client::next`].
    fn with_will(addr: SocketAddr, version: Version, topic: &str, payload: &[u8]) -> Self {
        let s = TcpStream::connect(addr).expect("connect to the MQTT listener");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Self::over(s, version);
        c.send(&Packet::Connect(Connect {
            clean_start: true,
            keep_alive: 60,
            properties: Properties::EMPTY,
            client_id: "with-will",
            will: Some(Will {
                qos: QoS::AtMostOnce,
                retain: false,
                properties: Properties::EMPTY,
                topic,
                payload,
            }),
            username: None,
            password: None,
        }));
        c
    }

    /// Connected: CONNACK success checked.
    pub(crate) fn connect(addr: SocketAddr, version: Version, id: &str) -> Self {
        let mut c = Self::open(addr, version, id, 60, true);
        let got = c.next();
        assert!(matches!(got, Some(Got::Connack { code: 0, .. })), "{got:?}");
        c
    }

    /// Nothing arrives within `wait`.
    pub(crate) fn quiet(&mut self, wait: Duration) {
        self.s.set_read_timeout(Some(wait)).unwrap();
        let mut chunk = [0u8; 64];
        match self.s.read(&mut chunk) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            other => panic!("expected nothing, got {other:?} {:?}", &chunk[..]),
        }
        self.s
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
    }
}

/// The next two packets, a PUBACK of 9 and a PUBLISH in either order (the
/// relay's answer and the publisher's own copy race): the message.
pub(crate) fn puback_and_message(c: &mut Client) -> (String, String) {
    let mut message = None;
    let mut acked = false;
    for _ in 0..2 {
        match c.next() {
            Some(Got::Puback(_, 0)) if !acked => acked = true,
            Some(Got::Publish { topic, payload, .. }) if message.is_none() => {
                message = Some((topic, String::from_utf8(payload).unwrap()));
            }
            other => panic!("expected a PUBACK and a PUBLISH, got {other:?}"),
        }
    }
    message.expect("a PUBLISH")
}

pub(crate) fn pair(t: &str, p: &str) -> (String, String) {
    (t.to_owned(), p.to_owned())
}

#[test]
fn mqtt_websocket_and_http_meet_on_a_channel_with_slashes() {
    let (s, mqtt) = mqtt_server(&["--workers", "2"]);
    let mut v3 = Client::connect(mqtt, Version::V311, "v3");
    let mut v5 = Client::connect(mqtt, Version::V5, "v5");
    assert_eq!(v3.subscribe(1, &["sensors/42/temp"]), [0]);
    assert_eq!(v5.subscribe(7, &["sensors/42/temp", "other"]), [0, 0]);
    let mut ws = subscribe(s.addr, "sensors/42/temp");
    wait_until("three subscribers", || {
        s.metric("throng_connections_open") == 3.0
    });

    // HTTP to all three.
    let (status, body) = publish(s.addr, "sensors/42/temp", b"21.5", None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"subscribers\":3"), "{body}");
    assert_eq!(v3.message(), pair("sensors/42/temp", "21.5"));
    assert_eq!(v5.message(), pair("sensors/42/temp", "21.5"));
    assert_eq!(next_text(&mut ws), "21.5");

    // An MQTT client's PUBLISH (QoS 1: acknowledged once relayed, which
    // may be after its own copy) to all three, itself included (it
    // subscribed).
    v5.publish(
        "sensors/42/temp",
        b"22.0",
        Delivery::AtLeastOnce(9.try_into().unwrap()),
    );
    assert_eq!(puback_and_message(&mut v5), pair("sensors/42/temp", "22.0"));
    assert_eq!(v3.message(), pair("sensors/42/temp", "22.0"));
    assert_eq!(next_text(&mut ws), "22.0");

    // A QoS 0 one from a client subscribed to nothing.
    let mut publisher = Client::connect(mqtt, Version::V311, "");
    publisher.publish("other", b"elsewhere", Delivery::AtMostOnce);
    assert_eq!(v5.message(), pair("other", "elsewhere"));
    v3.quiet(Duration::from_millis(300));

    // PINGREQ, then UNSUBSCRIBE: no more messages, and 5.0 says which
    // filters had a subscription.
    v3.send(&Packet::Pingreq);
    assert_eq!(v3.next(), Some(Got::Pingresp));
    v5.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 3.try_into().unwrap(),
        properties: Properties::EMPTY,
        filters: vec!["sensors/42/temp", "never"],
    }));
    assert_eq!(v5.next(), Some(Got::Unsuback(3, vec![0x00, 0x11])));
    let (_, body) = publish(s.addr, "sensors/42/temp", b"23", None);
    assert!(body.contains("\"subscribers\":2"), "{body}");
    assert_eq!(v3.message(), pair("sensors/42/temp", "23"));
    assert_eq!(next_text(&mut ws), "23");
    v5.quiet(Duration::from_millis(300));
    assert_eq!(s.metric("throng_messages_published_total"), 4.0);
    s.wait_metric("throng_mqtt_connections", |v| v == 3.0);
    s.wait_metric(
        "throng_mqtt_packets_received_total{type=\"SUBSCRIBE\"}",
        |v| v == 2.0,
    );
    s.wait_metric("throng_mqtt_packets_sent_total{type=\"PUBACK\"}", |v| {
        v == 1.0
    });
    drop(publisher);
    s.wait_metric("throng_mqtt_connections", |v| v == 2.0);
}

#[test]
fn connack_says_no_session_was_kept_and_5_0_gets_an_assigned_id() {
    let (_s, mqtt) = mqtt_server(&[]);
    let mut v5 = Client::open(mqtt, Version::V5, "", 60, false);
    match v5.next() {
        Some(Got::Connack {
            session_present,
            code,
            assigned_id,
        }) => {
            assert!(!session_present, "a first connect finds no session");
            assert_eq!(code, 0);
            assert!(assigned_id.is_some_and(|id| id.starts_with("throng-")));
        }
        other => panic!("{other:?}"),
    }
    let mut v3 = Client::open(mqtt, Version::V311, "keep-me", 60, false);
    assert_eq!(
        v3.next(),
        Some(Got::Connack {
            session_present: false,
            code: 0,
            assigned_id: None
        })
    );
}

#[test]
fn wildcard_filters_match_and_a_message_matched_twice_comes_once() {
    let (s, mqtt) = mqtt_server(&["--workers", "1"]);
    let mut v5 = Client::connect(mqtt, Version::V5, "v5");
    let codes = v5.subscribe(1, &["site/+/door", "site/#", "bad topic", "site/7/door"]);
    assert_eq!(codes, [0x00, 0x00, 0x8F, 0x00]);
    let mut v3 = Client::connect(mqtt, Version::V311, "v3");
    assert_eq!(v3.subscribe(2, &["+/7/#"]), [0x00]);
    let (_, body) = publish(s.addr, "site/7/door", b"open", None);
    assert!(body.contains("\"subscribers\":2"), "{body}");
    assert_eq!(v5.message(), pair("site/7/door", "open"));
    assert_eq!(v3.message(), pair("site/7/door", "open"));
    publish(s.addr, "site/8/window", b"shut", None);
    assert_eq!(v5.message(), pair("site/8/window", "shut"), "site/#");
    v5.quiet(Duration::from_millis(300));
    v3.quiet(Duration::from_millis(100));
    // Unsubscribing one filter leaves the others.
    v5.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 4.try_into().unwrap(),
        properties: Properties::EMPTY,
        filters: vec!["site/#", "site/#"],
    }));
    assert_eq!(v5.next(), Some(Got::Unsuback(4, vec![0x00, 0x11])));
    publish(s.addr, "site/8/window", b"again", None);
    publish(s.addr, "site/9/door", b"knock", None);
    assert_eq!(v5.message(), pair("site/9/door", "knock"));
    s.wait_metric("throng_mqtt_refused_total{kind=\"bad_channel\"}", |v| {
        v == 1.0
    });
}

#[test]
fn a_silent_client_is_closed_after_one_and_a_half_keep_alives() {
    // The check rides the sweep, which visits each connection once per
    // ping interval: the close comes up to one interval late.
    let (s, mqtt) = mqtt_server(&["--ping-interval", "200ms"]);
    let mut v5 = Client::open(mqtt, Version::V5, "sleepy", 1, true);
    assert!(matches!(v5.next(), Some(Got::Connack { code: 0, .. })));
    let t0 = Instant::now();
    assert_eq!(v5.next(), Some(Got::Disconnect(0x8D)), "keep alive timeout");
    assert_eq!(v5.next(), None);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // One that pings is kept.
    let mut v3 = Client::open(mqtt, Version::V311, "awake", 1, true);
    assert!(matches!(v3.next(), Some(Got::Connack { code: 0, .. })));
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(700));
        v3.send(&Packet::Pingreq);
        assert_eq!(v3.next(), Some(Got::Pingresp));
    }
    s.wait_metric(
        "throng_connections_closed_total{reason=\"idle_timeout\"}",
        |v| v == 1.0,
    );
}

#[test]
fn bad_first_packets_get_the_protocols_answer_and_are_counted() {
    let (s, mqtt) = mqtt_server(&[]);
    // A PINGREQ before CONNECT: closed without a word.
    let mut raw = TcpStream::connect(mqtt).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(&[0xC0, 0x00]).unwrap();
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    assert!(got.is_empty(), "{got:?}");
    // Protocol level 3 (MQTT 3.1): CONNACK 0x01, unacceptable version.
    let mut raw = TcpStream::connect(mqtt).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut connect = vec![0x10, 14, 0, 6];
    connect.extend_from_slice(b"MQIsdp");
    connect.extend_from_slice(&[3, 0x02, 0, 60, 0, 2]);
    connect.extend_from_slice(b"id");
    connect[1] = (connect.len() - 2) as u8;
    raw.write_all(&connect).unwrap();
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    assert_eq!(got, [0x20, 0x02, 0x00, 0x01]);
    s.wait_metric(
        "throng_handshake_failures_total{reason=\"mqtt_bad_connect\"}",
        |v| v == 2.0,
    );
}

#[test]
fn bad_packets_after_connect_get_their_reason_code_and_are_counted() {
    let (s, mqtt) = mqtt_server(&["--max-message", "1024"]);
    let cases: [(&str, &[u8], u8, &str); 6] = [
        (
            "remaining length over 4 bytes",
            &[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01],
            0x81,
            "length",
        ),
        ("over --max-message", &[0x30, 0xA0, 0x1F], 0x95, "too_large"),
        (
            "invalid UTF-8 in a topic",
            &[0x30, 0x05, 0x00, 0x02, 0xC3, 0x28, 0x00],
            0x81,
            "utf8",
        ),
        (
            "a wildcard in a PUBLISH topic",
            &[0x30, 0x06, 0x00, 0x03, b'a', b'/', b'+', 0x00],
            0x90,
            "topic_name",
        ),
        (
            "packet id 0 at QoS 1",
            &[0x32, 0x06, 0x00, 0x01, b'a', 0x00, 0x00, 0x00],
            0x82,
            "packet_id_zero",
        ),
        (
            "SUBSCRIBE with no filters",
            &[0x82, 0x03, 0x00, 0x01, 0x00],
            0x82,
            "no_filters",
        ),
    ];
    for (what, bytes, code, label) in cases {
        let mut v5 = Client::connect(mqtt, Version::V5, "bad");
        v5.s.write_all(bytes).unwrap();
        assert_eq!(v5.next(), Some(Got::Disconnect(code)), "{what}");
        assert_eq!(v5.next(), None, "{what}: closed");
        s.wait_metric(
            &format!("throng_mqtt_refused_total{{kind=\"{label}\"}}"),
            |v| v == 1.0,
        );
        // 3.1.1 has no DISCONNECT from a server: closed without a word.
        let mut v3 = Client::connect(mqtt, Version::V311, "bad");
        v3.s.write_all(bytes).unwrap();
        assert_eq!(v3.next(), None, "3.1.1 {what}");
    }
    s.wait_metric(
        "throng_connections_closed_total{reason=\"protocol_error\"}",
        |v| v == 12.0,
    );
}

#[test]
fn a_will_is_published_when_its_client_goes_without_a_disconnect() {
    let (s, mqtt) = mqtt_server(&[]);
    let mut sub = Client::connect(mqtt, Version::V311, "sub");
    sub.subscribe(1, &["status/+"]);
    let mut ws = subscribe(s.addr, "status/a");
    // A clean DISCONNECT drops the will.
    let mut polite = Client::with_will(mqtt, Version::V5, "status/a", b"polite gone");
    assert!(matches!(polite.next(), Some(Got::Connack { code: 0, .. })));
    polite.send(&Packet::Disconnect(Disconnect::new(ReasonCode::SUCCESS)));
    assert_eq!(polite.next(), None);
    // A lost connection publishes it, to MQTT and WebSocket alike.
    let lost = Client::with_will(mqtt, Version::V311, "status/a", b"offline");
    let mut lost = lost;
    assert!(matches!(lost.next(), Some(Got::Connack { code: 0, .. })));
    drop(lost);
    assert_eq!(sub.message(), pair("status/a", "offline"));
    assert_eq!(next_text(&mut ws), "offline");
    sub.quiet(Duration::from_millis(300));
    // 5.0's "disconnect with will message" asks for it.
    let mut asks = Client::with_will(mqtt, Version::V5, "status/b", b"asked");
    assert!(matches!(asks.next(), Some(Got::Connack { code: 0, .. })));
    asks.send(&Packet::Disconnect(Disconnect::new(
        ReasonCode::DISCONNECT_WITH_WILL,
    )));
    assert_eq!(sub.message(), pair("status/b", "asked"));
    // A will on a topic that is not a channel is refused with the CONNECT.
    let mut bad = Client::with_will(mqtt, Version::V5, "not a channel", b"x");
    assert!(matches!(bad.next(), Some(Got::Connack { code: 0x90, .. })));
}

/// A server with one MQTT TLS listener (a self-signed certificate): the
/// listener's address and the certificate.
fn mqtts_server() -> (Server, SocketAddr, String) {
    let s = serve(&["--mqtts-listen", "127.0.0.1:0", "--tls-self-signed"]);
    let addr: SocketAddr = s.start["mqtts_listen"][0]
        .as_str()
        .and_then(|a| a.parse().ok())
        .expect("mqtts_listen in the start line");
    let pem = s.start["config"]["tls"]["cert_pem"]
        .as_str()
        .unwrap()
        .to_owned();
    (s, addr, pem)
}

#[test]
fn mqtts_listen_speaks_mqtt_over_tls_on_the_servers_certificate() {
    let (s, addr, pem) = mqtts_server();
    let cfg = crate::serve_tls::client_config(&pem, rustls::ALL_VERSIONS);
    let mut c = Client::over(crate::serve_tls::connect(addr, &cfg), Version::V5);
    c.send(&Packet::Connect(Connect {
        clean_start: true,
        keep_alive: 60,
        properties: Properties::EMPTY,
        client_id: "tls",
        will: None,
        username: None,
        password: None,
    }));
    assert!(matches!(c.next(), Some(Got::Connack { code: 0, .. })));
    assert_eq!(c.subscribe(1, &["secure/room"]), [0]);
    for i in 0..3 {
        let body = format!("sealed {i}");
        publish(s.addr, "secure/room", body.as_bytes(), None);
        assert_eq!(c.message(), pair("secure/room", &body));
    }
    c.send(&Packet::Pingreq);
    assert_eq!(c.next(), Some(Got::Pingresp));
    s.wait_metric("throng_mqtt_connections", |v| v == 1.0);
}

#[test]
fn a_drain_tells_5_0_subscribers_the_server_is_shutting_down() {
    let (s, mqtt) = mqtt_server(&[]);
    let mut v5 = Client::connect(mqtt, Version::V5, "v5");
    let mut v3 = Client::connect(mqtt, Version::V311, "v3");
    v5.subscribe(1, &["news"]);
    v3.subscribe(1, &["news"]);
    s.signal("TERM");
    assert_eq!(
        v5.next(),
        Some(Got::Disconnect(ReasonCode::SERVER_SHUTTING_DOWN.0))
    );
    assert_eq!(v5.next(), None);
    assert_eq!(v3.next(), None, "3.1.1: closed");
}

#[test]
fn an_mqtt_subscriber_on_one_node_gets_what_an_mqtt_client_publishes_on_another() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    for mode in ["pattern", "channels"] {
        let args = ["--redis", &url, "--redis-mode", mode];
        let (a, mqtt_a) = mqtt_server(&args);
        let (b, mqtt_b) = mqtt_server(&args);
        a.wait_broker("up");
        b.wait_broker("up");
        let mut sub = Client::connect(mqtt_a, Version::V5, "on-a");
        sub.subscribe(1, &["site/7/door"]);
        let mut ws = subscribe(b.addr, "site/7/door");
        let mut publisher = Client::connect(mqtt_b, Version::V311, "on-b");
        // Channels mode subscribes in Redis when the node's first
        // subscriber comes: publish until A has it.
        let mut n = 0;
        let got = loop {
            n += 1;
            let body = format!("open {n}");
            publisher.publish("site/7/door", body.as_bytes(), Delivery::AtMostOnce);
            assert_eq!(next_text(&mut ws), body, "{mode}: B's own subscriber");
            sub.s
                .set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut chunk = [0u8; 256];
            match sub.s.read(&mut chunk) {
                Ok(k) if k > 0 => {
                    sub.buf.extend_from_slice(&chunk[..k]);
                    sub.s
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .unwrap();
                    break sub.message();
                }
                _ => assert!(n < 50, "{mode}: A never got one"),
            }
        };
        assert_eq!(got.0, "site/7/door", "{mode}");
        assert!(got.1.starts_with("open "), "{mode}: {got:?}");
        publisher.publish("site/7/door", b"closed", Delivery::AtMostOnce);
        assert_eq!(sub.message(), pair("site/7/door", "closed"), "{mode}");
    }
}

#[test]
fn publishing_stays_where_publish_listen_and_auth_put_it() {
    let (s, mqtt) = mqtt_server(&["--publish-listen", "127.0.0.1:0"]);
    let mut sub = Client::connect(mqtt, Version::V5, "sub");
    sub.subscribe(1, &["news"]);
    let mut p = Client::connect(mqtt, Version::V5, "pub");
    p.publish("news", b"x", Delivery::AtLeastOnce(2.try_into().unwrap()));
    assert_eq!(p.next(), Some(Got::Puback(2, 0x87)), "not authorized");
    p.publish("news", b"y", Delivery::AtMostOnce);
    sub.quiet(Duration::from_millis(300));
    s.wait_metric(
        "throng_mqtt_refused_total{kind=\"publish_not_here\"}",
        |v| v == 2.0,
    );
}

#[test]
fn serve_help_teaches_mqtt_listen() {
    let out = crate::throng().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--mqtt-listen <HOST:PORT>"), "{help}");
    assert!(help.contains("A topic is a channel"), "{help}");
}

#[test]
fn the_start_says_where_mqtt_is() {
    let out = crate::throng()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--mqtt-listen",
            "127.0.0.1:0",
            "--dry-run",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("mqtt-listen"), "{text}");
}

#[test]
fn a_second_connect_with_a_client_id_takes_it_over_on_any_worker() {
    let (s, mqtt) = mqtt_server(&["--workers", "2"]);
    // Connections land on either worker: several rounds meet both cases.
    let mut old = Client::connect(mqtt, Version::V5, "device-7");
    for round in 1..=6 {
        let version = if round % 2 == 0 {
            Version::V311
        } else {
            Version::V5
        };
        let new = Client::connect(mqtt, version, "device-7");
        let was = old.version;
        if was == Version::V5 {
            assert_eq!(old.next(), Some(Got::Disconnect(0x8E)), "round {round}");
        }
        assert_eq!(old.next(), None, "round {round}: closed");
        old = new;
    }
    // The last one stands, and other ids are left alone.
    let mut other = Client::connect(mqtt, Version::V5, "device-8");
    old.send(&Packet::Pingreq);
    assert_eq!(old.next(), Some(Got::Pingresp));
    other.send(&Packet::Pingreq);
    assert_eq!(other.next(), Some(Got::Pingresp));
    s.wait_metric(
        "throng_connections_closed_total{reason=\"taken_over\"}",
        |v| v == 6.0,
    );
}

/// Connects as `version` with CONNECT properties `props`; the CONNACK is
/// the first [`Client::next`].
pub(crate) fn open_with(
    addr: SocketAddr,
    version: Version,
    id: &str,
    props: &[throng_proto::mqtt::Property<'_>],
) -> Client {
    let s = TcpStream::connect(addr).expect("connect to the MQTT listener");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut c = Client::over(s, version);
    let mut properties = throng_proto::mqtt::PropertiesBuf::new();
    for p in props {
        properties.push(*p).unwrap();
    }
    c.send(&Packet::Connect(Connect {
        clean_start: true,
        keep_alive: 60,
        properties: properties.properties(),
        client_id: id,
        will: None,
        username: None,
        password: None,
    }));
    c
}

#[test]
fn mqtt_5_rules_a_client_relies_on_are_kept() {
    use throng_proto::mqtt::{PropertiesBuf, Property};
    let (s, mqtt) = mqtt_server(&[]);
    // Enhanced authentication is not offered: CONNACK 0x8C.
    let mut c = open_with(
        mqtt,
        Version::V5,
        "auth",
        &[Property::AuthenticationMethod("SCRAM-SHA-1")],
    );
    assert!(
        matches!(c.next(), Some(Got::Connack { code: 0x8C, .. })),
        "bad authentication method"
    );
    assert_eq!(c.next(), None);

    // A Maximum Packet Size of 64: a larger message is skipped for it,
    // and counted; a smaller one comes, with its publisher's properties.
    let mut small = open_with(
        mqtt,
        Version::V5,
        "small",
        &[Property::MaximumPacketSize(64)],
    );
    assert!(matches!(small.next(), Some(Got::Connack { code: 0, .. })));
    assert_eq!(small.subscribe(1, &["rules/a"]), [0]);
    let mut p = Client::connect(mqtt, Version::V5, "publisher");
    p.publish("rules/a", &[b'x'; 100], Delivery::AtMostOnce);
    let mut props = PropertiesBuf::new();
    props.push(Property::UserProperty("k", "v")).unwrap();
    props.push(Property::ResponseTopic("rules/reply")).unwrap();
    props.push(Property::CorrelationData(b"42")).unwrap();
    p.send(&Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::AtMostOnce,
        retain: false,
        topic: "rules/a",
        properties: props.properties(),
        payload: b"fits",
    }));
    let got = small.next_as(|p| match p {
        Packet::Publish(p) => (
            String::from_utf8_lossy(p.payload).into_owned(),
            p.properties
                .iter()
                .map(|q| format!("{q:?}"))
                .collect::<Vec<_>>(),
        ),
        other => panic!("expected a PUBLISH, got {other:?}"),
    });
    let (payload, props) = got.unwrap();
    assert_eq!(payload, "fits", "the 100-byte one was skipped");
    assert_eq!(props.len(), 3, "{props:?}");
    s.wait_metric(
        "throng_mqtt_refused_total{kind=\"over_client_maximum_packet\"}",
        |v| v == 1.0,
    );

    // A Topic Alias, when CONNACK offered none: DISCONNECT 0x94.
    let mut alias = PropertiesBuf::new();
    alias.push(Property::TopicAlias(1)).unwrap();
    p.send(&Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::AtMostOnce,
        retain: false,
        topic: "rules/a",
        properties: alias.properties(),
        payload: b"aliased",
    }));
    assert_eq!(p.next(), Some(Got::Disconnect(0x94)));
    assert_eq!(p.next(), None);

    // A Subscription Identifier, when CONNACK said none are available:
    // DISCONNECT 0xA1.
    let mut ids = PropertiesBuf::new();
    ids.push(Property::SubscriptionIdentifier(7)).unwrap();
    let mut sub = Client::connect(mqtt, Version::V5, "with-id");
    sub.send(&Packet::Subscribe(Subscribe {
        packet_id: 1.try_into().unwrap(),
        properties: ids.properties(),
        filters: vec![("rules/a", SubscriptionOptions::qos(QoS::AtMostOnce))],
    }));
    assert_eq!(sub.next(), Some(Got::Disconnect(0xA1)));
    assert_eq!(sub.next(), None);
}

#[test]
fn subscriptions_past_max_subscriptions_or_max_filter_bytes_are_refused_and_counted() {
    let (s, mqtt) = mqtt_server(&["--max-subscriptions", "3", "--max-filter-bytes", "40"]);
    let mut v5 = Client::connect(mqtt, Version::V5, "v5");
    assert_eq!(
        v5.subscribe(1, &["l/a", "l/+", "l/c", "l/d"]),
        [0, 0, 0, 0x97]
    );
    // Again to one it has: no new subscription, granted.
    assert_eq!(v5.subscribe(2, &["l/a"]), [0]);
    // One gone frees a place.
    v5.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 3.try_into().unwrap(),
        properties: Properties::EMPTY,
        filters: vec!["l/c"],
    }));
    assert!(matches!(v5.next(), Some(Got::Unsuback(3, _))));
    assert_eq!(v5.subscribe(4, &["l/d"]), [0]);
    // 3.1.1 says 0x80; filter bytes count too (37 + 4 > 40).
    let mut v3 = Client::connect(mqtt, Version::V311, "v3");
    let long = format!("l/{}", "x".repeat(35));
    assert_eq!(v3.subscribe(1, &[&long, "l/yy"]), [0, 0x80]);
    assert_eq!(v3.subscribe(2, &["l/y"]), [0], "37 + 3 fits");
    s.wait_metric(
        "throng_mqtt_refused_total{kind=\"max_subscriptions\"}",
        |v| v == 1.0,
    );
    s.wait_metric(
        "throng_mqtt_refused_total{kind=\"max_filter_bytes\"}",
        |v| v == 1.0,
    );
}

#[test]
fn mqtts_listen_offers_alpn_mqtt_to_a_client_that_asks_for_it_alone() {
    use std::sync::Arc;
    let (_s, addr, pem) = mqtts_server();
    let mut cfg = (*crate::serve_tls::client_config(&pem, rustls::ALL_VERSIONS)).clone();
    cfg.alpn_protocols = vec![b"mqtt".to_vec()];
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).expect("TLS handshake");
    }
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"mqtt"[..]));
    let mut c = Client::over(tls, Version::V311);
    c.send(&Packet::Connect(Connect {
        clean_start: true,
        keep_alive: 60,
        properties: Properties::EMPTY,
        client_id: "alpn",
        will: None,
        username: None,
        password: None,
    }));
    assert!(matches!(c.next(), Some(Got::Connack { code: 0, .. })));
}

#[test]
fn a_retained_message_keeps_its_publishers_properties_and_qos_2() {
    use throng_proto::mqtt::{PropertiesBuf, Property};
    let (_s, mqtt) = mqtt_server(&[]);
    let mut p = Client::connect(mqtt, Version::V5, "publisher");
    let mut props = PropertiesBuf::new();
    props.push(Property::UserProperty("unit", "C")).unwrap();
    p.send(&Packet::Publish(Publish {
        dup: false,
        delivery: Delivery::ExactlyOnce(1.try_into().unwrap()),
        retain: true,
        topic: "kept/temp",
        properties: props.properties(),
        payload: b"21.5",
    }));
    assert!(matches!(p.next(), Some(Got::Other(s)) if s.starts_with("Pubrec")));
    let mut late = Client::connect(mqtt, Version::V5, "late");
    late.send(&Packet::Subscribe(Subscribe {
        packet_id: 1.try_into().unwrap(),
        properties: Properties::EMPTY,
        filters: vec![("kept/+", SubscriptionOptions::qos(QoS::ExactlyOnce))],
    }));
    assert_eq!(late.next(), Some(Got::Suback(1, vec![2])));
    let got = late.next_as(|p| match p {
        Packet::Publish(p) => (
            p.retain,
            p.delivery.qos(),
            p.properties
                .iter()
                .map(|q| format!("{q:?}"))
                .collect::<Vec<_>>(),
        ),
        other => panic!("expected a PUBLISH, got {other:?}"),
    });
    let (retain, qos, props) = got.unwrap();
    assert!(retain);
    assert_eq!(qos, QoS::ExactlyOnce);
    assert_eq!(props.len(), 1, "{props:?}");
    assert!(props[0].contains("unit"), "{props:?}");
}

/// `--mqtt-max-keep-alive`: a 5.0 client asking for more, or for none, is
/// told the server's in CONNACK (Server Keep Alive) and held to it; one
/// asking for less, and a 3.1.1 one, keep theirs.
#[test]
fn a_5_0_keep_alive_over_the_servers_maximum_is_told_the_maximum() {
    let (_s, mqtt) = mqtt_server(&["--mqtt-max-keep-alive", "60s"]);
    let server_keep_alive = |version, asked| {
        let mut c = Client::open(mqtt, version, "ka", asked, true);
        c.next_as(|p| match p {
            Packet::Connack(c) => c.properties.server_keep_alive(),
            other => panic!("{other:?}"),
        })
        .expect("a CONNACK")
    };
    assert_eq!(server_keep_alive(Version::V5, 120), Some(60));
    assert_eq!(server_keep_alive(Version::V5, 0), Some(60));
    assert_eq!(server_keep_alive(Version::V5, 30), None);
    assert_eq!(server_keep_alive(Version::V311, 120), None);
}
