//! `throng agent`, `throng agents` and `hold --agents`: real agents (this
//! binary), a real `redis-server` between them and the controller, a real
//! `throng serve` as the target. On loopback: registration, expiry and
//! re-registration after a Redis restart, a run's merged figures against
//! each agent's own file, the errors before a start, a killed agent and
//! Ctrl-C on the controller. In network namespaces (one address each, as
//! separate machines would have): 30,000 connections from three agents.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use throng_testkit::process::{output_within, signal, text};
use throng_testkit::redis::Redis;
use throng_testkit::{Peer, TempDir, require, wait_until};

use crate::{serve, throng};

/// Each test here starts half a dozen processes or more: one such test at a
/// time, so that together they do not starve the suite's timing-sensitive
/// tests on a small machine.
pub(crate) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A program started by a test, its stderr kept line by line with the
/// time each line came; killed on drop.
pub(crate) struct Spawned {
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    stdout: Option<std::thread::JoinHandle<String>>,
}

impl Spawned {
    pub(crate) fn start(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let lines: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        if let Some(err) = child.stderr.take() {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(err).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push((Instant::now(), l));
                }
            });
        }
        let stdout = child.stdout.take().map(|mut out| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut out, &mut s);
                s
            })
        });
        Self {
            child,
            lines,
            stdout,
        }
    }

    /// When the first stderr line containing `what` came.
    fn said(&self, what: &str) -> Option<Instant> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|(_, l)| l.contains(what))
            .map(|(at, _)| *at)
    }

    fn stderr(&self) -> String {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| format!("{l}\n"))
            .collect()
    }

    pub(crate) fn wait_said(&self, what: &str) -> Instant {
        let start = Instant::now();
        loop {
            if let Some(at) = self.said(what) {
                return at;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no '{what}' within 30 s; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the end (at most `limit`): exit code, stdout.
    pub(crate) fn wait(&mut self, limit: Duration) -> (i32, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "did not end within {limit:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self
            .stdout
            .take()
            .map(|t| t.join().unwrap())
            .unwrap_or_default();
        (status.code().unwrap_or(-1), out)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `throng agent --redis URL --name NAME` plus `args`, once registered.
fn agent(url: &str, name: &str, args: &[&str]) -> Spawned {
    let a = Spawned::start(
        throng()
            .args(["agent", "--redis", url, "--name", name])
            .args(args),
    );
    a.wait_said("registered as");
    a
}

/// `throng agents --json`: the live agents by name.
fn agents(url: &str) -> Vec<Value> {
    let out = output_within(
        throng().args(["agents", "--redis", url, "--json"]),
        Duration::from_secs(20),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    match serde_json::from_slice(&out.stdout).unwrap() {
        Value::Array(a) => a,
        v => panic!("not a list: {v}"),
    }
}

fn names(listed: &[Value]) -> Vec<String> {
    listed
        .iter()
        .map(|a| a["registration"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn agents_register_expire_and_register_again_after_a_redis_restart() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let mut redis = Redis::start(&[], &[]);
    let url = redis.url();
    let a = agent(&url, "a1", &["--group", "g1", "--source-ips", "127.0.0.7"]);
    let mut b = agent(&url, "b2", &[]);
    let listed = agents(&url);
    assert_eq!(names(&listed), ["a1", "b2"]);
    let r = &listed[0]["registration"];
    assert_eq!(r["group"], "g1");
    assert_eq!(r["version"], env!("CARGO_PKG_VERSION"));
    assert!(r["capacity"]["cores"].as_u64().unwrap() >= 1, "{r}");
    assert!(r["capacity"]["nofile"].as_u64().unwrap() >= 1024, "{r}");
    assert_eq!(r["capacity"]["sources"][0], "127.0.0.7");
    assert!(r["running"].is_null(), "{r}");
    // Same machine, same clock: the offset through Redis is about zero.
    assert!(
        listed[0]["offset_ns"].as_i64().unwrap().abs() < 50_000_000,
        "{listed:?}"
    );
    let table = output_within(
        throng().args(["agents", "--redis", &url, "--group", "g1"]),
        Duration::from_secs(20),
    );
    let table = text(&table.stdout);
    assert!(table.contains("a1") && !table.contains("b2"), "{table}");
    // The key expires by itself: it has a TTL.
    let ttl: i64 = redis.cli(&["TTL", "throng:agents:agent:a1"])[0]
        .parse()
        .unwrap();
    assert!((1..=5).contains(&ttl), "TTL {ttl}");

    // Redis restarted empty: both agents come back by themselves.
    redis.stop();
    redis.restart();
    wait_until("both agents to register again", || {
        names(&agents(&url)) == ["a1", "b2"]
    });
    assert!(a.said("trying again").is_some(), "{}", a.stderr());

    // SIGTERM: the agent leaves at once; a killed one expires.
    signal(b.pid(), "TERM");
    let (code, _) = b.wait(Duration::from_secs(10));
    assert_eq!(code, 0, "{}", b.stderr());
    assert_eq!(names(&agents(&url)), ["a1"]);
    drop(a);
    let killed = Instant::now();
    wait_until("the killed agent's key to expire", || {
        agents(&url).is_empty()
    });
    assert!(killed.elapsed() <= Duration::from_secs(7));
}

/// Redis, agents `a1` and `b2`, and a server: the loopback set-up.
pub(crate) struct Two {
    /// Kept for the test's length: dropping it stops Redis.
    redis: Redis,
    pub(crate) url: String,
    a: Spawned,
    /// The second agent, which a test may kill (drop).
    pub(crate) b: Spawned,
    pub(crate) server: throng_testkit::Server,
}

pub(crate) fn two_agents() -> Two {
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    Two {
        a: agent(&url, "a1", &[]),
        b: agent(&url, "b2", &[]),
        server: serve(&[]),
        url,
        redis,
    }
}

/// The flags of a short hold on `server`.
pub(crate) fn hold_args(server: &throng_testkit::Server, connections: &str) -> Vec<String> {
    vec![
        "hold".into(),
        format!("ws://{}/news", server.addr),
        "-c".into(),
        connections.into(),
        "--rate".into(),
        "2000/s".into(),
        "--publish".into(),
        format!("http://{}/publish/news", server.addr),
    ]
}

/// `throng report --format json` of `files`.
fn report(files: &[&std::path::Path]) -> Value {
    let out = output_within(
        throng()
            .arg("report")
            .args(files)
            .args(["--format", "json"]),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn counter(report: &Value, name: &str) -> u64 {
    report["counters"][name]["total"]
        .as_u64()
        .or_else(|| report["counters"][name].as_u64())
        .unwrap_or_else(|| panic!("no counter {name} in {}", report["counters"]))
}

#[test]
fn a_hold_on_agents_adds_up_and_each_agents_file_adds_up_to_the_merged_one() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let t = two_agents();
    let (url, server) = (t.url.as_str(), &t.server);
    let dir = TempDir::new("agents-hold");
    let merged = dir.path().join("merged.jsonl");
    let per = dir.path().join("per");
    let mut args = hold_args(server, "1000");
    args.extend(
        [
            "--messages",
            "3",
            "--agents",
            url,
            "-o",
            merged.to_str().unwrap(),
            "--per-agent-output",
            per.to_str().unwrap(),
            "--verbose",
        ]
        .map(String::from),
    );
    let out = output_within(throng().args(&args), Duration::from_secs(90));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    // --verbose: each agent's line each second.
    assert!(stderr.contains("agent a1: open 500/500  msgs"), "{stderr}");
    assert!(stderr.contains("agent b2: open"), "{stderr}");
    assert!(
        stdout.contains("messages: 3 published, 3000 received of 3000 expected, 0 lost"),
        "{stdout}"
    );
    for name in ["a1", "b2"] {
        assert!(
            stdout.contains(&format!(
                "agent {name}: workers 2, 500 connections planned, 500 opened, 1500 messages received; done"
            )),
            "{stdout}"
        );
    }
    let whole = report(&[&merged]);
    let parts = report(&[&per.join("a1.jsonl"), &per.join("b2.jsonl")]);
    for c in [
        "connect.ok",
        "messages.received",
        "closed.clean",
        "bytes.in",
    ] {
        assert_eq!(counter(&whole, c), counter(&parts, c), "{c}");
    }
    assert_eq!(counter(&whole, "messages.received"), 3000);
    // Every record's source names its agent.
    let text = std::fs::read_to_string(&merged).unwrap();
    assert!(text.contains("\"a1/hold-0\"") && text.contains("\"b2/hold-3\""));
}

/// `throng agent --metrics-listen`: the agent's own figures, its
/// workers' records of the run it served, scraped by a real Prometheus
/// text parser once the run is over (they stay until the next run).
#[test]
fn an_agent_serves_its_own_workers_figures_on_metrics_listen() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli, Peer::PythonPrometheus);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let addr = format!("127.0.0.1:{}", throng_testkit::free_port());
    let a = agent(&url, "m1", &["--metrics-listen", &addr]);
    assert!(
        a.stderr()
            .contains(&format!("metrics on http://{addr}/metrics")),
        "{}",
        a.stderr()
    );
    let server = serve(&[]);
    let mut args = hold_args(&server, "200");
    args.extend(["--messages", "3", "--agents", &url].map(String::from));
    let out = output_within(throng().args(&args), Duration::from_secs(90));
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let scraped = crate::load_metrics::scrape(
        &format!("http://{addr}/metrics"),
        &[
            ("throng_load_connect_ok_total{role=\"hold\"}", 200),
            ("throng_load_messages_received_total{role=\"hold\"}", 600),
            ("throng_load_delivery_seconds_count{role=\"hold\"}", 600),
        ],
    );
    assert_eq!(
        scraped["samples"]["throng_load_messages_lost_total{role=\"hold\"}"], 0.0,
        "{scraped:#}"
    );
}

#[test]
fn a_run_the_agents_cannot_take_is_refused_before_it_starts() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&["--requirepass", "pw"], &["--pass", "pw"]);
    let url = format!("redis://:pw@127.0.0.1:{}", redis.port);
    let server = serve(&[]);
    let run = |url: &str, extra: &[&str]| {
        let mut args = hold_args(&server, "100");
        args.extend(["--agents".to_owned(), url.to_owned()]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let out = output_within(throng().args(&args), Duration::from_secs(30));
        (out.status.code(), text(&out.stderr))
    };
    let (code, err) = run(&url, &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("no live agents under throng:agents:agent:*"),
        "{err}"
    );
    assert!(err.contains("throng agent --redis"), "{err}");

    let wrong = format!("redis://:nope@127.0.0.1:{}", redis.port);
    let (code, err) = run(&wrong, &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("Redis refused"), "{err}");
    assert!(err.contains("check the user and password"), "{err}");
    assert!(!err.contains("nope"), "the password is printed: {err}");

    // Registrations written as an agent of another kind would write them.
    let register = |name: &str, version: &str, ports: [u16; 2], group: &str| {
        let reg = serde_json::json!({
            "name": name, "group": group, "version": version,
            "capacity": {"cores": 1, "nofile": 20_000, "free_memory": 0,
                         "local_ports": ports, "sources": ["127.0.0.9"]},
            "clock_offset_ns": 0, "clock_rtt_ns": 0, "running": null, "at_unix_ns": 0,
        });
        redis.cli(&[
            "SET",
            &format!("throng:agents:agent:{name}"),
            &reg.to_string(),
            "EX",
            "60",
        ]);
    };
    register("old", "0.0.1", [32768, 60999], "v");
    let (code, err) = run(&url, &["--group", "v"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("agent old is throng 0.0.1"), "{err}");
    assert!(err.contains("install throng"), "{err}");

    // Ten local ports and one source address cannot carry 100 connections.
    register("small", env!("CARGO_PKG_VERSION"), [60990, 60999], "s");
    let (code, err) = run(&url, &["--group", "s"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("agent small cannot take its share of 100"),
        "{err}"
    );
    assert!(err.contains("local ports are usable per pair"), "{err}");

    // A group nobody is in.
    let (code, err) = run(&url, &["--group", "nobody"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("of group nobody"), "{err}");
}

/// A controller running `hold --agents` with a long hold, once every
/// connection is open.
fn controller(server: &throng_testkit::Server, url: &str, extra: &[&str]) -> Spawned {
    let mut args = hold_args(server, "400");
    args.extend(
        [
            "--duration",
            "60s",
            "--publish-rate",
            "2/s",
            "--agents",
            url,
        ]
        .iter()
        .chain(extra)
        .map(|s| (*s).to_owned()),
    );
    let c = Spawned::start(throng().args(&args));
    wait_until("every connection to open", || {
        server.metric("throng_connections_open") >= 400.0
    });
    c
}

#[test]
fn a_killed_agent_is_named_within_5_s_and_its_share_counts_as_lost() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let t = two_agents();
    let (url, server) = (t.url.as_str(), &t.server);
    let mut c = controller(server, url, &[]);
    std::thread::sleep(Duration::from_secs(2));
    drop(t.b);
    let killed = Instant::now();
    let named = c.wait_said("agent b2 lost");
    assert!(
        named.duration_since(killed) <= Duration::from_secs(5),
        "named after {:?}",
        named.duration_since(killed)
    );
    // The run goes on without it (--on-agent-loss continue), then Ctrl-C.
    std::thread::sleep(Duration::from_secs(1));
    assert!(c.child.try_wait().unwrap().is_none(), "{}", c.stderr());
    signal(c.pid(), "INT");
    let (code, out) = c.wait(Duration::from_secs(30));
    assert_eq!(code, 1, "{out}{}", c.stderr());
    assert!(
        out.contains("agent b2: workers 2, 200 connections planned"),
        "{out}"
    );
    assert!(out.contains("LOST at"), "{out}");
    assert!(
        out.contains("agent a1: workers 2, 200 connections planned, 200 opened"),
        "{out}"
    );
    assert!(
        c.stderr().contains("FAIL: agent b2: no word from it"),
        "{}",
        c.stderr()
    );
}

#[test]
fn on_agent_loss_stop_ends_the_run() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let t = two_agents();
    let (url, server) = (t.url.as_str(), &t.server);
    let mut c = controller(server, url, &["--on-agent-loss", "stop"]);
    drop(t.b);
    c.wait_said("stopping the run (--on-agent-loss stop)");
    let (code, out) = c.wait(Duration::from_secs(30));
    assert_eq!(code, 1, "{out}{}", c.stderr());
    t.a.wait_said("idle again");
}

#[test]
fn ctrl_c_on_the_controller_stops_every_agent_within_the_close_timeout() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let t = two_agents();
    let (url, server) = (t.url.as_str(), &t.server);
    let mut c = controller(server, url, &["--close-timeout", "2s"]);
    assert!(
        agents(url)
            .iter()
            .all(|r| r["registration"]["running"]["role"] == "hold")
    );
    signal(c.pid(), "INT");
    let stopped = Instant::now();
    let (code, out) = c.wait(Duration::from_secs(30));
    assert_eq!(code, 0, "{out}{}", c.stderr());
    assert!(out.contains("agent a1:") && out.contains("; done"), "{out}");
    for x in [&t.a, &t.b] {
        let idle = x.wait_said("idle again");
        assert!(
            idle.duration_since(stopped) <= Duration::from_secs(5),
            "{}",
            x.stderr()
        );
    }
    wait_until("the server to see every connection closed", || {
        server.metric("throng_connections_open") == 0.0
    });
    wait_until("both agents to register as idle", || {
        agents(url)
            .iter()
            .all(|r| r["registration"]["running"].is_null())
    });
}

#[test]
fn an_agent_whose_controller_dies_stops_its_workers() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let a = agent(&url, "a1", &[]);
    let server = serve(&[]);
    let c = controller(&server, &url, &[]);
    drop(c);
    a.wait_said("its controller is gone");
    a.wait_said("idle again");
    wait_until("the server to see every connection closed", || {
        server.metric("throng_connections_open") == 0.0
    });
}

/// Machines simulated on this one: network namespaces, each with one
/// address on a bridge that this (root) namespace also has an address on,
/// so Redis listening here is reachable from every namespace. Removed on
/// drop.
struct Lan {
    bridge: String,
    spaces: Vec<String>,
    /// `10.213.N`: namespace `i` is `.{10 + i}`, this namespace `.1`.
    subnet: String,
}

impl Lan {
    /// `n` namespaces, or why they cannot be made here.
    fn create(n: usize) -> Result<Self, String> {
        // Unique per test run and per test: names are host-wide.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = (std::process::id() % 1000) * 10 + made % 10;
        let mut lan = Self {
            bridge: format!("tbr{tag}"),
            spaces: Vec::new(),
            subnet: format!("10.213.{}", 20 + tag % 230),
        };
        let ip = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    text(&out.stderr).trim()
                ))
            }
        };
        ip(&["link", "add", &lan.bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", lan.subnet),
            "dev",
            &lan.bridge,
        ])?;
        ip(&["link", "set", &lan.bridge, "up"])?;
        for i in 0..n {
            let ns = format!("thr{tag}n{i}");
            ip(&["netns", "add", &ns])?;
            lan.spaces.push(ns.clone());
            let (outer, inner) = (format!("tv{tag}n{i}"), format!("tp{tag}n{i}"));
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &lan.bridge])?;
            ip(&["link", "set", &outer, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", lan.addr(i)),
                "dev",
                &inner,
            ])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(lan)
    }

    /// Namespace `i`'s address.
    fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.subnet, 10 + i)
    }

    /// This namespace's address on the bridge.
    fn here(&self) -> String {
        format!("{}.1", self.subnet)
    }

    /// `throng` in namespace `i`.
    fn throng(&self, i: usize) -> Command {
        let mut c = throng_testkit::process::command("ip");
        c.args(["netns", "exec", &self.spaces[i], crate::THRONG]);
        c
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and with it the other.
        for ns in &self.spaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

/// Namespaces, or the test is skipped with the reason (and fails under
/// `scripts/test.sh`, which runs as root where they exist).
fn lan(n: usize) -> Option<Lan> {
    match Lan::create(n) {
        Ok(l) => Some(l),
        Err(why) => {
            assert!(
                !throng_testkit::peers::required(),
                "network namespaces are needed (root and iproute2): {why}"
            );
            eprintln!("SKIP: network namespaces are not available here: {why}");
            None
        }
    }
}

/// Three agents in namespaces 1-3 (each binding its namespace's address)
/// and `throng serve` in namespace 0, all reaching a Redis here.
struct Machines {
    server: std::net::SocketAddr,
    _processes: Vec<Spawned>,
    redis: Redis,
    // Last: the namespaces go after every process in them.
    lan: Lan,
}

impl Machines {
    fn start() -> Option<Self> {
        let lan = lan(4)?;
        // Loopback and the bridge only: a wildcard bind would collide with
        // other tests' connections from 127.0.0.x on the same port.
        let here = lan.here();
        let redis = Redis::start(
            &["--bind", "127.0.0.1", &here, "--protected-mode", "no"],
            &[],
        );
        let in_lan = format!("redis://{}:{}", lan.here(), redis.port);
        let server: std::net::SocketAddr = format!("{}:9000", lan.addr(0)).parse().unwrap();
        let mut processes = vec![Spawned::start(lan.throng(0).args([
            "serve",
            "--listen",
            &server.to_string(),
            "--max-connections",
            "31000",
            // /ping on the bridge address, not loopback: asked for.
            "--test-backend",
        ]))];
        wait_until("the server in its namespace to listen", || {
            std::net::TcpStream::connect(server).is_ok()
        });
        for i in 1..=3 {
            let a = Spawned::start(lan.throng(i).args([
                "agent",
                "--redis",
                &in_lan,
                "--name",
                &format!("ns{i}"),
                "--source-ips",
                &lan.addr(i),
            ]));
            a.wait_said("registered as");
            processes.push(a);
        }
        Some(Self {
            server,
            _processes: processes,
            redis,
            lan,
        })
    }

    /// The server's `throng_connections_open`.
    fn open(&self) -> f64 {
        let (_, body) = throng_testkit::http::get(self.server, "/metrics");
        throng_testkit::http::metric_in(&body, "throng_connections_open").unwrap_or(0.0)
    }
}

#[test]
fn an_attack_on_three_namespace_agents_sends_what_was_planned() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let Some(m) = Machines::start() else { return };
    let out = output_within(
        throng().args([
            "attack",
            "--url",
            &format!("http://{}/ping", m.server),
            "--rate",
            "600/s",
            "--duration",
            "3s",
            "--agents",
            &m.redis.url(),
        ]),
        Duration::from_secs(60),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("1800 (planned 1800)"), "{stdout}");
    assert!(stdout.contains("200:1800"), "{stdout}");
    let mut sent = 0;
    for i in 1..=3 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("agent ns{i}:")))
            .unwrap_or_else(|| panic!("{stdout}"));
        let n: u64 = line
            .split([',', ';'])
            .find_map(|w| w.trim().strip_suffix(" requests sent"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        sent += n;
    }
    assert_eq!(sent, 1800, "{stdout}");
}

#[test]
fn thirty_thousand_connections_from_three_namespace_agents_add_up() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    // Host-wide: 30,000 sockets and every core.
    throng_testkit::process::alone();
    let Some(m) = Machines::start() else { return };
    let (lan, redis, server_addr) = (&m.lan, &m.redis, m.server);
    let open = || m.open();
    let dir = TempDir::new("agents-netns");
    let merged = dir.path().join("merged.jsonl");
    let per = dir.path().join("per");
    let mut c = Spawned::start(throng().args([
        "hold",
        &format!("ws://{server_addr}/news"),
        "-c",
        "30000",
        "--rate",
        "5000/s",
        "--duration",
        "4s",
        "--publish",
        &format!("http://{server_addr}/publish/news"),
        "--publish-rate",
        "1/s",
        "--agents",
        &redis.url(),
        "-o",
        merged.to_str().unwrap(),
        "--per-agent-output",
        per.to_str().unwrap(),
    ]));
    let start = Instant::now();
    while open() < 30_000.0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} open after 60 s; controller:\n{}",
            open(),
            c.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Seen from the server: every connection comes from an agent's address.
    let ss = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lan.spaces[0],
            "ss",
            "-Htn",
            "state",
            "established",
        ])
        .args(["( sport = :9000 )"])
        .output()
        .unwrap();
    let mut by_peer = std::collections::BTreeMap::<String, u64>::new();
    for line in text(&ss.stdout).lines() {
        let peer = line.split_whitespace().nth(3).unwrap_or("?");
        let ip = peer.rsplit_once(':').map_or(peer, |(ip, _)| ip);
        *by_peer.entry(ip.to_owned()).or_default() += 1;
    }
    let expected: std::collections::BTreeMap<String, u64> =
        (1..=3).map(|i| (lan.addr(i), 10_000)).collect();
    assert_eq!(by_peer, expected);

    let (code, out) = c.wait(Duration::from_secs(120));
    assert_eq!(code, 0, "{out}{}", c.stderr());
    let messages = out
        .lines()
        .find(|l| l.starts_with("messages:"))
        .unwrap_or_else(|| panic!("{out}"));
    let n: Vec<u64> = messages
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    // published, received, expected, lost, ...
    assert!(n[0] >= 3, "{messages}");
    assert_eq!(
        (n[1], n[2], n[3]),
        (n[0] * 30_000, n[0] * 30_000, 0),
        "{messages}"
    );
    for i in 1..=3 {
        assert!(
            out.contains(&format!(
                "agent ns{i}: workers 2, 10000 connections planned, 10000 opened"
            )),
            "{out}"
        );
    }
    let whole = report(&[&merged]);
    let parts = report(&[
        &per.join("ns1.jsonl"),
        &per.join("ns2.jsonl"),
        &per.join("ns3.jsonl"),
    ]);
    for name in [
        "connect.ok",
        "messages.received",
        "closed.clean",
        "bytes.in",
    ] {
        assert_eq!(counter(&whole, name), counter(&parts, name), "{name}");
    }
}

#[test]
fn a_second_agent_of_the_same_name_waits_for_the_first_to_go() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let mut first = agent(&url, "same", &[]);
    let second = Spawned::start(throng().args(["agent", "--redis", &url, "--name", "same"]));
    second.wait_said("another agent named same is registered");
    assert!(
        second.said("registered as").is_none(),
        "{}",
        second.stderr()
    );
    signal(first.pid(), "TERM");
    first.wait(Duration::from_secs(10));
    second.wait_said("registered as");
    assert_eq!(names(&agents(&url)), ["same"]);
}

#[test]
fn an_agent_refuses_what_is_not_a_plan_of_its_own_version() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let a = agent(&redis.url(), "a1", &[]);
    let start = |role: &str, version: &str, plan: Value| {
        let c = serde_json::json!({
            "do": "start", "run": "r1", "role": role, "version": version,
            "reply": "throng:agents:run:r1",
            "workers": [{"index": 0, "label": "a1/x-0", "plan": plan}],
        });
        redis.cli(&["PUBLISH", "throng:agents:to:a1", &c.to_string()]);
    };
    let ours = env!("CARGO_PKG_VERSION");
    start("sh", ours, serde_json::json!({}));
    a.wait_said("refused: unknown role 'sh'");
    start("attack", ours, serde_json::json!({"per_request": "/tmp/x"}));
    a.wait_said("refused: a plan that writes per-request rows");
    start("hold", "0.0.1", serde_json::json!({}));
    a.wait_said("refused: this agent is throng");
    redis.cli(&["PUBLISH", "throng:agents:to:a1", "rm -rf /"]);
    a.wait_said("ignored a message that is not a command");
    assert!(a.said("started").is_none(), "{}", a.stderr());
    assert!(agents(&redis.url())[0]["registration"]["running"].is_null());
}

#[test]
fn redis_gone_mid_run_ends_it_on_both_sides_and_the_agents_come_back() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let mut t = two_agents();
    let mut c = controller(&t.server, &t.url, &[]);
    t.redis.stop();
    c.wait_said("agent a1 lost (the controller lost Redis");
    let (code, out) = c.wait(Duration::from_secs(30));
    assert_eq!(code, 1, "{out}{}", c.stderr());
    assert!(out.contains("LOST at"), "{out}");
    for x in [&t.a, &t.b] {
        x.wait_said("lost Redis during run");
        x.wait_said("idle again");
    }
    wait_until("the server to see every connection closed", || {
        t.server.metric("throng_connections_open") == 0.0
    });
    t.redis.restart();
    wait_until("both agents to register again, idle", || {
        let listed = agents(&t.url);
        names(&listed) == ["a1", "b2"]
            && listed
                .iter()
                .all(|r| r["registration"]["running"].is_null())
    });
}

#[test]
fn a_dry_run_on_agents_prints_each_share_and_starts_nothing() {
    let _one = one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli);
    let t = two_agents();
    let mut args = hold_args(&t.server, "1000");
    args.extend(["--agents", &t.url, "--dry-run"].map(String::from));
    let out = output_within(throng().args(&args), Duration::from_secs(30));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(all.contains("a1: workers 0-1, 500 connections"), "{all}");
    assert!(all.contains("b2: workers 2-3, 500 connections"), "{all}");
    assert!(
        all.contains("the plan fits the agents; nothing started"),
        "{all}"
    );
    assert!(t.a.said("started").is_none() && t.b.said("started").is_none());
}
