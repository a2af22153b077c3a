//! One owner per port: a `throng serve` claims each port it listens on with
//! a POSIX record lock on one byte (the port number as the offset) of one
//! file per user and network namespace. The kernel lets two processes of
//! one user join a `SO_REUSEPORT` group and splits connections between
//! them; this lock is how a second server learns the port is taken, and by
//! whom (`F_GETLK` names the holder's pid).
//!
//! Why a record lock: one descriptor for any number of ports (1,001 ports
//! cost one file, not 1,001), the kernel drops it when the process dies (a
//! `kill -9` leaves nothing stale), and it works without root. Why per
//! user: only one user can join another's `SO_REUSEPORT` group, so other
//! users' servers are refused by `bind` already. Why per network namespace:
//! ports are.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// Why a port could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another process holds the port's lock.
    #[error("port {port} is held by a running throng serve (pid {pid})")]
    Held {
        /// The port.
        port: u16,
        /// The holder, in this process's pid namespace.
        pid: i32,
    },
    /// The lock file could not be made or locked.
    #[error("cannot use the port lock file {path}: {source}")]
    File {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// The ports this process claimed; dropping it (or exiting) frees them.
#[derive(Debug)]
pub struct PortLocks {
    file: File,
    path: PathBuf,
    ports: Vec<u16>,
}

impl PortLocks {
    /// Opens this user's lock file for this network namespace, making its
    /// directory (mode 0700) if needed: `/run/throng` for root or for the
    /// user who owns it (a service's `RuntimeDirectory=throng`),
    /// `/tmp/throng-<uid>` for anyone else (the same place whatever the
    /// session's environment, so every shell of the user finds it).
    pub fn open() -> Result<Self, ClaimError> {
        Self::open_in(&default_dir())
    }

    /// As [`PortLocks::open`], in `dir`.
    pub fn open_in(dir: &Path) -> Result<Self, ClaimError> {
        let path = dir.join(format!("ports.net{}.lock", netns_id()));
        let fail = |source| ClaimError::File {
            path: path.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(fail)?;
        // Another user's directory in /tmp must not decide for us.
        let meta = std::fs::metadata(dir).map_err(fail)?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if meta.uid() != uid {
            return Err(fail(io::Error::other(format!(
                "{} belongs to uid {}, not to this user ({uid})",
                dir.display(),
                meta.uid()
            ))));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(fail)?;
        Ok(Self {
            file,
            path,
            ports: Vec::new(),
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The control socket a running serve with pid `pid` listens on for a
    /// `--takeover` (next to the lock file, so whoever finds the holder of
    /// a port finds it too).
    pub fn control_path(&self, pid: i32) -> PathBuf {
        self.path.with_file_name(format!("control.{pid}.sock"))
    }

    /// The ports claimed so far.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// Claims `port` for this process, or names the process that holds it.
    /// Claiming a port twice in one process succeeds (POSIX locks are the
    /// process's): a command that names one port twice is the caller's to refuse.
    pub fn claim(&mut self, port: u16) -> Result<(), ClaimError> {
        let mut lock = record(port, libc::F_WRLCK);
        // SAFETY: `lock` is a valid flock for the call; the fd is open.
        if unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLK, &lock) } == 0 {
            self.ports.push(port);
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if !matches!(err.raw_os_error(), Some(libc::EACCES | libc::EAGAIN)) {
            return Err(ClaimError::File {
                path: self.path.clone(),
                source: err,
            });
        }
        // SAFETY: as above; F_GETLK writes the holder into `lock`.
        let got = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETLK, &mut lock) };
        let pid = if got == 0 && lock.l_type != libc::F_UNLCK as libc::c_short {
            lock.l_pid
        } else {
            0
        };
        Err(ClaimError::Held { port, pid })
    }
}

/// A lock record for one byte at offset `port`.
fn record(port: u16, kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is plain data; all-zero is a valid value of it.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = libc::off_t::from(port);
    lock.l_len = 1;
    lock
}

fn default_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let run = PathBuf::from("/run/throng");
    // A service user's own /run/throng (systemd's RuntimeDirectory=throng)
    // is shared by the service and anything run by hand as that user.
    let ours = std::fs::metadata(&run).is_ok_and(|m| m.is_dir() && m.uid() == uid);
    if uid == 0 || ours {
        run
    } else {
        PathBuf::from(format!("/tmp/throng-{uid}"))
    }
}

/// The uid that owns a TCP socket listening on `port` (any address), from
/// `/proc/net/tcp` and `tcp6`, which anyone may read: who holds a port
/// this process cannot bind, when no claim of ours names the holder (a
/// serve of another user keeps its claims elsewhere).
pub fn listener_uid(port: u16) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find_map(|t| listener_uid_in(&t, port))
}

/// [`listener_uid`] over the text of one `/proc/net/tcp*` table.
fn listener_uid_in(table: &str, port: u16) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let local_port = f.get(1)?.rsplit_once(':')?.1;
        // State 0A is LISTEN.
        let listening = *f.get(3)? == "0A";
        let ours = u16::from_str_radix(local_port, 16).ok()? == port;
        (listening && ours).then(|| f.get(7)?.parse().ok())?
    })
}

/// The name of user `uid` in `/etc/passwd`, if it has one.
pub fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_owned())
    })
}

/// This process's network namespace (the inode of `/proc/self/ns/net`; 0
/// when it cannot be read).
fn netns_id() -> u64 {
    std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_of_a_port_is_found_with_its_uid_and_nothing_else_is() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:47A5 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 1 1\n\
           1: 0100007F:47A6 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     7        0 2 1\n";
        assert_eq!(listener_uid_in(table, 0x47A5), Some(1001));
        assert_eq!(
            listener_uid_in(table, 0x47A6),
            None,
            "connected, not listening"
        );
        assert_eq!(listener_uid_in(table, 1), None);
        assert_eq!(listener_uid_in("garbage", 1), None);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(listener_uid(port), Some(crate::fdpass::euid()));
        assert_eq!(user_name(0).as_deref(), Some("root"));
    }

    #[test]
    fn a_claimed_port_is_refused_to_another_process_naming_the_holder() {
        let dir = std::env::temp_dir().join(format!("throng-portlock-{}", std::process::id()));
        let mut mine = PortLocks::open_in(&dir).unwrap();
        mine.claim(40_001).unwrap();
        mine.claim(40_001).unwrap();
        assert_eq!(mine.ports(), [40_001, 40_001]);
        // Another process: a child that tries the same byte with flock(1)'s
        // cousin, python's fcntl.lockf, and reports what it got.
        let script = format!(
            "import fcntl,sys\nf=open({:?},'r+')\n\
             try:\n  fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB, 1, 40001)\n  print('got')\n\
             except OSError:\n  print('held')\n\
             fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB, 1, 40002)\nprint('other')",
            mine.path()
        );
        let out = std::process::Command::new("python3")
            .args(["-c", &script])
            .output();
        if let Ok(out) = out {
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(text, "held\nother\n", "{out:?}");
        }
        drop(mine);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
