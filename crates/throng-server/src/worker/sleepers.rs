//! The worker's sleepers: `/ping` connections whose answer waits (the
//! seeds' `sleep` header), held outside any task until their next part is
//! due; the worker's sleepers task takes the ones that are due
//! ([`Sleepers::due`]) and hands each to a task of its own again.
//!
//! A sleeper is its socket (out of tokio's reactor, watched by no one: the
//! connection says nothing while it waits for its answer) and what is left
//! of its answer, in a table by file descriptor (a 56-byte slot, with the
//! client address it stays counted under), and one 8-byte entry in a queue
//! ordered by when it wakes, against the 1.76 KB a sleeping connection cost
//! in its task. Wake times are kept as whole milliseconds from a base
//! instant in a `u32` (an `Instant` is 16 bytes): rounded up, so that no
//! one wakes early, and moved to a later base when they near 2^31 ms (25
//! days of a worker's life).
//!
//! Each sleeping socket is also watched in an epoll set of the sleepers'
//! own ([`Sleepers::stirred`]), so that a client that gives up and closes
//! frees its socket at once instead of leaving it in CLOSE-WAIT until its
//! answer's sleep ends.

use std::cell::{Cell, OnceCell, RefCell};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use throng_host::poll::{Events, Interest, Poller};
use tokio::sync::Notify;

/// Every sleeping connection of a worker: `S` is what it takes to go on
/// with one (its socket, the rest of its answer).
pub(crate) struct Sleepers<S> {
    /// What wake times count their milliseconds from.
    base: Cell<Instant>,
    /// Indexed by file descriptor, with when it wakes. `wakes` holds an
    /// entry for each; an entry whose slot is empty or wakes at another
    /// time is of a sleeper already gone (its client closed), and skipped.
    slots: RefCell<Vec<Option<(Ms, S)>>>,
    /// The sleeping sockets, watched for their client's close (made by the
    /// first [`Sleepers::stirred`], inside the runtime; `None` inside
    /// when the set could not be made: then nothing is watched).
    watch: OnceCell<Option<Poller>>,
    /// (when it wakes, fd), soonest first.
    wakes: RefCell<BinaryHeap<Reverse<(Ms, u32)>>>,
    /// A sleeper came that wakes before any other.
    sooner: Notify,
}

impl<S> Default for Sleepers<S> {
    fn default() -> Self {
        Self {
            base: Cell::new(Instant::now()),
            slots: RefCell::default(),
            watch: OnceCell::new(),
            wakes: RefCell::default(),
            sooner: Notify::new(),
        }
    }
}

/// Milliseconds from [`Sleepers`]' base.
type Ms = u32;

/// Past this, wake times move to a later base ([`Sleepers::rebase`]).
const REBASE_AT: Ms = 1 << 31;

impl<S> Sleepers<S> {
    /// `t` in whole milliseconds from the base, rounded up (a sleeper
    /// never wakes early), at most `Ms::MAX` (49 days: a longer sleep
    /// wakes then).
    fn ms_up(&self, t: Instant) -> Ms {
        let d = t.saturating_duration_since(self.base.get());
        let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0);
        Ms::try_from(ms).unwrap_or(Ms::MAX)
    }

    /// `t` in whole milliseconds from the base, rounded down.
    fn ms_down(&self, t: Instant) -> Ms {
        let ms = t.saturating_duration_since(self.base.get()).as_millis();
        Ms::try_from(ms).unwrap_or(Ms::MAX)
    }

    fn instant(&self, ms: Ms) -> Instant {
        self.base.get() + Duration::from_millis(u64::from(ms))
    }

    /// Moves the base to `now`, every wake time with it (those past stay
    /// past, at 0). Once in 25 days of a worker's life, in one pass.
    fn rebase(&self, now: Instant) {
        let shift = self.ms_down(now);
        self.base.set(self.instant(shift));
        let mut wakes = self.wakes.borrow_mut();
        let mut all = std::mem::take(&mut *wakes).into_vec();
        for Reverse((at, _)) in &mut all {
            *at = at.saturating_sub(shift);
        }
        *wakes = BinaryHeap::from(all);
        for (at, _) in self.slots.borrow_mut().iter_mut().flatten() {
            *at = at.saturating_sub(shift);
        }
    }
}

impl<S: AsRawFd + AsFd> Sleepers<S> {
    fn poller(&self) -> Option<&Poller> {
        self.watch.get().and_then(Option::as_ref)
    }

    /// Holds `sleeper` until `wake`.
    pub(crate) fn park(&self, sleeper: S, wake: Instant) {
        let Ok(fd) = u32::try_from(sleeper.as_raw_fd()) else {
            return;
        };
        if let Some(p) = self.poller() {
            // Unwatched, it still wakes on time: only its close goes unseen.
            let _ = p.add(&sleeper, u64::from(fd), Interest::Read);
        }
        if self.ms_down(Instant::now()) >= REBASE_AT {
            self.rebase(Instant::now());
        }
        let wake = self.ms_up(wake);
        let index = fd as usize;
        {
            let mut slots = self.slots.borrow_mut();
            if slots.len() <= index {
                slots.resize_with(index + 1, || None);
            }
            slots[index] = Some((wake, sleeper));
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
        self.slots.borrow().iter().flatten().count()
    }

    /// The sleepers whose time has come at `now`, taken out.
    pub(crate) fn due(&self, now: Instant) -> Vec<S> {
        let now = self.ms_down(now);
        let mut out = Vec::new();
        let mut wakes = self.wakes.borrow_mut();
        let mut slots = self.slots.borrow_mut();
        while let Some(Reverse((at, fd))) = wakes.peek().copied() {
            if at > now {
                break;
            }
            wakes.pop();
            let Some(slot) = slots.get_mut(fd as usize) else {
                continue;
            };
            if slot.as_ref().is_some_and(|(wake, _)| *wake == at)
                && let Some((_, s)) = slot.take()
            {
                if let Some(p) = self.poller() {
                    let _ = p.remove(&s);
                }
                out.push(s);
            }
        }
        out
    }

    /// Waits until a sleeping socket stirs (its client closed or reset it,
    /// or sent more), and returns their descriptors. Never returns when the
    /// set cannot be made.
    pub(crate) async fn stirred(&self, events: &mut Events) -> Vec<u32> {
        let watch = self.watch.get_or_init(|| Poller::new().ok());
        let Some(p) = watch else {
            return std::future::pending().await;
        };
        if p.wait(events).await.is_err() {
            return Vec::new();
        }
        events
            .iter()
            .filter_map(|e| u32::try_from(e.token).ok())
            .collect()
    }

    /// Sleeper `fd` stirred: takes it out if `gone` says its client is
    /// gone (its wake entry is then skipped), else stops watching it (it
    /// sent its next request early, read when it wakes).
    pub(crate) fn stir(&self, fd: u32, gone: impl Fn(&S) -> bool) -> Option<S> {
        let mut slots = self.slots.borrow_mut();
        let slot = slots.get_mut(fd as usize)?;
        let (_, s) = slot.as_ref()?;
        if let Some(p) = self.poller() {
            let _ = p.remove(s);
        }
        if gone(s) {
            slot.take().map(|(_, s)| s)
        } else {
            None
        }
    }

    /// When the next sleeper wakes.
    pub(crate) fn next(&self) -> Option<Instant> {
        let at = self.wakes.borrow().peek().map(|Reverse((at, _))| *at)?;
        Some(self.instant(at))
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
        // Kept to the millisecond, rounded up: never early.
        let next = s.next().unwrap();
        let soonest = t0 + Duration::from_millis(100);
        assert!(
            next >= soonest && next < soonest + Duration::from_millis(1),
            "{:?}",
            next - soonest
        );
        assert!(s.due(t0).is_empty());
        assert!(s.due(soonest - Duration::from_micros(1)).is_empty());
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

    /// What a sleeping request costs here: its slot and its queue entry.
    #[test]
    fn a_slot_and_a_queue_entry_stay_small() {
        assert_eq!(size_of::<Option<(Ms, crate::worker::state::Sleeper)>>(), 56);
        assert_eq!(size_of::<Reverse<(Ms, u32)>>(), 8);
    }

    #[test]
    fn a_new_base_keeps_every_wake_time_and_its_order() {
        let s = Sleepers::default();
        let t0 = Instant::now();
        let (a, b) = (socket(), socket());
        let fds = [a.as_raw_fd(), b.as_raw_fd()];
        s.park(a, t0 + Duration::from_millis(700));
        s.park(b, t0 + Duration::from_millis(500));
        let before = s.next().unwrap();
        s.rebase(t0 + Duration::from_millis(300));
        assert!(s.base.get() > t0);
        // The same instant, to the millisecond it was kept at.
        assert_eq!(s.next(), Some(before));
        assert!(s.due(t0 + Duration::from_millis(499)).is_empty());
        let woke: Vec<i32> = s
            .due(t0 + Duration::from_millis(800))
            .iter()
            .map(AsRawFd::as_raw_fd)
            .collect();
        assert_eq!(woke, [fds[1], fds[0]]);
    }

    #[tokio::test]
    async fn a_client_that_closes_while_its_answer_sleeps_is_let_go_at_once() {
        let s = Sleepers::default();
        let mut events = Events::with_capacity(8);
        // The set is made by the first wait; nothing stirs yet.
        let none = tokio::time::timeout(Duration::from_millis(20), s.stirred(&mut events)).await;
        assert!(none.is_err());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (served, _) = l.accept().unwrap();
        served.set_nonblocking(true).unwrap();
        let fd = served.as_raw_fd() as u32;
        let t0 = Instant::now();
        s.park(served, t0 + Duration::from_secs(30));
        drop(client);
        let fds = tokio::time::timeout(Duration::from_secs(5), s.stirred(&mut events))
            .await
            .expect("the close is seen");
        assert_eq!(fds, [fd]);
        let gone = s.stir(fd, |t| matches!(t.peek(&mut [0u8; 1]), Ok(0) | Err(_)));
        assert!(gone.is_some());
        assert_eq!(s.len(), 0);
        // Its wake entry is skipped; a new sleeper on the same fd is not woken by it.
        s.park(socket(), t0 + Duration::from_secs(60));
        assert!(s.due(t0 + Duration::from_secs(31)).is_empty());
        assert_eq!(s.due(t0 + Duration::from_secs(61)).len(), 1);
    }
}
