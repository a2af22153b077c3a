//! MQTT persistent sessions in Redis (`--redis`, pattern mode): a client
//! that goes away from one node and comes back to another resumes its
//! session there (session present 1, its subscriptions, what was
//! published while it was away, in order, once), also after the node it
//! left was SIGKILLed, and after a restart of the only node; a clean
//! start ends it everywhere. Real Redis, real `throng serve` nodes, the
//! test's own MQTT client.

use std::net::SocketAddr;

use throng_proto::mqtt::{
    Ack, Delivery, Disconnect, Packet, PacketId, Properties, QoS, ReasonCode, Subscribe,
    SubscriptionOptions, Version,
};
use throng_testkit::http::publish;
use throng_testkit::redis::Redis;
use throng_testkit::{Peer, Server, require, wait_until};

use crate::mqtt_listen::{Client, Got, mqtt_server};

/// A node on `redis` with one worker, once its link is up.
fn node(redis: &Redis) -> (Server, SocketAddr) {
    let url = redis.url();
    let n = mqtt_server(&[
        "--redis",
        &url,
        "--mqtt-sessions-in-redis",
        "--workers",
        "1",
    ]);
    n.0.wait_broker("up");
    n
}

/// Connects `id` without clean session (3.1.1): CONNACK's session present.
fn connect(mqtt: SocketAddr, id: &str) -> (Client, bool) {
    let mut c = Client::open(mqtt, Version::V311, id, 60, false);
    match c.next() {
        Some(Got::Connack {
            session_present,
            code: 0,
            ..
        }) => (c, session_present),
        other => panic!("expected CONNACK 0, got {other:?}"),
    }
}

fn subscribe(c: &mut Client, filters: &[&str]) {
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: PacketId::MIN,
        properties: Properties::EMPTY,
        filters: filters
            .iter()
            .map(|f| (*f, SubscriptionOptions::qos(QoS::AtLeastOnce)))
            .collect(),
    }));
    assert_eq!(c.next(), Some(Got::Suback(1, vec![1; filters.len()])));
}

/// The next PUBLISH's payload and QoS, acknowledged.
fn receive(c: &mut Client) -> (String, u8) {
    let got = c.next_as(|p| match p {
        Packet::Publish(p) => Some((
            String::from_utf8_lossy(p.payload).into_owned(),
            p.delivery.qos() as u8,
            p.delivery.packet_id(),
        )),
        _ => None,
    });
    let Some(Some((payload, qos, id))) = got else {
        panic!("expected a PUBLISH, got {got:?}");
    };
    if let Some(id) = id {
        c.send(&Packet::Puback(Ack {
            packet_id: id,
            reason: ReasonCode::SUCCESS,
            properties: Properties::EMPTY,
        }));
    }
    (payload, qos)
}

/// Waits until Redis holds `n` sessions away, each ready (its node added
/// what its connection had not received).
fn wait_parked(redis: &Redis, n: usize) {
    wait_until(&format!("{n} sessions away in Redis"), || {
        let keys = redis.cli(&["--scan", "--pattern", "throng:#s:*"]);
        keys.len() == n
            && keys
                .iter()
                .all(|k| redis.cli(&["HGET", k, "ready"]) == ["1"])
    });
}

/// Reconnects `id` to `mqtt`: session present, then every one of `want`
/// in order at QoS 1, and nothing more: a marker published after them
/// (through `http`) is the next message.
fn resume(mqtt: SocketAddr, http: SocketAddr, id: &str, want: &[String]) -> Client {
    let (mut c, present) = connect(mqtt, id);
    assert!(present, "the session was found");
    for w in want {
        assert_eq!(receive(&mut c), (w.clone(), 1));
    }
    sent(http, "away/end", &format!("end-{id}"));
    assert_eq!(receive(&mut c), (format!("end-{id}"), 1), "none twice");
    c
}

/// Subscribes `id` on `mqtt` to `filters` with a persistent session and
/// goes away.
fn subscribe_and_leave(redis: &Redis, mqtt: SocketAddr, id: &str, filters: &[&str]) {
    let (mut c, present) = connect(mqtt, id);
    assert!(!present, "a first connect has no session");
    subscribe(&mut c, filters);
    c.send(&Packet::Disconnect(Disconnect::new(ReasonCode::SUCCESS)));
    drop(c);
    wait_parked(redis, 1);
}

/// Publishes over HTTP: accepted (200) whoever is subscribed.
fn sent(http: SocketAddr, channel: &str, body: &str) {
    let (status, reply) = publish(http, channel, body.as_bytes(), None);
    assert_eq!(status, 200, "{reply}");
}

fn publish_all(http: SocketAddr, round: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|k| {
            let body = format!("{round}-{k}");
            sent(http, &format!("away/{k}"), &body);
            body
        })
        .collect()
}

#[test]
fn a_session_left_on_one_node_resumes_on_another_with_what_came_meanwhile() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let (a, mqtt_a) = node(&redis);
    let (b, mqtt_b) = node(&redis);
    subscribe_and_leave(&redis, mqtt_a, "mover", &["away/+"]);
    assert_eq!(a.metric("throng_mqtt_sessions_stored_total"), 1.0);
    // Published on both nodes while the client is away, over HTTP and by
    // an MQTT client (sealed with its QoS on the way through Redis).
    let mut want = publish_all(b.addr, "b", 5);
    want.extend(publish_all(a.addr, "a", 3));
    let mut publisher = Client::connect(mqtt_b, Version::V311, "publisher");
    let id = PacketId::MIN;
    publisher.publish("away/9", b"by-mqtt", Delivery::AtLeastOnce(id));
    assert_eq!(publisher.next(), Some(Got::Puback(1, 0)));
    want.push("by-mqtt".to_owned());
    let c = resume(mqtt_b, b.addr, "mover", &want);
    drop(c);
    // Back again on A: the session went with it each time.
    wait_parked(&redis, 1);
    // Redis forgot the publish script (SCRIPT FLUSH): one publish is
    // refused, not lost, and the node loads it again.
    redis.cli(&["SCRIPT", "FLUSH"]);
    let (status, reply) = publish(b.addr, "away/0", b"refused", None);
    assert_eq!(status, 503, "{reply}");
    let want = publish_all(b.addr, "again", 2);
    drop(resume(mqtt_a, a.addr, "mover", &want));
    // A clean start ends it everywhere.
    wait_parked(&redis, 1);
    let mut clean = Client::open(mqtt_b, Version::V311, "mover", 60, true);
    assert!(matches!(clean.next(), Some(Got::Connack { code: 0, .. })));
    wait_until("the session ended in Redis", || {
        redis.cli(&["--scan", "--pattern", "throng:#s*"]).is_empty()
    });
    drop(clean);
    let (_, present) = connect(mqtt_a, "mover");
    assert!(!present, "ended by the clean start");
}

#[test]
fn a_session_outlives_the_node_it_left_killed_and_a_restart_of_the_only_node() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let (a, mqtt_a) = node(&redis);
    let (mut b, mqtt_b) = node(&redis);
    // Exact filters and a wildcard matching the same topics: each message once.
    let filters = ["away/#", "away/0", "away/1", "away/2", "away/end", "+/end"];
    subscribe_and_leave(&redis, mqtt_a, "survivor", &filters);
    let mut want = publish_all(a.addr, "before", 2);
    a.signal("KILL");
    drop(a);
    // Nobody holds the session now: the publishing node queues.
    want.extend(publish_all(b.addr, "after", 3));
    drop(resume(mqtt_b, b.addr, "survivor", &want));

    // The only node restarts while the client is away.
    wait_parked(&redis, 1);
    let want_before = publish_all(b.addr, "old", 2);
    b.signal("TERM");
    assert!(b.child.wait().expect("serve ends").success());
    let (c, mqtt_c) = node(&redis);
    let mut want = want_before;
    want.extend(publish_all(c.addr, "new", 2));
    drop(resume(mqtt_c, c.addr, "survivor", &want));
}

#[test]
fn a_session_connected_through_a_graceful_restart_is_kept_in_redis() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let (mut a, mqtt_a) = node(&redis);
    let (mut c, present) = connect(mqtt_a, "stayer");
    assert!(!present);
    subscribe(&mut c, &["away/+"]);
    // Connected while its node drains: the drain closes it, and its
    // session goes to Redis before the node exits.
    a.signal("TERM");
    assert!(a.child.wait().expect("serve ends").success());
    drop(c);
    wait_parked(&redis, 1);
    let (b, mqtt_b) = node(&redis);
    let want = publish_all(b.addr, "later", 2);
    drop(resume(mqtt_b, b.addr, "stayer", &want));
}

#[test]
fn a_session_connected_through_serve_takeover_is_kept_in_redis() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let args = [
        "--redis",
        &url,
        "--mqtt-sessions-in-redis",
        "--workers",
        "1",
        "--drain-spread",
        "1s",
    ];
    let (old, mqtt) = mqtt_server(&args);
    old.wait_broker("up");
    let (mut c, present) = connect(mqtt, "handed");
    assert!(!present);
    subscribe(&mut c, &["away/+"]);
    // The new serve takes the ports; the old one's drain closes the client
    // and parks its session in Redis before it exits.
    let listen = mqtt.to_string();
    let new = crate::takeover::take_over(
        &old,
        &[
            "--mqtt-listen",
            &listen,
            "--redis",
            &url,
            "--mqtt-sessions-in-redis",
        ],
    );
    wait_parked(&redis, 1);
    drop(c);
    new.wait_broker("up");
    let want = publish_all(new.addr, "handed", 2);
    drop(resume(mqtt, new.addr, "handed", &want));
}

#[test]
fn a_client_that_moves_while_still_connected_takes_its_session_along() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let (a, mqtt_a) = node(&redis);
    let (b, mqtt_b) = node(&redis);
    let (mut old, present) = connect(mqtt_a, "restless");
    assert!(!present);
    subscribe(&mut old, &["away/+"]);
    sent(a.addr, "away/1", "on-a");
    assert_eq!(receive(&mut old), ("on-a".to_owned(), 1));
    // Connected to B while A still holds it: A closes its connection (the
    // takeover across nodes) and parks the session, which B waits for.
    let (mut new, present) = connect(mqtt_b, "restless");
    assert!(present, "the session came along\n{}", b.log());
    sent(a.addr, "away/2", "after-the-move");
    assert_eq!(receive(&mut new), ("after-the-move".to_owned(), 1));
    assert_eq!(old.next(), None, "A closed the old connection");
}

#[test]
fn a_5_0_resume_without_expiry_ends_the_session_with_its_connection() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let (_a, mqtt_a) = node(&redis);
    let (b, mqtt_b) = node(&redis);
    subscribe_and_leave(&redis, mqtt_a, "brief", &["away/+"]);
    sent(b.addr, "away/1", "kept");
    // 5.0, clean start 0, no Session Expiry Interval: resumed, then over.
    let mut c = Client::open(mqtt_b, Version::V5, "brief", 60, false);
    assert!(matches!(
        c.next(),
        Some(Got::Connack {
            session_present: true,
            code: 0,
            ..
        })
    ));
    assert_eq!(receive(&mut c), ("kept".to_owned(), 1));
    drop(c);
    wait_until("nothing of it left in Redis", || {
        redis.cli(&["--scan", "--pattern", "throng:#s*"]).is_empty()
    });
    let (_, present) = connect(mqtt_a, "brief");
    assert!(!present, "it ended with the 5.0 connection");
}

/// Without `--mqtt-sessions-in-redis`, `--redis` leaves sessions to their
/// node and publishes are a bare PUBLISH: nothing is stored in Redis, and
/// a client that moves to another node starts afresh there.
#[test]
fn without_the_flag_sessions_stay_on_their_node_and_publishes_stay_bare() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let plain = || {
        let n = mqtt_server(&["--redis", &url, "--workers", "1"]);
        n.0.wait_broker("up");
        n
    };
    let ((a, mqtt_a), (b, mqtt_b)) = (plain(), plain());
    let (mut c, present) = connect(mqtt_a, "stays");
    assert!(!present);
    subscribe(&mut c, &["away/+"]);
    c.send(&Packet::Disconnect(Disconnect::new(ReasonCode::SUCCESS)));
    drop(c);
    // Kept by A: a publish is queued there for it while it is away.
    a.wait_metric("throng_mqtt_sessions_parked", |v| v == 1.0);
    sent(b.addr, "away/1", "kept-by-a");
    let (c, present) = connect(mqtt_b, "other");
    assert!(!present);
    drop(c);
    assert!(redis.cli(&["--scan", "--pattern", "throng:#s*"]).is_empty());
    let scripts = redis.cli(&["INFO", "commandstats"]);
    assert!(
        !scripts
            .iter()
            .any(|l| l.starts_with("cmdstat_evalsha") || l.starts_with("cmdstat_eval:")),
        "{scripts:?}"
    );
    // Back on A, its session and what came meanwhile.
    let (mut c, present) = connect(mqtt_a, "stays");
    assert!(present);
    assert_eq!(receive(&mut c), ("kept-by-a".to_owned(), 1));
}

/// The flag where the nodes cannot share sessions is refused at start.
#[test]
fn the_flag_is_refused_where_sessions_cannot_be_shared() {
    let out = throng_testkit::process::output_within(
        crate::throng().args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--redis",
            "redis://127.0.0.1:1",
            "--redis-mode",
            "channels",
            "--mqtt-sessions-in-redis",
        ]),
        std::time::Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--mqtt-sessions-in-redis needs one Redis in pattern mode"),
        "{err}"
    );
    let out = throng_testkit::process::output_within(
        crate::throng().args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--mqtt-sessions-in-redis",
        ]),
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--redis"));
}
