//! The targets a worker sends, each ready on the wire: every one built at
//! the worker's start, or (a targets file too large to hold, a
//! [`LazyFile`]) read from the file as the run takes them, holding only
//! those of the requests in flight.
//!
//! Either way request `seq` takes target `seq % count`. A worker takes its
//! requests in order (`index`, `index + workers`, ...), so its [`Cursor`]
//! reads on through the file, passing over the targets of the other
//! workers, and opens it again to go round.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use throng_proto::h2::hpack;

use super::Settings;
use super::targets::{Cursor, LazyFile, Target, TargetError};

/// One target ready to send.
pub(super) struct Armed {
    /// HTTP/1.1: the whole request (empty under HTTP/2).
    pub(super) wire: Rc<[u8]>,
    /// HTTP/2: the header block (empty under HTTP/1.1).
    pub(super) head: Rc<[u8]>,
    /// HTTP/2: the body, if any.
    pub(super) body: Option<Rc<[u8]>>,
    /// Its endpoint's pool.
    pub(super) pool: usize,
    pub(super) method: String,
    /// Its URL, for per-request rows and errors.
    pub(super) url: String,
}

impl Armed {
    /// `target`, encoded as `settings` say, on pool `pool`.
    fn new(target: &Target, pool: usize, settings: &Settings) -> Self {
        let none: Rc<[u8]> = Rc::from(&[][..]);
        let (wire, head, body) = if settings.http2.is_some() {
            let u = &target.url;
            let head = hpack::encode_request(
                &target.method,
                u.tls,
                &u.authority,
                &u.path,
                &target.headers,
                target.body.len(),
            );
            let body = (!target.body.is_empty()).then(|| Rc::from(target.body.as_slice()));
            (none, Rc::from(head), body)
        } else {
            (Rc::from(target.encode(settings.keepalive)), none, None)
        };
        Self {
            wire,
            head,
            body,
            pool,
            method: target.method.clone(),
            url: target.url.to_string(),
        }
    }
}

/// Where a target's connections go: host, port, TLS.
type EndpointKey = (String, u16, bool);

fn key_of(t: &Target) -> EndpointKey {
    (t.url.host.clone(), t.url.port, t.url.tls)
}

/// A worker's targets.
pub(super) enum Aims {
    /// Every target, built once.
    Held(Vec<Rc<Armed>>),
    /// Read from the file as the run takes them.
    Read(Box<RefCell<Reading>>),
}

/// The targets of a [`LazyFile`] in flight.
pub(super) struct Reading {
    cursor: Cursor,
    settings: Settings,
    /// Targets of requests in flight, with how many hold each.
    held: HashMap<usize, (Rc<Armed>, u32)>,
    /// Each endpoint's pool.
    pools: HashMap<EndpointKey, usize>,
}

impl Aims {
    /// Every one of `targets` (the `i`th on pool `pool_of[i]`), built now.
    pub(super) fn held(targets: &[Target], pool_of: &[usize], settings: &Settings) -> Self {
        Self::Held(
            targets
                .iter()
                .zip(pool_of)
                .map(|(t, &pool)| Rc::new(Armed::new(t, pool, settings)))
                .collect(),
        )
    }

    /// The targets of `file`, read as the run takes them; `firsts[i]` (on
    /// pool `pool_of[i]`) names each endpoint.
    pub(super) fn read(
        file: LazyFile,
        firsts: &[Target],
        pool_of: &[usize],
        settings: &Settings,
    ) -> Self {
        Self::Read(Box::new(RefCell::new(Reading {
            cursor: Cursor::new(file),
            settings: *settings,
            held: HashMap::new(),
            pools: firsts
                .iter()
                .map(key_of)
                .zip(pool_of.iter().copied())
                .collect(),
        })))
    }

    /// Targets taken in turn.
    pub(super) fn count(&self) -> u64 {
        match self {
            Self::Held(list) => list.len() as u64,
            Self::Read(r) => r.borrow().cursor.count(),
        }
    }

    /// The target of request `seq`.
    pub(super) fn index(&self, seq: u64) -> usize {
        (seq % self.count().max(1)) as usize
    }

    /// Request `seq` starts: its target is held until [`Aims::release`]
    /// (read from the file if no request in flight holds it). Requests are
    /// taken in order. Its index.
    pub(super) fn take(&self, seq: u64) -> Result<usize, TargetError> {
        let t = self.index(seq);
        let Self::Read(r) = self else {
            return Ok(t);
        };
        let mut r = r.borrow_mut();
        if let Some((_, holders)) = r.held.get_mut(&t) {
            *holders += 1;
            return Ok(t);
        }
        let target = r.cursor.read(t as u64)?;
        let Some(&pool) = r.pools.get(&key_of(&target)) else {
            return Err(TargetError::Changed(format!(
                "the targets file changed during the run: {} is on an endpoint it did not have at the start",
                target.url
            )));
        };
        let armed = Rc::new(Armed::new(&target, pool, &r.settings));
        r.held.insert(t, (armed, 1));
        Ok(t)
    }

    /// Target `t` of a request in flight (`None`: no such request).
    pub(super) fn get(&self, t: usize) -> Option<Rc<Armed>> {
        match self {
            Self::Held(list) => list.get(t).cloned(),
            Self::Read(r) => r.borrow().held.get(&t).map(|(a, _)| a.clone()),
        }
    }

    /// A request on target `t` ended.
    pub(super) fn release(&self, t: usize) {
        if let Self::Read(r) = self {
            let mut r = r.borrow_mut();
            if let Some((_, holders)) = r.held.get_mut(&t) {
                *holders -= 1;
                if *holders == 0 {
                    r.held.remove(&t);
                }
            }
        }
    }
}
