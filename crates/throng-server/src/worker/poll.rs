//! The worker's own readiness set for subscribers: one epoll instance, itself
//! registered with tokio, holding every subscriber socket with its slot
//! number as the event data.
//!
//! Why not a tokio task and `TcpStream` per subscriber: measured on this
//! machine, a parked task plus tokio's per-socket registration cost about
//! 1 KiB of user space per idle connection (task cell and `ScheduledIo` are
//! each cache-line aligned); a socket in this epoll costs nothing in user
//! space beyond its [`super::conn::Conn`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::unix::AsyncFd;

/// Level-triggered epoll over subscriber sockets.
pub(crate) struct Poller {
    ep: AsyncFd<OwnedFd>,
}

/// One readiness event: the slot it was registered with and what is ready.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    pub(crate) slot: u32,
    pub(crate) readable: bool,
    pub(crate) writable: bool,
}

impl Poller {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: epoll_create1 has no memory-safety preconditions.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an OwnedFd always returns the same open descriptor until dropped.
        let ep = unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Self { ep })
    }

    fn ctl(&self, op: i32, fd: RawFd, slot: u32, write: bool) -> io::Result<()> {
        let mut events = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        if write {
            events |= libc::EPOLLOUT as u32;
        }
        let mut ev = libc::epoll_event {
            events,
            u64: u64::from(slot),
        };
        // SAFETY: `ev` is a valid epoll_event; `fd` is an open socket owned by a Conn.
        if unsafe { libc::epoll_ctl(self.ep.get_ref().as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for reading, reporting it as `slot`.
    pub(crate) fn add(&self, fd: RawFd, slot: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, slot, false)
    }

    /// Watches `fd` for writing too (while it has a queue), or no longer.
    pub(crate) fn want_write(&self, fd: RawFd, slot: u32, write: bool) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, slot, write)
    }

    /// Stops watching `fd` (closing it would too; this makes it immediate).
    pub(crate) fn remove(&self, fd: RawFd) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0, false);
    }

    /// Waits until some subscriber is ready and fills `out` with up to its
    /// capacity of events.
    pub(crate) async fn wait(
        &self,
        out: &mut Vec<Event>,
        raw: &mut [libc::epoll_event],
    ) -> io::Result<()> {
        out.clear();
        loop {
            let mut guard = self.ep.readable().await?;
            // SAFETY: `raw` is valid for `raw.len()` events; timeout 0 never blocks.
            let n = unsafe {
                libc::epoll_wait(
                    self.ep.get_ref().as_raw_fd(),
                    raw.as_mut_ptr(),
                    raw.len() as i32,
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                // Nothing left: wait for the next edge from tokio's reactor.
                guard.clear_ready();
                continue;
            }
            for ev in &raw[..n as usize] {
                let bits = ev.events;
                out.push(Event {
                    slot: ev.u64 as u32,
                    readable: bits
                        & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR)
                            as u32
                        != 0,
                    writable: bits & (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0,
                });
            }
            return Ok(());
        }
    }
}
