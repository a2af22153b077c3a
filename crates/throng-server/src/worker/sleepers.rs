//! The worker's sleepers: `/ping` connections whose answer waits (the
//! seeds' `sleep` header), held outside any task until their next part is
//! due, then handed to a task of their own again (`http::resume`).
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
use std::net::TcpStream;
use std::os::fd::AsRawFd as _;
use std::rc::Rc;
use std::time::Instant;

use tokio::sync::Notify;

use super::http;
use super::routes::Serves;
use super::routes::ping::Answer;
use super::state::Worker;
use crate::addresses::Source;

/// One sleeping connection: what it takes to go on with it.
pub(crate) struct Sleeper {
    pub(crate) stream: TcpStream,
    /// What is left of its answer.
    pub(crate) answer: Answer,
    /// What its listener serves, for its next requests.
    pub(crate) serves: Serves,
    /// The client address it is counted under (per-address limits): it
    /// stays counted while it sleeps.
    pub(crate) source: Option<Source>,
}

/// Every sleeping connection of a worker.
#[derive(Default)]
pub(crate) struct Sleepers {
    /// Indexed by file descriptor. Invariant: `slots[fd]` is `Some` exactly
    /// when `wakes` holds one entry for `fd`.
    slots: RefCell<Vec<Option<Sleeper>>>,
    /// (when it wakes, fd), soonest first.
    wakes: RefCell<BinaryHeap<Reverse<(Instant, u32)>>>,
    /// A sleeper came that wakes before any other.
    sooner: Notify,
}

impl Sleepers {
    /// Holds `sleeper` until `wake`, then its answer goes on.
    pub(crate) fn park(&self, sleeper: Sleeper, wake: Instant) {
        let Ok(fd) = u32::try_from(sleeper.stream.as_raw_fd()) else {
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
    fn due(&self, now: Instant) -> Vec<Sleeper> {
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
    fn next(&self) -> Option<Instant> {
        self.wakes.borrow().peek().map(|Reverse((at, _))| *at)
    }
}

/// Wakes each sleeper when its next part is due: a task of its own takes
/// the connection up again.
pub(crate) async fn run(w: Rc<Worker>) {
    loop {
        let next = w.sleepers.next();
        let wait = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = wait => {}
            () = w.sleepers.sooner.notified() => continue,
        }
        for sleeper in w.sleepers.due(Instant::now()) {
            tokio::task::spawn_local(http::resume(w.clone(), sleeper));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn socket() -> TcpStream {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        TcpStream::connect(l.local_addr().unwrap()).unwrap()
    }

    fn sleeper(stream: TcpStream, answer: Answer) -> Sleeper {
        Sleeper {
            stream,
            answer,
            serves: Serves {
                subscribe: true,
                publish: true,
                metrics: true,
            },
            source: None,
        }
    }

    #[test]
    fn sleepers_wake_in_the_order_of_their_time_whatever_their_order_in() {
        let s = Sleepers::default();
        let t0 = Instant::now();
        let answer = Answer::sleeping(t0 + Duration::from_secs(60));
        let (a, b, c) = (socket(), socket(), socket());
        let fds = [a.as_raw_fd(), b.as_raw_fd(), c.as_raw_fd()];
        s.park(sleeper(a, answer), t0 + Duration::from_millis(300));
        s.park(sleeper(b, answer), t0 + Duration::from_millis(100));
        s.park(sleeper(c, answer), t0 + Duration::from_millis(200));
        assert_eq!(s.len(), 3);
        assert_eq!(s.next(), Some(t0 + Duration::from_millis(100)));
        assert!(s.due(t0).is_empty());
        let woke: Vec<i32> = s
            .due(t0 + Duration::from_millis(250))
            .iter()
            .map(|s| s.stream.as_raw_fd())
            .collect();
        assert_eq!(woke, [fds[1], fds[2]]);
        assert_eq!(s.len(), 1);
        assert_eq!(s.due(t0 + Duration::from_secs(1)).len(), 1);
        assert_eq!((s.len(), s.next()), (0, None));
    }
}
