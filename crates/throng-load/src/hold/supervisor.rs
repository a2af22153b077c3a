//! `hold` on the supervisor's side, a [`Role`] of the harness core: the
//! plan of each worker, the ramp (the hold time starts once every worker
//! has opened or failed its share), the publisher of timestamped messages,
//! and the end of the run: stop publishing, let messages in flight land
//! (until every connection has every message, or deliveries stop), tell
//! every worker to close its connections, kill those that do not.
//!
//! A message counts as published once its request went out whole and was
//! not refused: a late or lost answer is counted apart (`unanswered`), and
//! its subscribers are still expected to get it.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use throng_report::fanout::{self, Spread};
use throng_report::format::Event;
use throng_report::interval::{Interval, new_histogram};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::figures::Running;
use super::mqtt::MqttOptions;
use super::plan::Fit;
use super::publish::{Outcome, Publisher};
use super::sessions::{SessionPlan, SessionSummary, Sessions};
use super::summary::{Summary, progress_line};
use super::target::{PublishTarget, WsTarget};
use super::{Settings, WorkerPlan, message};
use crate::harness::clock::{micros, now_unix_ns};
use crate::harness::collect::Totals;
use crate::harness::progress::View;
use crate::harness::recorder::{Take, record};
use crate::harness::worker::{LATE, Order};
use crate::harness::{Role, Run, Setup};
use crate::pacer::{Pacer, RateSpec};
use crate::threshold::Threshold;
use crate::tls::TlsOptions;

/// How long after every connection is open (or failed) before publishing
/// starts, so that the server has registered every subscriber.
pub const PUBLISH_SETTLE: Duration = Duration::from_millis(500);
/// After the last publish, connections stay open at least this long, and
/// then until every connection has every message, or no delivery came for
/// [`DRAIN_QUIET`], or [`DRAIN_MAX`] passed: a fan-out to a million
/// subscribers takes seconds.
pub const DRAIN: Duration = Duration::from_secs(1);
/// See [`DRAIN`]: longer than a late worker's record can be (2.5 intervals).
pub const DRAIN_QUIET: Duration = Duration::from_secs(3);
/// See [`DRAIN`].
pub const DRAIN_MAX: Duration = Duration::from_secs(120);
/// The default timeout of one publish call (connect, send, answer).
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the workers get between learning when publishing began and the
/// first message.
const TELL_WORKERS: Duration = Duration::from_millis(50);

/// When the first message goes out after every connection is open, at
/// the earliest and at the latest: after the settle time and the workers'
/// notice, and, at one message per `interval` or slower, up to one more
/// interval to start just after an interval boundary (see `publish_loop`).
pub fn first_publish_window(interval: Duration, rate: f64) -> (Duration, Duration) {
    let earliest = PUBLISH_SETTLE + TELL_WORKERS;
    let aligned = rate * interval.as_secs_f64() <= 1.0;
    (
        earliest,
        if aligned {
            earliest + interval
        } else {
            earliest
        },
    )
}

/// Publishing during a run.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishPlan {
    /// Where to publish.
    pub target: PublishTarget,
    /// Messages per second.
    pub rate: f64,
    /// Size of each message, bytes.
    pub message_size: usize,
    /// The Redis channel name (`throng:<channel>`).
    pub redis_channel: String,
    /// Publish this many messages, then end the hold once they are
    /// delivered (`None`: publish until the hold ends).
    pub messages: Option<u64>,
    /// Timeout of one publish call.
    pub timeout: Duration,
    /// Publishing clients, each over its own connection, sharing `rate`
    /// (`--publishers`; 1: one). An MQTT topic's `%i` is each one's number
    /// ([`client_topic`]).
    pub clients: u32,
}

/// A whole `hold` run, fitted onto the machine.
#[derive(Debug, Clone)]
pub struct HoldRun {
    /// Connections in total.
    pub connections: u64,
    /// The connection rate.
    pub rate: RateSpec,
    /// Where to connect.
    pub target: WsTarget,
    /// TLS settings of a `wss://` target.
    pub tls: Option<TlsOptions>,
    /// How MQTT subscribers connect (`mqtt://` targets).
    pub mqtt: Option<MqttOptions>,
    /// Workers and sources.
    pub fit: Fit,
    /// Timeouts and limits.
    pub settings: Settings,
    /// How long to hold once every connection is open or failed (`None`: until Ctrl-C).
    pub duration: Option<Duration>,
    /// Publishing, if any.
    pub publish: Option<PublishPlan>,
    /// Persistent-session MQTT clients that go away and return
    /// (`--mqtt-sessions`; `mqtt://` targets only).
    pub sessions: Option<SessionPlan>,
}

/// Runs a whole `hold`.
pub fn run(hold: HoldRun, setup: Setup) -> io::Result<Summary> {
    crate::harness::supervise::run(role(hold)?, setup)
}

/// Runs a whole `hold` that stops once one of `abort` can no longer pass
/// (`--abort-on-fail`).
pub fn run_until_doomed(hold: HoldRun, setup: Setup, abort: Vec<Threshold>) -> io::Result<Summary> {
    crate::harness::supervise::run(role(hold)?.abort_on(abort), setup)
}

/// The role of a whole `hold`, for a caller that runs it inside a role of
/// its own (`knee` runs one per level).
pub fn role(hold: HoldRun) -> io::Result<Hold> {
    // Workers build the same pacer; refuse a bad rate here, once.
    Pacer::for_count(hold.rate, hold.connections)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    Ok(Hold::new(hold))
}

/// What the publisher task counts, read by the supervisor each second.
#[derive(Debug)]
struct PubStats {
    /// When each message sent and not yet counted in an interval was sent
    /// (Unix ns): a message counts in the interval it was sent in, however
    /// late its answer comes or the supervisor closes that interval (a busy
    /// machine delays it past the next boundary, and a message counted a
    /// second early takes the previous one's last deliveries in per-message
    /// figures).
    sent_at: Vec<u64>,
    /// Messages published in all: sent, and not refused.
    published: u64,
    /// Answers that came (2xx), and how long each took.
    ok: u64,
    call: Histogram<u64>,
    /// Published messages whose answer did not come, by why (`timeout`, `io`).
    unanswered: BTreeMap<String, u64>,
    /// Messages sent and refused (a non-2xx answer, a Redis error), by why.
    refused: BTreeMap<String, u64>,
    /// Messages never sent (no connection), by why.
    errors: BTreeMap<String, u64>,
    lag: Histogram<u64>,
    subscribers: Option<u64>,
    /// Sequence number of the last message published.
    last_seq: u64,
    /// Sequence numbers taken by messages so far (published or in flight).
    taken_seq: u64,
    /// A publish error was shown.
    shown_error: bool,
}

impl PubStats {
    fn new() -> Self {
        Self {
            sent_at: Vec::new(),
            published: 0,
            ok: 0,
            call: new_histogram(),
            unanswered: BTreeMap::new(),
            refused: BTreeMap::new(),
            errors: BTreeMap::new(),
            lag: new_histogram(),
            subscribers: None,
            last_seq: 0,
            taken_seq: 0,
            shown_error: false,
        }
    }

    /// How many messages were sent before `end_ns`; they are counted now.
    fn take_sent_before(&mut self, end_ns: u64) -> u64 {
        let before = self.sent_at.len();
        self.sent_at.retain(|&at| at >= end_ns);
        (before - self.sent_at.len()) as u64
    }

    /// The sequence number of the message about to go.
    fn take_seq(&mut self) -> u64 {
        self.taken_seq += 1;
        self.taken_seq
    }

    /// Message `seq` was `published`, or not: an unpublished one gives its
    /// number back when no later message took it yet (with one publishing
    /// client, always), so that subscribers count no gap for it.
    fn settle_seq(&mut self, seq: u64, published: bool) {
        if published {
            self.last_seq = self.last_seq.max(seq);
        } else if self.taken_seq == seq {
            self.taken_seq -= 1;
        }
    }

    /// Counts what one call did (its sending was counted as it went out).
    fn count(&mut self, outcome: &Outcome, call_us: u64) {
        let why = |e: &super::publish::PublishError| e.label().to_owned();
        match &outcome.answer {
            Ok(n) => {
                self.ok += 1;
                record(&mut self.call, call_us);
                if n.is_some() {
                    self.subscribers = *n;
                }
            }
            Err(e) if outcome.refused() => *self.refused.entry(why(e)).or_insert(0) += 1,
            Err(e) if outcome.sent => *self.unanswered.entry(why(e)).or_insert(0) += 1,
            Err(e) => *self.errors.entry(why(e)).or_insert(0) += 1,
        }
        if outcome.published() {
            self.published += 1;
        }
    }
}

/// When the ramp ended: set once, by the last worker to finish it.
#[derive(Debug, Default)]
struct Ramp {
    done_at: Cell<Option<Instant>>,
    note: Notify,
    /// The run is stopping: a publisher still waiting for the ramp gives up.
    cancelled: Cell<bool>,
}

impl Ramp {
    /// Waits for the end of the ramp; `None` if the run stopped first.
    async fn wait(&self) -> Option<Instant> {
        loop {
            if let Some(at) = self.done_at.get() {
                return Some(at);
            }
            if self.cancelled.get() {
                return None;
            }
            self.note.notified().await;
        }
    }
}

/// The `hold` role.
#[derive(Debug)]
pub struct Hold {
    run: HoldRun,
    stats: Rc<RefCell<PubStats>>,
    publishing_stop: Rc<Cell<bool>>,
    ramp: Rc<Ramp>,
    /// Workers that opened (or failed) their whole share, or died.
    ramps_done: usize,
    hold_end: Option<Instant>,
    stop_at: Option<Instant>,
    ending: Ending,
    publisher: Option<JoinHandle<()>>,
    first_open_start: Option<u64>,
    last_open_end: u64,
    peak_open: i64,
    /// Connections open as last shown (every worker's last known count).
    open_now: i64,
    /// Deliveries counted so far in the run (late records included).
    received: u64,
    /// Ctrl-C (or a signal) stopped the run.
    interrupted: bool,
    /// Thresholds checked as the run goes (`--abort-on-fail`).
    abort: Vec<Threshold>,
    /// The one that can no longer pass, which stopped the run.
    aborted: Option<String>,
    /// When each message the server made arrived, over every worker.
    arrivals: Spread,
    /// The persistent-session clients, if any, and their task.
    sessions: Option<Rc<Sessions>>,
    session_task: Option<JoinHandle<()>>,
    /// Workers ready after the run's start, and how late each was (ns).
    late: BTreeMap<usize, u64>,
}

/// Where the end of the run is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ending {
    /// Holding (and publishing).
    Holding,
    /// Told to stop: waiting for the publish call in flight.
    Publishing { since: Instant },
    /// Publishing is over: waiting for the last deliveries.
    Draining {
        since: Instant,
        received: u64,
        changed: Instant,
    },
    /// The workers were told to close.
    Closing,
}

impl Hold {
    fn new(run: HoldRun) -> Self {
        let sessions = match (&run.sessions, &run.mqtt) {
            (Some(plan), Some(options)) if run.target.mqtt => Some(Rc::new(Sessions::new(
                plan.clone(),
                options.clone(),
                std::net::SocketAddr::new(run.target.ip, run.target.port_first),
                run.target.channel().to_owned(),
            ))),
            _ => None,
        };
        Self {
            sessions,
            session_task: None,
            run,
            stats: Rc::new(RefCell::new(PubStats::new())),
            publishing_stop: Rc::new(Cell::new(false)),
            ramp: Rc::new(Ramp::default()),
            ramps_done: 0,
            hold_end: None,
            stop_at: None,
            ending: Ending::Holding,
            publisher: None,
            first_open_start: None,
            last_open_end: 0,
            peak_open: 0,
            open_now: 0,
            received: 0,
            interrupted: false,
            abort: Vec::new(),
            aborted: None,
            arrivals: Spread::default(),
            late: BTreeMap::new(),
        }
    }

    /// Stops the run once one of `thresholds` can no longer pass.
    pub fn abort_on(mut self, thresholds: Vec<Threshold>) -> Self {
        self.abort = thresholds;
        self
    }

    /// Whether the last deliveries are in: every connection open has
    /// every message, or none came for a while, or the drain is over.
    fn drained(&self, now: Instant, since: Instant, changed: Instant) -> bool {
        let published = self.stats.borrow().published;
        let expected = published.saturating_mul(u64::try_from(self.open_now).unwrap_or(0));
        let waited = now.saturating_duration_since(since);
        let caught_up = self.sessions.as_ref().is_none_or(|s| s.caught_up());
        (waited >= DRAIN
            && ((self.received >= expected && caught_up) || now - changed >= DRAIN_QUIET))
            || waited >= DRAIN_MAX
    }

    /// One more worker is through its ramp (or gone); after the last, the
    /// hold time starts and publishing begins.
    fn ramp_step(&mut self) {
        self.ramps_done += 1;
        if self.ramps_done >= self.run.fit.workers as usize && self.ramp.done_at.get().is_none() {
            let now = Instant::now();
            self.ramp.done_at.set(Some(now));
            self.ramp.note.notify_one();
            self.hold_end = self.run.duration.map(|d| now + d);
        }
    }
}

impl Role for Hold {
    const NAME: &'static str = "hold";
    type Plan = WorkerPlan;
    type Summary = Summary;

    fn workers(&self) -> u32 {
        self.run.fit.workers
    }

    fn interval_ns(&self) -> u64 {
        self.run.settings.interval_ns
    }

    fn plan(&self, index: u32, label: String, start_unix_ns: u64) -> WorkerPlan {
        let r = &self.run;
        WorkerPlan {
            index,
            workers: r.fit.workers,
            connections: r.connections,
            rate: r.rate,
            start_unix_ns,
            target: r.target.clone(),
            sources: r.fit.sources.clone(),
            settings: r.settings,
            label,
            tls: r.tls.clone(),
            mqtt: r.mqtt.clone(),
        }
    }

    fn started(&mut self, run: &Rc<Run>) {
        self.publisher = self.run.publish.clone().map(|plan| {
            tokio::task::spawn_local(publish_loop(Publishing {
                plan,
                ramp: self.ramp.clone(),
                hold: self.run.duration,
                interval_ns: self.run.settings.interval_ns.max(1),
                stats: self.stats.clone(),
                stop: self.publishing_stop.clone(),
                run: run.clone(),
                sessions: self.sessions.clone(),
            }))
        });
        if let Some(sessions) = &self.sessions {
            let r = run.clone();
            let note: Rc<dyn Fn(&str)> = Rc::new(move |t: &str| r.note(t));
            let sessions = sessions.clone();
            // They connect at the run's --rate, as its subscribers do: all
            // at once would measure a connect storm, not the sessions.
            let pacer = Pacer::for_count(self.run.rate, u64::from(sessions.clients())).ok();
            self.session_task = Some(tokio::task::spawn_local(async move {
                let mut clients = tokio::task::JoinSet::new();
                let start = tokio::time::Instant::now();
                for k in 0..sessions.clients() {
                    if let Some(at) = pacer
                        .as_ref()
                        .and_then(|p| start.checked_add(p.intended(u64::from(k))))
                    {
                        tokio::time::sleep_until(at).await;
                    }
                    clients.spawn_local(sessions.clone().client(k, note.clone()));
                }
                while clients.join_next().await.is_some() {}
            }));
        }
    }

    fn event(&mut self, worker: usize, ev: &Event, run: &Rc<Run>) -> bool {
        if ev.kind == LATE {
            // Said when it was ready: its schedule started then. Still
            // shown as a note.
            let late = ev.at_ns.saturating_sub(run.start().unix_ns());
            self.late.insert(worker, late.max(1));
            return false;
        }
        match ev.kind.as_str() {
            "worker.ramp_done" => self.ramp_step(),
            // In the result file for bench's per-message figures.
            "worker.done" | "worker.messages" => {}
            fanout::KIND => {
                self.arrivals.add_text(&ev.text);
            }
            _ => return false,
        }
        true
    }

    fn gone(&mut self, worker: usize, done: bool, run: &Rc<Run>) {
        if done {
            return;
        }
        // A worker that died never reports its ramp: do not wait for it.
        self.ramp_step();
        if self.ending == Ending::Holding {
            run.note(&format!(
                "{}: worker exited early; its connections are gone",
                run.crew().label(worker)
            ));
        }
    }

    fn interrupted(&mut self, _run: &Rc<Run>) -> &'static str {
        self.stop_at = Some(Instant::now());
        self.interrupted = true;
        "Ctrl-C: stopping (press again to kill the workers)"
    }

    fn tick(&mut self, run: &Rc<Run>) {
        let now = Instant::now();
        let published_all = self
            .run
            .publish
            .as_ref()
            .is_some_and(|p| p.messages.is_some())
            && self.publisher.as_ref().is_some_and(JoinHandle::is_finished);
        if self.stop_at.is_none() && (self.hold_end.is_some_and(|e| now >= e) || published_all) {
            self.stop_at = Some(now);
        }
        match self.ending {
            Ending::Holding if self.stop_at.is_some_and(|at| now >= at) => {
                self.publishing_stop.set(true);
                if let Some(s) = &self.sessions {
                    s.settle();
                }
                self.ramp.cancelled.set(true);
                self.ramp.note.notify_one();
                self.ending = Ending::Publishing { since: now };
                self.tick(run);
            }
            Ending::Publishing { since } => {
                // A call in flight ends within its timeout.
                let timeout = self
                    .run
                    .publish
                    .as_ref()
                    .map_or(Duration::ZERO, |p| p.timeout);
                let finished = self.publisher.as_ref().is_none_or(JoinHandle::is_finished);
                if finished || now - since > timeout + Duration::from_secs(1) {
                    if let Some(p) = &self.publisher {
                        p.abort();
                    }
                    self.ending = if self.stats.borrow().published > 0 {
                        Ending::Draining {
                            since: now,
                            received: self.received,
                            changed: now,
                        }
                    } else {
                        self.close(run);
                        Ending::Closing
                    };
                }
            }
            Ending::Draining {
                since,
                received,
                changed,
            } => {
                let changed = if self.received != received {
                    now
                } else {
                    changed
                };
                if self.drained(now, since, changed) {
                    self.close(run);
                    self.ending = Ending::Closing;
                } else {
                    self.ending = Ending::Draining {
                        since,
                        received: self.received,
                        changed,
                    };
                }
            }
            Ending::Holding | Ending::Closing => {}
        }
    }

    fn own(&mut self, start_ns: u64, length_ns: u64) -> Interval {
        let mut stats = self.stats.borrow_mut();
        let s = &mut *stats;
        let mut sent = s.take_sent_before(start_ns + length_ns);
        let mut t = Take::default();
        t.count("publish.sent", &mut sent)
            .count("publish.ok", &mut s.ok)
            .histogram("publish", &mut s.call)
            .histogram("publish.lag", &mut s.lag);
        for (kind, mut n) in std::mem::take(&mut s.errors) {
            t.count(&format!("publish.error.{kind}"), &mut n);
        }
        for (kind, mut n) in std::mem::take(&mut s.unanswered) {
            t.count(&format!("publish.unanswered.{kind}"), &mut n);
        }
        for (kind, mut n) in std::mem::take(&mut s.refused) {
            t.count(&format!("publish.refused.{kind}"), &mut n);
        }
        if let Some(n) = s.subscribers {
            t.gauge("publish.subscribers", i64::try_from(n).unwrap_or(i64::MAX));
        }
        if let Some(sessions) = &self.sessions {
            sessions.take(&mut t);
        }
        t.into_interval(start_ns, length_ns, String::new())
    }

    fn absorb(&mut self, merged: &Interval) {
        if merged.counter("connect.ok") > 0 {
            self.first_open_start.get_or_insert(merged.start_ns);
            self.last_open_end = merged.start_ns + merged.length_ns;
        }
        self.open_now = merged.gauge("connections.open");
        self.peak_open = self.peak_open.max(self.open_now);
    }

    fn counted(&mut self, totals: &Interval) {
        self.received = totals.counter("messages.received");
        if self.aborted.is_none()
            && let Some(why) = self.abort.iter().find_map(|t| t.doomed(&Running(totals)))
        {
            // Ends as a Ctrl-C does: publishing stops, deliveries drain.
            self.stop_at = Some(Instant::now());
            self.aborted = Some(why);
        }
    }

    fn progress(&mut self, view: &View<'_>) -> String {
        let mut line = progress_line(view, self.run.connections);
        if self.sessions.is_some() {
            line.push_str(&super::sessions::progress(view.totals));
        }
        if let RateSpec::Stages(st) = self.run.rate {
            let pacer = Pacer::stages(&st);
            line.push_str(&crate::pacer::stage_note(&st, &pacer, view.elapsed_s()));
        }
        line
    }

    fn finish(self, totals: Totals, run: &Rc<Run>) -> Summary {
        if let Some(p) = self.publisher {
            p.abort();
        }
        let mut sessions = None;
        if let Some(c) = &self.sessions {
            if let Some(task) = self.session_task {
                task.abort();
            }
            // What the clients counted since the last interval (the losses
            // counted at the close, when no interval followed).
            let mut t = Take::default();
            c.take(&mut t);
            let mut all = t.into_interval(0, 0, String::new());
            all.add(&totals.total);
            sessions = SessionSummary::of(
                &all,
                c.clients(),
                self.run.mqtt.as_ref().map_or(0, |m| m.qos),
            );
        }
        let mut s = Summary::of(totals);
        let clients = self.run.publish.as_ref().map_or(1, |p| p.clients);
        if clients > 1 {
            // Two clients' messages may reach the broker in either order:
            // one overtaken was counted lost, then out of order on arrival.
            s.lost = s.lost.saturating_sub(s.out_of_order);
            s.publishers = clients;
            if let Some(c) = &mut sessions {
                c.lost = c.lost.saturating_sub(c.out_of_order);
            }
        }
        s.sessions = sessions;
        s.aborted = self.aborted;
        s.target = self.run.connections;
        s.workers = self.run.fit.workers;
        s.peak_open = self.peak_open;
        s.expected = s
            .published
            .saturating_mul(u64::try_from(self.peak_open).unwrap_or(0));
        if let Some(done) = self.ramp.done_at.get() {
            let span = done
                .saturating_duration_since(run.start().instant())
                .as_secs_f64();
            s.ramp_s = span;
            if span > 0.0 {
                s.connect_rate = s.opened as f64 / span;
            }
        } else if let Some(first) = self.first_open_start {
            // Stopped before the ramp ended: per-second intervals are all there is.
            let span = self.last_open_end.saturating_sub(first) as f64 / 1e9;
            if span > 0.0 {
                s.connect_rate = s.opened as f64 / span;
            }
        }
        s.elapsed_s = now_unix_ns().saturating_sub(run.start().unix_ns()) as f64 / 1e9;
        s.start_unix_ns = run.start().unix_ns();
        s.stopped = self.interrupted || s.aborted.is_some();
        s.server_spread = self.arrivals.stats();
        s.late_workers = self.late.len() as u32;
        s.late_start_s = self.late.values().max().copied().unwrap_or(0) as f64 / 1e9;
        s
    }
}

impl Hold {
    /// Tells every worker the last sequence number and to close; kills
    /// those still there after the close timeout (and some).
    fn close(&self, run: &Rc<Run>) {
        let final_seq = self.stats.borrow().last_seq;
        if let Some(s) = &self.sessions {
            s.close(final_seq);
        }
        run.crew().stop_all(&Order::Stop(final_seq));
        let close = Duration::from_millis(self.run.settings.close_timeout_ms);
        run.kill_after(close + Duration::from_secs(10));
    }
}

/// What the publisher task needs.
struct Publishing {
    plan: PublishPlan,
    ramp: Rc<Ramp>,
    /// How long the hold lasts from the end of the ramp.
    hold: Option<Duration>,
    /// The interval length it aligns its first message to.
    interval_ns: u64,
    stats: Rc<RefCell<PubStats>>,
    stop: Rc<Cell<bool>>,
    run: Rc<Run>,
    /// The persistent-session clients, told when publishing begins and
    /// each message published.
    sessions: Option<Rc<Sessions>>,
}

/// Publishes timestamped messages at `plan.rate`, from [`PUBLISH_SETTLE`]
/// after every worker has opened its share until the hold ends, `messages`
/// are published or the run is stopped, from `plan.clients` publishing
/// clients, each over its own connection, one call at a time (see
/// [`publish_client`]). Dropping it (an abort) drops every client.
async fn publish_loop(p: Publishing) {
    let Some(ramp_end) = p.ramp.wait().await else {
        return;
    };
    let until = p.hold.map(|d| ramp_end + d);
    tokio::time::sleep_until((ramp_end + PUBLISH_SETTLE).into()).await;
    if p.stop.get() {
        return;
    }
    // Tell the workers first, so a connection open before the first message
    // expects sequence number 1.
    let began = now_unix_ns();
    p.run.crew().tell_all(&Order::Publishing(began));
    if let Some(s) = &p.sessions {
        s.publishing(began);
    }
    // At one message per interval or slower, start just after an interval
    // boundary (intervals are aligned on wall time), and at least 50 ms after
    // telling the workers: each message's deliveries then fall in its own
    // interval and the ones after it, never in the interval of an earlier
    // publish, which is what per-message figures (`throng bench`) attribute
    // by. A random phase put a slow fan-out's tail in the next message's
    // interval. Faster rates gain nothing from it and would lose up to an
    // interval of a short hold, so they start after the 50 ms.
    let interval_ns = p.interval_ns;
    let mut wait = crate::harness::clock::nanos(TELL_WORKERS);
    if p.plan.rate * interval_ns as f64 <= 1e9 {
        let into = (now_unix_ns() + wait) % interval_ns;
        let phase = interval_ns / 100;
        wait += (interval_ns + phase - into) % interval_ns;
    }
    tokio::time::sleep(Duration::from_nanos(wait)).await;
    let start = Instant::now();
    let p = Rc::new(p);
    let mut clients = tokio::task::JoinSet::new();
    for k in 0..p.plan.clients.max(1) {
        clients.spawn_local(publish_client(p.clone(), k, start, until));
    }
    while clients.join_next().await.is_some() {}
}

/// Publishing client `k` of `plan.clients`: the messages of the run's
/// schedule whose number is `k` modulo the clients, so that together they
/// publish at `plan.rate`, each at `rate / clients` and spread evenly
/// between the others (emqtt-bench's `pub -c N -I ms`). Each message takes
/// the next sequence number when it goes; one that was not published
/// (never sent, or refused) gives it back when no later one took it yet,
/// so that workers count no gap for it.
async fn publish_client(p: Rc<Publishing>, k: u32, start: Instant, until: Option<Instant>) {
    let clients = u64::from(p.plan.clients.max(1));
    let Ok(pacer) = Pacer::constant(p.plan.rate) else {
        return;
    };
    let mut target = p.plan.target.clone();
    if let PublishTarget::Mqtt { topic, .. } = &mut target {
        *topic = client_topic(topic, k);
    }
    let mut publisher = Publisher::new(target, p.plan.redis_channel.clone(), p.plan.timeout);
    if clients > 1 {
        publisher = publisher.numbered(k as usize + 1);
    }
    let mut buf = Vec::with_capacity(p.plan.message_size.max(message::MAX_HEADER));
    for attempt in (u64::from(k)..).step_by(clients as usize) {
        if p.plan.messages.is_some_and(|n| attempt >= n) {
            break;
        }
        let intended = start + pacer.intended(attempt);
        if p.plan.messages.is_none() && until.is_some_and(|u| intended >= u) {
            break;
        }
        while Instant::now() < intended && !p.stop.get() {
            let step = intended.min(Instant::now() + Duration::from_millis(100));
            tokio::time::sleep_until(step.into()).await;
        }
        if p.stop.get() {
            break;
        }
        let seq = p.stats.borrow_mut().take_seq();
        let began = Instant::now();
        let sent_ns = now_unix_ns();
        buf.clear();
        message::encode(&mut buf, seq, sent_ns, p.plan.message_size);
        record(
            &mut p.stats.borrow_mut().lag,
            micros(began.saturating_duration_since(intended)),
        );
        let stats = &p.stats;
        let outcome = publisher
            .publish(&buf, &mut || stats.borrow_mut().sent_at.push(sent_ns))
            .await;
        let mut s = p.stats.borrow_mut();
        s.count(&outcome, micros(began.elapsed()));
        s.settle_seq(seq, outcome.published());
        if let Some(sessions) = &p.sessions {
            sessions.published(s.last_seq);
        }
        if let Err(e) = &outcome.answer
            && !s.shown_error
        {
            s.shown_error = true;
            let what = if outcome.published() {
                "sent, but its answer"
            } else {
                "not published"
            };
            p.run.note(&format!(
                "publish of message {seq}: {what}: {e} (first publish error shown)"
            ));
        }
    }
}

/// The topic of publishing client `k` (from 0): `template` with each `%i`
/// replaced by its number, from 1 (emqtt-bench's client sequence).
pub fn client_topic(template: &str, k: u32) -> String {
    template.replace("%i", &(u64::from(k) + 1).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_publishing_client_has_its_own_topic_from_1() {
        assert_eq!(client_topic("fleet/%i/temp", 0), "fleet/1/temp");
        assert_eq!(client_topic("fleet/%i/%i", 41), "fleet/42/42");
        assert_eq!(client_topic("fleet/all", 7), "fleet/all");
    }

    #[test]
    fn an_unpublished_message_gives_its_number_back_only_when_none_followed() {
        let mut s = PubStats::new();
        // One client: 1 published, 2 refused (given back), the next takes 2.
        let one = s.take_seq();
        s.settle_seq(one, true);
        let two = s.take_seq();
        s.settle_seq(two, false);
        assert_eq!(s.take_seq(), 2);
        s.settle_seq(2, true);
        // Two clients in flight: 3 and 4 taken; 3 fails after 4 was taken,
        // so 3 stays a gap (counted lost), and the last published is 4.
        let (three, four) = (s.take_seq(), s.take_seq());
        s.settle_seq(four, true);
        s.settle_seq(three, false);
        assert_eq!((s.last_seq, s.take_seq()), (4, 5));
    }

    #[test]
    fn the_first_message_waits_for_an_interval_boundary_only_at_slow_rates() {
        let second = Duration::from_secs(1);
        let (early, late) = first_publish_window(second, 0.5);
        assert_eq!(early, Duration::from_millis(550));
        assert_eq!(late, early + second);
        assert_eq!(first_publish_window(second, 10.0), (early, early));
    }

    #[test]
    fn a_message_counts_in_the_interval_it_was_sent_in_however_late_that_closes() {
        let mut s = PubStats::new();
        let sec = 1_000_000_000;
        // Message 1 at 10.01 s; interval [10 s, 11 s) closes late, at 12.3 s,
        // by when message 2 went at 12.01 s.
        s.sent_at
            .extend([10 * sec + sec / 100, 12 * sec + sec / 100]);
        assert_eq!(s.take_sent_before(11 * sec), 1);
        assert_eq!(s.take_sent_before(12 * sec), 0);
        assert_eq!(s.take_sent_before(13 * sec), 1);
        assert!(s.sent_at.is_empty());
    }
}
