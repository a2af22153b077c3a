//! Real Redis set-ups past one server: a Redis Cluster (`redis-server
//! --cluster-enabled yes` on free loopback ports, joined by `redis-cli
//! --cluster create`, masters with or without a replica each) and a
//! Sentinel set-up (a master, its replica and one `redis-sentinel`), with
//! what the tests ask of them: which master serves a key, waiting for a
//! failover. Every process is killed on drop.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::peers::{Peer, expect};
use crate::process::command;
use crate::redis::{FREE_PORT, Redis};
use crate::{TempDir, free_port, wait_until};

/// A Redis Cluster on 127.0.0.1: `nodes[..masters]` start as the masters.
#[derive(Debug)]
pub struct Cluster {
    /// Every node, masters first; a killed one stays (stopped).
    pub nodes: Vec<Redis>,
    /// Stopped (killed) nodes, by index.
    dead: Vec<bool>,
    _dir: TempDir,
}

impl Cluster {
    /// `masters` masters with `replicas` replicas each; returns once every
    /// node says `cluster_state:ok`. Failover is quick: a node is failed
    /// after 1 s of silence.
    pub fn start(masters: usize, replicas: usize) -> Self {
        expect(Peer::RedisServer);
        expect(Peer::RedisCli);
        let dir = TempDir::new("redis-cluster");
        let nodes: Vec<Redis> = (0..masters * (1 + replicas))
            .map(|i| {
                let conf = dir.arg(&format!("nodes-{i}.conf"));
                Redis::start(
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &conf,
                        // The bus port would be port + 10000, past 65535
                        // for a high free port: one of its own.
                        "--cluster-port",
                        FREE_PORT,
                        "--cluster-node-timeout",
                        "1000",
                        // A replica promotes however long ago it last
                        // heard its master (a test's cluster is young).
                        "--cluster-replica-validity-factor",
                        "0",
                        "--dir",
                        &dir.arg(""),
                    ],
                    &[],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = command("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(out.status.success(), "redis-cli --cluster create: {out:?}");
        let dead = vec![false; nodes.len()];
        let c = Self {
            nodes,
            dead,
            _dir: dir,
        };
        let known = c.nodes.len().to_string();
        for n in &c.nodes {
            wait_until("every cluster node to say cluster_state:ok", || {
                let info = n.cli(&["CLUSTER", "INFO"]).join("\n");
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{known}"))
            });
        }
        c
    }

    /// `HOST:PORT,...` of every node still running (for `--redis-cluster`).
    pub fn seeds(&self) -> String {
        self.live()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn live(&self) -> impl Iterator<Item = &Redis> {
        self.nodes
            .iter()
            .zip(&self.dead)
            .filter(|(_, d)| !**d)
            .map(|(n, _)| n)
    }

    /// The port of the master that serves `key`'s slot, as a live node
    /// sees it now.
    pub fn master_of(&self, key: &str) -> u16 {
        self.try_master_of(key)
            .unwrap_or_else(|| panic!("no master serves the slot of {key}"))
    }

    /// [`Self::master_of`], or `None` while no master serves it (a master
    /// failed, its replica not promoted yet).
    pub fn try_master_of(&self, key: &str) -> Option<u16> {
        let n = self.live().next().expect("a live node");
        let slot: u16 = n.cli(&["CLUSTER", "KEYSLOT", key])[0]
            .trim()
            .parse()
            .expect("a slot");
        for line in n.cli(&["CLUSTER", "NODES"]) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let serves = f[8..].iter().any(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
            });
            if serves {
                let port = f[1].split(['@', ':']).nth(1).expect("host:port@bus");
                return port.parse().ok();
            }
        }
        None
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> &Redis {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("a node of this cluster")
    }

    /// `key`'s slot.
    pub fn slot(&self, key: &str) -> u16 {
        let n = self.live().next().expect("a live node");
        n.cli(&["CLUSTER", "KEYSLOT", key])[0]
            .trim()
            .parse()
            .expect("a slot")
    }

    /// Moves `slot` from the master on `from` to the master on `to` as
    /// `redis-cli --cluster reshard` does: `IMPORTING`/`MIGRATING`, its
    /// keys `MIGRATE`d, `pause` (clients meanwhile meet `ASK`), then
    /// `SETSLOT NODE` on every master.
    pub fn move_slot(&self, slot: u16, from: u16, to: u16, pause: Duration) {
        let (src, dst) = (self.node(from), self.node(to));
        let id = |n: &Redis| n.cli(&["CLUSTER", "MYID"])[0].trim().to_owned();
        let (src_id, dst_id) = (id(src), id(dst));
        let s = slot.to_string();
        dst.cli(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id]);
        src.cli(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]);
        let keys = src.cli(&["CLUSTER", "GETKEYSINSLOT", &s, "1000"]);
        let keys: Vec<&str> = keys
            .iter()
            .map(String::as_str)
            .filter(|k| !k.is_empty())
            .collect();
        if !keys.is_empty() {
            let port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            src.cli(&args);
        }
        std::thread::sleep(pause);
        for n in [dst, src] {
            n.cli(&["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
        }
        for n in self.live().filter(|n| n.port != from && n.port != to) {
            let _ = n
                .cli_command()
                .args(["CLUSTER", "SETSLOT", &s, "NODE", &dst_id])
                .output();
        }
    }

    /// Kills (SIGKILL) the node on `port`: its replica, if any, takes over.
    pub fn kill(&mut self, port: u16) {
        let i = self
            .nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of this cluster");
        self.nodes[i].stop();
        self.dead[i] = true;
    }

    /// Waits until `key`'s slot is served by a master other than `old`;
    /// the new master's port and how long it took.
    pub fn wait_failover(&self, key: &str, old: u16) -> (u16, Duration) {
        let t = Instant::now();
        loop {
            if let Some(now) = self.try_master_of(key)
                && now != old
            {
                return (now, t.elapsed());
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no failover of {key}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A master, its replica and one sentinel watching them as `mymaster`
/// (quorum 1, down after 1 s), on 127.0.0.1.
#[derive(Debug)]
pub struct Sentinel {
    /// The first master.
    pub master: Redis,
    /// Its replica (the master after a failover).
    pub replica: Redis,
    child: Option<Child>,
    /// The sentinel's port.
    pub port: u16,
    log: Arc<Mutex<String>>,
    _dir: TempDir,
}

impl Sentinel {
    /// Starts the three; returns once the sentinel knows the replica.
    pub fn start() -> Self {
        expect(Peer::RedisSentinel);
        let dir = TempDir::new("sentinel");
        // A replica's sync writes an RDB file: in the scratch directory.
        let at = dir.arg("");
        let master = Redis::start(&["--dir", &at], &[]);
        let mp = master.port.to_string();
        let replica = Redis::start(&["--dir", &at, "--replicaof", "127.0.0.1", &mp], &[]);
        wait_until("the replica to sync", || {
            replica
                .cli(&["INFO", "replication"])
                .iter()
                .any(|l| l.trim() == "master_link_status:up")
        });
        let port = free_port();
        let conf = dir.file("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {mp} 1\n\
                 sentinel down-after-milliseconds mymaster 1000\n\
                 sentinel failover-timeout mymaster 10000\n",
                dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let mut child = command("redis-sentinel")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start redis-sentinel");
        let log: Arc<Mutex<String>> = Arc::default();
        if let Some(out) = child.stdout.take() {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    log.lock().expect("log lock").push_str(&(line + "\n"));
                }
            });
        }
        let s = Self {
            master,
            replica,
            child: Some(child),
            port,
            log,
            _dir: dir,
        };
        let rp = s.replica.port.to_string();
        wait_until("the sentinel to know the replica", || {
            s.ask(&["SENTINEL", "replicas", "mymaster"])
                .iter()
                .any(|l| l.trim() == rp)
        });
        s
    }

    /// `HOST:PORT` of the sentinel (for `--redis-sentinel`).
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What the sentinel answers `args` (one line per element).
    pub fn ask(&self, args: &[&str]) -> Vec<String> {
        let out = command("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The master's port as the sentinel names it now.
    pub fn master_port(&self) -> u16 {
        let a = self.ask(&["SENTINEL", "get-master-addr-by-name", "mymaster"]);
        a.get(1).and_then(|p| p.trim().parse().ok()).unwrap_or(0)
    }

    /// What the sentinel printed.
    pub fn log(&self) -> String {
        self.log.lock().expect("log lock").clone()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
