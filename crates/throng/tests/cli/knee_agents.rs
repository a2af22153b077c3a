//! `throng knee --agents`: every level a run on real agents (this binary,
//! on loopback) through a real `redis-server`, against a real `throng
//! serve`; the levels' figures merged over both agents, and the
//! generator's verdict taken over both.

use serde_json::Value;
use throng_testkit::{Peer, TempDir, require};

use crate::agents::{Spawned, one_at_a_time, two_agents};
use crate::knee::{QUICK, SATURATING, knee};

/// Every interval record of the search's result file.
fn intervals(dir: &TempDir) -> Vec<Value> {
    let file = std::fs::read_dir(dir.path())
        .expect("the out dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .expect("a result file");
    std::fs::read_to_string(file)
        .expect("read it")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["type"] == "interval")
        .collect()
}

#[test]
fn a_knee_on_agents_runs_each_level_on_every_agent_and_blames_their_lag() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let t = two_agents();
    let url = format!("http://{}/ping", t.server.addr);

    // A target that never breaks: every level passes, each run on both agents.
    let dir = TempDir::new("knee-agents");
    let s = knee(
        &dir,
        &[
            &["attack", "--url", &url, "--from", "100/s", "--to", "200/s"][..],
            &[
                "--step-duration",
                "2s",
                "--slo-p99",
                "1s",
                "--agents",
                &t.url,
            ],
            &QUICK,
        ]
        .concat(),
    );
    assert_eq!(s.code, 1, "{}\n{}", s.stdout, s.stderr);
    assert_eq!(s.knee["outcome"]["kind"], "no_knee", "{}", s.stdout);
    let runs = s.knee["runs"].as_array().cloned().unwrap_or_default();
    assert!(runs.len() >= 2, "{}", s.stdout);
    assert!(runs.iter().all(|r| r["verdict"] == "pass"), "{}", s.stdout);
    let records = intervals(&dir);
    for agent in ["a1/", "b2/"] {
        let theirs: Vec<&Value> = records
            .iter()
            .filter(|r| r["source"].as_str().is_some_and(|s| s.starts_with(agent)))
            .collect();
        assert!(!theirs.is_empty(), "no interval from {agent}\n{}", s.stderr);
        // Each worker's own CPU, wherever it runs: the generator's verdict reads it.
        assert!(
            theirs
                .iter()
                .any(|r| r["counters"]["worker.cpu_us"].as_u64() > Some(0)),
            "{theirs:?}"
        );
    }

    // One connection on each agent: past what two connections carry the
    // requests queue on the agents while the target answers in
    // microseconds. Their lag, merged over both, blames the generator.
    let dir = TempDir::new("knee-agents-generator");
    let s = knee(
        &dir,
        &[
            &["attack", "--url", &url, "--max-connections", "2"][..],
            &SATURATING,
            &["--agents", &t.url],
            &QUICK,
        ]
        .concat(),
    );
    assert_eq!(s.code, 1, "{}\n{}", s.stdout, s.stderr);
    assert_eq!(
        s.knee["outcome"]["kind"], "generator_saturated",
        "{}\n{}",
        s.stdout, s.stderr
    );
    let runs = s.knee["runs"].as_array().cloned().unwrap_or_default();
    assert!(runs.iter().all(|r| r["verdict"] != "fail"), "{}", s.stdout);
}

/// An agent lost during a level: the level's verdict is the generator's
/// (its share of the load was never generated), naming the agent, and the
/// search ends as a saturated generator, with its result, not with exit 2.
#[test]
fn a_lost_agent_gives_its_level_the_generator_verdict() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let t = two_agents();
    let url = format!("http://{}/ping", t.server.addr);
    let dir = TempDir::new("knee-agent-lost");
    let mut k = Spawned::start(
        crate::throng()
            .args([
                "knee",
                "attack",
                "--url",
                &url,
                "--from",
                "100/s",
                "--to",
                "200/s",
                "--step-duration",
                "60s",
                "--slo-p99",
                "1s",
                "--agents",
                &t.url,
                "--out-dir",
                dir.path().to_str().unwrap(),
            ])
            .args(QUICK),
    );
    k.wait_said("run 1");
    drop(t.b);
    let (code, out) = k.wait(std::time::Duration::from_secs(120));
    let knee: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    assert_eq!(code, 1, "{out}");
    assert_eq!(knee["outcome"]["kind"], "generator_saturated", "{out}");
    let run = &knee["runs"][0];
    assert_eq!(run["verdict"], "generator", "{out}");
    assert!(
        run["reasons"][0]
            .as_str()
            .is_some_and(|r| r.starts_with("agent(s) lost during the level (b2: ")),
        "{out}"
    );
}

/// Per-agent files would be written afresh at each level: refused, before
/// Redis is asked anything.
#[test]
fn per_agent_files_are_refused_for_a_search() {
    let out = throng_testkit::process::output_within(
        crate::throng().args([
            "knee",
            "attack",
            "--url",
            "http://127.0.0.1:9/ping",
            "--agents",
            "redis://127.0.0.1:9",
            "--per-agent-output",
            "per-agent",
        ]),
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--per-agent-output is for hold and attack"),
        "{err}"
    );
}
