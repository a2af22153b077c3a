//! `serve --takeover`: the handover of the ports from a running serve to a
//! new one over the running one's control socket (a Unix socket next to
//! the port lock file, named by the holder's pid).
//!
//! The exchange, one line each way, the sockets riding on the answer:
//! new `take` -> old `ports P,...` with its reserved sockets attached
//! (`SCM_RIGHTS`), and the old one gives up its port claims; the new one
//! claims them, starts its workers in the same `SO_REUSEPORT` groups and,
//! once they listen, says `go` -> the old one closes its connections
//! spread over `--drain-spread` and exits. Until `go` both accept, so no
//! connection is refused in between. Without `go` (the new one died) the
//! old one claims its ports again and carries on.
//!
//! After `go` the old one answers `history N` and N bytes: its embedded
//! history (`history::handover`), which the new one adopts before it
//! numbers a message or answers a recovery (N is 0 with Redis or without
//! history: nothing to hand over); then `retained N` and N bytes: its
//! embedded retained MQTT messages (`retained::handover`; N is 0 with
//! Redis, which keeps them for both), which the new one sets before it
//! answers a subscription's retained read. An old server that closes
//! after its history hands over no retained messages.

use std::io::{self, BufRead as _, BufReader, Read as _, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use throng_host::fdpass;

/// Why a takeover could not be done.
#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    /// The running serve's control socket did not answer.
    #[error("cannot reach the control socket {path} of the running serve (pid {pid}): {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The running serve.
        pid: i32,
        /// The OS error.
        source: io::Error,
    },
    /// The running serve is another user's: the kernel would not let our
    /// sockets join its ports' groups.
    #[error(
        "cannot take over pid {pid}: it runs as {holder}, this serve as {ours}; --takeover \
         works between serves of the same user only (the kernel lets only one user's sockets \
         share a port): run this one as that user (sudo -u {user} throng serve ... \
         --takeover; under systemd User={user})"
    )]
    OtherUser {
        /// The running serve.
        pid: i32,
        /// Its user (`name (uid N)`).
        holder: String,
        /// That user for `sudo -u` (`name`, or `#N`).
        user: String,
        /// Ours.
        ours: String,
    },
    /// The exchange broke off or made no sense.
    #[error("the takeover from pid {pid} failed: {source}")]
    Exchange {
        /// The running serve.
        pid: i32,
        /// What went wrong.
        source: io::Error,
    },
}

/// The new server's side of a handover in progress.
#[derive(Debug)]
pub struct Handover {
    stream: UnixStream,
    pid: i32,
    /// The running server's reserved sockets, received.
    pub sockets: Vec<socket2::Socket>,
}

impl Handover {
    /// Asks the serve with pid `pid` (control socket `path`) for its ports.
    pub fn take(path: &Path, pid: i32) -> Result<Self, TakeoverError> {
        let stream = UnixStream::connect(path).map_err(|source| TakeoverError::Connect {
            path: path.to_owned(),
            pid,
            source,
        })?;
        let fail = |source| TakeoverError::Exchange { pid, source };
        // Checked before asking: root may connect to anyone's socket.
        let holder = fdpass::peer(&stream).map_err(fail)?.uid;
        if holder != fdpass::euid() {
            return Err(TakeoverError::OtherUser {
                pid,
                holder: user_label(holder),
                user: sudo_user(holder),
                ours: user_label(fdpass::euid()),
            });
        }
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(fail)?;
        (&stream).write_all(b"take\n").map_err(fail)?;
        let mut buf = [0u8; 64 * 1024];
        let (n, fds) = fdpass::recv(&stream, &mut buf).map_err(fail)?;
        if let Some(why) = buf[..n].strip_prefix(b"refused: ") {
            let why = String::from_utf8_lossy(why).trim().to_owned();
            return Err(fail(io::Error::other(why)));
        }
        if !buf[..n].starts_with(b"ports ") {
            return Err(fail(io::Error::other(format!(
                "unexpected answer {:?}",
                String::from_utf8_lossy(&buf[..n])
            ))));
        }
        Ok(Self {
            stream,
            pid,
            sockets: fds.into_iter().map(socket2::Socket::from).collect(),
        })
    }

    /// The running serve's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Tells the old server that our workers listen (it closes its own)
    /// and reads what it hands over (empty: none). Blocking: run it on a
    /// thread of its own.
    pub fn go(self) -> io::Result<Handed> {
        (&self.stream).write_all(b"go\n")?;
        // Writing out a large history takes the old server a moment.
        self.stream
            .set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut r = BufReader::new(&self.stream);
        // An old server that hands over nothing (or no retained messages)
        // just closes.
        let history = read_part(&mut r, "history")?;
        let retained = read_part(&mut r, "retained")?;
        Ok(Handed { history, retained })
    }
}

/// Reads one part of what the old server hands over: a `<what> N` line
/// and N bytes (empty when the server closed instead).
fn read_part(r: &mut BufReader<&UnixStream>, what: &str) -> io::Result<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(Vec::new());
    }
    let n = line
        .trim()
        .strip_prefix(what)
        .and_then(|n| n.strip_prefix(' '))
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|&n| n <= MAX_HISTORY)
        .ok_or_else(|| io::Error::other(format!("unexpected answer {line:?}")))?;
    let mut bytes = vec![0; usize::try_from(n).map_err(io::Error::other)?];
    r.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// What the old server hands over after `go`: its embedded history and
/// retained messages as handover bytes (each empty: none).
#[derive(Debug, Default)]
pub struct Handed {
    /// `History::export`'s bytes.
    pub history: Vec<u8>,
    /// `Retained::export`'s bytes.
    pub retained: Vec<u8>,
}

/// The most bytes of one part a new server reads (the old one's are
/// bounded by its `--history-max-memory` and `--max-retained-memory`;
/// this only stops a garbage length).
const MAX_HISTORY: u64 = 1 << 36;

/// The old server's way to hand its history and retained messages over
/// once told `go`.
#[derive(Debug)]
pub struct Reply {
    handed: std::sync::mpsc::Sender<Handed>,
    written: std::sync::mpsc::Receiver<()>,
}

impl Reply {
    /// Hands `handed` to the new server. The handover's thread writes it
    /// out: the process must not exit before [`Written::wait`] says it has
    /// (a supervisor with nothing to drain exits at once, and took the
    /// bytes with it under load).
    pub fn send(self, handed: Handed) -> Written {
        let _ = self.handed.send(handed);
        Written(self.written)
    }
}

/// Says when the old server's handover bytes are written out.
#[derive(Debug)]
pub struct Written(std::sync::mpsc::Receiver<()>);

impl Written {
    /// Waits until the bytes are written (or failed), at most `limit`.
    pub fn wait(self, limit: Duration) {
        let _ = self.0.recv_timeout(limit);
    }
}

/// What the old server's side of a handover reports to its supervisor.
#[derive(Debug)]
pub enum Step {
    /// The sockets went over: give up the port claims.
    Release,
    /// The new server listens: close spread out and exit, and hand the
    /// history over through the reply.
    Go(Reply),
    /// The new server went away without `go`: claim the ports again.
    Abandoned,
}

/// The control socket of a running serve: binds `path` (a stale file of a
/// dead serve is replaced), connectable by its own user only (root still
/// connects, and is refused by [`admit`]).
pub fn listen(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt as _;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// `uid` as a person reads it: `name (uid N)`, or `uid N` without a name.
pub fn user_label(uid: u32) -> String {
    match throng_host::portlock::user_name(uid) {
        Some(name) => format!("{name} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// `uid` as `sudo -u` takes it: its name, or `#N`.
pub fn sudo_user(uid: u32) -> String {
    throng_host::portlock::user_name(uid).unwrap_or_else(|| format!("#{uid}"))
}

/// Whether a takeover request from `peer` may have our sockets: only
/// from our own user (whose sockets the kernel lets join our ports); else
/// the answer that says why not.
pub fn admit(peer: fdpass::Peer, ours: u32) -> Result<(), String> {
    if peer.uid == ours {
        return Ok(());
    }
    Err(format!(
        "refused: this serve (pid {}) runs as {}, the one asking (pid {}) as {}; a takeover \
         needs the same user\n",
        std::process::id(),
        user_label(ours),
        peer.pid,
        user_label(peer.uid)
    ))
}

/// The old server's side of one handover over `stream` (blocking: run it
/// on a thread of its own): sends `ports` and `sockets`, then reports
/// each step through `report`.
pub fn give(
    stream: &UnixStream,
    ports: &[u16],
    sockets: &[OwnedFd],
    mut report: impl FnMut(Step),
) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut lines = BufReader::new(stream);
    let mut line = String::new();
    lines.read_line(&mut line)?;
    if line.trim() != "take" {
        return Err(io::Error::other(format!("unexpected request {line:?}")));
    }
    let list: Vec<String> = ports.iter().map(u16::to_string).collect();
    let text = format!("ports {}\n", list.join(","));
    let fds: Vec<_> = sockets.iter().map(|s| s.as_fd()).collect();
    fdpass::send(stream, text.as_bytes(), &fds)?;
    report(Step::Release);
    // The new server's workers start within seconds; a minute is plenty.
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    line.clear();
    match lines.read_line(&mut line) {
        Ok(_) if line.trim() == "go" => {}
        _ => {
            report(Step::Abandoned);
            return Ok(());
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let (written, written_rx) = std::sync::mpsc::channel();
    report(Step::Go(Reply {
        handed: tx,
        written: written_rx,
    }));
    // The supervisor answers at once; without an answer the new server
    // starts with a history of its own.
    let handed = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
    let mut out = stream;
    let sent = [("history", handed.history), ("retained", handed.retained)]
        .into_iter()
        .try_for_each(|(what, bytes)| {
            out.write_all(format!("{what} {}\n", bytes.len()).as_bytes())?;
            out.write_all(&bytes)
        });
    // Written or failed: the process may go.
    let _ = written.send(());
    sent
}

/// A running serve's control socket, in its supervisor's event loop.
#[derive(Debug)]
pub(crate) struct Control {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    tx: tokio::sync::mpsc::UnboundedSender<Step>,
    rx: tokio::sync::mpsc::UnboundedReceiver<Step>,
}

impl Control {
    /// Listens on `path`, after removing the sockets of serves that are
    /// gone (a `kill -9` leaves its file behind).
    pub(crate) fn open(path: PathBuf) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            remove_stale(dir);
        }
        let l = listen(&path)?;
        l.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(l)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        Ok(Self {
            listener,
            path,
            tx,
            rx,
        })
    }

    /// Serves takeover requests (each on a thread of its own, with copies
    /// of `sockets`, the reserved ones of `ports`) until one reports a step.
    pub(crate) async fn next(&mut self, ports: &[u16], sockets: &[socket2::Socket]) -> Step {
        loop {
            tokio::select! {
                step = self.rx.recv() => if let Some(step) = step {
                    return step;
                },
                conn = self.listener.accept() => {
                    let Ok((conn, _)) = conn else { continue };
                    let copies: io::Result<Vec<OwnedFd>> = sockets
                        .iter()
                        .map(|s| s.try_clone().map(OwnedFd::from))
                        .collect();
                    let (Ok(copies), Ok(conn)) = (copies, conn.into_std()) else {
                        continue;
                    };
                    let peer = fdpass::peer(&conn);
                    let verdict = peer.as_ref().map_err(ToString::to_string).and_then(|p| admit(*p, fdpass::euid()));
                    if let Err(answer) = verdict {
                        log!("throng: takeover request {}", answer.trim());
                        let _ = conn.set_nonblocking(false);
                        let _ = (&conn).write_all(answer.as_bytes());
                        continue;
                    }
                    let tx = self.tx.clone();
                    let ports = ports.to_vec();
                    std::thread::spawn(move || {
                        let _ = conn.set_nonblocking(false);
                        if let Err(e) = give(&conn, &ports, &copies, |s| {
                            let _ = tx.send(s);
                        }) {
                            log!("throng: takeover request: {e}");
                        }
                    });
                }
            }
        }
    }
}

/// Removes `control.<pid>.sock` files in `dir` whose process is gone.
fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("control."))
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(|n| n.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_own_user_may_take_over() {
        let me = fdpass::euid();
        assert!(admit(fdpass::Peer { pid: 7, uid: me }, me).is_ok());
        let other = me.wrapping_add(1);
        let no = admit(fdpass::Peer { pid: 7, uid: other }, me).unwrap_err();
        assert!(no.starts_with("refused: "), "{no}");
        assert!(
            no.contains(&format!("uid {other}")) && no.contains("same user"),
            "{no}"
        );
    }

    #[test]
    fn a_handover_passes_the_sockets_and_reports_each_step() {
        let dir = std::env::temp_dir().join(format!("throng-takeover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("control.1.sock");
        let ctl = listen(&path).unwrap();
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let sockets = vec![OwnedFd::from(held)];
        let old = std::thread::spawn(move || {
            let (s, _) = ctl.accept().unwrap();
            let mut steps = Vec::new();
            give(&s, &[addr.port()], &sockets, |st| {
                steps.push(format!("{st:?}"));
                if let Step::Go(reply) = st {
                    // Not waited for here: this thread writes them.
                    drop(reply.send(Handed {
                        history: b"the history".to_vec(),
                        retained: b"retained".to_vec(),
                    }));
                }
            })
            .unwrap();
            steps
        });
        let h = Handover::take(&path, 1).unwrap();
        assert_eq!(h.sockets.len(), 1);
        let got = h.sockets[0].local_addr().unwrap().as_socket().unwrap();
        assert_eq!(got, addr);
        let handed = h.go().unwrap();
        assert_eq!(handed.history, b"the history");
        assert_eq!(handed.retained, b"retained");
        let steps = old.join().unwrap();
        assert_eq!(steps.len(), 2, "{steps:?}");
        assert_eq!(steps[0], "Release");
        assert!(steps[1].starts_with("Go("), "{steps:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
