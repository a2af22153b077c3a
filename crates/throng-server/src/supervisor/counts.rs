//! The supervisor's side of the server API across nodes
//! ([`crate::redis::counts`]): every [`WRITE_EVERY`] it asks its workers
//! for every channel's count and hands them to the counts link; an API
//! question about counts, once the workers answered, waits for the other
//! nodes' counts before it is answered with `"scope":"cluster"` (or, when
//! Redis cannot be read, with this node's alone). A disconnect is relayed
//! the same way: closed here first, then on every other live node, which
//! each say how many they closed.

use std::collections::HashMap;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{Event, Supervisor};
use crate::api::{Asker, Done, Nodes, Query};
use crate::redis::RedisSettings;
use crate::redis::counts::{self, CountsCmd, CountsNews, Order, Relayed, WRITE_EVERY};

/// The asker of the supervisor's own question: every channel's count.
const OWN: Asker = Asker {
    slot: usize::MAX,
    generation: 0,
    request: 0,
};

/// The asker of a disconnect another node relayed (`request`: its number here).
const ORDER: u64 = 1;

/// The counts link and the API answers waiting for it.
pub(super) struct Counts {
    pub(super) tx: mpsc::UnboundedSender<CountsCmd>,
    /// This node's name in Redis.
    id: String,
    /// API questions about counts or disconnects, by asker, until the workers answered.
    asked: HashMap<(usize, u64, u64), Query>,
    /// Answers waiting for the other nodes, by read id.
    reading: HashMap<u64, (Done, Query)>,
    /// Relayed orders being carried out here, by their number here.
    orders: HashMap<u64, String>,
    next: u64,
    /// Seconds of the supervisor's 1 s tick since the last write.
    ticks: u64,
    /// Presence events handed to the link and not yet published.
    pub(super) relaying: usize,
    /// Presence events not relayed: too many were waiting.
    pub(super) presence_dropped: u64,
}

impl Supervisor {
    /// Starts the counts link beside the broker (`--redis`).
    pub(super) fn start_counts(&mut self, settings: RedisSettings) {
        let (tx, rx) = mpsc::unbounded_channel();
        let events = self.events.clone();
        let id = counts::node_id();
        tokio::task::spawn_local(counts::run(settings, id.clone(), rx, move |news| {
            let _ = events.send(Event::Counts(news));
        }));
        self.counts = Some(Counts {
            tx,
            id,
            asked: HashMap::new(),
            reading: HashMap::new(),
            orders: HashMap::new(),
            next: 0,
            ticks: 0,
            relaying: 0,
            presence_dropped: 0,
        });
    }

    /// The supervisor's 1 s tick: every [`WRITE_EVERY`], ask the workers
    /// for every channel's count (the answer goes to Redis).
    pub(super) fn counts_tick(&mut self) {
        let Some(c) = &mut self.counts else {
            return;
        };
        c.ticks += 1;
        if c.ticks < WRITE_EVERY.as_secs() {
            return;
        }
        c.ticks = 0;
        let all = Query::Channels {
            prefix: String::new(),
            after: String::new(),
            limit: usize::MAX - 1,
        };
        let body = Bytes::from(serde_json::to_vec(&all).unwrap_or_default());
        self.api_ask(OWN, &all, body);
    }

    /// An API question arrived: counts and disconnects cover every node.
    pub(super) fn counts_asked(&mut self, to: Asker, query: &Query) {
        if let Some(c) = &mut self.counts {
            c.asked
                .insert((to.slot, to.generation, to.request), query.clone());
        }
    }

    /// The workers answered `done`: the supervisor's own questions go to
    /// Redis, an API question waits for the other nodes; `Some`: answer
    /// it now.
    pub(super) fn counts_answer(&mut self, done: Done) -> Option<Done> {
        let Some(c) = &mut self.counts else {
            return (done.to.slot != OWN.slot).then_some(done);
        };
        let to = done.to;
        if to == OWN {
            let _ = c.tx.send(CountsCmd::Write {
                counts: done.part.channels,
                presence: self.presence.snapshot(),
            });
            return None;
        }
        if to.slot == OWN.slot {
            if let Some(req) = c.orders.remove(&to.request) {
                let closed = done.part.closed;
                let _ = c.tx.send(CountsCmd::Closed { req, closed });
            }
            return None;
        }
        let Some(query) = c.asked.remove(&(to.slot, to.generation, to.request)) else {
            return Some(done);
        };
        c.next += 1;
        let id = c.next;
        let order = |channel: &str, sub: Option<&String>, code: u16, reason: &str| Order {
            req: format!("{}-{id}", c.id),
            from: c.id.clone(),
            channel: channel.to_owned(),
            code,
            reason: reason.to_owned(),
            sub: sub.cloned(),
        };
        let cmd = match &query {
            Query::Disconnect {
                channel,
                code,
                reason,
            } => CountsCmd::Disconnect {
                id,
                order: order(channel, None, *code, reason),
            },
            Query::DisconnectSubject { sub, code, reason } => CountsCmd::Disconnect {
                id,
                order: order("", Some(sub), *code, reason),
            },
            _ => CountsCmd::Read {
                id,
                query: query.clone(),
                presence: done.part.presence.is_some(),
            },
        };
        if c.tx.send(cmd).is_err() {
            return Some(done);
        }
        c.reading.insert(id, (done, query));
        None
    }

    /// News from the counts link.
    pub(super) fn counts_news(&mut self, news: CountsNews) {
        match news {
            CountsNews::Counts(id, got) => {
                let Some((mut done, query)) = self.waiting(id) else {
                    return;
                };
                if let Ok(remote) = got {
                    counts::merge(&mut done.part, remote, &query);
                    done.part.scope = Some("cluster".to_owned());
                }
                self.api_reply(done);
            }
            CountsNews::Relayed(id, got) => {
                let Some((mut done, _)) = self.waiting(id) else {
                    return;
                };
                if let Ok(Relayed {
                    closed,
                    asked,
                    answered,
                }) = got
                {
                    done.part.closed += closed;
                    done.part.scope = Some("cluster".to_owned());
                    done.part.nodes = Some(Nodes { asked, answered });
                }
                self.api_reply(done);
            }
            CountsNews::Order(order) => self.carry_out(order),
            CountsNews::Presence(e) => self.presence_deliver(&e),
            CountsNews::PresenceSent => {
                if let Some(c) = &mut self.counts {
                    c.relaying = c.relaying.saturating_sub(1);
                }
            }
        }
    }

    fn waiting(&mut self, id: u64) -> Option<(Done, Query)> {
        self.counts.as_mut()?.reading.remove(&id)
    }

    /// Another node relayed a disconnect: close this node's subscribers of
    /// the channel, then say how many ([`Supervisor::counts_answer`]).
    fn carry_out(&mut self, order: Order) {
        let Some(c) = &mut self.counts else {
            return;
        };
        c.next += 1;
        let n = c.next;
        c.orders.insert(n, order.req);
        let q = match order.sub {
            Some(sub) => Query::DisconnectSubject {
                sub,
                code: order.code,
                reason: order.reason,
            },
            None => Query::Disconnect {
                channel: order.channel,
                code: order.code,
                reason: order.reason,
            },
        };
        let body = Bytes::from(serde_json::to_vec(&q).unwrap_or_default());
        let to = Asker {
            slot: OWN.slot,
            generation: ORDER,
            request: n,
        };
        self.api_ask(to, &q, body);
    }
}
