//! A private network namespace for a run that keeps both ends on one
//! machine, made so that its TCP connection table fits the run.
//!
//! Every TCP segment the kernel receives is matched to its socket through
//! one hash table of established connections (`net.ipv4.tcp_ehash_entries`
//! buckets, sized at boot from memory: 262,144 on a 24 GiB machine). A
//! million loopback connections are two million sockets in it, chains of
//! 7.6 on average, and each segment's lookup walks its chain one cache miss
//! per socket: at that size the lookup was 21% of the machine's CPU during
//! a fan-out, and the fan-out took 11.6 s against 8.4 s with a table of two
//! million buckets (docs/scale.md). The host's table cannot be resized
//! without a reboot (`thash_entries=`), but since Linux 6.1 a namespace made
//! after `net.ipv4.tcp_child_ehash_entries` is set gets a table of its own
//! of that size. [`enter_private`] makes one for the calling process and
//! what it starts afterwards, with loopback up and the host's per-namespace
//! limits carried over, and leaves the host's setting as it found it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The largest table the kernel makes (`tcp_child_ehash_entries`' maximum).
pub const MAX_BUCKETS: u64 = 1 << 24;

const CHILD_BUCKETS: &str = "/proc/sys/net/ipv4/tcp_child_ehash_entries";
const BUCKETS: &str = "/proc/sys/net/ipv4/tcp_ehash_entries";

/// Per-namespace limits a run depends on, carried from the host into the
/// new namespace when the host's are larger (a namespace starts from the
/// kernel's defaults, not from what `throng doctor` had the host set).
const CARRIED: [&str; 3] = [
    "net.core.somaxconn",
    "net.ipv4.tcp_max_syn_backlog",
    "net.ipv4.ip_local_port_range",
];

/// Why a private namespace could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(
        "this kernel cannot size a namespace's TCP table (no {CHILD_BUCKETS}: Linux 6.1 or later)"
    )]
    Unsupported,
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        source: std::io::Error,
    },
}

fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> NetnsError {
    move |source| NetnsError::Os { what, source }
}

/// The buckets of this namespace's TCP connection table; a namespace that
/// shares the host's says so with a negative figure, so this is its size
/// either way. `None`: the kernel does not say (before Linux 6.1).
pub fn buckets() -> Option<u64> {
    let text = std::fs::read_to_string(BUCKETS).ok()?;
    text.trim().parse::<i64>().ok().map(i64::unsigned_abs)
}

/// Whether this process runs as root, as [`enter_private`] needs.
pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this kernel can size a new namespace's table.
pub fn supported() -> bool {
    Path::new(CHILD_BUCKETS).exists()
}

/// The table for `sockets`: a power of two at least as large (one socket
/// per chain on average), at most [`MAX_BUCKETS`].
pub fn buckets_for(sockets: u64) -> u64 {
    sockets.max(1).next_power_of_two().min(MAX_BUCKETS)
}

/// Moves this process (and every process and thread it starts afterwards)
/// into a new network namespace whose TCP table has `buckets` buckets, with
/// loopback up. Call it before starting any thread that opens sockets:
/// threads that already exist stay in the host's namespace. Needs root
/// (`CAP_SYS_ADMIN`). The host's `tcp_child_ehash_entries` is put back as
/// it was, whatever happens.
pub fn enter_private(buckets: u64) -> Result<(), NetnsError> {
    if !supported() {
        return Err(NetnsError::Unsupported);
    }
    let carried: Vec<(&str, Option<String>)> = CARRIED
        .iter()
        .map(|name| (*name, read_sysctl(name)))
        .collect();
    // Opened before the move: a /proc/sys/net file is bound to the
    // namespace of the process that opened it, so this handle still writes
    // the host's setting afterwards.
    let mut child = OpenOptions::new()
        .read(true)
        .write(true)
        .open(CHILD_BUCKETS)
        .map_err(os("open tcp_child_ehash_entries (root is needed)"))?;
    let mut before = String::new();
    child
        .read_to_string(&mut before)
        .map_err(os("read tcp_child_ehash_entries"))?;
    write_at_start(&mut child, &buckets.min(MAX_BUCKETS).to_string())
        .map_err(os("set tcp_child_ehash_entries"))?;
    // SAFETY: unshare takes flags only; CLONE_NEWNET moves the calling
    // thread into a new network namespace and touches no memory of ours.
    let moved = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    let moved = if moved == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    };
    let restored = write_at_start(&mut child, before.trim());
    moved.map_err(os("unshare the network namespace"))?;
    restored.map_err(os("put back the host's tcp_child_ehash_entries"))?;
    loopback_up().map_err(os("bring up loopback in the new namespace"))?;
    for (name, host) in carried {
        if let Some(host) = host {
            carry(name, &host);
        }
    }
    Ok(())
}

fn write_at_start(f: &mut File, value: &str) -> std::io::Result<()> {
    f.seek(SeekFrom::Start(0))?;
    f.write_all(value.as_bytes())
}

fn sysctl_path(name: &str) -> String {
    format!("/proc/sys/{}", name.replace('.', "/"))
}

fn read_sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(sysctl_path(name))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Sets `name` in this namespace to the host's value where that allows
/// more: a larger figure, or a wider port range. Best effort: a setting
/// that cannot be written leaves the kernel's default, which the run's
/// own checks then report.
fn carry(name: &str, host: &str) {
    let Some(here) = read_sysctl(name) else {
        return;
    };
    let nums = |s: &str| -> Vec<u64> {
        s.split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    let (h, n) = (nums(host), nums(&here));
    let wider = match (h.as_slice(), n.as_slice()) {
        ([hlo, hhi], [lo, hi]) => hhi.saturating_sub(*hlo) > hi.saturating_sub(*lo),
        ([h], [n]) => h > n,
        _ => false,
    };
    if wider {
        let _ = std::fs::write(sysctl_path(name), host.replace('\t', " "));
    }
}

/// `ip link set lo up`, with the ioctl it makes.
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: a plain socket call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data; all zeros is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: fd is an open socket and req a valid ifreq naming "lo"; the
    // kernel fills and reads its flags field only.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
    };
    // SAFETY: fd is ours and open.
    unsafe { libc::close(fd) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_powers_of_two_within_the_kernels_bounds() {
        assert_eq!(buckets_for(2_000_000), 2_097_152);
        assert_eq!(buckets_for(2_097_152), 2_097_152);
        assert_eq!(buckets_for(0), 1);
        assert_eq!(buckets_for(u64::MAX / 4), MAX_BUCKETS);
    }

    /// A real namespace, as root on Linux 6.1+: the calling thread moves,
    /// the table has the asked size, loopback carries a connection, and the
    /// host's setting is as it was. A thread of its own, so the test
    /// binary's other threads stay where they are.
    #[test]
    fn a_private_namespace_gets_its_table_and_loopback() {
        if !root() || !supported() {
            eprintln!("skipped: needs root and Linux 6.1+");
            return;
        }
        let host_child = std::fs::read_to_string(CHILD_BUCKETS).expect("readable");
        let host_buckets = buckets();
        std::thread::spawn(|| {
            // Not the host's size (262,144 here), so the check can fail.
            match enter_private(1 << 17) {
                Ok(()) => {}
                // Root without CAP_SYS_ADMIN (a container): not this test's case.
                Err(NetnsError::Os { source, .. })
                    if source.kind() == std::io::ErrorKind::PermissionDenied =>
                {
                    eprintln!("skipped: {source}");
                    return;
                }
                Err(e) => panic!("a private namespace: {e}"),
            }
            assert_eq!(buckets(), Some(1 << 17));
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("loopback is up");
            std::net::TcpStream::connect(l.local_addr().expect("an address")).expect("connect");
        })
        .join()
        .expect("the thread in the namespace");
        assert_eq!(
            std::fs::read_to_string(CHILD_BUCKETS).expect("readable"),
            host_child
        );
        assert_eq!(buckets(), host_buckets);
    }
}
