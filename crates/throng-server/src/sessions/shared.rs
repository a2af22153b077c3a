//! Sessions kept in Redis (`--redis`, pattern mode, one Redis), sans I/O:
//! what [`Sessions`] asks of Redis ([`Ask`]) when a session parks, resumes
//! or ends, and how it answers a resume once Redis replied and the mark
//! came ([`crate::redis::mqtt_sessions`] has the scripts).
//!
//! A park: the script writes the record and indexes its filters (from
//! then on every publish queues for it), and publishes a mark. At the
//! mark, every message relayed before it has reached this node: those
//! after the connection's last finished fan-out that a filter matches,
//! behind the deliveries it had not received, go in front of the queue
//! ([`Ask::Front`]), which makes the session ready.
//!
//! A resume: the take script hands back the record and the queue and
//! removes them, with a mark. Messages relayed after the mark were
//! published after the take: those a filter matches follow the queue in
//! the answer, and the connection is in the worker's tables from the
//! answer on. A take that finds its park not ready yet is asked again at
//! the next tick, and after [`WAIT_MS`] taken as it is (the parking node
//! died between its park and its front).

use std::collections::{HashMap, VecDeque};

use super::{Owner, Parked, Reply, Sessions, WAIT_MS};
use crate::control::{Message, SessionOpen, SessionPark, SessionSub};
use crate::redis::mqtt_sessions::{Filter, Record};

/// How long a park waits for its mark before it is forgotten (its
/// session stays not ready: a resume takes it after [`WAIT_MS`]).
const MARK_MS: u64 = 10_000;

/// Messages for a session: each with the QoS it goes at and the packet
/// id it was sent with (0: never).
pub(crate) type Queue = Vec<(Message, u8, u16)>;

/// What the sessions ask of Redis.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Keep session `hash` away for `ttl_ms`, its filters indexed, unless
    /// a connection other than `owner`'s holds it now.
    Park {
        hash: u64,
        nonce: u64,
        ttl_ms: u64,
        owner: u64,
        record: Record,
        indexed: Vec<Filter>,
    },
    /// Put these (message, QoS, packet id) in front of park `nonce`'s queue.
    Front {
        hash: u64,
        nonce: u64,
        entries: Queue,
    },
    /// Take session `hash` out of Redis; owned by `nonce` then, for `ttl_ms`.
    Take {
        hash: u64,
        nonce: u64,
        force: bool,
        ttl_ms: u64,
    },
    /// End session `hash`: `clean` (a clean start) whoever owns it, owned
    /// by `token` for `ttl_ms` then (0: nobody); else if `token` owns it.
    Drop {
        hash: u64,
        token: u64,
        clean: bool,
        ttl_ms: u64,
    },
}

/// What a take brought, messages already read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TakeAnswer {
    /// No session in Redis.
    Nothing,
    /// Its park is not ready yet: ask again.
    NotReady,
    /// The session, with its queue (message, QoS, packet id).
    Session(Record, Queue),
    /// Redis could not answer: the client starts afresh.
    Failed,
}

/// A resume waiting for Redis.
struct Taking {
    hash: u64,
    owner: Owner,
    since: u64,
    /// Ask again at the next tick.
    again: bool,
    /// The take's answer, once read.
    session: Option<(Record, Queue)>,
    /// When the answer came (ms), to stop waiting for a lost mark.
    answered: u64,
    /// The last relayed message before the mark, once it came.
    mark: Option<u64>,
    /// How long the connection holds the session in Redis: 0 when it
    /// ends with the connection (its park never comes).
    ttl_ms: u64,
}

/// A park waiting for its mark.
struct Parking {
    hash: u64,
    subs: Vec<SessionSub>,
    /// Deliveries not received, with their QoS and packet ids.
    pending: Queue,
    through: u64,
    since: u64,
}

/// The sessions' side of Redis.
pub(super) struct Shared {
    next: u64,
    asks: Vec<Ask>,
    taking: HashMap<u64, Taking>,
    parking: HashMap<u64, Parking>,
    /// Asks sent and not answered yet.
    unanswered: usize,
    /// Each connected session's token in Redis (its take's or clean
    /// start's nonce), for its park.
    tokens: HashMap<u64, u64>,
    /// How long a connected session's token holds it (`--mqtt-session-expiry`).
    ttl_ms: u64,
}

impl Shared {
    pub(super) fn new(ttl_ms: u64) -> Self {
        Self {
            tokens: HashMap::new(),
            ttl_ms,
            // Nonces are heard by every node: each starts at random.
            next: fastrand::u64(1..u64::MAX / 2),
            asks: Vec::new(),
            taking: HashMap::new(),
            parking: HashMap::new(),
            unanswered: 0,
        }
    }

    /// Whether a park or take waits: the relayed messages are kept.
    pub(super) fn busy(&self) -> bool {
        !self.taking.is_empty() || !self.parking.is_empty()
    }

    fn nonce(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

fn record(subs: &[SessionSub], releases: Vec<u16>, received: Vec<u16>) -> Record {
    Record {
        subs: subs.iter().map(|s| (s.filter.clone(), s.options)).collect(),
        releases,
        received,
    }
}

impl Sessions {
    /// Keeps sessions in Redis from now on (before any connection).
    pub fn keep_in_redis(&mut self) {
        self.shared = Some(Shared::new(u64::from(self.limits.max_expiry) * 1000));
    }

    /// What to ask of Redis now, in order.
    pub(crate) fn take_asks(&mut self) -> Vec<Ask> {
        let Some(s) = &mut self.shared else {
            return Vec::new();
        };
        s.unanswered += s.asks.len();
        std::mem::take(&mut s.asks)
    }

    /// Redis answered one of the asks (`ok`: as asked, else refused or
    /// lost with the link).
    pub fn answered(&mut self, ok: bool) {
        if let Some(s) = &mut self.shared {
            s.unanswered = s.unanswered.saturating_sub(1);
        }
        if !ok {
            self.stats.store_failed += 1;
        }
    }

    /// Whether parks are still on their way to Redis (a node that stops
    /// waits for them, a little).
    pub fn settling(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| !s.parking.is_empty() || s.unanswered > 0 || !s.asks.is_empty())
    }

    /// Whether `nonce` is a take of this node's waiting for its reply.
    pub fn is_take(&self, nonce: u64) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| s.taking.contains_key(&nonce))
    }

    /// `o` resumes a session this node does not hold: asked of Redis.
    pub(super) fn open_shared(&mut self, owner: Owner, o: &SessionOpen, now: u64) -> bool {
        let Some(s) = &mut self.shared else {
            return false;
        };
        let nonce = s.nonce();
        // A session that ends with this connection is parked by no one:
        // it holds nothing in Redis.
        let ttl_ms = if o.persistent { s.ttl_ms } else { 0 };
        s.asks.push(Ask::Take {
            hash: o.hash,
            nonce,
            force: false,
            ttl_ms,
        });
        if o.persistent {
            s.tokens.insert(o.hash, nonce);
        }
        s.taking.insert(
            nonce,
            Taking {
                hash: o.hash,
                owner,
                since: now,
                again: false,
                session: None,
                answered: 0,
                mark: None,
                ttl_ms,
            },
        );
        true
    }

    /// A clean start ends the session in Redis too; a persistent one owns
    /// the new session from then on.
    pub(super) fn drop_shared(&mut self, hash: u64, persistent: bool) {
        if let Some(s) = &mut self.shared {
            let token = s.nonce();
            let ttl_ms = if persistent { s.ttl_ms } else { 0 };
            if persistent {
                s.tokens.insert(hash, token);
            }
            s.asks.push(Ask::Drop {
                hash,
                token,
                clean: true,
                ttl_ms,
            });
        }
    }

    /// `p`'s session goes to Redis (`false`: sessions are the node's).
    pub(super) fn park_shared(&mut self, p: SessionPark, expiry: u32, now: u64) -> bool {
        let Some(s) = &mut self.shared else {
            return false;
        };
        let owner = s.tokens.remove(&p.hash).unwrap_or(0);
        if expiry == 0 {
            // It ends with its connection: so does its hold in Redis.
            s.asks.push(Ask::Drop {
                hash: p.hash,
                token: owner,
                clean: false,
                ttl_ms: 0,
            });
            return true;
        }
        let nonce = s.nonce();
        self.stats.stored += 1;
        let indexed = p
            .subs
            .iter()
            .filter(|f| !f.filter.starts_with("$share/"))
            .map(|f| (f.filter.clone(), f.options))
            .collect();
        s.asks.push(Ask::Park {
            hash: p.hash,
            nonce,
            ttl_ms: u64::from(expiry) * 1000,
            owner,
            record: record(&p.subs, p.releases, p.received),
            indexed,
        });
        let pending = p
            .pending
            .into_iter()
            .enumerate()
            .map(|(k, m)| {
                let qos = super::qos_of(&m).max(1);
                (m, qos, p.ids.get(k).copied().unwrap_or(0))
            })
            .collect();
        s.parking.insert(
            nonce,
            Parking {
                hash: p.hash,
                subs: p.subs,
                pending,
                through: p.through,
                since: now,
            },
        );
        true
    }

    /// A mark came (any node's), after the messages relayed before it.
    pub fn on_mark(&mut self, kind: u8, nonce: u64, now: u64) -> Option<Reply> {
        let last = self.last;
        match kind {
            b'p' => {
                let p = self.shared.as_mut()?.parking.remove(&nonce)?;
                let mut entries = p.pending;
                for (m, qos) in self.matched(&p.subs, p.through, last) {
                    entries.push((m, qos, 0));
                }
                let s = self.shared.as_mut()?;
                s.asks.push(Ask::Front {
                    hash: p.hash,
                    nonce,
                    entries,
                });
                None
            }
            _ => {
                let t = self.shared.as_mut()?.taking.get_mut(&nonce)?;
                t.mark = Some(last);
                if t.session.is_some() {
                    return self.finish(nonce, now);
                }
                None
            }
        }
    }

    /// Take `nonce` was answered.
    pub(crate) fn on_taken(&mut self, nonce: u64, answer: TakeAnswer, now: u64) -> Option<Reply> {
        let t = self.shared.as_mut()?.taking.get_mut(&nonce)?;
        match answer {
            TakeAnswer::NotReady => {
                t.again = true;
                None
            }
            TakeAnswer::Session(r, q) => {
                t.session = Some((r, q));
                t.answered = now;
                if t.mark.is_some() {
                    return self.finish(nonce, now);
                }
                None
            }
            TakeAnswer::Nothing | TakeAnswer::Failed => {
                let t = self.shared.as_mut()?.taking.remove(&nonce)?;
                Some(self.reply(t.owner, None, now))
            }
        }
    }

    /// Asks again for takes whose park was not ready, gives up on marks
    /// that never came.
    pub(super) fn tick_shared(&mut self, now: u64) -> Vec<Reply> {
        let Some(s) = &mut self.shared else {
            return Vec::new();
        };
        s.parking
            .retain(|_, p| now.saturating_sub(p.since) < MARK_MS);
        let mut asks = Vec::new();
        let mut lost = Vec::new();
        for (&nonce, t) in &mut s.taking {
            if t.again {
                t.again = false;
                let force = now.saturating_sub(t.since) >= WAIT_MS;
                asks.push(Ask::Take {
                    hash: t.hash,
                    nonce,
                    force,
                    ttl_ms: t.ttl_ms,
                });
            }
            if t.session.is_some() && now.saturating_sub(t.answered) >= WAIT_MS {
                // The mark was lost with the subscriber connection: what
                // was relayed meanwhile is all there is.
                lost.push(nonce);
            }
        }
        s.asks.extend(asks);
        let last = self.last;
        let mut out = Vec::new();
        for nonce in lost {
            if let Some(t) = self.shared.as_mut().and_then(|s| s.taking.get_mut(&nonce)) {
                t.mark = Some(last);
            }
            out.extend(self.finish(nonce, now));
        }
        out
    }

    /// A worker died: its resumes waiting for Redis go with it.
    pub(super) fn worker_gone_shared(&mut self, worker: usize, gone: &[u64]) {
        if let Some(s) = &mut self.shared {
            s.taking.retain(|_, t| t.owner.worker != worker);
            // Their sessions died with the worker: their clients' next
            // CONNECT need not wait for a park that never comes.
            for &hash in gone {
                if let Some(token) = s.tokens.remove(&hash) {
                    s.asks.push(Ask::Drop {
                        hash,
                        token,
                        clean: false,
                        ttl_ms: 0,
                    });
                }
            }
        }
    }

    /// The answer to take `nonce`: its queue, then what was relayed after
    /// its mark that a filter matches.
    fn finish(&mut self, nonce: u64, now: u64) -> Option<Reply> {
        let t = self.shared.as_mut()?.taking.remove(&nonce)?;
        let (record, queue) = t.session?;
        let subs: Vec<SessionSub> = record
            .subs
            .into_iter()
            .map(|(filter, options)| SessionSub { filter, options })
            .collect();
        let mut kept: VecDeque<(Message, u64, u16)> = queue
            .into_iter()
            .map(|(m, qos, id)| (super::at_qos(&m, qos), now, id))
            .collect();
        let after = t.mark.unwrap_or(self.last);
        for (m, qos) in self.matched(&subs, after, self.last) {
            kept.push_back((super::at_qos(&m, qos), now, 0));
        }
        let p = Parked {
            subs,
            queue: kept,
            releases: record.releases,
            received: record.received,
            bytes: 0,
            expires_at: 0,
        };
        Some(self.reply(t.owner, Some(p), now))
    }
}
