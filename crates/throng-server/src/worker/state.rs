//! What one worker owns, shared by its tasks (the control loop, the
//! accept loops, the epoll reactor, the tick, one task per HTTP
//! connection): its settings, counters, subscribers and supervisor link.
//! Nothing here is shared between threads or locked.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::rc::Rc;

use throng_host::poll::{Interest, Poller};
use throng_host::shared::SharedCounters;
use tokio::sync::Notify;

use super::conn::NONE;
use super::ping_answer::Answer;
use super::recurring::Recurring;
use super::sleepers::Sleepers;
use super::subscribers::{Outside, Subscribers};
use super::supervisor_link::SupervisorLink;
use crate::addresses::Source;
use crate::auth::{PublishKey, Verifier};
use crate::config::Config;
use crate::control::{Claim, Message, Record};
use crate::history::MessageId;
use crate::metrics::Counters;
use crate::retained::RetainedMessage;
use crate::tls::park::Parked;

/// Everything one worker owns.
pub(crate) struct Worker {
    pub(crate) cfg: Config,
    pub(crate) index: usize,
    pub(crate) counters: Rc<Counters>,
    pub(crate) subs: Subscribers<Around>,
    pub(crate) supervisor: Rc<SupervisorLink>,
    /// SIGTERM/SIGINT came: no new subscribers, no more fan-out.
    pub(crate) draining: Cell<bool>,
    /// Messages counted and answered for, still to be written, and
    /// retained answers behind them (in order).
    pub(crate) outbox: RefCell<VecDeque<Outgoing>>,
    /// Wakes the fan-out task when `outbox` gains a message.
    pub(crate) outbox_ready: Notify,
    /// `/ping` connections sleeping outside their task.
    pub(crate) sleepers: Sleepers<Sleeper>,
    /// Failing accepts (`EMFILE`), logged once and then counted.
    pub(crate) accept_errors: RefCell<Recurring>,
    /// Checks tokens, when keys are configured (SIGHUP may replace it).
    pub(crate) verifier: Reloadable<Rc<Verifier>>,
    /// The publish API key, when one is configured (SIGHUP may replace it).
    pub(crate) publish_key: Reloadable<Rc<PublishKey>>,
    /// The TLS settings of every TLS listener, once a SIGHUP replaced
    /// those they started with.
    pub(crate) tls: Reloadable<std::sync::Arc<rustls::ServerConfig>>,
    /// TLS connections waiting for a request out of their task (tls::park).
    pub(crate) parked: Parked<Waiting>,
}

/// Material a SIGHUP may replace ([`crate::reload`]): whoever uses it
/// takes a clone of what is current, so a reload never changes a check
/// halfway through.
pub(crate) struct Reloadable<T>(RefCell<Option<T>>);

impl<T: Clone> Reloadable<T> {
    pub(crate) fn new(value: Option<T>) -> Self {
        Self(RefCell::new(value))
    }

    /// What is current.
    pub(crate) fn get(&self) -> Option<T> {
        self.0.borrow().clone()
    }

    /// Replaces it.
    pub(crate) fn set(&self, value: Option<T>) {
        *self.0.borrow_mut() = value;
    }
}

/// What the fan-out task does next, in the order the supervisor sent it.
pub(crate) enum Outgoing {
    /// Write a message to its subscribers.
    Deliver(Message),
    /// Answer a retained ask: behind the fan-outs of every message
    /// relayed before it ([`super::mqtt_retain`]).
    Retained(u64, Vec<RetainedMessage>),
}

/// What one listener serves. The public listeners (`--listen`,
/// `--tls-listen`) serve subscriptions, `/healthz` and `/ping`, and
/// publishing and `/metrics` unless `--publish-listen` or `--metrics-listen`
/// moved them; an internal listener serves only what it was given, and
/// `/healthz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Serves {
    /// WebSocket upgrades, `/ping` and `/bench/floor`.
    pub(crate) subscribe: bool,
    /// `POST /publish/<channel>`.
    pub(crate) publish: bool,
    /// `GET /metrics`.
    pub(crate) metrics: bool,
    /// `/ping`, the test back end (it holds a connection up to an hour):
    /// on loopback addresses, elsewhere only with `--test-backend`.
    pub(crate) ping: bool,
}

impl Serves {
    /// The public listener of `cfg` on `addr`.
    pub(crate) fn public(cfg: &Config, addr: std::net::SocketAddr) -> Self {
        Self {
            subscribe: true,
            publish: cfg.publish_listen.is_empty(),
            metrics: cfg.metrics_listen.is_empty(),
            ping: cfg.test_backend || addr.ip().is_loopback(),
        }
    }

    /// The internal listener on `addr` (in `--publish-listen`,
    /// `--metrics-listen`, or both).
    pub(crate) fn internal(cfg: &Config, addr: std::net::SocketAddr) -> Self {
        Self {
            subscribe: false,
            publish: cfg.publish_listen.contains(&addr),
            metrics: cfg.metrics_listen.contains(&addr),
            ping: false,
        }
    }
}

/// One sleeping `/ping` connection ([`super::sleepers`]): what it takes
/// to go on with it.
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

impl AsRawFd for Sleeper {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

impl AsFd for Sleeper {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

/// What a parked TLS connection's HTTP phase goes on with when woken.
pub(crate) struct Waiting {
    pub(crate) serves: Serves,
    /// The client address it is counted under (per-address limits).
    pub(crate) source: Option<Source>,
    /// It is subject to per-address counting: counted under `source`, or,
    /// from a trusted proxy, to be counted under the client its upgrade's
    /// `X-Forwarded-For` names.
    pub(crate) ticketed: bool,
    /// No request was read yet: a timeout counts as a failed handshake.
    pub(crate) first: bool,
}

/// What the subscribers need around them in a worker: its one epoll set,
/// its supervisor link to report channel interest on, and what its subscribers are
/// counted under.
pub(crate) struct Around {
    pub(crate) poller: Poller,
    pub(crate) supervisor: Rc<SupervisorLink>,
    pub(crate) counted: Counted,
}

/// What a worker's connections are counted under where others see them:
/// each admitted connection's client address (per-address limits, counted
/// by the supervisor), and the node's subscribers under `--max-connections`
/// (one slot per worker in counters shared by every process).
pub(crate) struct Counted {
    /// This worker's slot in `places`.
    pub(crate) index: usize,
    /// The shared subscriber counts and the cap, with `--max-connections`.
    pub(crate) places: Option<(SharedCounters, u64)>,
    /// Subscribers this worker holds, and the most its files allow.
    own: Cell<u64>,
    own_cap: u64,
    /// Client addresses of subscribers that were admitted, by tag.
    sources: RefCell<Vec<Option<Source>>>,
    /// Tags free for reuse.
    free: RefCell<Vec<u32>>,
}

impl Counted {
    /// `own_cap`: the subscribers this worker's files allow (`None`: no cap).
    pub(crate) fn new(
        index: usize,
        places: Option<(SharedCounters, u64)>,
        own_cap: Option<u64>,
    ) -> Self {
        Self {
            index,
            places,
            own: Cell::new(0),
            own_cap: own_cap.unwrap_or(u64::MAX),
            sources: RefCell::default(),
            free: RefCell::default(),
        }
    }

    /// Takes one place for a new subscriber: under this worker's files and
    /// under `--max-connections`; false when either is full (a 503, not an
    /// `EMFILE` on the next accept).
    pub(crate) fn take_place(&self) -> bool {
        if self.own.get() >= self.own_cap {
            return false;
        }
        let taken = self
            .places
            .as_ref()
            .is_none_or(|(shared, cap)| shared.take_one(self.index, *cap));
        if taken {
            self.own.set(self.own.get() + 1);
        }
        taken
    }

    /// Gives back a place [`take_place`](Self::take_place) took.
    pub(crate) fn give_place(&self) {
        self.own.set(self.own.get().saturating_sub(1));
        if let Some((shared, _)) = &self.places {
            shared.give_one(self.index);
        }
    }

    /// The tag a subscriber admitted from `source` is counted under.
    pub(crate) fn tag(&self, source: Source) -> u32 {
        let mut sources = self.sources.borrow_mut();
        match self.free.borrow_mut().pop() {
            Some(t) => {
                sources[t as usize] = Some(source);
                t
            }
            None => {
                sources.push(Some(source));
                // Fewer subscribers than u32::MAX: each holds a file.
                (sources.len() - 1) as u32
            }
        }
    }

    /// A subscriber counted under `tag` is gone: its address goes back to
    /// the supervisor, its place to the node.
    pub(crate) fn release(&self, supervisor: &SupervisorLink, tag: u32) {
        if tag != NONE {
            let source = self
                .sources
                .borrow_mut()
                .get_mut(tag as usize)
                .and_then(Option::take);
            if let Some(source) = source {
                self.free.borrow_mut().push(tag);
                supervisor.release(source);
            }
        }
        self.give_place();
    }
}

impl Outside for Around {
    type Wire = TcpStream;

    fn watch(&self, wire: &TcpStream, slot: u32) -> io::Result<()> {
        self.poller.add(wire, u64::from(slot), Interest::Read)
    }

    fn want_write(&self, wire: &TcpStream, slot: u32, on: bool) {
        let interest = if on {
            Interest::ReadWrite
        } else {
            Interest::Read
        };
        let _ = self.poller.modify(wire, u64::from(slot), interest);
    }

    fn unwatch(&self, wire: &TcpStream) {
        // Not modified to no interest: a hang-up or an error would still
        // be reported, again and again (level-triggered).
        let _ = self.poller.remove(wire);
    }

    fn forget(&self, wire: &TcpStream, tag: u32) {
        let _ = self.poller.remove(wire);
        self.counted.release(&self.supervisor, tag);
    }

    fn channel_interest(&self, channel: &str, subscribed: bool) {
        self.supervisor.interest(channel, subscribed);
    }

    fn recover(&self, request: u64, channel: &str, since: MessageId) {
        self.supervisor.recover(request, channel, since);
    }

    fn publish(&self, m: Message, retain: Option<u8>) -> u64 {
        self.supervisor.publish_unanswered(m, retain)
    }

    fn origin(&self, slot: u32) -> u64 {
        (self.supervisor.index() as u64 + 1) << 32 | u64::from(slot)
    }

    fn client_id(&self, hash: u64, claim: Claim) {
        self.supervisor.send(&Record::ClientId { hash, claim });
    }

    fn session_open(&self, o: crate::control::SessionOpen) {
        self.supervisor.send(&Record::SessionOpen(o));
    }

    fn session_park(&self, p: crate::control::SessionPark) {
        self.supervisor.send(&Record::SessionPark(p));
    }

    fn share_member(&self, m: crate::control::ShareMember) {
        self.supervisor.send(&Record::ShareMember(m));
    }

    fn presence(&self, e: crate::control::PresenceEvent) {
        self.supervisor.send(&Record::Presence(e));
    }

    fn ask_retained(&self, request: u64, filters: Vec<String>) {
        self.supervisor.send(&Record::RetainedAsk {
            id: request,
            filters,
        });
    }
}
