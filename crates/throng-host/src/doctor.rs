//! What will stop a run of N connections on this machine, and the exact fix.
//!
//! [`HostLimits::read`] takes a snapshot of every limit that matters (open
//! files, `fs.*`, ports, backlogs, `tcp_mem`, conntrack, memory) from a
//! `/proc` root that may be a fake tree; [`check_machine`] is a pure function
//! from a [`Plan`] and that snapshot to [`Finding`]s; [`apply`] writes the
//! sysctl fixes it can; [`examine`] does all of it for `throng doctor` and
//! [`Report::render`] shows it. `bench` checks its plan the same way
//! before it starts, and prints the findings that are not OK, one line each.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;

use crate::limits::{self, DEFAULT_FD_RESERVE, NoFile, Sysctls};

/// Kernel memory of one idle TCP socket (socket, inode, dentry, file,
/// `tcp_sock`, hashes): about 3.5 KiB on x86-64 Linux. A stated default, overridable.
pub const DEFAULT_KERNEL_BYTES_PER_SOCKET: u64 = 3584;
/// User-space memory throng aims to spend per idle connection (each side).
pub const DEFAULT_USER_BYTES_PER_SOCKET: u64 = 1024;
/// Kernel memory of one conntrack entry, bytes (about 320 on x86-64).
pub const CONNTRACK_ENTRY_BYTES: u64 = 320;
/// Share of a (source, target) pair's ephemeral ports a run may use; the
/// rest is left for TIME-WAIT and other programs (the same share `hold` plans with).
pub const PORT_USE: f64 = 0.9;
/// Share of a (source, target) pair's ephemeral ports connects stay cheap
/// in. Linux's `connect()` (`__inet_hash_connect`) looks at ports of one
/// parity first, from a moving offset; once that half is nearly taken,
/// every connect walks all of it before it tries the other half. Measured on
/// kernel 6.18 with 28,232 ports, one attack worker, one pair
/// (`scripts/bench-ports.sh`): 120 µs of CPU per new request up to half the
/// range, 1,527 µs past it. Plans that pick their own source addresses stay
/// under this share; above it (given sources) they warn.
pub const PORT_FAST: f64 = 0.45;
/// Listen backlog below which bursts of connects are dropped and retried
/// after 1 s, 3 s, ...: Linux's own default since 5.4.
pub const MIN_BACKLOG: u64 = 4096;
/// The backlog the fixes suggest.
pub const GOOD_BACKLOG: u64 = 65_535;
/// Worker processes above which a run still works but the per-process
/// limit should be raised instead.
pub const MANY_WORKERS: u64 = 256;

/// Which sides of the connections live on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The load harness (`hold`, `attack`): needs local ports.
    Client,
    /// The server (`serve`): needs a listen backlog.
    Server,
    /// Both on one machine (`bench`): two sockets per connection.
    Both,
}

impl Role {
    /// Sockets this machine holds per connection.
    pub fn sides(self) -> u64 {
        match self {
            Self::Both => 2,
            Self::Client | Self::Server => 1,
        }
    }

    fn has_client(self) -> bool {
        matches!(self, Self::Client | Self::Both)
    }

    fn has_server(self) -> bool {
        matches!(self, Self::Server | Self::Both)
    }
}

/// The run to check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Connections to hold.
    pub connections: u64,
    /// Which sides run here.
    pub role: Role,
    /// Source addresses the client side spreads over.
    pub source_ips: u64,
    /// Target ports the client side spreads over.
    pub target_ports: u64,
    /// Kernel memory per socket, bytes.
    pub kernel_bytes_per_socket: u64,
    /// User-space memory per socket, bytes.
    pub user_bytes_per_socket: u64,
    /// File descriptors each process keeps for other things.
    pub fd_reserve: u64,
    /// The source addresses as given (`127.0.0.2-127.0.0.5`), if they were:
    /// the fixes keep them in the commands they print.
    pub source_list: Option<String>,
    /// The source addresses themselves, when given: each is bound to see
    /// that it is on this host (a plan from addresses elsewhere fails at
    /// every connection).
    #[serde(skip)]
    pub source_addrs: Vec<IpAddr>,
    /// The target ports as given (`10000-10015`), if they were.
    pub port_list: Option<String>,
    /// The plan is `throng bench`'s: both sides here, on the source
    /// addresses and server ports bench picks itself, so a fix names bench.
    pub bench: bool,
}

impl Plan {
    /// A plan for `connections` with the stated defaults: one source address,
    /// one target port, 3.5 KiB kernel + 1 KiB user memory per socket.
    pub fn new(connections: u64, role: Role) -> Self {
        Self {
            connections,
            role,
            source_ips: 1,
            target_ports: 1,
            kernel_bytes_per_socket: DEFAULT_KERNEL_BYTES_PER_SOCKET,
            user_bytes_per_socket: DEFAULT_USER_BYTES_PER_SOCKET,
            fd_reserve: DEFAULT_FD_RESERVE,
            source_list: None,
            source_addrs: Vec::new(),
            port_list: None,
            bench: false,
        }
    }

    /// Sockets on this machine.
    pub fn sockets(&self) -> u64 {
        self.connections.saturating_mul(self.role.sides())
    }
}

/// Every limit that matters, read at one moment. `None`: not available here
/// (a module not loaded, an old kernel).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostLimits {
    /// This process's open-file limit.
    pub nofile: NoFile,
    /// Whether this process may raise its hard open-file limit (root).
    pub may_raise_hard: bool,
    /// `fs.nr_open`: the most a process's open-file limit may be raised to.
    pub nr_open: Option<u64>,
    /// `fs.file-max`: open files on the whole system.
    pub file_max: Option<u64>,
    /// Files open on the system now (`fs.file-nr`, first field).
    pub files_open: Option<u64>,
    /// `net.ipv4.ip_local_port_range`, inclusive.
    pub port_range: Option<(u64, u64)>,
    /// `net.core.somaxconn`.
    pub somaxconn: Option<u64>,
    /// `net.ipv4.tcp_max_syn_backlog`.
    pub syn_backlog: Option<u64>,
    /// `net.ipv4.tcp_syncookies` (0 off, 1 when the SYN queue overflows, 2 always).
    pub syncookies: Option<u64>,
    /// `net.ipv4.tcp_mem` (min, pressure, max), pages.
    pub tcp_mem: Option<(u64, u64, u64)>,
    /// Buckets of this namespace's table of established TCP connections
    /// (`net.ipv4.tcp_ehash_entries`; negative there when the namespace
    /// shares the host's, whose size it then is).
    pub tcp_buckets: Option<u64>,
    /// Whether a namespace made now may get a table of its own size
    /// (`net.ipv4.tcp_child_ehash_entries` exists: Linux 6.1+).
    pub child_tables: bool,
    /// `net.netfilter.nf_conntrack_max`, if conntrack is loaded.
    pub conntrack_max: Option<u64>,
    /// `net.netfilter.nf_conntrack_count`, if conntrack is loaded.
    pub conntrack_count: Option<u64>,
    /// Established TCP connections now (`/proc/net/snmp` `CurrEstab`).
    pub tcp_established: Option<u64>,
    /// Whether conntrack tracks connections now: `Some(false)` when it is
    /// loaded but a loopback connection opened to test it was not tracked.
    pub conntrack_active: Option<bool>,
    /// `MemTotal`, bytes.
    pub mem_total: Option<u64>,
    /// `MemAvailable`, bytes.
    pub mem_available: Option<u64>,
    /// Page size, bytes.
    pub page_size: u64,
}

impl HostLimits {
    /// Reads the machine under `proc_root` (`/proc`, or a fake tree laid out
    /// like it: `sys/...`, `meminfo`, `self/limits`). The open-file limit
    /// comes from `<proc_root>/self/limits` when it exists, else from getrlimit.
    pub fn read(proc_root: &Path) -> Self {
        let sys = Sysctls::at(proc_root.join("sys"));
        let num = |name: &str| sys.read_u64(name).ok().flatten();
        let nums = |name: &str| sys.read_numbers(name).ok().flatten();
        let real_nofile = limits::nofile().unwrap_or(NoFile { soft: 0, hard: 0 });
        let nofile = read_nofile(&proc_root.join("self/limits")).unwrap_or(real_nofile);
        let meminfo = std::fs::read_to_string(proc_root.join("meminfo")).unwrap_or_default();
        let mem = |key: &str| {
            meminfo.lines().find_map(|l| {
                let rest = l.strip_prefix(key)?.strip_prefix(':')?;
                let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
                Some(kib * 1024)
            })
        };
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let conntrack_count = num("net.netfilter.nf_conntrack_count");
        let conntrack_active = match conntrack_count {
            None => None,
            Some(c) if c > 0 => Some(true),
            // Only the real /proc can be probed with a real connection.
            Some(_) if proc_root == Path::new("/proc") => {
                probe_tracking(|| num("net.netfilter.nf_conntrack_count"))
            }
            Some(_) => None,
        };
        Self {
            may_raise_hard: nofile == real_nofile && may_raise_hard(real_nofile),
            nofile,
            nr_open: num("fs.nr_open"),
            file_max: num("fs.file-max"),
            files_open: nums("fs.file-nr").and_then(|v| v.first().copied()),
            port_range: nums("net.ipv4.ip_local_port_range")
                .filter(|v| v.len() == 2 && v[0] <= v[1])
                .map(|v| (v[0], v[1])),
            somaxconn: num("net.core.somaxconn"),
            syn_backlog: num("net.ipv4.tcp_max_syn_backlog"),
            syncookies: num("net.ipv4.tcp_syncookies"),
            tcp_mem: nums("net.ipv4.tcp_mem")
                .filter(|v| v.len() == 3)
                .map(|v| (v[0], v[1], v[2])),
            tcp_buckets: sys
                .read("net.ipv4.tcp_ehash_entries")
                .ok()
                .flatten()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .map(i64::unsigned_abs),
            child_tables: sys.exists("net.ipv4.tcp_child_ehash_entries"),
            conntrack_max: num("net.netfilter.nf_conntrack_max"),
            conntrack_count,
            conntrack_active,
            tcp_established: read_curr_estab(&proc_root.join("net/snmp")),
            mem_total: mem("MemTotal"),
            mem_available: mem("MemAvailable"),
            page_size: u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096),
        }
    }
}

/// `Max open files  <soft>  <hard>  files` from a `/proc/<pid>/limits` file.
fn read_nofile(path: &Path) -> Option<NoFile> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let mut f = line["Max open files".len()..].split_whitespace();
    let parse = |s: &str| {
        if s == "unlimited" {
            Some(u64::MAX)
        } else {
            s.parse().ok()
        }
    };
    Some(NoFile {
        soft: parse(f.next()?)?,
        hard: parse(f.next()?)?,
    })
}

/// Opens one loopback connection and reads the conntrack count while it is
/// open: `Some(false)` if it stayed 0 (nothing is tracked), `None` if the
/// probe could not run.
fn probe_tracking(count: impl Fn() -> Option<u64>) -> Option<bool> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
    let client = std::net::TcpStream::connect(listener.local_addr().ok()?).ok()?;
    let (_server, _) = listener.accept().ok()?;
    let tracked = count()? > 0;
    drop(client);
    Some(tracked)
}

/// `Tcp: CurrEstab` from `/proc/net/snmp`.
fn read_curr_estab(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let i = names.split_whitespace().position(|n| n == "CurrEstab")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// Whether this process may raise its hard open-file limit: tried for real
/// (one above the current hard limit), then put back.
fn may_raise_hard(now: NoFile) -> bool {
    if now.hard == u64::MAX {
        return true;
    }
    if limits::set_nofile(now.soft, now.hard + 1).is_err() {
        return false;
    }
    // Lowering is always allowed; a failure leaves a limit one higher, harmless.
    let _ = limits::set_nofile(now.soft, now.hard);
    true
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Enough.
    Ok,
    /// The run may work but slower, less reliably, or closer to the edge than it should.
    Warn,
    /// What this checks could not be read here (a /proc that does not
    /// answer): nothing is known of the limit, so nothing is promised.
    Unknown,
    /// This will stop the run.
    Stop,
}

/// One way to fix a finding: a command that works as printed (the tests
/// run every form). What cannot be a command is a [`Finding::notes`] line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fix {
    /// Set a kernel setting (`sysctl -w name="value"`); `--apply` can do it as root.
    Sysctl {
        /// Dotted name.
        name: String,
        /// New value.
        value: String,
    },
    /// A `throng` command line that fits the limit (`throng serve
    /// --listen 127.0.0.1:8080-8083`).
    Throng {
        /// Its arguments, after `throng`; none holds a space or a quote.
        args: Vec<String>,
        /// What it changes, for the comment after it.
        why: String,
    },
    /// A shell command, run as root (`ulimit -Hn 100064`).
    Shell {
        /// The command line.
        command: String,
        /// What it changes, for the comment after it.
        why: String,
    },
}

impl Fix {
    fn sysctl(name: &str, value: impl ToString) -> Self {
        Self::Sysctl {
            name: name.to_owned(),
            value: value.to_string(),
        }
    }

    fn throng(args: Vec<String>, why: impl Into<String>) -> Self {
        Self::Throng {
            args,
            why: why.into(),
        }
    }

    fn shell(command: impl Into<String>, why: impl Into<String>) -> Self {
        Self::Shell {
            command: command.into(),
            why: why.into(),
        }
    }

    /// The command, as a person types it.
    pub fn line(&self) -> String {
        match self {
            Self::Sysctl { name, value } if value.contains(' ') => {
                format!("sysctl -w {name}=\"{value}\"")
            }
            Self::Sysctl { name, value } => format!("sysctl -w {name}={value}"),
            Self::Throng { args, .. } => format!("throng {}", args.join(" ")),
            Self::Shell { command, .. } => command.clone(),
        }
    }

    /// The command with what it changes as a shell comment: still pasteable.
    pub fn commented(&self) -> String {
        match self {
            Self::Sysctl { .. } => self.line(),
            Self::Throng { why, .. } | Self::Shell { why, .. } => {
                format!("{}  # {why}", self.line())
            }
        }
    }
}

/// The verdict on one limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What was checked (`open files`, `fs.file-max`, `ports`, ...).
    pub check: String,
    /// How bad.
    pub status: Status,
    /// What the machine has and what the plan needs, in one sentence.
    pub message: String,
    /// Ways to fix it, best first; empty when OK.
    pub fixes: Vec<Fix>,
    /// What a command cannot say: where a fix does not apply, what else
    /// would work. Empty when OK.
    pub notes: Vec<String>,
}

impl Finding {
    /// One line: `STOP ports: ... (fix: ...)`, for a command's start-up warnings.
    pub fn line(&self) -> String {
        let tag = match self.status {
            Status::Ok => "ok",
            Status::Warn => "warning",
            Status::Unknown => "unknown",
            Status::Stop => "will stop the run",
        };
        match self.fixes.first() {
            Some(fix) => format!(
                "{tag}: {}: {} (fix: {}; see 'throng doctor')",
                self.check,
                self.message,
                fix.line()
            ),
            None => format!("{tag}: {}: {}", self.check, self.message),
        }
    }
}

/// Checks `plan` against this machine (`/proc`).
pub fn check(plan: &Plan) -> Vec<Finding> {
    check_machine(plan, &HostLimits::read(Path::new("/proc")))
}

/// The one-line warnings a command prints at start: every finding of
/// [`check`] that is not OK, worst first.
pub fn warnings(plan: &Plan) -> Vec<String> {
    warning_lines(&check(plan))
}

/// [`Finding::line`] of every finding that is not OK, worst first.
pub fn warning_lines(findings: &[Finding]) -> Vec<String> {
    let mut bad: Vec<&Finding> = findings.iter().filter(|f| f.status != Status::Ok).collect();
    bad.sort_by_key(|f| std::cmp::Reverse(f.status));
    bad.into_iter().map(Finding::line).collect()
}

/// Every check, in the order of its findings; each says nothing (`None`)
/// when its limit is not known here or does not apply to the plan's role.
const CHECKS: [fn(&Plan, &HostLimits) -> Option<Finding>; 10] = [
    open_files,
    nr_open,
    file_max,
    local_ports,
    somaxconn,
    syn_backlog,
    tcp_mem,
    tcp_table_of,
    conntrack,
    memory,
];

/// Checks `plan` against `m`: one finding per limit, in a fixed order.
pub fn check_machine(plan: &Plan, m: &HostLimits) -> Vec<Finding> {
    let mut findings: Vec<Finding> = CHECKS.iter().filter_map(|check| check(plan, m)).collect();
    findings.extend(unknowns(plan, m));
    findings
}

/// What could not be read of the limits every run meets: each an
/// `Unknown` finding, so that a machine whose /proc does not answer is not
/// said to have nothing that will stop a run.
fn unknowns(plan: &Plan, m: &HostLimits) -> Vec<Finding> {
    let client = plan.role.has_client();
    let missing = [
        (m.file_max.is_none(), "fs.file-max", "/proc/sys/fs/file-max"),
        (m.nr_open.is_none(), "fs.nr_open", "/proc/sys/fs/nr_open"),
        (
            client && m.port_range.is_none(),
            "ports",
            "/proc/sys/net/ipv4/ip_local_port_range",
        ),
        (
            m.tcp_mem.is_none(),
            "net.ipv4.tcp_mem",
            "/proc/sys/net/ipv4/tcp_mem",
        ),
        (m.mem_available.is_none(), "memory", "/proc/meminfo"),
    ];
    missing
        .into_iter()
        .filter(|(gone, _, _)| *gone)
        .map(|(_, check, path)| Finding {
            check: check.to_owned(),
            status: Status::Unknown,
            message: format!("unknown: {path} could not be read, so this limit was not checked"),
            fixes: Vec::new(),
            notes: Vec::new(),
        })
        .collect()
}

/// Open files per process: throng raises soft to hard itself and spreads
/// connections over processes, so only the hard limit matters.
fn open_files(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    let n = plan.connections;
    let per_process = n.saturating_add(plan.fd_reserve);
    let nf = m.nofile;
    let target = m.nr_open.map_or(per_process, |o| per_process.min(o));
    // Only the hard limit: throng raises its soft limit to it itself.
    let mut raise = vec![Fix::shell(
        format!("echo '* hard nofile {target}' >> /etc/security/limits.conf"),
        "for login sessions, from the next login on",
    )];
    if m.may_raise_hard {
        raise.insert(
            0,
            Fix::shell(
                format!("ulimit -Hn {target}"),
                "in a root shell; start throng from that shell",
            ),
        );
    }
    let mut raise_notes = vec![format!(
        "a systemd service: LimitNOFILE={target} in its [Service] section (docs/deploy.md)"
    )];
    if !m.may_raise_hard {
        raise_notes.push(
            "this process may not raise its hard limit, even as root: in a container the runtime sets it"
                .to_owned(),
        );
    }
    Some(match limits::budget(n, nf.hard, plan.fd_reserve) {
        Err(_) => Finding {
            check: "open files".into(),
            status: Status::Stop,
            message: format!(
                "the hard limit {} leaves no room for connections after {} reserved files",
                nf.hard, plan.fd_reserve
            ),
            fixes: raise.clone(),
            notes: raise_notes.clone(),
        },
        Ok(b) => {
            let sides = if plan.role == Role::Both {
                " per side"
            } else {
                ""
            };
            let soft = if nf.soft < nf.hard {
                format!("; throng raises the soft limit {} to it itself", nf.soft)
            } else {
                String::new()
            };
            let may = if m.may_raise_hard {
                "; this process may raise it (root)"
            } else {
                ""
            };
            let many = b.workers > MANY_WORKERS;
            Finding {
                check: "open files".into(),
                status: if many { Status::Warn } else { Status::Ok },
                message: format!(
                    "hard limit {} per process: {} connections need {} worker process(es){sides} of at most {} each{soft}{may}",
                    nf.hard, n, b.workers, b.per_worker
                ),
                fixes: if many { raise.clone() } else { Vec::new() },
                notes: if many {
                    raise_notes.clone()
                } else {
                    Vec::new()
                },
            }
        }
    })
}

/// `fs.nr_open`: how far a process's open-file limit may be raised.
fn nr_open(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    let n = plan.connections;
    let per_process = n.saturating_add(plan.fd_reserve);
    let nr_open = m.nr_open?;
    let low = nr_open < m.nofile.hard.min(per_process);
    Some(Finding {
        check: "fs.nr_open".into(),
        status: Status::Ok,
        message: if low {
            format!("{nr_open}: no process can have its open-file limit raised above this")
        } else {
            format!("{nr_open}: a process may be allowed up to this many open files")
        },
        fixes: if nr_open < per_process {
            vec![Fix::sysctl("fs.nr_open", round_up(per_process))]
        } else {
            Vec::new()
        },
        notes: Vec::new(),
    })
}

/// `fs.file-max`: open files on the whole system.
fn file_max(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    let sockets = plan.sockets();
    let file_max = m.file_max?;
    let open = m.files_open.unwrap_or(0);
    let need = sockets.saturating_add(open);
    let (status, message) = if file_max < need {
        (
            Status::Stop,
            format!(
                "{file_max} files on the whole system, {open} open already: {sockets} sockets more do not fit"
            ),
        )
    } else {
        (
            Status::Ok,
            format!(
                "{file_max} files on the whole system: room for {sockets} sockets ({open} open already)"
            ),
        )
    };
    Some(Finding {
        check: "fs.file-max".into(),
        status,
        message,
        fixes: if status == Status::Stop {
            vec![Fix::sysctl(
                "fs.file-max",
                round_up(need.saturating_mul(5) / 4),
            )]
        } else {
            Vec::new()
        },
        notes: Vec::new(),
    })
}

/// Local ports for the client side: the (source, target) pairs' ephemeral
/// ports against the connections, and where connects stay cheap.
fn local_ports(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    let n = plan.connections;
    if !plan.role.has_client() {
        return None;
    }
    let (lo, hi) = m.port_range?;
    let range = hi - lo + 1;
    let pairs = plan.source_ips.max(1) * plan.target_ports.max(1);
    let usable = (range as f64 * PORT_USE) as u64;
    let capacity = usable.saturating_mul(pairs);
    let fast = ((range as f64 * PORT_FAST) as u64).saturating_mul(pairs);
    let status = if n > capacity {
        Status::Stop
    } else if n > fast {
        Status::Warn
    } else {
        Status::Ok
    };
    let (mut fixes, mut notes) = (Vec::new(), Vec::new());
    if status == Status::Warn {
        let per_source = ((range as f64 * PORT_FAST) as u64) * plan.target_ports.max(1);
        let sources = n.div_ceil(per_source.max(1));
        if !plan.bench {
            fixes.push(Fix::throng(
                run_command(plan, n, sources, plan.port_list.as_deref()),
                format!("{sources} source addresses keep each pair under half the range"),
            ));
        }
        notes.push(format!(
            "{} connections per (source, target) pair is over {:.0}% of the range: Linux's connect() tries one \
             half of the ports first and, once it is taken, walks all of it on every connect (over 10x the CPU \
             per connect); hold and attack pick loopback sources to stay under it",
            n.div_ceil(pairs.max(1)),
            PORT_FAST * 100.0
        ));
    }
    if status == Status::Stop {
        let wide = ((65_535 - 1_024 + 1) as f64 * PORT_USE) as u64 * pairs;
        let cheap = (range as f64 * PORT_FAST) as u64;
        if !plan.bench {
            // Fixes aim where connects stay cheap, not merely where they fit.
            let per_source = cheap * plan.target_ports.max(1);
            let sources = n.div_ceil(per_source.max(1));
            fixes.push(Fix::throng(
                run_command(plan, n, sources, plan.port_list.as_deref()),
                format!(
                    "{sources} source addresses: on loopback every 127.x address is this machine's (hold picks them itself); \
                     elsewhere give addresses this machine has"
                ),
            ));
        }
        if range < 65_535 - 1_024 + 1 {
            fixes.push(Fix::sysctl("net.ipv4.ip_local_port_range", "1024 65535"));
            if wide < n {
                notes.push(format!(
                    "even 1024-65535 gives only {wide}: more source addresses or target ports as well"
                ));
            }
        }
        let ports = n.div_ceil((cheap * plan.source_ips.max(1)).max(1));
        if !plan.bench && ports <= 65_535 - 8_080 {
            let listen = format!("8080-{}", 8_080 + ports - 1);
            let (on, with) = if plan.role == Role::Both {
                ("here", "and the harness here")
            } else {
                ("on the server", "and the harness")
            };
            fixes.push(Fix::throng(
                vec![
                    "serve".into(),
                    "--listen".into(),
                    format!("127.0.0.1:{listen}"),
                ],
                format!("or {ports} target ports: the server listens on each ({on})"),
            ));
            fixes.push(Fix::throng(
                run_command(plan, n, plan.source_ips, Some(&listen)),
                format!("{with} spreads its connections over them"),
            ));
        }
    }
    Some(Finding {
        check: "local ports".into(),
        status,
        message: format!(
            "{range} ephemeral ports ({lo}-{hi}) × {} source address(es) × {} target port(s), {:.0}% usable = {capacity} ({fast} with cheap connects) for {n} connections",
            plan.source_ips.max(1),
            plan.target_ports.max(1),
            PORT_USE * 100.0
        ),
        fixes,
        notes,
    })
}

/// `net.core.somaxconn`: the server side's accept queue.
fn somaxconn(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    if !plan.role.has_server() {
        return None;
    }
    let v = m.somaxconn?;
    let low = v < MIN_BACKLOG;
    Some(Finding {
        check: "net.core.somaxconn".into(),
        status: if low { Status::Warn } else { Status::Ok },
        message: if low {
            format!(
                "{v}: bursts of new connections overflow the accept queue and retry after 1 s, 3 s, ... (connect latency spikes)"
            )
        } else {
            format!("{v}: accept queue deep enough for bursts of new connections")
        },
        fixes: if low {
            vec![Fix::sysctl("net.core.somaxconn", GOOD_BACKLOG)]
        } else {
            Vec::new()
        },
        notes: Vec::new(),
    })
}

/// `net.ipv4.tcp_max_syn_backlog`: the server side's SYN queue.
fn syn_backlog(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    if !plan.role.has_server() {
        return None;
    }
    let v = m.syn_backlog?;
    // With syncookies (the default) an overflowing SYN queue is
    // answered with a cookie instead of dropped: no retry, no stall.
    let cookies = m.syncookies.is_some_and(|c| c > 0);
    let low = v < MIN_BACKLOG && !cookies;
    Some(Finding {
        check: "net.ipv4.tcp_max_syn_backlog".into(),
        status: if low { Status::Warn } else { Status::Ok },
        message: match (v < MIN_BACKLOG, cookies) {
            (false, _) => format!("{v}: SYN queue deep enough for bursts of new connections"),
            (true, true) => {
                format!("{v}: bursts past it are answered with syncookies (tcp_syncookies is on)")
            }
            (true, false) => format!(
                "{v}, and tcp_syncookies is off: bursts of new connections are dropped and retry after 1 s, 3 s, ..."
            ),
        },
        fixes: if low {
            vec![
                Fix::sysctl("net.ipv4.tcp_max_syn_backlog", GOOD_BACKLOG),
                Fix::sysctl("net.ipv4.tcp_syncookies", 1),
            ]
        } else {
            Vec::new()
        },
        notes: Vec::new(),
    })
}

/// `net.ipv4.tcp_mem`: the kernel's memory for TCP buffers.
fn tcp_mem(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    let sockets = plan.sockets();
    let (min, pressure, max) = m.tcp_mem?;
    // A push to every connection at once queues at least one buffer
    // (about a page) on each socket until it is read.
    let need = sockets;
    let page = m.page_size;
    let (status, message) = if need > max {
        (
            Status::Stop,
            format!(
                "max {max} pages ({}): one push to all {sockets} sockets queues ~{need} pages; past max the kernel refuses it ('TCP: out of memory' in dmesg)",
                human(max * page)
            ),
        )
    } else if need > pressure {
        (
            Status::Warn,
            format!(
                "pressure at {pressure} pages ({}): one push to all {sockets} sockets queues ~{need} pages, so the kernel will shrink buffers",
                human(pressure * page)
            ),
        )
    } else {
        (
            Status::Ok,
            format!(
                "pressure at {pressure} pages, max {max} ({}): room for a push to all {sockets} sockets",
                human(max * page)
            ),
        )
    };
    let fixes = if status == Status::Ok {
        Vec::new()
    } else {
        let new_max = round_up(need.saturating_mul(2)).max(max);
        let new_pressure = round_up(need.saturating_mul(5) / 4).max(pressure);
        vec![Fix::sysctl(
            "net.ipv4.tcp_mem",
            format!("{} {new_pressure} {new_max}", min.max(new_pressure / 2)),
        )]
    };
    Some(Finding {
        check: "net.ipv4.tcp_mem".into(),
        status,
        message,
        fixes,
        notes: Vec::new(),
    })
}

/// The TCP connection table, when its size is known.
fn tcp_table_of(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    let sockets = plan.sockets();
    let buckets = m.tcp_buckets.filter(|b| *b > 0)?;
    Some(tcp_table(sockets, buckets, m.child_tables))
}

/// Conntrack's table, when the module is loaded.
fn conntrack(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    let n = plan.connections;
    let max = m.conntrack_max?;
    // Loopback: both sides of a connection share one entry.
    let count = m.conntrack_count.unwrap_or(0);
    // Loaded but tracking nothing while connections are open: no rule
    // asks for tracking (newer kernels then skip it), so the table is not
    // a limit until a firewall rule that uses it appears.
    let idle = m.conntrack_active == Some(false)
        || (m.conntrack_count == Some(0) && m.tcp_established.is_some_and(|e| e > 0));
    let need = n.saturating_add(count);
    let full = need > max;
    let status = match (full, idle) {
        (false, _) => Status::Ok,
        (true, true) => Status::Warn,
        (true, false) => Status::Stop,
    };
    Some(Finding {
        check: "conntrack".into(),
        status,
        message: match status {
            Status::Ok => {
                format!("nf_conntrack is loaded with room for {max} entries ({count} used): enough")
            }
            Status::Warn => format!(
                "nf_conntrack is loaded with room for {max} entries but tracks nothing now (no firewall rule uses it); \
                 if one appears, connections past {max} are dropped"
            ),
            Status::Stop | Status::Unknown => format!(
                "nf_conntrack is loaded with room for {max} entries ({count} used): past that new connections are dropped \
                 ('nf_conntrack: table full, dropping packet' in dmesg)"
            ),
        },
        fixes: if full {
            let v = round_up(need.saturating_mul(5) / 4);
            vec![
                Fix::sysctl("net.netfilter.nf_conntrack_max", v),
                Fix::shell(
                    format!(
                        "echo {} > /sys/module/nf_conntrack/parameters/hashsize",
                        v / 4
                    ),
                    "and its hash table, a quarter of the entries",
                ),
            ]
        } else {
            Vec::new()
        },
        notes: if full {
            vec![
                "or leave the run's ports untracked: a NOTRACK rule for them in the raw table (iptables or nft)"
                    .to_owned(),
            ]
        } else {
            Vec::new()
        },
    })
}

/// Memory: the sockets' kernel and user-space memory against what is available.
fn memory(plan: &Plan, m: &HostLimits) -> Option<Finding> {
    let n = plan.connections;
    let sockets = plan.sockets();
    let avail = m.mem_available?;
    let per_socket = plan.kernel_bytes_per_socket + plan.user_bytes_per_socket;
    let conntrack = if m.conntrack_max.is_some() {
        n * CONNTRACK_ENTRY_BYTES
    } else {
        0
    };
    let need = sockets.saturating_mul(per_socket).saturating_add(conntrack);
    let fits = (avail as f64 * 0.8 / per_socket as f64 / plan.role.sides() as f64) as u64;
    let (status, message) = if need > avail {
        (
            Status::Stop,
            format!(
                "{} available, {sockets} sockets need ~{}: the OOM killer will end the run (seen only in dmesg)",
                human(avail),
                human(need)
            ),
        )
    } else if need as f64 > avail as f64 * 0.8 {
        (
            Status::Warn,
            format!(
                "{} available, {sockets} sockets need ~{}: close to where the OOM killer acts",
                human(avail),
                human(need)
            ),
        )
    } else {
        (
            Status::Ok,
            format!(
                "{} available, {sockets} sockets need ~{}",
                human(avail),
                human(need)
            ),
        )
    };
    Some(Finding {
        check: "memory".into(),
        status,
        message,
        fixes: if status == Status::Ok || plan.role == Role::Server {
            Vec::new()
        } else {
            // As many source addresses as the smaller run needs too.
            let per_source = m.port_range.map_or(u64::MAX, |(lo, hi)| {
                ((hi - lo + 1) as f64 * PORT_FAST) as u64 * plan.target_ports.max(1)
            });
            vec![Fix::throng(
                run_command(
                    plan,
                    fits,
                    fits.div_ceil(per_source.max(1)),
                    plan.port_list.as_deref(),
                ),
                "the most that fits in 80% of the memory available",
            )]
        },
        notes: match status {
            Status::Ok => Vec::new(),
            _ if plan.role == Role::Server => vec![
                format!("this machine serves ~{fits} connections in 80% of the memory available: spread the rest over more servers (docs/deploy.md)"),
            ],
            _ => vec![
                "or spread the run over more machines and merge their result files with throng report".to_owned(),
            ],
        },
    })
}

/// Chains past this many sockets per bucket of the TCP connection table,
/// on average, make each segment's socket lookup a walk worth warning
/// about (at 7.6 the lookup took 21% of the machine's CPU in a fan-out to a
/// million, against 6.5% at 1: docs/scale.md).
pub const TCP_CHAIN_WARN: u64 = 2;

/// The name of the TCP connection table's finding.
pub const TCP_TABLE: &str = "TCP connection table";

/// The established-connection table against the sockets planned here.
fn tcp_table(sockets: u64, buckets: u64, child_tables: bool) -> Finding {
    let check = TCP_TABLE.to_owned();
    let chain = sockets as f64 / buckets as f64;
    if sockets <= buckets.saturating_mul(TCP_CHAIN_WARN) {
        return Finding {
            check,
            status: Status::Ok,
            message: format!(
                "{buckets} buckets (net.ipv4.tcp_ehash_entries) for {sockets} sockets: chains of {chain:.1} on average"
            ),
            fixes: Vec::new(),
            notes: Vec::new(),
        };
    }
    let want = crate::netns::buckets_for(sockets);
    let mut fixes = Vec::new();
    let mut notes = Vec::new();
    if child_tables {
        fixes.push(Fix::sysctl("net.ipv4.tcp_child_ehash_entries", want));
        fixes.push(Fix::shell(
            "ip netns add throng && ip netns exec throng ip link set lo up",
            "a namespace made after that sysctl has a table of that size; run throng in it: ip netns exec throng throng ...",
        ));
        notes.push(
            "'throng bench' does this itself when run as root (a private namespace for its run; --host-network keeps the host's table)"
                .to_owned(),
        );
    }
    notes.push(format!(
        "the host's own table is sized at boot: the kernel parameter thash_entries={want} sets it"
    ));
    Finding {
        check,
        status: Status::Warn,
        message: format!(
            "{buckets} buckets (net.ipv4.tcp_ehash_entries) for {sockets} sockets: chains of {chain:.1}, \
             which every segment's socket lookup walks (slower fan-outs and connects; {want} buckets make it 1)"
        ),
        fixes,
        notes,
    }
}

/// The `throng` arguments of the run `plan` describes, for `connections`:
/// `bench --connections N` for bench's plan; otherwise `hold` against a
/// loopback target on `ports` (default `throng serve`'s 8080), from the
/// source addresses given, or from enough of 127.0.0.2.. for the local
/// ports (at least `sources`), so the command fits what it fixes.
fn run_command(plan: &Plan, connections: u64, sources: u64, ports: Option<&str>) -> Vec<String> {
    if plan.bench {
        return vec![
            "bench".into(),
            "--connections".into(),
            connections.to_string(),
        ];
    }
    // A comma list is no URL's port part: its first port stands for it.
    let ports = match ports {
        Some(p) if !p.contains(',') => p.to_owned(),
        Some(p) => p.split([',', '-']).next().unwrap_or("8080").to_owned(),
        None => "8080".to_owned(),
    };
    let mut args = vec![
        "hold".into(),
        format!("ws://127.0.0.1:{ports}/news"),
        "--connections".into(),
        connections.to_string(),
    ];
    match &plan.source_list {
        Some(list) if sources <= plan.source_ips => {
            args.extend(["--source-ips".into(), list.clone()]);
        }
        _ if sources > 1 => {
            args.extend([
                "--source-ips".into(),
                format!("127.0.0.2-{}", ipv4_plus([127, 0, 0, 2], sources - 1)),
            ]);
        }
        _ => {}
    }
    args
}

/// What `--apply` did with one sysctl fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Dotted name.
    pub name: String,
    /// Value written.
    pub value: String,
    /// `None` when written; else why not.
    pub error: Option<String>,
}

/// Writes every sysctl fix of the findings that are not OK under
/// `proc_root/sys` (root only on a real `/proc`). Manual fixes are left for
/// the caller to print.
pub fn apply(findings: &[Finding], proc_root: &Path) -> Vec<Applied> {
    let sys = Sysctls::at(proc_root.join("sys"));
    let mut done = Vec::new();
    for f in findings.iter().filter(|f| f.status != Status::Ok) {
        for fix in &f.fixes {
            if let Fix::Sysctl { name, value } = fix {
                let error = sys.write(name, value).err().map(|e| match &e {
                    limits::SysctlError::Io { source, .. }
                        if source.kind() == std::io::ErrorKind::PermissionDenied =>
                    {
                        format!("{e} (needs root: sudo {})", fix.line())
                    }
                    _ => e.to_string(),
                });
                done.push(Applied {
                    name: name.clone(),
                    value: value.clone(),
                    error,
                });
            }
        }
    }
    done
}

/// The lines of a `/etc/sysctl.d/` file that keeps the sysctl fixes of
/// findings that are not OK across reboots (empty if there are none).
pub fn sysctl_d(findings: &[Finding]) -> String {
    let mut s = String::new();
    for f in findings.iter().filter(|f| f.status != Status::Ok) {
        for fix in &f.fixes {
            if let Fix::Sysctl { name, value } = fix {
                s.push_str(&format!("{name} = {value}\n"));
            }
        }
    }
    s
}

/// A whole check, as `throng doctor` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The run checked.
    pub plan: Plan,
    /// The machine, as read last.
    pub machine: HostLimits,
    /// One finding per limit.
    pub findings: Vec<Finding>,
    /// The sysctl fixes written (with `apply`).
    pub applied: Vec<Applied>,
    /// Findings that will stop the run.
    pub stops: usize,
    /// Findings that will slow it or bring it near the edge.
    pub warnings: usize,
    /// The `/etc/sysctl.d/` lines that keep the sysctl fixes.
    pub sysctl_d: String,
    /// The fixes were to be applied.
    #[serde(skip)]
    pub apply: bool,
}

/// The plan's source addresses that do not bind on this host, as one STOP
/// finding (`None` when every one binds, or none was given). Bound for
/// real, not read from /proc: only the kernel knows which address it takes.
fn sources_here(plan: &Plan) -> Option<Finding> {
    let bad: Vec<String> = plan
        .source_addrs
        .iter()
        .filter_map(|ip| {
            std::net::TcpListener::bind((*ip, 0))
                .err()
                .map(|e| format!("{ip} ({e})"))
        })
        .collect();
    if bad.is_empty() {
        return None;
    }
    Some(Finding {
        check: "source addresses".into(),
        status: Status::Stop,
        message: format!(
            "{} cannot be bound on this host: every connection from them would fail",
            bad.join(", ")
        ),
        fixes: Vec::new(),
        notes: vec![
            "give --source-ips of this host (ip -brief address), or add each address to an interface first (ip address add ADDR/32 dev lo)".into(),
        ],
    })
}

/// Checks `plan` against the machine under `proc_root`; with `apply`,
/// writes the sysctl fixes first and checks again.
pub fn examine(plan: Plan, proc_root: &Path, apply: bool) -> Report {
    let mut findings = check_machine(&plan, &HostLimits::read(proc_root));
    let mut applied = Vec::new();
    if apply {
        applied = self::apply(&findings, proc_root);
        findings = check_machine(&plan, &HostLimits::read(proc_root));
    }
    findings.extend(sources_here(&plan));
    Report {
        stops: findings.iter().filter(|f| f.status == Status::Stop).count(),
        warnings: findings.iter().filter(|f| f.status == Status::Warn).count(),
        sysctl_d: sysctl_d(&findings),
        machine: HostLimits::read(proc_root),
        plan,
        findings,
        applied,
        apply,
    }
}

impl Report {
    /// The report as text: the plan, each finding with its fixes, and what to do next.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let Self {
            plan,
            findings,
            applied,
            stops,
            warnings,
            sysctl_d: persist,
            apply,
            ..
        } = self;
        let (stops, warnings, apply) = (*stops, *warnings, *apply);
        let mut o = String::new();
        let role = match plan.role {
            Role::Both if plan.bench => {
                "throng bench: client and server on this machine, 2 sockets each"
            }
            Role::Both => "client and server on this machine, 2 sockets each",
            Role::Client => "the client side on this machine",
            Role::Server => "the server side on this machine",
        };
        let _ = writeln!(
            o,
            "throng doctor: can this machine hold {} connections ({role})?",
            plan.connections
        );
        let _ = writeln!(
            o,
            "  assuming {:.1} KiB kernel + {:.1} KiB user memory per socket (--kernel-per-socket, --user-per-socket),",
            plan.kernel_bytes_per_socket as f64 / 1024.0,
            plan.user_bytes_per_socket as f64 / 1024.0
        );
        let given = |list: &Option<String>| match list {
            Some(l) => format!(" ({l})"),
            None => String::new(),
        };
        let _ = writeln!(
            o,
            "  {} source address(es){}, {} target port(s){}{}, {} files per process kept for other uses\n",
            plan.source_ips,
            given(&plan.source_list),
            plan.target_ports,
            given(&plan.port_list),
            if plan.bench {
                ", as bench picks them"
            } else {
                ""
            },
            plan.fd_reserve
        );
        for a in applied {
            match &a.error {
                None => {
                    let _ = writeln!(o, "  applied  {} = {}", a.name, a.value);
                }
                Some(e) => {
                    let _ = writeln!(o, "  could not apply {} = {}: {e}", a.name, a.value);
                }
            }
        }
        if !applied.is_empty() {
            let _ = writeln!(o, "  (checked again after applying)\n");
        }
        for f in findings {
            let tag = match f.status {
                Status::Ok => "ok",
                Status::Warn => "WARN",
                Status::Unknown => "??",
                Status::Stop => "STOP",
            };
            let _ = writeln!(o, "  {tag:<5} {:<29} {}", f.check, f.message);
            if f.status != Status::Ok {
                for fix in &f.fixes {
                    let _ = writeln!(o, "        fix: {}", fix.commented());
                }
                for note in &f.notes {
                    let _ = writeln!(o, "        note: {note}");
                }
            }
        }
        let _ = writeln!(o);
        let unknown = findings
            .iter()
            .filter(|f| f.status == Status::Unknown)
            .count();
        if stops == 0 && warnings == 0 && unknown > 0 {
            let _ = writeln!(
                o,
                "{unknown} limit(s) unknown: what they check could not be read here, so nothing is promised for a run of {} connections.",
                plan.connections
            );
        } else if stops == 0 && warnings == 0 {
            let _ = writeln!(
                o,
                "Nothing here will stop a run of {} connections.",
                plan.connections
            );
        } else {
            let _ = writeln!(
                o,
                "{stops} limit(s) will stop this run, {warnings} warning(s). Apply the fixes{}, then run throng doctor again.",
                if apply || persist.is_empty() {
                    ""
                } else {
                    " (the sysctls: throng doctor --apply, as root)"
                }
            );
        }
        if !persist.is_empty() {
            let _ = writeln!(
                o,
                "To keep the sysctl fixes after a reboot, put these lines in /etc/sysctl.d/60-throng.conf:"
            );
            for line in persist.lines() {
                let _ = writeln!(o, "  {line}");
            }
        }
        o
    }
}

/// Why a list of ports (`--ports`) does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PortsError {
    /// An item that is not a port number 1-65535.
    #[error("'{0}' is not a port (1-65535)")]
    NotAPort(String),
    /// A range whose first port is above its last.
    #[error("range '{0}' runs backwards")]
    Backwards(String),
    /// The list names no port at all.
    #[error("no ports")]
    Empty,
}

/// How many ports `10000-10015` or `9000,9001,9005-9006` names.
pub fn count_ports(list: &str) -> Result<u64, PortsError> {
    let mut n = 0u64;
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let port = |s: &str| {
            s.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| PortsError::NotAPort(s.to_owned()))
        };
        n += match item.split_once('-') {
            None => port(item).map(|_| 1)?,
            Some((a, b)) => {
                let (a, b) = (port(a)?, port(b)?);
                if a > b {
                    return Err(PortsError::Backwards(item.to_owned()));
                }
                u64::from(b - a) + 1
            }
        };
    }
    if n == 0 {
        return Err(PortsError::Empty);
    }
    Ok(n)
}

/// The default `/proc` root.
pub fn proc_root() -> PathBuf {
    PathBuf::from("/proc")
}

/// A round figure at or above `n`: two significant digits.
fn round_up(n: u64) -> u64 {
    let mut scale = 1u64;
    while n / scale >= 100 {
        scale *= 10;
    }
    n.div_ceil(scale) * scale
}

fn ipv4_plus(base: [u8; 4], k: u64) -> String {
    let v = u32::from_be_bytes(base).saturating_add(u32::try_from(k).unwrap_or(u32::MAX));
    std::net::Ipv4Addr::from(v).to_string()
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_proc_that_cannot_be_read_is_unknown_not_fine() {
        let empty =
            std::env::temp_dir().join(format!("throng-doctor-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let report = examine(Plan::new(1000, Role::Both), &empty, false);
        let _ = std::fs::remove_dir_all(&empty);
        assert!(report.findings.iter().any(|f| f.status == Status::Unknown));
        let text = report.render();
        assert!(!text.contains("Nothing here will stop"), "{text}");
        assert!(text.contains("unknown"), "{text}");
        assert!(text.contains("/proc/meminfo could not be read"), "{text}");
    }

    use super::*;

    #[test]
    fn ports_count() {
        assert_eq!(count_ports("10000-10015"), Ok(16));
        assert_eq!(count_ports("9000,9001,9005-9006"), Ok(4));
        assert!(count_ports("").is_err());
        assert!(count_ports("70000").is_err());
        assert!(count_ports("9-1").is_err());
    }

    #[test]
    fn round_figures() {
        assert_eq!(round_up(0), 0);
        assert_eq!(round_up(99), 99);
        assert_eq!(round_up(100_064), 110_000);
        assert_eq!(round_up(1_250_000), 1_300_000);
        assert_eq!(ipv4_plus([127, 0, 0, 2], 300), "127.0.1.46");
    }

    #[test]
    fn nofile_reads_from_a_limits_file() {
        let dir = std::env::temp_dir().join(format!("throng-doctor-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("limits");
        std::fs::write(
            &p,
            "Limit                     Soft Limit           Hard Limit           Units\n\
             Max open files            1024                 unlimited            files\n",
        )
        .unwrap();
        assert_eq!(
            read_nofile(&p),
            Some(NoFile {
                soft: 1024,
                hard: u64::MAX
            })
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
