//! One `hold` worker process: opens its share of the run's connections on
//! the open-model schedule, holds them, checks every message that arrives,
//! and closes them cleanly when told to stop.
//!
//! A worker is one single-threaded tokio runtime (the harness core's
//! [`worker`](crate::harness::worker)). Each connection is opened by its
//! own task (connect, TLS handshake for `wss://`, upgrade, their
//! timeouts); once upgraded it is handed to the worker's readiness loop
//! (`held`) and its task ends. While a connection is idle it owns nothing
//! but the socket, a frame decoder with no buffer, its place in the
//! message sequence and the time it opened: no read or write buffer and no
//! timer (a TLS connection adds its two record keys, see
//! [`crate::tls::Records`]). Reads go into one scratch buffer per worker;
//! only a frame (or TLS record) split across reads leaves a small owned
//! remainder behind.
//!
//! Besides the core's orders (`publishing <ns>` before the first message,
//! `stop <final_seq>` at the end), its records include a
//! `worker.ramp_done` event once every connection of its share is open or
//! has failed, a `worker.messages` event at its end (each message's
//! deliveries here: count, latency sum and largest), a `worker.arrivals`
//! event when the server's own messages were measured (`--stamp`: each
//! one's first and last arrival here, `throng_report::fanout`), and a
//! `worker.done` event last.

use std::cell::{Cell, RefCell};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use throng_proto::http::{self, BodyKind};
use throng_proto::{mqtt, ws};
use throng_report::fanout;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use super::WorkerPlan;
use super::held::{Codec, Holder};
use super::mqtt::{Joining, MqttOptions, Refusal};
use super::plan::assign;
use super::recorder::{ConnectError, Handshake, HoldRecorder, MessageTally};
use super::shared::Shared;
use super::target::WsTarget;
use crate::harness::clock::{Anchor, micros};
use crate::harness::failure::{Failure, FirstOfKind, NetCause};
use crate::harness::worker::{Live, Order, Orders, Output, Stop, Ticker};
use crate::pacer::Pacer;
use crate::tls::{self, Phase, Records, Session, TlsClient};

/// State shared by every task of the worker (single-threaded: `Rc`, `Cell`).
struct Ctx {
    /// What the tasks share with the readiness loop.
    shared: Shared,
    /// The TLS client of `wss://` runs.
    tls: Option<TlsClient>,
    /// Connections being opened, plus 1 while the schedule still runs.
    opening: Cell<u64>,
    ticker: Ticker,
    /// The readiness loop holding upgraded connections.
    holder: Holder,
    /// One log line per error kind, so a failing run does not flood stdout.
    logged: FirstOfKind,
    /// What the first TLS handshake negotiated was logged.
    tls_noted: Cell<bool>,
    out: Output,
}

impl Ctx {
    fn fail(&self, kind: ConnectError, detail: impl FnOnce() -> String) {
        self.shared.rec.borrow_mut().failed(kind);
        if self.logged.first(kind) {
            self.out.event(
                "connect.error",
                format!("{} (first of its kind): {}", kind.label(), detail()),
            );
        }
    }

    /// One connection attempt (or the schedule itself) is over; when all
    /// are, tell the supervisor, which starts the hold time and publishing then.
    fn opening_done(&self) {
        let left = self.opening.get() - 1;
        self.opening.set(left);
        if left == 0 {
            // Opening many connections at once leaves freed handshake
            // buffers and task cells behind; glibc keeps them, and they
            // would count as RSS of the idle connections.
            throng_host::process::release_free_memory();
            self.out.event(
                "worker.ramp_done",
                format!("{} connections attempted", self.shared.plan.share()),
            );
        }
    }

    /// The supervisor's order to stop: close every held connection, and
    /// give up on those that do not answer within the close timeout.
    fn stop(self: &Rc<Self>, final_seq: u64) {
        if !self.shared.stop.set() {
            return;
        }
        self.shared.final_seq.set(final_seq);
        self.holder.close_all(&self.shared);
        let wait = Duration::from_millis(self.shared.plan.settings.close_timeout_ms);
        let ctx = self.clone();
        tokio::task::spawn_local(async move {
            tokio::time::sleep(wait).await;
            ctx.holder.expire(&ctx.shared);
        });
    }
}

/// Runs one worker: its share of `plan`, until every connection has closed.
/// Ready after the run's start, it starts its ramp then, at the planned pace.
pub async fn work(mut plan: WorkerPlan, mut orders: Orders, out: Box<dyn Write>) -> io::Result<()> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    let pacer =
        Pacer::for_count(plan.rate, plan.connections).map_err(|e| invalid(e.to_string()))?;
    let settings = plan.settings;
    let rec = HoldRecorder::new(plan.label.clone(), settings.interval_ns, plan.share());
    let tls = match (&plan.tls, plan.target.tls) {
        (Some(opts), true) => Some(TlsClient::new(opts).map_err(|e| invalid(e.to_string()))?),
        (None, true) => {
            return Err(invalid(
                "a wss:// target needs TLS options in the worker plan".into(),
            ));
        }
        (_, false) => None,
    };
    if plan.target.mqtt && plan.mqtt.is_none() {
        return Err(invalid(
            "an mqtt:// target needs MQTT options in the worker plan".into(),
        ));
    }
    let out = Output::new(plan.label.clone(), out);
    out.ready(&mut plan.start_unix_ns);
    let ctx = Rc::new(Ctx {
        shared: Shared {
            plain: RefCell::new(Vec::new()),
            rec: RefCell::new(rec),
            scratch: RefCell::new(vec![0u8; settings.scratch.max(4096)].into_boxed_slice()),
            stop: Stop::default(),
            final_seq: Cell::new(0),
            first_publish_ns: Cell::new(0),
            live: Live::default(),
            plan,
        },
        tls,
        opening: Cell::new(1),
        ticker: Ticker::new(settings.interval_ns),
        logged: FirstOfKind::default(),
        tls_noted: Cell::new(false),
        holder: Holder::new()?,
        out,
    });
    // The opener itself, so that the worker waits for the schedule to end.
    ctx.shared.live.add();

    let orders_ctx = ctx.clone();
    tokio::task::spawn_local(async move {
        while let Some(order) = orders.next().await {
            match order {
                Order::Publishing(ns) => orders_ctx.shared.first_publish_ns.set(ns),
                Order::Stop(seq) => orders_ctx.stop(seq),
            }
        }
    });
    let start = Anchor::at_unix_ns(ctx.shared.plan.start_unix_ns).instant();
    tokio::task::spawn_local(open_all(ctx.clone(), pacer, start));
    let tick_ctx = ctx.clone();
    let ticker = tokio::task::spawn_local(async move {
        tick_ctx
            .ticker
            .run(&tick_ctx.shared.rec, &tick_ctx.out, || {})
            .await;
    });
    let loop_ctx = ctx.clone();
    let holder =
        tokio::task::spawn_local(async move { loop_ctx.holder.run(&loop_ctx.shared).await });
    let pinger = ctx
        .shared
        .plan
        .mqtt
        .as_ref()
        .filter(|_| ctx.shared.plan.target.mqtt)
        .map(|opts| {
            let keep_alive_s = opts.keep_alive_s;
            let ping_ctx = ctx.clone();
            tokio::task::spawn_local(async move {
                let mut every = tokio::time::interval(Duration::from_secs(1));
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut tick = 0u64;
                loop {
                    every.tick().await;
                    ping_ctx.holder.ping(&ping_ctx.shared, tick, keep_alive_s);
                    tick += 1;
                }
            })
        });

    let read_timeout_ms = ctx.shared.plan.settings.read_timeout_ms;
    let sweeper = (read_timeout_ms > 0).then(|| {
        let sweep_ctx = ctx.clone();
        tokio::task::spawn_local(async move {
            let half = Duration::from_millis(read_timeout_ms.div_ceil(2));
            let mut every = tokio::time::interval_at(tokio::time::Instant::now() + half, half);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                sweep_ctx.holder.sweep(&sweep_ctx.shared);
            }
        })
    });

    while ctx.shared.live.get() > 0 {
        ctx.shared.live.changed().await;
    }
    ticker.abort();
    holder.abort();
    for task in [pinger, sweeper].into_iter().flatten() {
        task.abort();
    }
    ctx.ticker.last(&ctx.shared.rec, &ctx.out);
    let messages = ctx.shared.rec.borrow().messages();
    if !messages.is_empty() {
        // Exact per message whatever their spacing (bench's last subscriber).
        ctx.out
            .event("worker.messages", MessageTally::to_text(&messages));
    }
    let arrivals = ctx.shared.rec.borrow().arrivals().clone();
    if !arrivals.is_empty() {
        // Each server message's first and last arrival here: its spread
        // over every worker is one merge away.
        ctx.out.event(fanout::KIND, arrivals.to_text());
    }
    ctx.out.event(
        "worker.done",
        format!("{} connections attempted", ctx.shared.plan.share()),
    );
    Ok(())
}

/// Starts this worker's connections on the schedule.
async fn open_all(ctx: Rc<Ctx>, pacer: Pacer, start: Instant) {
    let step = u64::from(ctx.shared.plan.workers.max(1));
    let mut i = u64::from(ctx.shared.plan.index);
    while i < ctx.shared.plan.connections && !ctx.shared.stop.is_set() {
        // Past the last stage (which ended at 0/s) nothing more is due.
        let Some(intended) = start.checked_add(pacer.intended(i)) else {
            break;
        };
        let now = Instant::now();
        if intended > now {
            let stop = ctx.shared.stop.notified();
            tokio::select! {
                biased;
                () = stop => break,
                () = tokio::time::sleep_until(intended.into()) => {}
            }
            continue;
        }
        ctx.shared.rec.borrow_mut().started(micros(now - intended));
        ctx.shared.live.add();
        ctx.opening.set(ctx.opening.get() + 1);
        tokio::task::spawn_local(connection(ctx.clone(), i, intended));
        i += step;
    }
    ctx.opening_done();
    ctx.shared.live.done();
}

/// One connection from first SYN to last close.
async fn connection(ctx: Rc<Ctx>, i: u64, intended: Instant) {
    let started = Instant::now();
    let plan = &ctx.shared.plan;
    let (_, s, p) = assign(
        i,
        plan.workers,
        plan.sources.len(),
        plan.target.port_count(),
    );
    let source = plan.sources.get(s).copied();
    let port = plan.target.port(p);
    let opened = if ctx.shared.stop.is_set() {
        None
    } else {
        let stop = ctx.shared.stop.notified();
        tokio::select! {
            biased;
            () = stop => None,
            r = open(&ctx, source, port, i) => Some(r),
        }
    };
    match opened {
        Some(Ok(open)) => {
            let now = Instant::now();
            let mut rec = ctx.shared.rec.borrow_mut();
            rec.opened(micros(now - intended), micros(now - started));
            rec.phases(open.tcp_us, open.tls_us, open.upgrade_us);
            if let Some(resumed) = open.resumed {
                rec.tls_handshake(resumed);
            }
            drop(rec);
            ctx.holder.adopt(
                &ctx.shared,
                open.stream,
                open.records,
                open.codec,
                open.rest,
            );
        }
        Some(Err((kind, detail))) => ctx.fail(kind, || detail),
        None => ctx.shared.rec.borrow_mut().abandoned(),
    }
    ctx.opening_done();
    ctx.shared.live.done();
}

type OpenError = (ConnectError, String);

/// An upgraded connection and how long each step took.
struct Opened {
    stream: TcpStream,
    /// The TLS record state of a `wss://` connection.
    records: Option<Box<Records>>,
    /// Whether its handshake resumed a session.
    resumed: Option<bool>,
    /// Bytes (decrypted) that arrived after the upgrade response head.
    rest: Vec<u8>,
    /// The decoder the connection goes on with.
    codec: Codec,
    tcp_us: u64,
    tls_us: Option<u64>,
    upgrade_us: u64,
}

/// TCP connect from `source`, the TLS handshake (`wss://`, `mqtts://`) and
/// the WebSocket upgrade, the event stream's GET (`sse://`), or MQTT's
/// CONNECT and SUBSCRIBE for connection `i`.
async fn open(ctx: &Ctx, source: Option<IpAddr>, port: u16, i: u64) -> Result<Opened, OpenError> {
    let began = Instant::now();
    let settings = &ctx.shared.plan.settings;
    let addr = SocketAddr::new(ctx.shared.plan.target.ip, port);
    let mut stream = connect(source, addr, settings.connect_timeout_ms).await?;
    let connected = Instant::now();
    let timeout = Duration::from_millis(settings.handshake_timeout_ms);
    let mut plain = Vec::new();
    let mut session = match &ctx.tls {
        None => None,
        Some(client) => Some(secure(ctx, client, &stream, addr, &mut plain).await?),
    };
    let secured = Instant::now();
    let greeting = greet(ctx, &mut stream, session.as_deref_mut(), plain, port, i);
    match tokio::time::timeout(timeout, greeting).await {
        Ok(Ok((rest, codec))) => {
            let done = Instant::now();
            let resumed = session.as_ref().map(|s| s.resumed());
            // Out of rustls: only the keys stay (see `tls::records`).
            let records = match session {
                None => None,
                Some(s) => Some(Box::new(s.into_records().map_err(|e| {
                    (
                        Failure::from_tls(&e),
                        format!("taking over the TLS connection to {addr}: {e}"),
                    )
                })?)),
            };
            Ok(Opened {
                stream,
                tls_us: resumed.map(|_| micros(secured - connected)),
                records,
                resumed,
                rest,
                codec,
                tcp_us: micros(connected - began),
                upgrade_us: micros(done - secured),
            })
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(greeting_timed_out(&ctx.shared.plan, addr)),
    }
}

/// TCP connect from `source` to `addr`, within `timeout_ms`.
async fn connect(
    source: Option<IpAddr>,
    addr: SocketAddr,
    timeout_ms: u64,
) -> Result<TcpStream, OpenError> {
    let io_err = |what: &str, e: io::Error| (Failure::from_io(&e), format!("{what} {addr}: {e}"));
    let socket =
        crate::harness::source::socket(source, addr).map_err(|e| io_err("socket/bind for", e))?;
    let connect = tokio::time::timeout(Duration::from_millis(timeout_ms), socket.connect(addr));
    match connect.await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(io_err("connect to", e)),
        Err(_) => Err((
            Failure::Net(NetCause::Timeout),
            format!("connect to {addr}: no answer in {timeout_ms} ms"),
        )),
    }
}

/// The TLS handshake with `client` on `stream` (to `addr`), within the
/// handshake timeout; bytes that came after it go to `plain`.
async fn secure(
    ctx: &Ctx,
    client: &TlsClient,
    stream: &TcpStream,
    addr: SocketAddr,
    plain: &mut Vec<u8>,
) -> Result<Box<Session>, OpenError> {
    let settings = &ctx.shared.plan.settings;
    let timeout = Duration::from_millis(settings.handshake_timeout_ms);
    let mut session = client
        .session(&ctx.shared.plan.target.host)
        .map_err(|e| (Failure::Net(NetCause::Other), e.to_string()))?;
    let handshake = tls::handshake(stream, &ctx.shared.scratch, &mut session, plain);
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err((
                Failure::from_tls(&e),
                format!("TLS handshake with {addr}: {e}"),
            ));
        }
        Err(_) => {
            return Err((
                Failure::Net(NetCause::Timeout),
                format!(
                    "TLS handshake with {addr}: not done in {} ms",
                    settings.handshake_timeout_ms
                ),
            ));
        }
    }
    if !ctx.tls_noted.replace(true) {
        ctx.out.event("tls.negotiated", session.describe());
    }
    Ok(Box::new(session))
}

/// What makes a subscriber of connection `i` (to `port`): the event
/// stream's GET, MQTT's CONNECT and SUBSCRIBE, or the WebSocket upgrade;
/// the bytes after its answer and the decoder it goes on with.
async fn greet(
    ctx: &Ctx,
    stream: &mut TcpStream,
    session: Option<&mut Session>,
    plain: Vec<u8>,
    port: u16,
    i: u64,
) -> Result<(Vec<u8>, Codec), OpenError> {
    let plan = &ctx.shared.plan;
    let settings = &plan.settings;
    let scratch = &ctx.shared.scratch;
    let mqtt = plan.mqtt.as_ref().filter(|_| plan.target.mqtt);
    if let Some(opts) = mqtt.filter(|_| !plan.target.sse) {
        let id = format!("{}{i}", opts.client_id_prefix);
        let asked = (opts, id.as_str(), plan.target.channel());
        let (rest, decoder) =
            join(stream, scratch, session, plain, asked, settings.max_message).await?;
        return Ok((rest, Codec::mqtt(decoder)));
    }
    let start = HttpStart {
        stream,
        scratch,
        session,
        plain,
        target: &plan.target,
        port,
        max_head: settings.max_head,
    };
    if plan.target.sse {
        return Ok((subscribe(start).await?, Codec::Sse));
    }
    let rest = upgrade(start).await?;
    let decoder = ws::Decoder::new(ws::Role::Client, settings.max_message);
    Ok((rest, Codec::Ws(decoder)))
}

/// What the HTTP start of a connection (the WebSocket upgrade, the event
/// stream's GET) works with.
struct HttpStart<'a> {
    stream: &'a mut TcpStream,
    scratch: &'a RefCell<Box<[u8]>>,
    /// The TLS session of `wss://` and `sses://`.
    session: Option<&'a mut Session>,
    /// Bytes that already arrived (with the TLS handshake).
    plain: Vec<u8>,
    target: &'a WsTarget,
    /// The target port this connection goes to.
    port: u16,
    /// The largest response head accepted.
    max_head: usize,
}

impl HttpStart<'_> {
    /// Sends `request` and reads until `answer` has what it waits for
    /// (see [`Exchange::run`]); `what` names it in errors.
    async fn ask<T>(
        self,
        what: &'static str,
        request: &[u8],
        answer: impl FnMut(&mut Vec<u8>) -> Result<Option<T>, OpenError>,
    ) -> Result<T, OpenError> {
        let exchange = Exchange {
            what,
            limit: 2 * self.max_head,
        };
        exchange
            .run(
                self.stream,
                self.scratch,
                self.session,
                request,
                self.plain,
                answer,
            )
            .await
    }
}

/// The error of a subscriber's greeting (upgrade, GET, CONNECT) that had
/// no answer within the handshake timeout.
fn greeting_timed_out(plan: &WorkerPlan, addr: SocketAddr) -> OpenError {
    let (what, answer) = match (plan.target.mqtt, plan.target.sse) {
        (true, _) => ("MQTT CONNECT/SUBSCRIBE", "CONNACK and SUBACK"),
        (false, true) => ("event stream GET", "200 response"),
        (false, false) => ("upgrade", "101 response"),
    };
    (
        Failure::Net(NetCause::Timeout),
        format!(
            "{what} at {addr}: no {answer} in {} ms",
            plan.settings.handshake_timeout_ms
        ),
    )
}

/// The WebSocket upgrade (through `session` for `wss://`); `plain` holds
/// any bytes that already arrived. Returns the bytes after the response head.
async fn upgrade(start: HttpStart<'_>) -> Result<Vec<u8>, OpenError> {
    let (target, port, max_head) = (start.target, start.port, start.max_head);
    let key = ws::client_key(fastrand::u128(..).to_ne_bytes());
    let mut request = Vec::with_capacity(256);
    ws::write_upgrade_request(&mut request, &target.host_header(port), &target.path, &key);
    with_extra_head(&mut request, target);
    let bad = |why: String| (Failure::Own(Handshake::BadHandshake), why);
    let answer = |buf: &mut Vec<u8>| match http::parse_response(buf, max_head) {
        Ok(None) => Ok(None),
        Ok(Some((resp, n))) => match ws::client_verify(&resp, &key) {
            Ok(()) => Ok(Some(buf.split_off(n))),
            Err(ws::HandshakeError::NotSwitching(status)) => Err((
                Failure::Own(Handshake::BadStatus),
                format!("upgrade: server answered {status} {}", resp.reason),
            )),
            Err(e) => Err(bad(format!("upgrade: {e}"))),
        },
        Err(e) => Err(bad(format!("upgrade: {e}"))),
    };
    start.ask("upgrade", &request, answer).await
}

/// Puts `target`'s extra head lines (`-H`, `--subprotocol`) before the
/// blank line that ends `request`'s head (a request without a body).
fn with_extra_head(request: &mut Vec<u8>, target: &WsTarget) {
    let extra = target.extra_head();
    if !extra.is_empty() && request.ends_with(b"\r\n\r\n") {
        request.truncate(request.len() - 2);
        request.extend_from_slice(extra.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
}

/// A Server-Sent Events subscriber's start (through `session` for
/// `sses://`): `GET` with `Accept: text/event-stream`, answered by `200`
/// with that content type and a body that runs until the connection ends.
/// Returns the bytes after the response head (the first events).
async fn subscribe(start: HttpStart<'_>) -> Result<Vec<u8>, OpenError> {
    let (target, port, max_head) = (start.target, start.port, start.max_head);
    let mut request = Vec::with_capacity(256);
    let host = target.host_header(port);
    http::write_request(
        &mut request,
        "GET",
        &target.path,
        &[
            ("Host", host.as_bytes()),
            ("Accept", b"text/event-stream"),
            ("Cache-Control", b"no-cache"),
        ],
        b"",
    );
    with_extra_head(&mut request, target);
    let bad = |why: String| (Failure::Own(Handshake::BadHandshake), why);
    let answer = |buf: &mut Vec<u8>| match http::parse_response(buf, max_head) {
        Ok(None) => Ok(None),
        Ok(Some((resp, _))) if resp.status != 200 => Err((
            Failure::Own(Handshake::BadStatus),
            format!(
                "event stream: server answered {} {}",
                resp.status, resp.reason
            ),
        )),
        Ok(Some((resp, n))) => {
            let media = resp.header("content-type").unwrap_or_default();
            let media = media.split(|&b| b == b';').next().unwrap_or_default();
            if !media
                .trim_ascii()
                .eq_ignore_ascii_case(b"text/event-stream")
            {
                return Err(bad(format!(
                    "event stream: 200 with Content-Type '{}', not text/event-stream",
                    String::from_utf8_lossy(media)
                )));
            }
            match resp.body_kind("GET") {
                Ok(BodyKind::UntilClose) => Ok(Some(buf.split_off(n))),
                Ok(kind) => Err(bad(format!(
                    "event stream: a body of kind {kind:?}; hold reads one that runs until \
                     the connection closes (no chunked encoding, no length)"
                ))),
                Err(e) => Err(bad(format!("event stream: {e}"))),
            }
        }
        Err(e) => Err(bad(format!("event stream: {e}"))),
    };
    start.ask("event stream GET", &request, answer).await
}

/// An MQTT subscriber's start (through `session` for `mqtts://`): CONNECT
/// and SUBSCRIBE in one write, then CONNACK and SUBACK. Returns the bytes
/// after SUBACK and the decoder, which has seen CONNACK.
async fn join(
    stream: &mut TcpStream,
    scratch: &RefCell<Box<[u8]>>,
    session: Option<&mut Session>,
    plain: Vec<u8>,
    (opts, client_id, filter): (&MqttOptions, &str, &str),
    max_packet: usize,
) -> Result<(Vec<u8>, mqtt::Decoder), OpenError> {
    let mut request = Vec::with_capacity(64 + filter.len());
    opts.connect(client_id, opts.keep_alive_s, &mut request);
    opts.subscribe(filter, &mut request);
    let mut decoder = mqtt::Decoder::client(opts.version(), max_packet);
    let mut step = opts.joining();
    let answer = |buf: &mut Vec<u8>| {
        while step != Joining::Done {
            let (consumed, next) = match decoder.decode(buf) {
                Ok(None) => return Ok(None),
                Ok(Some(d)) => (d.consumed, step.on(&d.packet)),
                Err(e) => {
                    return Err((
                        Failure::Own(Handshake::BadHandshake),
                        format!("MQTT CONNECT/SUBSCRIBE: {e}"),
                    ));
                }
            };
            step = next.map_err(|refusal| {
                let kind = match refusal {
                    Refusal::Unexpected(_) => Handshake::BadHandshake,
                    Refusal::Connack(_) | Refusal::Suback(_) => Handshake::BadStatus,
                };
                (Failure::Own(kind), format!("MQTT: {refusal}"))
            })?;
            buf.drain(..consumed);
        }
        // A copy of what follows SUBACK (nothing, almost always: no
        // allocation), so the read buffer is freed now, not held.
        Ok(Some(buf.to_vec()))
    };
    let exchange = Exchange {
        what: "MQTT CONNECT/SUBSCRIBE",
        limit: 2 * max_packet,
    };
    let rest = exchange
        .run(stream, scratch, session, &request, plain, answer)
        .await?;
    Ok((rest, decoder))
}

/// One request and its answer at the start of a connection, plain or
/// through TLS: the WebSocket upgrade, MQTT's CONNECT and SUBSCRIBE.
struct Exchange {
    /// What it is, for errors.
    what: &'static str,
    /// The most bytes read before the answer is whole.
    limit: usize,
}

impl Exchange {
    /// Sends `request` and reads until `answer` (given every byte read so
    /// far, `plain` first) has what it waits for.
    async fn run<T>(
        &self,
        stream: &mut TcpStream,
        scratch: &RefCell<Box<[u8]>>,
        mut session: Option<&mut Session>,
        request: &[u8],
        plain: Vec<u8>,
        mut answer: impl FnMut(&mut Vec<u8>) -> Result<Option<T>, OpenError>,
    ) -> Result<T, OpenError> {
        let what = self.what;
        let io_err = |e: io::Error| (Failure::from_io(&e), format!("{what}: {e}"));
        let tls_err = |e: tls::TlsError| (Failure::from_tls(&e), format!("{what} (over TLS): {e}"));
        let closed = || {
            (
                Failure::Net(NetCause::Reset),
                format!("{what}: the server closed the connection before answering"),
            )
        };
        let mut wire = Vec::new();
        match session.as_deref_mut() {
            Some(s) => {
                s.send(request, &mut wire).map_err(tls_err)?;
                tls::write_all(stream, &wire).await.map_err(io_err)?;
                wire.clear();
            }
            None => stream.write_all(request).await.map_err(io_err)?,
        }
        let mut buf = plain;
        let mut first = !buf.is_empty();
        let mut peer_closed = false;
        loop {
            if first {
                // Bytes that came with the handshake: look at them before reading.
                first = false;
            } else if let Some(s) = session.as_deref_mut() {
                let phase = tls::receive_from(stream, scratch, s, &mut buf, &mut wire)
                    .await
                    .map_err(tls_err)?
                    .ok_or_else(closed)?;
                if !wire.is_empty() {
                    tls::write_all(stream, &wire).await.map_err(io_err)?;
                    wire.clear();
                }
                peer_closed = phase == Phase::PeerClosed;
            } else {
                stream.readable().await.map_err(io_err)?;
                let old = buf.len();
                buf.resize(old + 1024, 0);
                match stream.try_read(&mut buf[old..]) {
                    Ok(0) => return Err(closed()),
                    Ok(n) => buf.truncate(old + n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        buf.truncate(old);
                        continue;
                    }
                    Err(e) => return Err(io_err(e)),
                }
            }
            if let Some(done) = answer(&mut buf)? {
                return Ok(done);
            }
            if peer_closed {
                return Err(closed());
            }
            if buf.len() > self.limit {
                return Err((
                    Failure::Own(Handshake::BadHandshake),
                    format!("{what}: no answer in the first {} bytes", self.limit),
                ));
            }
        }
    }
}
