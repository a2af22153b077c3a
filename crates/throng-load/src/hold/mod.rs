//! One `hold` worker process: opens its share of the run's connections on
//! the open-model schedule, holds them, checks every message that arrives,
//! and closes them cleanly when told to stop.
//!
//! A worker is one single-threaded tokio runtime. Each connection is opened
//! by its own task (connect, TLS handshake for `wss://`, upgrade, their
//! timeouts); once upgraded it is handed to the worker's readiness loop
//! (`held`) and its task ends. While a connection is idle it owns nothing
//! but the socket, a frame decoder with no buffer, the last sequence number
//! seen and the time it opened: no read or write buffer and no timer (a TLS
//! connection adds its two record keys, see [`crate::tls::Records`]). Reads go into one
//! scratch buffer per worker; only a frame (or TLS record) split across
//! reads leaves a small owned remainder behind.
//!
//! The worker talks to its supervisor over stdio. Its stdin carries the
//! [`WorkerPlan`] as the first line (JSON), then control lines:
//! `publishing <first_publish_unix_ns>` before the first message is
//! published, and `stop <final_seq>` at the end (end of input also stops).
//! Its stdout carries result-file records (`throng-report` format): one
//! interval per second, events for errors, a `worker.ramp_done` event once
//! every connection of its share is open or has failed, and a `worker.done`
//! event last.

use std::cell::{Cell, RefCell};
use std::io::{self, BufRead, Write};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use throng_proto::http;
use throng_proto::ws;
use throng_report::format::{Event, encode_event, encode_interval};
use throng_report::interval::Interval;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Notify;

use crate::message;
use crate::pacer::{Pacer, RateSpec};
use crate::plan::assign;
use crate::recorder::{ConnectError, HoldRecorder};
use crate::target::WsTarget;
use crate::tls::{self, Phase, Records, Session, TlsClient, TlsOptions};
use held::Holder;

mod held;

/// Timeouts and limits of held connections; every one is printed at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// TCP connect, from the actual start (ms).
    pub connect_timeout_ms: u64,
    /// The upgrade request and response, after TCP connect (ms).
    pub handshake_timeout_ms: u64,
    /// How long to wait for the server's close frame after sending ours (ms).
    pub close_timeout_ms: u64,
    /// The largest message accepted; a bigger one closes the connection with 1009.
    pub max_message: usize,
    /// The largest upgrade response head accepted.
    pub max_head: usize,
    /// Size of the one read buffer per worker.
    pub scratch: usize,
    /// Interval length (ns).
    pub interval_ns: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 10_000,
            handshake_timeout_ms: 10_000,
            close_timeout_ms: 2_000,
            max_message: 1 << 20,
            max_head: http::MAX_HEAD,
            scratch: 64 * 1024,
            interval_ns: 1_000_000_000,
        }
    }
}

/// Everything one worker needs to run its share; sent as JSON on its stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerPlan {
    /// This worker's number, `0..workers`.
    pub index: u32,
    /// Workers in the run.
    pub workers: u32,
    /// Connections in the whole run; this worker opens those with `i % workers == index`.
    pub connections: u64,
    /// The run's connection rate (the whole run's, not this worker's share).
    pub rate: RateSpec,
    /// When event 0 of the schedule is due, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Where to connect.
    pub target: WsTarget,
    /// Source addresses to bind (empty: the kernel picks).
    pub sources: Vec<IpAddr>,
    /// Timeouts and limits.
    pub settings: Settings,
    /// The `source` of this worker's intervals (`host/hold-0`).
    pub label: String,
    /// How to check and resume TLS (`wss://` targets only).
    #[serde(default)]
    pub tls: Option<TlsOptions>,
}

impl WorkerPlan {
    /// Connections this worker opens.
    pub fn share(&self) -> u64 {
        let w = u64::from(self.workers.max(1));
        let i = u64::from(self.index);
        if i >= self.connections {
            0
        } else {
            (self.connections - i).div_ceil(w)
        }
    }
}

/// Gives the heap's free memory back to the kernel. Opening many
/// connections at once leaves freed handshake buffers and task cells behind;
/// glibc keeps them, and they would count as RSS of the idle connections.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Wall-clock time, ns since the Unix epoch.
pub fn now_unix_ns() -> u64 {
    throng_host::sample::now_ns()
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A 4-byte client mask. RFC 6455 wants it unpredictable to intermediaries;
/// fastrand is enough for a load generator that is not a browser.
fn mask() -> [u8; 4] {
    fastrand::u32(..).to_ne_bytes()
}

/// State shared by every task of the worker (single-threaded: `Rc`, `Cell`).
struct Ctx {
    plan: WorkerPlan,
    rec: RefCell<HoldRecorder>,
    /// The one read buffer of the worker. Borrowed only between awaits.
    scratch: RefCell<Box<[u8]>>,
    /// Decrypted bytes of one TLS read, reused by every connection.
    plain: RefCell<Vec<u8>>,
    /// The TLS client of `wss://` runs.
    tls: Option<TlsClient>,
    /// Set once, when the run ends; connections check it before waiting.
    stopping: Cell<bool>,
    /// Wakes every idle connection when `stopping` is set.
    stop: Notify,
    /// The last sequence number published, from the `stop` line (0: unknown).
    final_seq: Cell<u64>,
    /// When the first message was published (0: not yet).
    first_publish_ns: Cell<u64>,
    /// Connection tasks still running plus connections held.
    live: Cell<u64>,
    /// Connections being opened, plus 1 while the schedule still runs.
    opening: Cell<u64>,
    /// The start of the next interval to emit (0 before the first).
    next_start: Cell<u64>,
    /// The readiness loop holding upgraded connections.
    holder: Holder,
    /// Wakes the main task when `live` drops to zero.
    idle: Notify,
    /// One log line per error kind, so a failing run does not flood stdout.
    logged: Cell<u32>,
    /// What the first TLS handshake negotiated was logged.
    tls_noted: Cell<bool>,
    out: RefCell<Box<dyn Write>>,
}

impl Ctx {
    fn emit(&self, line: &str) {
        let mut out = self.out.borrow_mut();
        // A supervisor that went away will also close our stdin, which stops
        // the run; nothing more to do about a failed write here.
        let _ = out
            .write_all(line.as_bytes())
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
    }

    fn event(&self, kind: &str, text: String) {
        let ev = Event {
            at_ns: now_unix_ns(),
            source: self.plan.label.clone(),
            kind: kind.to_owned(),
            text,
        };
        self.emit(&encode_event(&ev));
    }

    fn fail(&self, kind: ConnectError, detail: impl FnOnce() -> String) {
        self.rec.borrow_mut().failed(kind);
        let bit = 1u32 << kind.index();
        if self.logged.get() & bit == 0 {
            self.logged.set(self.logged.get() | bit);
            self.event(
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
            release_free_memory();
            self.event(
                "worker.ramp_done",
                format!("{} connections attempted", self.plan.share()),
            );
        }
    }

    fn task_done(&self) {
        let left = self.live.get() - 1;
        self.live.set(left);
        if left == 0 {
            self.idle.notify_one();
        }
    }
}

/// Runs a worker: reads its plan from `control`, runs it, writes records to
/// `out`. Returns when every connection has closed.
pub fn run_worker(
    mut control: impl BufRead + Send + 'static,
    out: Box<dyn Write>,
) -> io::Result<()> {
    let mut first = String::new();
    control.read_line(&mut first)?;
    let plan: WorkerPlan = serde_json::from_str(&first).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad worker plan on stdin: {e}"),
        )
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, worker(plan, control, out))
}

enum Control {
    Publishing(u64),
    Stop(u64),
}

async fn worker(
    plan: WorkerPlan,
    control: impl BufRead + Send + 'static,
    out: Box<dyn Write>,
) -> io::Result<()> {
    let pacer = Pacer::for_count(plan.rate, plan.connections)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let settings = plan.settings;
    let rec = HoldRecorder::new(plan.label.clone(), settings.interval_ns, plan.share());
    let tls = match (&plan.tls, plan.target.tls) {
        (Some(opts), true) => Some(
            TlsClient::new(opts)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?,
        ),
        (None, true) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a wss:// target needs TLS options in the worker plan",
            ));
        }
        (_, false) => None,
    };
    let ctx = Rc::new(Ctx {
        plain: RefCell::new(Vec::new()),
        tls,
        rec: RefCell::new(rec),
        scratch: RefCell::new(vec![0u8; settings.scratch.max(4096)].into_boxed_slice()),
        stopping: Cell::new(false),
        stop: Notify::new(),
        final_seq: Cell::new(0),
        first_publish_ns: Cell::new(0),
        live: Cell::new(1), // the opener itself, so `idle` waits for the schedule to end
        opening: Cell::new(1),
        next_start: Cell::new(0),
        idle: Notify::new(),
        logged: Cell::new(0),
        tls_noted: Cell::new(false),
        holder: Holder::new()?,
        out: RefCell::new(out),
        plan,
    });

    // Control lines arrive on a blocking stdin; read them on a thread.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut control = control;
        let mut line = String::new();
        loop {
            line.clear();
            match control.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(Control::Stop(0));
                    return;
                }
                Ok(_) => {}
            }
            let mut words = line.split_whitespace();
            let cmd = words.next();
            let arg = words
                .next()
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(0);
            let msg = match cmd {
                Some("publishing") => Control::Publishing(arg),
                Some("stop") => Control::Stop(arg),
                _ => continue,
            };
            if tx.send(msg).is_err() {
                return;
            }
        }
    });
    let control_ctx = ctx.clone();
    tokio::task::spawn_local(async move {
        while let Some(msg) = rx.recv().await {
            match msg {
                Control::Publishing(ns) => control_ctx.first_publish_ns.set(ns),
                Control::Stop(seq) => {
                    if !control_ctx.stopping.get() {
                        control_ctx.final_seq.set(seq);
                        control_ctx.stopping.set(true);
                        control_ctx.stop.notify_waiters();
                        control_ctx.holder.close_all(&control_ctx);
                        let wait =
                            Duration::from_millis(control_ctx.plan.settings.close_timeout_ms);
                        let expire_ctx = control_ctx.clone();
                        tokio::task::spawn_local(async move {
                            tokio::time::sleep(wait).await;
                            expire_ctx.holder.expire(&expire_ctx);
                        });
                    }
                }
            }
        }
    });

    // Align the schedule on the supervisor's wall-clock start.
    let now_ns = now_unix_ns();
    let now = Instant::now();
    let start = if ctx.plan.start_unix_ns >= now_ns {
        now + Duration::from_nanos(ctx.plan.start_unix_ns - now_ns)
    } else {
        now.checked_sub(Duration::from_nanos(now_ns - ctx.plan.start_unix_ns))
            .unwrap_or(now)
    };

    tokio::task::spawn_local(open_all(ctx.clone(), pacer, start));
    let ticker = tokio::task::spawn_local(tick(ctx.clone()));
    let loop_ctx = ctx.clone();
    let holder = tokio::task::spawn_local(async move { loop_ctx.holder.run(&loop_ctx).await });

    while ctx.live.get() > 0 {
        ctx.idle.notified().await;
    }
    ticker.abort();
    holder.abort();
    let length = settings.interval_ns.max(1);
    // The ticker's clock (monotonic) and the wall clock may disagree by a
    // little: never label the last interval with a start already sent.
    let start_ns = (now_unix_ns() / length * length).max(ctx.next_start.get());
    let iv = ctx.rec.borrow_mut().take(start_ns);
    ctx.emit(&encode_interval(&iv));
    ctx.event(
        "worker.done",
        format!("{} connections attempted", ctx.plan.share()),
    );
    Ok(())
}

/// Emits one interval per wall-clock second (aligned).
async fn tick(ctx: Rc<Ctx>) {
    let length = ctx.plan.settings.interval_ns.max(1);
    let mut last_end = ctx.next_start.get();
    loop {
        let now = now_unix_ns();
        let end = ((now / length + 1) * length).max(last_end + length);
        tokio::time::sleep(Duration::from_nanos(end.saturating_sub(now))).await;
        last_end = end;
        ctx.next_start.set(end);
        let iv: Interval = ctx.rec.borrow_mut().take(end - length);
        ctx.emit(&encode_interval(&iv));
    }
}

/// Starts this worker's connections on the schedule.
async fn open_all(ctx: Rc<Ctx>, pacer: Pacer, start: Instant) {
    let step = u64::from(ctx.plan.workers.max(1));
    let mut i = u64::from(ctx.plan.index);
    while i < ctx.plan.connections && !ctx.stopping.get() {
        let intended = start + pacer.intended(i);
        let now = Instant::now();
        if intended > now {
            let stop = ctx.stop.notified();
            tokio::select! {
                biased;
                () = stop => break,
                () = tokio::time::sleep_until(intended.into()) => {}
            }
            continue;
        }
        ctx.rec.borrow_mut().started(us(now - intended));
        ctx.live.set(ctx.live.get() + 1);
        ctx.opening.set(ctx.opening.get() + 1);
        tokio::task::spawn_local(connection(ctx.clone(), i, intended));
        i += step;
    }
    ctx.opening_done();
    ctx.task_done();
}

/// One connection from first SYN to last close.
async fn connection(ctx: Rc<Ctx>, i: u64, intended: Instant) {
    let started = Instant::now();
    let plan = &ctx.plan;
    let (_, s, p) = assign(
        i,
        plan.workers,
        plan.sources.len(),
        plan.target.port_count(),
    );
    let source = plan.sources.get(s).copied();
    let port = plan.target.port(p);
    let opened = if ctx.stopping.get() {
        None
    } else {
        let stop = ctx.stop.notified();
        tokio::select! {
            biased;
            () = stop => None,
            r = open(&ctx, source, port) => Some(r),
        }
    };
    match opened {
        Some(Ok(open)) => {
            let now = Instant::now();
            let mut rec = ctx.rec.borrow_mut();
            rec.opened(us(now - intended), us(now - started));
            rec.phases(open.tcp_us, open.tls_us, open.upgrade_us);
            if let Some(resumed) = open.resumed {
                rec.tls_handshake(resumed);
            }
            drop(rec);
            ctx.holder.adopt(&ctx, open.stream, open.records, open.rest);
        }
        Some(Err((kind, detail))) => ctx.fail(kind, || detail),
        None => ctx.rec.borrow_mut().abandoned(),
    }
    ctx.opening_done();
    ctx.task_done();
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
    tcp_us: u64,
    tls_us: Option<u64>,
    upgrade_us: u64,
}

/// TCP connect from `source`, the TLS handshake (`wss://`) and the
/// WebSocket upgrade.
async fn open(ctx: &Ctx, source: Option<IpAddr>, port: u16) -> Result<Opened, OpenError> {
    let began = Instant::now();
    let settings = &ctx.plan.settings;
    let addr = SocketAddr::new(ctx.plan.target.ip, port);
    let io_err =
        |what: &str, e: io::Error| (ConnectError::from_io(&e), format!("{what} {addr}: {e}"));
    let socket = new_socket(source, addr).map_err(|e| io_err("socket/bind for", e))?;
    let connect = tokio::time::timeout(
        Duration::from_millis(settings.connect_timeout_ms),
        socket.connect(addr),
    );
    let mut stream = match connect.await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(io_err("connect to", e)),
        Err(_) => {
            return Err((
                ConnectError::Timeout,
                format!(
                    "connect to {addr}: no answer in {} ms",
                    settings.connect_timeout_ms
                ),
            ));
        }
    };
    let connected = Instant::now();
    let timeout = Duration::from_millis(settings.handshake_timeout_ms);
    let mut plain = Vec::new();
    let session = match &ctx.tls {
        None => None,
        Some(client) => {
            let mut session = client
                .session(&ctx.plan.target.host)
                .map_err(|e| (ConnectError::Other, e.to_string()))?;
            let handshake = tls::handshake(&stream, &ctx.scratch, &mut session, &mut plain);
            match tokio::time::timeout(timeout, handshake).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err((
                        ConnectError::from_tls(&e),
                        format!("TLS handshake with {addr}: {e}"),
                    ));
                }
                Err(_) => {
                    return Err((
                        ConnectError::Timeout,
                        format!(
                            "TLS handshake with {addr}: not done in {} ms",
                            settings.handshake_timeout_ms
                        ),
                    ));
                }
            }
            if !ctx.tls_noted.replace(true) {
                ctx.event("tls.negotiated", session.describe());
            }
            Some(Box::new(session))
        }
    };
    let secured = Instant::now();
    let mut session = session;
    let handshake = tokio::time::timeout(
        timeout,
        upgrade(
            &mut stream,
            &ctx.scratch,
            session.as_deref_mut(),
            plain,
            &ctx.plan.target,
            port,
            settings.max_head,
        ),
    );
    match handshake.await {
        Ok(Ok(rest)) => {
            let done = Instant::now();
            let resumed = session.as_ref().map(|s| s.resumed());
            // Out of rustls: only the keys stay (see `tls::records`).
            let records = match session {
                None => None,
                Some(s) => Some(Box::new(s.into_records().map_err(|e| {
                    (
                        ConnectError::from_tls(&e),
                        format!("taking over the TLS connection to {addr}: {e}"),
                    )
                })?)),
            };
            Ok(Opened {
                stream,
                tls_us: resumed.map(|_| us(secured - connected)),
                records,
                resumed,
                rest,
                tcp_us: us(connected - began),
                upgrade_us: us(done - secured),
            })
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err((
            ConnectError::Timeout,
            format!(
                "upgrade at {addr}: no 101 response in {} ms",
                settings.handshake_timeout_ms
            ),
        )),
    }
}

/// A non-blocking TCP socket bound to `source` with `IP_BIND_ADDRESS_NO_PORT`,
/// so the local port is chosen at connect time per destination and one
/// source address carries a full port range to every target port.
fn new_socket(source: Option<IpAddr>, dst: SocketAddr) -> io::Result<TcpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if dst.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let socket = Socket::new(
        domain,
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    if let Some(src) = source {
        if src.is_ipv4() {
            set_bind_no_port(&socket)?;
        }
        socket.bind(&SocketAddr::new(src, 0).into())?;
    }
    socket.set_nodelay(true)?;
    Ok(TcpSocket::from_std_stream(socket.into()))
}

fn set_bind_no_port(socket: &socket2::Socket) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let one: libc::c_int = 1;
    // SAFETY: the fd is a valid socket owned by `socket` for the duration of
    // the call; the option value is a c_int that outlives the call and its
    // size is passed exactly.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The WebSocket upgrade (through `session` for `wss://`); `plain` holds
/// any bytes that already arrived. Returns the bytes after the response head.
async fn upgrade(
    stream: &mut TcpStream,
    scratch: &RefCell<Box<[u8]>>,
    mut session: Option<&mut Session>,
    plain: Vec<u8>,
    target: &WsTarget,
    port: u16,
    max_head: usize,
) -> Result<Vec<u8>, OpenError> {
    let key = ws::client_key(fastrand::u128(..).to_ne_bytes());
    let mut buf = Vec::with_capacity(256);
    ws::write_upgrade_request(&mut buf, &target.host_header(port), &target.path, &key);
    let io_err = |e: io::Error| (ConnectError::from_io(&e), format!("upgrade: {e}"));
    let tls_err = |e: tls::TlsError| {
        (
            ConnectError::from_tls(&e),
            format!("upgrade (over TLS): {e}"),
        )
    };
    let closed = || {
        (
            ConnectError::Reset,
            "upgrade: the server closed the connection before answering".to_owned(),
        )
    };
    let mut wire = Vec::new();
    match session.as_deref_mut() {
        Some(s) => {
            s.send(&buf, &mut wire).map_err(tls_err)?;
            tls::write_all(stream, &wire).await.map_err(io_err)?;
            wire.clear();
        }
        None => stream.write_all(&buf).await.map_err(io_err)?,
    }
    buf = plain;
    let mut first = !buf.is_empty();
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
            if phase == Phase::PeerClosed {
                return Err(closed());
            }
            if buf.len() > 2 * max_head {
                return Err((
                    ConnectError::BadHandshake,
                    format!("upgrade: no response head in the first {max_head} bytes"),
                ));
            }
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
        match http::parse_response(&buf, max_head) {
            Ok(None) => continue,
            Ok(Some((resp, n))) => {
                return match ws::client_verify(&resp, &key) {
                    Ok(()) => Ok(buf.split_off(n)),
                    Err(ws::HandshakeError::NotSwitching(status)) => Err((
                        ConnectError::BadStatus,
                        format!("upgrade: server answered {status} {}", resp.reason),
                    )),
                    Err(e) => Err((ConnectError::BadHandshake, format!("upgrade: {e}"))),
                };
            }
            Err(e) => return Err((ConnectError::BadHandshake, format!("upgrade: {e}"))),
        }
    }
}

/// Checks one message's sequence number and records its delivery latency.
fn on_message(ctx: &Ctx, last_seq: &mut u64, opened_ns: u64, payload: &[u8], now_ns: u64) {
    let mut rec = ctx.rec.borrow_mut();
    let Some((seq, sent_ns)) = message::decode(payload) else {
        rec.foreign();
        return;
    };
    rec.delivered(now_ns.saturating_sub(sent_ns) / 1000);
    let last = *last_seq;
    if last == 0 {
        // The first message: a connection that was open before publishing
        // began should have received every message from seq 1.
        let first_publish = ctx.first_publish_ns.get();
        if first_publish != 0 && opened_ns < first_publish && seq > 1 {
            rec.lost(seq - 1);
        }
        *last_seq = seq;
    } else if seq > last {
        if seq > last + 1 {
            rec.lost(seq - last - 1);
        }
        *last_seq = seq;
    } else if seq == last {
        rec.duplicated();
    } else {
        rec.out_of_order();
    }
}
