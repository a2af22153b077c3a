//! Persistent-session MQTT clients in `throng hold` (`--mqtt-sessions N`):
//! what a broker keeps for a device that goes away and comes back.
//!
//! Each client keeps a session on the broker (3.1.1: clean session 0;
//! 5.0: Clean Start 0 and a Session Expiry Interval, a clean start the
//! first time), subscribes to the run's filter once, and on a schedule
//! goes away (DISCONNECT, then `away` offline) and comes back. On each
//! return it checks that the broker kept the session (CONNACK's session
//! present) and measures what the broker kept for it: the messages
//! published while it was away (`session.owed`), delivered on its return
//! (`session.resumed`, and how long after the CONNACK, `session.resume`),
//! none lost, none twice, in order (its own [`Sequence`], as a held
//! subscriber's). A QoS 2 message the broker sends again (DUP) before its
//! PUBREL (our PUBREC lost when we went) is acknowledged again and counted
//! once.
//!
//! The clients are tasks of the supervisor, beside the publishers, not
//! connections of the workers: a few hundred returning clients show what
//! a broker keeps; the workers' held subscribers measure the fan-out.
//! Their counts are the supervisor's own record of each interval
//! (`session.*`). Once publishing stops, a client that is away comes back
//! at once and stays, so that every message it is owed can arrive before
//! the run ends; those still missing then are lost.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use throng_proto::mqtt::{self, Delivery, Packet};
use throng_report::interval::{Interval, new_histogram};
use throng_report::summary::HistStats;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::message;
use super::mqtt::{Joining, MqttOptions, acknowledge, disconnect, handshake_step, pingreq};
use super::sequence::{Arrival, Sequence};
use crate::harness::clock::now_unix_ns;
use crate::harness::recorder::{Take, record};

/// The largest packet a session client reads (a message, with room).
const MAX_PACKET: usize = 1 << 20;

/// How the persistent-session clients run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPlan {
    /// Clients.
    pub clients: u32,
    /// How long each stays connected before it goes away.
    pub online: Duration,
    /// How long each stays away.
    pub away: Duration,
    /// The 5.0 Session Expiry Interval asked for, seconds.
    pub expiry_s: u32,
}

impl SessionPlan {
    /// The start line.
    pub fn describe(&self, options: &MqttOptions) -> String {
        format!(
            "sessions: {} persistent clients ({}), each online {} then away {}, again and again; client ids {}session<n>",
            self.clients,
            if options.level == 5 {
                format!("Clean Start 0, Session Expiry Interval {} s", self.expiry_s)
            } else {
                "clean session 0".to_owned()
            },
            throng_host::units::fmt_duration(self.online),
            throng_host::units::fmt_duration(self.away),
            options.client_id_prefix
        )
    }
}

/// What the clients counted and not yet handed to an interval.
#[derive(Debug)]
struct Counts {
    counters: BTreeMap<&'static str, u64>,
    errors: BTreeMap<&'static str, u64>,
    delivery: Histogram<u64>,
    resume: Histogram<u64>,
}

impl Counts {
    fn add(&mut self, name: &'static str, n: u64) {
        *self.counters.entry(name).or_insert(0) += n;
    }
}

/// The clients' shared state: what the supervisor tells them and what
/// they count.
#[derive(Debug)]
pub struct Sessions {
    plan: SessionPlan,
    options: MqttOptions,
    addr: SocketAddr,
    filter: String,
    counts: RefCell<Counts>,
    /// Each client's place in the message sequence (kept here, so that the
    /// end of the run can count what each is missing).
    seqs: RefCell<Vec<Sequence>>,
    /// Clients away now.
    away: Cell<u32>,
    /// When publishing began (Unix ns; 0: not yet).
    first_publish_ns: Cell<u64>,
    /// The sequence number of the last message published.
    published: Cell<u64>,
    /// Publishing is over: come back and stay.
    settle: Cell<bool>,
    /// The run is closing: disconnect and end.
    closing: Cell<bool>,
    woken: Notify,
    /// The first error of each kind was shown.
    shown: RefCell<HashSet<&'static str>>,
}

impl Sessions {
    /// The clients of `plan`, to the broker at `addr`, on `filter`.
    pub fn new(plan: SessionPlan, options: MqttOptions, addr: SocketAddr, filter: String) -> Self {
        let now = now_unix_ns();
        Self {
            seqs: RefCell::new(vec![Sequence::new(now); plan.clients as usize]),
            plan,
            options,
            addr,
            filter,
            counts: RefCell::new(Counts {
                counters: BTreeMap::new(),
                errors: BTreeMap::new(),
                delivery: new_histogram(),
                resume: new_histogram(),
            }),
            away: Cell::new(0),
            first_publish_ns: Cell::new(0),
            published: Cell::new(0),
            settle: Cell::new(false),
            closing: Cell::new(false),
            woken: Notify::new(),
            shown: RefCell::new(HashSet::new()),
        }
    }

    /// Clients.
    pub fn clients(&self) -> u32 {
        self.plan.clients
    }

    /// Publishing began at `unix_ns`: a client that subscribed before is
    /// owed every message from the first.
    pub fn publishing(&self, unix_ns: u64) {
        self.first_publish_ns.set(unix_ns);
    }

    /// Messages up to `seq` were published.
    pub fn published(&self, seq: u64) {
        self.published.set(seq);
    }

    /// Publishing is over: clients away come back now, and none goes again.
    pub fn settle(&self) {
        self.settle.set(true);
        self.woken.notify_waiters();
    }

    /// Every client is back and has every message up to the last published.
    pub fn caught_up(&self) -> bool {
        let last = self.published.get();
        self.away.get() == 0 && self.seqs.borrow().iter().all(|s| s.last() >= last)
    }

    /// The run is closing after message `final_seq`: what each client is
    /// still missing is lost, and the clients disconnect.
    pub fn close(&self, final_seq: u64) {
        if self.closing.replace(true) {
            return;
        }
        let first = self.first_publish_ns.get();
        let missing: u64 = self
            .seqs
            .borrow()
            .iter()
            .map(|s| s.missing_at_end(final_seq, first))
            .sum();
        self.counts.borrow_mut().add("session.lost", missing);
        self.woken.notify_waiters();
    }

    /// Moves what was counted into `t` (the supervisor's interval).
    pub fn take(&self, t: &mut Take) {
        let mut c = self.counts.borrow_mut();
        let c = &mut *c;
        for (name, mut n) in std::mem::take(&mut c.counters) {
            t.count(name, &mut n);
        }
        for (kind, mut n) in std::mem::take(&mut c.errors) {
            t.count(&format!("session.error.{kind}"), &mut n);
        }
        t.histogram("session.delivery", &mut c.delivery)
            .histogram("session.resume", &mut c.resume);
        t.gauge("session.away", i64::from(self.away.get()));
    }

    /// Runs client `k` until the run closes; `note` shows the first error
    /// of each kind.
    pub async fn client(self: Rc<Self>, k: u32, note: Rc<dyn Fn(&str)>) {
        let mut c = Client {
            s: self.clone(),
            k: k as usize,
            id: format!("{}session{}", self.options.client_id_prefix, k + 1),
            pending: HashSet::new(),
            subscribed: false,
            returned: None,
            buf: Vec::new(),
            out: Vec::new(),
        };
        // Spread the clients' departures evenly over one online time.
        let mut online = self
            .plan
            .online
            .mul_f64(f64::from(k + 1) / f64::from(self.plan.clients.max(1)));
        while !self.closing.get() {
            match c.online(online).await {
                Ok(()) => {}
                Err(e) => {
                    // Not again at once, even when publishing is over.
                    let _ = tokio::time::timeout(
                        self.plan.away.min(Duration::from_secs(1)),
                        self.woken.notified(),
                    )
                    .await;
                    let kind = e.kind();
                    *self.counts.borrow_mut().errors.entry(kind).or_insert(0) += 1;
                    if self.shown.borrow_mut().insert(kind) {
                        note(&format!(
                            "session client {}: {e} (first of its kind)",
                            k + 1
                        ));
                    }
                }
            }
            online = self.plan.online;
            if self.closing.get() {
                break;
            }
            self.away.set(self.away.get() + 1);
            let back = Instant::now() + self.plan.away;
            while !self.settle.get() && !self.closing.get() && Instant::now() < back {
                let _ = tokio::time::timeout_at(back.into(), self.woken.notified()).await;
            }
            self.away.set(self.away.get() - 1);
        }
    }

    fn count(&self, name: &'static str) {
        self.counts.borrow_mut().add(name, 1);
    }

    /// A message `payload` arrived at client `k` at `now_ns`; `returned`:
    /// what its connection owes it, on a return.
    fn arrived(&self, k: usize, payload: &[u8], now_ns: u64, returned: Option<&mut Return>) {
        let Some((seq, sent_ns)) = message::decode(payload) else {
            return;
        };
        let arrival = self.seqs.borrow_mut()[k].receive(seq, self.first_publish_ns.get());
        let mut c = self.counts.borrow_mut();
        c.add("session.received", 1);
        match arrival {
            Arrival::Next { lost } => c.add("session.lost", lost),
            Arrival::Duplicate => c.add("session.duplicated", 1),
            Arrival::OutOfOrder => c.add("session.out_of_order", 1),
        }
        record(&mut c.delivery, now_ns.saturating_sub(sent_ns) / 1000);
        if let Some(r) = returned
            && r.first(seq)
        {
            c.add("session.resumed", 1);
            record(&mut c.resume, now_ns.saturating_sub(r.at_ns) / 1000);
        }
    }
}

/// The most messages a return tells apart (a bit each): past it, one that
/// comes twice counts twice as kept.
const MAX_OWED_TRACKED: u64 = 1 << 20;

/// What a return's CONNACK found owed: the messages after `from` (the
/// highest received before) up to `to` (the last published then), and
/// which of them came since.
#[derive(Debug)]
struct Return {
    at_ns: u64,
    from: u64,
    to: u64,
    seen: Vec<u64>,
}

impl Return {
    fn new(at_ns: u64, from: u64, to: u64) -> Self {
        let owed = to.saturating_sub(from);
        let words = if owed <= MAX_OWED_TRACKED {
            owed.div_ceil(64) as usize
        } else {
            0
        };
        Self {
            at_ns,
            from,
            to,
            seen: vec![0; words],
        }
    }

    /// Whether `seq` is owed and came for the first time (then marked).
    fn first(&mut self, seq: u64) -> bool {
        if seq <= self.from || seq > self.to {
            return false;
        }
        let i = seq - self.from - 1;
        let Some(word) = self.seen.get_mut((i / 64) as usize) else {
            return true;
        };
        let bit = 1u64 << (i % 64);
        let first = *word & bit == 0;
        *word |= bit;
        first
    }
}

/// Why a client's connection ended other than by its schedule.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    #[error("connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Refused(super::mqtt::Refusal),
    #[error("bad packet from the broker: {0}")]
    Protocol(String),
    #[error("the broker closed the connection")]
    Closed,
    #[error("no CONNACK or SUBACK within 10s")]
    Timeout,
}

impl SessionError {
    fn kind(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Io(_) => "io",
            Self::Refused(_) => "refused",
            Self::Protocol(_) => "protocol",
            Self::Closed => "closed",
            Self::Timeout => "timeout",
        }
    }
}

/// One client's state across its connections.
struct Client {
    s: Rc<Sessions>,
    k: usize,
    id: String,
    /// QoS 2 packet ids received (PUBREC sent) whose PUBREL has not come:
    /// the same id again, marked DUP, is the same message, sent again.
    pending: HashSet<u16>,
    /// A SUBACK came (the session has the subscription, unless a return
    /// finds it discarded).
    subscribed: bool,
    /// On a return: what it owes.
    returned: Option<Return>,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl Client {
    /// One connection: connect (subscribe the first time, or when the
    /// broker kept no session), then read for `online` (until the run
    /// closes once publishing is over), then DISCONNECT.
    async fn online(&mut self, online: Duration) -> Result<(), SessionError> {
        let s = self.s.clone();
        let opts = &s.options;
        let version = opts.version();
        let first = !self.subscribed;
        let mut conn = TcpStream::connect(s.addr)
            .await
            .map_err(SessionError::Connect)?;
        let _ = conn.set_nodelay(true);
        self.out.clear();
        self.buf.clear();
        self.returned = None;
        // SUBSCRIBE waits for CONNACK, as a device's does: whether the
        // broker kept the session says whether it is needed.
        opts.connect_session(&self.id, !first, s.plan.expiry_s, &mut self.out);
        conn.write_all(&self.out).await?;
        let mut decoder = mqtt::Decoder::client(version, MAX_PACKET);
        let mut joining = Joining::ConnackOnly;
        let deadline = Instant::now() + Duration::from_secs(10);
        while joining != Joining::Done {
            let Some(d) = decoder
                .decode(&self.buf)
                .map_err(|e| SessionError::Protocol(e.to_string()))?
            else {
                if !read_more(&mut conn, &mut self.buf, deadline).await? {
                    return Err(SessionError::Timeout);
                }
                continue;
            };
            let used = d.consumed;
            let next = joining.on(&d.packet).map_err(SessionError::Refused)?;
            let connack = match &d.packet {
                Packet::Connack(c) => Some(c.session_present),
                _ => None,
            };
            self.buf.drain(..used);
            joining = next;
            if let Some(present) = connack {
                s.count("session.connects");
                if !first {
                    self.returned(present);
                }
                if first || !present {
                    self.out.clear();
                    opts.subscribe(&s.filter, &mut self.out);
                    conn.write_all(&self.out).await?;
                    joining = Joining::Suback;
                }
            }
        }
        self.subscribed = true;
        self.hold(&mut conn, &mut decoder, online).await?;
        self.out.clear();
        disconnect(version, &mut self.out);
        let _ = conn.write_all(&self.out).await;
        let _ = conn.shutdown().await;
        Ok(())
    }

    /// A return's CONNACK came, with the session `present` or not: counts
    /// it, and what the client is owed (every message published so far
    /// and not received).
    fn returned(&mut self, present: bool) {
        let s = &self.s;
        s.count("session.returns");
        s.count(if present {
            "session.present"
        } else {
            "session.discarded"
        });
        let owed_to = s.published.get();
        let last = s.seqs.borrow()[self.k].last();
        s.counts
            .borrow_mut()
            .add("session.owed", owed_to.saturating_sub(last));
        self.returned = Some(Return::new(now_unix_ns(), last, owed_to));
    }

    /// Reads and answers until `online` has passed (or, once publishing
    /// is over, until the run closes).
    async fn hold(
        &mut self,
        conn: &mut TcpStream,
        decoder: &mut mqtt::Decoder,
        online: Duration,
    ) -> Result<(), SessionError> {
        let s = self.s.clone();
        let version = s.options.version();
        let until = Instant::now() + online;
        let every = super::mqtt::ping_every(s.options.keep_alive_s);
        let mut ping_at = Instant::now() + Duration::from_secs(every.max(1));
        loop {
            let done = if s.settle.get() {
                s.closing.get()
            } else {
                Instant::now() >= until || s.closing.get()
            };
            if done {
                return Ok(());
            }
            if let Some(d) = decoder
                .decode(&self.buf)
                .map_err(|e| SessionError::Protocol(e.to_string()))?
            {
                let used = d.consumed;
                self.out.clear();
                match d.packet {
                    Packet::Publish(p) => {
                        // Sent again (DUP) before its PUBREL: the same
                        // message. Without DUP, a new one that reuses the
                        // id of a PUBREL never sent (we went away first).
                        let again = match p.delivery {
                            Delivery::ExactlyOnce(id) => !self.pending.insert(id.get()) && p.dup,
                            _ => false,
                        };
                        acknowledge(p.delivery, version, &mut self.out);
                        if !again {
                            s.arrived(self.k, p.payload, now_unix_ns(), self.returned.as_mut());
                        }
                    }
                    Packet::Pubrel(a) => {
                        self.pending.remove(&a.packet_id.get());
                        handshake_step(false, a.packet_id, version, &mut self.out);
                    }
                    Packet::Disconnect(d) => {
                        return Err(SessionError::Protocol(format!(
                            "DISCONNECT with reason {:#04x}",
                            d.reason.0
                        )));
                    }
                    _ => {}
                }
                self.buf.drain(..used);
                if !self.out.is_empty() {
                    conn.write_all(&self.out).await?;
                }
                continue;
            }
            let wake = until
                .min(ping_at)
                .min(Instant::now() + Duration::from_millis(200));
            if !read_more(conn, &mut self.buf, wake).await?
                && every > 0
                && Instant::now() >= ping_at
            {
                self.out.clear();
                pingreq(version, &mut self.out);
                conn.write_all(&self.out).await?;
                ping_at = Instant::now() + Duration::from_secs(every);
            }
        }
    }
}

/// Reads what came into `buf`, waiting until `deadline`: false when
/// nothing came by then.
async fn read_more(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<bool, SessionError> {
    let mut chunk = [0u8; 16 * 1024];
    match tokio::time::timeout_at(deadline.into(), conn.read(&mut chunk)).await {
        Err(_) => Ok(false),
        Ok(Ok(0)) => Err(SessionError::Closed),
        Ok(Ok(n)) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(true)
        }
        Ok(Err(e)) => Err(SessionError::Io(e)),
    }
}

/// What the persistent-session clients did over the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionSummary {
    /// Clients.
    pub clients: u32,
    /// The QoS they subscribed at.
    pub qos: u8,
    /// CONNACKs accepted, first connections and returns.
    pub connects: u64,
    /// Connections after the first.
    pub returns: u64,
    /// Returns whose CONNACK said session present.
    pub present: u64,
    /// Returns whose CONNACK said the broker kept no session.
    pub discarded: u64,
    /// Messages not yet received at each return (published while away).
    pub owed: u64,
    /// Of those, delivered after the return.
    pub resumed: u64,
    /// Messages received, in all.
    pub received: u64,
    /// Messages lost (gaps, and what was missing at the end).
    pub lost: u64,
    /// Messages received twice.
    pub duplicated: u64,
    /// Messages received after a later one.
    pub out_of_order: u64,
    /// Connections that failed, by why.
    pub errors: BTreeMap<String, u64>,
    /// Publish to arrival, every message, µs (a message kept while its
    /// client was away includes the time away).
    pub delivery_us: HistStats,
    /// A return's CONNACK to each kept message's arrival, µs.
    pub resume_us: HistStats,
}

impl SessionSummary {
    /// From the run's totals (`None` without session clients).
    pub fn of(t: &Interval, clients: u32, qos: u8) -> Option<Self> {
        if clients == 0 {
            return None;
        }
        let errors = t
            .counters
            .iter()
            .filter_map(|(k, v)| {
                let kind = k.strip_prefix("session.error.")?;
                Some((kind.to_owned(), *v))
            })
            .collect();
        Some(Self {
            clients,
            qos,
            connects: t.counter("session.connects"),
            returns: t.counter("session.returns"),
            present: t.counter("session.present"),
            discarded: t.counter("session.discarded"),
            owed: t.counter("session.owed"),
            resumed: t.counter("session.resumed"),
            received: t.counter("session.received"),
            lost: t.counter("session.lost"),
            duplicated: t.counter("session.duplicated"),
            out_of_order: t.counter("session.out_of_order"),
            errors,
            delivery_us: t.stats("session.delivery"),
            resume_us: t.stats("session.resume"),
        })
    }

    /// The lines of the human summary.
    pub fn render(&self) -> String {
        let lat = crate::harness::collect::latency_line;
        let mut out = format!(
            "sessions: {} clients, {} returns: {} with the session kept, {} without\n",
            self.clients, self.returns, self.present, self.discarded
        );
        out.push_str(&format!(
            "  published while away: {} owed on return, {} delivered on return; {} received in all, {} lost, {} duplicated, {} out of order\n",
            self.owed, self.resumed, self.received, self.lost, self.duplicated, self.out_of_order
        ));
        out.push_str(&format!(
            "  return to each kept message: {}\n",
            lat(&self.resume_us)
        ));
        out.push_str(&format!(
            "  delivery (publish to arrival, time away included): {}\n",
            lat(&self.delivery_us)
        ));
        if !self.errors.is_empty() {
            out.push_str(&format!(
                "  connection errors: {}\n",
                crate::harness::collect::kinds(&self.errors, " ", ", ")
            ));
        }
        out
    }

    /// What fails the run: a message lost, a session not kept, a message
    /// twice at QoS 2 (exactly once), a connection that failed.
    pub fn failures(&self) -> Vec<String> {
        let exactly_once = self.qos == 2;
        let mut out = Vec::new();
        if self.lost > 0 {
            out.push(format!(
                "{} messages lost by persistent-session clients",
                self.lost
            ));
        }
        if self.discarded > 0 {
            out.push(format!(
                "{} returns of persistent-session clients found no session kept",
                self.discarded
            ));
        }
        if exactly_once && self.duplicated > 0 {
            out.push(format!(
                "{} messages received twice by persistent-session clients at QoS 2",
                self.duplicated
            ));
        }
        let errors: u64 = self.errors.values().sum();
        if errors > 0 {
            out.push(format!("{errors} persistent-session connections failed"));
        }
        out
    }
}

/// The progress line's part: returns with the session kept, messages
/// kept and delivered on return, lost.
pub fn progress(t: &Interval) -> String {
    format!(
        "  sessions back {}/{} kept {}/{} lost {}",
        t.counter("session.present"),
        t.counter("session.returns"),
        t.counter("session.resumed"),
        t.counter("session.owed"),
        t.counter("session.lost")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(clients: u32) -> Sessions {
        let plan = SessionPlan {
            clients,
            online: Duration::from_secs(1),
            away: Duration::from_secs(1),
            expiry_s: 60,
        };
        Sessions::new(
            plan,
            MqttOptions::default(),
            "127.0.0.1:1883".parse().unwrap(),
            "f/#".into(),
        )
    }

    fn message(seq: u64, sent_ns: u64) -> Vec<u8> {
        let mut out = Vec::new();
        message::encode(&mut out, seq, sent_ns, 0);
        out
    }

    fn totals(s: &Sessions) -> Interval {
        let mut t = Take::default();
        s.take(&mut t);
        t.into_interval(0, 1, String::new())
    }

    #[test]
    fn what_a_return_delivers_is_counted_kept_and_what_never_came_lost() {
        let s = sessions(2);
        s.publishing(1);
        // Client 0 got 1 and 2 online; returned when 5 was published, and
        // got 3, 4 and 5 after its CONNACK at 1,000 ns; then 6 online.
        let mut back = Return::new(1_000, 2, 5);
        s.arrived(0, &message(1, 10), 20, None);
        s.arrived(0, &message(2, 10), 20, None);
        // 4 overtook 3 (two publishing clients): both kept, 3 out of order.
        for seq in [4, 3, 5] {
            s.arrived(0, &message(seq, 500), 1_000 + seq * 1_000, Some(&mut back));
        }
        s.arrived(0, &message(6, 9_000), 9_500, Some(&mut back));
        // 5 again: out of order, and not kept twice.
        s.arrived(0, &message(5, 500), 9_600, Some(&mut back));
        // Not ours: ignored.
        s.arrived(0, b"hello", 9_700, Some(&mut back));
        s.published(6);
        // Client 1 has only 1..=4: not caught up; at the close 5 and 6 are lost.
        for seq in 1..=4 {
            s.arrived(1, &message(seq, 10), 20, None);
        }
        assert!(!s.caught_up());
        s.close(6);
        let t = totals(&s);
        assert_eq!(t.counter("session.received"), 11);
        assert_eq!(t.counter("session.resumed"), 3);
        assert_eq!(t.counter("session.out_of_order"), 2);
        // 3 was counted lost when 4 overtook it; 5 and 6 of client 1 at the close.
        assert_eq!(t.counter("session.lost"), 3);
        assert_eq!(t.stats("session.resume").count, 3);
        // From the return's CONNACK (1,000 ns) to 3 at 4,000 ns: 3 µs.
        assert_eq!(t.stats("session.resume").min, 3);
        let summary = SessionSummary::of(&t, 2, 2).unwrap();
        assert_eq!(summary.failures().len(), 1, "{:?}", summary.failures());
    }

    #[test]
    fn every_client_caught_up_lets_the_drain_end() {
        let s = sessions(1);
        s.publishing(1);
        s.published(2);
        s.arrived(0, &message(1, 10), 20, None);
        assert!(!s.caught_up());
        s.arrived(0, &message(2, 10), 20, None);
        assert!(s.caught_up());
        s.close(2);
        assert_eq!(totals(&s).counter("session.lost"), 0);
    }
}
