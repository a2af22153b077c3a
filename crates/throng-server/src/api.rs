//! The server API's questions to the workers and the merging of their
//! answers (`GET /api/channels`, `GET /api/channels/<c>`,
//! `POST /api/disconnect`; docs/api.md). Workers hold the subscriber
//! tables, so the supervisor asks each of them ([`crate::control::ApiRecord`])
//! and merges what they say here: a state machine without sockets or
//! clock, fed the question, the parts and the workers that went away.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// The most channels one `GET /api/channels` lists (`?limit=` at most this).
pub const MAX_LIMIT: usize = 1000;

/// What the supervisor asks every worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Query {
    /// The subscribers of each channel whose name starts with `prefix` and
    /// sorts after `after`: the first `limit + 1` names (one more tells
    /// whether there is a next page).
    Channels {
        prefix: String,
        after: String,
        limit: usize,
    },
    /// The subscribers of one channel (MQTT wildcard filters matching it included).
    Channel { name: String },
    /// Close every subscriber of `channel` with `code` and `reason`.
    Disconnect {
        channel: String,
        code: u16,
        reason: String,
    },
    /// Close every connection whose token's subject is `sub`, with `code`
    /// and `reason`.
    DisconnectSubject {
        sub: String,
        code: u16,
        reason: String,
    },
}

/// One worker's answer, and (merged) the node's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// `(channel, subscribers)`, sorted by name.
    #[serde(default)]
    pub channels: Vec<(String, u64)>,
    /// `Channel` with `--presence` on for it: `(sub, connections)` of the
    /// channel's subscribers admitted with a token subject, sorted by sub.
    /// (Boxed: most answers have none, and a part stays small.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence: Option<Box<Vec<(String, u64)>>>,
    /// Subscribers closed (`Disconnect`, `DisconnectSubject`).
    #[serde(default)]
    pub closed: u64,
    /// Workers that answered.
    #[serde(default)]
    pub workers: u64,
    /// `"cluster"`: the counts include the other nodes sharing Redis
    /// (`redis/counts.rs`); absent: this node's (or server's) only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// A disconnect relayed through Redis: the other nodes it went to, and
    /// those that said in time how many they closed (counted in `closed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Nodes>,
}

/// The other nodes a relayed disconnect reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nodes {
    /// Live nodes it was relayed to.
    pub asked: u64,
    /// Those that answered within the wait.
    pub answered: u64,
}

impl Part {
    /// Adds another worker's part: counts of one name summed, `closed` summed.
    fn add(&mut self, other: Self, limit: Option<usize>) {
        let mut merged: BTreeMap<String, u64> = self.channels.drain(..).collect();
        for (name, n) in other.channels {
            *merged.entry(name).or_default() += n;
        }
        self.channels = merged.into_iter().collect();
        if let Some(limit) = limit {
            // The first `limit + 1` names of the union are each among the
            // first `limit + 1` of every worker that has them, so the
            // rest can never be part of the page.
            self.channels.truncate(limit.saturating_add(1));
        }
        if let Some(theirs) = other.presence {
            let mut merged: BTreeMap<String, u64> = self
                .presence
                .take()
                .map(|p| *p)
                .unwrap_or_default()
                .into_iter()
                .collect();
            for (sub, n) in *theirs {
                *merged.entry(sub).or_default() += n;
            }
            self.presence = Some(Box::new(merged.into_iter().collect()));
        }
        self.closed += other.closed;
        self.workers += other.workers;
    }
}

/// Where an answer goes: the worker slot and generation that asked, and
/// its request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asker {
    pub slot: usize,
    pub generation: u64,
    pub request: u64,
}

/// An answer ready for its asker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub to: Asker,
    pub part: Part,
}

struct Pending {
    to: Asker,
    /// Worker slots that have not answered.
    waiting: Vec<usize>,
    merged: Part,
    limit: Option<usize>,
}

/// The API questions in flight, by the supervisor's id.
#[derive(Default)]
pub struct Gather {
    next: u64,
    pending: HashMap<u64, Pending>,
}

impl Gather {
    /// Starts `query` for `to`, put to the worker slots `workers`; returns
    /// the id the workers' parts will carry, or the answer at once when
    /// there is no worker to ask.
    pub fn ask(&mut self, to: Asker, query: &Query, workers: Vec<usize>) -> Result<u64, Done> {
        if workers.is_empty() {
            return Err(Done {
                to,
                part: Part::default(),
            });
        }
        self.next += 1;
        let limit = match query {
            Query::Channels { limit, .. } => Some(*limit),
            _ => None,
        };
        self.pending.insert(
            self.next,
            Pending {
                to,
                waiting: workers,
                merged: Part::default(),
                limit,
            },
        );
        Ok(self.next)
    }

    /// Worker `slot`'s part of question `id`; the merged answer once every
    /// asked worker gave its part.
    pub fn part(&mut self, slot: usize, id: u64, part: Part) -> Option<Done> {
        let p = self.pending.get_mut(&id)?;
        let at = p.waiting.iter().position(|&s| s == slot)?;
        p.waiting.swap_remove(at);
        let limit = p.limit;
        p.merged.add(part, limit);
        self.finish_if_done(id)
    }

    /// Worker `slot` exited: it will not answer; the questions that waited
    /// only for it are answered without it.
    pub fn gone(&mut self, slot: usize) -> Vec<Done> {
        let ids: Vec<u64> = self
            .pending
            .iter_mut()
            .filter_map(|(id, p)| {
                let at = p.waiting.iter().position(|&s| s == slot)?;
                p.waiting.swap_remove(at);
                Some(*id)
            })
            .collect();
        ids.into_iter()
            .filter_map(|id| self.finish_if_done(id))
            .collect()
    }

    fn finish_if_done(&mut self, id: u64) -> Option<Done> {
        if !self.pending.get(&id)?.waiting.is_empty() {
            return None;
        }
        let p = self.pending.remove(&id)?;
        Some(Done {
            to: p.to,
            part: p.merged,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TO: Asker = Asker {
        slot: 0,
        generation: 1,
        request: 7,
    };

    fn part(names: &[(&str, u64)]) -> Part {
        Part {
            channels: names.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect(),
            presence: None,
            closed: 0,
            workers: 1,
            scope: None,
            nodes: None,
        }
    }

    #[test]
    fn parts_merge_by_name_and_keep_one_page() {
        let mut g = Gather::default();
        let q = Query::Channels {
            prefix: String::new(),
            after: String::new(),
            limit: 2,
        };
        let id = g.ask(TO, &q, vec![0, 1]).unwrap();
        assert_eq!(g.part(0, id, part(&[("a", 1), ("c", 2), ("d", 1)])), None);
        // A part from a worker not asked, or twice, is ignored.
        assert_eq!(g.part(5, id, part(&[("a", 100)])), None);
        let done = g
            .part(1, id, part(&[("b", 3), ("c", 1), ("e", 1)]))
            .unwrap();
        assert_eq!(done.to, TO);
        let want = vec![("a".into(), 1), ("b".into(), 3), ("c".into(), 3)];
        assert_eq!(done.part.channels, want);
        assert_eq!(done.part.workers, 2);
        assert_eq!(g.part(1, id, part(&[])), None);
    }

    #[test]
    fn a_worker_that_exits_is_not_waited_for() {
        let mut g = Gather::default();
        let q = Query::Channel { name: "a".into() };
        let id = g.ask(TO, &q, vec![0, 1]).unwrap();
        assert_eq!(g.part(0, id, part(&[("a", 4)])), None);
        let done = g.gone(1);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].part.channels, vec![("a".into(), 4)]);
        assert_eq!(done[0].part.workers, 1);
        assert!(g.gone(0).is_empty());
    }

    #[test]
    fn no_worker_answers_at_once() {
        let mut g = Gather::default();
        let q = Query::Channel { name: "a".into() };
        assert_eq!(g.ask(TO, &q, vec![]).unwrap_err().part, Part::default());
    }
}
