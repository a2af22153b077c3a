//! One `attack` worker process: starts its share of the requests on the
//! schedule (or keeps its share of a closed pool busy), speaks HTTP/1.1 over
//! a pool of keep-alive connections, and reports one interval per second.
//!
//! A request is one task, started at its intended time whatever the
//! requests before it are doing (open model). While it waits for its
//! response it owns a socket, a body decoder of a few words and its timeout
//! entry in the runtime's timer wheel: no read or write buffer. The request
//! bytes are encoded once per target and shared; responses are read into one
//! scratch buffer per worker, and only a response head split across reads
//! leaves a small owned remainder behind. So thousands of slow requests in
//! flight cost little more than the kernel's sockets.
//!
//! An `https://` connection also owns its TLS [`Session`]; its handshake is
//! part of opening the connection (timed apart from TCP connect), and its
//! records are read through the same scratch buffer.
//!
//! With `--http2` the requests go to a `Streams` engine instead (the `h2`
//! module beside this one, made by the function `work` is given): many
//! requests per connection as streams, no task per request. It uses this
//! worker's state (`Ctx`), its connect and its recording.
//!
//! It talks to its supervisor through the harness core's
//! [`worker`](crate::harness::worker): the [`WorkerPlan`] first, then a
//! `stop` order (or the end of its input) stops it at once; its
//! `worker.done` event carries [`Done`] as JSON.

use std::cell::{Cell, RefCell};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use throng_host::poll::Events;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Sleep;

use super::aims::{Aims, Armed};
use super::record::{
    Answer, AttackRecorder, Exchange, Io, RequestError, Row, RowFormat, RowWriter,
};
use super::response::ResponseReader;
use super::waiting::{Left, Outcome, Waiting, WaitingRoom, Wake};
use super::{Load, WorkerPlan, pacer};
use crate::harness::clock::{Anchor, micros, nanos, start_late};
use crate::harness::failure::{Failure, FirstOfKind, NetCause};
use crate::harness::share;
use crate::harness::worker::{Live, Order, Orders, Output, Stop, Ticker};
use crate::tls::{self, Phase, Session, TlsClient, TlsError};

/// What a worker says when it ends (the `worker.done` event's text, JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {
    /// Requests started.
    pub sent: u64,
    /// Actual start of the first request, ns since the epoch (0: none).
    pub first_sent_ns: u64,
    /// Actual start of the last request.
    pub last_sent_ns: u64,
    /// When the last request ended.
    pub last_done_ns: u64,
    /// Stopped before the schedule ended.
    pub stopped: bool,
    /// When this worker's schedule started, ns since the epoch: the run's
    /// start, or (ready late) when it was ready.
    #[serde(default)]
    pub start_ns: u64,
    /// How late after the run's start it was ready, ns (0: on time).
    #[serde(default)]
    pub late_ns: u64,
}

/// State shared by every task of the worker (single-threaded).
pub(super) struct Ctx {
    pub(super) plan: WorkerPlan,
    /// The targets, ready on the wire (its `targets` are moved here).
    pub(super) aims: Aims,
    /// Distinct endpoints, by pool index.
    pub(super) endpoints: Vec<Endpoint>,
    /// Idle keep-alive connections, by pool index.
    pools: Vec<RefCell<Vec<Link>>>,
    /// The TLS client, when any target is `https://`.
    tls: Option<TlsClient>,
    /// Connections open or being opened, idle ones included.
    /// Invariant: `open <= cap`.
    pub(super) open: Cell<u64>,
    /// This worker's share of `--max-connections`.
    pub(super) cap: u64,
    /// The source address the next new connection binds (an index into the plan's).
    next_source: Cell<usize>,
    /// Requests whose answer is slow, waiting outside tokio.
    waiting: WaitingRoom,
    /// A connection went back to a pool or closed: one waiter may go on.
    freed: Notify,
    pub(super) timeout: Duration,
    /// Where the schedule starts (request 0's intended time), both clocks.
    start: Anchor,
    pub(super) rec: RefCell<AttackRecorder>,
    /// The one read buffer. Borrowed only between awaits.
    pub(super) scratch: RefCell<Box<[u8]>>,
    rows: RefCell<Option<RowWriter>>,
    pub(super) stop: Stop,
    /// Request tasks and loops still running, plus the scheduler.
    pub(super) live: Live,
    done: Cell<Done>,
    ticker: Ticker,
    /// Failure kinds already logged (one event per kind).
    logged: FirstOfKind,
    /// A TLS handshake failure was logged with rustls's own words.
    pub(super) tls_logged: Cell<bool>,
    /// What the first TLS handshake negotiated was logged.
    tls_noted: Cell<bool>,
    pub(super) out: Output,
    /// The HTTP/2 engine (`--http2`).
    pub(super) h2: Option<Rc<dyn Streams>>,
    /// Responses' headers and bodies are kept for the rows (Vegeta's).
    keep_answers: bool,
    /// The answer of the request that just ended, for its row: put here
    /// when its response ends and taken by [`finish`] in the same poll.
    answer: RefCell<Option<Box<Answer>>>,
}

impl Ctx {
    /// A reader for a response, keeping its answer when rows want it.
    fn reader(&self) -> ResponseReader {
        if self.keep_answers {
            ResponseReader::keeping()
        } else {
            ResponseReader::new()
        }
    }

    /// The response `reader` read ended: its answer (if kept) is for the row.
    fn answered(&self, reader: &mut ResponseReader) {
        if let Some(a) = reader.take_answer() {
            *self.answer.borrow_mut() = Some(a);
        }
    }

    /// Wall-clock ns of `at`, through the schedule's start.
    fn unix_ns(&self, at: Instant) -> u64 {
        self.start.unix_ns_of(at)
    }

    /// Flushes the per-request rows; a failing disk is reported once and
    /// the rows stop.
    fn flush_rows(&self) {
        let mut rows = self.rows.borrow_mut();
        if let Some(w) = rows.as_mut()
            && let Err(e) = w.flush()
        {
            self.out.event(
                "per_request.error",
                format!("writing per-request rows: {e}"),
            );
            *rows = None;
        }
    }
}

/// A multiplexing engine the worker hands its requests to instead of
/// running each in a task (HTTP/2: `super::h2`).
pub(super) trait Streams {
    /// Request `seq`, due at `intended`, starts now; it holds a place in
    /// `live` until it ends.
    fn submit(self: Rc<Self>, ctx: &Rc<Ctx>, seq: u64, intended: Instant);
    /// A closed pool of `loops` connections starts, each holding a place in `live`.
    fn start_closed(self: Rc<Self>, ctx: &Rc<Ctx>, loops: u64);
}

/// Makes the engine of a plan (`None`: a task per request), given the
/// number of endpoints.
pub(super) type MakeStreams = fn(&WorkerPlan, usize) -> Option<Rc<dyn Streams>>;

/// Runs one worker: its share of `plan`, until it is done or told to stop;
/// `streams` makes its multiplexing engine, if the plan asks for one.
pub(super) async fn work(
    plan: WorkerPlan,
    mut orders: Orders,
    out: Box<dyn Write>,
    streams: MakeStreams,
) -> io::Result<()> {
    let (ctx, loops) = Ctx::new(plan, out, streams)?;
    let ctx = Rc::new(ctx);
    let late_ns = ctx.done.get().late_ns;
    if late_ns > 0 {
        ctx.out.late(late_ns);
    }

    // A stop order, or the end of the input, stops the run at once.
    let orders_ctx = ctx.clone();
    tokio::task::spawn_local(async move {
        while let Some(Order::Publishing(_)) = orders.next().await {}
        orders_ctx.stop.set();
        orders_ctx.live.wake();
    });

    ctx.live.add();
    start_load(&ctx, loops)?;
    let tick_ctx = ctx.clone();
    let ticker = tokio::task::spawn_local(async move {
        let c = &tick_ctx;
        c.ticker.run(&c.rec, &c.out, || c.flush_rows()).await;
    });
    let waiting = tokio::task::spawn_local(serve_waiting(ctx.clone()));

    while ctx.live.get() > 0 && !ctx.stop.is_set() {
        ctx.live.changed().await;
    }
    ticker.abort();
    waiting.abort();
    let mut done = ctx.done.get();
    if ctx.stop.is_set() {
        done.stopped = true;
        ctx.rec.borrow_mut().cancel_in_flight();
    }
    if let Some(rows) = ctx.rows.borrow_mut().as_mut() {
        rows.flush()?;
    }
    ctx.ticker.last(&ctx.rec, &ctx.out);
    ctx.out.event(
        "worker.done",
        serde_json::to_string(&done).map_err(io::Error::other)?,
    );
    Ok(())
}

/// An invalid worker plan.
fn invalid(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, m)
}

impl Ctx {
    /// The worker's state for `plan`, writing its records to `out`, and
    /// (closed pool) the number of loops it runs. Must be called inside
    /// the worker's runtime.
    fn new(
        mut plan: WorkerPlan,
        out: Box<dyn Write>,
        streams: MakeStreams,
    ) -> io::Result<(Self, u64)> {
        if plan.targets.is_empty() || plan.targets.len() != plan.addrs.len() {
            return Err(invalid(
                "a worker plan needs targets and one address per target".into(),
            ));
        }
        let settings = plan.settings;
        let (endpoints, pool_of) = Endpoint::pools(&plan);
        let aims = match plan.lazy.take() {
            Some(file) => Aims::read(file, &plan.targets, &pool_of, &settings),
            None => Aims::held(&plan.targets, &pool_of, &settings),
        };
        let tls = if plan.targets.iter().any(|t| t.url.tls) {
            let opts = plan.tls.as_ref().ok_or_else(|| {
                invalid("https:// targets need TLS options in the worker plan".into())
            })?;
            let client = TlsClient::new(opts).map_err(|e| invalid(e.to_string()))?;
            Some(if settings.http2.is_some() {
                client.for_h2()
            } else {
                client
            })
        } else {
            None
        };
        // Connections this worker may hold, and (closed pool) the loops it runs:
        // its share, which is 0 for some workers when there are more workers
        // than connections.
        let (cap, loops) = match plan.load {
            Load::Rate(_) => (share(settings.max_connections, plan.index, plan.workers), 0),
            Load::Max { connections } => {
                let n = share(
                    connections.min(settings.max_connections),
                    plan.index,
                    plan.workers,
                );
                (n, n)
            }
        };
        let rows = match &plan.per_request {
            Some(path) => Some(RowWriter::open(
                path,
                plan.row_format.unwrap_or_else(|| RowFormat::for_path(path)),
            )?),
            None => None,
        };
        // Everything slow (the plan read, each target encoded) is done:
        // ready after the start, the schedule starts now.
        let late_ns = start_late(&mut plan.start_unix_ns).unwrap_or(0);
        let start = Anchor::at_unix_ns(plan.start_unix_ns);
        let pool_count = endpoints.len();
        let keep_answers = plan.row_format == Some(RowFormat::Vegeta) && plan.per_request.is_some();
        // Held once, in `aims`.
        plan.targets = Vec::new();
        let ctx = Self {
            aims,
            pools: endpoints.iter().map(|_| RefCell::new(Vec::new())).collect(),
            endpoints,
            tls,
            tls_logged: Cell::new(false),
            tls_noted: Cell::new(false),
            open: Cell::new(0),
            cap: cap.max(1),
            next_source: Cell::new(0),
            waiting: WaitingRoom::new(start.instant(), keep_answers)?,
            keep_answers,
            answer: RefCell::new(None),
            freed: Notify::new(),
            timeout: Duration::from_millis(settings.timeout_ms),
            start,
            rec: RefCell::new(AttackRecorder::new(
                plan.label.clone(),
                settings.interval_ns.max(1),
            )),
            scratch: RefCell::new(vec![0u8; settings.scratch.max(4096)].into_boxed_slice()),
            rows: RefCell::new(rows),
            stop: Stop::default(),
            live: Live::default(),
            done: Cell::new(Done {
                start_ns: plan.start_unix_ns,
                late_ns,
                ..Done::default()
            }),
            ticker: Ticker::new(settings.interval_ns),
            logged: FirstOfKind::default(),
            out: Output::new(plan.label.clone(), out),
            h2: streams(&plan, pool_count),
            plan,
        };
        Ok((ctx, loops))
    }
}

/// Starts the load: the open-model schedule, or (closed pool) `loops`
/// loops at the schedule's start.
fn start_load(ctx: &Rc<Ctx>, loops: u64) -> io::Result<()> {
    let duration = ctx.plan.duration_ns.map(Duration::from_nanos);
    let requests = ctx.plan.requests;
    match ctx.plan.load {
        Load::Rate(spec) => {
            let pacer = pacer(spec, duration, requests).map_err(|e| invalid(e.to_string()))?;
            tokio::task::spawn_local(schedule(ctx.clone(), pacer, duration, requests));
        }
        Load::Max { .. } if ctx.h2.is_some() => {
            let c = ctx.clone();
            let start = ctx.start.instant();
            tokio::task::spawn_local(async move {
                tokio::time::sleep_until(start.into()).await;
                if let Some(h2) = c.h2.clone() {
                    h2.start_closed(&c, loops);
                }
                c.live.done();
            });
        }
        Load::Max { .. } => {
            let start = ctx.start.instant();
            let end = duration.map(|d| start + d);
            let next = Rc::new(Cell::new(0u64));
            let c = ctx.clone();
            tokio::task::spawn_local(async move {
                tokio::time::sleep_until(start.into()).await;
                for _ in 0..loops {
                    c.live.add();
                    tokio::task::spawn_local(closed_loop(c.clone(), end, next.clone()));
                }
                c.live.done();
            });
        }
    }
    Ok(())
}

/// Starts this worker's requests on the open-model schedule.
async fn schedule(
    ctx: Rc<Ctx>,
    pacer: crate::pacer::Pacer,
    duration: Option<Duration>,
    requests: Option<u64>,
) {
    let step = u64::from(ctx.plan.workers.max(1));
    let mut i = u64::from(ctx.plan.index);
    let mut burst = 0u32;
    // Without a timerfd (not Linux?), tokio's millisecond timers will do.
    let timer = throng_host::timer::Timer::new().ok();
    loop {
        if ctx.stop.is_set() || requests.is_some_and(|n| i >= n) {
            break;
        }
        let offset = pacer.intended(i);
        if duration.is_some_and(|d| offset >= d) {
            break;
        }
        // Past the last stage (which ended at 0/s) nothing more is due.
        let Some(intended) = ctx.start.instant().checked_add(offset) else {
            break;
        };
        if intended > Instant::now() {
            burst = 0;
            let stop = ctx.stop.notified();
            let wait = async {
                let precise = match &timer {
                    Some(t) => t.sleep_until(intended).await.is_ok(),
                    None => false,
                };
                if !precise {
                    tokio::time::sleep_until(intended.into()).await;
                }
            };
            tokio::select! {
                biased;
                () = stop => break,
                () = wait => {}
            }
            continue;
        }
        if !take(&ctx, i) {
            break;
        }
        ctx.live.add();
        if let Some(h2) = ctx.h2.clone() {
            h2.submit(&ctx, i, intended);
        } else {
            let c = ctx.clone();
            tokio::task::spawn_local(async move {
                if request(&c, i, intended, Instant::now(), None).await {
                    c.live.done();
                }
            });
        }
        i += step;
        // Behind schedule, every due request starts now; let the responses
        // already in be read between batches so the lag does not feed itself.
        burst += 1;
        if burst % 64 == 0 {
            tokio::task::yield_now().await;
        }
    }
    ctx.live.done();
}

/// One connection's worth of closed-model load: the next request as soon as
/// the last one ends.
async fn closed_loop(ctx: Rc<Ctx>, end: Option<Instant>, next: Rc<Cell<u64>>) {
    let step = u64::from(ctx.plan.workers.max(1));
    // One timer for the loop's whole life rather than one per request: it is
    // armed for the first request's deadline and, when it fires early for a
    // later request, moved on to that one's. Keep-alive requests that take
    // microseconds then cost the timer wheel nothing.
    let timer = tokio::time::sleep(ctx.timeout);
    tokio::pin!(timer);
    loop {
        let k = next.get();
        let seq = u64::from(ctx.plan.index) + k * step;
        let now = Instant::now();
        if ctx.stop.is_set()
            || end.is_some_and(|e| now >= e)
            || ctx.plan.requests.is_some_and(|n| seq >= n)
        {
            break;
        }
        next.set(k + 1);
        if !take(&ctx, seq) {
            break;
        }
        // With its own timer a request never leaves for the waiting room.
        let _ended = request(&ctx, seq, now, now, Some(timer.as_mut())).await;
    }
    ctx.live.done();
}

/// The event of a worker whose targets file no longer reads as checked.
pub const TARGETS_ERROR: &str = "targets.error";

/// Request `seq` takes its target (in turn: see [`Aims::take`]); a
/// targets file that no longer reads as it did stops the worker, said once.
pub(super) fn take(ctx: &Ctx, seq: u64) -> bool {
    match ctx.aims.take(seq) {
        Ok(_) => true,
        Err(e) => {
            if !ctx.stop.is_set() {
                ctx.out
                    .event(TARGETS_ERROR, format!("{e}; this worker stops"));
                ctx.stop.set();
                ctx.live.wake();
            }
            false
        }
    }
}

/// Runs request `seq` (target `seq % targets`), due at `intended` and
/// started at `began` (now), to its end, or until it waits for a slow
/// answer in the waiting room (then `false`: the waiting room ends it).
/// `timer`: a closed loop's own timer to reuse for the timeout (else the
/// request takes a timer of its own, and may leave for the waiting room).
async fn request(
    ctx: &Rc<Ctx>,
    seq: u64,
    intended: Instant,
    began: Instant,
    timer: Option<Pin<&mut Sleep>>,
) -> bool {
    count_start(ctx, began);

    let io = Io {
        bytes_in: 0,
        bytes_out: 0,
        began,
        sent_at: None,
    };
    attempt(ctx, seq, intended, io, began + ctx.timeout, timer, false).await
}

/// Counts a request started at `began`.
pub(super) fn count_start(ctx: &Ctx, began: Instant) {
    ctx.rec.borrow_mut().started();
    let mut done = ctx.done.get();
    done.sent += 1;
    let began_ns = ctx.unix_ns(began);
    if done.first_sent_ns == 0 {
        done.first_sent_ns = began_ns;
    }
    done.last_sent_ns = began_ns;
    ctx.done.set(done);
}

/// Runs request `seq` (due at `intended`) to its end by `deadline`, or
/// until it waits in the waiting room (then `false`). `retried`: this is
/// its second try, after a reused connection went stale while it waited
/// there; it gets no third.
async fn attempt(
    ctx: &Rc<Ctx>,
    seq: u64,
    intended: Instant,
    mut io: Io,
    deadline: Instant,
    timer: Option<Pin<&mut Sleep>>,
    retried: bool,
) -> bool {
    let t = ctx.aims.index(seq);
    let result = match timer {
        None => {
            let exchange = exchange(ctx, t, &mut io, true, retried);
            match tokio::time::timeout_at(deadline.into(), exchange).await {
                Ok(r) => r,
                Err(_) => Err(Failure::Net(NetCause::Timeout)),
            }
        }
        Some(mut timer) => {
            let exchange = exchange(ctx, t, &mut io, false, retried);
            tokio::pin!(exchange);
            loop {
                tokio::select! {
                    biased;
                    r = &mut exchange => break r,
                    () = timer.as_mut() => {
                        if Instant::now() >= deadline {
                            break Err(Failure::Net(NetCause::Timeout));
                        }
                        // Armed for an earlier request: move on to this one's deadline.
                        timer.as_mut().reset(deadline.into());
                    }
                }
            }
        }
    };
    let result = match result {
        Ok(Exchanged::Answered(status)) => Ok(status),
        Ok(Exchanged::Slow(link, may_retry)) => match link.stream.into_std() {
            Ok(stream) => {
                let start = ctx.start.instant();
                let wait = Waiting::new(start, stream, seq, t, intended, &io, may_retry);
                if let Err(refused) = ctx.waiting.enter(wait, deadline) {
                    // Ended at once, its task's work with it.
                    settle(ctx, refused);
                }
                // Otherwise the waiting room ends it.
                return false;
            }
            Err(e) => {
                // Its place under the cap was kept for the waiting room.
                ctx.open.set(ctx.open.get().saturating_sub(1));
                ctx.rec.borrow_mut().connection_closed();
                ctx.freed.notify_one();
                Err(RequestError::from_io(&e))
            }
        },
        Err(why) => Err(why),
    };
    finish(ctx, seq, t, intended, &io, result);
    true
}

/// The waiting room's loop: reads answers as they come, ends requests at
/// their deadline, and settles each request that leaves the room.
async fn serve_waiting(ctx: Rc<Ctx>) {
    let room = &ctx.waiting;
    let mut events = Events::with_capacity(1024);
    loop {
        match room.wait(&mut events).await {
            Err(_) => return,
            Ok(Wake::Ready) => {
                for ev in events.iter() {
                    let fd = ev.token as usize;
                    if let Some(left) = room.read(fd, &ctx.scratch, &ctx.aims, &ctx.rec) {
                        settle(&ctx, left);
                    }
                }
            }
            Ok(Wake::Due) => {
                let now = Instant::now();
                while let Some(left) = room.expire(now) {
                    settle(&ctx, left);
                }
            }
        }
    }
}

/// A request left the waiting room: records how it ended, and that its
/// task's work is done, its connection back in its pool or closed; or (its
/// reused connection was stale) sends it again, on a new connection, by
/// its first try's deadline (counted from when it first went out).
fn settle(ctx: &Rc<Ctx>, left: Left) {
    let Left {
        seq,
        t,
        intended,
        mut io,
        stream,
        how,
        answer,
    } = left;
    *ctx.answer.borrow_mut() = answer;
    let Some(pool) = ctx.aims.get(t).map(|a| a.pool) else {
        // Invariant: its target is held until it ends.
        free_place(ctx, None, 0);
        finish(
            ctx,
            seq,
            t,
            intended,
            &io,
            Err(Failure::Net(NetCause::Other)),
        );
        ctx.live.done();
        return;
    };
    let (result, keep) = match how {
        Outcome::Answered(status, keep) => (
            Ok(status),
            keep && ctx.plan.settings.keepalive && !ctx.stop.is_set(),
        ),
        Outcome::Failed(why) => (Err(why), false),
        Outcome::Stale => {
            free_place(ctx, None, pool);
            ctx.rec.borrow_mut().retried();
            io.sent_at = None;
            let deadline = io.began + ctx.timeout;
            let c = ctx.clone();
            tokio::task::spawn_local(async move {
                if attempt(&c, seq, intended, io, deadline, None, true).await {
                    c.live.done();
                }
            });
            return;
        }
    };
    free_place(ctx, keep.then_some(stream), pool);
    finish(ctx, seq, t, intended, &io, result);
    ctx.live.done();
}

/// The connection of a request that left the waiting room: back to pool
/// `pool` (`keep`), or closed; either way the cap's waiters hear of it.
fn free_place(ctx: &Ctx, keep: Option<std::net::TcpStream>, pool: usize) {
    let back = keep.and_then(|s| TcpStream::from_std(s).ok());
    match back {
        Some(stream) => {
            ctx.pools[pool]
                .borrow_mut()
                .push(Link { stream, tls: None });
        }
        None => {
            ctx.open.set(ctx.open.get().saturating_sub(1));
            ctx.rec.borrow_mut().connection_closed();
        }
    }
    ctx.freed.notify_one();
}

/// Records how request `seq` (target `t`, due at `intended`) ended.
pub(super) fn finish(
    ctx: &Ctx,
    seq: u64,
    t: usize,
    intended: Instant,
    io: &Io,
    result: Result<u16, RequestError>,
) {
    let aim = ctx.aims.get(t);
    ctx.aims.release(t);
    let answer = ctx.answer.take();
    if ctx.stop.is_set() {
        // Counted as canceled with the rest of those in flight.
        return;
    }
    let (method, url) = aim
        .as_deref()
        .map_or(("", ""), |a| (a.method.as_str(), a.url.as_str()));
    let end = Instant::now();
    let sent_at = io.sent_at.unwrap_or(end);
    ctx.rec
        .borrow_mut()
        .lag(micros(sent_at.saturating_duration_since(intended)));
    let (latency, service) = (
        micros(end.saturating_duration_since(intended)),
        micros(end - sent_at),
    );
    match result {
        Ok(status) => ctx.rec.borrow_mut().answered(status, latency, service),
        Err(why) => {
            ctx.rec.borrow_mut().failed(why, latency);
            if ctx.logged.first(why) {
                ctx.out.event(
                    "request.error",
                    format!("{} (first of its kind): {method} {url}", why.label()),
                );
            }
        }
    }
    let mut d = ctx.done.get();
    d.last_done_ns = ctx.unix_ns(end);
    ctx.done.set(d);
    if let Some(rows) = ctx.rows.borrow_mut().as_mut() {
        let row = Row {
            seq,
            worker: ctx.plan.index,
            target: t,
            intended_ns: ctx.unix_ns(intended),
            started_ns: ctx.unix_ns(sent_at),
            latency_us: latency,
            service_us: service,
            status: *result.as_ref().unwrap_or(&0),
            error: result.err().map_or("", RequestError::label),
            bytes_in: io.bytes_in,
            bytes_out: io.bytes_out,
            latency_ns: nanos(end.saturating_duration_since(intended)),
        };
        // A failing disk is reported once by the ticker's flush.
        let _ = rows.push(&row, (method, url), answer.as_deref());
    }
}

/// Where a pool's connections go: an address, and for `https://` the host
/// named in SNI and checked in the certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Endpoint {
    pub(super) addr: SocketAddr,
    tls_host: Option<String>,
}

impl Endpoint {
    /// The distinct endpoints of `plan`'s targets, and each target's index
    /// among them (its pool: targets on one endpoint share one).
    fn pools(plan: &WorkerPlan) -> (Vec<Self>, Vec<usize>) {
        let mut endpoints: Vec<Self> = Vec::new();
        let pool_of = plan
            .addrs
            .iter()
            .zip(&plan.targets)
            .map(|(a, t)| {
                let e = Self {
                    addr: *a,
                    tls_host: t.url.tls.then(|| t.url.host.clone()),
                };
                match endpoints.iter().position(|b| *b == e) {
                    Some(i) => i,
                    None => {
                        endpoints.push(e);
                        endpoints.len() - 1
                    }
                }
            })
            .collect();
        (endpoints, pool_of)
    }
}

/// An open connection: the socket and, for `https://`, its TLS session.
pub(super) struct Link {
    pub(super) stream: TcpStream,
    pub(super) tls: Option<Box<Session>>,
}

/// An open connection counted against the cap; closing it (by drop) frees
/// its place. Also stands for a place reserved while connecting.
struct Conn {
    ctx: Rc<Ctx>,
    stream: Option<Link>,
    /// The connection went back to a pool (or to the waiting room), which
    /// keeps its place.
    pooled: bool,
}

impl Conn {
    /// Reserves a place under the cap. Invariant: the caller checked `open < cap`.
    fn reserve(ctx: &Rc<Ctx>) -> Self {
        ctx.open.set(ctx.open.get() + 1);
        Self {
            ctx: ctx.clone(),
            stream: None,
            pooled: false,
        }
    }

    /// Takes the connection out, keeping its place under the cap: the
    /// waiting room holds both from now on.
    fn keep_place(mut self) -> Option<Link> {
        self.pooled = true;
        self.stream.take()
    }

    /// Puts the connection back into its pool for the next request.
    fn release(mut self, pool: usize) {
        if let Some(s) = self.stream.take() {
            self.ctx.pools[pool].borrow_mut().push(s);
            self.ctx.freed.notify_one();
            self.pooled = true;
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.pooled {
            return;
        }
        if self.stream.take().is_some() {
            self.ctx.rec.borrow_mut().connection_closed();
        }
        self.ctx.open.set(self.ctx.open.get() - 1);
        self.ctx.freed.notify_one();
    }
}

/// A connection for pool `pool`: an idle one, a new one under the cap, or
/// (at the cap) the next one freed. The flag says whether it was reused.
/// `fresh`: a new one, never an idle one (a retry after a stale one: the
/// idle connections beside it have likely been idle as long); at the cap an
/// idle one of any pool is closed for it.
async fn acquire(
    ctx: &Rc<Ctx>,
    pool: usize,
    io: &mut Io,
    fresh: bool,
) -> Result<(Conn, bool), RequestError> {
    // Until it waits for a free connection, a request goes out as it starts.
    let mut waited = false;
    let sent_now = |io: &mut Io, waited: bool| {
        let at = if waited { Instant::now() } else { io.began };
        io.sent_at.get_or_insert(at);
    };
    loop {
        let idle = if fresh {
            None
        } else {
            ctx.pools[pool].borrow_mut().pop()
        };
        if let Some(s) = idle {
            sent_now(io, waited);
            return Ok((
                Conn {
                    ctx: ctx.clone(),
                    stream: Some(s),
                    pooled: false,
                },
                true,
            ));
        }
        if ctx.open.get() < ctx.cap {
            let mut conn = Conn::reserve(ctx);
            sent_now(io, waited);
            // Boxed: the connect future is large and lives only this long,
            // so it must not widen every request's task.
            let stream = Box::pin(connect(ctx, pool)).await?;
            ctx.rec.borrow_mut().connection_opened();
            conn.stream = Some(stream);
            return Ok((conn, false));
        }
        // At the cap with idle connections to other addresses: close one.
        let evicted = ctx
            .pools
            .iter()
            .enumerate()
            .any(|(i, p)| (fresh || i != pool) && p.borrow_mut().pop().is_some());
        if evicted {
            ctx.open.set(ctx.open.get() - 1);
            ctx.rec.borrow_mut().connection_closed();
            continue;
        }
        ctx.freed.notified().await;
        waited = true;
    }
}

/// Opens a connection for pool `pool`: TCP connect, then the TLS handshake
/// for an `https://` endpoint; records how long each took.
pub(super) async fn connect(ctx: &Ctx, pool: usize) -> Result<Link, RequestError> {
    let endpoint = &ctx.endpoints[pool];
    let began = Instant::now();
    let sources = &ctx.plan.sources;
    let source = if sources.is_empty() {
        None
    } else {
        let k = ctx.next_source.get();
        ctx.next_source.set((k + 1) % sources.len());
        Some(sources[k])
    };
    let stream = crate::harness::source::socket(source, endpoint.addr)
        .map_err(|e| RequestError::from_io(&e))?
        .connect(endpoint.addr)
        .await
        .map_err(|e| RequestError::from_io(&e))?;
    stream
        .set_nodelay(true)
        .map_err(|e| RequestError::from_io(&e))?;
    let connected = Instant::now();
    let (Some(host), Some(client)) = (&endpoint.tls_host, &ctx.tls) else {
        ctx.rec
            .borrow_mut()
            .connect_phases(micros(connected - began), None);
        return Ok(Link { stream, tls: None });
    };
    let mut session = client
        .session(host)
        .map_err(|_| Failure::Tls(tls::TlsFailure::Other))?;
    let mut plain = Vec::new();
    if let Err(e) = tls::handshake(&stream, &ctx.scratch, &mut session, &mut plain).await {
        let why = RequestError::from_tls(&e);
        if matches!(why, Failure::Tls(_)) && !ctx.tls_logged.replace(true) {
            // The reason rustls gave, once: the counter only names its kind.
            ctx.out.event(
                "request.error",
                format!("TLS handshake with {}: {e}", endpoint.addr),
            );
        }
        return Err(why);
    }
    ctx.rec.borrow_mut().connect_phases(
        micros(connected - began),
        Some((micros(Instant::now() - connected), session.resumed())),
    );
    if !ctx.tls_noted.replace(true) {
        ctx.out.event("tls.negotiated", session.describe());
    }
    Ok(Link {
        stream,
        tls: Some(Box::new(session)),
    })
}

/// Why one try of a request failed.
enum Talk {
    /// Nothing came back before the connection ended: on a reused
    /// keep-alive connection the server may simply have closed it while
    /// idle, so the request goes again on a new one.
    Stale(RequestError),
    /// Failed for good.
    Fail(RequestError),
    /// The request went out and no byte of its answer came within
    /// [`WAIT_IN_TASK`]: it waits on outside tokio ([`super::waiting`]).
    Slow,
}

/// How long a request waits for the first byte of its answer in its own
/// task before it leaves the task for the worker's waiting room: most
/// answers come at once, and a slow one (a sleeping back end) then costs
/// a few hundred bytes instead of a task, a tokio registration and a timer.
const WAIT_IN_TASK: Duration = Duration::from_millis(100);

/// How an exchange ended in its task.
enum Exchanged {
    /// The answer came: its status.
    Answered(u16),
    /// The request went out and is slow to be answered: its connection
    /// goes to the waiting room (its place under the cap with it); and
    /// whether it may go again on a new connection if this one turns out
    /// stale there (it was reused, and this is its first try).
    Slow(Link, bool),
}

/// Sends target `t` and reads its response; returns the status code.
/// A request whose reused connection was stale goes again once on a new
/// one (`retried`: it already did).
async fn exchange(
    ctx: &Rc<Ctx>,
    t: usize,
    io: &mut Io,
    may_wait_outside: bool,
    mut retried: bool,
) -> Result<Exchanged, RequestError> {
    // Invariant: its target is held until it ends.
    let aim = ctx.aims.get(t).ok_or(Failure::Net(NetCause::Other))?;
    let pool = aim.pool;
    loop {
        let (mut conn, reused) = acquire(ctx, pool, io, retried).await?;
        let Some(link) = conn.stream.as_mut() else {
            return Err(Failure::Net(NetCause::Other));
        };
        let talked = match link.tls.as_deref_mut() {
            None => talk(ctx, &link.stream, &aim, io, may_wait_outside).await,
            // Boxed: inline, the TLS exchange's state would size every
            // request's task, plain ones included (scripts/bench-attack.sh:
            // 1,307 B per plain request in flight before TLS, 1,832 B with
            // it inline).
            Some(session) => Box::pin(talk_tls(ctx, &link.stream, session, &aim, io)).await,
        };
        match talked {
            Ok((status, keep)) => {
                if keep && ctx.plan.settings.keepalive && !ctx.stop.is_set() {
                    conn.release(pool);
                } else {
                    conn.stream.take();
                    ctx.rec.borrow_mut().connection_closed();
                }
                return Ok(Exchanged::Answered(status));
            }
            Err(Talk::Slow) => {
                return match conn.keep_place() {
                    Some(link) => Ok(Exchanged::Slow(link, reused && !retried)),
                    None => Err(Failure::Net(NetCause::Other)),
                };
            }
            Err(Talk::Stale(_)) if reused && !retried => {
                retried = true;
                ctx.rec.borrow_mut().retried();
            }
            Err(Talk::Stale(why) | Talk::Fail(why)) => return Err(why),
        }
    }
}

/// One request and response on `stream`: whether the connection may be
/// kept. With `may_wait_outside`, an answer whose first byte has not come
/// within [`WAIT_IN_TASK`] is left to the waiting room ([`Talk::Slow`]).
async fn talk(
    ctx: &Ctx,
    stream: &TcpStream,
    aim: &Armed,
    io: &mut Io,
    may_wait_outside: bool,
) -> Result<(u16, bool), Talk> {
    let wire = &aim.wire;
    let mut off = 0;
    while off < wire.len() {
        match stream.try_write(&wire[off..]) {
            Ok(n) => {
                off += n;
                io.bytes_out += n as u64;
                ctx.rec.borrow_mut().bytes_out(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                stream
                    .writable()
                    .await
                    .map_err(|e| Talk::Fail(RequestError::from_io(&e)))?;
            }
            Err(e) if off == 0 => return Err(Talk::Stale(RequestError::from_io(&e))),
            Err(e) => return Err(Talk::Fail(RequestError::from_io(&e))),
        }
    }
    let method = aim.method.as_str();
    let mut reader = ctx.reader();
    loop {
        if may_wait_outside && !reader.started() {
            match tokio::time::timeout(WAIT_IN_TASK, stream.readable()).await {
                Ok(ready) => ready.map_err(|e| Talk::Fail(RequestError::from_io(&e)))?,
                Err(_) => return Err(Talk::Slow),
            }
        } else {
            stream
                .readable()
                .await
                .map_err(|e| Talk::Fail(RequestError::from_io(&e)))?;
        }
        let mut scratch = ctx.scratch.borrow_mut();
        let n = match stream.try_read(&mut scratch[..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if !reader.started() => return Err(Talk::Stale(RequestError::from_io(&e))),
            Err(e) => return Err(Talk::Fail(RequestError::from_io(&e))),
        };
        if n == 0 {
            return match reader.eof() {
                Some(status) => {
                    ctx.answered(&mut reader);
                    Ok((status, false))
                }
                None if !reader.started() => Err(Talk::Stale(Failure::Own(Exchange::Closed))),
                None => Err(Talk::Fail(Failure::Own(Exchange::Closed))),
            };
        }
        io.bytes_in += n as u64;
        ctx.rec.borrow_mut().bytes_in(n);
        if let Some(done) = reader.feed(&scratch[..n], method).map_err(Talk::Fail)? {
            if n < scratch.len() {
                // The read did not fill the buffer, so the socket is drained:
                // forget its read readiness now, or the next request on this
                // connection would spend a `recv` finding that out.
                let _ = stream.try_io(Interest::READABLE, || {
                    Err::<(), _>(io::ErrorKind::WouldBlock.into())
                });
            }
            ctx.answered(&mut reader);
            return Ok(done);
        }
    }
}

/// [`talk`] over TLS: the request is encrypted, the response decrypted
/// (byte counts are HTTP bytes, before encryption).
async fn talk_tls(
    ctx: &Ctx,
    stream: &TcpStream,
    session: &mut Session,
    aim: &Armed,
    io: &mut Io,
) -> Result<(u16, bool), Talk> {
    let wire = &aim.wire;
    let tls_fail = |e: TlsError| Talk::Fail(RequestError::from_tls(&e));
    let mut out = Vec::new();
    session.send(wire, &mut out).map_err(tls_fail)?;
    if let Err(e) = tls::write_all(stream, &out).await {
        // Nothing reached a server that closed the idle connection: try again.
        return Err(Talk::Stale(RequestError::from_io(&e)));
    }
    io.bytes_out += wire.len() as u64;
    ctx.rec.borrow_mut().bytes_out(wire.len());
    out.clear();
    let method = aim.method.as_str();
    let mut reader = ctx.reader();
    let mut plain = Vec::new();
    loop {
        plain.clear();
        let got = tls::receive_from(stream, &ctx.scratch, session, &mut plain, &mut out).await;
        if !out.is_empty() {
            tls::write_all(stream, &out)
                .await
                .map_err(|e| Talk::Fail(RequestError::from_io(&e)))?;
            out.clear();
        }
        let ended = match got {
            Ok(Some(Phase::PeerClosed) | None) => true,
            Ok(Some(_)) => false,
            Err(TlsError::Io(e)) if !reader.started() => {
                return Err(Talk::Stale(RequestError::from_io(&e)));
            }
            Err(e) => return Err(tls_fail(e)),
        };
        if !plain.is_empty() {
            io.bytes_in += plain.len() as u64;
            ctx.rec.borrow_mut().bytes_in(plain.len());
            if let Some(done) = reader.feed(&plain, method).map_err(Talk::Fail)? {
                ctx.answered(&mut reader);
                return Ok(done);
            }
        }
        if ended {
            return match reader.eof() {
                Some(status) => {
                    ctx.answered(&mut reader);
                    Ok((status, false))
                }
                None if !reader.started() => Err(Talk::Stale(Failure::Own(Exchange::Closed))),
                None => Err(Talk::Fail(Failure::Own(Exchange::Closed))),
            };
        }
    }
}
