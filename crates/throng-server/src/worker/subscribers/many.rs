//! Connections of several channels (docs/channels.md): a WebSocket
//! offering `throng.v1` at `/?channel=a&channel=b`, or an event stream at
//! `/sse/?channel=a&channel=b`. They join their channels at connect, and a
//! WebSocket one asks for more in text frames ([`crate::worker::multi`]):
//! subscribe (after an id: that channel's recovery), unsubscribe, publish
//! (acknowledged once the relay took it, with the message's id), and a
//! token refresh. Each request is answered; a bad one changes nothing.
//!
//! What a connection of one channel costs is untouched: the channels of
//! these are in the tables' side lists ([`super::super::table`]), and what
//! their credential grants is kept here, by connection.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::rc::Rc;

use bytes::Bytes;

use super::{Live, Outside, Rejoin, Subscribers};
use crate::auth::Verifier;
use crate::control::Message;
use crate::history::MessageId;
use crate::metrics::CloseReason;
use crate::worker::conn::{Conn, SendError};
use crate::worker::mqtt_auth::{self, MqttGrants};
use crate::worker::multi::{self, Op};
use crate::worker::rejoin::Kind;

/// What the subscribers keep for connections of several channels.
pub(crate) struct Many<W> {
    /// What each one's credential grants, by connection; none is kept
    /// where nothing is guarded.
    grants: RefCell<HashMap<usize, Box<MqttGrants>>>,
    /// Their publishes awaiting the relay's answer, by request: the
    /// connection and the channel, for the acknowledgement.
    owed: RefCell<HashMap<u64, Owed<W>>>,
    /// How many of `owed` are each connection's (by [`key`]); none is
    /// listed at 0. Bounds what one client can have waiting.
    in_flight: RefCell<HashMap<usize, u32>>,
    /// What a refreshed token is checked by (reloaded with the keys).
    verifier: RefCell<Option<Rc<Verifier>>>,
}

/// A publish awaiting the relay: who asked, on which channel.
type Owed<W> = (Rc<Conn<W>>, Rc<str>);

impl<W> Default for Many<W> {
    fn default() -> Self {
        Self {
            grants: RefCell::default(),
            owed: RefCell::default(),
            in_flight: RefCell::default(),
            verifier: RefCell::default(),
        }
    }
}

/// A connection's key in [`Many::grants`]: its address, stable while it lives.
fn key<W>(c: &Conn<W>) -> usize {
    std::ptr::from_ref(c) as usize
}

/// Publishes one connection may have awaiting the relay's answer; past it
/// a publish is refused until acknowledgements come (as MQTT's receive
/// maximum bounds a client's QoS 1 publishes).
pub(crate) const MAX_IN_FLIGHT: u32 = 64;

/// Why a subscription ended when the refreshed token no longer grants it.
const NOT_GRANTED_NOW: &str = "not granted by the refreshed token";

/// The close code of a WebSocket of one channel whose refreshed token does
/// not grant its channel (docs/auth.md: 4001-4099 are throng's).
pub(crate) const CLOSE_NOT_GRANTED: u16 = 4003;

impl<O: Outside> Subscribers<O> {
    /// Sets the token verifier in-band refreshes are checked by.
    pub(crate) fn set_verifier(&self, v: Option<Rc<Verifier>>) {
        *self.many.verifier.borrow_mut() = v;
    }

    /// Registers a connection of several channels (its kind set): into
    /// each of `channels` (already checked against its grants and the
    /// limit), each after `since` when given; keeps its `grants`.
    pub(crate) fn subscribe_many(
        &self,
        c: Conn<O::Wire>,
        channels: &[&str],
        since: Option<MessageId>,
        grants: Option<Box<MqttGrants>>,
        presence: &[&str],
    ) -> io::Result<()> {
        let c = self.admit_quiet(c, None)?;
        if let Some(g) = grants {
            self.many.grants.borrow_mut().insert(key(&*c), g);
        }
        for name in channels {
            self.join_many(&c, name, since);
        }
        // Checked by the caller: each is one of `channels`, with presence on.
        for name in presence {
            let _ = self.watch(&c, name);
        }
        if c.has_rest() {
            self.on_readable(&c, false);
        }
        Ok(())
    }

    /// Puts `c` in channel `name` (it is not in it); with `since`, what the
    /// channel kept after it comes first.
    fn join_many(&self, c: &Rc<Conn<O::Wire>>, name: &str, since: Option<MessageId>) {
        let joined = self.channels.borrow_mut().subscribe_multi(name, c);
        if joined == Some(true) {
            self.outside.channel_interest(name, true);
        }
        if joined.is_some() {
            self.presence_told(c, name, true);
        }
        let Some(since) = since else { return };
        c.set_rejoining(true);
        let request = self.next_rejoin.get();
        self.next_rejoin.set(request + 1);
        self.rejoins.borrow_mut().push(Rejoin {
            request,
            conn: c.clone(),
            channel: Some(Rc::from(name)),
            since,
            held: Vec::new(),
            held_bytes: 0,
            fence: None,
        });
        self.outside.recover(request, name, since);
    }

    /// Takes connection `c` (of several channels) out of all of them.
    pub(super) fn leave_all(&self, c: &Conn<O::Wire>) {
        let gone = self.channels.borrow_mut().unsubscribe_multi_all(c);
        for name in gone {
            self.outside.channel_interest(&name, false);
        }
        self.many.grants.borrow_mut().remove(&key(c));
    }

    /// Takes `c` out of channel `name` (and its recovery there, if one is
    /// under way); false when it was not in it.
    fn leave_one(&self, c: &Conn<O::Wire>, name: &str) -> bool {
        let left = self.channels.borrow_mut().unsubscribe_multi(name, c);
        let Some(gone) = left else { return false };
        if let Some(name) = gone {
            self.outside.channel_interest(&name, false);
        }
        self.unwatch(c, name);
        self.presence_told(c, name, false);
        let mut rejoins = self.rejoins.borrow_mut();
        rejoins.retain(|r| !(std::ptr::eq(&*r.conn, c) && r.channel.as_deref() == Some(name)));
        if !rejoins.iter().any(|r| std::ptr::eq(&*r.conn, c)) {
            c.set_rejoining(false);
        }
        true
    }

    /// What a connection of several channels does with live message `m`
    /// while some of its channels recover: those held, repeated or sent as
    /// a single channel's rejoin ([`Self::live`]); the others' sent.
    pub(super) fn live_multi(&self, c: &Rc<Conn<O::Wire>>, m: &Message) -> Result<Live, SendError> {
        let mut rejoins = self.rejoins.borrow_mut();
        let mine = |r: &Rejoin<O::Wire>| Rc::ptr_eq(&r.conn, c);
        let Some(k) = rejoins
            .iter()
            .position(|r| mine(r) && r.channel.as_deref() == Some(&*m.channel))
        else {
            if !rejoins.iter().any(mine) {
                c.set_rejoining(false);
            }
            return Ok(Live::Send);
        };
        let live = self.rejoin_live(&mut rejoins[k], m)?;
        if matches!(live, Live::Send) {
            rejoins.swap_remove(k);
            if !rejoins.iter().any(mine) {
                c.set_rejoining(false);
            }
        }
        Ok(live)
    }

    /// Sends `frame` to `c`; false when that ended it.
    pub(super) fn answer(&self, c: &Rc<Conn<O::Wire>>, frame: &Bytes) -> bool {
        match self.send(c, frame) {
            Ok(()) => true,
            Err(e) => {
                self.send_failed(c, e);
                false
            }
        }
    }

    /// One text frame of a WebSocket of several channels: its request,
    /// done and answered. False when the connection ended.
    pub(super) fn on_request(&self, c: &Rc<Conn<O::Wire>>, text: &[u8]) -> bool {
        if !c.is_open() {
            return true;
        }
        match multi::parse(text) {
            Err(e) => self.answer(c, &multi::error(&e)),
            Ok(Op::Subscribe {
                channel,
                since,
                presence,
            }) => self.request_subscribe(c, &channel, since, presence),
            Ok(Op::Unsubscribe { channel }) => {
                if self.leave_one(c, &channel) {
                    self.answer(c, &multi::unsubscribed(&channel, None))
                } else {
                    let e = multi::refusal("not subscribed", "unsubscribe", Some(&channel));
                    self.answer(c, &e)
                }
            }
            Ok(Op::Publish {
                channel,
                text,
                payload,
            }) => self.request_publish(c, &channel, text, payload),
            Ok(Op::Refresh { token }) => self.request_refresh(c, &token),
        }
    }

    /// `{"subscribe":..}`: checked (not in it already, under the limit, a
    /// live token that grants it, presence on when asked for), then
    /// answered and joined.
    fn request_subscribe(
        &self,
        c: &Rc<Conn<O::Wire>>,
        name: &str,
        since: Option<MessageId>,
        presence: bool,
    ) -> bool {
        let held = {
            let channels = self.channels.borrow();
            if channels.in_multi(name, c) {
                None
            } else {
                Some(channels.multi_channels(c).len())
            }
        };
        let grants = self.many.grants.borrow();
        let why = match held {
            None => Some("already subscribed".to_owned()),
            Some(n) if n >= self.limits.max_channels => Some(format!(
                "this connection is in {n} channels, the most --max-channels-per-connection allows"
            )),
            Some(_) if c.expired(self.wall.get()) => Some("token expired".to_owned()),
            Some(_) if !mqtt_auth::may_subscribe(grants.get(&key(&**c)).map(|g| &**g), name) => {
                Some("not granted by the token".to_owned())
            }
            Some(_) if presence && !self.presence_on(name) => Some(super::presence::NOT_ON.into()),
            Some(_) => None,
        };
        drop(grants);
        if let Some(why) = why {
            return self.answer(c, &multi::refusal(why, "subscribe", Some(name)));
        }
        if !self.answer(c, &multi::subscribed(name)) {
            return false;
        }
        if presence {
            let _ = self.watch(c, name);
        }
        self.join_many(c, name, since);
        true
    }

    /// `{"publish":..}`: checked (publishing served here, the size, a live
    /// token whose `publish` claim grants it), then relayed; answered
    /// when the relay answers ([`Self::many_published`]).
    fn request_publish(
        &self,
        c: &Rc<Conn<O::Wire>>,
        name: &str,
        text: bool,
        payload: Vec<u8>,
    ) -> bool {
        let grants = self.many.grants.borrow();
        let granted = mqtt_auth::may_publish(
            self.limits.publish_guarded,
            grants.get(&key(&**c)).map(|g| &**g),
            name,
        );
        drop(grants);
        let waiting = self
            .many
            .in_flight
            .borrow()
            .get(&key(&**c))
            .copied()
            .unwrap_or(0);
        let why = if !self.limits.mqtt_publish {
            Some("publishing is not served on this address (--publish-listen)".to_owned())
        } else if payload.len() > self.limits.max_message {
            Some(format!(
                "too large: {} bytes, over --max-message ({} bytes)",
                payload.len(),
                self.limits.max_message
            ))
        } else if c.expired(self.wall.get()) {
            Some("token expired".to_owned())
        } else if waiting >= MAX_IN_FLIGHT {
            Some(format!(
                "{waiting} publishes await the relay's answer: wait for their acknowledgements"
            ))
        } else if !granted {
            Some("not granted by the token's publish claim".to_owned())
        } else {
            None
        };
        if let Some(why) = why {
            return self.answer(c, &multi::refusal(why, "publish", Some(name)));
        }
        let m = Message {
            id: 0,
            message: MessageId::NONE,
            text,
            at_most_once: false,
            exactly_once: false,
            properties: Bytes::new(),
            retained: false,
            origin: 0,
            channel: name.to_owned(),
            payload: Bytes::from(payload),
        };
        let request = self.outside.publish(m, None);
        self.many
            .owed
            .borrow_mut()
            .insert(request, (c.clone(), Rc::from(name)));
        *self
            .many
            .in_flight
            .borrow_mut()
            .entry(key(&**c))
            .or_default() += 1;
        true
    }

    /// The relay's answer to publish `request`, if it was one of these:
    /// acknowledged with message `id`, or refused with the reason. Returns
    /// whether it was.
    pub(super) fn many_published(
        &self,
        request: u64,
        id: MessageId,
        refused: Option<&[u8]>,
    ) -> bool {
        let Some((c, name)) = self.many.owed.borrow_mut().remove(&request) else {
            return false;
        };
        let mut in_flight = self.many.in_flight.borrow_mut();
        if let Some(n) = in_flight.get_mut(&key(&*c)) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&key(&*c));
            }
        }
        drop(in_flight);
        if c.is_open() {
            let frame = match refused {
                None => multi::published(&name, id),
                Some(why) => {
                    let why = format!("not published: {}", String::from_utf8_lossy(why));
                    multi::refusal(why, "publish", Some(&name))
                }
            };
            self.answer(&c, &frame);
        }
        true
    }

    /// A text frame from a WebSocket of one channel: `{"refresh":..}` is
    /// done and answered ([`Self::refresh_one`]); anything else is ignored,
    /// as it always was. False when the connection ended.
    pub(super) fn on_single_text(&self, c: &Rc<Conn<O::Wire>>, text: &[u8]) -> bool {
        if text.first() != Some(&b'{') || !c.is_open() {
            return true;
        }
        match multi::parse(text) {
            Ok(Op::Refresh { token }) => self.refresh_one(c, &token),
            _ => true,
        }
    }

    /// `{"refresh":..}` on a WebSocket of one channel: a valid token's
    /// expiry (and subject) replace the old; one that does not grant the
    /// channel closes the connection ([`CLOSE_NOT_GRANTED`]). A token that
    /// does not verify changes nothing.
    fn refresh_one(&self, c: &Rc<Conn<O::Wire>>, token: &str) -> bool {
        let Some(admitted) = self.verify_refresh(c, token) else {
            return c.is_open();
        };
        let own = self.channels.borrow().multi_channels(c);
        if !own
            .iter()
            .all(|name| mqtt_auth::may_subscribe(admitted.grants.as_deref(), name))
        {
            let reason = NOT_GRANTED_NOW;
            self.close(c, CLOSE_NOT_GRANTED, reason, CloseReason::Disconnected);
            return false;
        }
        c.set_expires(admitted.expires);
        self.presence_resubject(c, admitted.subject);
        self.answer(c, &multi::refreshed(admitted.expires))
    }

    /// A refresh's token, checked: what it admits, or `None` when it was
    /// refused (and answered so).
    fn verify_refresh(&self, c: &Rc<Conn<O::Wire>>, token: &str) -> Option<mqtt_auth::Admitted> {
        let verifier = self.many.verifier.borrow().clone();
        let Some(v) = verifier else {
            let why = "this server takes no tokens (no --auth-* keys): nothing to refresh";
            self.answer(c, &multi::refusal(why, "refresh", None));
            return None;
        };
        match mqtt_auth::check(true, Some(&v), None, token.as_bytes(), self.wall.get()) {
            Ok(a) => Some(a),
            Err(refusal) => {
                self.counters.refused(refusal.label());
                self.answer(c, &multi::refusal(refusal.to_string(), "refresh", None));
                None
            }
        }
    }

    /// `{"refresh":..}`: a valid token's grants and expiry replace the
    /// old; each channel it does not grant ends, saying why. A token that
    /// does not verify changes nothing.
    fn request_refresh(&self, c: &Rc<Conn<O::Wire>>, token: &str) -> bool {
        let Some(admitted) = self.verify_refresh(c, token) else {
            return c.is_open();
        };
        c.set_expires(admitted.expires);
        self.presence_resubject(c, admitted.subject);
        let revoked: Vec<_> = {
            let mut grants = self.many.grants.borrow_mut();
            match admitted.grants {
                Some(g) => grants.insert(key(&**c), g),
                None => grants.remove(&key(&**c)),
            };
            let now = grants.get(&key(&**c)).map(|g| &**g);
            self.channels
                .borrow()
                .multi_channels(c)
                .into_iter()
                .filter(|name| !mqtt_auth::may_subscribe(now, name))
                .collect()
        };
        if !self.answer(c, &multi::refreshed(admitted.expires)) {
            return false;
        }
        revoked
            .iter()
            .all(|name| self.end_subscription(c, name, NOT_GRANTED_NOW))
    }

    /// Ends `c`'s subscription to `name` for the server's `reason`: a
    /// WebSocket is told (`{"unsubscribed":..,"reason":..}`), an event
    /// stream, which cannot be, ends. False when the connection ended.
    pub(super) fn end_subscription(&self, c: &Rc<Conn<O::Wire>>, name: &str, reason: &str) -> bool {
        if c.kind() == Kind::SseMulti {
            self.close(c, 0, reason, CloseReason::Disconnected);
            return false;
        }
        self.leave_one(c, name);
        self.answer(c, &multi::unsubscribed(name, Some(reason)))
    }
}

#[cfg(test)]
mod tests {
    //! Both ends in memory ([`Pair`]); the CLI tests (`tests/cli/channels.rs`)
    //! run the same with real sockets and clients.

    use bytes::Bytes;
    use throng_proto::ws::OpCode;

    use crate::control::Message;
    use crate::history::{Kept, MessageId};
    use crate::worker::pair::{Got, Pair};

    fn text(s: &str) -> Got {
        Got::Text(s.to_owned())
    }

    fn message(channel: &str, seq: u64, payload: &str) -> Message {
        Message {
            message: MessageId { epoch: 1, seq },
            ..Message::sample(seq, channel, payload.to_owned())
        }
    }

    #[test]
    fn requests_are_answered_and_messages_say_their_channel() {
        let mut limits = super::super::Limits::of(&crate::Config::default());
        limits.max_channels = 3;
        let mut p = Pair::new(limits);
        let m = p.connect_many(&["a", "b"], None);
        let one = p.connect("a");
        assert_eq!(p.publish("a", "hi"), 2);
        assert_eq!(p.clients[m].take(), [text("a\n\nhi")]);
        assert_eq!(
            p.clients[one].take(),
            [text("hi")],
            "one channel: as before"
        );
        let ask = |p: &mut Pair, s: &str| {
            p.clients[m].send(OpCode::Text, s.as_bytes());
            p.drive();
            p.clients[m].take()
        };
        assert_eq!(
            ask(&mut p, r#"{"subscribe":"c"}"#),
            [text(r#"{"subscribed":"c"}"#)]
        );
        assert_eq!(
            ask(&mut p, r#"{"subscribe":"c"}"#),
            [text(
                r#"{"channel":"c","error":"already subscribed","op":"subscribe"}"#
            )]
        );
        let over = ask(&mut p, r#"{"subscribe":"d"}"#);
        assert!(
            matches!(&over[..], [Got::Text(t)] if t.contains("--max-channels-per-connection")),
            "{over:?}"
        );
        assert!(matches!(&ask(&mut p, "{nope")[..], [Got::Text(t)] if t.contains("not JSON")));
        assert!(
            matches!(&ask(&mut p, r#"{"jump":"a"}"#)[..], [Got::Text(t)] if t.contains("one of"))
        );
        p.clients[m].send(OpCode::Binary, b"x");
        p.drive();
        assert!(matches!(&p.clients[m].take()[..], [Got::Text(t)] if t.contains("text frames")));
        assert_eq!(p.subs.subscribers_of("c"), 1);
        assert_eq!(
            ask(&mut p, r#"{"unsubscribe":"a"}"#),
            [text(r#"{"unsubscribed":"a"}"#)]
        );
        assert!(
            matches!(&ask(&mut p, r#"{"unsubscribe":"a"}"#)[..], [Got::Text(t)] if t.contains("not subscribed"))
        );
        assert_eq!(p.publish("a", "x"), 1, "only the single-channel one");
        assert_eq!(p.clients[m].take(), []);
        assert_eq!(p.publish("c", "y"), 1);
        assert_eq!(p.clients[m].take(), [text("c\n\ny")]);
        // A publish is relayed, and acknowledged when the relay answers.
        assert_eq!(ask(&mut p, r#"{"publish":"b","data":"up"}"#), []);
        let published = p.subs.outside().published.borrow().clone();
        assert_eq!(published, [("b".to_owned(), Bytes::from_static(b"up"))]);
        p.subs
            .publish_answered(1, MessageId { epoch: 1, seq: 9 }, None);
        p.drive();
        assert_eq!(
            p.clients[m].take(),
            [text(r#"{"id":"1-9","published":"b"}"#)]
        );
        // At most MAX_IN_FLIGHT wait for the relay; then one more may go.
        for _ in 0..super::MAX_IN_FLIGHT {
            assert_eq!(ask(&mut p, r#"{"publish":"b","data":"n"}"#), []);
        }
        let full = ask(&mut p, r#"{"publish":"b","data":"n"}"#);
        assert!(
            matches!(&full[..], [Got::Text(t)] if t.contains("await the relay")),
            "{full:?}"
        );
        let refused = Some(&b"Redis is unreachable"[..]);
        p.subs.publish_answered(2, MessageId::NONE, refused);
        p.drive();
        let why = r#"{"channel":"b","error":"not published: Redis is unreachable","op":"publish"}"#;
        assert_eq!(p.clients[m].take(), [text(why)]);
        assert_eq!(ask(&mut p, r#"{"publish":"b","data":"n"}"#), []);
        // Closed: out of every channel, the single-channel one untouched.
        p.clients[m].close(1000);
        p.drive();
        assert_eq!(p.subs.subscribers_of("b"), 0);
        assert_eq!(p.subs.subscribers_of("c"), 0);
        assert_eq!(p.subs.subscribers_of("a"), 1);
    }

    #[test]
    fn one_channel_recovers_while_the_others_go_on() {
        let mut p = Pair::defaults();
        let m = p.connect_many(&["a"], None);
        let since = r#"{"subscribe":"b","since":"1-5"}"#;
        p.clients[m].send(OpCode::Text, since.as_bytes());
        p.drive();
        assert_eq!(p.clients[m].take(), [text(r#"{"subscribed":"b"}"#)]);
        let (request, channel, from) = p.subs.outside().recovers.borrow()[0].clone();
        assert_eq!(
            (channel.as_str(), from),
            ("b", MessageId { epoch: 1, seq: 5 })
        );
        p.subs.fanout(&message("b", 7, "held"));
        p.subs.fanout(&message("a", 8, "live"));
        p.drive();
        assert_eq!(
            p.clients[m].take(),
            [text("a\n1-8\nlive")],
            "b is held, a is not"
        );
        let kept = |seq: u64, s: &str| Kept {
            id: MessageId { epoch: 1, seq },
            text: true,
            payload: Bytes::copy_from_slice(s.as_bytes()),
        };
        p.subs
            .recovered(request, true, vec![kept(6, "missed"), kept(7, "held")]);
        p.drive();
        assert_eq!(
            p.clients[m].take(),
            [text("b\n1-6\nmissed"), text("b\n1-7\nheld")],
            "each once, in order"
        );
        p.subs.fanout(&message("b", 9, "next"));
        p.drive();
        assert_eq!(p.clients[m].take(), [text("b\n1-9\nnext")]);
    }
}
