//! `throng serve` as a child of the bench: started, waited for until it
//! answers, stopped with SIGTERM, never left behind.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use throng_host::process::{self, Signal};

use super::BenchError;

/// `throng serve` as a child process in its own process group, killed with
/// its parent (`PR_SET_PDEATHSIG`) so that a bench that dies leaves no server.
#[derive(Debug)]
pub struct Server {
    child: Child,
    addr: SocketAddr,
    /// The JSON start line it printed.
    start_line: serde_json::Value,
    done: Option<ExitStatus>,
    /// Its last lines on stderr (which are passed on to ours as they come),
    /// to say why it stopped.
    said: Arc<Mutex<VecDeque<String>>>,
}

/// How many of the server's last stderr lines are kept.
const KEPT_LINES: usize = 4;

/// Passes the server's stderr on to ours, line by line, keeping the last
/// [`KEPT_LINES`].
fn pass_on(stderr: impl Read + Send + 'static, said: Arc<Mutex<VecDeque<String>>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("{line}");
            let mut kept = said.lock().unwrap_or_else(PoisonError::into_inner);
            if kept.len() == KEPT_LINES {
                kept.pop_front();
            }
            kept.push_back(line);
        }
    });
}

impl Server {
    /// Starts `program args...` (which must print a JSON line with
    /// `"listen":["ADDR",..]` on stdout when bound) and waits until it
    /// answers `GET /healthz`.
    pub fn start(program: &Path, args: &[String], timeout: Duration) -> Result<Self, BenchError> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        {
            use std::os::unix::process::CommandExt as _;
            // Own group: the terminal's Ctrl-C reaches the bench only, which
            // stops the server itself after the harness closed its connections.
            cmd.process_group(0);
        }
        process::exit_with_parent(&mut cmd, Signal::Term);
        let mut child = cmd.spawn().map_err(BenchError::Spawn)?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(BenchError::NotReady("no stdout".into()));
        };
        let said = Arc::new(Mutex::new(VecDeque::new()));
        pass_on(stderr, Arc::clone(&said));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let mut sent = false;
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if !sent => {
                        sent = true;
                        let _ = tx.send(line.clone());
                    }
                    // Later lines are drained so the server never blocks on a full pipe.
                    Ok(_) => {}
                }
            }
        });
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            start_line: serde_json::Value::Null,
            done: None,
            said,
        };
        let deadline = Instant::now() + timeout;
        let line = match rx.recv_timeout(timeout) {
            Ok(line) => line,
            // Its stdout closed: it exited, or is about to.
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = server.stop(Duration::from_secs(2));
                return Err(BenchError::ServerExited {
                    status: status.map_or_else(|| "killed".to_owned(), |s| s.to_string()),
                    said: server.last_words(),
                });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let status = server.stop(Duration::from_secs(2));
                return Err(BenchError::NotReady(format!(
                    "no start line within {timeout:?} (server {}){}",
                    status.map_or_else(|| "killed".to_owned(), |s| s.to_string()),
                    server
                        .last_words()
                        .map_or_else(String::new, |w| format!(": {w}"))
                )));
            }
        };
        let start_line = serde_json::from_str::<serde_json::Value>(&line).unwrap_or_default();
        let addr = start_line["listen"][0]
            .as_str()
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            server.stop(Duration::from_secs(2));
            return Err(BenchError::NotReady(format!(
                "start line has no listen address: {}",
                line.trim()
            )));
        };
        server.addr = addr;
        server.start_line = start_line;
        loop {
            if let Some(status) = server.exited() {
                return Err(BenchError::ServerExited {
                    status: status.to_string(),
                    said: server.last_words(),
                });
            }
            if http_get(addr, "/healthz").is_ok_and(|(code, _)| code == 200) {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                server.stop(Duration::from_secs(2));
                return Err(BenchError::NotReady(format!(
                    "no answer on http://{addr}/healthz within {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its last stderr lines, joined, if it said anything. The pipe may
    /// still hold a line when it has just exited: waited for briefly.
    fn last_words(&self) -> Option<String> {
        std::thread::sleep(Duration::from_millis(100));
        let kept = self.said.lock().unwrap_or_else(PoisonError::into_inner);
        (!kept.is_empty()).then(|| {
            kept.iter()
                .map(|l| l.trim())
                .collect::<Vec<_>>()
                .join(" / ")
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The JSON line it printed when it was ready.
    pub fn start_line(&self) -> &serde_json::Value {
        &self.start_line
    }

    /// The supervisor's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.done.is_none() {
            self.done = self.child.try_wait().ok().flatten();
        }
        self.done
    }

    /// SIGTERM (the server closes every connection with 1001 and exits),
    /// then after `timeout` SIGKILL to its whole process group. `None`: killed.
    pub fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exited() {
            return Some(s);
        }
        // Our own child, not reaped yet: the pid is still its.
        let pid = self.child.id();
        let _ = process::signal(pid, Signal::Term);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The child leads its own process group (process_group(0)).
        let _ = process::signal_group(pid, Signal::Kill);
        let _ = self.child.wait();
        self.done = None;
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.exited().is_none() {
            self.stop(Duration::from_secs(5));
        }
    }
}

/// One `GET path` over HTTP/1.0: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.take(16 << 20).read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other("not an HTTP response"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    Ok((code, body))
}

/// The first of `n` consecutive free TCP ports on `ip`, below the usual
/// ephemeral range (so outgoing connections do not take them meanwhile).
/// Several listening ports give the server several accept queues, which a
/// burst of connects on a busy machine needs.
pub fn free_port_range(ip: std::net::IpAddr, n: u16) -> io::Result<u16> {
    for _ in 0..200 {
        let first = fastrand::u16(20_000..30_000 - n);
        let bound: Result<Vec<_>, _> = (first..first + n)
            .map(|p| std::net::TcpListener::bind((ip, p)))
            .collect();
        if bound.is_ok() {
            return Ok(first);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no {n} consecutive free ports on {ip} in 20000-30000"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that exits before its start line is named at once, with
    /// what it said last, not after the whole timeout.
    #[test]
    fn a_server_that_exits_at_start_is_named_with_its_last_words() {
        let t0 = Instant::now();
        let e = Server::start(
            Path::new("/bin/sh"),
            &[
                "-c".into(),
                "echo starting >&2; echo 'throng: error: cannot listen on 127.0.0.1:1' >&2; exit 2"
                    .into(),
            ],
            Duration::from_secs(20),
        )
        .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        let text = e.to_string();
        assert!(text.contains("exited before it was ready"), "{text}");
        assert!(text.contains("exit status: 2"), "{text}");
        assert!(
            text.contains("starting / throng: error: cannot listen on 127.0.0.1:1"),
            "{text}"
        );
    }
}
