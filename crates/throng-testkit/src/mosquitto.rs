//! A real Mosquitto broker (Debian's) on a free loopback port, plain or
//! TLS, anonymous, for the MQTT tests: what `throng hold mqtt://...` and
//! `--publish mqtt://...` are checked against.

use std::io::Read as _;
use std::net::TcpStream;
use std::process::{Child, Stdio};

use crate::certs::Certs;
use crate::peers::{Peer, expect};
use crate::process::command;
use crate::{TempDir, free_port, wait_until};

/// A `mosquitto` on 127.0.0.1, killed on drop.
#[derive(Debug)]
pub struct Mosquitto {
    child: Option<Child>,
    pub port: u16,
    /// Its config and log.
    dir: TempDir,
    tls: Option<Certs>,
}

impl Mosquitto {
    /// A plain broker: `mqtt://127.0.0.1:<port>`.
    pub fn start() -> Self {
        Self::launch(None, "")
    }

    /// A plain broker with more configuration lines (`allow_anonymous false\n`).
    pub fn start_with(config: &str) -> Self {
        Self::launch(None, config)
    }

    /// A TLS-only broker with the certificate in `certs`:
    /// `mqtts://127.0.0.1:<port>`.
    pub fn start_tls(certs: Certs) -> Self {
        Self::launch(Some(certs), "")
    }

    fn launch(tls: Option<Certs>, extra: &str) -> Self {
        expect(Peer::Mosquitto);
        let dir = TempDir::new("mosquitto");
        let port = free_port();
        let mut conf = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nuser root\n\
             log_dest file {}\nlog_type error\nlog_type warning\n\
             max_connections -1\nmax_queued_messages 100000\n",
            dir.arg("mosquitto.log")
        );
        // Later lines win: what the test asks for overrides the defaults.
        conf.push_str(extra);
        if let Some(c) = &tls {
            conf.push_str(&format!("certfile {}\nkeyfile {}\n", c.cert(), c.key()));
        }
        let conf_path = dir.arg("mosquitto.conf");
        std::fs::write(&conf_path, conf).expect("write mosquitto.conf");
        let child = command("mosquitto")
            .args(["-c", &conf_path])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto");
        let mut m = Self {
            child: Some(child),
            port,
            dir,
            tls,
        };
        wait_until("mosquitto to listen", || {
            if let Some(c) = m.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("mosquitto exited ({status}):\n{}", m.log());
            }
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        m
    }

    /// `mqtt://127.0.0.1:<port>/<topic>`, or `mqtts://` for a TLS broker.
    pub fn url(&self, topic: &str) -> String {
        let scheme = if self.tls.is_some() { "mqtts" } else { "mqtt" };
        format!("{scheme}://127.0.0.1:{}/{topic}", self.port)
    }

    /// The certificates of a TLS broker.
    pub fn certs(&self) -> &Certs {
        self.tls.as_ref().expect("a TLS mosquitto")
    }

    /// What the broker logged (errors, warnings, notices).
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.arg("mosquitto.log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
