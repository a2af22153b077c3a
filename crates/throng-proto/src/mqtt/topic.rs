//! Topic names and topic filters (section 4.7 of both specifications): their
//! rules, one matcher, and [`FilterTrie`], the index that finds every filter
//! matching a topic at a cost that does not grow with the number of filters
//! or of the subscribers behind them.
//!
//! Levels are split by `/`; an empty level is a level (`a//b` has three). In
//! a filter, `+` is exactly one level and `#`, only as the last level, is
//! any number of levels including none (`a/#` matches `a`). A topic whose
//! first level starts with `$` (`$SYS/...`) is matched by no filter that
//! starts with a wildcard: it takes a filter naming that first level.
//!
//! The same matcher serves subscriptions and, in the server, the channel
//! patterns of token grants, so the two can never disagree.

use std::collections::HashMap;

use thiserror::Error;

/// The longest topic or filter: a two-byte length.
pub const MAX_LEN: usize = u16::MAX as usize;

/// The most levels a [`FilterTrie`] indexes in one filter (it refuses
/// deeper ones; matching walks at most this deep, whatever the topic).
pub const MAX_LEVELS: usize = 64;

/// Why a string is not a topic name or not a topic filter.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopicError {
    /// Empty (topics and filters have at least one character).
    #[error("empty")]
    Empty,
    /// Over 65,535 bytes.
    #[error("longer than 65,535 bytes")]
    TooLong,
    /// U+0000.
    #[error("contains U+0000")]
    Nul,
    /// `+` or `#` in a topic name (they belong to filters).
    #[error("wildcard '+' or '#' in a topic name")]
    Wildcard,
    /// `+` or `#` sharing a level with other characters, or `#` before the
    /// last level.
    #[error("'+' and '#' must fill a level, and '#' must be the last")]
    MisplacedWildcard,
}

fn check_common(s: &str) -> Result<(), TopicError> {
    if s.is_empty() {
        return Err(TopicError::Empty);
    }
    if s.len() > MAX_LEN {
        return Err(TopicError::TooLong);
    }
    if s.contains('\0') {
        return Err(TopicError::Nul);
    }
    Ok(())
}

/// Checks a topic name, as a PUBLISH or a will carries: not empty, not too
/// long, no U+0000, no wildcard.
pub fn check_name(topic: &str) -> Result<(), TopicError> {
    check_common(topic)?;
    if topic.contains(['+', '#']) {
        return Err(TopicError::Wildcard);
    }
    Ok(())
}

/// Checks a topic filter, as a SUBSCRIBE carries: a topic name whose levels
/// may also be `+`, and whose last level may be `#`.
pub fn check_filter(filter: &str) -> Result<(), TopicError> {
    check_common(filter)?;
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        match level {
            "+" => {}
            "#" if last => {}
            _ if level.contains(['+', '#']) => return Err(TopicError::MisplacedWildcard),
            _ => {}
        }
    }
    Ok(())
}

/// Whether `filter` has a wildcard level.
pub fn is_wildcard(filter: &str) -> bool {
    filter.contains(['+', '#'])
}

/// A `$` topic (`$SYS/...`), which filters starting with a wildcard skip.
fn is_dollar(level: &str) -> bool {
    level.starts_with('$')
}

/// Whether `filter` matches `topic`. Both are taken as checked
/// ([`check_filter`], [`check_name`]); on anything else the answer means
/// nothing, but it is an answer. No allocation, one pass.
pub fn matches(filter: &str, topic: &str) -> bool {
    let mut want = filter.split('/');
    let mut have = topic.split('/');
    let mut first = true;
    loop {
        match (want.next(), have.next()) {
            (Some("#"), Some(h)) if first && is_dollar(h) => return false,
            (Some("#"), _) => return true,
            (Some("+"), Some(h)) if first && is_dollar(h) => return false,
            (Some("+"), Some(_)) => {}
            (Some(w), Some(h)) if w == h => {}
            (None, None) => return true,
            _ => return false,
        }
        first = false;
    }
}

/// Whether every topic `filter` matches is matched by `grant` too (both
/// checked filters): what a server asks before it lets a subscription with
/// wildcards through a grant.
pub fn covers(grant: &str, filter: &str) -> bool {
    let mut g = grant.split('/');
    let mut f = filter.split('/');
    let mut first = true;
    loop {
        match (g.next(), f.next()) {
            // A grant starting with a wildcard matches no `$` topic, which a
            // filter naming a `$` level matches.
            (Some("#" | "+"), Some(l)) if first && is_dollar(l) => return false,
            (Some("#"), _) => return true,
            (Some("+"), Some(l)) if l != "#" => {}
            (Some(a), Some(b)) if a == b && a != "+" => {}
            (None, None) => return true,
            _ => return false,
        }
        first = false;
    }
}

/// An index of topic filters, each with a value (a server's: the subscribers
/// of that filter), answering "which filters match this topic".
///
/// A trie by level: matching a topic of `L` levels visits at most the nodes
/// on the paths that spell it with some levels replaced by `+` (and the `#`
/// leaves beside them), one hash lookup each, so its cost follows the topic
/// and the filters that do match, never the number of filters or of
/// subscribers behind them.
#[derive(Debug)]
pub struct FilterTrie<V> {
    root: Node<V>,
    len: usize,
}

#[derive(Debug)]
struct Node<V> {
    /// The filter that ends at this node.
    value: Option<V>,
    /// The filter that is this node's path followed by `/#`: `#` is always
    /// a leaf, so it lives in its parent.
    hash: Option<V>,
    /// A `+` level next.
    plus: Option<Box<Self>>,
    /// Named levels next.
    literal: HashMap<Box<str>, Self>,
}

impl<V> Default for Node<V> {
    fn default() -> Self {
        Self {
            value: None,
            hash: None,
            plus: None,
            literal: HashMap::new(),
        }
    }
}

impl<V> Node<V> {
    fn is_empty(&self) -> bool {
        self.value.is_none()
            && self.hash.is_none()
            && self.plus.is_none()
            && self.literal.is_empty()
    }
}

/// A filter deeper than [`MAX_LEVELS`].
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("topic filter deeper than {MAX_LEVELS} levels")]
pub struct TooDeep;

impl<V> Default for FilterTrie<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> FilterTrie<V> {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            root: Node::default(),
            len: 0,
        }
    }

    /// Filters indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No filter indexed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of `filter` (a checked filter), made with `make` if the
    /// filter is new.
    pub fn get_or_insert_with(
        &mut self,
        filter: &str,
        make: impl FnOnce() -> V,
    ) -> Result<&mut V, TooDeep> {
        if filter.split('/').count() > MAX_LEVELS {
            return Err(TooDeep);
        }
        let (path, hash) = split_hash(filter);
        let mut node = &mut self.root;
        for level in path.into_iter().flat_map(|p| p.split('/')) {
            node = if level == "+" {
                node.plus.get_or_insert_with(Box::default)
            } else {
                node.literal.entry(level.into()).or_default()
            };
        }
        let slot = if hash {
            &mut node.hash
        } else {
            &mut node.value
        };
        if slot.is_none() {
            self.len += 1;
        }
        Ok(slot.get_or_insert_with(make))
    }

    /// The value of `filter`, if indexed.
    pub fn get_mut(&mut self, filter: &str) -> Option<&mut V> {
        let (path, hash) = split_hash(filter);
        let mut node = &mut self.root;
        for level in path.into_iter().flat_map(|p| p.split('/')) {
            node = if level == "+" {
                node.plus.as_deref_mut()?
            } else {
                node.literal.get_mut(level)?
            };
        }
        if hash {
            node.hash.as_mut()
        } else {
            node.value.as_mut()
        }
    }

    /// Removes `filter`, freeing the nodes only it used; its value, if it
    /// was indexed.
    pub fn remove(&mut self, filter: &str) -> Option<V> {
        let (path, hash) = split_hash(filter);
        let levels: Vec<&str> = path.into_iter().flat_map(|p| p.split('/')).collect();
        let removed = remove_at(&mut self.root, &levels, hash);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// Calls `found` with the value of every filter matching `topic` (a
    /// checked topic name), each once.
    pub fn for_each_match(&self, topic: &str, mut found: impl FnMut(&V)) {
        let mut levels = topic.split('/');
        let first = levels.next().unwrap_or_default();
        // `$` topics: no wildcard at the first level.
        let dollar = is_dollar(first);
        if !dollar {
            self.root.hash.iter().for_each(&mut found);
        }
        if let Some(next) = self.root.literal.get(first) {
            walk(next, levels.clone(), &mut found);
        }
        if !dollar {
            if let Some(plus) = &self.root.plus {
                walk(plus, levels, &mut found);
            }
        }
    }
}

/// `a/b/#` is `(Some("a/b"), true)`, `#` is `(None, true)`, `a/+` is
/// `(Some("a/+"), false)`.
fn split_hash(filter: &str) -> (Option<&str>, bool) {
    match filter.strip_suffix("#") {
        Some("") => (None, true),
        Some(path) => match path.strip_suffix('/') {
            Some(path) => (Some(path), true),
            None => (Some(filter), false),
        },
        None => (Some(filter), false),
    }
}

/// Matches the rest of a topic from `node`, which the levels before matched.
/// Recursion depth is bounded by the trie's depth ([`MAX_LEVELS`]).
fn walk<'t, V>(
    node: &Node<V>,
    mut levels: impl Iterator<Item = &'t str> + Clone,
    found: &mut impl FnMut(&V),
) {
    // `#` matches what is left, nothing included.
    node.hash.iter().for_each(&mut *found);
    let Some(level) = levels.next() else {
        node.value.iter().for_each(found);
        return;
    };
    if let Some(next) = node.literal.get(level) {
        walk(next, levels.clone(), found);
    }
    if let Some(plus) = &node.plus {
        walk(plus, levels, found);
    }
}

fn remove_at<V>(node: &mut Node<V>, levels: &[&str], hash: bool) -> Option<V> {
    let Some((&level, rest)) = levels.split_first() else {
        return if hash {
            node.hash.take()
        } else {
            node.value.take()
        };
    };
    if level == "+" {
        let child = node.plus.as_deref_mut()?;
        let removed = remove_at(child, rest, hash);
        if child.is_empty() {
            node.plus = None;
        }
        removed
    } else {
        let child = node.literal.get_mut(level)?;
        let removed = remove_at(child, rest, hash);
        if child.is_empty() {
            node.literal.remove(level);
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_have_no_wildcards() {
        assert_eq!(check_name("sensors/42/temp"), Ok(()));
        assert_eq!(check_name("/"), Ok(()));
        assert_eq!(check_name("$SYS/x"), Ok(()));
        assert_eq!(check_name(""), Err(TopicError::Empty));
        assert_eq!(check_name("a/+/b"), Err(TopicError::Wildcard));
        assert_eq!(check_name("a#"), Err(TopicError::Wildcard));
        assert_eq!(check_name("a\0"), Err(TopicError::Nul));
        assert_eq!(
            check_name(&"x".repeat(MAX_LEN + 1)),
            Err(TopicError::TooLong)
        );
    }

    #[test]
    fn wildcards_fill_a_level_and_hash_comes_last() {
        for ok in [
            "#",
            "+",
            "a/#",
            "+/+",
            "/+",
            "a//+/#",
            "sport/tennis/+",
            "$SYS/#",
        ] {
            assert_eq!(check_filter(ok), Ok(()), "{ok}");
        }
        for bad in ["a#", "a/#/b", "+a", "a/b+", "#/", "##", "a/+#"] {
            assert_eq!(
                check_filter(bad),
                Err(TopicError::MisplacedWildcard),
                "{bad}"
            );
        }
    }

    /// The examples of section 4.7 of the 3.1.1 specification.
    #[test]
    fn the_specifications_examples() {
        let yes = [
            ("sport/tennis/player1/#", "sport/tennis/player1"),
            ("sport/tennis/player1/#", "sport/tennis/player1/ranking"),
            (
                "sport/tennis/player1/#",
                "sport/tennis/player1/score/wimbledon",
            ),
            ("sport/#", "sport"),
            ("#", "sport/tennis"),
            ("sport/tennis/+", "sport/tennis/player1"),
            ("sport/+", "sport/"),
            ("+/+", "/finance"),
            ("/+", "/finance"),
            ("+", "sport"),
            ("$SYS/#", "$SYS/broker"),
            ("$SYS/+", "$SYS/x"),
            ("+/monitor/Clients", "a/monitor/Clients"),
        ];
        for (f, t) in yes {
            assert!(matches(f, t), "{f} should match {t}");
        }
        let no = [
            ("sport/tennis/+", "sport/tennis/player1/ranking"),
            ("sport/+", "sport"),
            ("+", "/finance"),
            ("#", "$SYS/broker"),
            ("+/monitor/Clients", "$SYS/monitor/Clients"),
            ("sport/tennis", "sport/tennis/x"),
            ("a/b", "a"),
            ("a/#", "ab"),
        ];
        for (f, t) in no {
            assert!(!matches(f, t), "{f} should not match {t}");
        }
    }

    #[test]
    fn a_grant_covers_a_filter_only_when_it_matches_all_it_matches() {
        for (g, f) in [
            ("#", "#"),
            ("#", "a/+/b"),
            ("a/#", "a"),
            ("a/#", "a/#"),
            ("a/+", "a/b"),
            ("a/+", "a/+"),
            ("+/+", "+/b"),
            ("$SYS/#", "$SYS/+"),
        ] {
            assert!(covers(g, f), "{g} should cover {f}");
        }
        for (g, f) in [
            ("a/+", "a/#"),
            ("a/b", "a/+"),
            ("a/+/#", "a/#"),
            ("#", "$SYS/x"),
            ("+/x", "$SYS/x"),
            ("a", "a/b"),
            ("a/b", "a"),
        ] {
            assert!(!covers(g, f), "{g} should not cover {f}");
        }
    }

    fn matched(trie: &FilterTrie<&'static str>, topic: &str) -> Vec<&'static str> {
        let mut out = Vec::new();
        trie.for_each_match(topic, |v| out.push(*v));
        out.sort_unstable();
        out
    }

    #[test]
    fn the_trie_finds_what_the_matcher_finds() {
        let filters = [
            "#", "+", "+/+", "/+", "a", "a/#", "a/+", "a/b", "a/+/c", "a/b/#", "+/b/#", "$SYS/#",
            "$SYS/+", "+/#", "a//b",
        ];
        let mut trie = FilterTrie::new();
        for f in filters {
            trie.get_or_insert_with(f, || f).unwrap();
        }
        assert_eq!(trie.len(), filters.len());
        for topic in [
            "a", "a/b", "a/b/c", "a/x/c", "/x", "$SYS/b", "$SYS", "b/b", "a//b", "x",
        ] {
            let mut want: Vec<&str> = filters.into_iter().filter(|f| matches(f, topic)).collect();
            want.sort_unstable();
            assert_eq!(matched(&trie, topic), want, "{topic}");
        }
    }

    #[test]
    fn removing_a_filter_frees_its_nodes_and_keeps_the_rest() {
        let mut trie = FilterTrie::new();
        for f in ["a/+/c", "a/#", "a/b", "#"] {
            trie.get_or_insert_with(f, || f).unwrap();
        }
        assert_eq!(trie.remove("a/+/c"), Some("a/+/c"));
        assert_eq!(trie.remove("a/+/c"), None);
        assert_eq!(trie.remove("a/x"), None);
        assert_eq!(matched(&trie, "a/b/c"), ["#", "a/#"]);
        assert_eq!(trie.remove("a/#"), Some("a/#"));
        assert_eq!(trie.remove("a/b"), Some("a/b"));
        assert_eq!(trie.remove("#"), Some("#"));
        assert!(trie.is_empty());
        assert!(trie.root.is_empty(), "every node freed");
    }

    #[test]
    fn one_value_per_filter_and_deep_filters_are_refused() {
        let mut trie: FilterTrie<u32> = FilterTrie::new();
        *trie.get_or_insert_with("a/+", || 0).unwrap() += 1;
        *trie.get_or_insert_with("a/+", || 0).unwrap() += 1;
        assert_eq!(trie.len(), 1);
        assert_eq!(trie.get_mut("a/+"), Some(&mut 2));
        assert_eq!(trie.get_mut("a/#"), None);
        let deep = vec!["+"; MAX_LEVELS + 1].join("/");
        assert_eq!(trie.get_or_insert_with(&deep, || 0), Err(TooDeep));
        let deepest = vec!["+"; MAX_LEVELS].join("/");
        assert!(trie.get_or_insert_with(&deepest, || 0).is_ok());
        // A topic far deeper than any filter is walked only as deep as the trie.
        let topic = vec!["x"; 100_000].join("/");
        trie.for_each_match(&topic, |_| {});
    }
}
