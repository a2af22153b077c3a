//! Test kit: a worker's subscribers and their clients with both ends in
//! memory, quinn's `Pair` as the model. Each connection is a [`Pipe`] whose
//! server-to-client direction holds at most `room` unread bytes (a socket's
//! send buffer); each client speaks RFC 6455 in the client role
//! (`throng_proto::ws`); time is the worker's tick, advanced by the test.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use throng_proto::ws::{self, Decoder, Frame, OpCode, Role};

use super::conn::{Conn, Wire};
use super::rejoin::Kind;
use super::subscribers::{Limits, Outside, Subscribers};
use crate::control::{Claim, Message};
use crate::history::MessageId;
use crate::metrics::Counters;
use crate::wheel::TICK;

/// Room a new pipe gives the server: plenty, unless a test says otherwise.
const ROOM: usize = 1 << 20;

/// Both directions of one connection.
pub(crate) struct Pipe {
    /// Written by the server, not yet read by the client.
    to_client: RefCell<VecDeque<u8>>,
    /// How many unread bytes `to_client` may hold.
    room: Cell<usize>,
    /// Sent by the client, not yet read by the server.
    to_server: RefCell<VecDeque<u8>>,
    /// The client sent FIN (after `to_server`).
    client_fin: Cell<bool>,
    /// The connection was reset: every call fails.
    reset: Cell<bool>,
    /// The server sent FIN.
    server_fin: Cell<bool>,
    /// The server dropped its end (its `Conn` is gone from every table).
    server_closed: Cell<bool>,
    /// Readiness registration, as epoll would keep it.
    watched: Cell<bool>,
    write_wanted: Cell<bool>,
}

impl Pipe {
    fn new(room: usize) -> Rc<Self> {
        Rc::new(Self {
            to_client: RefCell::default(),
            room: Cell::new(room),
            to_server: RefCell::default(),
            client_fin: Cell::new(false),
            reset: Cell::new(false),
            server_fin: Cell::new(false),
            server_closed: Cell::new(false),
            watched: Cell::new(false),
            write_wanted: Cell::new(false),
        })
    }
}

/// The server's end of a [`Pipe`]. Dropping it closes the socket.
pub(crate) struct MemWire(Rc<Pipe>);

impl Drop for MemWire {
    fn drop(&mut self) {
        self.0.server_closed.set(true);
    }
}

impl Wire for MemWire {
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let p = &self.0;
        if p.reset.get() {
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        let mut q = p.to_server.borrow_mut();
        if q.is_empty() {
            return if p.client_fin.get() {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(q.len());
        for (b, x) in buf.iter_mut().zip(q.drain(..n)) {
            *b = x;
        }
        Ok(n)
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let p = &self.0;
        if p.reset.get() || p.server_fin.get() {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let mut q = p.to_client.borrow_mut();
        let room = p.room.get().saturating_sub(q.len());
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        if room == 0 && want > 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut left = room;
        for b in bufs {
            let n = b.len().min(left);
            q.extend(&b[..n]);
            left -= n;
        }
        Ok(room - left)
    }

    fn shutdown_write(&self) {
        self.0.server_fin.set(true);
    }
}

/// What the subscribers see around them: the pipes' registration flags,
/// and the channel interest reported.
#[derive(Default)]
pub(crate) struct Around {
    pub(crate) interest: RefCell<Vec<(String, bool)>>,
    /// Rejoins asked for: request, channel, since.
    pub(crate) recovers: RefCell<Vec<(u64, String, MessageId)>>,
    /// What MQTT clients published: channel, payload.
    pub(crate) published: RefCell<Vec<(String, Bytes)>>,
    /// Retained messages asked for: request, filters.
    pub(crate) retained_asks: RefCell<Vec<(u64, Vec<String>)>>,
    /// Presence events told, not yet handed back by [`Pair::drive`].
    pub(crate) presence: RefCell<Vec<crate::control::PresenceEvent>>,
}

impl Outside for Around {
    type Wire = MemWire;

    fn watch(&self, wire: &MemWire, _slot: u32) -> io::Result<()> {
        wire.0.watched.set(true);
        Ok(())
    }

    fn want_write(&self, wire: &MemWire, _slot: u32, on: bool) {
        wire.0.write_wanted.set(on);
    }

    fn forget(&self, wire: &MemWire, _tag: u32) {
        wire.0.watched.set(false);
        wire.0.write_wanted.set(false);
    }

    fn channel_interest(&self, channel: &str, subscribed: bool) {
        self.interest
            .borrow_mut()
            .push((channel.to_owned(), subscribed));
    }

    fn recover(&self, request: u64, channel: &str, since: MessageId) {
        self.recovers
            .borrow_mut()
            .push((request, channel.to_owned(), since));
    }

    fn publish(&self, m: Message, _retain: Option<u8>) -> u64 {
        let mut published = self.published.borrow_mut();
        published.push((m.channel, m.payload));
        published.len() as u64
    }

    fn ask_retained(&self, request: u64, filters: Vec<String>) {
        self.retained_asks.borrow_mut().push((request, filters));
    }

    fn client_id(&self, _hash: u64, _claim: Claim) {}

    fn session_open(&self, _o: crate::control::SessionOpen) {}

    fn session_park(&self, _p: crate::control::SessionPark) {}

    fn share_member(&self, _m: crate::control::ShareMember) {}

    fn presence(&self, e: crate::control::PresenceEvent) {
        self.presence.borrow_mut().push(e);
    }

    fn origin(&self, slot: u32) -> u64 {
        u64::from(slot) + 1
    }
}

/// A frame a client received, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Got {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>, String),
}

/// The client end of one connection.
pub(crate) struct Client {
    pub(crate) pipe: Rc<Pipe>,
    decoder: Decoder,
    /// Received bytes not yet decoded into a whole frame.
    buf: Vec<u8>,
    /// Every frame received, in order.
    pub(crate) got: Vec<Got>,
    /// Whether the client reads what arrives (a slow client does not).
    pub(crate) reading: bool,
}

impl Client {
    /// Sends one masked frame.
    pub(crate) fn send(&self, opcode: OpCode, payload: &[u8]) {
        let mut out = Vec::new();
        ws::encode_into(&mut out, true, opcode, payload, Some(fastrand_mask()));
        self.send_raw(&out);
    }

    /// Sends bytes as they are (a frame in pieces, or garbage).
    pub(crate) fn send_raw(&self, bytes: &[u8]) {
        self.pipe.to_server.borrow_mut().extend(bytes);
    }

    /// Sends a close frame with `code`.
    pub(crate) fn close(&self, code: u16) {
        let mut out = Vec::new();
        ws::encode_close(&mut out, code, "", Some(fastrand_mask()));
        self.send_raw(&out);
    }

    /// Sends FIN.
    pub(crate) fn fin(&self) {
        self.pipe.client_fin.set(true);
    }

    /// Reads everything that arrived and decodes the whole frames; returns
    /// the bytes read.
    pub(crate) fn read(&mut self) -> usize {
        let n = {
            let mut q = self.pipe.to_client.borrow_mut();
            let n = q.len();
            self.buf.extend(q.drain(..));
            n
        };
        let mut pos = 0;
        while let Some(d) = self
            .decoder
            .decode(&mut self.buf[pos..])
            .expect("the server speaks RFC 6455")
        {
            pos += d.consumed;
            self.got.extend(d.frame.map(|f| match f {
                Frame::Text(t) => Got::Text(String::from_utf8_lossy(t).into_owned()),
                Frame::Binary(b) => Got::Binary(b.to_vec()),
                Frame::Ping(p) => Got::Ping(p.to_vec()),
                Frame::Pong(p) => Got::Pong(p.to_vec()),
                Frame::Close { code, reason } => Got::Close(code, reason.to_owned()),
            }));
        }
        self.buf.drain(..pos);
        n
    }

    /// Takes the frames received so far.
    pub(crate) fn take(&mut self) -> Vec<Got> {
        std::mem::take(&mut self.got)
    }

    /// Whether the server closed the socket (its end was dropped).
    pub(crate) fn server_closed(&self) -> bool {
        self.pipe.server_closed.get()
    }

    /// The raw bytes that arrived (an SSE client's view), taken.
    pub(crate) fn take_raw(&mut self) -> Vec<u8> {
        let mut q = self.pipe.to_client.borrow_mut();
        q.drain(..).collect()
    }

    /// Whether the server sent FIN without closing.
    pub(crate) fn server_fin(&self) -> bool {
        self.pipe.server_fin.get()
    }

    /// Whether the server watches this connection for room to write.
    pub(crate) fn write_wanted(&self) -> bool {
        self.pipe.write_wanted.get()
    }
}

/// Any mask will do; the server must unmask whatever it is.
fn fastrand_mask() -> [u8; 4] {
    fastrand::u32(..).to_le_bytes()
}

/// Limits for tests, in ticks: every connection visited on every tick.
pub(crate) fn limits(max_queue: usize, idle: u32, write: u32, grace: u32) -> Limits {
    Limits {
        max_queue,
        ping_interval: TICK,
        idle,
        write,
        grace,
        wildcards: true,
        mqtt_publish: true,
        mqtt_packet: 1 << 16,
        max_message: 1 << 16,
        max_subscriptions: 100,
        max_channels: 3,
        deflate_min: None,
        max_filter_bytes: 1 << 14,
        publish_guarded: false,
        claim_window: Duration::from_secs(10),
    }
}

/// A worker's subscribers and their clients.
pub(crate) struct Pair {
    pub(crate) subs: Subscribers<Around>,
    pub(crate) clients: Vec<Client>,
}

impl Pair {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            subs: Subscribers::new(limits, Around::default(), Rc::new(Counters::default())),
            clients: Vec::new(),
        }
    }

    /// The limits of a server's defaults (`Config::default()`), in ticks.
    pub(crate) fn defaults() -> Self {
        Self::new(Limits::of(&crate::Config::default()))
    }

    pub(crate) fn counters(&self) -> &Counters {
        self.subs.counters()
    }

    /// A client subscribes to `channel` (`sent` arrived with its upgrade
    /// request); returns its index.
    pub(crate) fn connect_with(&mut self, channel: &str, room: usize, sent: &[u8]) -> usize {
        self.connect_token(channel, room, sent, None)
    }

    /// A client whose token expires at Unix second `exp` subscribes to
    /// `channel`; returns its index.
    pub(crate) fn connect_until(&mut self, channel: &str, exp: u64) -> usize {
        self.connect_token(channel, ROOM, b"", Some(exp))
    }

    fn connect_token(
        &mut self,
        channel: &str,
        room: usize,
        sent: &[u8],
        exp: Option<u64>,
    ) -> usize {
        self.connect_as(channel, room, sent, exp, Kind::Ws, None)
    }

    /// A client of `kind` subscribes to `channel`, rejoining after `since`
    /// when given; returns its index.
    pub(crate) fn connect_kind(
        &mut self,
        channel: &str,
        kind: Kind,
        since: Option<MessageId>,
    ) -> usize {
        self.connect_as(channel, ROOM, b"", None, kind, since)
    }

    fn connect_as(
        &mut self,
        channel: &str,
        room: usize,
        sent: &[u8],
        exp: Option<u64>,
        kind: Kind,
        since: Option<MessageId>,
    ) -> usize {
        let pipe = Pipe::new(room);
        let conn = Conn::new(MemWire(pipe.clone()), self.subs.now(), sent)
            .with_expiry(crate::auth::expiry(exp))
            .with_kind(kind);
        match since {
            Some(since) => self.subs.subscribe_after(channel, conn, since),
            None => self.subs.subscribe(channel, conn).map(drop),
        }
        .expect("watched");
        self.add_client(pipe)
    }

    /// The client end of `pipe`, reading; returns its index.
    fn add_client(&mut self, pipe: Rc<Pipe>) -> usize {
        self.clients.push(Client {
            pipe,
            decoder: Decoder::new(Role::Client, 1 << 20),
            buf: Vec::new(),
            got: Vec::new(),
            reading: true,
        });
        self.clients.len() - 1
    }

    /// A `throng.v1` client of several channels in `channels`, each after
    /// `since` when given; returns its index.
    pub(crate) fn connect_many(&mut self, channels: &[&str], since: Option<MessageId>) -> usize {
        self.connect_watching(channels, since, &[])
    }

    /// [`Self::connect_many`], watching the joins and leaves of `presence`
    /// (some of `channels`, with presence on).
    pub(crate) fn connect_watching(
        &mut self,
        channels: &[&str],
        since: Option<MessageId>,
        presence: &[&str],
    ) -> usize {
        let pipe = Pipe::new(ROOM);
        let conn = Conn::new(MemWire(pipe.clone()), self.subs.now(), b"")
            .with_kind(Kind::WsMulti)
            .with_max_message(1 << 16);
        self.subs
            .subscribe_many(conn, channels, since, None, presence)
            .expect("watched");
        self.add_client(pipe)
    }

    /// An MQTT client of `version` after its CONNACK, subscribed to
    /// nothing; it does not decode (read its bytes with
    /// [`Client::take_raw`]). Returns its index and its server connection.
    pub(crate) fn connect_mqtt(
        &mut self,
        version: throng_proto::mqtt::Version,
    ) -> (usize, Rc<Conn<MemWire>>) {
        let pipe = Pipe::new(ROOM);
        let state = super::mqtt::Mqtt::new(0);
        let conn = Conn::new(MemWire(pipe.clone()), self.subs.now(), b"").with_mqtt(version, state);
        self.subs.add_mqtt(conn, None, None).expect("watched");
        self.clients.push(Client {
            pipe,
            decoder: Decoder::new(Role::Client, 1 << 20),
            buf: Vec::new(),
            got: Vec::new(),
            reading: false,
        });
        let i = self.clients.len() - 1;
        let conn = self.conn(i).expect("in the tables");
        (i, conn)
    }

    /// A client subscribes to `channel` with plenty of room; returns its index.
    pub(crate) fn connect(&mut self, channel: &str) -> usize {
        self.connect_with(channel, ROOM, b"")
    }

    /// The server's connection of client `i`, while it is in the tables.
    pub(crate) fn conn(&self, i: usize) -> Option<Rc<Conn<MemWire>>> {
        let pipe = &self.clients[i].pipe;
        self.subs
            .all()
            .into_iter()
            .find(|c| Rc::ptr_eq(&c.wire().0, pipe))
    }

    /// Sets how many unread bytes client `i`'s pipe holds at most.
    pub(crate) fn set_room(&self, i: usize, room: usize) {
        self.clients[i].pipe.room.set(room);
    }

    /// Resets client `i`'s connection.
    pub(crate) fn reset(&self, i: usize) {
        self.clients[i].pipe.reset.set(true);
    }

    /// Runs both ends until nothing moves: reading clients read, and the
    /// server handles each connection that is readable or, while it asks,
    /// writable (level-triggered, as the worker's epoll).
    pub(crate) fn drive(&mut self) {
        for _ in 0..1000 {
            let mut moved = false;
            for c in &mut self.clients {
                if c.reading && c.read() > 0 {
                    moved = true;
                }
            }
            let all = self.subs.all();
            for c in all {
                let p = &c.wire().0;
                let before = (p.to_client.borrow().len(), p.to_server.borrow().len());
                if p.write_wanted.get() && p.to_client.borrow().len() < p.room.get() {
                    self.subs.on_writable(&c);
                }
                let readable =
                    !p.to_server.borrow().is_empty() || p.client_fin.get() || p.reset.get();
                if p.watched.get() && readable {
                    self.subs.on_readable(&c, true);
                }
                let after = (p.to_client.borrow().len(), p.to_server.borrow().len());
                moved |= before != after;
            }
            // What the supervisor does with presence events: back to every worker.
            let told: Vec<_> = self
                .subs
                .outside()
                .presence
                .borrow_mut()
                .drain(..)
                .collect();
            for e in &told {
                self.subs.presence_event(e);
                moved = true;
            }
            if !moved {
                return;
            }
        }
        panic!("the pair never settled");
    }

    /// Fans `text` out on `channel` and runs both ends; returns the count.
    pub(crate) fn publish(&mut self, channel: &str, text: &str) -> u64 {
        let n = self.fanout(channel, text);
        self.drive();
        n
    }

    /// Fans `text` out on `channel` without running the ends afterwards.
    pub(crate) fn fanout(&self, channel: &str, text: &str) -> u64 {
        self.subs.fanout(&Message {
            id: 1,
            message: MessageId::NONE,
            text: true,
            at_most_once: false,
            exactly_once: false,
            properties: Bytes::new(),
            retained: false,
            origin: 0,
            channel: channel.into(),
            payload: Bytes::copy_from_slice(text.as_bytes()),
        })
    }

    /// Lets `n` ticks pass, running both ends after each.
    pub(crate) fn tick(&mut self, n: u32) {
        for _ in 0..n {
            self.subs.tick();
            self.drive();
        }
    }
}
