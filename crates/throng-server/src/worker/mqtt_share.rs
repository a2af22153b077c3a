//! MQTT shared subscriptions (`$share/group/filter`) on a worker's side,
//! sans I/O: the worker's members of each group, and which of them gets
//! the next message the supervisor sends here for the group (in turn).
//! The supervisor picks the worker ([`crate::shares`]); a member is not in
//! the channel tables, so the fan-outs pass it by.

use std::collections::HashMap;
use std::rc::Rc;

use super::conn::Conn;

/// What a SUBSCRIBE filter `$share/group/filter` names: the key
/// `group/filter` and the filter; `None` for a filter that is not a shared
/// subscription; `Err` for a malformed one (an empty group or filter, or a
/// wildcard in the group).
pub(crate) fn parse(filter: &str) -> Option<Result<(&str, &str), ()>> {
    let key = filter.strip_prefix("$share/")?;
    Some(match key.split_once('/') {
        Some((group, f)) if !group.is_empty() && !f.is_empty() && !group.contains(['+', '#']) => {
            Ok((key, f))
        }
        _ => Err(()),
    })
}

/// One group's members here, with their subscription bytes.
struct Group<W> {
    members: Vec<(Rc<Conn<W>>, u8)>,
    turn: usize,
}

/// A worker's members of every group.
pub(crate) struct Shares<W> {
    groups: HashMap<Rc<str>, Group<W>>,
}

impl<W> Default for Shares<W> {
    fn default() -> Self {
        Self {
            groups: HashMap::new(),
        }
    }
}

impl<W> Shares<W> {
    /// `c` subscribes to `key` with `sub`: true if it is a new member
    /// (else its subscription byte is replaced).
    pub(crate) fn join(&mut self, key: &str, c: &Rc<Conn<W>>, sub: u8) -> bool {
        let g = self.groups.entry(key.into()).or_insert_with(|| Group {
            members: Vec::new(),
            turn: 0,
        });
        if let Some(m) = g.members.iter_mut().find(|(m, _)| Rc::ptr_eq(m, c)) {
            m.1 = sub;
            return false;
        }
        g.members.push((c.clone(), sub));
        true
    }

    /// `c` leaves `key`: whether it was a member.
    pub(crate) fn leave(&mut self, key: &str, c: &Conn<W>) -> bool {
        let Some(g) = self.groups.get_mut(key) else {
            return false;
        };
        let Some(k) = g.members.iter().position(|(m, _)| std::ptr::eq(&**m, c)) else {
            return false;
        };
        g.members.remove(k);
        if g.members.is_empty() {
            self.groups.remove(key);
        }
        true
    }

    /// `c`'s shared subscriptions among `keys`, each with its
    /// subscription byte (for its persistent session to keep).
    pub(crate) fn held(&self, keys: &[Rc<str>], c: &Conn<W>) -> Vec<(Rc<str>, u8)> {
        keys.iter()
            .filter_map(|k| {
                let g = self.groups.get(k)?;
                let (_, sub) = g.members.iter().find(|(m, _)| std::ptr::eq(&**m, c))?;
                Some((k.clone(), *sub))
            })
            .collect()
    }

    /// The member of `key` whose turn it is, with its subscription byte.
    pub(crate) fn pick(&mut self, key: &str) -> Option<(Rc<Conn<W>>, u8)> {
        let g = self.groups.get_mut(key)?;
        let n = g.members.len();
        let k = g.turn % n.max(1);
        g.turn = g.turn.wrapping_add(1);
        g.members.get(k).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_share_filter_names_its_group_and_filter() {
        assert_eq!(parse("a/b"), None);
        assert_eq!(parse("$share/g/a/+"), Some(Ok(("g/a/+", "a/+"))));
        assert_eq!(parse("$share/g"), Some(Err(())));
        assert_eq!(parse("$share//a"), Some(Err(())));
        assert_eq!(parse("$share/g+/a"), Some(Err(())));
    }
}
