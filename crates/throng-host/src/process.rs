//! This process and the processes it starts: its resident memory, the CPU
//! clocks of its threads, signals to a process or a process group, and a
//! child that dies with its parent.
//!
//! The server's workers read their RSS into every counter snapshot and time
//! each fan-out on the thread's CPU clock; supervisors signal their workers.

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::Command;
use std::time::Duration;

/// Bytes per memory page (`_SC_PAGESIZE`; 4096 if the system will not say).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096)
}

/// Kernel clock ticks per second (`_SC_CLK_TCK`), the unit of the CPU times
/// in `/proc/<pid>/stat`; 100 if the system will not say.
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: as for `page_size`.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|t| *t > 0).unwrap_or(100)
}

/// Resident set size of this process in bytes (0 when `/proc` is unreadable).
pub fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * page_size()
}

fn read_clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for clock_gettime to fill. These
    // clocks always exist on Linux; on failure `ts` stays zero.
    unsafe { libc::clock_gettime(id, &mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// The host's monotonic clock (CLOCK_MONOTONIC): one time line for every
/// process on the machine, unlike [`std::time::Instant`], whose values
/// cannot leave their process.
pub fn monotonic() -> Duration {
    read_clock(libc::CLOCK_MONOTONIC)
}

/// Gives the allocator's free memory back to the kernel, so RSS shows what
/// is in use (after a burst of short-lived allocations, such as connecting).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// CPU time (user + system) the calling thread has used, to the nanosecond.
pub fn thread_cpu() -> Duration {
    read_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time (user + system) all threads of this process have used.
pub fn process_cpu() -> Duration {
    read_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// A signal throng sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `SIGTERM`: drain and exit.
    Term,
    /// `SIGINT`: as Ctrl-C.
    Int,
    /// `SIGKILL`: now.
    Kill,
    /// `SIGUSR2`: a serve worker's "taken over" (close spread out, exit).
    Usr2,
}

impl Signal {
    fn number(self) -> libc::c_int {
        match self {
            Self::Term => libc::SIGTERM,
            Self::Int => libc::SIGINT,
            Self::Kill => libc::SIGKILL,
            Self::Usr2 => libc::SIGUSR2,
        }
    }
}

fn kill(pid: libc::pid_t, signal: Signal) -> io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal.number()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn pid_t(pid: u32) -> io::Result<libc::pid_t> {
    // 0 would mean "my process group": never what a caller holding a pid means.
    match libc::pid_t::try_from(pid) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no process {pid}"),
        )),
    }
}

/// Sends `signal` to process `pid`.
pub fn signal(pid: u32, signal: Signal) -> io::Result<()> {
    kill(pid_t(pid)?, signal)
}

/// Sends `signal` to every process in the group led by `pgid` (a child
/// started with `process_group(0)` leads its own).
pub fn signal_group(pgid: u32, signal: Signal) -> io::Result<()> {
    kill(-pid_t(pgid)?, signal)
}

/// Makes the child `cmd` starts receive `signal` when this process (the
/// thread that started it) dies, so a killed harness leaves no server behind.
pub fn exit_with_parent(cmd: &mut Command, signal: Signal) {
    let number = libc::c_ulong::try_from(signal.number()).unwrap_or(0);
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: prctl is one, and it touches only
    // the child; nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, number) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// What `/metrics` shows of one process, in Prometheus's standard
/// `process_*` terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// User and system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// Its soft open-file limit.
    pub max_fds: u64,
    /// When it started, Unix seconds.
    pub start_time_seconds: f64,
}

/// [`Stats`] of process `pid` from `/proc`, or `None` when it is gone or
/// `/proc` is unreadable.
pub fn stats(pid: u32) -> Option<Stats> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) is in parentheses and may hold spaces or ')'.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..]
        .split_ascii_whitespace()
        .collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let ticks = clock_ticks_per_sec() as f64;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<u64>().ok())?;
    let open_fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let max_fds = std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_ascii_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some(Stats {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        rss_bytes: field(24)? * page_size(),
        open_fds,
        max_fds,
        start_time_seconds: boot as f64 + field(22)? as f64 / ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_this_process_are_plausible() {
        let s = stats(std::process::id()).unwrap();
        assert!(
            s.rss_bytes > 0 && s.open_fds >= 3 && s.max_fds >= s.open_fds,
            "{s:?}"
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 3600.0,
            "{s:?}"
        );
        assert_eq!(stats(u32::MAX), None);
    }

    #[test]
    fn memory_and_clocks_of_this_process() {
        assert!(page_size() >= 4096);
        assert!(clock_ticks_per_sec() > 0);
        let rss = rss_bytes();
        assert!(rss > 0 && rss % page_size() == 0, "{rss}");
        let (t0, p0) = (thread_cpu(), process_cpu());
        let mut x = 0u64;
        for i in 0..3_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu() > t0, "the thread's clock moves with its work");
        assert!(process_cpu() > p0);
    }

    #[test]
    fn signals_reach_a_child_and_its_group() {
        use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        signal(child.id(), Signal::Term).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));

        let mut leader = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        signal_group(leader.id(), Signal::Kill).unwrap();
        assert_eq!(leader.wait().unwrap().signal(), Some(libc::SIGKILL));

        assert!(signal(0, Signal::Term).is_err(), "pid 0 is refused");
        assert!(signal(u32::MAX, Signal::Term).is_err());
    }

    #[test]
    fn a_child_told_to_exit_with_its_parent_does() {
        // A parent shell starts the child, says its pid, and exits; the
        // child (a long sleep) gets SIGTERM at once instead of running on.
        let mut parent = Command::new("sh");
        parent.args(["-c", "sleep 30 >/dev/null 2>&1 & echo $!"]);
        let out = parent.output().unwrap();
        let orphan: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let orphan_alive = std::path::Path::new(&format!("/proc/{orphan}")).exists();
        let _ = signal(orphan, Signal::Kill);
        assert!(orphan_alive, "without it, the child outlives its parent");

        let mut child = Command::new("sleep");
        child.arg("30");
        exit_with_parent(&mut child, Signal::Term);
        // The parent is a thread of this test that ends right after the spawn.
        let mut child = std::thread::spawn(move || child.spawn().unwrap())
            .join()
            .unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
    }
}
