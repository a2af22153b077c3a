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
//! connection is parked for the same time, so the queue of deadlines is in
//! order and the tick pops its front.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::TcpStream;
use std::time::Duration;

use rustls::server::UnbufferedServerConnection;
use throng_host::poll::{Interest, Poller};

/// How long a kept-alive connection waits for its next request in its
/// task before it is parked: a client sending requests back to back does
/// not pay the move each time (measured: 6.1 µs of server CPU per request
/// became 10.5 µs when every wait parked; `scripts/bench-tls-compare.sh`).
/// A TLS connection waiting for its first request is parked at once: the
/// move is small beside its handshake. A plain one waits this long too
/// (its client's request usually follows the connect at once).
pub(crate) const KEPT_GRACE: Duration = Duration::from_millis(10);

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
    /// Tells this entry from a later one in the same slot.
    generation: u32,
}

/// One worker's parked connections, by slot; tokens are
/// [`TOKEN_BIT`] | slot.
pub(crate) struct Parked<T> {
    slots: RefCell<Vec<Option<Entry<T>>>>,
    free: RefCell<Vec<u32>>,
    /// (deadline tick, slot, generation), in the order parked, which is
    /// the order of the deadlines; an entry woken before is skipped.
    deadlines: RefCell<VecDeque<(u32, u32, u32)>>,
    generation: Cell<u32>,
}

impl<T> Default for Parked<T> {
    fn default() -> Self {
        Self {
            slots: RefCell::default(),
            free: RefCell::default(),
            deadlines: RefCell::default(),
            generation: Cell::new(0),
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
        let generation = self.generation.get().wrapping_add(1);
        self.generation.set(generation);
        slots[slot as usize] = Some(Entry {
            tcp,
            conn,
            extra,
            generation,
        });
        self.deadlines
            .borrow_mut()
            .push_back((deadline, slot, generation));
        Ok(())
    }

    /// The connection of `token` (readable, or closed by its peer), out of
    /// the epoll set; `None` if there is none.
    pub(crate) fn wake(&self, poller: &Poller, token: u64) -> Option<Entry<T>> {
        let slot = u32::try_from(token & !TOKEN_BIT).ok()?;
        let e = self.slots.borrow_mut().get_mut(slot as usize)?.take()?;
        let _ = poller.remove(&e.tcp);
        self.free.borrow_mut().push(slot);
        Some(e)
    }

    /// Takes every connection whose deadline is `now` or before out of the
    /// epoll set and gives it to `expired`.
    pub(crate) fn expire(&self, poller: &Poller, now: u32, mut expired: impl FnMut(Entry<T>)) {
        loop {
            let front = self.deadlines.borrow().front().copied();
            let Some((deadline, slot, generation)) = front else {
                return;
            };
            if deadline > now {
                return;
            }
            self.deadlines.borrow_mut().pop_front();
            let still = self
                .slots
                .borrow()
                .get(slot as usize)
                .and_then(Option::as_ref)
                .is_some_and(|e| e.generation == generation);
            if still {
                if let Some(e) = self.wake(poller, TOKEN_BIT | u64::from(slot)) {
                    expired(e);
                }
            }
        }
    }

    /// How many connections are parked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.borrow().iter().flatten().count()
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
}
