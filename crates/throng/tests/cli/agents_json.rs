//! The JSON summary of a run on agents (`--agents … --json`) has a section
//! per agent, as the text summary has a line per agent.

use std::time::Duration;

use serde_json::Value;
use throng_testkit::process::{output_within, text};
use throng_testkit::{Peer, require};

use crate::agents::{Two, hold_args, one_at_a_time, two_agents};
use crate::throng;

/// The summary's `agents` section, by agent name.
fn by_agent(summary: &Value) -> Vec<(String, Value)> {
    let mut agents: Vec<(String, Value)> = summary["agents"]
        .as_array()
        .unwrap_or_else(|| panic!("no agents section: {summary:#}"))
        .iter()
        .map(|a| (a["agent"].as_str().unwrap_or("").to_owned(), a.clone()))
        .collect();
    agents.sort_by(|a, b| a.0.cmp(&b.0));
    agents
}

#[test]
fn a_hold_on_agents_says_what_each_agent_opened_delivered_and_lost() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let t = two_agents();
    let mut args = hold_args(&t.server, "1000");
    args.extend(["--messages", "3", "--agents", &t.url, "--json", "-q"].map(String::from));
    let out = output_within(throng().args(&args), Duration::from_secs(90));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    let agents = by_agent(&s);
    assert_eq!(agents.len(), 2, "{s:#}");
    for ((name, a), want) in agents.iter().zip(["a1", "b2"]) {
        assert_eq!(name, want);
        assert_eq!(a["workers"], 2, "{a}");
        assert_eq!(a["connections"], 500, "{a}");
        assert_eq!(a["opened"], 500, "{a}");
        assert_eq!(a["delivered"], 1500, "{a}");
        assert_eq!((&a["lost"], &a["errors"]), (&0.into(), &0.into()), "{a}");
        assert_eq!(a["state"], "done", "{a}");
    }
    let delivered: u64 = agents
        .iter()
        .filter_map(|(_, a)| a["delivered"].as_u64())
        .sum();
    assert_eq!(delivered, s["received"].as_u64().unwrap_or(0), "{s:#}");
}

#[test]
fn an_attack_on_agents_says_what_each_agent_sent_and_what_failed() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let t = two_agents();
    let s = attack_on_agents(&t, &format!("http://{}/healthz", t.server.addr), &[]);
    let agents = by_agent(&s);
    assert_eq!(agents.len(), 2, "{s:#}");
    let mut sent = 0;
    for (_, a) in &agents {
        let requests = a["requests"].as_u64().unwrap_or(0);
        assert!(requests > 0, "{a}");
        assert_eq!(a["errors"], 0, "{a}");
        assert_eq!(a["state"], "done", "{a}");
        sent += requests;
    }
    assert_eq!(sent, s["requests"].as_u64().unwrap_or(u64::MAX), "{s:#}");
}

/// `throng attack URL` at 200/s for 1 s on `t`'s agents, with `extra`:
/// its JSON summary, the run checked ok.
pub(crate) fn attack_on_agents(t: &Two, url: &str, extra: &[&str]) -> Value {
    let out = output_within(
        throng()
            .args([
                "attack",
                "--url",
                url,
                "--rate",
                "200/s",
                "--duration",
                "1s",
            ])
            .args(["--agents", &t.url, "--format", "json", "-q"])
            .args(extra),
        Duration::from_secs(90),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}
