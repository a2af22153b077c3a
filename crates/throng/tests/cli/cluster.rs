//! `throng serve` past one Redis, against real ones: a 3-master Redis
//! Cluster (sharded pub/sub, each channel on its slot's master, history
//! through the shard, pattern mode refused), a master killed mid-run in a
//! cluster with replicas and behind Sentinel, and what happened to each
//! message published meanwhile: delivered, or answered as failed; never
//! acknowledged and lost.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use throng_testkit::http::{get, publish, publish_redis};
use throng_testkit::process::output_within;
use throng_testkit::redis_cluster::{Cluster, Sentinel};
use throng_testkit::ws::{Sub, next_text, subscribe};
use throng_testkit::{Peer, Server, require, wait_until};

use crate::{serve, throng};

/// GETs `path` until its JSON answer satisfies `ok` (another node's counts
/// arrive with its next write, every 5 s), within a generous minute.
fn wait_json(
    addr: SocketAddr,
    path: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let (status, body) = get(addr, path);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && ok(&v) {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{path}: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A node on the cluster; returns once every shard's link is up.
fn cluster_node(c: &Cluster, extra: &[&str]) -> Server {
    let seeds = c.seeds();
    let mut args = vec!["--redis-cluster", &seeds, "--workers", "1"];
    args.extend_from_slice(extra);
    let s = serve(&args);
    s.wait_broker("up");
    s
}

#[test]
fn three_masters_each_channel_on_its_shard_and_history_publishes() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let c = Cluster::start(3, 0);
    let a = cluster_node(&c, &["--history", "10"]);
    // Every node of a deployment shares --history (B reads the ids).
    let b = cluster_node(&c, &["--history", "10"]);
    let channels: Vec<String> = (0..12).map(|i| format!("room.{i}")).collect();
    let mut subs: Vec<Sub> = channels.iter().map(|ch| subscribe(b.addr, ch)).collect();
    b.wait_metric("throng_broker_subscriptions", |v| v == 12.0);
    // The channels are spread over the masters, each subscribed on its own.
    let mut masters = BTreeSet::new();
    for ch in &channels {
        let key = format!("throng:{ch}");
        let m = c.master_of(&key);
        masters.insert(m);
        let owner = c.nodes.iter().find(|n| n.port == m).expect("a node");
        let n = owner.cli(&["PUBSUB", "SHARDNUMSUB", &key]);
        assert_eq!(n.get(1).map(String::as_str), Some("1"), "{key} on {m}");
    }
    assert_eq!(masters.len(), 3, "12 channels over 3 masters: {masters:?}");
    for (ch, s) in channels.iter().zip(&mut subs) {
        // Through A's history script (XADD + SPUBLISH on the shard): B
        // is the one subscribed node.
        assert_eq!(publish_redis(a.addr, ch, &format!("to {ch}")), 1);
        assert_eq!(next_text(s), format!("to {ch}"));
    }
    for m in &masters {
        let up = format!("throng_broker_shard_up{{shard=\"127.0.0.1:{m}\"}}");
        assert_eq!(a.metric(&up), 1.0, "{up}");
    }
    let (_, health) = get(a.addr, "/healthz");
    assert!(health.contains("broker: up (cluster"), "{health}");
    // Node A has no subscriber; it counts B's through the cluster (the
    // counts' keys on one master, reached through MOVED from any seed).
    let listed = wait_json(a.addr, "/api/channels?prefix=room.&limit=1000", |v| {
        v["channels"].as_array().is_some_and(|l| l.len() == 12)
    });
    assert_eq!(listed["scope"], "cluster", "{listed}");
    let one = wait_json(a.addr, "/api/channels/room.7", |v| v["subscribers"] == 1);
    assert_eq!(one["scope"], "cluster", "{one}");
    // Read from the shard's stream on a node with no subscriber of it.
    assert_eq!(
        one["last_id"],
        wait_json(b.addr, "/api/channels/room.7", |_| true)["last_id"]
    );
    assert!(one["last_id"].is_string(), "{one}");
    let m = c.master_of("{throng:#counts}:nodes");
    let owner = c.nodes.iter().find(|n| n.port == m).expect("a node");
    assert_eq!(owner.cli(&["ZCARD", "{throng:#counts}:nodes"]), ["2"]);
    // Pattern mode has no sharded form: refused at start, with the reason.
    let seeds = c.seeds();
    let out = output_within(
        throng().args(["serve", "--listen", "127.0.0.1:0"]).args([
            "--redis-cluster",
            &seeds,
            "--redis-mode",
            "pattern",
        ]),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("pattern cannot run on a Redis Cluster") && err.contains("channels"),
        "{err}"
    );
    // A hash tag in the prefix would put every channel in one slot.
    let out = output_within(
        throng().args(["serve", "--listen", "127.0.0.1:0"]).args([
            "--redis-cluster",
            &seeds,
            "--redis-prefix",
            "{app}:",
        ]),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("has a brace"),
        "{err}"
    );
}

/// What became of one published message.
#[derive(Debug, Default, Clone, Copy)]
struct Fate {
    /// The publish answered 200.
    acked: bool,
    /// Redis's receiver count in the answer.
    receivers: u64,
    /// Its subscriber got it.
    delivered: bool,
}

/// One published message: its number, what became of it, when it went.
type Sent = (usize, Fate, Duration);

/// Whether the last `n` publishes were all acknowledged.
fn last_acked(sent: &[Sent], n: usize) -> bool {
    sent.len() >= n && sent.iter().rev().take(n).all(|(_, f, _)| f.acked)
}

/// Publishes `"<i>"` on `channels[i % n]` through `node` every 10 ms;
/// `during(i, elapsed, sent so far)` is called before each and says
/// whether to go on (bounded by the caller). Returns each message's answer.
fn publish_until(
    node: SocketAddr,
    channels: &[String],
    mut during: impl FnMut(usize, Duration, &[Sent]) -> bool,
) -> Vec<Sent> {
    let t0 = Instant::now();
    let mut sent = Vec::new();
    for i in 0.. {
        if !during(i, t0.elapsed(), &sent) {
            break;
        }
        let ch = &channels[i % channels.len()];
        let at = t0.elapsed();
        let (status, body) = publish(node, ch, i.to_string().as_bytes(), None);
        let receivers = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["redis_receivers"].as_u64())
            .unwrap_or(0);
        let fate = Fate {
            acked: status == 200,
            receivers,
            delivered: false,
        };
        assert!(status == 200 || status == 503, "{status} {body}");
        sent.push((i, fate, at));
        std::thread::sleep(Duration::from_millis(10));
    }
    sent
}

/// Publishes `end` on every channel (retrying while it is refused), reads
/// each subscriber up to it and marks what arrived.
fn collect(node: SocketAddr, channels: &[String], subs: &mut [Sub], sent: &mut [Sent]) {
    for ch in channels {
        wait_until("the end marker to be published", || {
            publish(node, ch, b"end", None).0 == 200
        });
    }
    let mut got = BTreeSet::new();
    for s in subs.iter_mut() {
        loop {
            let t = next_text(s);
            if t == "end" {
                break;
            }
            got.insert(t.parse::<usize>().expect("a number"));
        }
    }
    for (i, f, _) in sent.iter_mut() {
        f.delivered = got.contains(i);
    }
}

/// When publishes were refused: the first and the last 503.
fn refused_span(sent: &[Sent]) -> Option<(Duration, Duration)> {
    let mut r = sent.iter().filter(|(_, f, _)| !f.acked).map(|s| s.2);
    let first = r.next()?;
    Some((first, r.next_back().unwrap_or(first)))
}

/// Counts by fate, printed (the test's output shows what happened).
fn tally(what: &str, sent: &[Sent]) -> BTreeMap<&'static str, usize> {
    let mut t = BTreeMap::new();
    for (_, f, _) in sent {
        let k = match (f.acked, f.delivered) {
            (true, true) => "acknowledged, delivered",
            (true, false) => "acknowledged, LOST",
            (false, false) => "answered 503, not delivered",
            (false, true) => "answered 503 (may or may not), delivered",
        };
        *t.entry(k).or_default() += 1;
    }
    eprintln!("{what}: {} messages: {t:?}", sent.len());
    t
}

#[test]
fn a_killed_cluster_master_fails_only_its_channels_until_its_replica_takes_over() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let mut c = Cluster::start(3, 1);
    let a = cluster_node(&c, &[]);
    let channels: Vec<String> = (0..9).map(|i| format!("k.{i}")).collect();
    let mut subs: Vec<Sub> = channels.iter().map(|ch| subscribe(a.addr, ch)).collect();
    a.wait_metric("throng_broker_subscriptions", |v| v == 9.0);
    let victim = c.master_of("throng:k.0");
    let on_victim: BTreeSet<usize> = (0..channels.len())
        .filter(|&i| c.master_of(&format!("throng:{}", channels[i])) == victim)
        .collect();
    let (mut killed_at, mut failover) = (None, None);
    let mut seen_down = None;
    let shard_up = format!("throng_broker_shard_up{{shard=\"127.0.0.1:{victim}\"}}");
    let mut sent = publish_until(a.addr, &channels, |i, t, _| {
        if i == 60 {
            c.kill(victim);
            killed_at = Some(t);
        }
        if i == 75 {
            // What an operator sees while the master is down.
            seen_down = Some((get(a.addr, "/healthz").1, a.metric(&shard_up)));
        }
        if let Some(k) = killed_at
            && failover.is_none()
            && i % 10 == 0
            && c.try_master_of("throng:k.0").is_some_and(|m| m != victim)
        {
            failover = Some(t - k);
        }
        // Until 2 s after the failover was seen, 40 s at most.
        let done =
            failover.is_some_and(|f| t > killed_at.unwrap_or(t) + f + Duration::from_secs(2));
        !done && t < Duration::from_secs(40)
    });
    assert!(failover.is_some(), "the replica took over");
    let (health, up) = seen_down.expect("looked while it was down");
    assert!(
        health.contains("broker: down for")
            && health.contains(&format!("shard 127.0.0.1:{victim} unreachable"))
            && health.contains("2 of 3 shards up")
            && up == 0.0,
        "{health} {shard_up} {up}"
    );
    collect(a.addr, &channels, &mut subs, &mut sent);
    let t = tally("cluster master killed", &sent);
    assert_eq!(t.get("acknowledged, LOST"), None, "{sent:?}");
    // Only the killed master's channels were refused; the others went on.
    let refused: BTreeSet<usize> = sent
        .iter()
        .filter(|(_, f, _)| !f.acked)
        .map(|(i, ..)| i % channels.len())
        .collect();
    assert!(!refused.is_empty(), "some publishes hit the dead master");
    assert!(
        refused.is_subset(&on_victim),
        "{refused:?} vs {on_victim:?}"
    );
    // And they publish again on the promoted replica.
    let last = sent
        .iter()
        .rev()
        .find(|(i, ..)| on_victim.contains(&(i % channels.len())))
        .expect("a message to the victim's shard");
    assert!(last.1.acked && last.1.delivered, "{last:?}");
    let first_refused = sent.iter().find(|(_, f, _)| !f.acked).map(|s| s.2);
    let back = sent
        .iter()
        .filter(|(i, f, at)| {
            f.acked && on_victim.contains(&(i % channels.len())) && Some(*at) > first_refused
        })
        .map(|s| s.2)
        .next();
    eprintln!(
        "timeline: killed at {killed_at:?}, first 503 at {first_refused:?}, failover seen after \
         {failover:?}, its channels acknowledged again at {back:?}"
    );
}

#[test]
fn a_slot_moved_mid_run_with_history_loses_no_acknowledged_publish() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let c = Cluster::start(3, 0);
    let a = cluster_node(&c, &["--history", "100"]);
    let channels: Vec<String> = (0..6).map(|i| format!("m.{i}")).collect();
    let mut subs: Vec<Sub> = channels.iter().map(|ch| subscribe(a.addr, ch)).collect();
    a.wait_metric("throng_broker_subscriptions", |v| v == 6.0);
    let key = "throng:m.0";
    let (slot, from) = (c.slot(key), c.master_of(key));
    let to = c
        .nodes
        .iter()
        .map(|n| n.port)
        .find(|&p| p != from)
        .expect("another master");
    let mut sent = Vec::new();
    let moved_in = std::thread::scope(|scope| {
        let mover = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            let t = Instant::now();
            c.move_slot(slot, from, to, Duration::from_millis(300));
            t.elapsed()
        });
        sent = publish_until(a.addr, &channels, |_, t, so_far| {
            // Until 30 in a row went through after the move, 30 s at most.
            let done = mover.is_finished() && last_acked(so_far, 30);
            !done && t < Duration::from_secs(30)
        });
        mover.join().expect("the move")
    });
    assert_eq!(c.master_of(key), to, "the slot moved");
    collect(a.addr, &channels, &mut subs, &mut sent);
    let t = tally("slot moved between masters", &sent);
    assert_eq!(t.get("acknowledged, LOST"), None, "{sent:?}");
    let n = c.node(to).cli(&["PUBSUB", "SHARDNUMSUB", key]);
    assert_eq!(
        n.get(1).map(String::as_str),
        Some("1"),
        "resubscribed on {to}"
    );
    eprintln!(
        "slot {slot} moved {from} -> {to} in {moved_in:?}; publishes refused (first, last) {:?}",
        refused_span(&sent)
    );
}

#[test]
fn sentinel_failover_moves_both_nodes_and_loses_no_acknowledged_publish() {
    require!(Peer::RedisServer, Peer::RedisCli, Peer::RedisSentinel);
    let mut s = Sentinel::start();
    let node = |extra: &[&str]| {
        let at = s.addr();
        let mut args = vec![
            "--redis-sentinel",
            &at,
            "--redis-master",
            "mymaster",
            "--workers",
            "1",
        ];
        args.extend_from_slice(extra);
        let n = serve(&args);
        n.wait_broker("up");
        n
    };
    let a = node(&[]);
    let b = node(&["--redis-mode", "channels"]);
    let channels: Vec<String> = (0..4).map(|i| format!("s.{i}")).collect();
    let mut on_a: Vec<Sub> = channels.iter().map(|ch| subscribe(a.addr, ch)).collect();
    let mut on_b: Vec<Sub> = channels.iter().map(|ch| subscribe(b.addr, ch)).collect();
    b.wait_metric("throng_broker_subscriptions", |v| v == 4.0);
    let (old, new) = (s.master.port, s.replica.port);
    assert_eq!(s.master_port(), old);
    let mut killed_at = None;
    let mut switched = None;
    let mut sent = publish_until(a.addr, &channels, |i, t, so_far| {
        if i == 40 {
            s.master.stop();
            killed_at = Some(t);
        }
        if killed_at.is_some() && switched.is_none() && i % 10 == 0 && s.master_port() == new {
            switched = Some(t);
        }
        // Until 40 in a row went through on the new master, 40 s at most.
        let done = switched.is_some() && last_acked(so_far, 40);
        !done && t < Duration::from_secs(40)
    });
    assert!(switched.is_some(), "Sentinel promoted the replica");
    // Both nodes on the new master before the end markers go out.
    a.wait_broker("up");
    b.wait_broker("up");
    let mut on_b_sent = sent.clone();
    collect(a.addr, &channels, &mut on_a, &mut sent);
    // B saw the same messages; read its subscribers up to the same markers.
    for sub in &mut on_b {
        let mut got = BTreeSet::new();
        while let Ok(n) = next_text(sub).parse::<usize>() {
            got.insert(n);
        }
        for (i, f, _) in on_b_sent.iter_mut() {
            if got.contains(i) {
                f.delivered = true;
            }
        }
    }
    let t = tally(
        "Sentinel failover, subscribers on the publishing node",
        &sent,
    );
    assert_eq!(t.get("acknowledged, LOST"), None, "{sent:?}");
    assert!(t.contains_key("answered 503, not delivered"), "{t:?}");
    // On the other node: an acknowledged message reached it unless the
    // answer said fewer than two nodes received it.
    let tb = tally(
        "Sentinel failover, subscribers on the other node",
        &on_b_sent,
    );
    for (i, f, _) in &on_b_sent {
        assert!(
            !f.acked || f.delivered || f.receivers < 2,
            "message {i}: acknowledged to 2 receivers, not delivered on B ({tb:?})"
        );
    }
    assert!(a.log().contains("lost Redis"), "{}", a.log());
    eprintln!(
        "timeline: master {old} killed at {killed_at:?}, Sentinel named {new} at {switched:?}, \
         publishes refused (first, last) {:?}",
        refused_span(&sent)
    );
    let _ = s.log();
}
