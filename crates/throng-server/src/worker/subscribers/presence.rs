//! Presence events (`--presence`, docs/channels.md): when a connection
//! with a token subject joins or leaves a channel that `--presence` names,
//! the worker tells the supervisor ([`Outside::presence`]), which hands
//! the event to every worker of the node (and, with `--redis`, of every
//! node); each tells the connections of several channels there that asked
//! for that channel's events (`presence=` at connect, `"presence":true`
//! in a subscribe).
//!
//! Bounded: an event is encoded once per worker and kind of connection
//! and written to each watcher as a message is, under the same
//! `--max-queue` (a watcher that cannot keep up with a flood of joins is
//! a slow consumer, closed 1008, like one that cannot keep up with
//! messages). A watcher costs one entry in its channel's map; a
//! connection that watches nothing costs nothing; with `--presence` off
//! the subscriber paths pay one check.

use std::collections::HashMap;
use std::rc::Rc;

use bytes::Bytes;
use throng_proto::sse;
use throng_proto::ws::{self, OpCode};

use super::{Outside, Subscribers};
use crate::auth::Grants;
use crate::control::PresenceEvent;
use crate::worker::conn::{Conn, SendError};
use crate::worker::rejoin::Kind;

/// The `--presence` patterns and who watches which channel here.
pub(crate) struct Presence<W> {
    /// `--presence`: the channels whose joins and leaves are told; `None`: off.
    on: Option<Grants>,
    /// The connections that asked for a channel's events, by channel, by
    /// connection ([`key`]).
    watchers: HashMap<Rc<str>, HashMap<usize, Rc<Conn<W>>>>,
}

impl<W> Default for Presence<W> {
    fn default() -> Self {
        Self {
            on: None,
            watchers: HashMap::new(),
        }
    }
}

/// A connection's key: its address, stable while it lives.
fn key<W>(c: &Conn<W>) -> usize {
    std::ptr::from_ref(c) as usize
}

/// Why a connection may not watch a channel's presence.
pub(crate) const NOT_ON: &str = "presence is not on for this channel (throng serve --presence)";

/// An SSE event's type for a join and a leave.
const SSE_JOIN: &str = "join";
const SSE_LEAVE: &str = "leave";

/// The frame of event `e` for a connection of `kind`: a WebSocket's JSON
/// text frame `{"join":{"channel":"a","sub":"alice"}}` (or `"leave"`), an
/// event stream's `join` (`leave`) event whose data is `<channel>\n<sub>`.
pub(crate) fn frame(kind: Kind, e: &PresenceEvent) -> Bytes {
    let what = if e.join { "join" } else { "leave" };
    if kind == Kind::SseMulti {
        let mut out = Vec::new();
        let event = if e.join { SSE_JOIN } else { SSE_LEAVE };
        sse::event(
            &mut out,
            None,
            Some(event),
            &format!("{}\n{}", e.channel, e.sub),
        );
        return Bytes::from(out);
    }
    let body = serde_json::json!({ what: { "channel": e.channel, "sub": e.sub } });
    ws::server_frame(OpCode::Text, body.to_string().as_bytes())
}

impl<O: Outside> Subscribers<O> {
    /// Sets the `--presence` patterns (none: presence events are off).
    pub(crate) fn set_presence(&self, patterns: &[String]) {
        self.presence.borrow_mut().on = if patterns.is_empty() {
            None
        } else {
            Grants::parse(patterns).ok()
        };
    }

    /// Whether `--presence` names `channel`.
    pub(crate) fn presence_on(&self, channel: &str) -> bool {
        (self.presence.borrow().on.as_ref()).is_some_and(|g| g.allows(channel))
    }

    /// `c` joined (`join`) or left `channel`: told to every node when the
    /// channel's presence is on and `c` has a token subject (MQTT clients
    /// are listed by `GET /api/channels/<c>` but not told).
    pub(super) fn presence_told(&self, c: &Conn<O::Wire>, channel: &str, join: bool) {
        if c.kind().is_mqtt() || !self.presence_on(channel) {
            return;
        }
        let Some(sub) = self.subject_of(c) else {
            return;
        };
        self.outside.presence(PresenceEvent {
            join,
            channel: channel.to_owned(),
            sub: sub.to_string(),
        });
    }

    /// `c` is leaving every channel (it closes, or the tables drop it): a
    /// leave for each one with presence on, and it watches nothing more.
    /// Called before the tables forget its channels; again after, it finds
    /// none.
    pub(super) fn presence_leave_all(&self, c: &Conn<O::Wire>) {
        if self.presence.borrow().on.is_none() || c.kind().is_mqtt() {
            return;
        }
        let names = self.channels.borrow().multi_channels(c);
        for name in names {
            self.unwatch(c, &name);
            self.presence_told(c, &name, false);
        }
    }

    /// `c` refreshed its token: its subject is the new token's. Where that
    /// changed who it is, each of its channels with presence on sees the
    /// old subject leave and the new one join.
    pub(super) fn presence_resubject(&self, c: &Conn<O::Wire>, subject: Option<Box<str>>) {
        let changed = self.subject_of(c).as_deref() != subject.as_deref();
        let names = if changed && self.presence.borrow().on.is_some() {
            self.channels.borrow().multi_channels(c)
        } else {
            Vec::new()
        };
        for name in &names {
            self.presence_told(c, name, false);
        }
        self.subject_refreshed(c, subject);
        for name in &names {
            self.presence_told(c, name, true);
        }
    }

    /// `c` (of several channels, in `channel`) gets `channel`'s joins and
    /// leaves from now on; refused when `--presence` does not name it.
    pub(super) fn watch(&self, c: &Rc<Conn<O::Wire>>, channel: &str) -> Result<(), &'static str> {
        if !self.presence_on(channel) {
            return Err(NOT_ON);
        }
        let mut p = self.presence.borrow_mut();
        let name: Rc<str> = Rc::from(channel);
        p.watchers
            .entry(name)
            .or_default()
            .insert(key(&**c), c.clone());
        Ok(())
    }

    /// `c` no longer gets `channel`'s events.
    pub(super) fn unwatch(&self, c: &Conn<O::Wire>, channel: &str) {
        let mut p = self.presence.borrow_mut();
        if let Some(w) = p.watchers.get_mut(channel) {
            w.remove(&key(c));
            if w.is_empty() {
                p.watchers.remove(channel);
            }
        }
    }

    /// Whether `c` gets `channel`'s events.
    #[cfg(test)]
    pub(crate) fn watching(&self, c: &Conn<O::Wire>, channel: &str) -> bool {
        (self.presence.borrow().watchers.get(channel)).is_some_and(|w| w.contains_key(&key(c)))
    }

    /// Presence event `e` (from this node or another): written to the
    /// connections here that watch its channel, the frame encoded once
    /// for each kind. Returns how many it was written to.
    pub(crate) fn presence_event(&self, e: &PresenceEvent) -> u64 {
        let mut failed: Vec<(Rc<Conn<O::Wire>>, SendError)> = Vec::new();
        let mut sent = 0;
        {
            let p = self.presence.borrow();
            let Some(watchers) = p.watchers.get(e.channel.as_str()) else {
                return 0;
            };
            let (mut ws, mut sse) = (None, None);
            for c in watchers.values() {
                if !c.is_open() {
                    continue;
                }
                let f = if c.kind() == Kind::SseMulti {
                    sse.get_or_insert_with(|| frame(Kind::SseMulti, e))
                } else {
                    ws.get_or_insert_with(|| frame(Kind::WsMulti, e))
                };
                match self.send(c, f) {
                    Ok(()) => sent += 1,
                    Err(err) => failed.push((c.clone(), err)),
                }
            }
        }
        let n = &self.counters.presence_events;
        n.set(n.get() + sent);
        for (c, err) in failed {
            self.send_failed(&c, err);
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::pair::{Got, Pair};

    fn text(s: &str) -> Got {
        Got::Text(s.to_owned())
    }

    fn join(channel: &str, sub: &str) -> Got {
        text(&format!(
            r#"{{"join":{{"channel":"{channel}","sub":"{sub}"}}}}"#
        ))
    }

    fn leave(channel: &str, sub: &str) -> Got {
        text(&format!(
            r#"{{"leave":{{"channel":"{channel}","sub":"{sub}"}}}}"#
        ))
    }

    fn ask(p: &mut Pair, i: usize, s: &str) -> Vec<Got> {
        p.clients[i].send(OpCode::Text, s.as_bytes());
        p.drive();
        p.clients[i].take()
    }

    #[test]
    fn watchers_get_the_joins_and_leaves_of_subjects_where_presence_is_on() {
        let mut p = Pair::defaults();
        p.subs.set_presence(&["room.*".to_owned()]);
        let watcher = p.connect_watching(&["room.a", "news"], None, &["room.a"]);
        let refused = ask(&mut p, watcher, r#"{"subscribe":"other","presence":true}"#);
        assert!(
            matches!(&refused[..], [Got::Text(t)] if t.contains("--presence") && t.contains("\"op\":\"subscribe\"")),
            "{refused:?}"
        );
        assert_eq!(p.subs.subscribers_of("other"), 0, "nothing changed");
        p.subs.subject_next(Some("alice".into()));
        let alice = p.connect("room.a");
        p.drive();
        assert_eq!(p.clients[watcher].take(), [join("room.a", "alice")]);
        // No subject, or a channel without presence: nothing is told.
        p.connect("room.a");
        p.subs.subject_next(Some("bob".into()));
        p.connect("news");
        p.drive();
        assert_eq!(p.clients[watcher].take(), []);
        // A watcher asking in-band sees its own join, as the other does.
        p.subs.subject_next(Some("carol".into()));
        let carol = p.connect_many(&[], None);
        assert_eq!(
            ask(&mut p, carol, r#"{"subscribe":"room.a","presence":true}"#),
            [text(r#"{"subscribed":"room.a"}"#), join("room.a", "carol")]
        );
        assert_eq!(p.clients[watcher].take(), [join("room.a", "carol")]);
        // A connection that closes leaves.
        p.clients[alice].close(1000);
        p.drive();
        assert_eq!(p.clients[watcher].take(), [leave("room.a", "alice")]);
        assert_eq!(p.clients[carol].take(), [leave("room.a", "alice")]);
        // One that unsubscribes leaves, and watches no more.
        assert_eq!(
            ask(&mut p, carol, r#"{"unsubscribe":"room.a"}"#),
            [text(r#"{"unsubscribed":"room.a"}"#)]
        );
        assert_eq!(p.clients[watcher].take(), [leave("room.a", "carol")]);
        let carol_conn = p.conn(carol).expect("open");
        assert!(!p.subs.watching(&carol_conn, "room.a"));
        p.subs.subject_next(Some("dave".into()));
        p.connect("room.a");
        p.drive();
        assert_eq!(p.clients[carol].take(), []);
        assert_eq!(p.clients[watcher].take(), [join("room.a", "dave")]);
        assert_eq!(p.subs.counters().presence_events.get(), 7);
    }

    #[test]
    fn a_watcher_that_cannot_keep_up_with_a_flood_of_joins_is_a_slow_consumer() {
        let mut limits = super::super::Limits::of(&crate::Config::default());
        limits.max_queue = 4096;
        let mut p = Pair::new(limits);
        p.subs.set_presence(&["*".to_owned()]);
        let slow = p.connect_watching(&["a"], None, &["a"]);
        let fast = p.connect_watching(&["a"], None, &["a"]);
        p.clients[slow].reading = false;
        p.set_room(slow, 256);
        for i in 0..1000 {
            p.subs.subject_next(Some(format!("user{i}").into()));
            p.connect("a");
            p.drive();
        }
        let got = p.clients[fast].take();
        assert_eq!(got.len(), 1000, "the one that reads gets every join");
        assert_eq!(got[999], join("a", "user999"));
        assert_eq!(p.subs.counters().slow_consumer.borrow()["queue"], 1);
        assert!(p.conn(slow).is_none(), "closed, its queue dropped");
    }

    #[test]
    fn an_event_is_a_json_frame_or_an_sse_event() {
        let e = PresenceEvent {
            join: true,
            channel: "room.a".into(),
            sub: "alice".into(),
        };
        assert_eq!(
            frame(Kind::WsMulti, &e),
            ws::server_frame(
                OpCode::Text,
                br#"{"join":{"channel":"room.a","sub":"alice"}}"#
            )
        );
        let leave = PresenceEvent { join: false, ..e };
        assert_eq!(
            &frame(Kind::SseMulti, &leave)[..],
            b"event: leave\ndata: room.a\ndata: alice\n\n"
        );
    }
}
