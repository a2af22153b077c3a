//! Helpers for the cluster tests: a real `redis-server` and a real HAProxy
//! (Debian packages, installed by scripts/test.sh), started on free loopback
//! ports and killed on drop. A missing program fails the test with a message
//! saying how to install it: nothing is skipped silently.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// Always included beside support/serve.rs, as `support`.
use crate::support::wait_until;

/// Fails the test at once when `program` cannot run.
pub(crate) fn need(program: &str, package: &str) {
    let found = Command::new(program)
        .arg(if program == "haproxy" {
            "-v"
        } else {
            "--version"
        })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "{program} is not installed: run scripts/test.sh (it installs the Debian package \
         {package}), or apt-get install {package}"
    );
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` on 127.0.0.1; extra config lines (`--requirepass x`)
/// are kept for a restart on the same port.
pub(crate) struct Redis {
    child: Option<Child>,
    pub(crate) port: u16,
    args: Vec<String>,
    /// `redis-cli` arguments that authenticate.
    auth: Vec<String>,
    /// What redis-server printed.
    log: Arc<Mutex<String>>,
    /// TLS only (`--port 0 --tls-port`), with this server certificate.
    tls: Option<Certs>,
}

impl Redis {
    /// Starts redis-server with `args` (config directives as flags) on a free port.
    pub(crate) fn start(args: &[&str], auth: &[&str]) -> Self {
        Self::launch(None, args, auth)
    }

    /// Like [`Self::start`], but the server speaks only TLS on its port,
    /// with the certificate in `certs` (clients are not asked for one).
    pub(crate) fn start_tls(certs: Certs, args: &[&str], auth: &[&str]) -> Self {
        Self::launch(Some(certs), args, auth)
    }

    fn launch(tls: Option<Certs>, args: &[&str], auth: &[&str]) -> Self {
        need("redis-server", "redis-server");
        need("redis-cli", "redis-tools");
        let mut r = Self {
            child: None,
            port: free_port(),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            auth: auth.iter().map(|s| (*s).to_owned()).collect(),
            log: Arc::default(),
            tls,
        };
        r.restart();
        r
    }

    /// The certificates of a TLS server.
    pub(crate) fn certs(&self) -> &Certs {
        self.tls.as_ref().expect("a TLS redis-server")
    }

    /// (Re)starts the server on its port and waits until it answers PING.
    pub(crate) fn restart(&mut self) {
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
                c.cert_str(),
                "--tls-key-file",
                c.key_str(),
                "--tls-ca-cert-file",
                c.ca_str(),
                "--tls-auth-clients",
                "no",
            ],
        };
        let child = Command::new("redis-server")
            .args(&listen)
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start redis-server");
        // Drain its log so a full pipe never stalls it; kept for errors.
        let mut child = child;
        if let Some(out) = child.stdout.take() {
            let log = self.log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    log.lock().unwrap().push_str(&(line + "\n"));
                }
            });
        }
        self.child = Some(child);
        wait_until("redis-server to answer PING", || {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "redis-server exited ({status}):\n{}",
                    self.log.lock().unwrap()
                );
            }
            String::from_utf8_lossy(&self.cli_output(&["PING"]).stdout).trim() == "PONG"
        });
    }

    /// Kills the server (SIGKILL: an outage, not a shutdown).
    pub(crate) fn stop(&mut self) {
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
    pub(crate) fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("redis-server is running").id();
        let ok = Command::new("kill")
            .args(["-s", sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    fn cli_output(&self, args: &[&str]) -> Output {
        let tls: Vec<&str> = match &self.tls {
            None => vec![],
            Some(c) => vec!["--tls", "--cacert", c.ca_str()],
        };
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&tls)
            .args(&self.auth)
            .arg("--no-auth-warning")
            .args(args)
            .output()
            .expect("run redis-cli")
    }

    /// Runs `redis-cli <args>`; returns its output lines.
    pub(crate) fn cli(&self, args: &[&str]) -> Vec<String> {
        let out = self.cli_output(args);
        assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `PUBSUB NUMSUB <channel>`: subscriptions to it.
    pub(crate) fn numsub(&self, channel: &str) -> u64 {
        let lines = self.cli(&["PUBSUB", "NUMSUB", channel]);
        lines.get(1).and_then(|n| n.parse().ok()).unwrap_or(0)
    }

    /// `PUBSUB CHANNELS <pattern>`, sorted.
    pub(crate) fn channels(&self, pattern: &str) -> Vec<String> {
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

/// A test CA and a server certificate it signed for 127.0.0.1 and
/// localhost (ECDSA P-256), made with the `openssl` CLI in a fresh
/// directory that is removed on drop.
pub(crate) struct Certs {
    dir: PathBuf,
    ca: String,
    cert: String,
    key: String,
}

impl Certs {
    /// Generates the CA (`ca.pem`) and the server's `server.pem`/`server.key`.
    pub(crate) fn generate(name: &str) -> Self {
        need("openssl", "openssl");
        let dir = std::env::temp_dir().join(format!("throng-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let c = Self {
            ca: file("ca.pem"),
            cert: file("server.pem"),
            key: file("server.key"),
            dir,
        };
        c.new_ca("ca");
        let ext = c.dir.join("server.ext");
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        c.openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        c.openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.pem",
            "-extfile",
            "server.ext",
        ]);
        c
    }

    /// Another self-signed CA, `<name>.pem`, that signed nothing we serve.
    pub(crate) fn new_ca(&self, name: &str) -> PathBuf {
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=throng test {name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ]);
        self.dir.join(format!("{name}.pem"))
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("run openssl");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    }

    /// The CA certificate (PEM) that signed the server's.
    pub(crate) fn ca_str(&self) -> &str {
        &self.ca
    }

    fn cert_str(&self) -> &str {
        &self.cert
    }

    fn key_str(&self) -> &str {
        &self.key
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// HAProxy in TCP mode on a free port, round-robin over `backends`, with
/// the health check and timeouts docs/deploy.md recommends.
pub(crate) struct Haproxy {
    child: Child,
    pub(crate) addr: SocketAddr,
    config: PathBuf,
}

impl Haproxy {
    pub(crate) fn start(backends: &[SocketAddr]) -> Self {
        need("haproxy", "haproxy");
        let port = free_port();
        let mut cfg = format!(
            "global\n  maxconn 2000\n\
             defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  \
             timeout server 1h\n  timeout tunnel 1h\n  timeout client-fin 30s\n\
             frontend ws\n  bind 127.0.0.1:{port}\n  default_backend nodes\n\
             backend nodes\n  balance roundrobin\n  option httpchk\n  \
             http-check send meth GET uri /healthz\n  http-check expect status 200\n"
        );
        for (i, b) in backends.iter().enumerate() {
            cfg.push_str(&format!("  server node{i} {b} check inter 1s\n"));
        }
        let config = std::env::temp_dir().join(format!(
            "throng-test-haproxy-{}-{port}.cfg",
            std::process::id()
        ));
        std::fs::write(&config, cfg).unwrap();
        let check = Command::new("haproxy")
            .args(["-c", "-q", "-f"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(check.status.success(), "haproxy config: {check:?}");
        let child = Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_until("haproxy to listen", || TcpStream::connect(addr).is_ok());
        Self {
            child,
            addr,
            config,
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}
