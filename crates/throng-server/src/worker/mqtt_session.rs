//! Persistent sessions on a worker's side, sans I/O: the connections whose
//! CONNECT asked to resume a session and wait for the supervisor's answer
//! (their CONNACK waits with them), and the fences that keep a resumed
//! connection from getting twice what its session queue already holds.
//!
//! The supervisor keeps a session while its client is away
//! ([`crate::sessions`]). A resume is answered on the control socket in
//! order with the relayed messages: the answer holds everything relayed
//! before it, and the connection is in the tables from the answer on, so
//! nothing relayed after it passes the connection by. The fan-outs of
//! messages relayed before the answer may still be waiting on this worker
//! when it comes, and would reach the connection now in the tables: those
//! (relay id up to the answer's `through`) are dropped for it.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use bytes::Bytes;

use super::conn::Conn;
use super::mqtt::Persist;

/// Waiting connections whose room [`Resumes`] keeps once none waits.
const KEPT: usize = 64;

/// A connection waiting for its session.
pub(crate) struct Waiting<W> {
    pub(crate) conn: Rc<Conn<W>>,
    pub(crate) persist: Option<Persist>,
    pub(crate) hash: u64,
    /// Its CONNACK with session present 0, then with 1.
    pub(crate) connacks: [Bytes; 2],
}

/// A worker's resumes and fences.
pub(crate) struct Resumes<W> {
    waiting: HashMap<u64, Waiting<W>>,
    /// The waiting connections, by address (each kept alive by its
    /// [`Waiting`], so no other has it meanwhile).
    held: HashSet<*const Conn<W>>,
    fences: Vec<(Rc<Conn<W>>, u64)>,
    next_id: u64,
}

impl<W> Default for Resumes<W> {
    fn default() -> Self {
        Self {
            waiting: HashMap::new(),
            held: HashSet::new(),
            fences: Vec::new(),
            next_id: 1,
        }
    }
}

impl<W> Resumes<W> {
    /// A new connection's id in the session records.
    pub(crate) fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Connection `id` waits for the answer to its resume.
    pub(crate) fn wait(&mut self, id: u64, w: Waiting<W>) {
        self.held.insert(Rc::as_ptr(&w.conn));
        self.waiting.insert(id, w);
    }

    /// Whether connection `id` waits for its answer.
    pub(crate) fn is_waiting(&self, id: u64) -> bool {
        self.waiting.contains_key(&id)
    }

    /// Whether `c` waits for its answer; cheap while none waits.
    pub(crate) fn holds(&self, c: &Rc<Conn<W>>) -> bool {
        !self.held.is_empty() && self.held.contains(&Rc::as_ptr(c))
    }

    /// The answer for connection `id` came.
    pub(crate) fn answered(&mut self, id: u64) -> Option<Waiting<W>> {
        let w = self.waiting.remove(&id)?;
        self.held.remove(&Rc::as_ptr(&w.conn));
        if self.waiting.is_empty() && self.waiting.capacity() > KEPT {
            // A burst of resumes (devices coming back at once) grew these
            // to its size: kept, they would cost every session connected
            // afterwards the room of one that waited.
            self.waiting = HashMap::new();
            self.held = HashSet::new();
        }
        Some(w)
    }

    /// Live messages up to relay id `through` are repeats for `c`.
    pub(crate) fn fence(&mut self, c: &Rc<Conn<W>>, through: u64) {
        self.fences.push((c.clone(), through));
    }

    /// For a live message of relay id `id` to `c`: `Some(true)` when it is
    /// a repeat, `Some(false)` when it is the first past the fence (which
    /// is lifted), `None` when `c` has none.
    pub(crate) fn fenced(&mut self, c: &Rc<Conn<W>>, id: u64) -> Option<bool> {
        let k = self.fences.iter().position(|(f, _)| Rc::ptr_eq(f, c))?;
        if id <= self.fences[k].1 {
            return Some(true);
        }
        self.fences.swap_remove(k);
        Some(false)
    }

    /// `c` ended: its fence goes with it.
    pub(crate) fn forget(&mut self, c: &Rc<Conn<W>>) {
        self.fences.retain(|(f, _)| !Rc::ptr_eq(f, c));
    }
}

/// The session a CONNECT asks for: its expiry in seconds, if it outlives
/// the connection (3.1.1: clean session 0, kept until the server's cap;
/// 5.0: a Session Expiry Interval over 0).
pub(crate) fn expiry(v5: bool, clean_start: bool, interval: Option<u32>) -> Option<u32> {
    if v5 {
        interval.filter(|&s| s > 0)
    } else {
        (!clean_start).then_some(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::expiry;

    #[test]
    fn which_connects_outlive_their_connection() {
        assert_eq!(expiry(false, false, None), Some(u32::MAX));
        assert_eq!(expiry(false, true, None), None);
        assert_eq!(expiry(true, false, None), None);
        assert_eq!(expiry(true, true, Some(60)), Some(60));
        assert_eq!(expiry(true, false, Some(0)), None);
    }
}
