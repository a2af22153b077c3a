//! MQTT shared subscriptions (`$share/group/filter`) across a node's
//! workers, sans I/O: how many members each worker has in each group, and
//! which worker gets each message, so that a message reaches one member of
//! the group on the node, round-robin over the members wherever they are.
//!
//! Workers report their members joining and leaving ([`ShareMember`]);
//! every relayed message is matched against the groups' filters, and for
//! each matching group the worker holding the next member in turn is
//! named ([`Shares::picks`]); that worker gives it to one of its members,
//! in turn too. With `--redis` each node does this for the messages Redis
//! hands it: a message reaches one member of the group on each node.

use std::collections::HashMap;

use throng_proto::mqtt::topic::FilterTrie;

use crate::control::ShareMember;

/// One group's members by worker.
struct Group {
    filter: String,
    /// (worker, members there), those with none removed.
    members: Vec<(usize, u32)>,
    /// Messages given so far: the next member in turn.
    turn: u64,
}

/// The node's shared subscriptions.
#[derive(Default)]
pub struct Shares {
    groups: HashMap<String, Group>,
    /// Filter: the keys of the groups on it.
    index: FilterTrie<Vec<String>>,
}

/// The filter of key `group/filter`.
fn filter_of(key: &str) -> Option<&str> {
    key.split_once('/')
        .map(|(_, f)| f)
        .filter(|f| !f.is_empty())
}

impl Shares {
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Groups, and their members on every worker, for `/metrics`.
    pub fn counts(&self) -> (u64, u64) {
        let members = self
            .groups
            .values()
            .flat_map(|g| g.members.iter().map(|&(_, n)| u64::from(n)))
            .sum();
        (self.groups.len() as u64, members)
    }

    /// Worker `worker` reported `m`.
    pub fn member(&mut self, worker: usize, m: &ShareMember) {
        let Some(filter) = filter_of(&m.key) else {
            return;
        };
        if m.joined {
            if !self.groups.contains_key(&m.key) {
                let Ok(keys) = self.index.get_or_insert_with(filter, Vec::new) else {
                    return;
                };
                keys.push(m.key.clone());
                let group = Group {
                    filter: filter.to_owned(),
                    members: Vec::new(),
                    turn: 0,
                };
                self.groups.insert(m.key.clone(), group);
            }
            let Some(g) = self.groups.get_mut(&m.key) else {
                return;
            };
            match g.members.iter_mut().find(|(w, _)| *w == worker) {
                Some((_, n)) => *n += 1,
                None => g.members.push((worker, 1)),
            }
            return;
        }
        let Some(g) = self.groups.get_mut(&m.key) else {
            return;
        };
        if let Some(k) = g.members.iter().position(|(w, _)| *w == worker) {
            g.members[k].1 -= 1;
            if g.members[k].1 == 0 {
                g.members.remove(k);
            }
        }
        if g.members.is_empty() {
            self.remove(&m.key);
        }
    }

    /// The groups whose filter matches `channel`, each with the worker
    /// whose member's turn it is.
    pub fn picks(&mut self, channel: &str) -> Vec<(usize, String)> {
        let mut keys = Vec::new();
        self.index
            .for_each_match(channel, |k| keys.extend(k.iter().cloned()));
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let Some(g) = self.groups.get_mut(&key) else {
                continue;
            };
            let total: u64 = g.members.iter().map(|&(_, n)| u64::from(n)).sum();
            if total == 0 {
                continue;
            }
            let mut at = g.turn % total;
            g.turn += 1;
            for &(worker, n) in &g.members {
                if at < u64::from(n) {
                    out.push((worker, key));
                    break;
                }
                at -= u64::from(n);
            }
        }
        out
    }

    /// Worker `worker` died: its members are gone.
    pub fn worker_gone(&mut self, worker: usize) {
        let mut empty = Vec::new();
        for (key, g) in &mut self.groups {
            g.members.retain(|&(w, _)| w != worker);
            if g.members.is_empty() {
                empty.push(key.clone());
            }
        }
        for key in empty {
            self.remove(&key);
        }
    }

    fn remove(&mut self, key: &str) {
        let Some(g) = self.groups.remove(key) else {
            return;
        };
        let empty = self.index.get_mut(&g.filter).is_some_and(|keys| {
            keys.retain(|k| k != key);
            keys.is_empty()
        });
        if empty {
            self.index.remove(&g.filter);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(s: &mut Shares, worker: usize, key: &str, joined: bool) {
        s.member(
            worker,
            &ShareMember {
                key: key.to_owned(),
                joined,
            },
        );
    }

    #[test]
    fn each_message_goes_to_one_member_in_turn_wherever_it_is() {
        let mut s = Shares::default();
        join(&mut s, 0, "g/t/+", true);
        join(&mut s, 1, "g/t/+", true);
        join(&mut s, 1, "g/t/+", true);
        join(&mut s, 0, "h/t/1", true);
        let workers: Vec<usize> = (0..6)
            .map(|_| {
                s.picks("t/2")
                    .into_iter()
                    .map(|(w, _)| w)
                    .collect::<Vec<_>>()
            })
            .map(|w| w[0])
            .collect();
        // One member on worker 0, two on worker 1: one in three to 0.
        assert_eq!(workers, vec![0, 1, 1, 0, 1, 1]);
        assert_eq!(s.picks("t/1").len(), 2, "both groups match");
        assert!(s.picks("u").is_empty());
        join(&mut s, 1, "g/t/+", false);
        join(&mut s, 1, "g/t/+", false);
        s.worker_gone(0);
        assert!(s.is_empty());
        assert!(s.picks("t/1").is_empty());
    }
}
