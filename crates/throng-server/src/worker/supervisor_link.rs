//! The worker's end of its control socket to the supervisor (not a Redis
//! link, nor a client's stream), as its tasks and HTTP routes use it: ask
//! the supervisor to relay a publish and wait for the count, ask for the
//! `/metrics` text, remember the broker's last state (for `/healthz`), send
//! counter snapshots and channel interest.
//!
//! Records go out through a channel to one writer task; the answers the
//! control loop reads are handed back here by request id.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::addresses::{Source, Verdict};
use crate::control::{API_READ, ApiRecord, Leg, Message, Record};
use crate::history::{Kept, MessageId};
use crate::metrics::Counters;

/// How long `/metrics` waits for the supervisor.
const METRICS_WAIT: Duration = Duration::from_secs(5);

/// What a history read found: whether nothing after `since` was dropped,
/// and the kept messages.
pub(crate) type KeptAfter = (bool, Vec<Kept>);

/// The Redis broker's state as the supervisor last described it.
struct BrokerState {
    up: bool,
    /// How long it had been down when the supervisor said so.
    down: Duration,
    text: String,
    /// When the supervisor said so.
    at: Instant,
}

/// A publish the supervisor relayed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Published {
    /// Subscribers it reached over all workers (with Redis: receivers Redis counted).
    pub(crate) subscribers: u64,
    /// Its id ([`MessageId::NONE`] when Redis relays it: each node numbers it).
    pub(crate) message: MessageId,
}

/// Why a publish through the supervisor did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PublishError {
    /// The supervisor could not publish it (Redis is down, the message is
    /// too large for it, ...): its reason.
    #[error("cannot publish: {0}")]
    Refused(String),
    /// The supervisor is gone (the worker is about to drain).
    #[error("supervisor unavailable")]
    Gone,
}

/// The record of publish request `message`: retained (at QoS `retain`) or not.
fn publish_record(message: Message, retain: Option<u8>) -> Record {
    match retain {
        Some(qos) => Record::PublishRetained { qos, message },
        None => Record::Publish(message),
    }
}

/// One worker's link to its supervisor.
pub(crate) struct SupervisorLink {
    index: usize,
    counters: Rc<Counters>,
    /// Whether channel interest is reported (Redis channels mode).
    report_interest: bool,
    ctl: mpsc::UnboundedSender<Bytes>,
    next_request: Cell<u64>,
    pending_publish: RefCell<HashMap<u64, oneshot::Sender<Result<Published, PublishError>>>>,
    pending_metrics: RefCell<HashMap<u64, oneshot::Sender<Bytes>>>,
    pending_admit: RefCell<HashMap<u64, oneshot::Sender<Verdict>>>,
    /// Server API questions (`/api/...`) waiting for the merged answer.
    pending_api: RefCell<HashMap<u64, oneshot::Sender<Bytes>>>,
    /// `GET /api/history` reads waiting for the history, by their
    /// recovery id ([`API_READ`] set).
    pending_history: RefCell<HashMap<u64, oneshot::Sender<KeptAfter>>>,
    /// The broker's last state from the supervisor (Redis only).
    broker: RefCell<Option<BrokerState>>,
}

impl SupervisorLink {
    /// The link of worker `index` whose records go to `ctl`.
    pub(crate) fn new(
        index: usize,
        counters: Rc<Counters>,
        report_interest: bool,
        ctl: mpsc::UnboundedSender<Bytes>,
    ) -> Self {
        Self {
            index,
            counters,
            report_interest,
            ctl,
            next_request: Cell::new(1),
            pending_publish: RefCell::default(),
            pending_metrics: RefCell::default(),
            pending_admit: RefCell::default(),
            pending_api: RefCell::default(),
            pending_history: RefCell::default(),
            broker: RefCell::default(),
        }
    }

    /// The worker's index.
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Sends a record to the supervisor (dropped if it is gone).
    pub(crate) fn send(&self, rec: &Record) {
        let _ = self.ctl.send(rec.encode());
    }

    fn request_id(&self) -> u64 {
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        id
    }

    /// Takes an answer to one of this link's requests, or the broker's
    /// state; gives back any other record.
    pub(crate) fn on_record(&self, rec: Record) -> Option<Record> {
        match rec {
            Record::Published { id, .. } | Record::PublishFailed { id, .. }
                if !self.pending_publish.borrow().contains_key(&id) =>
            {
                // An MQTT client's publish: the subscribers acknowledge it.
                return Some(rec);
            }
            Record::Published {
                id,
                subscribers,
                message,
            } => {
                if let Some(tx) = self.pending_publish.borrow_mut().remove(&id) {
                    let _ = tx.send(Ok(Published {
                        subscribers,
                        message,
                    }));
                }
            }
            Record::PublishFailed { id, reason } => {
                if let Some(tx) = self.pending_publish.borrow_mut().remove(&id) {
                    let reason = String::from_utf8_lossy(&reason).into_owned();
                    let _ = tx.send(Err(PublishError::Refused(reason)));
                }
            }
            Record::Broker { up, down_ms, text } => {
                *self.broker.borrow_mut() = Some(BrokerState {
                    up,
                    down: Duration::from_millis(down_ms),
                    text: String::from_utf8_lossy(&text).into_owned(),
                    at: Instant::now(),
                });
            }
            Record::Metrics { id, text } => {
                if let Some(tx) = self.pending_metrics.borrow_mut().remove(&id) {
                    let _ = tx.send(text);
                }
            }
            Record::Admitted { id, verdict } => {
                if let Some(tx) = self.pending_admit.borrow_mut().remove(&id) {
                    let _ = tx.send(verdict);
                }
            }
            Record::Api(r) if r.leg == Leg::Answer => {
                if let Some(tx) = self.pending_api.borrow_mut().remove(&r.id) {
                    let _ = tx.send(r.body);
                }
            }
            Record::Recovered {
                id,
                complete,
                messages,
            } if id & API_READ != 0 => {
                if let Some(tx) = self.pending_history.borrow_mut().remove(&id) {
                    let _ = tx.send((complete, messages));
                }
            }
            other => return Some(other),
        }
        None
    }

    /// Asks the supervisor a server API question (JSON, a
    /// [`crate::api::Query`]); resolves to the merged answer's JSON, or
    /// `None` when the supervisor did not answer within [`METRICS_WAIT`].
    pub(crate) async fn api(&self, query: Bytes) -> Option<Bytes> {
        let id = self.request_id();
        let (tx, rx) = oneshot::channel();
        self.pending_api.borrow_mut().insert(id, tx);
        let rec = Record::Api(ApiRecord {
            leg: Leg::Ask,
            id,
            body: query,
        });
        let answer = match self.ctl.send(rec.encode()) {
            Ok(()) => tokio::time::timeout(METRICS_WAIT, rx).await.ok()?.ok(),
            Err(_) => None,
        };
        self.pending_api.borrow_mut().remove(&id);
        answer
    }

    /// Reads what `channel` kept after `since` (the embedded history or
    /// Redis, as a reconnecting subscriber's recovery does): whether
    /// nothing after `since` was dropped, and the messages; `None` when the
    /// supervisor did not answer in time.
    pub(crate) async fn history(&self, channel: &str, since: MessageId) -> Option<KeptAfter> {
        let id = self.request_id() | API_READ;
        let (tx, rx) = oneshot::channel();
        self.pending_history.borrow_mut().insert(id, tx);
        self.recover(id, channel, since);
        let answer = tokio::time::timeout(METRICS_WAIT, rx).await.ok()?.ok();
        self.pending_history.borrow_mut().remove(&id);
        answer
    }

    /// Asks the supervisor to relay a message (also its channel's retained
    /// message when `retain` holds its QoS); resolves to the number of
    /// subscribers it reached over all workers (with Redis: the receivers
    /// Redis counted) and its id, or why it could not be published.
    pub(crate) async fn publish(
        &self,
        channel: &str,
        text: bool,
        payload: Bytes,
        retain: Option<u8>,
    ) -> Result<Published, PublishError> {
        let id = self.request_id();
        let (tx, rx) = oneshot::channel();
        self.pending_publish.borrow_mut().insert(id, tx);
        let message = Message {
            id,
            message: MessageId::NONE,
            text,
            at_most_once: false,
            exactly_once: false,
            properties: Bytes::new(),
            retained: false,
            origin: 0,
            channel: channel.to_owned(),
            payload,
        };
        let rec = publish_record(message, retain);
        if self.ctl.send(rec.encode()).is_err() {
            self.pending_publish.borrow_mut().remove(&id);
            return Err(PublishError::Gone);
        }
        rx.await.unwrap_or(Err(PublishError::Gone))
    }

    /// Asks the supervisor to relay a message whose answer no task waits
    /// for (an MQTT client's PUBLISH): its answer, under an id no request
    /// holds, is given back by [`Self::on_record`] for the subscribers;
    /// its id is set here and returned.
    pub(crate) fn publish_unanswered(&self, mut message: Message, retain: Option<u8>) -> u64 {
        let id = self.request_id();
        message.id = id;
        self.send(&publish_record(message, retain));
        id
    }

    /// Asks the supervisor for what `channel` kept after `since` (rejoin
    /// `request`); the answer goes to the subscribers.
    pub(crate) fn recover(&self, request: u64, channel: &str, since: MessageId) {
        self.send(&Record::Recover {
            id: request,
            since,
            channel: channel.to_owned(),
        });
    }

    /// Asks the supervisor whether a new connection from `source` may be
    /// served (per-address limits). With no supervisor to ask, it may: the
    /// worker is about to drain anyway.
    pub(crate) async fn admit(&self, source: Source) -> Verdict {
        let id = self.request_id();
        let (tx, rx) = oneshot::channel();
        self.pending_admit.borrow_mut().insert(id, tx);
        if self
            .ctl
            .send(Record::Admit { id, source }.encode())
            .is_err()
        {
            self.pending_admit.borrow_mut().remove(&id);
            return Verdict::Admit;
        }
        rx.await.unwrap_or(Verdict::Admit)
    }

    /// Tells the supervisor that an admitted connection from `source` ended.
    pub(crate) fn release(&self, source: Source) {
        self.send(&Record::Release { source });
    }

    /// Asks the supervisor for the Prometheus text of all workers.
    pub(crate) async fn metrics(&self) -> Option<Bytes> {
        let id = self.request_id();
        let (tx, rx) = oneshot::channel();
        self.pending_metrics.borrow_mut().insert(id, tx);
        self.send_snapshot();
        if self
            .ctl
            .send(Record::MetricsRequest { id }.encode())
            .is_err()
        {
            self.pending_metrics.borrow_mut().remove(&id);
            return None;
        }
        match tokio::time::timeout(METRICS_WAIT, rx).await {
            Ok(Ok(text)) => Some(text),
            _ => {
                self.pending_metrics.borrow_mut().remove(&id);
                None
            }
        }
    }

    /// Sends this worker's counters (and its RSS) to the supervisor.
    pub(crate) fn send_snapshot(&self) {
        let snap = self.counters.snapshot(
            self.index,
            std::process::id(),
            throng_host::process::rss_bytes(),
        );
        if let Ok(json) = serde_json::to_vec(&snap) {
            let _ = self.ctl.send(Record::Snapshot(Bytes::from(json)).encode());
        }
    }

    /// Redis channels mode: the supervisor subscribes this node to a channel
    /// while some worker has subscribers of it.
    pub(crate) fn interest(&self, channel: &str, subscribed: bool) {
        if self.report_interest {
            self.send(&Record::Interest {
                channel: channel.to_owned(),
                subscribed,
            });
        }
    }

    /// The `/healthz` line about the Redis broker (empty with the local relay).
    /// The node stays healthy while Redis is away: its subscribers are kept and
    /// get messages again once it is back; a load balancer that should steer new
    /// subscribers away can check for `broker: up` (docs/deploy.md).
    pub(crate) fn broker_health(&self) -> String {
        match &*self.broker.borrow() {
            None => String::new(),
            Some(b) if b.up => format!("broker: {}\n", b.text),
            Some(b) => format!(
                "broker: down for {:.1}s ({})\n",
                (b.down + b.at.elapsed()).as_secs_f64(),
                b.text
            ),
        }
    }
}
