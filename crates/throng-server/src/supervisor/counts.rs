//! The supervisor's side of subscriber counts across nodes
//! ([`crate::redis::counts`]): every [`WRITE_EVERY`] it asks its workers
//! for every channel's count and hands them to the counts link; an API
//! question about counts, once the workers answered, waits for the other
//! nodes' counts before it is answered with `"scope":"cluster"` (or, when
//! Redis cannot be read, with this node's alone).

use std::collections::HashMap;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{Event, Supervisor};
use crate::api::{Asker, Done, Query};
use crate::redis::RedisSettings;
use crate::redis::counts::{self, CountsCmd, WRITE_EVERY};

/// The asker of the supervisor's own question: every channel's count.
const OWN: Asker = Asker {
    slot: usize::MAX,
    generation: 0,
    request: 0,
};

/// The counts link and the API answers waiting for it.
pub(super) struct Counts {
    tx: mpsc::UnboundedSender<CountsCmd>,
    /// API questions about counts, by asker, until the workers answered.
    asked: HashMap<(usize, u64, u64), Query>,
    /// Answers waiting for the other nodes' counts, by read id.
    reading: HashMap<u64, (Done, Query)>,
    next: u64,
    /// Seconds of the supervisor's 1 s tick since the last write.
    ticks: u64,
}

impl Supervisor {
    /// Starts the counts link beside the broker (`--redis`).
    pub(super) fn start_counts(&mut self, settings: RedisSettings) {
        let (tx, rx) = mpsc::unbounded_channel();
        let events = self.events.clone();
        tokio::task::spawn_local(counts::run(
            settings,
            counts::node_id(),
            rx,
            move |id, r| {
                let _ = events.send(Event::Counts(id, r));
            },
        ));
        self.counts = Some(Counts {
            tx,
            asked: HashMap::new(),
            reading: HashMap::new(),
            next: 0,
            ticks: 0,
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

    /// An API question arrived: one about counts is answered cluster-wide.
    pub(super) fn counts_asked(&mut self, to: Asker, query: &Query) {
        if let Some(c) = &mut self.counts
            && matches!(query, Query::Channels { .. } | Query::Channel { .. })
        {
            c.asked
                .insert((to.slot, to.generation, to.request), query.clone());
        }
    }

    /// The workers answered `done`: the supervisor's own question goes to
    /// Redis, a question about counts waits for the other nodes'; `Some`:
    /// answer it now.
    pub(super) fn counts_answer(&mut self, done: Done) -> Option<Done> {
        let Some(c) = &mut self.counts else {
            return (done.to != OWN).then_some(done);
        };
        if done.to == OWN {
            let _ = c.tx.send(CountsCmd::Write(done.part.channels));
            return None;
        }
        let to = done.to;
        let Some(query) = c.asked.remove(&(to.slot, to.generation, to.request)) else {
            return Some(done);
        };
        c.next += 1;
        let id = c.next;
        if c.tx
            .send(CountsCmd::Read {
                id,
                query: query.clone(),
            })
            .is_err()
        {
            return Some(done);
        }
        c.reading.insert(id, (done, query));
        None
    }

    /// The other nodes' counts for read `id` (or why not): the answer goes out.
    pub(super) fn counts_read(&mut self, id: u64, got: Result<Vec<(String, u64)>, String>) {
        let Some((mut done, query)) = self.counts.as_mut().and_then(|c| c.reading.remove(&id))
        else {
            return;
        };
        if let Ok(remote) = got {
            counts::merge(&mut done.part, remote, &query);
            done.part.scope = Some("cluster".to_owned());
        }
        self.api_reply(done);
    }
}
