//! A worker: one process, one single-threaded tokio runtime, its own
//! listeners (`SO_REUSEPORT`), subscribers and channel table. Nothing here is
//! shared between threads or locked: state is `Rc` and `Cell`/`RefCell`.
//!
//! The worker talks to its supervisor over the Unix socket it was given as
//! stdin: it receives its settings and every published message, and sends
//! publish requests, per-message subscriber counts and its counters.

mod conn;
mod http;
mod table;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use throng_proto::ws::{self, OpCode, close_code};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::config::Config;
use crate::control::{Message, Record, read_record};
use crate::metrics::{CloseReason, Counters};
use crate::redis::RedisMode;
use crate::tls;
use crate::wheel::{self, Sweep};
use conn::Conn;
use table::{Channels, Slab};
use throng_host::poll::{Events, Interest, Poller};
use throng_host::process;
use throng_host::timer::Timer;

/// Why a worker could not start or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// Stdin is not the supervisor's control socket.
    #[error(
        "worker: stdin is not a control socket ({0}); workers are started by 'throng serve', not by hand"
    )]
    NoControl(std::io::Error),
    /// The control socket closed or carried garbage before the settings arrived.
    #[error("worker: no settings from the supervisor: {0}")]
    NoConfig(String),
    /// The TLS settings from the supervisor were refused (cannot happen
    /// when the supervisor checked them; kept for a clear message).
    #[error("worker {index}: {source}")]
    Tls {
        /// Worker index.
        index: usize,
        /// Why.
        source: tls::TlsError,
    },
    /// A listener could not be opened.
    #[error("worker {index}: cannot listen on {addr}: {source}")]
    Listen {
        /// Worker index.
        index: usize,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The runtime could not start.
    #[error("worker: {0}")]
    Io(#[from] std::io::Error),
}

/// The Redis broker's state as the supervisor last described it.
pub(crate) struct BrokerState {
    pub(crate) up: bool,
    /// How long it had been down when the supervisor said so.
    pub(crate) down: Duration,
    pub(crate) text: String,
}

/// Size of the one read buffer per worker. Clients only send control
/// frames, so this is far more than one read ever needs.
const SCRATCH: usize = 64 * 1024;

/// Everything one worker owns.
pub(crate) struct Worker {
    pub(crate) cfg: Config,
    pub(crate) index: usize,
    pub(crate) counters: Counters,
    pub(crate) conns: RefCell<Slab>,
    pub(crate) channels: RefCell<Channels>,
    /// The one read buffer: every subscriber reads into it, in turn.
    pub(crate) scratch: RefCell<Box<[u8]>>,
    /// TLS subscribers: what the records just read decrypt to.
    pub(crate) tls_plain: RefCell<Vec<u8>>,
    /// TLS subscribers: one frame (or control record) encrypted for one
    /// connection, written from here.
    pub(crate) tls_out: RefCell<Vec<u8>>,
    /// Ticks of [`wheel::TICK`] since the worker started.
    pub(crate) now: Cell<u32>,
    /// Subscriber sockets' readiness (one epoll for all of them).
    pub(crate) poller: Poller,
    /// Subscribers that have a write queue (checked each tick for `--write-timeout`).
    pub(crate) queued: RefCell<Vec<Rc<Conn>>>,
    /// Connections in a closing handshake, with the tick it started.
    pub(crate) closing: RefCell<Vec<(Rc<Conn>, u32)>>,
    pub(crate) draining: Cell<bool>,
    ctl: mpsc::UnboundedSender<Bytes>,
    next_request: Cell<u64>,
    pending_publish: RefCell<HashMap<u64, oneshot::Sender<Result<u64, String>>>>,
    /// The broker's last state from the supervisor (Redis only), and when it came.
    pub(crate) broker: RefCell<Option<(BrokerState, Instant)>>,
    pending_metrics: RefCell<HashMap<u64, oneshot::Sender<Bytes>>>,
    ping: Bytes,
}

/// Runs a worker whose control socket is stdin (as the supervisor starts
/// it). Returns when the worker has drained after a signal or when the
/// supervisor is gone.
pub fn run_from_stdin(index: usize) -> Result<(), WorkerError> {
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(WorkerError::NoControl)?;
    let ctl = std::os::unix::net::UnixStream::from(fd);
    ctl.set_nonblocking(true).map_err(WorkerError::NoControl)?;
    // Rust routes fd 0 to its stdin object: make sure nothing reads it there.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let ctl = UnixStream::from_std(ctl).map_err(WorkerError::NoControl)?;
        main(index, ctl).await
    })
}

async fn main(index: usize, ctl: UnixStream) -> Result<(), WorkerError> {
    let (mut rd, mut wr) = ctl.into_split();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let cfg: Config = match read_record(&mut rd, &mut buf).await {
        Ok(Some(Record::Config(json))) => {
            serde_json::from_slice(&json).map_err(|e| WorkerError::NoConfig(e.to_string()))?
        }
        Ok(other) => return Err(WorkerError::NoConfig(format!("unexpected {other:?}"))),
        Err(e) => return Err(WorkerError::NoConfig(e.to_string())),
    };
    let tls = match &cfg.tls {
        Some(m) if !cfg.tls_listen.is_empty() => {
            Some(tls::server_config(m).map_err(|source| WorkerError::Tls { index, source })?)
        }
        _ => None,
    };
    let mut listeners = Vec::new();
    let plain = cfg.listen.iter().map(|a| (*a, None));
    let secure = cfg.tls_listen.iter().map(|a| (*a, tls.clone()));
    for (addr, tls) in plain.chain(secure) {
        let l = listen(addr).map_err(|source| WorkerError::Listen {
            index,
            addr,
            source,
        })?;
        listeners.push((l, tls));
    }

    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    tokio::task::spawn_local(async move {
        while let Some(rec) = rx.recv().await {
            if wr.write_all(&rec).await.is_err() {
                break;
            }
        }
    });
    let w = Rc::new(Worker {
        index,
        counters: Counters::default(),
        conns: RefCell::default(),
        channels: RefCell::default(),
        scratch: RefCell::new(vec![0; SCRATCH].into_boxed_slice()),
        tls_plain: RefCell::default(),
        tls_out: RefCell::default(),
        now: Cell::new(0),
        poller: Poller::new()?,
        queued: RefCell::default(),
        closing: RefCell::default(),
        draining: Cell::new(false),
        ctl: tx,
        next_request: Cell::new(1),
        pending_publish: RefCell::default(),
        broker: RefCell::default(),
        pending_metrics: RefCell::default(),
        ping: ws::server_frame(OpCode::Ping, b""),
        cfg,
    });
    let accepts: Vec<AbortHandle> = listeners
        .into_iter()
        .map(|(l, tls)| tokio::task::spawn_local(accept_loop(w.clone(), l, tls)).abort_handle())
        .collect();
    let ticker = tokio::task::spawn_local(tick_loop(w.clone())).abort_handle();
    let reactor = tokio::task::spawn_local(reactor(w.clone())).abort_handle();
    w.send_snapshot();

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        tokio::select! {
            rec = read_record(&mut rd, &mut buf) => match rec {
                Ok(Some(rec)) => w.on_record(rec),
                Ok(None) | Err(_) => {
                    log!("throng: worker {index}: supervisor is gone; draining");
                    break;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    for a in accepts {
        a.abort();
    }
    w.drain(&mut rd, &mut buf).await;
    ticker.abort();
    reactor.abort();
    Ok(())
}

/// A listener in the worker's `SO_REUSEPORT` group for `addr`.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let domain = if addr.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    // The kernel caps this at net.core.somaxconn.
    s.listen(65_535)?;
    TcpListener::from_std(s.into())
}

/// Accepts connections on `l`; with `tls`, each starts with a TLS handshake.
async fn accept_loop(w: Rc<Worker>, l: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) {
    let mut last_report: Option<Instant> = None;
    loop {
        match l.accept().await {
            Ok((stream, _)) => {
                crate::metrics::inc(&w.counters.accepted);
                let _ = stream.set_nodelay(true);
                match &tls {
                    Some(cfg) => {
                        tokio::task::spawn_local(http::serve_tls(w.clone(), stream, cfg.clone()));
                    }
                    None => {
                        tokio::task::spawn_local(http::serve(
                            w.clone(),
                            tls::stream::Io::Plain(stream),
                        ));
                    }
                }
            }
            Err(e) => {
                // EMFILE and friends: say so, and back off instead of spinning.
                w.counters.handshake_failed("accept_error");
                if last_report.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                    last_report = Some(Instant::now());
                    let hint = if e.raw_os_error() == Some(libc::EMFILE) {
                        " (open-file limit reached: run more workers, see --max-connections)"
                    } else {
                        ""
                    };
                    log!("throng: worker {}: accept: {e}{hint}", w.index);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Hands subscriber readiness from the worker's epoll to the connections.
async fn reactor(w: Rc<Worker>) {
    let mut events = Events::with_capacity(256);
    loop {
        if let Err(e) = w.poller.wait(&mut events).await {
            log!("throng: worker {}: epoll: {e}", w.index);
            return;
        }
        for ev in events.iter() {
            let slot = usize::try_from(ev.token).unwrap_or(usize::MAX);
            let Some(c) = w.conns.borrow().get(slot).cloned() else {
                continue;
            };
            if ev.writable {
                w.on_writable(&c);
            }
            if ev.readable {
                w.on_readable(&c, true);
            }
        }
    }
}

/// The worker's one timer: advances the clock, walks a slice of the
/// connection table (ping, idle check), ends overdue closing handshakes,
/// and reports counters to the supervisor.
async fn tick_loop(w: Rc<Worker>) {
    let mut sweep = Sweep::new(w.cfg.ping_interval);
    let idle = wheel::ticks(w.cfg.idle_timeout);
    let every = match Timer::new().and_then(|t| t.start_ticking(wheel::TICK).map(|()| t)) {
        Ok(t) => t,
        Err(e) => {
            log!("throng: worker {}: cannot start its clock: {e}", w.index);
            return;
        }
    };
    let snapshot_every = wheel::ticks(Duration::from_millis(500));
    let grace = wheel::ticks(conn::CLOSE_GRACE);
    let write_limit = wheel::ticks(w.cfg.write_timeout);
    loop {
        // Missed ticks are not made up: the clock counts sweeps, and a
        // connection's deadlines stretch with a busy worker, never shrink.
        if let Err(e) = every.tick().await {
            log!("throng: worker {}: clock: {e}", w.index);
            return;
        }
        let now = w.now.get().wrapping_add(1);
        w.now.set(now);
        if w.draining.get() {
            continue;
        }
        let mut idle_out = Vec::new();
        let mut slow = Vec::new();
        {
            let conns = w.conns.borrow();
            for slot in sweep.step(conns.capacity()) {
                let Some(c) = conns.get(slot) else { continue };
                if !c.is_open() {
                    continue;
                }
                if wheel::expired(now, c.last_seen.get(), idle) {
                    idle_out.push(c.clone());
                } else {
                    match w.send(c, &w.ping) {
                        Ok(()) => crate::metrics::inc(&w.counters.pings),
                        Err(e) => slow.push((c.clone(), e)),
                    }
                }
            }
        }
        for c in idle_out {
            w.close(
                &c,
                close_code::POLICY,
                "idle timeout",
                CloseReason::IdleTimeout,
            );
        }
        for (c, e) in slow {
            if e == conn::SendError::QueueFull {
                w.close_slow(&c, "queue");
            } else {
                w.lost(&c);
            }
        }
        let overdue: Vec<Rc<Conn>> = {
            let mut closing = w.closing.borrow_mut();
            let mut out = Vec::new();
            closing.retain(|(c, since)| {
                if c.state.get() == conn::State::Gone || c.slot.get() == table::NONE {
                    return false;
                }
                if wheel::expired(now, *since, grace) {
                    out.push(c.clone());
                    return false;
                }
                true
            });
            out
        };
        for c in overdue {
            w.finish(&c);
        }
        let late: Vec<Rc<Conn>> = {
            let mut queued = w.queued.borrow_mut();
            let mut late = Vec::new();
            queued.retain(|c| match c.queued_since() {
                Some(since) if c.state.get() != conn::State::Gone => {
                    if wheel::expired(now, since, write_limit) {
                        late.push(c.clone());
                        return false;
                    }
                    true
                }
                _ => {
                    c.listed.set(false);
                    false
                }
            });
            late
        };
        for c in late {
            c.listed.set(false);
            w.close_slow(&c, "timeout");
        }
        if now % snapshot_every == 0 {
            w.send_snapshot();
        }
    }
}

impl Worker {
    fn on_record(self: &Rc<Self>, rec: Record) {
        match rec {
            Record::Deliver(m) => {
                let n = if self.draining.get() {
                    0
                } else {
                    self.fanout(&m)
                };
                let _ = self.ctl.send(
                    Record::Delivered {
                        id: m.id,
                        subscribers: n,
                    }
                    .encode(),
                );
            }
            Record::Published { id, subscribers } => {
                if let Some(tx) = self.pending_publish.borrow_mut().remove(&id) {
                    let _ = tx.send(Ok(subscribers));
                }
            }
            Record::PublishFailed { id, reason } => {
                if let Some(tx) = self.pending_publish.borrow_mut().remove(&id) {
                    let _ = tx.send(Err(String::from_utf8_lossy(&reason).into_owned()));
                }
            }
            Record::Broker { up, down_ms, text } => {
                let state = BrokerState {
                    up,
                    down: Duration::from_millis(down_ms),
                    text: String::from_utf8_lossy(&text).into_owned(),
                };
                *self.broker.borrow_mut() = Some((state, Instant::now()));
            }
            Record::Metrics { id, text } => {
                if let Some(tx) = self.pending_metrics.borrow_mut().remove(&id) {
                    let _ = tx.send(text);
                }
            }
            other => log!(
                "throng: worker {}: unexpected control record {other:?}",
                self.index
            ),
        }
    }

    /// Writes one message to every subscriber of its channel here: encoded
    /// once, then one `try_write` per subscriber; only a subscriber whose
    /// socket is full gets a queue. Returns the number of subscribers.
    fn fanout(self: &Rc<Self>, m: &Message) -> u64 {
        let start = Instant::now();
        let cpu = process::thread_cpu();
        let frame = ws::server_frame(
            if m.text { OpCode::Text } else { OpCode::Binary },
            &m.payload,
        );
        let mut behind = Vec::new();
        let n = {
            let channels = self.channels.borrow();
            let Some(ch) = channels.get(&m.channel) else {
                return 0;
            };
            let mut delivered = 0u64;
            for c in &ch.subs {
                match self.send(c, &frame) {
                    Ok(()) => delivered += 1,
                    Err(e) => behind.push((c.clone(), e)),
                }
            }
            self.counters
                .frames_delivered
                .set(self.counters.frames_delivered.get() + delivered);
            ch.subs.len() as u64
        };
        self.counters
            .frames_dropped
            .set(self.counters.frames_dropped.get() + behind.len() as u64);
        for (c, e) in behind {
            match e {
                conn::SendError::QueueFull => self.close_slow(&c, "queue"),
                conn::SendError::Broken | conn::SendError::Closed => self.lost(&c),
            }
        }
        self.counters
            .fanout(start.elapsed(), process::thread_cpu().saturating_sub(cpu));
        n
    }

    /// Asks the supervisor to relay a message; resolves to the number of
    /// subscribers it reached over all workers (with Redis: the receivers
    /// Redis counted), or why it could not be published (`None`: supervisor gone).
    pub(crate) async fn publish(
        &self,
        channel: &str,
        text: bool,
        payload: Bytes,
    ) -> Option<Result<u64, String>> {
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        let (tx, rx) = oneshot::channel();
        self.pending_publish.borrow_mut().insert(id, tx);
        let rec = Record::Publish(Message {
            id,
            text,
            channel: channel.to_owned(),
            payload,
        });
        if self.ctl.send(rec.encode()).is_err() {
            self.pending_publish.borrow_mut().remove(&id);
            return None;
        }
        rx.await.ok()
    }

    /// Asks the supervisor for the Prometheus text of all workers.
    pub(crate) async fn metrics(&self) -> Option<Bytes> {
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        let (tx, rx) = oneshot::channel();
        self.pending_metrics.borrow_mut().insert(id, tx);
        self.send_snapshot();
        if self
            .ctl
            .send(Record::MetricsRequest { id }.encode())
            .is_err()
        {
            self.pending_metrics.borrow_mut().remove(&id);
            return None;
        }
        match tokio::time::timeout(Duration::from_secs(5), rx).await {
            Ok(Ok(text)) => Some(text),
            _ => {
                self.pending_metrics.borrow_mut().remove(&id);
                None
            }
        }
    }

    fn send_snapshot(&self) {
        let snap = self
            .counters
            .snapshot(self.index, std::process::id(), process::rss_bytes());
        if let Ok(json) = serde_json::to_vec(&snap) {
            let _ = self.ctl.send(Record::Snapshot(Bytes::from(json)).encode());
        }
    }

    /// Takes a subscriber out of its channel; in Redis channels mode, tells
    /// the supervisor when that was the channel's last subscriber here.
    pub(crate) fn unsubscribe(&self, c: &Conn) {
        let gone = self.channels.borrow_mut().unsubscribe(c);
        if let Some(name) = gone {
            self.interest(&name, false);
        }
    }

    /// Redis channels mode: the supervisor subscribes this node to a channel
    /// while some worker has subscribers of it.
    fn interest(&self, channel: &str, subscribed: bool) {
        if self.cfg.redis_mode == Some(RedisMode::Channels) {
            let rec = Record::Interest {
                channel: channel.to_owned(),
                subscribed,
            };
            let _ = self.ctl.send(rec.encode());
        }
    }

    /// Registers an upgraded connection: into the tables and the epoll.
    pub(crate) fn subscribe(&self, channel: &str, c: Conn) {
        let c = Rc::new(c);
        self.conns.borrow_mut().insert(&c);
        if let Err(e) = self
            .poller
            .add(c.socket(), u64::from(c.slot.get()), Interest::Read)
        {
            self.conns.borrow_mut().remove(&c);
            self.counters.handshake_failed("epoll");
            log!(
                "throng: worker {}: cannot watch a subscriber: {e}",
                self.index
            );
            return;
        }
        if self.channels.borrow_mut().subscribe(channel, &c) {
            self.interest(channel, true);
        }
        self.counters.open.set(self.counters.open.get() + 1);
        crate::metrics::inc(&self.counters.upgraded);
        if c.has_rest() {
            // Frames that came in the same packet as the upgrade request.
            self.on_readable(&c, false);
        }
    }

    /// Sends 1001 to every subscriber and waits until they are gone (or the
    /// drain timeout), answering control records meanwhile.
    async fn drain(self: &Rc<Self>, rd: &mut tokio::net::unix::OwnedReadHalf, buf: &mut BytesMut) {
        self.draining.set(true);
        let all = self.conns.borrow().all();
        let n = all.len();
        for c in &all {
            self.close(
                c,
                close_code::GOING_AWAY,
                "server shutting down",
                CloseReason::Shutdown,
            );
        }
        drop(all);
        let deadline = tokio::time::Instant::now() + self.cfg.drain_timeout;
        let mut ctl_open = true;
        loop {
            if self.conns.borrow().len() == 0 && self.counters.queued.get() == 0 {
                break;
            }
            let wait = tokio::time::sleep(Duration::from_millis(20));
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = wait => {},
                rec = read_record(rd, buf), if ctl_open => match rec {
                    Ok(Some(rec)) => self.on_record(rec),
                    _ => ctl_open = false,
                },
            }
        }
        let left = self.conns.borrow().len();
        log!(
            "throng: worker {}: drained {} of {n} subscribers",
            self.index,
            n - left
        );
        self.send_snapshot();
        // Give the writer task a moment to hand the last records over.
        tokio::task::yield_now().await;
    }
}
