//! The independent push servers `throng hold` is tested against:
//! `tests/peers/hold_server.py` (Python `websockets`) and
//! `tests/peers/hold_server.js` (Node `ws`). Each serves WebSocket
//! subscribers and an HTTP publish endpoint, misbehaves on request, and
//! counts what it saw (see the scripts' own help).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

use crate::peers;

/// A running peer server, killed on drop.
#[derive(Debug)]
pub struct HoldServer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The first and last WebSocket port (the same unless `--ports N`).
    pub ws_ports: (u16, u16),
    /// Where `POST /publish/<channel>` goes.
    pub http_port: u16,
}

impl HoldServer {
    /// `hold_server.py` with `args`.
    pub fn python(args: &[&str]) -> Self {
        Self::start(peers::python("hold_server.py"), args)
    }

    /// `hold_server.js` with `args`.
    pub fn node(args: &[&str]) -> Self {
        Self::start(peers::node("hold_server.js"), args)
    }

    /// Starts the peer and reads its `READY <ws first> <ws last> <http>` line.
    fn start(mut cmd: Command, args: &[&str]) -> Self {
        let mut child = cmd
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let stdin = child.stdin.take().expect("stdin is piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("read the peer's READY line");
        let words: Vec<&str> = line.split_whitespace().collect();
        let port = |i: usize| -> u16 {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("{cmd:?} said {line:?}, not READY <port> <port> <port>"))
        };
        assert_eq!(words.first(), Some(&"READY"), "{cmd:?} said {line:?}");
        Self {
            ws_ports: (port(1), port(2)),
            http_port: port(3),
            child,
            stdin,
            stdout,
        }
    }

    /// `ws://127.0.0.1:<port>/chan`, or `<first>-<last>` over several ports.
    pub fn ws_url(&self) -> String {
        match self.ws_ports {
            (a, b) if a == b => format!("ws://127.0.0.1:{a}/chan"),
            (a, b) => format!("ws://127.0.0.1:{a}-{b}/chan"),
        }
    }

    /// `http://127.0.0.1:<http port>/publish/chan`.
    pub fn publish_url(&self) -> String {
        format!("http://127.0.0.1:{}/publish/chan", self.http_port)
    }

    /// What the peer counted: upgrades seen, connections by client address
    /// (`by_ip`) and by server port (`by_port`). `hold_server.py` only.
    pub fn stats(&mut self) -> Value {
        writeln!(self.stdin, "stats").expect("ask the peer for its stats");
        self.stdin.flush().expect("flush the peer's stdin");
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("read the peer's stats");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("stats {line:?}: {e}"))
    }
}

impl Drop for HoldServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
