//! A worker: one process, one single-threaded tokio runtime, its own
//! listeners (`SO_REUSEPORT`), subscribers and channel table. Nothing here is
//! shared between threads or locked: state is `Rc` and `Cell`/`RefCell`.
//!
//! The worker talks to its supervisor over the Unix socket it was given as
//! stdin: it receives its settings and every published message, and sends
//! publish requests, per-message subscriber counts and its counters.
//!
//! Its tasks: the control loop (this module), one accept loop per listener
//! handing each connection to `http` (and its `routes`), the reactor
//! over the epoll set of subscribers, the fan-out of published messages
//! (after their count went back to the supervisor), the sleepers (`/ping`
//! connections waiting outside their task), and the tick. Every subscriber is in
//! `subscribers` (`conn`: one connection's life; `table`: slots and
//! channels); `state` is what the tasks share, `supervisor_link` the
//! control socket as the tasks and routes use it.

mod api;
mod conn;
mod gate;
mod http;
mod mqtt;
mod mqtt_accept;
mod mqtt_auth;
mod mqtt_ids;
mod mqtt_qos;
mod mqtt_retain;
mod mqtt_session;
mod mqtt_share;
mod mqtt_ws;
mod multi;
#[cfg(test)]
mod pair;
mod ping_answer;
mod recurring;
mod rejoin;
mod routes;
mod sleepers;
mod state;
mod subscribers;
mod supervisor_link;
mod table;
mod trim;

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use throng_host::poll::{Events, Poller};
use throng_host::shared::SharedCounters;
use throng_host::timer::Timer;
use throng_proto::ws::close_code;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;

use crate::auth::{PublishKey, Verifier};
use crate::config::Config;
use crate::control::{Record, read_record};
use crate::metrics::{CloseReason, Counters};
use crate::redis::RedisMode;
use crate::reuseport;
use crate::tls::{self, park};
use crate::wheel::{self, TICK};
use park::Parked;
use recurring::Recurring;
use state::{Around, Counted, Outgoing, Reloadable, Serves, Worker};
use subscribers::{Limits, Subscribers};
use supervisor_link::SupervisorLink;

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
    NoConfig(NoSettings),
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

/// Why the supervisor's first record did not give a worker its settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NoSettings {
    /// The settings record did not read as settings.
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// Another record came first (or none: the socket closed).
    #[error("unexpected {0:?}")]
    Unexpected(Option<Box<Record>>),
    /// The control socket failed or carried garbage.
    #[error("{0}")]
    Control(#[source] crate::control::ControlError),
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
    let cfg = settings(&mut rd, &mut buf).await?;
    let (listeners, mqtt_listeners) = open_listeners(index, &cfg)?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    tokio::task::spawn_local(async move {
        while let Some(rec) = rx.recv().await {
            if wr.write_all(&rec).await.is_err() {
                break;
            }
        }
    });
    let w = Rc::new(worker(index, cfg, tx)?);
    let (stop_accepting, stop) = tokio::sync::watch::channel(false);
    let mut accepts: Vec<AbortHandle> = listeners
        .into_iter()
        .map(|(l, tls, serves)| {
            let speaks = Speaks::Http(tls, serves);
            let stop = stop.clone();
            tokio::task::spawn_local(accept_loop(w.clone(), l, speaks, stop)).abort_handle()
        })
        .collect();
    accepts.extend(mqtt_listeners.into_iter().map(|(l, tls)| {
        let speaks = Speaks::Mqtt(tls);
        tokio::task::spawn_local(accept_loop(w.clone(), l, speaks, stop.clone())).abort_handle()
    }));
    let ticker = tokio::task::spawn_local(tick_loop(w.clone())).abort_handle();
    let reactor = tokio::task::spawn_local(reactor(w.clone())).abort_handle();
    let fanout = tokio::task::spawn_local(fanout_loop(w.clone())).abort_handle();
    let sleeping = tokio::task::spawn_local(http::wake_sleepers(w.clone())).abort_handle();
    w.supervisor.send_snapshot();

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    // SIGHUP is the supervisor's (a reload): a whole process group
    // signalled must not kill the workers, which get the reload over the
    // control socket.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    // SIGUSR2 is the supervisor's "you are taken over": close spread out.
    let mut usr2 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())?;
    let mut spread = None;
    loop {
        tokio::select! {
            _ = hup.recv() => {}
            rec = read_record(&mut rd, &mut buf) => match rec {
                Ok(Some(rec)) => on_record(&w, rec),
                Ok(None) | Err(_) => {
                    log!("throng: worker {index}: supervisor is gone; draining");
                    break;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = usr2.recv() => {
                spread = Some(w.cfg.drain_spread);
                break;
            }
        }
    }
    // Each accept loop takes what its listener's queue holds and closes
    // it: a connection left in the queue of a closed listener is reset
    // (unless net.ipv4.tcp_migrate_req), so a takeover refuses no one.
    let _ = stop_accepting.send(true);
    // Let them go before the first subscriber is told to reconnect: it
    // must not land on a listener about to close.
    tokio::task::yield_now().await;
    for a in accepts {
        a.abort();
    }
    drain(&w, &mut rd, &mut buf, spread).await;
    ticker.abort();
    reactor.abort();
    fanout.abort();
    sleeping.abort();
    Ok(())
}

/// Reads the worker's settings, the supervisor's first record.
async fn settings(
    rd: &mut tokio::net::unix::OwnedReadHalf,
    buf: &mut BytesMut,
) -> Result<Config, WorkerError> {
    let why = match read_record(rd, buf).await {
        Ok(Some(Record::Config(json))) => match serde_json::from_slice(&json) {
            Ok(cfg) => return Ok(cfg),
            Err(e) => NoSettings::Json(e),
        },
        Ok(other) => NoSettings::Unexpected(other.map(Box::new)),
        Err(e) => NoSettings::Control(e),
    };
    Err(WorkerError::NoConfig(why))
}

/// A listener of HTTP connections: its socket, TLS and what it serves.
type HttpListener = (TcpListener, Option<Arc<rustls::ServerConfig>>, Serves);

/// A listener of MQTT connections: its socket and TLS.
type MqttListener = (TcpListener, Option<Arc<rustls::ServerConfig>>);

/// Opens this worker's listeners (`SO_REUSEPORT`, beside the other
/// workers'): the HTTP ones (public, then internal) and the MQTT ones.
fn open_listeners(
    index: usize,
    cfg: &Config,
) -> Result<(Vec<HttpListener>, Vec<MqttListener>), WorkerError> {
    let tls = match &cfg.tls {
        Some(m) if !cfg.tls_listen.is_empty() || !cfg.mqtts_listen.is_empty() => {
            Some(tls::server_config(m).map_err(|source| WorkerError::Tls { index, source })?)
        }
        _ => None,
    };
    let listen = |addr: SocketAddr| {
        reuseport::listener(addr)
            .and_then(TcpListener::from_std)
            .map_err(|source| WorkerError::Listen {
                index,
                addr,
                source,
            })
    };
    let mut listeners = Vec::new();
    let mut mqtt_listeners = Vec::new();
    let plain_mqtt = cfg.mqtt_listen.iter().map(|a| (*a, None));
    // --mqtts-listen offers ALPN `mqtt` (what an MQTT client that names
    // its protocol asks for), then `http/1.1` as before.
    let mqtts = tls.as_ref().map(|t| {
        let mut c = rustls::ServerConfig::clone(t);
        c.alpn_protocols = vec![b"mqtt".to_vec(), b"http/1.1".to_vec()];
        Arc::new(c)
    });
    let secure_mqtt = cfg.mqtts_listen.iter().map(|a| (*a, mqtts.clone()));
    for (addr, tls) in plain_mqtt.chain(secure_mqtt) {
        mqtt_listeners.push((listen(addr)?, tls));
    }
    let plain = cfg
        .listen
        .iter()
        .map(|a| (*a, None, Serves::public(cfg, *a)));
    let secure = cfg
        .tls_listen
        .iter()
        .map(|a| (*a, tls.clone(), Serves::public(cfg, *a)));
    // An address in both --publish-listen and --metrics-listen is one
    // listener serving both.
    let mut internal: Vec<SocketAddr> = cfg.publish_listen.clone();
    internal.extend(
        cfg.metrics_listen
            .iter()
            .filter(|a| !cfg.publish_listen.contains(a)),
    );
    let internal = internal
        .into_iter()
        .map(|a| (a, None, Serves::internal(cfg, a)));
    for (addr, tls, serves) in plain.chain(secure).chain(internal) {
        listeners.push((listen(addr)?, tls, serves));
    }

    Ok((listeners, mqtt_listeners))
}

/// What the worker owns, made from its settings; `tx` takes the records
/// for the supervisor.
fn worker(
    index: usize,
    cfg: Config,
    tx: mpsc::UnboundedSender<Bytes>,
) -> Result<Worker, WorkerError> {
    let counters = Rc::new(Counters::default());
    let report_interest = cfg.redis_mode == Some(RedisMode::Channels);
    let supervisor = Rc::new(SupervisorLink::new(
        index,
        counters.clone(),
        report_interest,
        tx,
    ));
    let places = match (cfg.max_connections, cfg.shared_counters) {
        (Some(cap), Some(fd)) => {
            let shared = SharedCounters::inherit(fd, cfg.workers)?;
            // What a dead predecessor in this slot held went with it.
            if let Some(mine) = shared.slot(index) {
                mine.store(0, std::sync::atomic::Ordering::SeqCst);
            }
            Some((shared, cap))
        }
        _ => None,
    };
    let around = Around {
        poller: Poller::new()?,
        supervisor: supervisor.clone(),
        counted: Counted::new(index, places, cfg.worker_files),
    };
    let publish_key = match &cfg.auth.publish_key {
        Some(file) => Some(PublishKey::new(file).map_err(|_| {
            WorkerError::Io(std::io::Error::other("no randomness for the publish key"))
        })?),
        None => None,
    };
    let verifier = Verifier::new(&cfg.auth).map(Rc::new);
    let subs = Subscribers::new(Limits::of(&cfg), around, counters.clone());
    subs.set_verifier(verifier.clone());
    subs.set_presence(&cfg.presence);
    Ok(Worker {
        index,
        subs,
        counters,
        supervisor,
        draining: Cell::new(false),
        outbox: RefCell::default(),
        outbox_ready: Notify::new(),
        sleepers: sleepers::Sleepers::default(),
        accept_errors: RefCell::new(Recurring::new(index)),
        verifier: Reloadable::new(verifier),
        publish_key: Reloadable::new(publish_key.map(Rc::new)),
        tls: Reloadable::new(None),
        parked: Parked::default(),
        cfg,
    })
}

/// What a listener's connections speak.
#[derive(Clone)]
enum Speaks {
    /// HTTP (and WebSocket, SSE); with TLS, each starts with a TLS handshake.
    Http(Option<Arc<rustls::ServerConfig>>, Serves),
    /// MQTT (`--mqtt-listen`); with TLS (`--mqtts-listen`), each starts
    /// with a TLS handshake.
    Mqtt(Option<Arc<rustls::ServerConfig>>),
}

impl Speaks {
    /// A listener clients reach (through a balancer, with
    /// `--proxy-protocol`), not an internal `--publish-listen` or
    /// `--metrics-listen` one.
    fn is_public(&self) -> bool {
        match self {
            Self::Http(_, serves) => serves.subscribe,
            Self::Mqtt(_) => true,
        }
    }
}

/// Accepts connections on `l`.
async fn accept_loop(
    w: Rc<Worker>,
    l: TcpListener,
    speaks: Speaks,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let got = tokio::select! {
            biased;
            _ = stop.changed() => {
                take_queued(&w, l, &speaks);
                return;
            }
            got = l.accept() => got,
        };
        match got {
            Ok((stream, peer)) => accepted(&w, stream, peer, &speaks),
            Err(e) => {
                // EMFILE and friends: say so once, count the rest, and back
                // off instead of spinning.
                w.counters.handshake_failed("accept_error");
                let hint = if e.raw_os_error() == Some(libc::EMFILE) {
                    " (open-file limit reached: run more workers, see --max-connections)"
                } else {
                    ""
                };
                let what = format!("accept: {e}{hint}");
                if let Some(line) = w.accept_errors.borrow_mut().note(&what, Instant::now()) {
                    log!("{line}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves an accepted connection (after its PROXY header, when asked for).
fn accepted(w: &Rc<Worker>, stream: TcpStream, peer: SocketAddr, speaks: &Speaks) {
    crate::metrics::inc(&w.counters.accepted);
    let _ = stream.set_nodelay(true);
    if w.cfg.proxy_protocol && speaks.is_public() {
        tokio::task::spawn_local(proxied(w.clone(), stream, peer, speaks.clone()));
        return;
    }
    dispatch(w, stream, peer, speaks);
}

/// Accepts what `l`'s queue holds now, without waiting, then closes it.
fn take_queued(w: &Rc<Worker>, l: TcpListener, speaks: &Speaks) {
    let Ok(l) = l.into_std() else { return };
    while let Ok((s, peer)) = l.accept() {
        let s = s
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(s));
        if let Ok(s) = s {
            accepted(w, s, peer, speaks);
        }
    }
}

/// Starts serving an accepted connection from `client` as its listener speaks.
fn dispatch(w: &Rc<Worker>, stream: TcpStream, client: SocketAddr, speaks: &Speaks) {
    let (tls, serves) = match speaks {
        Speaks::Http(tls, serves) => (current_tls(w, tls), *serves),
        Speaks::Mqtt(tls) => {
            let tls = current_tls(w, tls);
            tokio::task::spawn_local(mqtt_accept::serve(w.clone(), stream, client, tls));
            return;
        }
    };
    if w.cfg.per_address.any() {
        // A trusted proxy is not the client: its requests name the client
        // in X-Forwarded-For, counted at the upgrade.
        if !w.cfg.proxy_protocol && crate::proxied::trusted(&w.cfg.trusted_proxies, client.ip()) {
            tokio::task::spawn_local(http::forwarded(w.clone(), stream, tls, serves));
        } else {
            tokio::task::spawn_local(http::admit(w.clone(), stream, client, tls, serves));
        }
        return;
    }
    match tls {
        Some(cfg) => {
            tokio::task::spawn_local(http::serve_tls(w.clone(), stream, cfg, serves, None));
        }
        None => {
            tokio::task::spawn_local(http::serve(
                w.clone(),
                tls::stream::Io::Plain(stream),
                serves,
                None,
            ));
        }
    }
}

/// `--proxy-protocol`: a connection from a trusted proxy starts with a
/// PROXY header naming the client, who is then served (and counted) as
/// if it had connected itself; anyone else, or a connection without a
/// whole header within `--handshake-timeout`, is closed.
async fn proxied(w: Rc<Worker>, stream: TcpStream, peer: SocketAddr, speaks: Speaks) {
    if !crate::proxied::trusted(&w.cfg.trusted_proxies, peer.ip()) {
        w.counters.refused("untrusted_proxy");
        return;
    }
    let header = tokio::time::timeout(w.cfg.handshake_timeout, proxy_header(&stream)).await;
    match header {
        Ok(Ok(client)) => dispatch(&w, stream, client.unwrap_or(peer), &speaks),
        Ok(Err(_)) => w.counters.handshake_failed("proxy_header"),
        Err(_) => w.counters.handshake_failed("proxy_timeout"),
    }
}

/// Reads the PROXY header off `stream` and nothing after it (the bytes are
/// peeked first, so what follows stays for TLS or HTTP); the client it
/// names (`None`: the proxy's own check, served as the proxy).
async fn proxy_header(stream: &TcpStream) -> std::io::Result<Option<SocketAddr>> {
    use throng_proto::proxy;
    let mut buf = vec![0u8; proxy::V2_MAX];
    let mut seen = 0;
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        match proxy::parse(&buf[..n]).map_err(std::io::Error::other)? {
            Some(h) => {
                let mut header = &mut buf[..h.len];
                while !header.is_empty() {
                    let got = stream.try_read(header);
                    match got {
                        Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                        Ok(k) => header = &mut header[k..],
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            stream.readable().await?;
                        }
                        Err(e) => return Err(e),
                    }
                }
                return Ok(h.addresses.map(|(client, _)| client));
            }
            // Part of a header: the socket stays readable while those
            // bytes wait, so wait a little for the rest rather than spin.
            None if n == seen => tokio::time::sleep(Duration::from_millis(5)).await,
            None => seen = n,
        }
    }
}

/// The TLS settings a new connection of a listener started with `given`
/// gets: the reloaded ones once a SIGHUP brought some (`None`: a plain listener).
fn current_tls(
    w: &Worker,
    given: &Option<Arc<rustls::ServerConfig>>,
) -> Option<Arc<rustls::ServerConfig>> {
    given
        .as_ref()
        .map(|g| w.tls.get().unwrap_or_else(|| g.clone()))
}

/// Takes the certificate and keys a SIGHUP re-read (`json`: the whole
/// settings, as at start); what does not parse leaves the old material.
fn reload(w: &Worker, json: &[u8]) {
    let cfg: Config = match serde_json::from_slice(json) {
        Ok(cfg) => cfg,
        Err(e) => {
            log!(
                "throng: worker {}: reload: unreadable settings: {e}",
                w.index
            );
            return;
        }
    };
    if let Some(m) = &cfg.tls
        && (!cfg.tls_listen.is_empty() || !cfg.mqtts_listen.is_empty())
    {
        match tls::server_config(m) {
            Ok(c) => w.tls.set(Some(c)),
            Err(e) => log!("throng: worker {}: reload: TLS kept: {e}", w.index),
        }
    }
    w.verifier.set(Verifier::new(&cfg.auth).map(Rc::new));
    w.subs.set_verifier(w.verifier.get());
    if let Some(file) = &cfg.auth.publish_key
        && let Ok(key) = PublishKey::new(file)
    {
        w.publish_key.set(Some(Rc::new(key)));
    }
}

/// Hands readiness from the worker's epoll to the subscribers, and to the
/// TLS connections parked between requests.
async fn reactor(w: Rc<Worker>) {
    let mut events = Events::with_capacity(256);
    loop {
        if let Err(e) = w.subs.outside().poller.wait(&mut events).await {
            log!("throng: worker {}: epoll: {e}", w.index);
            return;
        }
        for ev in events.iter() {
            if ev.token & park::TOKEN_BIT != 0 {
                http::unpark(&w, ev.token);
                continue;
            }
            let Some(c) = w.subs.get(ev.token) else {
                continue;
            };
            if ev.writable {
                w.subs.on_writable(&c);
            }
            if ev.readable {
                w.subs.on_readable(&c, true);
            }
        }
    }
}

/// The worker's one timer: every [`TICK`] the subscribers' clock advances
/// and their tick runs (ping, idle check, closing and write deadlines), and
/// twice a second the counters go to the supervisor.
async fn tick_loop(w: Rc<Worker>) {
    let every = match Timer::new().and_then(|t| t.start_ticking(TICK).map(|()| t)) {
        Ok(t) => t,
        Err(e) => {
            log!("throng: worker {}: cannot start its clock: {e}", w.index);
            return;
        }
    };
    let snapshot_every = wheel::ticks(Duration::from_millis(500));
    let mut burst = trim::AfterBurst::default();
    loop {
        // Missed ticks are not made up: the clock counts sweeps, and a
        // connection's deadlines stretch with a busy worker, never shrink.
        if let Err(e) = every.tick().await {
            log!("throng: worker {}: clock: {e}", w.index);
            return;
        }
        let now = if w.draining.get() {
            let now = w.subs.advance();
            w.subs.end_overdue(now);
            now
        } else {
            w.subs.set_wall(gate::unix_now());
            w.subs.tick();
            http::expire_parked(&w);
            w.subs.now()
        };
        if now % snapshot_every == 0 {
            w.supervisor.send_snapshot();
            // At most twice a second, however many tokens named an unknown kid.
            if w.verifier.get().is_some_and(|v| v.take_unknown_kid()) {
                w.supervisor.send(&Record::KeysStale);
            }
            if let Some(line) = w.accept_errors.borrow_mut().flush(Instant::now()) {
                log!("{line}");
            }
            if burst.due(w.counters.accepted.get()) {
                throng_host::process::release_free_memory();
            }
        }
    }
}

/// Handles a record from the supervisor: a message to fan out, or an
/// answer for the supervisor link.
///
/// A message is counted (this worker's subscribers of its channel) and the
/// count sent back before it is written to anyone: the publisher's answer
/// says the message is accepted for delivery and to how many, so its
/// latency does not grow with the fan-out (10 s at a million subscribers
/// when it waited for the last write). The writes follow on the fan-out
/// task, in the order messages came.
fn on_record(w: &Worker, rec: Record) {
    match w.supervisor.on_record(rec) {
        None => {}
        Some(Record::Deliver(m)) => {
            let n = if w.draining.get() {
                0
            } else {
                w.subs.subscribers_of(&m.channel)
            };
            w.supervisor.send(&Record::Delivered {
                id: m.id,
                subscribers: n,
            });
            if n > 0 {
                w.outbox.borrow_mut().push_back(Outgoing::Deliver(m));
                w.outbox_ready.notify_one();
            } else if w.outbox.borrow().is_empty() {
                w.subs.passed(m.id);
            }
        }
        Some(Record::Recovered {
            id,
            complete,
            messages,
        }) => w.subs.recovered(id, complete, messages),
        Some(Record::Published { id, message, .. }) => w.subs.publish_answered(id, message, None),
        Some(Record::ClientId { hash, claim }) => w.subs.taken_over(hash, claim),
        Some(Record::SessionResumed(r)) => w.subs.session_resumed(r),
        Some(Record::ShareDeliver(d)) => w.subs.share_deliver(d),
        Some(Record::PublishFailed { id, reason }) => {
            w.subs
                .publish_answered(id, crate::history::MessageId::NONE, Some(&reason));
        }
        Some(Record::Reload(json)) => reload(w, &json),
        Some(Record::Api(r)) if r.leg == crate::control::Leg::Query => api::answer(w, &r),
        Some(Record::Presence(e)) => {
            w.subs.presence_event(&e);
        }
        Some(Record::Retained { id, messages }) => {
            // In order with the fan-outs of what came before it.
            w.outbox
                .borrow_mut()
                .push_back(Outgoing::Retained(id, messages));
            w.outbox_ready.notify_one();
        }
        Some(other) => log!(
            "throng: worker {}: unexpected control record {other:?}",
            w.index
        ),
    }
}

/// Subscribers written to per turn of the fan-out task: about 5 ms of
/// writes, after which the worker's other tasks (the control socket, the
/// publish routes waiting for their answer, the reactor) get a turn.
const FANOUT_TURN: usize = 1024;

/// Writes each message taken by [`on_record`] to its subscribers here, in
/// order, once its count is on its way to the supervisor.
async fn fanout_loop(w: Rc<Worker>) {
    loop {
        w.outbox_ready.notified().await;
        loop {
            let next = w.outbox.borrow_mut().pop_front();
            let m = match next {
                None => break,
                Some(Outgoing::Deliver(m)) => m,
                Some(Outgoing::Retained(id, messages)) => {
                    w.subs.retained_answer(id, messages);
                    continue;
                }
            };
            let mut f = w.subs.begin_fanout(&m);
            while !w.draining.get() && w.subs.fanout_some(&mut f, FANOUT_TURN) {
                tokio::task::yield_now().await;
            }
            tokio::task::yield_now().await;
        }
    }
}

/// Sends 1001 (MQTT 5.0: DISCONNECT 0x8B) to every subscriber and waits until they are gone (or the
/// drain timeout), answering control records meanwhile. Taken over
/// (`spread`): 1012 "service restart" instead, to a share of the
/// subscribers every 20 ms so that the last gets it when `spread` is over.
async fn drain(
    w: &Worker,
    rd: &mut tokio::net::unix::OwnedReadHalf,
    buf: &mut BytesMut,
    spread: Option<Duration>,
) {
    // Taken over, the subscribers still open keep getting messages until
    // their turn comes.
    w.draining.set(spread.is_none());
    let start = tokio::time::Instant::now();
    let mut pending = Vec::new();
    let n = match spread {
        None => w.subs.close_all(
            close_code::GOING_AWAY,
            "server shutting down",
            CloseReason::Shutdown,
        ),
        Some(_) => {
            pending = w.subs.all();
            pending.len()
        }
    };
    let spread = spread.unwrap_or_default();
    let deadline = start + spread + w.cfg.drain_timeout;
    let mut ctl_open = true;
    loop {
        if !pending.is_empty() {
            // Those due by now: n x elapsed/spread.
            let due = if spread.is_zero() {
                n
            } else {
                let part = start.elapsed().as_secs_f64() / spread.as_secs_f64();
                ((n as f64 * part).floor() as usize).min(n)
            };
            let closed = n - pending.len();
            for c in pending.drain(..due.saturating_sub(closed).min(n - closed)) {
                w.subs.close(
                    &c,
                    close_code::SERVICE_RESTART,
                    "service restart",
                    CloseReason::Shutdown,
                );
            }
            if pending.is_empty() {
                // And whoever finished a handshake meanwhile.
                w.draining.set(true);
                w.subs.close_all(
                    close_code::SERVICE_RESTART,
                    "service restart",
                    CloseReason::Shutdown,
                );
            }
        } else if w.subs.len() == 0 && w.counters.queued.get() == 0 {
            break;
        }
        let wait = tokio::time::sleep(Duration::from_millis(20));
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break,
            _ = wait => {},
            rec = read_record(rd, buf), if ctl_open => match rec {
                Ok(Some(rec)) => on_record(w, rec),
                _ => ctl_open = false,
            },
        }
    }
    let left = w.subs.len();
    log!(
        "throng: worker {}: drained {} of {n} subscribers",
        w.index,
        n - left
    );
    w.supervisor.send_snapshot();
    // Give the writer task a moment to hand the last records over.
    tokio::task::yield_now().await;
}
