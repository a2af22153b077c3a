//! The worker's tables: every live subscriber by slot (what the sweep walks)
//! and the subscribers of each channel (what a fan-out walks).
//!
//! Both hold `Rc<Conn>`; a connection knows its slot and its position in its
//! channel's list, so joining and leaving are O(1). A WebSocket or SSE
//! subscriber is in one channel; an MQTT one in any number: each channel
//! keeps its MQTT subscribers in a list of their own, each entry naming the
//! subscription it is in the connection's list ([`super::mqtt::MqttState`]),
//! which names the entry back, so that leaving stays O(1) too.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use throng_proto::mqtt::topic::{FilterTrie, TooDeep};

use super::conn::Conn;
use super::mqtt::{Sub, WildSub};

/// Marks a connection that is not in a table.
pub(crate) const NONE: u32 = u32::MAX;

/// Live subscribers by slot. Invariant: `slots[c.slot] == Some(c)` for every
/// connection in the table; free slots are listed in `free`.
pub(crate) struct Slab<W> {
    slots: Vec<Option<Rc<Conn<W>>>>,
    free: Vec<u32>,
    len: usize,
}

impl<W> Default for Slab<W> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<W> Slab<W> {
    pub(crate) fn insert(&mut self, c: &Rc<Conn<W>>) {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        c.slot.set(slot);
        self.slots[slot as usize] = Some(c.clone());
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, c: &Conn<W>) {
        let slot = c.slot.replace(NONE);
        if slot == NONE {
            return;
        }
        self.slots[slot as usize] = None;
        self.free.push(slot);
        self.len -= 1;
    }

    /// Number of slots (live or free): the range the sweep walks.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, slot: usize) -> Option<&Rc<Conn<W>>> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub(crate) fn all(&self) -> Vec<Rc<Conn<W>>> {
        self.slots.iter().flatten().cloned().collect()
    }
}

/// One channel's subscribers, in no particular order.
pub(crate) struct Channel<W> {
    pub(crate) subs: Vec<Rc<Conn<W>>>,
    /// MQTT subscribers, each with the index of this subscription in its
    /// connection's list. Invariant: `c.mqtt().subs[k] == (this channel,
    /// position of (c, k) here)`.
    pub(crate) mqtt: Vec<(Rc<Conn<W>>, u32)>,
}

impl<W> Channel<W> {
    /// Subscribers of every kind.
    pub(crate) fn len(&self) -> usize {
        self.subs.len() + self.mqtt.len()
    }

    fn is_empty(&self) -> bool {
        self.subs.is_empty() && self.mqtt.is_empty()
    }
}

/// The MQTT subscribers of one wildcard filter, each with the index of
/// this subscription in its connection's wildcard list (as [`Channel::mqtt`]).
pub(crate) type Wild<W> = Vec<(Rc<Conn<W>>, u32)>;

/// Channels by name. Invariant: `list[c.channel].subs[c.sub_pos] == c` for
/// every subscribed connection; a channel is dropped with its last subscriber.
/// Wildcard filters are not channels: they live in `wild`, a trie whose
/// lookup costs what the topic's levels and the matching filters cost,
/// never what the number of filters or subscribers does.
pub(crate) struct Channels<W> {
    by_name: HashMap<Rc<str>, u32>,
    list: Vec<Option<(Rc<str>, Channel<W>)>>,
    free: Vec<u32>,
    wild: FilterTrie<Wild<W>>,
    /// Bumped per lookup of a topic's MQTT subscribers: a connection
    /// marked with the current one was already found (two of its filters
    /// match), so it gets the message once.
    generation: Cell<u64>,
}

impl<W> Default for Channels<W> {
    fn default() -> Self {
        Self {
            by_name: HashMap::new(),
            list: Vec::new(),
            free: Vec::new(),
            wild: FilterTrie::new(),
            generation: Cell::new(0),
        }
    }
}

impl<W> Channels<W> {
    pub(crate) fn get(&self, name: &str) -> Option<&Channel<W>> {
        let id = *self.by_name.get(name)?;
        self.list[id as usize].as_ref().map(|(_, ch)| ch)
    }

    /// Whether some MQTT subscriber here has a wildcard filter.
    pub(crate) fn has_wildcards(&self) -> bool {
        !self.wild.is_empty()
    }

    /// Calls `found` with every MQTT subscriber a message on `channel`
    /// reaches (its exact subscribers, then those of every matching
    /// wildcard filter), each once.
    pub(crate) fn for_each_mqtt(&self, channel: &str, mut found: impl FnMut(&Rc<Conn<W>>)) {
        let generation = self.generation.get() + 1;
        self.generation.set(generation);
        let mut first = |c: &Rc<Conn<W>>| {
            let fresh = c
                .proto
                .borrow_mut()
                .mqtt_mut()
                .is_some_and(|m| std::mem::replace(&mut m.seen, generation) != generation);
            if fresh {
                found(c);
            }
        };
        if let Some(ch) = self.get(channel) {
            ch.mqtt.iter().for_each(|(c, _)| first(c));
        }
        self.wild
            .for_each_match(channel, |subs| subs.iter().for_each(|(c, _)| first(c)));
    }

    /// Whether MQTT subscriber `c` has subscription `filter` already (an
    /// exact one or a wildcard one).
    pub(crate) fn has_mqtt_subscription(&self, filter: &str, c: &Conn<W>) -> bool {
        let proto = c.proto.borrow();
        let Some(m) = proto.mqtt() else {
            return false;
        };
        if m.wild.iter().any(|w| &*w.filter == filter) {
            return true;
        }
        self.by_name
            .get(filter)
            .is_some_and(|id| m.subs.iter().any(|s| s.channel == *id))
    }

    /// Adds MQTT subscriber `c` to wildcard `filter` (a checked filter),
    /// unless it has it already.
    pub(crate) fn subscribe_wild(&mut self, filter: &str, c: &Rc<Conn<W>>) -> Result<(), TooDeep> {
        if c.proto
            .borrow()
            .mqtt()
            .is_some_and(|m| m.wild.iter().any(|w| &*w.filter == filter))
        {
            return Ok(());
        }
        let subs = self.wild.get_or_insert_with(filter, Vec::new)?;
        let mut proto = c.proto.borrow_mut();
        if let Some(m) = proto.mqtt_mut() {
            m.wild.push(WildSub {
                filter: Rc::from(filter),
                pos: subs.len() as u32,
            });
            subs.push((c.clone(), (m.wild.len() - 1) as u32));
        }
        Ok(())
    }

    /// Takes MQTT subscriber `c` out of wildcard `filter`; false when it
    /// had no such subscription.
    pub(crate) fn unsubscribe_wild(&mut self, filter: &str, c: &Conn<W>) -> bool {
        let k = c
            .proto
            .borrow()
            .mqtt()
            .and_then(|m| m.wild.iter().position(|w| &*w.filter == filter));
        match k {
            Some(k) => {
                self.leave_wild(c, k);
                true
            }
            None => false,
        }
    }

    /// Takes wildcard subscription `k` of `c` out of the trie and out of
    /// `c`'s list (whose last one moves into its place).
    fn leave_wild(&mut self, c: &Conn<W>, k: usize) {
        let (sub, moved) = {
            let mut proto = c.proto.borrow_mut();
            let Some(m) = proto.mqtt_mut() else { return };
            let sub = m.wild.swap_remove(k);
            (sub, m.wild.get(k).map(|w| (w.filter.clone(), w.pos)))
        };
        if let Some((filter, pos)) = moved
            && let Some(subs) = self.wild.get_mut(&filter)
        {
            subs[pos as usize].1 = k as u32;
        }
        let Some(subs) = self.wild.get_mut(&sub.filter) else {
            return;
        };
        subs.swap_remove(sub.pos as usize);
        if let Some((other, j)) = subs.get(sub.pos as usize)
            && let Some(m) = other.proto.borrow_mut().mqtt_mut()
        {
            m.wild[*j as usize].pos = sub.pos;
        }
        if subs.is_empty() {
            self.wild.remove(&sub.filter);
        }
    }

    /// The id of channel `name`, made if it is new (then `true`).
    fn id_of(&mut self, name: &str) -> (u32, bool) {
        if let Some(&id) = self.by_name.get(name) {
            return (id, false);
        }
        let name: Rc<str> = Rc::from(name);
        let entry = Some((
            name.clone(),
            Channel {
                subs: Vec::new(),
                mqtt: Vec::new(),
            },
        ));
        let id = match self.free.pop() {
            Some(id) => {
                self.list[id as usize] = entry;
                id
            }
            None => {
                self.list.push(entry);
                (self.list.len() - 1) as u32
            }
        };
        self.by_name.insert(name, id);
        (id, true)
    }

    /// Adds `c` to channel `name`; returns whether it is the channel's first subscriber.
    pub(crate) fn subscribe(&mut self, name: &str, c: &Rc<Conn<W>>) -> bool {
        let (id, first) = self.id_of(name);
        if let Some((_, ch)) = self.list[id as usize].as_mut() {
            c.channel.set(id);
            c.sub_pos.set(ch.subs.len() as u32);
            ch.subs.push(c.clone());
        }
        first
    }

    /// Adds MQTT subscriber `c` to channel `name`, unless it is in it
    /// already; returns whether it is the channel's first subscriber.
    pub(crate) fn subscribe_mqtt(&mut self, name: &str, c: &Rc<Conn<W>>) -> bool {
        let (id, first) = self.id_of(name);
        let Some((_, ch)) = self.list[id as usize].as_mut() else {
            return first;
        };
        let mut proto = c.proto.borrow_mut();
        let Some(m) = proto.mqtt_mut() else {
            return first;
        };
        if m.subs.iter().any(|s| s.channel == id) {
            return first;
        }
        m.subs.push(Sub {
            channel: id,
            pos: ch.mqtt.len() as u32,
        });
        ch.mqtt.push((c.clone(), (m.subs.len() - 1) as u32));
        first
    }

    /// Takes MQTT subscriber `c` out of channel `name`: `None` when it was
    /// not in it, else the channel's name when `c` was its last subscriber.
    pub(crate) fn unsubscribe_mqtt(&mut self, name: &str, c: &Conn<W>) -> Option<Option<Rc<str>>> {
        let id = *self.by_name.get(name)?;
        let k = c
            .proto
            .borrow()
            .mqtt()?
            .subs
            .iter()
            .position(|s| s.channel == id)?;
        Some(self.leave_mqtt(c, k))
    }

    /// Takes MQTT subscriber `c` out of every channel; returns the names of
    /// those it was the last subscriber of.
    pub(crate) fn unsubscribe_mqtt_all(&mut self, c: &Conn<W>) -> Vec<Rc<str>> {
        let mut gone = Vec::new();
        loop {
            let n = c.proto.borrow().mqtt().map_or(0, |m| m.wild.len());
            if n == 0 {
                break;
            }
            self.leave_wild(c, n - 1);
        }
        loop {
            let n = c.proto.borrow().mqtt().map_or(0, |m| m.subs.len());
            if n == 0 {
                return gone;
            }
            gone.extend(self.leave_mqtt(c, n - 1));
        }
    }

    /// Takes subscription `k` of `c` out of its channel and out of `c`'s
    /// list (whose last subscription moves into its place).
    fn leave_mqtt(&mut self, c: &Conn<W>, k: usize) -> Option<Rc<str>> {
        let (sub, moved) = {
            let mut proto = c.proto.borrow_mut();
            let m = proto.mqtt_mut()?;
            let sub = m.subs.swap_remove(k);
            (sub, m.subs.get(k).copied())
        };
        if let Some(moved) = moved
            && let Some((_, ch)) = self.list[moved.channel as usize].as_mut()
        {
            ch.mqtt[moved.pos as usize].1 = k as u32;
        }
        let id = sub.channel as usize;
        let (_, ch) = self.list[id].as_mut()?;
        ch.mqtt.swap_remove(sub.pos as usize);
        if let Some((other, j)) = ch.mqtt.get(sub.pos as usize)
            && let Some(m) = other.proto.borrow_mut().mqtt_mut()
        {
            // Another connection's: `c` is in a channel once.
            m.subs[*j as usize].pos = sub.pos;
        }
        self.forget_if_empty(id)
    }

    /// Takes `c` out of its channel; returns the channel's name when `c` was
    /// its last subscriber (the channel is gone).
    pub(crate) fn unsubscribe(&mut self, c: &Conn<W>) -> Option<Rc<str>> {
        let pos = c.sub_pos.replace(NONE);
        if pos == NONE {
            return None;
        }
        let id = c.channel.get() as usize;
        let (_, ch) = self.list[id].as_mut()?;
        ch.subs.swap_remove(pos as usize);
        if let Some(moved) = ch.subs.get(pos as usize) {
            moved.sub_pos.set(pos);
        }
        self.forget_if_empty(id)
    }

    /// Forgets channel `id` when its last subscriber of any kind left;
    /// returns its name then.
    fn forget_if_empty(&mut self, id: usize) -> Option<Rc<str>> {
        let (name, ch) = self.list[id].as_ref()?;
        if !ch.is_empty() {
            return None;
        }
        let name = name.clone();
        self.by_name.remove(&*name);
        self.list[id] = None;
        self.free.push(id as u32);
        Some(name)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::rc::Rc;

    use throng_proto::mqtt::{Decoder, Version};

    use super::{Channels, NONE, Slab};
    use crate::worker::conn::Conn;
    use crate::worker::mqtt::MqttState;

    fn conns(n: usize) -> (TcpListener, Vec<Rc<Conn<TcpStream>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let v = (0..n)
            .map(|_| Rc::new(Conn::new(TcpStream::connect(addr).unwrap(), 0, b"")))
            .collect();
        (l, v)
    }

    fn check(ch: &Channels<TcpStream>, name: &str, want: usize) {
        let subs = ch.get(name).map_or(&[][..], |c| &c.subs[..]);
        assert_eq!(subs.len(), want, "{name}");
        for (i, c) in subs.iter().enumerate() {
            assert_eq!(c.sub_pos.get() as usize, i, "position invariant in {name}");
        }
    }

    #[test]
    fn join_and_leave_keep_positions_and_slots() {
        let (_l, cs) = conns(7);
        let (mut slab, mut ch) = (Slab::default(), Channels::default());
        for (i, c) in cs.iter().enumerate() {
            slab.insert(c);
            ch.subscribe(if i < 5 { "a" } else { "b" }, c);
        }
        check(&ch, "a", 5);
        check(&ch, "b", 2);
        ch.unsubscribe(&cs[1]);
        ch.unsubscribe(&cs[1]); // twice is harmless
        assert_eq!(cs[1].sub_pos.get(), NONE);
        check(&ch, "a", 4);
        assert_eq!(ch.unsubscribe(&cs[5]), None);
        assert_eq!(ch.unsubscribe(&cs[6]).as_deref(), Some("b"));
        assert!(
            ch.get("b").is_none(),
            "a channel goes with its last subscriber"
        );
        assert!(
            ch.subscribe("b", &cs[5]),
            "first subscriber of a new channel"
        );
        assert!(!ch.subscribe("a", &cs[6]));
        check(&ch, "b", 1);

        let slot = cs[2].slot.get();
        slab.remove(&cs[2]);
        assert_eq!(cs[2].slot.get(), NONE);
        assert!(slab.get(slot as usize).is_none());
        assert_eq!(slab.len(), 6);
        let (_l2, more) = conns(1);
        slab.insert(&more[0]);
        assert_eq!(more[0].slot.get(), slot, "free slots are reused");
        assert_eq!(slab.capacity(), 7);
        assert_eq!(slab.all().len(), 7);
    }

    fn mqtt_conns(n: usize) -> (TcpListener, Vec<Rc<Conn<TcpStream>>>) {
        let (l, cs) = conns(n);
        let cs = cs
            .into_iter()
            .map(|c| {
                let c = Rc::into_inner(c).unwrap();
                let state = MqttState::new(Decoder::server(1024), 0);
                Rc::new(c.with_mqtt(Version::V5, state))
            })
            .collect();
        (l, cs)
    }

    /// Every MQTT entry of `name` names a subscription of its connection
    /// that names it back; returns the connections, by pointer.
    fn check_mqtt(ch: &Channels<TcpStream>, name: &str) -> Vec<*const Conn<TcpStream>> {
        let id = *ch.by_name.get(name).unwrap_or(&NONE);
        let entries = ch.get(name).map_or(&[][..], |c| &c.mqtt[..]);
        for (pos, (c, k)) in entries.iter().enumerate() {
            let sub = c.proto.borrow().mqtt().unwrap().subs[*k as usize];
            assert_eq!((sub.channel, sub.pos as usize), (id, pos), "{name}");
        }
        entries.iter().map(|(c, _)| Rc::as_ptr(c)).collect()
    }

    fn found(ch: &Channels<TcpStream>, topic: &str) -> Vec<*const Conn<TcpStream>> {
        let mut got = Vec::new();
        ch.for_each_mqtt(topic, |c| got.push(Rc::as_ptr(c)));
        got.sort();
        got
    }

    fn ptrs(cs: &[&Rc<Conn<TcpStream>>]) -> Vec<*const Conn<TcpStream>> {
        let mut v: Vec<_> = cs.iter().map(|c| Rc::as_ptr(c)).collect();
        v.sort();
        v
    }

    #[test]
    fn mqtt_subscribers_are_found_once_however_many_of_their_filters_match() {
        let (_l, cs) = mqtt_conns(4);
        let mut ch = Channels::default();
        for c in &cs[..3] {
            ch.subscribe_mqtt("a/x", c);
        }
        assert!(!ch.subscribe_mqtt("a/x", &cs[0]), "twice is once");
        assert!(ch.subscribe_mqtt("b", &cs[0]));
        ch.subscribe_wild("a/+", &cs[0]).unwrap();
        ch.subscribe_wild("a/+", &cs[3]).unwrap();
        ch.subscribe_wild("#", &cs[0]).unwrap();
        assert_eq!(check_mqtt(&ch, "a/x").len(), 3);
        assert_eq!(
            found(&ch, "a/x"),
            ptrs(&[&cs[0], &cs[1], &cs[2], &cs[3]]),
            "the first one matches by its channel, a/+ and #: once"
        );
        assert_eq!(found(&ch, "b"), ptrs(&[&cs[0]]));
        assert_eq!(found(&ch, "a/y"), ptrs(&[&cs[0], &cs[3]]));
        assert_eq!(found(&ch, "a/x"), ptrs(&[&cs[0], &cs[1], &cs[2], &cs[3]]));

        assert_eq!(ch.unsubscribe_mqtt("a/x", &cs[1]), Some(None));
        assert_eq!(ch.unsubscribe_mqtt("a/x", &cs[1]), None, "not in it");
        let mut left = check_mqtt(&ch, "a/x");
        left.sort();
        assert_eq!(left, ptrs(&[&cs[0], &cs[2]]));
        // The first leaves everything: "b" goes with it, "a/x" stays.
        let gone = ch.unsubscribe_mqtt_all(&cs[0]);
        assert_eq!(gone.iter().map(|n| &**n).collect::<Vec<_>>(), ["b"]);
        assert!(ch.get("b").is_none());
        check_mqtt(&ch, "a/x");
        assert_eq!(found(&ch, "a/x"), ptrs(&[&cs[2], &cs[3]]));
        assert_eq!(
            found(&ch, "z"),
            ptrs(&[]),
            "# left with its only subscriber"
        );
        assert!(ch.unsubscribe_wild("a/+", &cs[3]));
        assert!(!ch.unsubscribe_wild("a/+", &cs[3]));
        assert!(!ch.has_wildcards(), "the trie is empty again");
        assert_eq!(found(&ch, "a/x"), ptrs(&[&cs[2]]));
    }
}
