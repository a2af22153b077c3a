//! A real `redis-server` (Debian's) on a free loopback port, plain or
//! TLS-only, stopped, hung and restarted on cue, and `redis-cli` to look
//! inside it.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::certs::Certs;
use crate::peers::{Peer, expect};
use crate::process::command;
use crate::{free_port, wait_until};

/// In [`Redis::start`]'s arguments: a free port of its own (e.g. for
/// `--cluster-port`), chosen again if a start finds it taken.
pub const FREE_PORT: &str = "{free port}";

/// A `redis-server` on 127.0.0.1, killed on drop. Its extra config lines
/// (`--requirepass x`) are kept for a restart on the same port.
#[derive(Debug)]
pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    args: Vec<String>,
    /// `redis-cli` arguments that authenticate.
    auth: Vec<String>,
    /// What redis-server printed.
    log: Arc<Mutex<String>>,
    /// TLS only (`--port 0 --tls-port`), with this server certificate.
    tls: Option<Certs>,
}

impl Redis {
    /// Starts redis-server with `args` (config directives as flags) on a
    /// free port; `redis-cli` authenticates with `auth`.
    pub fn start(args: &[&str], auth: &[&str]) -> Self {
        Self::launch(None, args, auth)
    }

    /// Like [`Self::start`], but the server speaks only TLS on its port,
    /// with the certificate in `certs` (clients are not asked for one).
    pub fn start_tls(certs: Certs, args: &[&str], auth: &[&str]) -> Self {
        Self::launch(Some(certs), args, auth)
    }

    /// Starts it on a free port, and [`FREE_PORT`] in `args` each on one
    /// of its own. A free port is only free until someone binds it (a
    /// busy test run's outgoing connections take ports from the same
    /// range): a start that finds one taken tries new ones.
    fn launch(tls: Option<Certs>, args: &[&str], auth: &[&str]) -> Self {
        expect(Peer::RedisServer);
        expect(Peer::RedisCli);
        let mut r = Self {
            child: None,
            port: 0,
            args: Vec::new(),
            auth: auth.iter().map(|s| (*s).to_owned()).collect(),
            log: Arc::default(),
            tls,
        };
        for attempt in 1.. {
            r.port = free_port();
            r.args = args
                .iter()
                .map(|&a| match a {
                    FREE_PORT => free_port().to_string(),
                    a => a.to_owned(),
                })
                .collect();
            match r.spawn() {
                Ok(()) => break,
                Err(e) if attempt < 5 && e.contains("Address already in use") => {
                    r.log.lock().expect("log lock").clear();
                }
                Err(e) => panic!("{e}"),
            }
        }
        r
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The certificates of a TLS server.
    pub fn certs(&self) -> &Certs {
        self.tls.as_ref().expect("a TLS redis-server")
    }

    /// (Re)starts the server on its port and waits until it answers PING.
    pub fn restart(&mut self) {
        if let Err(e) = self.spawn() {
            panic!("{e}");
        }
    }

    /// Starts the server on its port and waits until it answers PING; what
    /// it printed if it exited instead.
    fn spawn(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "redis-server is already running");
        let port = self.port.to_string();
        let listen: Vec<&str> = match &self.tls {
            None => vec!["--port", &port],
            Some(c) => vec![
                "--port",
                "0",
                "--tls-port",
                &port,
                "--tls-cert-file",
                c.cert(),
                "--tls-key-file",
                c.key(),
                "--tls-ca-cert-file",
                c.ca(),
                "--tls-auth-clients",
                "no",
            ],
        };
        let mut child = command("redis-server")
            .args(&listen)
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start redis-server");
        // Drain its log so a full pipe never stalls it; kept for errors.
        if let Some(out) = child.stdout.take() {
            let log = self.log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    log.lock().expect("log lock").push_str(&(line + "\n"));
                }
            });
        }
        self.child = Some(child);
        let mut exited = None;
        wait_until("redis-server to answer PING", || {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                exited = Some(status);
                return true;
            }
            String::from_utf8_lossy(&self.cli_output(&["PING"]).stdout).trim() == "PONG"
        });
        let Some(status) = exited else {
            return Ok(());
        };
        self.child = None;
        // The log thread reads what it printed last.
        std::thread::sleep(Duration::from_millis(100));
        Err(format!(
            "redis-server exited ({status}):\n{}",
            self.log.lock().expect("log lock")
        ))
    }

    /// Kills the server (SIGKILL: an outage, not a shutdown) and waits
    /// until its port is closed.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        wait_until("redis-server's port to close", || {
            TcpStream::connect(("127.0.0.1", self.port)).is_err()
        });
    }

    /// Sends a signal (`STOP`, `CONT`) to the server: a hung Redis keeps
    /// its connections open and answers nothing.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("redis-server is running").id();
        crate::process::signal(pid, sig);
    }

    /// `redis-cli` aimed at this server (address, TLS, authentication);
    /// the caller adds the command.
    pub fn cli_command(&self) -> Command {
        let mut c = command("redis-cli");
        c.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(certs) = &self.tls {
            c.args(["--tls", "--cacert", certs.ca()]);
        }
        c.args(&self.auth).arg("--no-auth-warning");
        c
    }

    fn cli_output(&self, args: &[&str]) -> Output {
        self.cli_command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli")
    }

    /// Runs `redis-cli <args>`; returns its output lines.
    pub fn cli(&self, args: &[&str]) -> Vec<String> {
        let out = self.cli_output(args);
        assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `PUBSUB NUMSUB <channel>`: subscriptions to it.
    pub fn numsub(&self, channel: &str) -> u64 {
        let lines = self.cli(&["PUBSUB", "NUMSUB", channel]);
        lines.get(1).and_then(|n| n.parse().ok()).unwrap_or(0)
    }

    /// `PUBSUB CHANNELS <pattern>`, sorted.
    pub fn channels(&self, pattern: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .cli(&["PUBSUB", "CHANNELS", pattern])
            .into_iter()
            .filter(|l| !l.is_empty())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
