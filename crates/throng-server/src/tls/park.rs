//! TLS connections parked between HTTP requests: a connection that would
//! wait for a request (its first, after the handshake, or the next one on
//! a kept-alive connection) holding no bytes leaves its tokio task and
//! tokio's reactor and waits in the worker's own epoll, as subscribers do,
//! holding its socket and rustls's state only. Its first bytes (or its
//! end) wake it: it becomes a task again and reads its request. A plain
//! HTTP connection waiting for its first request is parked the same way,
//! with no rustls state.
//!
//! Measured with `scripts/bench-tls.sh --part states`: a connection
//! waiting in its task held ~7.8 KB of user space (rustls's state, ~3.3
//! KB, and the task: its future, timers, tokio's registration, the boxed
//! stream); parked, about what a wss subscriber holds (docs/tls.md).
//!
//! A parked connection still has a deadline (`--handshake-timeout` from
//! when it was parked, as a task waiting for a request has): every
//! connection is parked for the same time, so the parked connections,
//! linked in the order parked, are in the order of their deadlines and the
//! tick takes them from the front.

use std::cell::{Cell, RefCell};
use std::net::TcpStream;
use std::time::Duration;

use rustls::server::UnbufferedServerConnection;
use throng_host::poll::{Interest, Poller};

/// How long a kept-alive connection waits for its next request in its
/// task before it is parked: a client sending requests back to back does
/// not pay the move each time (measured: 6.1 µs of server CPU per request
/// became 10.5 µs when every wait parked; `scripts/bench-tls-compare.sh`).
/// A TLS connection waiting for its first request is parked at once: the
/// move is small beside its handshake.
pub(crate) const KEPT_GRACE: Duration = Duration::from_millis(10);

/// How long a plain connection waits for its first request in its task
/// before it is parked. Its client's request usually follows the connect
/// at once, but in a connect storm the clients fall behind: with 10 ms,
/// the parks' own work (four epoll calls and a new task each) slowed the
/// server further and more requests came late (`throng bench -c 20000
/// --rate 20000/s`: ~16,500/s against ~19,960/s, medians of 6,
/// alternating); with 100 ms the connects' time in their tasks left more
/// heap behind than a parked connection may cost (~640 B each with
/// `scripts/bench-tls.sh --part plain`, before the worker's trim after a
/// burst). With 30 ms: 19,961/s against 19,963/s, and 471 B (24 B with
/// the trim).
pub(crate) const FIRST_GRACE: Duration = Duration::from_millis(30);

/// The bit that marks a parked connection's token in the worker's epoll
/// (a subscriber's token is its slot, below 2^32).
pub(crate) const TOKEN_BIT: u64 = 1 << 63;

/// A parked connection: the socket (out of tokio's reactor), its rustls
/// state (none: a plain connection), and what the HTTP phase needs to go
/// on (`T`).
pub(crate) struct Entry<T> {
    pub(crate) tcp: TcpStream,
    pub(crate) conn: Option<Box<UnbufferedServerConnection>>,
    pub(crate) extra: T,
    /// The tick it is closed at.
    deadline: u32,
    /// The slots parked just before and just after it ([`NIL`]: none).
    prev: u32,
    next: u32,
}

/// No slot: the end of the deadline list.
const NIL: u32 = u32::MAX;

/// The table's room (in slots) kept once no connection is parked; a
/// burst's larger table is given back.
const KEPT_SLOTS: usize = 64;

/// One worker's parked connections, by slot; tokens are
/// [`TOKEN_BIT`] | slot.
///
/// Every connection is parked for the same time, so the order parked is
/// the order of the deadlines: the entries are linked in that order
/// through their slots, and a woken one leaves the list at once. A queue
/// of deadlines beside the slots kept an entry for every connection
/// parked within the last `--handshake-timeout`, woken or not: in a
/// connect storm (`scripts/bench-serve.sh`, 18,000 upgrades, most of them
/// parked a moment) it grew to 16,384 entries and kept that room for
/// good, ~11 B more per idle subscriber.
pub(crate) struct Parked<T> {
    slots: RefCell<Vec<Option<Entry<T>>>>,
    free: RefCell<Vec<u32>>,
    /// The first and last parked (`NIL`: none).
    head: Cell<u32>,
    tail: Cell<u32>,
    parked: Cell<usize>,
}

impl<T> Default for Parked<T> {
    fn default() -> Self {
        Self {
            slots: RefCell::default(),
            free: RefCell::default(),
            head: Cell::new(NIL),
            tail: Cell::new(NIL),
            parked: Cell::new(0),
        }
    }
}

impl<T> Parked<T> {
    /// Parks `tcp` (non-blocking, out of tokio's reactor) in `poller`
    /// until it is readable, or until the tick `deadline`. `deadline` must
    /// not be earlier than any given before (every connection waits the
    /// same time). If epoll refuses it, the connection is closed and
    /// `extra` given back.
    pub(crate) fn park(
        &self,
        poller: &Poller,
        tcp: TcpStream,
        conn: Option<Box<UnbufferedServerConnection>>,
        extra: T,
        deadline: u32,
    ) -> Result<(), T> {
        let mut slots = self.slots.borrow_mut();
        let slot = match self.free.borrow_mut().pop() {
            Some(s) => s,
            None => {
                slots.push(None);
                // Fewer parked connections than u32::MAX: each holds a file.
                (slots.len() - 1) as u32
            }
        };
        if poller
            .add(&tcp, TOKEN_BIT | u64::from(slot), Interest::Read)
            .is_err()
        {
            self.free.borrow_mut().push(slot);
            return Err(extra);
        }
        let tail = self.tail.replace(slot);
        match slots.get_mut(tail as usize).and_then(Option::as_mut) {
            Some(last) => last.next = slot,
            None => self.head.set(slot),
        }
        slots[slot as usize] = Some(Entry {
            tcp,
            conn,
            extra,
            deadline,
            prev: tail,
            next: NIL,
        });
        self.parked.set(self.parked.get() + 1);
        Ok(())
    }

    /// The connection of `token` (readable, or closed by its peer), out of
    /// the epoll set; `None` if there is none.
    pub(crate) fn wake(&self, poller: &Poller, token: u64) -> Option<Entry<T>> {
        let slot = u32::try_from(token & !TOKEN_BIT).ok()?;
        let mut slots = self.slots.borrow_mut();
        let e = slots.get_mut(slot as usize)?.take()?;
        let _ = poller.remove(&e.tcp);
        match slots.get_mut(e.prev as usize).and_then(Option::as_mut) {
            Some(before) => before.next = e.next,
            None => self.head.set(e.next),
        }
        match slots.get_mut(e.next as usize).and_then(Option::as_mut) {
            Some(after) => after.prev = e.prev,
            None => self.tail.set(e.prev),
        }
        let mut free = self.free.borrow_mut();
        free.push(slot);
        self.parked.set(self.parked.get() - 1);
        if self.parked.get() == 0 && slots.capacity() > KEPT_SLOTS {
            // Every slot is free: the burst's room goes back.
            *slots = Vec::with_capacity(KEPT_SLOTS);
            *free = Vec::with_capacity(KEPT_SLOTS);
        }
        Some(e)
    }

    /// Takes every connection whose deadline is `now` or before out of the
    /// epoll set and gives it to `expired`.
    pub(crate) fn expire(&self, poller: &Poller, now: u32, mut expired: impl FnMut(Entry<T>)) {
        loop {
            let head = self.head.get();
            let due = self
                .slots
                .borrow()
                .get(head as usize)
                .and_then(Option::as_ref)
                .is_some_and(|e| e.deadline <= now);
            if !due {
                return;
            }
            if let Some(e) = self.wake(poller, TOKEN_BIT | u64::from(head)) {
                expired(e);
            }
        }
    }

    /// How many connections are parked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.parked.get()
    }

    /// How many slots the table has room for.
    #[cfg(test)]
    fn room(&self) -> usize {
        self.slots
            .borrow()
            .capacity()
            .max(self.free.borrow().capacity())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::net::TcpListener;
    use std::sync::Arc;

    use throng_host::poll::Events;

    use super::*;
    use crate::tls::{Material, server_config};

    /// A connected pair of sockets: (client, server side, non-blocking).
    fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        (client, server)
    }

    #[test]
    fn parked_connections_wake_by_token_and_expire_in_order() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let cfg: Arc<rustls::ServerConfig> =
                server_config(&Material::self_signed().unwrap()).unwrap();
            let conn = || {
                Some(Box::new(
                    UnbufferedServerConnection::new(cfg.clone()).unwrap(),
                ))
            };
            let poller = Poller::new().unwrap();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let parked: Parked<&str> = Parked::default();
            let (mut a, a_srv) = pair(&l);
            let (_b, b_srv) = pair(&l);
            let (_c, c_srv) = pair(&l);
            parked.park(&poller, a_srv, conn(), "a", 10).unwrap();
            parked.park(&poller, b_srv, conn(), "b", 10).unwrap();
            parked.park(&poller, c_srv, conn(), "c", 12).unwrap();
            assert_eq!(parked.len(), 3);

            // Bytes for `a`: its token comes out of epoll, and wakes it.
            a.write_all(b"x").unwrap();
            let mut events = Events::with_capacity(8);
            poller.wait(&mut events).await.unwrap();
            let tokens: Vec<u64> = events.iter().map(|e| e.token).collect();
            assert_eq!(tokens.len(), 1);
            assert_ne!(tokens[0] & TOKEN_BIT, 0);
            let woken = parked.wake(&poller, tokens[0]).unwrap();
            assert_eq!(woken.extra, "a");
            assert!(parked.wake(&poller, tokens[0]).is_none(), "woken once");

            // `d` takes `a`'s slot; the old deadline of that slot is not its.
            let (_d, d_srv) = pair(&l);
            // A plain connection (no rustls state) parks beside them.
            parked.park(&poller, d_srv, None, "d", 12).unwrap();
            let mut gone = Vec::new();
            parked.expire(&poller, 9, |e| gone.push(e.extra));
            assert!(gone.is_empty());
            parked.expire(&poller, 10, |e| gone.push(e.extra));
            assert_eq!(gone, ["b"]);
            parked.expire(&poller, 20, |e| gone.push(e.extra));
            assert_eq!(gone, ["b", "c", "d"]);
            assert_eq!(parked.len(), 0);
            assert_eq!(poller.poll_now(&mut events).unwrap(), 0, "out of epoll");
        });
    }

    #[test]
    fn a_burst_of_parked_connections_gives_its_room_back() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let poller = Poller::new().unwrap();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let parked: Parked<usize> = Parked::default();
            let burst = 4 * KEPT_SLOTS;
            let mut clients = Vec::new();
            for i in 0..burst {
                let (c, srv) = pair(&l);
                clients.push(c);
                parked.park(&poller, srv, None, i, 10 + i as u32).unwrap();
            }
            assert!(parked.room() >= burst);
            // Woken out of order (every other one first), as bytes come.
            let mut woken = Vec::new();
            for slot in (0..burst).step_by(2).chain((1..burst).step_by(2)) {
                let token = TOKEN_BIT | slot as u64;
                woken.push(parked.wake(&poller, token).unwrap().extra);
                if parked.len() > 0 {
                    assert!(parked.room() >= burst, "room kept while any waits");
                }
            }
            assert_eq!(woken.len(), burst);
            assert_eq!(parked.len(), 0);
            assert!(parked.room() <= KEPT_SLOTS, "{}", parked.room());
            // The list is whole again: new ones expire in order.
            for i in 0..3 {
                let (c, srv) = pair(&l);
                clients.push(c);
                parked.park(&poller, srv, None, 100 + i, 50).unwrap();
            }
            let mut gone = Vec::new();
            parked.expire(&poller, 50, |e| gone.push(e.extra));
            assert_eq!(gone, [100, 101, 102]);
        });
    }
}
