//! One epoll set, itself registered with tokio: the readiness loop of the
//! connections a worker holds outside tokio's reactor (the server's
//! subscribers, the harness's held connections).
//!
//! Why not a tokio task and `TcpStream` per connection: measured on this
//! machine at 18,000 connections, a parked task plus tokio's per-socket
//! registration cost about 1 KiB of user space per idle connection (the
//! task cell and `ScheduledIo` are each cache-line aligned); a socket in
//! this set costs nothing in user space beyond what its owner keeps.
//!
//! The set is level-triggered: a connection with more to read than one turn
//! takes is reported again, so one busy connection cannot starve the
//! others. Each socket is registered with a `u64` token of the owner's
//! choosing (a slot number, a file descriptor) that comes back in its events.

use std::io;
use std::os::fd::{AsFd, AsRawFd as _, FromRawFd as _, OwnedFd};

use tokio::io::unix::AsyncFd;

/// What a socket is watched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    /// Data to read, or the peer's end (`EPOLLIN | EPOLLRDHUP`).
    Read,
    /// That, and room to write (while the owner has something queued).
    ReadWrite,
}

impl Interest {
    fn bits(self) -> u32 {
        let read = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        match self {
            Self::Read => read,
            Self::ReadWrite => read | libc::EPOLLOUT as u32,
        }
    }
}

/// One readiness report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The token the socket was registered with.
    pub token: u64,
    /// Something to read: data, the peer's end, or an error to collect.
    pub readable: bool,
    /// Room to write, or an error a write will report.
    pub writable: bool,
}

/// The buffer [`Poller::wait`] fills: up to its capacity of events per call.
pub struct Events {
    raw: Vec<libc::epoll_event>,
    /// Invariant: `len <= raw.len()`; `raw[..len]` is what the kernel wrote last.
    len: usize,
}

impl Events {
    /// Room for `capacity` events per call (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            raw: vec![libc::epoll_event { events: 0, u64: 0 }; capacity.max(1)],
            len: 0,
        }
    }

    /// The events of the last call.
    pub fn iter(&self) -> impl Iterator<Item = Event> + '_ {
        self.raw[..self.len].iter().map(|ev| {
            // Copied out of the packed struct before use.
            let (bits, token) = (ev.events, ev.u64);
            let error = (libc::EPOLLERR | libc::EPOLLHUP) as u32;
            Event {
                token,
                readable: bits & ((libc::EPOLLIN | libc::EPOLLRDHUP) as u32 | error) != 0,
                writable: bits & (libc::EPOLLOUT as u32 | error) != 0,
            }
        })
    }

    /// How many events the last call gave.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the last call gave none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A level-triggered epoll set whose own fd is registered with tokio, so
/// its loop runs as one task beside the worker's others.
#[derive(Debug)]
pub struct Poller {
    ep: AsyncFd<OwnedFd>,
}

impl Poller {
    /// A new, empty set. Must be called inside a tokio runtime.
    pub fn new() -> io::Result<Self> {
        // SAFETY: epoll_create1 takes only flags and returns a new fd or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1 and nothing else owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: the AsyncFd owns `owned` and keeps it open until it is
        // dropped; an OwnedFd always reports the same descriptor.
        let ep = unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Self { ep })
    }

    fn ctl(&self, op: i32, fd: &impl AsFd, token: u64, interest: Interest) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: interest.bits(),
            u64: token,
        };
        // SAFETY: `ev` is a valid event for the call to read; both fds are
        // open for the call (the socket is borrowed, the set is ours). A
        // wrong fd is an error from the kernel, not undefined behaviour.
        let r = unsafe {
            libc::epoll_ctl(
                self.ep.get_ref().as_raw_fd(),
                op,
                fd.as_fd().as_raw_fd(),
                &mut ev,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for `interest`, reporting it as `token`.
    pub fn add(&self, fd: &impl AsFd, token: u64, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, interest)
    }

    /// Changes what a watched `fd` is watched for (and its token).
    pub fn modify(&self, fd: &impl AsFd, token: u64, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, interest)
    }

    /// Stops watching `fd`. Closing it would too, once every copy of it is
    /// closed; this makes it immediate.
    pub fn remove(&self, fd: &impl AsFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, Interest::Read)
    }

    /// Waits until some socket is ready, then fills `events` (at least one).
    pub async fn wait(&self, events: &mut Events) -> io::Result<()> {
        loop {
            let mut guard = self.ep.readable().await?;
            if self.poll_now(events)? > 0 {
                return Ok(());
            }
            // Nothing left: wait for the next edge from tokio's reactor.
            guard.clear_ready();
        }
    }

    /// Fills `events` with what is ready now, without waiting; returns how
    /// many. For a loop that takes several rounds per wake-up.
    pub fn poll_now(&self, events: &mut Events) -> io::Result<usize> {
        let room = i32::try_from(events.raw.len()).unwrap_or(i32::MAX);
        loop {
            // SAFETY: `events.raw` holds `room` valid entries for the kernel
            // to fill; timeout 0 never blocks.
            let n = unsafe {
                libc::epoll_wait(
                    self.ep.get_ref().as_raw_fd(),
                    events.raw.as_mut_ptr(),
                    room,
                    0,
                )
            };
            if n >= 0 {
                // epoll_wait returns at most `room`, so this fits.
                events.len = usize::try_from(n).unwrap_or(0);
                return Ok(events.len);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                events.len = 0;
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use super::*;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        a.set_nonblocking(true).unwrap();
        (a, b)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn reports_reads_writes_and_ends_by_token() {
        runtime().block_on(async {
            let p = Poller::new().unwrap();
            let mut events = Events::with_capacity(8);
            let (ours, mut theirs) = pair();
            p.add(&ours, 7, Interest::Read).unwrap();
            assert_eq!(p.poll_now(&mut events).unwrap(), 0, "nothing yet");

            theirs.write_all(b"hi").unwrap();
            tokio::time::timeout(Duration::from_secs(5), p.wait(&mut events))
                .await
                .unwrap()
                .unwrap();
            let ev: Vec<Event> = events.iter().collect();
            assert_eq!(
                ev,
                [Event {
                    token: 7,
                    readable: true,
                    writable: false
                }]
            );
            // Level-triggered: unread data is reported again.
            assert_eq!(p.poll_now(&mut events).unwrap(), 1);
            let mut buf = [0; 8];
            assert_eq!((&ours).read(&mut buf).unwrap(), 2);
            assert_eq!(p.poll_now(&mut events).unwrap(), 0);

            // Room to write is reported only while asked for.
            p.modify(&ours, 9, Interest::ReadWrite).unwrap();
            assert_eq!(p.poll_now(&mut events).unwrap(), 1);
            let ev = events.iter().next().unwrap();
            assert!(ev.writable && !ev.readable && ev.token == 9, "{ev:?}");
            p.modify(&ours, 9, Interest::Read).unwrap();
            assert_eq!(p.poll_now(&mut events).unwrap(), 0);

            // The peer's end reads as readable, once its FIN has come
            // (loopback delivers it in a softirq that a busy machine defers).
            drop(theirs);
            tokio::time::timeout(Duration::from_secs(5), p.wait(&mut events))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(events.len(), 1);
            assert!(events.iter().next().unwrap().readable);
            p.remove(&ours).unwrap();
            assert_eq!(p.poll_now(&mut events).unwrap(), 0);
            assert!(p.remove(&ours).is_err(), "not watched any more");
        });
    }

    #[test]
    fn events_are_capped_by_the_buffer() {
        runtime().block_on(async {
            let p = Poller::new().unwrap();
            let mut events = Events::with_capacity(2);
            let pairs: Vec<_> = (0..5).map(|_| pair()).collect();
            for (i, (ours, theirs)) in pairs.iter().enumerate() {
                p.add(ours, i as u64, Interest::Read).unwrap();
                (&*theirs).write_all(b"x").unwrap();
            }
            tokio::time::timeout(Duration::from_secs(5), p.wait(&mut events))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(events.len(), 2);
        });
    }
}
