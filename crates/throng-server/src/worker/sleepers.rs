//! The worker's sleepers: `/ping` connections whose answer waits (the
//! seeds' `sleep` header), held outside any task until their next part is
//! due; the worker's sleepers task takes the ones that are due
//! ([`Sleepers::due`]) and hands each to a task of its own again.
//!
//! A sleeper is its socket (out of tokio's reactor, watched by no one: the
//! connection says nothing while it waits for its answer) and what is left
//! of its answer, in a table by file descriptor, and one entry in a queue
//! ordered by when it wakes (its slot 56 bytes, with the client address it
//! stays counted under): under a hundred bytes, against the 1.76 KB a
//! sleeping connection cost in its task.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::AsRawFd;
use std::time::Instant;

use tokio::sync::Notify;

/// Every sleeping connection of a worker: `S` is what it takes to go on
/// with one (its socket, the rest of its answer).
pub(crate) struct Sleepers<S> {
    /// Indexed by file descriptor. Invariant: `slots[fd]` is `Some` exactly
    /// when `wakes` holds one entry for `fd`.
    slots: RefCell<Vec<Option<S>>>,
    /// (when it wakes, fd), soonest first.
    wakes: RefCell<BinaryHeap<Reverse<(Instant, u32)>>>,
    /// A sleeper came that wakes before any other.
    sooner: Notify,
}

impl<S> Default for Sleepers<S> {
    fn default() -> Self {
        Self {
            slots: RefCell::default(),
            wakes: RefCell::default(),
            sooner: Notify::new(),
        }
    }
}

impl<S: AsRawFd> Sleepers<S> {
    /// Holds `sleeper` until `wake`.
    pub(crate) fn park(&self, sleeper: S, wake: Instant) {
        let Ok(fd) = u32::try_from(sleeper.as_raw_fd()) else {
            return;
        };
        let index = fd as usize;
        {
            let mut slots = self.slots.borrow_mut();
            if slots.len() <= index {
                slots.resize_with(index + 1, || None);
            }
            slots[index] = Some(sleeper);
        }
        let mut wakes = self.wakes.borrow_mut();
        let soonest = wakes.peek().is_none_or(|Reverse((at, _))| wake < *at);
        wakes.push(Reverse((wake, fd)));
        if soonest {
            self.sooner.notify_one();
        }
    }

    /// Connections sleeping now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.wakes.borrow().len()
    }

    /// The sleepers whose time has come at `now`, taken out.
    pub(crate) fn due(&self, now: Instant) -> Vec<S> {
        let mut out = Vec::new();
        let mut wakes = self.wakes.borrow_mut();
        let mut slots = self.slots.borrow_mut();
        while let Some(Reverse((at, fd))) = wakes.peek().copied() {
            if at > now {
                break;
            }
            wakes.pop();
            if let Some(s) = slots.get_mut(fd as usize).and_then(Option::take) {
                out.push(s);
            }
        }
        out
    }

    /// When the next sleeper wakes.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.wakes.borrow().peek().map(|Reverse((at, _))| *at)
    }

    /// Returns once a sleeper came that wakes before any other.
    pub(crate) async fn sooner(&self) {
        self.sooner.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;
    use std::time::Duration;

    use super::*;

    fn socket() -> TcpStream {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        TcpStream::connect(l.local_addr().unwrap()).unwrap()
    }

    #[test]
    fn sleepers_wake_in_the_order_of_their_time_whatever_their_order_in() {
        let s = Sleepers::default();
        let t0 = Instant::now();
        let (a, b, c) = (socket(), socket(), socket());
        let fds = [a.as_raw_fd(), b.as_raw_fd(), c.as_raw_fd()];
        s.park(a, t0 + Duration::from_millis(300));
        s.park(b, t0 + Duration::from_millis(100));
        s.park(c, t0 + Duration::from_millis(200));
        assert_eq!(s.len(), 3);
        assert_eq!(s.next(), Some(t0 + Duration::from_millis(100)));
        assert!(s.due(t0).is_empty());
        let woke: Vec<i32> = s
            .due(t0 + Duration::from_millis(250))
            .iter()
            .map(AsRawFd::as_raw_fd)
            .collect();
        assert_eq!(woke, [fds[1], fds[2]]);
        assert_eq!(s.len(), 1);
        assert_eq!(s.due(t0 + Duration::from_secs(1)).len(), 1);
        assert_eq!((s.len(), s.next()), (0, None));
    }
}
