//! Events grouped: the same thing said by many sources is one line. A run
//! of 51 workers that all hit the same failure writes 51 events that differ
//! only in their source and the numbers in their text (a port, a count);
//! a reader wants one line with how many, from whom, and when first and
//! last.
//!
//! Two events are in one group when their kind is the same and their texts
//! are the same once every run of digits is read as one number
//! ([`group_key`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::format::Event;

/// Groups kept; events of further groups are only counted.
pub const MAX_GROUPS: usize = 1_000;
/// Sources named per group; further ones are only counted.
pub const MAX_SOURCES: usize = 1_000;

/// Events of one kind that say one thing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventGroup {
    /// The kind (`connect.error`, `worker.exited`).
    pub kind: String,
    /// The first event's text.
    pub text: String,
    /// Events in the group.
    pub count: u64,
    /// The sources that said it (at most [`MAX_SOURCES`]).
    pub sources: BTreeSet<String>,
    /// When it was first said, ns since the epoch.
    pub first_ns: u64,
    /// When it was last said.
    pub last_ns: u64,
}

impl EventGroup {
    /// `h/hold-0, h/hold-1 and 49 more` style list of its sources.
    pub fn sources_text(&self) -> String {
        let names: Vec<&str> = self.sources.iter().map(String::as_str).collect();
        match names.len() {
            0 => String::new(),
            1..=3 => names.join(", "),
            n => format!("{}, {} and {} more", names[0], names[1], n - 2),
        }
    }
}

/// The grouping key of an event: its kind, and its text with every run of
/// digits made `#`.
pub fn group_key(ev: &Event) -> (String, String) {
    let mut text = String::with_capacity(ev.text.len());
    let mut in_digits = false;
    for c in ev.text.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                text.push('#');
            }
            in_digits = true;
        } else {
            text.push(c);
            in_digits = false;
        }
    }
    (ev.kind.clone(), text)
}

/// Events grouped as they come, in the order groups first appeared.
#[derive(Debug, Clone, Default)]
pub struct Groups {
    index: BTreeMap<(String, String), usize>,
    groups: Vec<EventGroup>,
    /// Events of groups past [`MAX_GROUPS`].
    pub uncounted: u64,
}

impl Groups {
    /// Adds one event; `true` when it began a group (the first of its kind
    /// and text: the one to show as it happens).
    pub fn add(&mut self, ev: &Event) -> bool {
        let key = group_key(ev);
        if let Some(&i) = self.index.get(&key) {
            let g = &mut self.groups[i];
            g.count += 1;
            g.first_ns = g.first_ns.min(ev.at_ns);
            g.last_ns = g.last_ns.max(ev.at_ns);
            if g.sources.len() < MAX_SOURCES {
                g.sources.insert(ev.source.clone());
            }
            return false;
        }
        if self.groups.len() >= MAX_GROUPS {
            self.uncounted += 1;
            return false;
        }
        self.index.insert(key, self.groups.len());
        self.groups.push(EventGroup {
            kind: ev.kind.clone(),
            text: ev.text.clone(),
            count: 1,
            sources: BTreeSet::from([ev.source.clone()]),
            first_ns: ev.at_ns,
            last_ns: ev.at_ns,
        });
        true
    }

    /// The groups, in the order they first appeared.
    pub fn groups(&self) -> &[EventGroup] {
        &self.groups
    }

    /// The groups, taken.
    pub fn into_groups(self) -> Vec<EventGroup> {
        self.groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(at: u64, source: &str, kind: &str, text: &str) -> Event {
        Event {
            at_ns: at,
            source: source.into(),
            kind: kind.into(),
            text: text.into(),
        }
    }

    #[test]
    fn the_same_thing_from_many_workers_is_one_group() {
        let mut g = Groups::default();
        let mut shown = 0;
        for w in 0..51u64 {
            let text = format!(
                "reset (first of its kind): upgrade at 127.0.0.1:{}: the server closed the connection",
                20_000 + w % 8
            );
            if g.add(&ev(100 + w, &format!("h/hold-{w}"), "connect.error", &text)) {
                shown += 1;
            }
        }
        g.add(&ev(
            90,
            "h/hold-3",
            "connect.error",
            "refused (first of its kind): connect to 127.0.0.1:20001: refused",
        ));
        g.add(&ev(95, "h/hold-3", "tls.negotiated", "TLS 1.3"));
        assert_eq!(shown, 1, "only the first of a group is news");
        let groups = g.groups();
        assert_eq!(groups.len(), 3);
        let reset = &groups[0];
        assert_eq!((reset.count, reset.sources.len()), (51, 51));
        assert_eq!((reset.first_ns, reset.last_ns), (100, 150));
        assert!(
            reset
                .text
                .ends_with("127.0.0.1:20000: the server closed the connection")
        );
        assert_eq!(reset.sources_text(), "h/hold-0, h/hold-1 and 49 more");
        assert_eq!(groups[1].count, 1, "another reason is another group");
        assert_eq!(groups[1].sources_text(), "h/hold-3");
    }

    #[test]
    fn groups_are_bounded() {
        let mut g = Groups::default();
        for i in 0..MAX_GROUPS + 5 {
            g.add(&ev(
                1,
                "s",
                &format!("kind.{}", "x".repeat(i % 7 + 1)),
                &format!("{i}"),
            ));
        }
        // Seven kinds, digits read alike: seven groups only.
        assert_eq!(g.groups().len(), 7);
        let mut g = Groups::default();
        for i in 0..MAX_GROUPS + 5 {
            g.add(&ev(1, "s", &format!("kind{}", "x".repeat(i)), ""));
        }
        assert_eq!(g.groups().len(), MAX_GROUPS);
        assert_eq!(g.uncounted, 5);
    }
}
