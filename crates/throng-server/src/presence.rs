//! Who is subscribed to the channels of `--presence` on this node, kept by
//! the supervisor from the join and leave events its workers tell it
//! ([`crate::control::PresenceEvent`]): written to Redis with the
//! subscriber counts (`--redis`, [`crate::redis::counts`]) so that every
//! node's `GET /api/channels/<c>` lists every node's subjects. A state
//! machine without sockets: fed events and workers that died, asked for a
//! snapshot.

use std::collections::{BTreeMap, HashMap};

use crate::control::PresenceEvent;

/// The subjects of this node's `--presence` channels, by worker.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// By worker slot: `(channel, sub)` → connections.
    by_worker: HashMap<usize, HashMap<(String, String), u64>>,
}

impl Tally {
    /// Worker `worker` told event `e`.
    pub(crate) fn told(&mut self, worker: usize, e: &PresenceEvent) {
        let mine = self.by_worker.entry(worker).or_default();
        let k = (e.channel.clone(), e.sub.clone());
        if e.join {
            *mine.entry(k).or_default() += 1;
        } else if let Some(n) = mine.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                mine.remove(&k);
            }
        }
        if mine.is_empty() {
            self.by_worker.remove(&worker);
        }
    }

    /// Worker `worker` died, and its connections with it: a leave for each
    /// of them, for the other workers' (and nodes') watchers.
    pub(crate) fn worker_gone(&mut self, worker: usize) -> Vec<PresenceEvent> {
        let Some(mine) = self.by_worker.remove(&worker) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for ((channel, sub), n) in mine {
            for _ in 0..n {
                out.push(PresenceEvent {
                    join: false,
                    channel: channel.clone(),
                    sub: sub.clone(),
                });
            }
        }
        out
    }

    /// This node's presence: by channel, each subject with its
    /// connections, sorted by name.
    pub(crate) fn snapshot(&self) -> Vec<(String, Vec<(String, u64)>)> {
        let mut all: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
        for mine in self.by_worker.values() {
            for ((channel, sub), n) in mine {
                *all.entry(channel).or_default().entry(sub).or_default() += n;
            }
        }
        all.into_iter()
            .map(|(c, subs)| {
                let subs = subs.into_iter().map(|(s, n)| (s.to_owned(), n)).collect();
                (c.to_owned(), subs)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(join: bool, channel: &str, sub: &str) -> PresenceEvent {
        PresenceEvent {
            join,
            channel: channel.into(),
            sub: sub.into(),
        }
    }

    #[test]
    fn joins_and_leaves_add_up_across_workers_and_a_dead_worker_leaves() {
        let mut t = Tally::default();
        t.told(0, &ev(true, "a", "alice"));
        t.told(1, &ev(true, "a", "alice"));
        t.told(1, &ev(true, "a", "bob"));
        t.told(1, &ev(true, "b", "bob"));
        t.told(0, &ev(false, "b", "carol")); // never joined: ignored
        assert_eq!(
            t.snapshot(),
            [
                ("a".into(), vec![("alice".into(), 2), ("bob".into(), 1)]),
                ("b".into(), vec![("bob".into(), 1)]),
            ]
        );
        t.told(0, &ev(false, "a", "alice"));
        let mut gone = t.worker_gone(1);
        gone.sort_by(|x, y| (&x.channel, &x.sub).cmp(&(&y.channel, &y.sub)));
        assert_eq!(
            gone,
            [
                ev(false, "a", "alice"),
                ev(false, "a", "bob"),
                ev(false, "b", "bob")
            ]
        );
        assert!(t.snapshot().is_empty());
        assert!(t.worker_gone(1).is_empty());
    }
}
