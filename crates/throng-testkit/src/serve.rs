//! A real `throng serve` (supervisor and workers) on a free loopback port,
//! and what a test asks of it: metrics, worker pids, its log.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::http::{get, healthy, metric_in};
use crate::process::command;
use crate::wait_until;

/// A running `throng serve`, SIGKILLed on drop.
#[derive(Debug)]
pub struct Server {
    pub child: Child,
    /// The first plain listen address.
    pub addr: SocketAddr,
    /// Where `/healthz` and `/metrics` are asked: the first
    /// `--metrics-listen` address if given (the public ones then refuse
    /// `/metrics`; with `--proxy-protocol` they want a PROXY header), else `addr`.
    pub ops: SocketAddr,
    /// The JSON start line (`tls_listen`, `config.tls.cert_pem`, ...).
    pub start: serde_json::Value,
    /// What the server wrote to stderr so far.
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `<throng> serve --listen 127.0.0.1:0 --json` plus `args` and
    /// returns once a worker answers `/healthz`.
    pub fn start(throng: &str, args: &[&str]) -> Self {
        Self::start_with(throng, args, |_| {})
    }

    /// [`Server::start`], with `prepare` given the command before it runs
    /// (to start it in a process group of its own, say).
    pub fn start_with(throng: &str, args: &[&str], prepare: impl FnOnce(&mut Command)) -> Self {
        let mut cmd = command(throng);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--json"])
            .args(args);
        prepare(&mut cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start throng serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout is piped"))
            .read_line(&mut line)
            .expect("read serve's start line");
        let start: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("start line {line:?}: {e}"));
        let addr = start["listen"][0]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no listen address in {line}"));
        let ops = start["metrics_listen"][0]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or(addr);
        let log = Arc::new(Mutex::new(String::new()));
        let (err, sink) = (child.stderr.take().expect("stderr is piped"), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().expect("log lock").push_str(&(line + "\n"));
            }
        });
        let s = Self {
            child,
            addr,
            ops,
            log,
            start,
        };
        // Workers bind after the supervisor reserved the port: wait until one answers.
        wait_until("a worker answers /healthz", || healthy(s.ops));
        s
    }

    /// The first TLS listen address (`--tls-listen`).
    pub fn tls_addr(&self) -> SocketAddr {
        self.start["tls_listen"][0]
            .as_str()
            .and_then(|a| a.parse().ok())
            .expect("tls_listen in the start line")
    }

    /// Sends a signal (`TERM`, `KILL`, ...) to the supervisor.
    pub fn signal(&self, sig: &str) {
        crate::process::signal(self.child.id(), sig);
    }

    /// The value of one /metrics sample (`name` with its labels, as printed).
    pub fn metric(&self, sample: &str) -> f64 {
        metric_in(&get(self.ops, "/metrics").1, sample)
            .unwrap_or_else(|| panic!("no sample {sample}"))
    }

    /// Waits until the sample satisfies `ok` (metrics are up to 0.5 s old).
    pub fn wait_metric(&self, sample: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let start = Instant::now();
        loop {
            // A request can meet a worker that was just killed (its
            // SO_REUSEPORT listener goes with it): no sample is "not yet".
            let last = metric_in(&get(self.ops, "/metrics").1, sample);
            if let Some(v) = last.filter(|&v| ok(v)) {
                return v;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "timed out waiting on {sample} (last value {last:?})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Worker pids from /metrics.
    pub fn worker_pids(&self) -> Vec<u32> {
        get(self.ops, "/metrics")
            .1
            .lines()
            .filter(|l| l.starts_with("throng_worker_rss_bytes{"))
            .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect()
    }

    /// What the server wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().expect("log lock").clone()
    }

    /// Waits until /healthz says `broker: <state>` (a node routing through Redis).
    pub fn wait_broker(&self, state: &str) {
        let want = format!("broker: {state}");
        wait_until(&format!("{} to report '{want}'", self.addr), || {
            get(self.ops, "/healthz").1.contains(&want)
        });
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
