//! The worker's tables: every live subscriber by slot (what the sweep walks)
//! and the subscribers of each channel (what a fan-out walks).
//!
//! Both hold `Rc<Conn>`; a connection knows its slot and its position in its
//! channel's list, so joining and leaving are O(1). A WebSocket or SSE
//! subscriber is in one channel; an MQTT one in any number. An MQTT
//! subscriber's only subscription is kept as a WebSocket subscriber's
//! channel is (in the channel's list, by the connection's own fields: no
//! box, no list of its own). Once it has more, each is in the channel's
//! MQTT list, each entry naming the subscription it is in the connection's
//! list ([`super::mqtt::MqttState`]), which names the entry back, so that
//! leaving stays O(1) too.
//!
//! A connection of several channels (`throng.v1` at `/?channel=..`, or an
//! event stream of several) keeps its first channel as a WebSocket
//! subscriber's is (so with one it costs what one of `/<channel>` does),
//! and is in each other one's `multi` list; which, and where, is kept here
//! in a side table by connection, so a subscriber of one channel pays
//! nothing for it.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use throng_proto::mqtt::topic::{FilterTrie, TooDeep};

use super::conn::{Conn, NONE};
use super::mqtt::{Mqtt, MqttState, QOS, Sub, WildSub};
use crate::control::SessionSub;

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
        c.set_slot(slot);
        self.slots[slot as usize] = Some(c.clone());
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, c: &Conn<W>) {
        let slot = c.take_slot();
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
    /// Subscribers for whom this is their only channel: WebSocket and SSE
    /// ones, and MQTT ones with one subscription (its QoS in [`Mqtt::qos`]).
    pub(crate) subs: Vec<Rc<Conn<W>>>,
    /// MQTT subscribers, each with the index of this subscription in its
    /// connection's list and the QoS it was granted (0 or 1). Invariant:
    /// `c.mqtt().subs[k] == (this channel, position of (c, k, _) here)`.
    pub(crate) mqtt: Vec<(Rc<Conn<W>>, u32, u8)>,
    /// Connections of several channels, each with the index of this
    /// channel in its list ([`Channels::joined`]).
    pub(crate) multi: Vec<(Rc<Conn<W>>, u32)>,
}

impl<W> Channel<W> {
    /// Subscribers of every kind.
    pub(crate) fn len(&self) -> usize {
        self.subs.len() + self.mqtt.len() + self.multi.len()
    }

    fn is_empty(&self) -> bool {
        self.subs.is_empty() && self.mqtt.is_empty() && self.multi.is_empty()
    }
}

/// Where a connection of several channels is in one of them: the
/// channel's id and its position in that channel's `multi` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Joined {
    channel: u32,
    pos: u32,
}

/// A connection's key in the side table: its address, stable while it lives.
fn key<W>(c: &Conn<W>) -> usize {
    std::ptr::from_ref(c) as usize
}

/// The MQTT subscribers of one wildcard filter, each with the index of
/// this subscription in its connection's wildcard list and its QoS (as
/// [`Channel::mqtt`]).
pub(crate) type Wild<W> = Vec<(Rc<Conn<W>>, u32, u8)>;

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
    /// The channels of each connection of several (by [`key`]).
    /// Invariant: `list[j.channel].multi[j.pos] == (c, k)` for the `k`th
    /// entry `j` of `c`'s.
    /// A boxed slice, not a `Vec`: 8 bytes less in the table, and no
    /// spare capacity; joining and leaving (rare) reallocate it.
    joined: HashMap<usize, Box<[Joined]>>,
}

impl<W> Default for Channels<W> {
    fn default() -> Self {
        Self {
            by_name: HashMap::new(),
            list: Vec::new(),
            free: Vec::new(),
            wild: FilterTrie::new(),
            generation: Cell::new(0),
            joined: HashMap::new(),
        }
    }
}

impl<W> Channels<W> {
    /// Every channel with its name, in no order (the server API's listing).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Channel<W>)> {
        self.list.iter().flatten().map(|(n, ch)| (&**n, ch))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Channel<W>> {
        let id = *self.by_name.get(name)?;
        self.list[id as usize].as_ref().map(|(_, ch)| ch)
    }

    /// Whether some MQTT subscriber here has a wildcard filter.
    pub(crate) fn has_wildcards(&self) -> bool {
        !self.wild.is_empty()
    }

    /// Calls `found(c, sub, true)` with every MQTT subscriber with more
    /// than one subscription a message on `channel` reaches (those of its
    /// MQTT list, then those of every matching wildcard filter), each once,
    /// with the byte (QoS and options, [`super::mqtt::QOS`]) of the
    /// subscription found first; then `found(c, sub, false)` when a later
    /// one of its subscriptions has a higher QoS (the message goes at the
    /// highest, with that one's options). Those with one subscription are in
    /// [`Channel::subs`], and cannot be found twice.
    pub(crate) fn for_each_mqtt(
        &self,
        channel: &str,
        mut found: impl FnMut(&Rc<Conn<W>>, u8, bool),
    ) {
        let generation = self.generation.get() + 1;
        self.generation.set(generation);
        // `seen` holds the lookup's generation and, in its low two bits,
        // the highest QoS found for the connection in it.
        let mut visit = |c: &Rc<Conn<W>>, sub: u8| {
            let qos = sub & QOS;
            let mut proto = c.proto_mut();
            let state = proto.mqtt_mut().and_then(|m| m.more.as_deref_mut());
            let before = state.map(|m| {
                let before = m.seen;
                if before >> 2 != generation || qos > (before & 3) as u8 {
                    m.seen = generation << 2 | u64::from(qos);
                }
                before
            });
            drop(proto);
            match before {
                Some(b) if b >> 2 != generation => found(c, sub, true),
                Some(b) if qos > (b & 3) as u8 => found(c, sub, false),
                _ => {}
            }
        };
        if let Some(ch) = self.get(channel) {
            ch.mqtt.iter().for_each(|(c, _, q)| visit(c, *q));
        }
        self.wild.for_each_match(channel, |subs| {
            subs.iter().for_each(|(c, _, q)| visit(c, *q));
        });
    }

    /// The highest QoS of MQTT subscriber `c`'s subscriptions that match
    /// `channel` (0 when none does).
    pub(crate) fn qos_for(&mut self, c: &Conn<W>, channel: &str) -> u8 {
        let id = self.by_name.get(channel).copied();
        if id.is_some_and(|id| c.sub_pos() != NONE && c.channel() == id) {
            return c.proto().mqtt().map_or(0, |m| m.qos & QOS);
        }
        let Some(m) = state(c) else { return 0 };
        let mut qos = 0;
        if let Some(s) = m.subs.iter().find(|s| Some(s.channel) == id)
            && let Some((_, ch)) = self.list[s.channel as usize].as_ref()
        {
            qos = ch.mqtt.get(s.pos as usize).map_or(0, |e| e.2 & QOS);
        }
        for w in &m.wild {
            if throng_proto::mqtt::topic::matches(&w.filter, channel)
                && let Some(subs) = self.wild.get_mut(&w.filter)
            {
                qos = qos.max(subs.get(w.pos as usize).map_or(0, |e| e.2 & QOS));
            }
        }
        qos
    }

    /// MQTT subscriber `c`'s subscriptions: how many, and the bytes of
    /// their filters (what `--max-subscriptions` and `--max-filter-bytes`
    /// bound).
    pub(crate) fn mqtt_footprint(&self, c: &Conn<W>) -> (usize, usize) {
        let name_len = |id: u32| {
            self.list
                .get(id as usize)
                .and_then(Option::as_ref)
                .map_or(0, |(name, _)| name.len())
        };
        let (mut n, mut bytes) = (0, 0);
        if c.sub_pos() != NONE {
            n += 1;
            bytes += name_len(c.channel());
        }
        if let Some(m) = state(c) {
            n += m.subs.len() + m.wild.len();
            bytes += m.subs.iter().map(|s| name_len(s.channel)).sum::<usize>();
            bytes += m.wild.iter().map(|w| w.filter.len()).sum::<usize>();
            n += m.shares.len();
            bytes += m.shares.iter().map(|k| k.len()).sum::<usize>();
        }
        (n, bytes)
    }

    /// MQTT subscriber `c`'s subscriptions: each filter with its
    /// subscription byte (QoS and 5.0 options), for its session to keep.
    pub(crate) fn mqtt_subscriptions(&mut self, c: &Conn<W>) -> Vec<SessionSub> {
        let mut out = Vec::new();
        fn named<W>(
            list: &[Option<(Rc<str>, Channel<W>)>],
            id: u32,
        ) -> Option<(String, &Channel<W>)> {
            list.get(id as usize)
                .and_then(Option::as_ref)
                .map(|(name, ch)| (name.to_string(), ch))
        }
        if c.sub_pos() != NONE
            && let Some((filter, _)) = named(&self.list, c.channel())
        {
            let options = c.proto().mqtt().map_or(0, |m| m.qos);
            out.push(SessionSub { filter, options });
        }
        let Some(m) = state(c) else { return out };
        for s in &m.subs {
            if let Some((filter, ch)) = named(&self.list, s.channel) {
                let options = ch.mqtt.get(s.pos as usize).map_or(0, |e| e.2);
                out.push(SessionSub { filter, options });
            }
        }
        for w in &m.wild {
            let options = self
                .wild
                .get_mut(&w.filter)
                .and_then(|subs| subs.get(w.pos as usize))
                .map_or(0, |e| e.2);
            out.push(SessionSub {
                filter: w.filter.to_string(),
                options,
            });
        }
        out
    }

    /// Whether MQTT subscriber `c` has subscription `filter` already (an
    /// exact one, kept as its channel or in its list, or a wildcard one).
    pub(crate) fn has_mqtt_subscription(&self, filter: &str, c: &Conn<W>) -> bool {
        let Some(&id) = self.by_name.get(filter) else {
            return state(c).is_some_and(|m| m.wild.iter().any(|w| &*w.filter == filter));
        };
        if c.sub_pos() != NONE && c.channel() == id {
            return true;
        }
        state(c).is_some_and(|m| m.subs.iter().any(|s| s.channel == id))
    }

    /// Adds MQTT subscriber `c` to wildcard `filter` (a checked filter) at
    /// `qos`; a subscription it has already takes the new QoS.
    pub(crate) fn subscribe_wild(
        &mut self,
        filter: &str,
        c: &Rc<Conn<W>>,
        qos: u8,
    ) -> Result<(), TooDeep> {
        let had =
            state(c).and_then(|m| m.wild.iter().find(|w| &*w.filter == filter).map(|w| w.pos));
        if let Some(pos) = had {
            if let Some(entry) = self
                .wild
                .get_mut(filter)
                .and_then(|subs| subs.get_mut(pos as usize))
            {
                entry.2 = qos;
            }
            return Ok(());
        }
        // Found by the trie, it must be found in its channel's MQTT list
        // too, where a lookup marks what it found.
        self.spill(c);
        let subs = self.wild.get_or_insert_with(filter, Vec::new)?;
        let mut proto = c.proto_mut();
        if let Some(m) = proto.mqtt_mut().map(Mqtt::state_mut) {
            m.wild.push(WildSub {
                filter: Rc::from(filter),
                pos: subs.len() as u32,
            });
            subs.push((c.clone(), (m.wild.len() - 1) as u32, qos));
        }
        Ok(())
    }

    /// Takes MQTT subscriber `c` out of wildcard `filter`; false when it
    /// had no such subscription.
    pub(crate) fn unsubscribe_wild(&mut self, filter: &str, c: &Conn<W>) -> bool {
        let k = state(c).and_then(|m| m.wild.iter().position(|w| &*w.filter == filter));
        match k {
            Some(k) => {
                self.leave_wild(c, k);
                if let Some(m) = c.proto_mut().mqtt_mut() {
                    m.shrink();
                }
                true
            }
            None => false,
        }
    }

    /// Takes wildcard subscription `k` of `c` out of the trie and out of
    /// `c`'s list (whose last one moves into its place).
    fn leave_wild(&mut self, c: &Conn<W>, k: usize) {
        let (sub, moved) = {
            let mut proto = c.proto_mut();
            let Some(m) = proto.mqtt_mut().and_then(|m| m.more.as_deref_mut()) else {
                return;
            };
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
        if let Some((other, j, _)) = subs.get(sub.pos as usize)
            && let Some(m) = other.proto_mut().mqtt_mut()
            && let Some(m) = m.more.as_deref_mut()
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
                multi: Vec::new(),
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
        self.join(id, c);
        first
    }

    /// Puts `c` in channel `id`'s list, as its channel.
    fn join(&mut self, id: u32, c: &Rc<Conn<W>>) {
        if let Some((_, ch)) = self.list[id as usize].as_mut() {
            c.set_channel(id);
            c.set_sub_pos(ch.subs.len() as u32);
            ch.subs.push(c.clone());
        }
    }

    /// Adds MQTT subscriber `c` to channel `name` at `qos` (a subscription
    /// it has already takes the new QoS); returns whether it is the
    /// channel's first subscriber. A connection's only subscription is
    /// kept as a WebSocket subscriber's channel is; a second one moves it
    /// to the channel's MQTT list.
    pub(crate) fn subscribe_mqtt(&mut self, name: &str, c: &Rc<Conn<W>>, qos: u8) -> bool {
        let (id, first) = self.id_of(name);
        let inline = c.sub_pos() != NONE;
        if inline && c.channel() == id {
            if let Some(m) = c.proto_mut().mqtt_mut() {
                m.qos = qos;
            }
            return first;
        }
        let listed = state(c).is_some_and(|m| !m.subs.is_empty() || !m.wild.is_empty());
        if !inline && !listed {
            if let Some(m) = c.proto_mut().mqtt_mut() {
                m.qos = qos;
            }
            self.join(id, c);
            return first;
        }
        self.spill(c);
        let had = state(c).and_then(|m| m.subs.iter().find(|s| s.channel == id).map(|s| s.pos));
        match had {
            Some(pos) => {
                if let Some((_, ch)) = self.list[id as usize].as_mut()
                    && let Some(entry) = ch.mqtt.get_mut(pos as usize)
                {
                    entry.2 = qos;
                }
            }
            None => self.join_mqtt(id, c, qos),
        }
        first
    }

    /// Puts `c` in channel `id`'s MQTT list at `qos` (it is not in it).
    fn join_mqtt(&mut self, id: u32, c: &Rc<Conn<W>>, qos: u8) {
        let Some((_, ch)) = self.list[id as usize].as_mut() else {
            return;
        };
        let mut proto = c.proto_mut();
        let Some(m) = proto.mqtt_mut().map(Mqtt::state_mut) else {
            return;
        };
        m.subs.push(Sub {
            channel: id,
            pos: ch.mqtt.len() as u32,
        });
        ch.mqtt.push((c.clone(), (m.subs.len() - 1) as u32, qos));
    }

    /// Moves MQTT subscriber `c`'s subscription kept as its channel, if it
    /// has one, to that channel's MQTT list (it is getting another).
    fn spill(&mut self, c: &Rc<Conn<W>>) {
        if c.sub_pos() == NONE {
            return;
        }
        let id = c.channel();
        let qos = c.proto().mqtt().map_or(0, |m| m.qos);
        self.leave(c);
        self.join_mqtt(id, c, qos);
    }

    /// Takes MQTT subscriber `c` out of channel `name`: `None` when it was
    /// not in it, else the channel's name when `c` was its last subscriber.
    pub(crate) fn unsubscribe_mqtt(&mut self, name: &str, c: &Conn<W>) -> Option<Option<Rc<str>>> {
        let id = *self.by_name.get(name)?;
        if c.sub_pos() != NONE && c.channel() == id {
            return Some(self.unsubscribe(c));
        }
        let k = state(c)?.subs.iter().position(|s| s.channel == id)?;
        let gone = self.leave_mqtt(c, k);
        if let Some(m) = c.proto_mut().mqtt_mut() {
            m.shrink();
        }
        Some(gone)
    }

    /// Takes MQTT subscriber `c` out of every channel; returns the names of
    /// those it was the last subscriber of.
    pub(crate) fn unsubscribe_mqtt_all(&mut self, c: &Conn<W>) -> Vec<Rc<str>> {
        let mut gone = Vec::new();
        loop {
            let n = state(c).map_or(0, |m| m.wild.len());
            if n == 0 {
                break;
            }
            self.leave_wild(c, n - 1);
        }
        loop {
            let n = state(c).map_or(0, |m| m.subs.len());
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
            let mut proto = c.proto_mut();
            let m = proto.mqtt_mut()?.more.as_deref_mut()?;
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
        if let Some((other, j, _)) = ch.mqtt.get(sub.pos as usize)
            && let Some(m) = other.proto_mut().mqtt_mut()
            && let Some(m) = m.more.as_deref_mut()
        {
            // Another connection's: `c` is in a channel once.
            m.subs[*j as usize].pos = sub.pos;
        }
        self.forget_if_empty(id)
    }

    /// Takes `c` out of its channel; returns the channel's name when `c` was
    /// its last subscriber (the channel is gone).
    pub(crate) fn unsubscribe(&mut self, c: &Conn<W>) -> Option<Rc<str>> {
        let id = self.leave(c)?;
        self.forget_if_empty(id)
    }

    /// Takes `c` out of its channel's list; returns the channel's id.
    fn leave(&mut self, c: &Conn<W>) -> Option<usize> {
        let pos = c.take_sub_pos();
        if pos == NONE {
            return None;
        }
        let id = c.channel() as usize;
        let (_, ch) = self.list[id].as_mut()?;
        ch.subs.swap_remove(pos as usize);
        if let Some(moved) = ch.subs.get(pos as usize) {
            moved.set_sub_pos(pos);
        }
        Some(id)
    }

    /// Adds connection `c` (of several channels) to channel `name`: `None`
    /// when it is in it already, else whether it is the channel's first
    /// subscriber. While it has no channel kept as its own, this one is.
    pub(crate) fn subscribe_multi(&mut self, name: &str, c: &Rc<Conn<W>>) -> Option<bool> {
        if self.in_multi(name, c) {
            return None;
        }
        let (id, first) = self.id_of(name);
        if c.sub_pos() == NONE {
            self.join(id, c);
            return Some(first);
        }
        let (_, ch) = self.list[id as usize].as_mut()?;
        let mine = self.joined.entry(key(&**c)).or_default();
        let mut grown = std::mem::take(mine).into_vec();
        grown.push(Joined {
            channel: id,
            pos: ch.multi.len() as u32,
        });
        ch.multi.push((c.clone(), (grown.len() - 1) as u32));
        *mine = grown.into_boxed_slice();
        Some(first)
    }

    /// Whether connection `c` (of several channels) is in channel `name`.
    pub(crate) fn in_multi(&self, name: &str, c: &Conn<W>) -> bool {
        let Some(&id) = self.by_name.get(name) else {
            return false;
        };
        (c.sub_pos() != NONE && c.channel() == id)
            || self
                .joined
                .get(&key(c))
                .is_some_and(|mine| mine.iter().any(|j| j.channel == id))
    }

    /// The channels connection `c` (of several) is in, in the order it
    /// joined them (but for those that moved when one before them left).
    pub(crate) fn multi_channels(&self, c: &Conn<W>) -> Vec<Rc<str>> {
        let own = (c.sub_pos() != NONE).then(|| c.channel());
        let others = self.joined.get(&key(c)).into_iter().flatten();
        own.into_iter()
            .chain(others.map(|j| j.channel))
            .filter_map(|id| self.list[id as usize].as_ref())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Takes connection `c` (of several channels) out of channel `name`:
    /// `None` when it was not in it, else the channel's name when `c` was
    /// its last subscriber.
    pub(crate) fn unsubscribe_multi(&mut self, name: &str, c: &Conn<W>) -> Option<Option<Rc<str>>> {
        let id = *self.by_name.get(name)?;
        if c.sub_pos() != NONE && c.channel() == id {
            return Some(self.unsubscribe(c));
        }
        let k = self
            .joined
            .get(&key(c))?
            .iter()
            .position(|j| j.channel == id)?;
        Some(self.leave_multi(c, k))
    }

    /// Takes connection `c` (of several channels) out of every channel;
    /// returns the names of those it was the last subscriber of.
    pub(crate) fn unsubscribe_multi_all(&mut self, c: &Conn<W>) -> Vec<Rc<str>> {
        let mut gone: Vec<Rc<str>> = self.unsubscribe(c).into_iter().collect();
        while let Some(n) = self.joined.get(&key(c)).map(|mine| mine.len()) {
            if n == 0 {
                self.joined.remove(&key(c));
                break;
            }
            gone.extend(self.leave_multi(c, n - 1));
        }
        gone
    }

    /// Takes entry `k` of `c`'s channels out of its channel and out of
    /// `c`'s list (whose last entry moves into its place).
    fn leave_multi(&mut self, c: &Conn<W>, k: usize) -> Option<Rc<str>> {
        let mine = self.joined.get_mut(&key(c))?;
        let mut shrunk = std::mem::take(mine).into_vec();
        let j = shrunk.swap_remove(k);
        let moved = shrunk.get(k).copied();
        if shrunk.is_empty() {
            self.joined.remove(&key(c));
        } else {
            *mine = shrunk.into_boxed_slice();
        }
        if let Some(moved) = moved
            && let Some((_, ch)) = self.list[moved.channel as usize].as_mut()
        {
            ch.multi[moved.pos as usize].1 = k as u32;
        }
        let id = j.channel as usize;
        let (_, ch) = self.list[id].as_mut()?;
        ch.multi.swap_remove(j.pos as usize);
        if let Some((other, i)) = ch.multi.get(j.pos as usize)
            && let Some(theirs) = self.joined.get_mut(&key(&**other))
        {
            // Another connection's: `c` is in a channel once.
            theirs[*i as usize].pos = j.pos;
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

/// MQTT subscriber `c`'s boxed state, if it has one.
fn state<W>(c: &Conn<W>) -> Option<std::cell::Ref<'_, MqttState>> {
    std::cell::Ref::filter_map(c.proto(), |p| p.mqtt().and_then(Mqtt::state)).ok()
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::rc::Rc;

    use throng_proto::mqtt::Version;

    use super::{Channels, NONE, Slab, state};
    use crate::worker::conn::Conn;
    use crate::worker::mqtt::Mqtt;

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
            assert_eq!(c.sub_pos() as usize, i, "position invariant in {name}");
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
        assert_eq!(cs[1].sub_pos(), NONE);
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

        let slot = cs[2].slot();
        slab.remove(&cs[2]);
        assert_eq!(cs[2].slot(), NONE);
        assert!(slab.get(slot as usize).is_none());
        assert_eq!(slab.len(), 6);
        let (_l2, more) = conns(1);
        slab.insert(&more[0]);
        assert_eq!(more[0].slot(), slot, "free slots are reused");
        assert_eq!(slab.capacity(), 7);
        assert_eq!(slab.all().len(), 7);
    }

    fn mqtt_conns(n: usize) -> (TcpListener, Vec<Rc<Conn<TcpStream>>>) {
        let (l, cs) = conns(n);
        let cs = cs
            .into_iter()
            .map(|c| {
                let c = Rc::into_inner(c).unwrap();
                Rc::new(c.with_mqtt(Version::V5, Mqtt::new(0)))
            })
            .collect();
        (l, cs)
    }

    /// Every MQTT entry of `name` names a subscription of its connection
    /// that names it back, and those kept as the connection's channel have
    /// no other; returns the connections, by pointer (MQTT list, then those
    /// kept as their channel).
    fn check_mqtt(ch: &Channels<TcpStream>, name: &str) -> Vec<*const Conn<TcpStream>> {
        let id = *ch.by_name.get(name).unwrap_or(&NONE);
        let entries = ch.get(name).map_or(&[][..], |c| &c.mqtt[..]);
        for (pos, (c, k, _)) in entries.iter().enumerate() {
            assert_eq!(c.sub_pos(), NONE, "{name}: in one list only");
            let sub = state(c).unwrap().subs[*k as usize];
            assert_eq!((sub.channel, sub.pos as usize), (id, pos), "{name}");
        }
        let own = ch.get(name).map_or(&[][..], |c| &c.subs[..]);
        for c in own {
            assert!(
                state(c).is_none_or(|m| m.subs.is_empty() && m.wild.is_empty()),
                "{name}: kept as its channel, it has no other subscription"
            );
        }
        let mut all: Vec<_> = entries.iter().map(|(c, _, _)| Rc::as_ptr(c)).collect();
        all.extend(own.iter().map(Rc::as_ptr));
        all
    }

    /// Every MQTT subscriber a message on `topic` reaches, as a fan-out
    /// finds them: the channel's own, then the lookup's, each once.
    fn found(ch: &Channels<TcpStream>, topic: &str) -> Vec<*const Conn<TcpStream>> {
        let mut got: Vec<_> = ch
            .get(topic)
            .map_or(&[][..], |c| &c.subs[..])
            .iter()
            .map(Rc::as_ptr)
            .collect();
        ch.for_each_mqtt(topic, |c, _, first| {
            if first {
                got.push(Rc::as_ptr(c));
            }
        });
        let n = got.len();
        got.sort();
        got.dedup();
        assert_eq!(got.len(), n, "{topic}: found twice");
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
            ch.subscribe_mqtt("a/x", c, 0);
        }
        for c in &cs[..3] {
            assert!(
                c.proto().mqtt().unwrap().state().is_none(),
                "one subscription needs no box"
            );
        }
        assert!(!ch.subscribe_mqtt("a/x", &cs[0], 0), "twice is once");
        assert!(ch.subscribe_mqtt("b", &cs[0], 0));
        ch.subscribe_wild("a/+", &cs[0], 0).unwrap();
        ch.subscribe_wild("a/+", &cs[3], 0).unwrap();
        ch.subscribe_wild("#", &cs[0], 0).unwrap();
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

    /// What each connection a lookup finds gets the message at: the
    /// highest QoS of its matching subscriptions, whichever is met first.
    fn qos_found(ch: &Channels<TcpStream>, topic: &str) -> Vec<(*const Conn<TcpStream>, u8)> {
        let mut got: Vec<(*const Conn<TcpStream>, u8)> = ch
            .get(topic)
            .map_or(&[][..], |c| &c.subs[..])
            .iter()
            .map(|c| (Rc::as_ptr(c), c.proto().mqtt().unwrap().qos))
            .collect();
        ch.for_each_mqtt(topic, |c, qos, first| {
            if first {
                got.push((Rc::as_ptr(c), qos));
            } else if let Some(e) = got.iter_mut().find(|(p, _)| *p == Rc::as_ptr(c)) {
                e.1 = e.1.max(qos);
            }
        });
        got.sort();
        got
    }

    #[test]
    fn a_connection_two_of_whose_subscriptions_match_gets_the_higher_qos() {
        let (_l, cs) = mqtt_conns(3);
        let mut ch = Channels::default();
        // 0: exact at QoS 0, wildcard at 1 (met second); 1: exact at 1,
        // wildcard at 0; 2: wildcard at 0 only.
        ch.subscribe_mqtt("a/x", &cs[0], 0);
        ch.subscribe_wild("a/+", &cs[0], 1).unwrap();
        ch.subscribe_mqtt("a/x", &cs[1], 1);
        ch.subscribe_wild("#", &cs[1], 0).unwrap();
        ch.subscribe_wild("a/#", &cs[2], 0).unwrap();
        let mut want = vec![
            (Rc::as_ptr(&cs[0]), 1),
            (Rc::as_ptr(&cs[1]), 1),
            (Rc::as_ptr(&cs[2]), 0),
        ];
        want.sort();
        assert_eq!(qos_found(&ch, "a/x"), want);
        // A subscription made again takes its new QoS.
        ch.subscribe_wild("a/+", &cs[0], 0).unwrap();
        ch.subscribe_mqtt("a/x", &cs[1], 0);
        ch.subscribe_wild("a/#", &cs[2], 1).unwrap();
        let mut want = vec![
            (Rc::as_ptr(&cs[0]), 0),
            (Rc::as_ptr(&cs[1]), 0),
            (Rc::as_ptr(&cs[2]), 1),
        ];
        want.sort();
        assert_eq!(qos_found(&ch, "a/x"), want);
        check_mqtt(&ch, "a/x");
    }

    /// Every `multi` entry of every channel names a place in its
    /// connection's list that names it back; returns the channel's count.
    fn check_multi(ch: &Channels<TcpStream>, name: &str) -> usize {
        let Some(&id) = ch.by_name.get(name) else {
            return 0;
        };
        let channel = ch.get(name).expect("listed");
        for (pos, (c, k)) in channel.multi.iter().enumerate() {
            let mine = &ch.joined[&super::key(&**c)];
            let j = super::Joined {
                channel: id,
                pos: pos as u32,
            };
            assert_eq!(mine[*k as usize], j, "{name}");
            assert_ne!(c.channel(), id, "{name}: in one list only");
        }
        check(ch, name, channel.subs.len());
        channel.len()
    }

    #[test]
    fn connections_of_several_channels_leave_any_of_them_in_o1_and_keep_positions() {
        let (_l, cs) = conns(5);
        let mut ch = Channels::default();
        let names = ["a", "b", "c", "d"];
        for (i, c) in cs.iter().enumerate() {
            for n in &names[..1 + i % 4] {
                let first = ch.subscribe_multi(n, c).expect("not in it yet");
                assert_eq!(first, i == names.iter().position(|m| m == n).unwrap());
            }
            assert_eq!(c.channel(), ch.by_name["a"], "its first is kept as its own");
        }
        assert_eq!(ch.subscribe_multi("a", &cs[0]), None, "twice is once");
        assert_eq!(names.map(|n| check_multi(&ch, n)), [5, 3, 2, 1]);
        assert_eq!(ch.unsubscribe_multi("b", &cs[1]), Some(None));
        assert_eq!(ch.unsubscribe_multi("b", &cs[1]), None, "not in it");
        assert_eq!(
            ch.unsubscribe_multi("d", &cs[3]).flatten().as_deref(),
            Some("d")
        );
        assert_eq!(names.map(|n| check_multi(&ch, n)), [5, 2, 2, 0]);
        let names_of = |c| {
            ch.multi_channels(c)
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names_of(&cs[1]), ["a"]);
        let gone = ch.unsubscribe_multi_all(&cs[2]);
        assert!(gone.is_empty(), "a, b and c have others: {gone:?}");
        assert_eq!(names.map(|n| check_multi(&ch, n)), [4, 1, 1, 0]);
        for c in &cs {
            ch.unsubscribe_multi_all(c);
        }
        assert!(
            ch.joined.is_empty() && ch.iter().next().is_none(),
            "nothing left"
        );
    }
}
