//! A new connection's first life as HTTP: read the request head (within
//! `--handshake-timeout`), then either answer it with one of the
//! [`routes`], make it a subscriber (a WebSocket upgrade, or
//! an event stream: `/sse/<channel>`, `Accept: text/event-stream`; either
//! may rejoin after an id, `?since=` or `Last-Event-ID`), or refuse it with
//! the status and reason a client can act on.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use throng_proto::http::{self, HeadError, Request};
use throng_proto::{deflate, ws};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::conn::{Conn, NONE, TlsState};
use super::gate;
use super::mqtt_accept;
use super::mqtt_auth;
use super::mqtt_ws;
use super::multi;
use super::ping_answer::Answer;
use super::rejoin::Kind;
use super::routes::ping::Pinged;
use super::routes::{self, Route, ops, ping, publish, refuse};
use super::state::{Serves, Sleeper, Waiting, Worker};
use super::subscribers::max_packet;
use crate::addresses::{Source, Verdict};
use crate::auth::Refusal;
use crate::channel;
use crate::history::MessageId;
use crate::tls::park;
use crate::tls::stream::{Io, TlsStream, Woken};
use crate::wheel;

/// What reading a request head gave.
enum Head {
    Request(Request, usize),
    /// The client closed (or the socket failed) before sending a whole head.
    Closed,
    Bad(HeadError),
    /// A TLS connection would wait for a request holding no bytes, or a
    /// plain one for its first request: it waits on out of its task
    /// ([`park()`]).
    Park,
}

/// An admitted connection's client address, while it is counted under it
/// (per-address limits): the upgrade takes it for the subscriber, which
/// gives it back when it ends; otherwise [`admit`] gives it back when the
/// connection's HTTP phase ends. Borrowed by the connection's future, so
/// that future (every HTTP connection's) grows by one pointer only.
pub(crate) type Ticket = Cell<Option<Source>>;

/// Per-address limits: asks the supervisor whether a new connection from
/// `peer` may be served, then serves it (holding its [`Ticket`]) or turns
/// it away.
pub(crate) async fn admit(
    w: Rc<Worker>,
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    serves: Serves,
) {
    let source = Source::of(peer.ip());
    let verdict = w.supervisor.admit(source).await;
    if let Some(label) = verdict.label() {
        w.counters.refused(label);
        // On a TLS port the answer would cost the handshake the limits
        // are there to spare: the connection is just closed.
        if tls.is_none() {
            turn_away(&w, tcp, verdict).await;
        }
        return;
    }
    let ticket: Ticket = Cell::new(Some(source));
    match tls {
        Some(cfg) => serve_tls(w.clone(), tcp, cfg, serves, Some(&ticket)).await,
        None => serve(w.clone(), Io::Plain(tcp), serves, Some(&ticket)).await,
    }
    if let Some(source) = ticket.take() {
        w.supervisor.release(source);
    }
}

/// Per-address limits for a connection from a trusted proxy without
/// `--proxy-protocol`: the proxy is not the client, so nothing is counted
/// at accept; an upgrade is admitted under the client its
/// `X-Forwarded-For` names ([`forwarded_admission`]), and that address is
/// given back when the connection ends.
pub(crate) async fn forwarded(
    w: Rc<Worker>,
    tcp: TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    serves: Serves,
) {
    let ticket: Ticket = Cell::new(None);
    match tls {
        Some(cfg) => serve_tls(w.clone(), tcp, cfg, serves, Some(&ticket)).await,
        None => serve(w.clone(), Io::Plain(tcp), serves, Some(&ticket)).await,
    }
    if let Some(source) = ticket.take() {
        w.supervisor.release(source);
    }
}

/// An upgrade on a connection that was not counted at accept (it came
/// from a trusted proxy, see [`forwarded`]): counts it under the client
/// `X-Forwarded-For` names, or refuses it (429) past that client's limit.
/// `false`: refused and answered.
async fn forwarded_admission(w: &Worker, stream: &mut Io, req: &Request, ticket: &Ticket) -> bool {
    let values: Vec<&[u8]> = req
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("x-forwarded-for"))
        .map(|(_, v)| v.as_slice())
        .collect();
    // Without the header the proxy speaks for itself: not counted.
    let Some(client) = crate::proxied::forwarded_for(&w.cfg.trusted_proxies, &values) else {
        return true;
    };
    let source = Source::of(client);
    let verdict = w.supervisor.admit(source).await;
    if let Some(label) = verdict.label() {
        w.counters.refused(label);
        let why = "too many connections from your address (--max-connections-per-ip)\n";
        refuse(w, stream, 429, why).await;
        return false;
    }
    ticket.set(Some(source));
    true
}

/// How long a turned-away connection is read (and its bytes dropped)
/// after the answer, so that closing it does not reset the connection
/// before the client reads the answer.
const LINGER: Duration = Duration::from_secs(1);

/// Answers a connection refused by a per-address limit (429) or a full
/// address table (503) without reading its request, and closes it.
async fn turn_away(w: &Worker, mut tcp: TcpStream, verdict: Verdict) {
    let (status, why, retry_after) = match verdict {
        Verdict::TooMany => (
            429,
            "too many connections from your address (--max-connections-per-ip)\n",
            None,
        ),
        Verdict::TooFast { retry_after } => (
            429,
            "too many new connections from your address (--handshakes-per-ip)\n",
            Some(retry_after),
        ),
        _ => (
            503,
            "too many client addresses at once\n",
            Some(gate::RETRY_AFTER),
        ),
    };
    let retry = retry_after.map(|s| s.to_string());
    let mut headers = vec![("Content-Type", "text/plain"), ("Connection", "close")];
    if let Some(r) = &retry {
        headers.push(("Retry-After", r));
    }
    let mut out = Vec::with_capacity(256);
    http::write_response(&mut out, status, &headers, why.as_bytes());
    let answered = async {
        tcp.write_all(&out).await?;
        tcp.shutdown().await
    };
    if !matches!(
        tokio::time::timeout(w.cfg.handshake_timeout, answered).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let _ = tokio::time::timeout(LINGER.min(w.cfg.handshake_timeout), async {
        loop {
            if tcp.readable().await.is_err() {
                return;
            }
            let mut scratch = w.subs.scratch().borrow_mut();
            match tcp.try_read(&mut scratch) {
                Ok(0) => return,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return,
                _ => {}
            }
        }
    })
    .await;
}

/// Runs the TLS handshake on a connection from a `--tls-listen` listener
/// (within `--handshake-timeout`), then serves it like a plain one.
pub(crate) async fn serve_tls(
    w: Rc<Worker>,
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    serves: Serves,
    ticket: Option<&Ticket>,
) {
    let accepted =
        tokio::time::timeout(w.cfg.handshake_timeout, TlsStream::accept(tcp, config)).await;
    match accepted {
        Err(_) => w.counters.handshake_failed("tls_timeout"),
        Ok(Err(e)) => w.counters.handshake_failed(e.label()),
        Ok(Ok(s)) => {
            w.counters.tls_handshake(s.handshake_label());
            serve(w, Io::Tls(Box::new(s)), serves, ticket).await;
        }
    }
}

/// How a connection's HTTP phase ended.
enum Phase {
    /// Closed (or to be closed).
    Closed,
    /// A WebSocket upgrade was asked for: the request, and the bytes read after it.
    Upgrade(Request, Vec<u8>),
    /// A `/ping` answer sleeps until the instant given: the sleepers hold it.
    Sleeps(Answer, Instant),
    /// A connection waiting for a request, to park (TLS; plain: only for
    /// its first); `first`: no request was read on it yet.
    Park { first: bool },
}

/// Serves one accepted connection until it upgrades, sleeps or closes.
pub(crate) async fn serve(w: Rc<Worker>, stream: Io, serves: Serves, ticket: Option<&Ticket>) {
    serve_from(&w, stream, serves, ticket, true).await;
}

/// [`serve`], `first` if no request was read on the connection yet.
async fn serve_from(
    w: &Rc<Worker>,
    mut stream: Io,
    serves: Serves,
    ticket: Option<&Ticket>,
    first: bool,
) {
    // A plain connection from a trusted proxy, counted only at its upgrade
    // ([`forwarded`]), waits in its task as before (a parked one would keep
    // that mark in `Waiting::ticketed`, as TLS ones do, but no test covers
    // a plain one yet).
    let parks = ticket.is_none_or(|t| t.get().is_some());
    let phase = requests(w, &mut stream, serves, first, parks).await;
    end(w.clone(), stream, serves, ticket, phase).await;
}

/// Wakes each of the worker's sleepers when its next part is due: a task
/// of its own takes the connection up again ([`resume`]).
/// A sleeper whose client closed or reset its socket meanwhile is let go
/// at once (its client address released) and counted in /metrics as
/// `throng_handshake_failures_total{reason="ping_client_closed"}`.
pub(crate) async fn wake_sleepers(w: Rc<Worker>) {
    let mut events = throng_host::poll::Events::with_capacity(64);
    loop {
        let next = w.sleepers.next();
        let wait = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = wait => {}
            () = w.sleepers.sooner() => continue,
            fds = w.sleepers.stirred(&mut events) => {
                for fd in fds {
                    let gone = |s: &Sleeper| match s.stream.peek(&mut [0u8; 1]) {
                        Ok(n) => n == 0,
                        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                    };
                    if let Some(sleeper) = w.sleepers.stir(fd, gone) {
                        w.counters.handshake_failed("ping_client_closed");
                        if let Some(source) = sleeper.source {
                            w.supervisor.release(source);
                        }
                    }
                }
                continue;
            }
        }
        for sleeper in w.sleepers.due(Instant::now()) {
            tokio::task::spawn_local(resume(w.clone(), sleeper));
        }
    }
}

/// Takes up a sleeping `/ping` connection whose next part is due (from the
/// worker's sleepers): the rest of its answer, then its next requests,
/// still counted under its client address if it was.
pub(crate) async fn resume(w: Rc<Worker>, sleeper: Sleeper) {
    let ticket: Ticket = Cell::new(sleeper.source);
    if let Ok(tcp) = TcpStream::from_std(sleeper.stream) {
        let mut stream = Io::Plain(tcp);
        let phase = match ping::go_on(&w, &mut stream, sleeper.answer, true).await {
            Pinged::Sleeps(answer, wake) => Phase::Sleeps(answer, wake),
            Pinged::Done(false) => Phase::Closed,
            Pinged::Done(true) => requests(&w, &mut stream, sleeper.serves, false, false).await,
        };
        end(w.clone(), stream, sleeper.serves, Some(&ticket), phase).await;
    }
    if let Some(source) = ticket.take() {
        w.supervisor.release(source);
    }
}

/// Ends the HTTP phase: the upgrade, the sleepers (which keep the client
/// address's count, taken from `ticket`), or the close.
async fn end(w: Rc<Worker>, mut stream: Io, serves: Serves, ticket: Option<&Ticket>, phase: Phase) {
    match phase {
        Phase::Upgrade(req, rest) => upgrade(&w, stream, &req, &rest, ticket).await,
        Phase::Sleeps(answer, wake) => {
            // Only plain connections are handed over (see `requests`).
            if let Io::Plain(tcp) = stream
                && let Ok(tcp) = tcp.into_std()
            {
                w.sleepers.park(
                    Sleeper {
                        stream: tcp,
                        answer,
                        serves,
                        source: ticket.and_then(Cell::take),
                    },
                    wake,
                );
            }
        }
        Phase::Park { first } => match stream {
            Io::Tls(s) => {
                let parts = s.into_parts();
                park(
                    &w,
                    parts.tcp,
                    Some(Box::new(parts.conn)),
                    serves,
                    ticket,
                    first,
                );
            }
            Io::Plain(tcp) => park(&w, tcp, None, serves, ticket, first),
        },
        Phase::Closed => {
            if let Io::Tls(_) = stream {
                // close_notify, so the client can tell the end from a cut.
                let _ = tokio::time::timeout(
                    w.cfg.handshake_timeout,
                    AsyncWriteExt::shutdown(&mut stream),
                )
                .await;
            }
        }
    }
}

/// Answers requests until the connection ends, asks for a subscription,
/// sleeps in a `/ping` answer long enough to leave its task (plain
/// connections only: a TLS one keeps its session in its task), or is to
/// be parked (TLS; plain: before its first request, if `parks`).
async fn requests(
    w: &Worker,
    stream: &mut Io,
    serves: Serves,
    mut first: bool,
    parks: bool,
) -> Phase {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let read = tokio::time::timeout(
            w.cfg.handshake_timeout,
            read_head(w, stream, &mut buf, first, parks && first),
        );
        let Ok(head) = read.await else {
            if first || !buf.is_empty() {
                w.counters.handshake_failed("timeout");
            }
            return Phase::Closed;
        };
        let (req, used) = match head {
            Head::Request(req, used) => (req, used),
            Head::Closed => {
                if !buf.is_empty() {
                    w.counters.handshake_failed("incomplete_head");
                }
                return Phase::Closed;
            }
            Head::Park => return Phase::Park { first },
            Head::Bad(e) => {
                let (status, label) = match e {
                    HeadError::TooLarge { .. } | HeadError::TooManyHeaders => {
                        (431, "head_too_large")
                    }
                    _ => (400, "malformed_head"),
                };
                w.counters.handshake_failed(label);
                refuse(w, stream, status, &format!("{e}\n")).await;
                return Phase::Closed;
            }
        };
        first = false;
        buf.drain(..used);
        // RFC 9112 section 3.2: an HTTP/1.1 request with no Host, or more
        // than one, gets 400.
        if req.minor_version == 1 && hosts(&req) != 1 {
            w.counters.handshake_failed("bad_host");
            let why = "an HTTP/1.1 request needs exactly one Host header (RFC 9112 section 3.2)\n";
            Box::pin(refuse(w, stream, 400, why)).await;
            return Phase::Closed;
        }
        let Some(route) = routes::route(w, &req, serves) else {
            return Phase::Upgrade(req, buf);
        };
        // The connection's future is as large as its largest route's, and
        // a sleeping `/ping` request holds it all the while: the publish
        // routes, short-lived and larger, are boxed for the time they run.
        let keep = match route {
            Route::Healthz => ops::healthz(w, stream, &req).await,
            Route::Metrics => ops::metrics(w, stream, &req).await,
            Route::Publish => Box::pin(publish::serve(w, stream, &req, &mut buf)).await,
            Route::PublishMethod => publish::refuse_method(w, stream).await,
            Route::Api => Box::pin(routes::api::serve(w, stream, &req, &mut buf)).await,
            Route::Ping => {
                let may_leave = matches!(stream, Io::Plain(_));
                match ping::serve(w, stream, &req, &mut buf, may_leave).await {
                    Pinged::Done(keep) => keep,
                    Pinged::Sleeps(answer, wake) => return Phase::Sleeps(answer, wake),
                }
            }
            #[cfg(feature = "bench-floor")]
            Route::BenchFloor => {
                Box::pin(routes::bench_floor::serve(w, stream, &req, &mut buf)).await
            }
            Route::NotHere(what) => Box::pin(routes::not_here(w, stream, what)).await,
            Route::TestBackendOff => Box::pin(routes::test_backend_off(w, stream)).await,
        };
        if !keep {
            return Phase::Closed;
        }
    }
}

/// How many `Host` lines `req` has.
fn hosts(req: &Request) -> usize {
    req.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
        .count()
}

/// Reads one request head. A connection waiting for a request (a new one,
/// or a keep-alive one between requests) holds no buffer: it waits for
/// readiness and reads into the worker's scratch buffer, and keeps an owned
/// copy only of a head that arrived split, or of bytes after a whole head
/// (a pipelined request, a body). Measured with `scripts/bench-attack.sh`:
/// reserving 4 KiB per connection up front was most of what each of 5,000
/// sleeping `/ping` requests cost the server. A TLS connection reads through
/// its stream, which owns the decrypted bytes.
/// `first`: no request was read on the connection yet. `park_plain`: a
/// plain connection with nothing to read is parked (its first request).
async fn read_head(
    w: &Worker,
    stream: &mut Io,
    buf: &mut Vec<u8>,
    first: bool,
    park_plain: bool,
) -> Head {
    // The end of a plain connection's wait in its task, once it began.
    let mut grace: Option<tokio::time::Instant> = None;
    loop {
        if !buf.is_empty() {
            match http::parse_request(buf, http::MAX_HEAD) {
                Ok(Some((req, used))) => return Head::Request(req, used),
                Ok(None) => {}
                Err(e) => return Head::Bad(e),
            }
            if buf.len() > http::MAX_HEAD {
                return Head::Bad(HeadError::TooLarge {
                    limit: http::MAX_HEAD,
                });
            }
            // The rest of a split head goes where its start is.
            buf.reserve(4096);
            match stream.read_buf(buf).await {
                Ok(0) | Err(_) => return Head::Closed,
                Ok(_) => continue,
            }
        }
        let tcp = match stream {
            Io::Plain(tcp) => tcp,
            Io::Tls(tls) => {
                // TLS: wait holding no buffer here (nor in the stream), as
                // the plain path does; then take what was decrypted.
                crate::tls::stream::give_buffer(std::mem::take(buf));
                // Boxed: the wait's timer would grow every connection's
                // future, plain ones too, for TLS's sake.
                let ready = Box::pin(async {
                    // A kept-alive client's next request usually comes at
                    // once: it is waited for in the task a moment.
                    if !first {
                        let next = std::future::poll_fn(|cx| tls.poll_plain_ready(cx));
                        if let Ok(r) = tokio::time::timeout(park::KEPT_GRACE, next).await {
                            return Some(r);
                        }
                    }
                    // Nothing to read and nothing held (not even part of a
                    // record): the connection waits on parked, out of its task.
                    std::future::poll_fn(|cx| match tls.poll_plain_ready(cx) {
                        Poll::Pending if tls.parkable() => Poll::Ready(None),
                        other => other.map(Some),
                    })
                    .await
                });
                match ready.await {
                    Some(Ok(())) => {}
                    Some(Err(_)) => return Head::Closed,
                    None => return Head::Park,
                }
                *buf = crate::tls::stream::take_buffer();
                match stream.read_buf(buf).await {
                    Ok(0) | Err(_) => return Head::Closed,
                    Ok(_) => continue,
                }
            }
        };
        // A plain connection waiting for its first request reads at once
        // (tokio's readiness of a socket just registered is not known yet,
        // while its client's request is often there already); with
        // nothing to read it waits in its task a moment (a client's request
        // usually follows its connect at once: parking it would add four
        // epoll calls to its upgrade), then it is parked: ~1.9 KB as a
        // task against a parked entry's few dozen bytes.
        if !park_plain && tcp.readable().await.is_err() {
            return Head::Closed;
        }
        let read = {
            let mut scratch = w.subs.scratch().borrow_mut();
            if park_plain && grace.is_none() {
                std::io::Read::read(&mut &*socket2::SockRef::from(&*tcp), &mut scratch)
            } else {
                // Through tokio once it has said the socket is readable:
                // a WouldBlock clears that readiness. Tokio often says a
                // socket just accepted is readable while nothing is there
                // yet; read around it, the wait ended at once and most
                // connections of a connect storm were parked
                // (`scripts/bench-serve.sh`: 14,323 of 18,000).
                tcp.try_read(&mut scratch)
            }
        };
        let n = match read {
            Ok(0) => return Head::Closed,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && park_plain => {
                let until =
                    *grace.get_or_insert_with(|| tokio::time::Instant::now() + park::FIRST_GRACE);
                // Boxed, as TLS's wait: the timer would grow every
                // connection's future.
                let ready = Box::pin(tokio::time::timeout_at(until, tcp.readable()));
                match ready.await {
                    Err(_) => return Head::Park,
                    Ok(Err(_)) => return Head::Closed,
                    Ok(Ok(())) => continue,
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Head::Closed,
        };
        // What was just read, with no wait since.
        let scratch = w.subs.scratch().borrow();
        match http::parse_request(&scratch[..n], http::MAX_HEAD) {
            Ok(Some((req, used))) => {
                buf.extend_from_slice(&scratch[used..n]);
                return Head::Request(req, 0);
            }
            Ok(None) if n > http::MAX_HEAD => {
                return Head::Bad(HeadError::TooLarge {
                    limit: http::MAX_HEAD,
                });
            }
            Ok(None) => buf.extend_from_slice(&scratch[..n]),
            Err(e) => return Head::Bad(e),
        }
    }
}

/// Parks a connection that waits for a request (tls::park; `conn`: its
/// rustls state, none if plain) until its next bytes, for what is left of
/// `--handshake-timeout`. Its address stays counted (the ticket's source
/// goes with it).
fn park(
    w: &Worker,
    tcp: TcpStream,
    conn: Option<Box<rustls::server::UnbufferedServerConnection>>,
    serves: Serves,
    ticket: Option<&Ticket>,
    first: bool,
) {
    let ticketed = ticket.is_some();
    let source = ticket.and_then(Cell::take);
    let release = |source: Option<Source>| {
        if let Some(source) = source {
            w.supervisor.release(source);
        }
    };
    let Ok(tcp) = tcp.into_std() else {
        release(source);
        return;
    };
    let waiting = Waiting {
        serves,
        source,
        ticketed,
        first,
    };
    let parked = w.parked.park(
        &w.subs.outside().poller,
        tcp,
        conn,
        waiting,
        park_deadline(w),
    );
    if let Err(waiting) = parked {
        release(waiting.source);
    }
}

/// The tick a connection parked now is closed at: `--handshake-timeout`
/// from now, as a task waiting for a request would be.
fn park_deadline(w: &Worker) -> u32 {
    let wait = wheel::ticks(w.cfg.handshake_timeout);
    w.subs.now().saturating_add(wait)
}

/// A parked connection's bytes (or its end) came: it goes on in a task.
pub(crate) fn unpark(w: &Rc<Worker>, token: u64) {
    let Some(e) = w.parked.wake(&w.subs.outside().poller, token) else {
        return;
    };
    let Some(conn) = e.conn else {
        // Plain: its task reads the request (or parks it again if there
        // was nothing after all).
        match TcpStream::from_std(e.tcp) {
            Ok(tcp) => {
                tokio::task::spawn_local(resumed(w.clone(), Io::Plain(tcp), e.extra));
            }
            Err(_) => {
                if let Some(source) = e.extra.source {
                    w.supervisor.release(source);
                }
            }
        }
        return;
    };
    let waiting = match TlsStream::wake(e.tcp, conn) {
        Woken::Stream(s) => {
            tokio::task::spawn_local(resumed(w.clone(), Io::Tls(s), e.extra));
            return;
        }
        Woken::NotYet(tcp, conn) => {
            let deadline = park_deadline(w);
            match w
                .parked
                .park(&w.subs.outside().poller, tcp, Some(conn), e.extra, deadline)
            {
                Ok(()) => return,
                Err(waiting) => waiting,
            }
        }
        Woken::Ended => e.extra,
    };
    if let Some(source) = waiting.source {
        w.supervisor.release(source);
    }
}

/// A woken connection's task: its HTTP phase goes on, counted under its
/// address as before (one from a trusted proxy, not counted yet, is counted
/// at its upgrade under the client it names).
async fn resumed(w: Rc<Worker>, stream: Io, waiting: Waiting) {
    let ticket: Ticket = Cell::new(waiting.source);
    let counted = waiting.ticketed.then_some(&ticket);
    serve_from(&w, stream, waiting.serves, counted, waiting.first).await;
    if let Some(source) = ticket.take() {
        w.supervisor.release(source);
    }
}

/// Closes the parked connections whose time ran out (with a
/// close_notify, as in a task), as the tick finds them.
pub(crate) fn expire_parked(w: &Worker) {
    w.parked
        .expire(&w.subs.outside().poller, w.subs.now(), |mut e| {
            if e.extra.first {
                w.counters.handshake_failed("timeout");
            }
            if let Some(source) = e.extra.source {
                w.supervisor.release(source);
            }
            let mut out = Vec::new();
            if let Some(conn) = &mut e.conn
                && crate::tls::close_notify(conn, &mut [], &mut out).is_ok()
            {
                // Best effort: the socket is non-blocking, and closed next.
                let _ = std::io::Write::write(&mut e.tcp, &out);
            }
        });
}

/// Completes (or refuses) a subscription, a WebSocket upgrade or an event
/// stream ([`is_sse`]), and hands the socket to the subscribers.
async fn upgrade(w: &Worker, mut stream: Io, req: &Request, rest: &[u8], ticket: Option<&Ticket>) {
    let sse = is_sse(req);
    let accept = if sse {
        String::new()
    } else {
        match ws::server_accept(req) {
            Ok(accept) => accept,
            Err(e) => {
                w.counters.handshake_failed(e.label());
                let mut out = Vec::new();
                ws::write_refusal(&mut out, &e);
                let _ = tokio::time::timeout(w.cfg.handshake_timeout, stream.write_all(&out)).await;
                return;
            }
        }
    };
    if !sse && gate::offers(req, mqtt_ws::SUBPROTOCOL) {
        // MQTT over WebSocket, on any path: an MQTT session, not a channel.
        if !gate::origin_allowed(w, req) {
            w.counters.refused("origin");
            let why = "this origin may not connect (--allowed-origins)\n";
            Box::pin(refuse(w, &mut stream, 403, why)).await;
            return;
        }
        let unticketed = Cell::new(None);
        let ticket = ticket.unwrap_or(&unticketed);
        Box::pin(mqtt_accept::over_ws(w, stream, &accept, rest, ticket)).await;
        return;
    }
    let prefix = if sse && req.target.starts_with(SSE_PREFIX) {
        SSE_PREFIX
    } else {
        "/"
    };
    if many_channels(req, prefix) {
        Box::pin(upgrade_many(w, stream, req, rest, ticket, &accept)).await;
        return;
    }
    let name = match channel::from_target(&req.target, prefix) {
        Ok(name) => name,
        Err(e) => {
            w.counters.handshake_failed("bad_channel");
            refuse(w, &mut stream, 400, &format!("{e}\n")).await;
            return;
        }
    };
    // Refusals are boxed: the upgrade's future is part of every HTTP
    // connection's, and stays as small as the happy path needs.
    if Box::pin(turned_away(w, &mut stream, req)).await {
        return;
    }
    // Its expiry is kept in the four bytes a subscriber has for it; its
    // subject (if any) beside the tables.
    let (expires, subject) = match gate::may_subscribe(w, req, name) {
        Ok(access) => (crate::auth::expiry(access.expires), access.subject),
        Err(why) => {
            Box::pin(gate::refuse(w, &mut stream, why)).await;
            return;
        }
    };
    let protocol = if sse { None } else { gate::protocol(req) };
    let kind = match (sse, protocol) {
        (true, _) => Kind::Sse,
        (false, Some(gate::PROTOCOL_IDS)) => Kind::WsIds,
        (false, _) => Kind::Ws,
    };
    let since = match since(req, kind) {
        Ok(since) => since,
        Err(why) => {
            w.counters.handshake_failed("bad_since");
            Box::pin(refuse(w, &mut stream, 400, &why.to_string())).await;
            return;
        }
    };
    let Some((c, tag)) =
        Box::pin(take(w, stream, req, rest, ticket, kind, protocol, &accept)).await
    else {
        return;
    };
    let c = c.with_expiry(expires);
    w.subs.subject_next(subject);
    let subscribed = match since {
        Some(since) => w.subs.subscribe_after(name, c, since),
        None => w.subs.subscribe(name, c).map(drop),
    };
    if let Err(e) = subscribed {
        w.subs.outside().counted.release(&w.supervisor, tag);
        w.counters.handshake_failed("epoll");
        log!("throng: worker {}: cannot watch a subscriber: {e}", w.index);
    }
}

/// Admits an accepted subscription (per-address limits,
/// `--max-connections`), writes the head that answers it and takes its
/// socket out of tokio: the subscriber's `Conn` (of `kind`, counted under
/// the tag it is returned with). `None` when it was refused (answered and
/// counted) or lost.
#[allow(clippy::too_many_arguments)]
async fn take(
    w: &Worker,
    mut stream: Io,
    req: &Request,
    rest: &[u8],
    ticket: Option<&Ticket>,
    kind: Kind,
    protocol: Option<&str>,
    accept: &str,
) -> Option<(Conn<std::net::TcpStream>, u32)> {
    if w.cfg.per_address.any()
        && let Some(t) = ticket.filter(|t| t.get().is_none())
        && !Box::pin(forwarded_admission(w, &mut stream, req, t)).await
    {
        return None;
    }
    let counted = &w.subs.outside().counted;
    if !counted.take_place() {
        w.counters.refused("max_connections");
        Box::pin(gate::full(w, &mut stream)).await;
        return None;
    }
    // permessage-deflate, when offered and this server offers it too.
    let deflate = (w.cfg.ws_deflate && !kind.is_sse())
        .then(|| {
            deflate::negotiate(req.headers.iter().filter_map(|(k, v)| {
                k.eq_ignore_ascii_case("sec-websocket-extensions")
                    .then_some(&v[..])
            }))
        })
        .flatten();
    let mut out = Vec::with_capacity(160);
    upgrade_head(w, req, kind, protocol, accept, deflate, &mut out);
    let written = tokio::time::timeout(w.cfg.handshake_timeout, stream.write_all(&out)).await;
    if !matches!(written, Ok(Ok(()))) {
        counted.give_place();
        w.counters.handshake_failed("write_failed");
        return None;
    }
    // From here on the socket lives in the worker's own epoll, not tokio's.
    let Some(c) = into_conn(w, stream, rest) else {
        counted.give_place();
        w.counters.handshake_failed("write_failed");
        return None;
    };
    let c = c.with_kind(kind);
    let c = if deflate.is_some() {
        c.with_deflate()
    } else {
        c
    };
    // The subscriber holds its place and its address from here on, and
    // gives both back when it ends (`Outside::forget`).
    let tag = ticket.and_then(Cell::take).map_or(NONE, |s| counted.tag(s));
    let c = c.with_tag(tag);
    Some((c.with_tag(tag), tag))
}

/// Refuses a subscription while the worker drains (503) or from an origin
/// `--allowed-origins` does not allow (403); true when it did.
async fn turned_away(w: &Worker, stream: &mut Io, req: &Request) -> bool {
    if w.draining.get() {
        w.counters.handshake_failed("draining");
        refuse(w, stream, 503, "server is shutting down\n").await;
        return true;
    }
    if !gate::origin_allowed(w, req) {
        w.counters.refused("origin");
        let why = "this origin may not subscribe (--allowed-origins)\n";
        refuse(w, stream, 403, why).await;
        return true;
    }
    false
}

/// Whether `req` subscribes to several channels: its path is the bare
/// `prefix` (`/`, or `/sse/` for an event stream), and it names channels
/// in its query or (a WebSocket) offers `throng.v1` to name them later.
fn many_channels(req: &Request, prefix: &str) -> bool {
    let path = req.target.split_once('?').map_or(&*req.target, |(p, _)| p);
    path == prefix
        && (!multi::channels_of(&req.target).is_empty() || gate::offers(req, gate::PROTOCOL_IDS))
}

/// Completes (or refuses) a subscription to several channels (docs/channels.md):
/// a WebSocket offering `throng.v1`, or an event stream. Every channel is
/// checked (a name, under `--max-channels-per-connection`, granted by the
/// token) before any is joined; `?since=` (or `Last-Event-ID`) recovers each.
async fn upgrade_many(
    w: &Worker,
    mut stream: Io,
    req: &Request,
    rest: &[u8],
    ticket: Option<&Ticket>,
    accept: &str,
) {
    let sse = is_sse(req);
    let protocol = if sse { None } else { gate::protocol(req) };
    let kind = if sse { Kind::SseMulti } else { Kind::WsMulti };
    let mut names = multi::channels_of(&req.target);
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    let mut watch = multi::presence_of(&req.target);
    watch.dedup();
    let why = if !sse && protocol != Some(gate::PROTOCOL_IDS) {
        Some(format!(
            "several channels on one WebSocket need the {} subprotocol (docs/channels.md)\n",
            gate::PROTOCOL_IDS
        ))
    } else if sse && names.is_empty() {
        Some("an event stream of several channels names them: /sse/?channel=a&channel=b\n".into())
    } else if names.len() > w.cfg.max_channels_per_connection {
        Some(format!(
            "{} channels, over --max-channels-per-connection ({})\n",
            names.len(),
            w.cfg.max_channels_per_connection
        ))
    } else {
        names
            .iter()
            .find_map(|n| channel::validate(n).err().map(|e| format!("{e}: {n:?}\n")))
            .or_else(|| watch_refusal(w, &names, &watch))
    };
    if let Some(why) = why {
        w.counters.handshake_failed("bad_channel");
        refuse(w, &mut stream, 400, &why).await;
        return;
    }
    if turned_away(w, &mut stream, req).await {
        return;
    }
    let admitted = gate::admitted(w, req).and_then(|a| {
        let all = names
            .iter()
            .all(|n| mqtt_auth::may_subscribe(a.grants.as_deref(), n));
        if all { Ok(a) } else { Err(Refusal::NotGranted) }
    });
    let admitted = match admitted {
        Ok(a) => a,
        Err(why) => return gate::refuse(w, &mut stream, why).await,
    };
    let since = match since(req, kind) {
        Ok(since) => since,
        Err(why) => {
            w.counters.handshake_failed("bad_since");
            refuse(w, &mut stream, 400, &why.to_string()).await;
            return;
        }
    };
    let Some((c, tag)) = take(w, stream, req, rest, ticket, kind, protocol, accept).await else {
        return;
    };
    // Room for a publish of --max-message in base64 (`data_base64`), and
    // the JSON around it.
    let c = c
        .with_expiry(admitted.expires)
        .with_max_message(max_packet(w.cfg.max_message.div_ceil(3) * 4));
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let watch: Vec<&str> = watch.iter().map(String::as_str).collect();
    w.subs.subject_next(admitted.subject);
    if let Err(e) = w
        .subs
        .subscribe_many(c, &names, since, admitted.grants, &watch)
    {
        w.subs.outside().counted.release(&w.supervisor, tag);
        w.counters.handshake_failed("epoll");
        log!("throng: worker {}: cannot watch a subscriber: {e}", w.index);
    }
}

/// Why the `presence=` channels of a connection of several cannot be
/// watched: each must be one of its `channel=`, with `--presence` on.
fn watch_refusal(w: &Worker, names: &[String], watch: &[String]) -> Option<String> {
    watch.iter().find_map(|n| {
        if !names.contains(n) {
            Some(format!(
                "presence={n} names a channel the query does not (channel={n})\n"
            ))
        } else if !w.subs.presence_on(n) {
            Some(format!(
                "{}: {n:?}\n",
                crate::worker::subscribers::PRESENCE_NOT_ON
            ))
        } else {
            None
        }
    })
}

/// The upgraded connection as a subscriber's `Conn`, its socket out of
/// tokio (`rest`: what the HTTP phase read behind the request); `None`
/// when the socket could not be taken.
fn into_conn(w: &Worker, stream: Io, rest: &[u8]) -> Option<Conn<std::net::TcpStream>> {
    Some(match stream {
        Io::Plain(tcp) => Conn::new(tcp.into_std().ok()?, w.subs.now(), rest),
        Io::Tls(tls) => {
            let parts = tls.into_parts();
            let sock = parts.tcp.into_std().ok()?;
            // Frames the client sent right behind its request: first what
            // the HTTP phase had read, then what it had decrypted but not read.
            let mut plain = rest.to_vec();
            plain.extend_from_slice(&parts.plain_rest);
            Conn::new(sock, w.subs.now(), &plain)
                .with_tls(TlsState::new(parts.conn, &parts.cipher_rest))
        }
    })
}

/// The head that answers an upgrade to `kind`, in `out`: 101 with the
/// WebSocket `accept` (and the `protocol` chosen), or an event stream's.
fn upgrade_head(
    w: &Worker,
    req: &Request,
    kind: Kind,
    protocol: Option<&str>,
    accept: &str,
    deflate: Option<deflate::Agreed>,
    out: &mut Vec<u8>,
) {
    if kind.is_sse() {
        return sse_head(w, req, out);
    }
    let mut headers = vec![
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Accept", accept),
    ];
    // Only the protocol this server speaks goes back, never a token.
    if let Some(p) = protocol {
        headers.push(("Sec-WebSocket-Protocol", p));
    }
    if let Some(d) = deflate {
        headers.push(("Sec-WebSocket-Extensions", d.response()));
    }
    http::write_response_head(out, 101, &headers);
}

/// The path prefix of an event stream for clients that cannot set `Accept`.
pub(crate) const SSE_PREFIX: &str = "/sse/";

/// How long an SSE client waits before it reconnects (the `retry:` hint).
pub(crate) const SSE_RETRY_MS: u64 = 2000;

/// Whether `req` asks for an event stream: a `GET` of `/sse/<channel>`, or
/// of `/<channel>` accepting `text/event-stream` (and not a WebSocket upgrade).
pub(crate) fn is_sse(req: &Request) -> bool {
    if req.method != "GET" || req.header("upgrade").is_some() {
        return false;
    }
    req.target.starts_with(SSE_PREFIX)
        || req.header("accept").is_some_and(|v| {
            v.windows(17)
                .any(|w| w.eq_ignore_ascii_case(b"text/event-stream"))
        })
}

/// The id a reconnecting subscriber gives: `Last-Event-ID` (an event
/// stream's own), else `?since=`. An id that does not read is a 400 (the
/// text says why); a bare WebSocket, which could not tell what it missed,
/// must ask for ids on the wire first.
fn since(req: &Request, kind: Kind) -> Result<Option<MessageId>, BadSince> {
    let header = kind
        .is_sse()
        .then(|| req.header("last-event-id"))
        .flatten()
        .map(|v| String::from_utf8_lossy(v.trim_ascii()).into_owned())
        .filter(|v| !v.is_empty());
    let query = req.target.split_once('?').and_then(|(_, q)| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("since="))
            .map(str::to_owned)
    });
    let Some(given) = header.or(query) else {
        return Ok(None);
    };
    if kind == Kind::Ws {
        return Err(BadSince::NeedsIds);
    }
    given.parse().map(Some).map_err(BadSince::Id)
}

/// Why a reconnecting subscriber's id was refused (400); the text is the
/// answer's body.
#[derive(Debug, thiserror::Error)]
enum BadSince {
    /// A bare WebSocket subscriber gave an id: it could not tell what it
    /// missed without ids on the wire.
    #[error(
        "since= needs ids on the wire: offer the {} subprotocol (docs/clients.md)\n",
        gate::PROTOCOL_IDS
    )]
    NeedsIds,
    /// The id does not read.
    #[error("{0}\n")]
    Id(crate::history::BadId),
}

/// The head of an event stream, and its `retry:` hint. A browser page
/// from an allowed origin may read it (`Access-Control-Allow-Origin`).
fn sse_head(w: &Worker, req: &Request, out: &mut Vec<u8>) {
    let origin = req
        .header("origin")
        .filter(|_| gate::origin_allowed(w, req))
        .map(|o| String::from_utf8_lossy(o).into_owned());
    let mut headers = vec![
        ("Content-Type", "text/event-stream"),
        ("Cache-Control", "no-cache"),
        ("X-Accel-Buffering", "no"),
    ];
    if let Some(o) = &origin {
        headers.push(("Access-Control-Allow-Origin", o));
        headers.push(("Vary", "Origin"));
    }
    http::write_response_head(out, 200, &headers);
    throng_proto::sse::retry(out, SSE_RETRY_MS);
}
