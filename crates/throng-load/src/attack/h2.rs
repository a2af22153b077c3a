//! HTTP/2 in an `attack` worker (`--http2`): many requests at once on each
//! connection, as streams of `throng-proto`'s sans-I/O [`Connection`].
//!
//! One task per connection, none per request: a request due on the
//! schedule goes into its endpoint's queue (a [`Flight`] of 48 bytes), and
//! a connection with a free stream takes it; when every stream is busy it
//! waits there, and its latency still counts from its intended time (no
//! coordinated omission). A new connection opens, under `--max-connections`,
//! when the open ones have no room. A stream in flight is a map entry in its
//! connection (its `Flight` and windows): no task, timer or buffer of its
//! own, which is why HTTP/1.1's waiting room has no part here.
//!
//! Prior knowledge on `http://` (h2c); ALPN `h2` on `https://`, and a server
//! that does not choose it fails the connection with a clear message.
//!
//! What ends a stream: its answer (the status is recorded); RST_STREAM
//! (`stream_reset`); a malformed answer (`bad_response`); the connection
//! lost (`closed`); its timeout, counted from when it began (an RST_STREAM
//! CANCEL goes out). A stream the server did not process (REFUSED_STREAM,
//! or above a GOAWAY's last stream) goes once more, keeping its intended
//! time (counted in `retried`): on another connection while the pool has
//! one that takes streams or room for a new one (a refused stream is
//! marked so that the connection that refused it leaves it to the others),
//! else on the same; refused twice, it fails as `stream_reset`.
//!
//! Closed pool (`--max`): each of the `--connections` keeps its streams
//! busy, the next request starting as soon as one ends (h2load's `-c`/`-m`).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::time::Instant;

use throng_proto::h2::{Config, Connection, Event};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::WorkerPlan;
use super::record::{Exchange, Io, RequestError};
use super::worker::{Ctx, Link, Streams, connect, count_start, finish};
use crate::harness::failure::{Failure, NetCause};
use crate::tls::{self, Session};

/// One request on its way: what is needed to record it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Flight {
    seq: u64,
    intended: Instant,
    /// When the generator started it (its timeout counts from here).
    began: Instant,
    /// When its stream started (it waited for one until then).
    sent_at: Instant,
    /// Refused once already (it gets no third try).
    retried: bool,
    /// The connection that refused it (`Shared::id`; 0: none): it goes on
    /// another while the pool has one that takes streams.
    avoid: u32,
}

impl Flight {
    /// Its figures when it ended without an answer.
    fn io(&self) -> Io {
        Io {
            bytes_in: 0,
            bytes_out: 0,
            began: self.began,
            sent_at: Some(self.sent_at),
        }
    }
}

/// The HTTP/2 side of a worker: the encoded requests, and per endpoint the
/// connections and the requests waiting for a stream.
pub(super) struct H2 {
    config: Config,
    pools: Vec<RefCell<Pool>>,
    /// Closed pool: the next request number (of this worker's), and when to stop.
    closed: Option<(Cell<u64>, Option<Instant>)>,
    /// A GOAWAY was logged.
    goaway_logged: Cell<bool>,
    /// A connection error was logged with its reason.
    protocol_logged: Cell<bool>,
    /// An RST_STREAM was logged with its code.
    reset_logged: Cell<bool>,
    /// The last connection's `Shared::id`.
    last_id: Cell<u32>,
}

#[derive(Default)]
struct Pool {
    conns: Vec<Rc<Shared>>,
    /// Requests due with no stream free, oldest first.
    queue: VecDeque<Flight>,
}

/// What a connection's task and the dispatcher share.
struct Shared {
    /// Its number in the worker (from 1).
    id: u32,
    /// Streams open now.
    open: Cell<u32>,
    /// Requests the dispatcher sent its way since it last looked.
    claimed: Cell<u32>,
    /// Its stream limit (ours until the server's SETTINGS come).
    limit: Cell<u32>,
    /// It takes no more streams (going away, failed).
    closing: Cell<bool>,
    wake: Notify,
}

impl Shared {
    fn room(&self) -> u32 {
        if self.closing.get() {
            return 0;
        }
        self.limit
            .get()
            .saturating_sub(self.open.get() + self.claimed.get())
    }
}

/// The HTTP/2 engine of a worker running `plan` (`None`: HTTP/1.1), its
/// targets on `pools` endpoints.
pub(super) fn engine(plan: &WorkerPlan, pools: usize) -> Option<Rc<dyn Streams>> {
    let streams = plan.settings.http2?;
    let closed = matches!(plan.load, super::Load::Max { .. }).then(|| {
        plan.duration_ns.map(|d| {
            crate::harness::clock::Anchor::at_unix_ns(plan.start_unix_ns).instant()
                + std::time::Duration::from_nanos(d)
        })
    });
    Some(Rc::new(H2::new(pools, streams, closed)))
}

impl Streams for H2 {
    fn submit(self: Rc<Self>, ctx: &Rc<Ctx>, seq: u64, intended: Instant) {
        submit(ctx, &self, seq, intended);
    }

    fn start_closed(self: Rc<Self>, ctx: &Rc<Ctx>, loops: u64) {
        start_closed(ctx, &self, loops);
    }
}

impl H2 {
    /// The engine for `pools` endpoints, `max_streams` per connection; a
    /// closed pool stops at `end`.
    fn new(pools: usize, max_streams: u32, closed: Option<Option<Instant>>) -> Self {
        Self {
            config: Config {
                max_streams: max_streams.max(1),
                ..Config::default()
            },
            pools: (0..pools).map(|_| RefCell::default()).collect(),
            closed: closed.map(|end| (Cell::new(0), end)),
            goaway_logged: Cell::new(false),
            protocol_logged: Cell::new(false),
            reset_logged: Cell::new(false),
            last_id: Cell::new(0),
        }
    }
}

/// Request `seq`, due at `intended`, starts now: it goes to a connection
/// of its endpoint with a free stream, or waits for one.
fn submit(ctx: &Rc<Ctx>, h2: &Rc<H2>, seq: u64, intended: Instant) {
    let began = Instant::now();
    count_start(ctx, began);
    let f = Flight {
        seq,
        intended,
        began,
        sent_at: began,
        retried: false,
        avoid: 0,
    };
    // Invariant: its target is held until it ends.
    let Some(pool) = ctx.aims.get(ctx.aims.index(seq)).map(|a| a.pool) else {
        end(ctx, h2, f, f.io(), Err(Failure::Net(NetCause::Other)));
        return;
    };
    h2.pools[pool].borrow_mut().queue.push_back(f);
    place(ctx, h2, pool, 1);
}

/// Finds streams for `n` requests of pool `pool`'s queue: room on the open
/// connections, then new connections under the cap.
fn place(ctx: &Rc<Ctx>, h2: &Rc<H2>, pool: usize, n: u32) {
    let _unplaced = place_avoiding(ctx, h2, pool, n, 0);
}

/// [`place`], on connections other than `avoid`'s; how many of the `n`
/// found no room.
fn place_avoiding(ctx: &Rc<Ctx>, h2: &Rc<H2>, pool: usize, mut n: u32, avoid: u32) -> u32 {
    {
        let p = h2.pools[pool].borrow();
        for c in p.conns.iter().filter(|c| c.id != avoid) {
            if n == 0 {
                return 0;
            }
            let k = c.room().min(n);
            if k > 0 {
                c.claimed.set(c.claimed.get() + k);
                c.wake.notify_one();
                n -= k;
            }
        }
    }
    while n > 0 && ctx.open.get() < ctx.cap {
        let k = n.min(h2.config.max_streams);
        n -= k;
        open_connection(ctx, h2, pool, k);
    }
    n
}

/// Starts a connection task for pool `pool`, `claimed` requests its way.
fn open_connection(ctx: &Rc<Ctx>, h2: &Rc<H2>, pool: usize, claimed: u32) {
    ctx.open.set(ctx.open.get() + 1);
    h2.last_id.set(h2.last_id.get() + 1);
    let shared = Rc::new(Shared {
        id: h2.last_id.get(),
        open: Cell::new(0),
        claimed: Cell::new(claimed),
        limit: Cell::new(h2.config.max_streams),
        closing: Cell::new(false),
        wake: Notify::new(),
    });
    h2.pools[pool].borrow_mut().conns.push(shared.clone());
    let c = ctx.clone();
    let s = shared;
    let h2 = h2.clone();
    tokio::task::spawn_local(async move {
        run(&c, &h2, pool, &s).await;
        let h2 = &h2;
        let left = {
            let mut p = h2.pools[pool].borrow_mut();
            p.conns.retain(|x| !Rc::ptr_eq(x, &s));
            p.queue.len() as u32
        };
        c.open.set(c.open.get() - 1);
        if h2.closed.is_some() {
            // A closed pool's connection is its loop.
            c.live.done();
        } else if left > 0 && !c.stop.is_set() {
            place(&c, h2, pool, left);
        }
    });
}

/// The closed pool's connections: `loops` of them, each keeping its
/// streams busy until the run ends.
fn start_closed(ctx: &Rc<Ctx>, h2: &Rc<H2>, loops: u64) {
    for i in 0..loops {
        ctx.live.add();
        let pool = (i as usize) % ctx.endpoints.len();
        open_connection(ctx, h2, pool, 0);
    }
}

/// Why a connection ended before it could carry streams.
fn connect_failed(ctx: &Rc<Ctx>, h2: &Rc<H2>, pool: usize, shared: &Shared, why: RequestError) {
    if h2.closed.is_some() {
        // A closed pool's loop: its next request fails with the connect.
        if let Some(f) = next_closed(ctx, h2) {
            end(ctx, h2, f, f.io(), Err(why));
        }
        return;
    }
    // The requests that made this connection open fail with it.
    let n = shared.claimed.replace(0);
    for _ in 0..n.max(1) {
        let f = h2.pools[pool].borrow_mut().queue.pop_front();
        let Some(f) = f else { break };
        end(ctx, h2, f, f.io(), Err(why));
    }
}

/// Records how flight `f` ended, with its figures `io`.
fn end(ctx: &Rc<Ctx>, h2: &H2, f: Flight, io: Io, result: Result<u16, RequestError>) {
    finish(ctx, f.seq, ctx.aims.index(f.seq), f.intended, &io, result);
    // A request of the schedule holds its place in `live` until it ends.
    if h2.closed.is_none() {
        ctx.live.done();
    }
}

/// One connection's life: connect, then carry streams until it is done.
async fn run(ctx: &Rc<Ctx>, h2: &Rc<H2>, pool: usize, shared: &Rc<Shared>) {
    let link = loop {
        let link = Box::pin(connect(ctx, pool)).await;
        match link.and_then(|l| check_alpn(ctx, pool, &l).map(|()| l)) {
            Ok(link) => break link,
            Err(why) => {
                connect_failed(ctx, h2, pool, shared, why);
                // A closed pool's loop tries again while it has requests to make.
                if h2.closed.is_none() || ctx.stop.is_set() || !has_next_closed(ctx, h2) {
                    shared.closing.set(true);
                    return;
                }
            }
        }
    };
    ctx.rec.borrow_mut().connection_opened();
    let mut io_state = Wire {
        stream: link.stream,
        tls: link.tls,
        out: Vec::new(),
        plain: Vec::new(),
    };
    let mut conn: Connection<Flight> = Connection::new(h2.config);
    let lost = carry(ctx, h2, pool, shared, &mut io_state, &mut conn).await;
    shared.closing.set(true);
    conn.closed();
    let why = lost.unwrap_or(Failure::Own(Exchange::Closed));
    settle_events(ctx, h2, (pool, shared), &mut conn, Some(why));
    ctx.rec.borrow_mut().connection_closed();
}

/// An `https://` connection must have agreed to `h2`.
fn check_alpn(ctx: &Ctx, pool: usize, link: &Link) -> Result<(), RequestError> {
    let Some(session) = link.tls.as_deref() else {
        return Ok(());
    };
    if session.alpn() == Some(b"h2") {
        return Ok(());
    }
    if !ctx.tls_logged.replace(true) {
        let got = session
            .alpn()
            .map_or("none".into(), String::from_utf8_lossy);
        ctx.out.event(
            "request.error",
            format!(
                "--http2: the server at {} did not choose h2 in ALPN (it chose {got}); it does not speak HTTP/2 over TLS",
                ctx.endpoints[pool].addr
            ),
        );
    }
    Err(Failure::Own(Exchange::BadResponse))
}

/// A connection's socket, its TLS session, and buffers for TLS.
struct Wire {
    stream: TcpStream,
    tls: Option<Box<Session>>,
    /// Encrypted bytes to write (TLS only).
    out: Vec<u8>,
    /// Decrypted bytes read (TLS only).
    plain: Vec<u8>,
}

impl Wire {
    /// Writes what `conn` has to send.
    async fn flush(&mut self, ctx: &Ctx, conn: &mut Connection<Flight>) -> io::Result<()> {
        let n = conn.output().len();
        if n == 0 {
            return Ok(());
        }
        ctx.rec.borrow_mut().bytes_out(n);
        match self.tls.as_deref_mut() {
            Some(session) => {
                session
                    .send(conn.output(), &mut self.out)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                conn.written(n);
                tls::write_all(&self.stream, &self.out).await?;
                self.out.clear();
            }
            None => {
                tls::write_all(&self.stream, conn.output()).await?;
                conn.written(n);
            }
        }
        Ok(())
    }

    /// Reads what came (the socket is readable) into `conn`: `false` at
    /// the end of the connection.
    fn read(
        &mut self,
        ctx: &Ctx,
        h2: &Rc<H2>,
        conn: &mut Connection<Flight>,
    ) -> Result<bool, RequestError> {
        let mut scratch = ctx.scratch.borrow_mut();
        let n = match self.stream.try_read(&mut scratch[..]) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(RequestError::from_io(&e)),
        };
        let data: &[u8] = match self.tls.as_deref_mut() {
            Some(session) => {
                self.plain.clear();
                let phase = session
                    .receive(&mut scratch[..n], &mut self.plain, &mut self.out)
                    .map_err(|e| RequestError::from_tls(&e))?;
                if phase == tls::Phase::PeerClosed && self.plain.is_empty() {
                    return Ok(false);
                }
                &self.plain
            }
            None => &scratch[..n],
        };
        ctx.rec.borrow_mut().bytes_in(data.len());
        if let Err(e) = conn.recv(data) {
            if !h2.protocol_logged.replace(true) {
                ctx.out.event(
                    "request.error",
                    format!("HTTP/2 connection error (first of its kind): {e}"),
                );
            }
            return Err(Failure::Own(Exchange::BadResponse));
        }
        Ok(true)
    }
}

/// Carries streams on `conn` until it is done; returns why it was lost.
async fn carry(
    ctx: &Rc<Ctx>,
    h2: &Rc<H2>,
    pool: usize,
    shared: &Shared,
    wire: &mut Wire,
    conn: &mut Connection<Flight>,
) -> Option<RequestError> {
    let timeout = ctx.timeout;
    loop {
        // Also here: a busy socket must not keep timeouts from coming.
        expire(ctx, h2, conn, timeout);
        settle_events(ctx, h2, (pool, shared), conn, None);
        take_work(ctx, h2, pool, shared, conn);
        if let Err(e) = wire.flush(ctx, conn).await {
            return Some(RequestError::from_io(&e));
        }
        if !wire.out.is_empty() {
            if let Err(e) = tls::write_all(&wire.stream, &wire.out).await {
                return Some(RequestError::from_io(&e));
            }
            wire.out.clear();
        }
        shared.open.set(conn.open_streams() as u32);
        shared.limit.set(conn.stream_limit());
        if conn.going_away() {
            shared.closing.set(true);
        }
        if conn.is_done() || (shared.closing.get() && conn.open_streams() == 0) || ctx.stop.is_set()
        {
            return None;
        }
        let next_deadline = conn.oldest().map(|(_, f)| f.began + timeout);
        let deadline = async {
            match next_deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            ready = wire.stream.readable() => {
                if let Err(e) = ready {
                    return Some(RequestError::from_io(&e));
                }
                match wire.read(ctx, h2, conn) {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(why) => {
                        // The GOAWAY the connection queued goes out first.
                        let _ = wire.flush(ctx, conn).await;
                        return Some(why);
                    }
                }
            }
            () = shared.wake.notified() => {}
            () = deadline => expire(ctx, h2, conn, timeout),
        }
        if conn.going_away() {
            // Before the refused streams look for a connection: not this one.
            shared.closing.set(true);
        }
        settle_events(ctx, h2, (pool, shared), conn, None);
    }
}

/// Ends the streams whose timeout came (an RST_STREAM CANCEL each), oldest
/// stream first: streams start in the order requests were due, so their
/// deadlines come in that order too, except a request sent again after a
/// refusal, which keeps its first deadline and is checked when it is the
/// oldest (at most its first try's time late).
fn expire(ctx: &Rc<Ctx>, h2: &H2, conn: &mut Connection<Flight>, timeout: std::time::Duration) {
    let now = Instant::now();
    while let Some((id, f)) = conn.oldest() {
        if f.began + timeout > now {
            break;
        }
        if let Some(f) = conn.cancel(id) {
            end(ctx, h2, f, f.io(), Err(Failure::Net(NetCause::Timeout)));
        }
    }
}

/// Starts streams for waiting requests while `conn` has room; in a closed
/// pool, new requests.
fn take_work(
    ctx: &Rc<Ctx>,
    h2: &Rc<H2>,
    pool: usize,
    shared: &Shared,
    conn: &mut Connection<Flight>,
) {
    shared.claimed.set(0);
    if shared.closing.get() || ctx.stop.is_set() {
        return;
    }
    while conn.can_start() {
        let queued = pop_for(&mut h2.pools[pool].borrow_mut(), shared.id);
        let next = match queued {
            Some(f) => f,
            None if h2.closed.is_some() => match next_closed(ctx, h2) {
                Some(f) => f,
                None => {
                    if conn.open_streams() == 0 {
                        shared.closing.set(true);
                    }
                    return;
                }
            },
            None => return,
        };
        if next.began + ctx.timeout <= Instant::now() {
            // It waited for a stream past its whole timeout.
            end(
                ctx,
                h2,
                next,
                next.io(),
                Err(Failure::Net(NetCause::Timeout)),
            );
            continue;
        }
        let Some(aim) = ctx.aims.get(ctx.aims.index(next.seq)) else {
            // Invariant: its target is held until it ends.
            end(ctx, h2, next, next.io(), Err(Failure::Net(NetCause::Other)));
            continue;
        };
        let next = Flight {
            sent_at: Instant::now(),
            ..next
        };
        if let Err(f) = conn.start(&aim.head, aim.body.clone(), next) {
            h2.pools[pool].borrow_mut().queue.push_front(f);
            return;
        }
    }
}

/// The oldest request in `p`'s queue for connection `id`: one it refused
/// is left to the others while any of them takes streams.
fn pop_for(p: &mut Pool, id: u32) -> Option<Flight> {
    let others = p.conns.iter().any(|c| c.id != id && !c.closing.get());
    let at = if others {
        p.queue.iter().position(|f| f.avoid != id)?
    } else {
        0
    };
    p.queue.remove(at)
}

/// Whether a closed pool has requests left to make.
fn has_next_closed(ctx: &Ctx, h2: &Rc<H2>) -> bool {
    let Some((next, end)) = &h2.closed else {
        return false;
    };
    let seq = u64::from(ctx.plan.index) + next.get() * u64::from(ctx.plan.workers.max(1));
    end.is_none_or(|e| Instant::now() < e) && ctx.plan.requests.is_none_or(|n| seq < n)
}

/// A closed pool's next request, started now (`None`: the run is over).
fn next_closed(ctx: &Rc<Ctx>, h2: &Rc<H2>) -> Option<Flight> {
    if ctx.stop.is_set() || !has_next_closed(ctx, h2) {
        return None;
    }
    let (next, _) = h2.closed.as_ref()?;
    let k = next.get();
    next.set(k + 1);
    let seq = u64::from(ctx.plan.index) + k * u64::from(ctx.plan.workers.max(1));
    if !super::worker::take(ctx, seq) {
        return None;
    }
    let now = Instant::now();
    count_start(ctx, now);
    Some(Flight {
        seq,
        intended: now,
        began: now,
        sent_at: now,
        retried: false,
        avoid: 0,
    })
}

/// Records the streams that ended; sends refused ones again elsewhere.
/// `lost`: the connection is gone, and its open streams failed so.
fn settle_events(
    ctx: &Rc<Ctx>,
    h2: &Rc<H2>,
    (pool, from): (usize, &Shared),
    conn: &mut Connection<Flight>,
    lost: Option<RequestError>,
) {
    let mut again = 0;
    while let Some(ev) = conn.poll_event() {
        let (f, result, bytes_in) = match ev {
            Event::Answered {
                token,
                status,
                bytes_in,
            } => (token, Ok(status), bytes_in),
            Event::Reset { token, code } => {
                if !h2.reset_logged.replace(true) {
                    ctx.out.event(
                        "request.error",
                        format!("the server reset an HTTP/2 stream (RST_STREAM, error code {code}) (first of its kind)"),
                    );
                }
                (token, Err(Failure::Own(Exchange::StreamReset)), 0)
            }
            Event::Malformed { token, .. } => (token, Err(Failure::Own(Exchange::BadResponse)), 0),
            Event::Lost { token } => (
                token,
                Err(lost.unwrap_or(Failure::Own(Exchange::Closed))),
                0,
            ),
            Event::Refused { token } if !token.retried && !ctx.stop.is_set() => {
                ctx.rec.borrow_mut().retried();
                let f = Flight {
                    retried: true,
                    avoid: from.id,
                    ..token
                };
                h2.pools[pool].borrow_mut().queue.push_front(f);
                again += 1;
                continue;
            }
            Event::Refused { token } => (token, Err(Failure::Own(Exchange::StreamReset)), 0),
            Event::GoAway { last_stream, code } => {
                if !h2.goaway_logged.replace(true) {
                    ctx.out.event(
                        "h2.goaway",
                        format!(
                            "the server sent GOAWAY (code {code}, last stream {last_stream}): its connections close and streams it did not process go again on new ones (first of its kind)"
                        ),
                    );
                }
                continue;
            }
        };
        let sent = ctx.aims.get(ctx.aims.index(f.seq)).map_or(0, |a| {
            a.head.len() + 9 + a.body.as_ref().map_or(0, |b| b.len() + 9)
        });
        let io = Io {
            bytes_in,
            bytes_out: sent as u64,
            began: f.began,
            sent_at: Some(f.sent_at),
        };
        end(ctx, h2, f, io, result);
    }
    // On another connection (an open one, or a new one under the cap);
    // those with none go on any, this one too.
    let unplaced = if again > 0 {
        place_avoiding(ctx, h2, pool, again, from.id)
    } else {
        0
    };
    if unplaced > 0 {
        for f in h2.pools[pool].borrow_mut().queue.iter_mut() {
            if f.avoid == from.id {
                f.avoid = 0;
            }
        }
        place(ctx, h2, pool, unplaced);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request in flight over HTTP/2 is its stream's entry in its
    /// connection: this token, two windows, a body handle, the status and
    /// its byte count (docs/http2.md; `scripts/bench-attack-h2.sh` measures
    /// the whole cost per stream).
    #[test]
    fn a_stream_in_flight_keeps_its_size() {
        assert_eq!(size_of::<Flight>(), 64);
        assert_eq!(throng_proto::h2::stream_size::<Flight>(), 120);
    }
}
