//! MQTT across the nodes of one Redis, in every mode, with paho-mqtt
//! (Python) as the client: a client id that connects to another node
//! closes its old connection there (MQTT-3.1.4-2; 5.0 DISCONNECT 0x8E) in
//! `--redis-mode channels` and on a Redis Cluster as in pattern mode
//! (`mqtt_redis.rs`), and a shared subscription with members on two nodes
//! gets each message once in all, the living node taking a dead one's
//! share.

use std::io::{BufRead as _, BufReader, Lines};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use throng_testkit::http::publish_redis;
use throng_testkit::peers::dir;
use throng_testkit::process::command;
use throng_testkit::redis::Redis;
use throng_testkit::redis_cluster::Cluster;
use throng_testkit::{Peer, Server, require, wait_until};

use crate::mqtt_listen::mqtt_server;
use crate::mqtt_session::share_sub;

/// A paho 5.0 client connected as `id` that never reconnects, and its
/// output's lines after `{"connected": true}`.
struct Held {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Held {
    fn connect(mqtt: SocketAddr, id: &str) -> Self {
        let mut child = command("python3")
            .arg(dir().join("mqtt_peer.py"))
            .args(["hold", "127.0.0.1", &mqtt.port().to_string(), "-"])
            .args(["--client-id", id, "--v5", "--timeout", "60"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start paho");
        let out = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(out).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(first, r#"{"connected": true}"#);
        Self { child, lines }
    }

    /// The DISCONNECT reason the server ended it with (-1: none).
    fn ended(mut self) -> i64 {
        let line = self.lines.next().and_then(Result::ok).unwrap_or_default();
        let _ = self.child.wait();
        let v: Value = serde_json::from_str(&line).unwrap_or_default();
        v["disconnected"].as_i64().expect("a disconnected line")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects "roamer" to node A, then to B: A's is closed with 0x8E; and
/// back to A: B's is.
fn roam(a: &Server, mqtt_a: SocketAddr, mqtt_b: SocketAddr, b: &Server) {
    let first = Held::connect(mqtt_a, "roamer");
    let second = Held::connect(mqtt_b, "roamer");
    assert_eq!(first.ended(), 0x8E, "{}", a.log());
    a.wait_metric(
        "throng_connections_closed_total{reason=\"taken_over\"}",
        |v| v == 1.0,
    );
    let third = Held::connect(mqtt_a, "roamer");
    assert_eq!(second.ended(), 0x8E, "{}", b.log());
    b.wait_metric(
        "throng_connections_closed_total{reason=\"taken_over\"}",
        |v| v == 1.0,
    );
    // A's own claim came back to it through Redis and closed nothing.
    assert_eq!(
        a.metric("throng_connections_closed_total{reason=\"taken_over\"}"),
        1.0
    );
    drop(third);
    // The control channels are not subscriptions of the node's.
    assert_eq!(a.metric("throng_broker_subscriptions"), 0.0);
}

/// `PUBSUB SHARDNUMSUB`'s count from its `cli` lines.
fn subscribers(cli: &[String]) -> Option<u32> {
    cli.get(1).and_then(|n| n.parse().ok())
}

#[test]
fn in_channels_mode_a_client_id_moving_to_another_node_is_taken_over() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::PythonPaho);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let args = [
        "--redis",
        &url,
        "--redis-mode",
        "channels",
        "--workers",
        "1",
    ];
    let ((a, mqtt_a), (b, mqtt_b)) = (mqtt_server(&args), mqtt_server(&args));
    a.wait_broker("up");
    b.wait_broker("up");
    // Each node is subscribed to the claims channel without a subscriber.
    wait_until("both nodes on throng:#claims", || {
        redis.numsub("throng:#claims") == 2
    });
    roam(&a, mqtt_a, mqtt_b, &b);
}

#[test]
fn on_a_redis_cluster_a_client_id_moving_to_another_node_is_taken_over() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::PythonPaho);
    let c = Cluster::start(3, 0);
    let seeds = c.seeds();
    let args = ["--redis-cluster", &seeds, "--workers", "1"];
    let ((a, mqtt_a), (b, mqtt_b)) = (mqtt_server(&args), mqtt_server(&args));
    a.wait_broker("up");
    b.wait_broker("up");
    // Sharded pub/sub: the claims channel on its slot's master.
    let master = c.node(c.master_of("throng:#claims"));
    wait_until("both nodes on throng:#claims", || {
        subscribers(&master.cli(&["PUBSUB", "SHARDNUMSUB", "throng:#claims"])) == Some(2)
    });
    roam(&a, mqtt_a, mqtt_b, &b);
}

/// A paho subscriber of `filter` (QoS 1, 5.0) whose payloads a thread
/// collects as they come.
struct Member {
    child: Child,
    got: Arc<Mutex<Vec<String>>>,
}

impl Member {
    fn start(mqtt: SocketAddr, filter: &str) -> Self {
        let mut child = share_sub(mqtt, filter, 100_000);
        let out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let got = Arc::new(Mutex::new(Vec::new()));
        let into = got.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).unwrap_or_default();
                if let Some(p) = v.get("payload").and_then(Value::as_str) {
                    into.lock().unwrap().push(p.to_owned());
                }
            }
        });
        Self { child, got }
    }

    fn got(&self) -> Vec<String> {
        self.got.lock().unwrap().clone()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (a generous minute) until `members` got `n` messages in all.
fn wait_total(members: &[&Member], n: usize) {
    let start = Instant::now();
    loop {
        let total: usize = members.iter().map(|m| m.got().len()).sum();
        if total >= n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{total} of {n} messages came to the members"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two members of `$share/g/s` on node A, one on B, a plain subscriber of
/// `s` on A: 40 messages published on A reach the group once each in all
/// (both nodes' members have some); B dies, and once A forgets it A's
/// members get every message. `broker`: the nodes' Redis flags.
fn one_member_in_the_deployment(broker: &[&str]) {
    let mut args = vec!["--workers", "1"];
    args.extend_from_slice(broker);
    let ((a, mqtt_a), (b, mqtt_b)) = (mqtt_server(&args), mqtt_server(&args));
    a.wait_broker("up");
    b.wait_broker("up");
    let (a1, a2) = (
        Member::start(mqtt_a, "$share/g/s"),
        Member::start(mqtt_a, "$share/g/s"),
    );
    let b1 = Member::start(mqtt_b, "$share/g/s");
    let plain = Member::start(mqtt_a, "s");
    // Each node knows all three members, its own as heard back.
    a.wait_metric("throng_mqtt_shared_cluster_members", |v| v == 3.0);
    b.wait_metric("throng_mqtt_shared_cluster_members", |v| v == 3.0);
    let sent: Vec<String> = (0..40).map(|k| format!("m{k}")).collect();
    for m in &sent {
        publish_redis(a.addr, "s", m);
    }
    wait_total(&[&plain], 40);
    wait_total(&[&a1, &a2, &b1], 40);
    // Every delivery is counted where it was written: the plain
    // subscriber's 40 and the group's 40, none twice.
    let delivered = "throng_frames_delivered_total";
    a.wait_metric(delivered, |v| v + b.metric(delivered) >= 80.0);
    assert_eq!(a.metric(delivered) + b.metric(delivered), 80.0);
    let mut all: Vec<String> = [&a1, &a2, &b1].iter().flat_map(|m| m.got()).collect();
    all.sort();
    let mut want = sent;
    want.sort();
    assert_eq!(all, want, "each message to one member in all");
    assert!(!b1.got().is_empty(), "B's member has its share");
    assert!(!a1.got().is_empty() && !a2.got().is_empty(), "so have A's");

    // B dies: A forgets it (5 s unheard) and takes its share.
    let a_before = a.metric(delivered);
    drop(b);
    drop(b1);
    a.wait_metric("throng_mqtt_shared_cluster_members", |v| v == 2.0);
    let before = a1.got().len() + a2.got().len();
    for k in 40..60 {
        publish_redis(a.addr, "s", &format!("m{k}"));
    }
    wait_total(&[&plain], 60);
    wait_total(&[&a1, &a2], before + 20);
    a.wait_metric(delivered, |v| v >= a_before + 40.0);
    assert_eq!(a.metric(delivered), a_before + 40.0);
    let mut late: Vec<String> = [&a1, &a2].iter().flat_map(|m| m.got()).collect();
    late.retain(|p| p[1..].parse::<u32>().is_ok_and(|k| k >= 40));
    late.sort();
    let mut want: Vec<String> = (40..60).map(|k| format!("m{k}")).collect();
    want.sort();
    assert_eq!(late, want);
}

#[test]
fn a_shared_subscription_with_members_on_two_nodes_gets_each_message_once() {
    require!(Peer::RedisServer, Peer::PythonPaho);
    let redis = Redis::start(&[], &[]);
    one_member_in_the_deployment(&["--redis", &redis.url()]);
}

#[test]
fn in_channels_mode_a_node_with_only_shared_members_subscribes_and_shares_too() {
    require!(Peer::RedisServer, Peer::PythonPaho);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    one_member_in_the_deployment(&["--redis", &url, "--redis-mode", "channels"]);
}

/// On a cluster the members' announcements and the messages are on
/// different masters: once every node has heard every member (the gauge),
/// each message still goes to one member in all.
#[test]
fn on_a_redis_cluster_a_shared_subscription_gets_each_message_once() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::PythonPaho);
    let c = Cluster::start(3, 0);
    one_member_in_the_deployment(&["--redis-cluster", &c.seeds()]);
}
