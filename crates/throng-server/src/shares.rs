//! MQTT shared subscriptions (`$share/group/filter`) across a node's
//! workers, sans I/O: how many members each worker has in each group, and
//! which worker gets each message, so that a message reaches one member of
//! the group on the node, round-robin over the members wherever they are.
//!
//! Workers report their members joining and leaving ([`ShareMember`]);
//! every relayed message is matched against the groups' filters, and for
//! each matching group the worker holding the next member in turn is
//! named ([`Shares::picks`]); that worker gives it to one of its members,
//! in turn too. With `--redis` the nodes say their members to each other
//! (`shares::cluster`) and only the node holding the member a message's hash
//! picks delivers it: one member of the group in the whole deployment.

pub(crate) mod cluster;

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
    /// Every node's members, as heard through Redis (`--redis`).
    view: cluster::View,
    /// Groups the last announcement left out.
    left_out: usize,
}

/// A filter that gained its first group (`true`) or lost its last: with
/// `--redis-mode channels` the node subscribes to it in Redis meanwhile.
pub type Interest = (String, bool);

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

    /// Members of this node's groups on every node, as heard through
    /// Redis (this node's own once its announcement came back).
    pub fn cluster_members(&self) -> u64 {
        self.view.members(self.groups.keys())
    }

    /// Every node's members as heard through Redis.
    pub(crate) fn view(&mut self) -> &mut cluster::View {
        &mut self.view
    }

    /// What node `node` says of its groups now ([`cluster::announcement`]),
    /// and how many groups it leaves out when that changed (to say once).
    pub(crate) fn announcement(&mut self, node: u64) -> (bytes::Bytes, Option<usize>) {
        let groups = self.groups.iter().map(|(key, g)| {
            let n: u32 = g.members.iter().map(|&(_, n)| n).sum();
            (key.as_str(), n)
        });
        let (payload, left_out) = cluster::announcement(node, groups);
        let changed = left_out != self.left_out && left_out > 0;
        self.left_out = left_out;
        (payload, changed.then_some(left_out))
    }

    /// Worker `worker` reported `m`; a filter's first group or last one
    /// gone is said.
    pub fn member(&mut self, worker: usize, m: &ShareMember) -> Option<Interest> {
        let filter = filter_of(&m.key)?;
        self.view.changed();
        let mut first = None;
        if m.joined {
            if !self.groups.contains_key(&m.key) {
                let keys = self.index.get_or_insert_with(filter, Vec::new).ok()?;
                if keys.is_empty() {
                    first = Some((filter.to_owned(), true));
                }
                keys.push(m.key.clone());
                let group = Group {
                    filter: filter.to_owned(),
                    members: Vec::new(),
                    turn: 0,
                };
                self.groups.insert(m.key.clone(), group);
            }
            let g = self.groups.get_mut(&m.key)?;
            match g.members.iter_mut().find(|(w, _)| *w == worker) {
                Some((_, n)) => *n += 1,
                None => g.members.push((worker, 1)),
            }
            return first;
        }
        let g = self.groups.get_mut(&m.key)?;
        if let Some(k) = g.members.iter().position(|(w, _)| *w == worker) {
            g.members[k].1 -= 1;
            if g.members[k].1 == 0 {
                g.members.remove(k);
            }
        }
        if g.members.is_empty() {
            return self.remove(&m.key);
        }
        None
    }

    /// The groups whose filter matches `channel`, each with the worker
    /// whose member's turn it is. `spread`: with `--redis`, the message's
    /// hash and this node's tag: only the groups whose member it picks
    /// in the whole deployment is here (`cluster::View::mine`).
    pub fn picks(&mut self, channel: &str, spread: Option<(u64, u64)>) -> Vec<(usize, String)> {
        let mut keys = Vec::new();
        self.index
            .for_each_match(channel, |k| keys.extend(k.iter().cloned()));
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some((hash, me)) = spread
                && !self.view.mine(&key, hash, me)
            {
                continue;
            }
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

    /// Worker `worker` died: its members are gone; the filters left with
    /// no group.
    pub fn worker_gone(&mut self, worker: usize) -> Vec<Interest> {
        let mut empty = Vec::new();
        for (key, g) in &mut self.groups {
            g.members.retain(|&(w, _)| w != worker);
            if g.members.is_empty() {
                empty.push(key.clone());
            }
        }
        self.view.changed();
        empty.iter().filter_map(|key| self.remove(key)).collect()
    }

    /// Group `key` has no member left; its filter, if that was its last group.
    fn remove(&mut self, key: &str) -> Option<Interest> {
        let g = self.groups.remove(key)?;
        let empty = self.index.get_mut(&g.filter).is_some_and(|keys| {
            keys.retain(|k| k != key);
            keys.is_empty()
        });
        if empty {
            self.index.remove(&g.filter);
            return Some((g.filter, false));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(s: &mut Shares, worker: usize, key: &str, joined: bool) -> Option<Interest> {
        s.member(
            worker,
            &ShareMember {
                key: key.to_owned(),
                joined,
            },
        )
    }

    #[test]
    fn each_message_goes_to_one_member_in_turn_wherever_it_is() {
        let mut s = Shares::default();
        assert_eq!(join(&mut s, 0, "g/t/+", true), Some(("t/+".into(), true)));
        assert_eq!(join(&mut s, 1, "g/t/+", true), None);
        join(&mut s, 1, "g/t/+", true);
        assert_eq!(join(&mut s, 0, "h/t/1", true), Some(("t/1".into(), true)));
        assert_eq!(join(&mut s, 0, "i/t/1", true), None, "t/1 has a group");
        let workers: Vec<usize> = (0..6)
            .map(|_| {
                s.picks("t/2", None)
                    .into_iter()
                    .map(|(w, _)| w)
                    .collect::<Vec<_>>()
            })
            .map(|w| w[0])
            .collect();
        // One member on worker 0, two on worker 1: one in three to 0.
        assert_eq!(workers, vec![0, 1, 1, 0, 1, 1]);
        assert_eq!(s.picks("t/1", None).len(), 3, "three groups match");
        assert!(s.picks("u", None).is_empty());
        join(&mut s, 1, "g/t/+", false);
        join(&mut s, 1, "g/t/+", false);
        let mut gone = s.worker_gone(0);
        gone.sort();
        assert_eq!(gone, [("t/+".into(), false), ("t/1".into(), false)]);
        assert!(s.is_empty());
        assert!(s.picks("t/1", None).is_empty());
    }

    #[test]
    fn with_other_nodes_heard_a_message_goes_to_the_node_its_hash_picks() {
        let mut s = Shares::default();
        join(&mut s, 0, "g/t", true);
        // Node 7 (this one) has one member, node 9 another.
        let (mine, _) = s.announcement(7);
        assert!(s.view().heard(&mine, 0));
        let (theirs, _) = cluster::announcement(9, [("g/t", 1)].into_iter());
        assert!(s.view().heard(&theirs, 0));
        assert_eq!(s.cluster_members(), 2);
        let here = (0..200u64)
            .filter(|&h| !s.picks("t", Some((h, 7))).is_empty())
            .count();
        assert!((60..140).contains(&here), "about half here: {here}");
        // Node 9 falls silent: every message is this node's.
        s.view().expire(cluster::FORGET_AFTER_MS + 1);
        s.view().heard(&mine, cluster::FORGET_AFTER_MS + 1);
        assert!((0..50u64).all(|h| s.picks("t", Some((h, 7))).len() == 1));
    }
}
