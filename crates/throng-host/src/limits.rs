//! The limits that decide how many connections a run can hold: this
//! process's open-file limit, kernel settings under `/proc/sys`, and the file
//! budget that says how many worker processes a connection target needs.

use std::io;
use std::path::{Path, PathBuf};

/// File descriptors a worker keeps for things other than connections:
/// stdio, the epoll and event fds, listeners, the pipe to its supervisor,
/// `/proc` reads, a result file.
pub const DEFAULT_FD_RESERVE: u64 = 64;

/// The open-file limit (`RLIMIT_NOFILE`) of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NoFile {
    /// What applies now.
    pub soft: u64,
    /// How far this process may raise `soft` without privilege.
    pub hard: u64,
}

/// `RLIM_INFINITY` reads as `u64::MAX`.
pub fn nofile() -> io::Result<NoFile> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(NoFile {
        soft: lim.rlim_cur,
        hard: lim.rlim_max,
    })
}

/// Raises this process's soft open-file limit to its hard limit and returns
/// the new soft limit. Every process that holds connections should call it
/// first: shells start with a soft limit of 1024.
pub fn raise_nofile() -> io::Result<u64> {
    let now = nofile()?;
    if now.soft >= now.hard {
        return Ok(now.soft);
    }
    set_nofile(now.hard, now.hard)?;
    Ok(nofile()?.soft)
}

/// Sets soft and hard open-file limits. Raising `hard` needs `CAP_SYS_RESOURCE`
/// and may not exceed `fs.nr_open`.
pub fn set_nofile(soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid rlimit; setrlimit only reads it.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel's default `net.ipv4.ip_local_port_range`, taken when the
/// setting cannot be read.
pub const DEFAULT_LOCAL_PORTS: (u16, u16) = (32768, 60999);

/// CPU cores this process may run on (at least 1).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Why a kernel setting could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SysctlError {
    /// The file under `/proc/sys` could not be read or written.
    #[error("{name} ({path}): {source}")]
    Io {
        /// The dotted name, `net.core.somaxconn`.
        name: String,
        /// The file it lives in.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The value is not the numbers the kernel writes there.
    #[error("{name}: cannot read {value:?} as numbers")]
    Parse {
        /// The dotted name.
        name: String,
        /// What the file held.
        value: String,
    },
}

/// Reads and writes kernel settings by their dotted `sysctl` name under a
/// `/proc/sys` root (a path, so tests and `doctor` can use a fake tree).
#[derive(Debug, Clone)]
pub struct Sysctls {
    root: PathBuf,
}

impl Default for Sysctls {
    fn default() -> Self {
        Self::system()
    }
}

impl Sysctls {
    /// This machine's `/proc/sys`.
    pub fn system() -> Self {
        Self::at("/proc/sys")
    }

    /// The tree at `root` (a directory laid out like `/proc/sys`).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root this reads.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file holding `name` (`net.core.somaxconn` → `<root>/net/core/somaxconn`).
    pub fn path(&self, name: &str) -> PathBuf {
        let mut p = self.root.clone();
        p.extend(name.split('.'));
        p
    }

    /// Whether the setting exists (a module such as `nf_conntrack` may not be loaded).
    pub fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    /// The setting's text, trimmed; `Ok(None)` if it does not exist.
    pub fn read(&self, name: &str) -> Result<Option<String>, SysctlError> {
        let path = self.path(name);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s.trim().to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SysctlError::Io {
                name: name.to_owned(),
                path,
                source,
            }),
        }
    }

    /// The setting as whitespace-separated numbers (`tcp_mem`, `ip_local_port_range`).
    pub fn read_numbers(&self, name: &str) -> Result<Option<Vec<u64>>, SysctlError> {
        let Some(text) = self.read(name)? else {
            return Ok(None);
        };
        text.split_ascii_whitespace()
            .map(str::parse)
            .collect::<Result<Vec<u64>, _>>()
            .map(Some)
            .map_err(|_| SysctlError::Parse {
                name: name.to_owned(),
                value: text,
            })
    }

    /// The setting as one number.
    pub fn read_u64(&self, name: &str) -> Result<Option<u64>, SysctlError> {
        match self.read_numbers(name)? {
            None => Ok(None),
            Some(v) if v.len() == 1 => Ok(Some(v[0])),
            Some(v) => Err(SysctlError::Parse {
                name: name.to_owned(),
                value: format!("{v:?}"),
            }),
        }
    }

    /// `net.ipv4.ip_local_port_range`, inclusive: the ports a client socket
    /// gets per (source, destination) pair; [`DEFAULT_LOCAL_PORTS`] when
    /// unreadable.
    pub fn local_port_range(&self) -> (u16, u16) {
        match self.read_numbers("net.ipv4.ip_local_port_range") {
            Ok(Some(v)) if v.len() == 2 => (
                u16::try_from(v[0]).unwrap_or(DEFAULT_LOCAL_PORTS.0),
                u16::try_from(v[1]).unwrap_or(DEFAULT_LOCAL_PORTS.1),
            ),
            _ => DEFAULT_LOCAL_PORTS,
        }
    }

    /// Writes `value` to the setting (needs root on a real `/proc/sys`).
    pub fn write(&self, name: &str, value: &str) -> Result<(), SysctlError> {
        let path = self.path(name);
        std::fs::write(&path, format!("{value}\n")).map_err(|source| SysctlError::Io {
            name: name.to_owned(),
            path,
            source,
        })
    }
}

/// How a connection target splits over worker processes under a per-process
/// open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    /// Worker processes needed (at least 1).
    pub workers: u64,
    /// Connections each worker may hold at most: its file limit less the reserve.
    pub per_worker: u64,
}

/// Why no number of workers can hold the target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetError {
    /// The per-process limit leaves no room for connections after the reserve.
    #[error(
        "an open-file limit of {nofile} leaves no room for connections after {reserve} reserved fds; \
         raise it (ulimit -n, LimitNOFILE=) — see 'throng doctor'"
    )]
    NoRoom {
        /// The per-process limit.
        nofile: u64,
        /// Fds kept for other things.
        reserve: u64,
    },
}

/// How many worker processes `connections` need when each may open `nofile`
/// files and keeps `reserve` of them for other things (one fd per connection).
pub fn budget(connections: u64, nofile: u64, reserve: u64) -> Result<Budget, BudgetError> {
    let per_worker = nofile.saturating_sub(reserve);
    if per_worker == 0 {
        return Err(BudgetError::NoRoom { nofile, reserve });
    }
    Ok(Budget {
        workers: connections.div_ceil(per_worker).max(1),
        per_worker,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_splits_under_the_limit() {
        assert_eq!(
            budget(100_000, 20_000, 64).unwrap(),
            Budget {
                workers: 6,
                per_worker: 19_936
            }
        );
        assert_eq!(budget(19_936, 20_000, 64).unwrap().workers, 1);
        assert_eq!(budget(19_937, 20_000, 64).unwrap().workers, 2);
        assert_eq!(budget(0, 20_000, 64).unwrap().workers, 1);
        assert_eq!(
            budget(10, 64, 64),
            Err(BudgetError::NoRoom {
                nofile: 64,
                reserve: 64
            })
        );
    }

    #[test]
    fn raise_nofile_reaches_the_hard_limit() {
        let before = nofile().unwrap();
        assert!(before.soft <= before.hard);
        let raised = raise_nofile().unwrap();
        assert_eq!(raised, before.hard);
        assert_eq!(nofile().unwrap().soft, before.hard);
    }

    #[test]
    fn sysctls_read_a_fake_tree_and_the_real_one() {
        let root = std::env::temp_dir().join(format!("throng-host-sysctl-{}", std::process::id()));
        std::fs::create_dir_all(root.join("net/ipv4")).unwrap();
        std::fs::write(root.join("net/ipv4/ip_local_port_range"), "32768\t60999\n").unwrap();
        std::fs::write(root.join("net/ipv4/tcp_mem"), "not numbers\n").unwrap();
        let fake = Sysctls::at(&root);
        assert_eq!(
            fake.read_numbers("net.ipv4.ip_local_port_range").unwrap(),
            Some(vec![32768, 60999])
        );
        assert!(fake.read_u64("net.ipv4.ip_local_port_range").is_err());
        assert_eq!(fake.local_port_range(), (32768, 60999));
        assert!(matches!(
            fake.read_numbers("net.ipv4.tcp_mem"),
            Err(SysctlError::Parse { .. })
        ));
        assert_eq!(fake.read("net.core.somaxconn").unwrap(), None);
        fake.write("net.ipv4.tcp_mem", "1 2 3").unwrap();
        fake.write("net.ipv4.ip_local_port_range", "1024 99999")
            .unwrap();
        assert_eq!(fake.local_port_range(), (1024, DEFAULT_LOCAL_PORTS.1));
        fake.write("net.ipv4.ip_local_port_range", "junk").unwrap();
        assert_eq!(fake.local_port_range(), DEFAULT_LOCAL_PORTS);
        assert_eq!(
            fake.read_numbers("net.ipv4.tcp_mem").unwrap(),
            Some(vec![1, 2, 3])
        );
        std::fs::remove_dir_all(root).unwrap();

        let real = Sysctls::system();
        assert!(real.read_u64("fs.nr_open").unwrap().unwrap() > 0);
    }
}
