//! The token subject (`sub`) of each connection admitted with one, kept
//! beside the subscriber tables so that `POST /api/disconnect {"sub":..}`
//! can find a user's connections (docs/api.md). A subscriber without a
//! subject pays nothing; one with a subject pays one entry of a map by
//! connection, and its subject's text is shared by all connections of the
//! same user on this worker (interned). Nothing here runs per message.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use super::{Outside, Subscribers};
use crate::metrics::CloseReason;
use crate::worker::conn::{Conn, NONE};

/// The subjects of this worker's connections.
#[derive(Default)]
pub(crate) struct Subjects {
    /// The subject of the connection being admitted now: set just before
    /// the admission, taken by it (so admissions keep their signatures).
    next: Option<Box<str>>,
    /// By connection ([`key`]): only those admitted with a subject.
    by_conn: HashMap<usize, Rc<str>>,
    /// Every subject some connection here has, once.
    interned: HashSet<Rc<str>>,
}

/// A connection's key: its address, stable while it lives.
fn key<W>(c: &Conn<W>) -> usize {
    std::ptr::from_ref(c) as usize
}

impl Subjects {
    /// Keeps `subject` for connection `at`.
    fn insert(&mut self, at: usize, subject: &str) {
        let shared = match self.interned.get(subject) {
            Some(s) => s.clone(),
            None => {
                let s: Rc<str> = Rc::from(subject);
                self.interned.insert(s.clone());
                s
            }
        };
        self.by_conn.insert(at, shared);
    }

    /// Forgets connection `at`'s subject; the text too when it was the last
    /// connection of that subject.
    fn remove(&mut self, at: usize) {
        let Some(s) = self.by_conn.remove(&at) else {
            return;
        };
        // Held by `interned` and `s` alone: no other connection has it.
        if Rc::strong_count(&s) == 2 {
            self.interned.remove(&*s);
        }
    }
}

impl<O: Outside> Subscribers<O> {
    /// The token subject of the connection admitted next (by
    /// [`Self::subscribe`], [`Self::subscribe_after`], `subscribe_many` or
    /// `add_mqtt`): called just before it.
    pub(crate) fn subject_next(&self, subject: Option<Box<str>>) {
        self.subjects.borrow_mut().next = subject;
    }

    /// Admission of `c`: it keeps the subject announced for it, if any.
    pub(super) fn subject_admitted(&self, c: &Conn<O::Wire>) {
        let mut subjects = self.subjects.borrow_mut();
        if let Some(s) = subjects.next.take()
            && c.slot() != NONE
        {
            subjects.insert(key(c), &s);
        }
    }

    /// `c` is gone: its subject is forgotten.
    pub(super) fn subject_gone(&self, c: &Conn<O::Wire>) {
        self.subjects.borrow_mut().remove(key(c));
    }

    /// Who is subscribed to `channel` here: each token subject with how
    /// many of its connections are (exactly that name; MQTT wildcard
    /// filters not included), sorted by subject. Walks the channel's
    /// subscribers: asked by the API, never on delivery.
    pub(crate) fn presence_of(&self, channel: &str) -> Vec<(String, u64)> {
        let subjects = self.subjects.borrow();
        let mut who: std::collections::BTreeMap<&str, u64> = Default::default();
        if let Some(ch) = self.channels.borrow().get(channel) {
            let conns = (ch.subs.iter())
                .chain(ch.multi.iter().map(|(c, _)| c))
                .chain(ch.mqtt.iter().map(|(c, _, _)| c));
            for c in conns {
                if let Some(s) = subjects.by_conn.get(&key(&**c)) {
                    *who.entry(s).or_default() += 1;
                }
            }
        }
        who.into_iter().map(|(s, n)| (s.to_owned(), n)).collect()
    }

    /// `c` refreshed its token in-band: the new token's subject replaces
    /// the old.
    pub(super) fn subject_refreshed(&self, c: &Conn<O::Wire>, subject: Option<Box<str>>) {
        let mut subjects = self.subjects.borrow_mut();
        subjects.remove(key(c));
        if let Some(s) = subject {
            subjects.insert(key(c), &s);
        }
    }

    /// The subject of `c`, if it came with one.
    pub(crate) fn subject_of(&self, c: &Conn<O::Wire>) -> Option<Rc<str>> {
        self.subjects.borrow().by_conn.get(&key(c)).cloned()
    }

    /// Connections here with a subject, and distinct subjects.
    #[cfg(test)]
    pub(crate) fn subject_counts(&self) -> (usize, usize) {
        let s = self.subjects.borrow();
        (s.by_conn.len(), s.interned.len())
    }

    /// Closes every connection here whose token's subject is `sub`
    /// (WebSocket: a close frame with `code` and `reason`; SSE: the stream
    /// ends; MQTT 5.0: a DISCONNECT, Administrative action), whatever its
    /// channels. Returns how many. Walks the connections with a subject
    /// (not the subscribers of any channel): an API call, not a delivery.
    pub(crate) fn close_subject(&self, sub: &str, code: u16, reason: &str) -> u64 {
        let keys: HashSet<usize> = self
            .subjects
            .borrow()
            .by_conn
            .iter()
            .filter(|(_, s)| &***s == sub)
            .map(|(k, _)| *k)
            .collect();
        if keys.is_empty() {
            return 0;
        }
        let conns: Vec<Rc<Conn<O::Wire>>> = self
            .conns
            .borrow()
            .all()
            .into_iter()
            .filter(|c| c.is_open() && keys.contains(&key(&**c)))
            .collect();
        for c in &conns {
            self.close(c, code, reason, CloseReason::Disconnected);
        }
        conns.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::Subjects;

    #[test]
    fn a_subject_is_kept_once_and_forgotten_with_its_last_connection() {
        let mut s = Subjects::default();
        s.insert(1, "alice");
        s.insert(2, "alice");
        s.insert(3, "bob");
        assert_eq!((s.by_conn.len(), s.interned.len()), (3, 2));
        assert!(Rc::ptr_eq(&s.by_conn[&1], &s.by_conn[&2]));
        s.remove(1);
        assert_eq!((s.by_conn.len(), s.interned.len()), (2, 2));
        s.remove(2);
        s.remove(2);
        assert_eq!((s.by_conn.len(), s.interned.len()), (1, 1));
        s.remove(3);
        assert_eq!((s.by_conn.len(), s.interned.len()), (0, 0));
    }

    #[test]
    fn closing_a_subject_closes_its_connections_of_every_channel_and_forgets_them() {
        use crate::worker::pair::{Got, Pair};
        let mut p = Pair::defaults();
        let mut as_user = |sub: Option<&str>, channels: &[&str]| {
            p.subs.subject_next(sub.map(Into::into));
            if channels.len() == 1 {
                p.connect(channels[0])
            } else {
                p.connect_many(channels, None)
            }
        };
        let alice = [
            as_user(Some("alice"), &["x"]),
            as_user(Some("alice"), &["y"]),
        ];
        let many = as_user(Some("alice"), &["x", "z"]);
        let bob = as_user(Some("bob"), &["x"]);
        let nobody = as_user(None, &["x"]);
        let conn = |i| p.conn(i).expect("in the tables");
        assert_eq!(p.subs.subject_of(&conn(alice[0])).as_deref(), Some("alice"));
        assert_eq!(p.subs.subject_of(&conn(nobody)), None);
        assert_eq!(p.subs.subject_counts(), (4, 2));
        assert_eq!(p.subs.close_subject("alice", 4003, "removed"), 3);
        assert_eq!(p.subs.close_subject("carol", 4003, ""), 0);
        p.drive();
        for i in alice.into_iter().chain([many]) {
            let got = p.clients[i].take();
            assert_eq!(got.last(), Some(&Got::Close(Some(4003), "removed".into())));
        }
        for i in [bob, nobody] {
            assert_eq!(p.clients[i].take(), []);
        }
        assert_eq!(p.subs.subscribers_of("x"), 2);
        assert_eq!(
            (p.subs.subscribers_of("y"), p.subs.subscribers_of("z")),
            (0, 0)
        );
        // Once their closing handshakes end, only bob's subject is kept.
        for i in alice.into_iter().chain([many]) {
            p.clients[i].close(4003);
        }
        p.drive();
        assert_eq!(p.subs.subject_counts(), (1, 1));
        // Closed already: not counted twice.
        assert_eq!(p.subs.close_subject("alice", 4003, ""), 0);
    }

    use std::rc::Rc;
}
