//! The few operating-system calls the server makes outside tokio: the
//! open-file limit, this process's resident memory, the thread's CPU clock,
//! and shutting a socket down from outside its task.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// The open-file limit after raising the soft limit to the hard one:
/// `(soft, hard)`. Children inherit it.
pub fn raise_nofile() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; failure leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Resident set size of this process in bytes (0 when `/proc` is unreadable).
pub fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// CPU time consumed by the calling thread.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Shuts a socket down in both directions. Its task then sees end of stream
/// and drops it: this is how a worker ends a connection it does not own.
pub fn shutdown(fd: RawFd, write_only: bool) {
    let how = if write_only {
        libc::SHUT_WR
    } else {
        libc::SHUT_RDWR
    };
    // SAFETY: `fd` is an open socket owned by a live TcpStream; shutdown does not close it.
    unsafe { libc::shutdown(fd, how) };
}

/// One `write(2)` of `buf` to `fd`, for the benchmark floor. Returns bytes written or -1.
pub fn raw_write(fd: RawFd, buf: &[u8]) -> isize {
    // SAFETY: `buf` is valid for `buf.len()` bytes; `fd` is an open socket owned by a live TcpStream.
    unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) }
}

/// Sends `sig` to process `pid`.
pub fn kill(pid: u32, sig: i32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) };
}
