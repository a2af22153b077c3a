//! The TLS client of `scripts/bench-tls.sh` (issue 7): the same client for
//! `throng serve` and for HAProxy terminating TLS, so their figures compare.
//!
//! ```text
//! tls_bench idle       --target A --conns N --pid P [--state S | --ws] [--plain] [--publish A --rounds R --payload B]
//! tls_bench handshakes --target A --secs S --threads T
//! tls_bench requests   --target A --secs S --threads T
//! ```
//!
//! - `idle`: opens N connections (TLS unless `--plain`), each doing its
//!   handshake and then, by `--state`: nothing (`waiting`: a connection
//!   waiting for its first request), one keep-alive `GET /healthz` (`kept`,
//!   the default), a WebSocket upgrade on `/bench` (`ws`, or `--ws`), or
//!   an event stream of `/sse/bench` (`sse`); and holds them idle; prints the RSS of
//!   process P before and after, per connection. With `--publish` (throng's
//!   plain listener) it then publishes R messages of B bytes and reports the
//!   server's fan-out CPU per delivered frame (from `/metrics`), and checks
//!   that every subscriber got every frame, in order.
//! - `handshakes`: T threads each loop: connect, full handshake (no
//!   resumption), `GET /healthz` with `Connection: close`, read the answer,
//!   close; prints new connections per second.
//! - `requests`: T keep-alive TLS connections each loop `GET /healthz`;
//!   prints requests per second.
//!
//! The client trusts any certificate and checks no signature, so nearly all
//! CPU spent on crypto is the server's. Every loop is bounded by `--secs`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustls::{ClientConnection, StreamOwned};
use rustls_pki_types::ServerName;
use throng_proto::{http, ws};

use throng_client::trust::AnyCertificate;

#[derive(Clone)]
struct Opts {
    mode: String,
    target: SocketAddr,
    conns: usize,
    pid: u32,
    state: State,
    plain: bool,
    publish: Option<SocketAddr>,
    rounds: usize,
    payload: usize,
    secs: f64,
    threads: usize,
}

fn opts() -> Opts {
    let mut args = std::env::args().skip(1);
    let mode = args.next().expect("mode: idle, handshakes or requests");
    let mut o = Opts {
        mode,
        target: SocketAddr::from(([127, 0, 0, 1], 8443)),
        conns: 1000,
        pid: 0,
        state: State::Kept,
        plain: false,
        publish: None,
        rounds: 10,
        payload: 64,
        secs: 5.0,
        threads: 4,
    };
    while let Some(a) = args.next() {
        let mut v = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--target" => o.target = v().parse().expect("--target HOST:PORT"),
            "--conns" => o.conns = v().parse().expect("--conns N"),
            "--pid" => o.pid = v().parse().expect("--pid PID"),
            "--ws" => o.state = State::Ws,
            "--state" => {
                let s = v();
                o.state = State::named(&s)
                    .unwrap_or_else(|| panic!("--state is waiting, kept, ws or sse, not {s}"));
            }
            "--plain" => o.plain = true,
            "--publish" => o.publish = Some(v().parse().expect("--publish HOST:PORT")),
            "--rounds" => o.rounds = v().parse().expect("--rounds N"),
            "--payload" => o.payload = v().parse().expect("--payload BYTES"),
            "--secs" => o.secs = v().parse().expect("--secs S"),
            "--threads" => o.threads = v().parse().expect("--threads N"),
            _ => panic!("unknown argument {a}"),
        }
    }
    o
}

/// What an idle connection of `idle` has done after its handshake.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Nothing: the server waits for its first request.
    Waiting,
    /// One keep-alive request answered: the server waits for the next.
    Kept,
    /// A WebSocket subscriber.
    Ws,
    /// A Server-Sent Events subscriber.
    Sse,
}

impl State {
    /// The state `--state` names.
    fn named(s: &str) -> Option<Self> {
        Some(match s {
            "waiting" => Self::Waiting,
            "kept" => Self::Kept,
            "ws" => Self::Ws,
            "sse" => Self::Sse,
            _ => return None,
        })
    }
}

fn client_config() -> Arc<rustls::ClientConfig> {
    let provider = rustls::crypto::ring::default_provider();
    let trust_all = AnyCertificate::unchecked(provider.signature_verification_algorithms);
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(trust_all))
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    c.resumption = rustls::client::Resumption::disabled();
    Arc::new(c)
}

/// A TCP connection from a spread source address (127.0.0.2-201), so
/// that many connections and closes do not run out of ephemeral ports.
fn connect(target: SocketAddr, i: usize) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    let src = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 2 + (i % 200) as u8), 0));
    s.bind(&src.into())?;
    s.connect(&target.into())?;
    s.set_nodelay(true)?;
    // Abortive close: no TIME_WAIT left behind by the handshake loop.
    s.set_linger(Some(Duration::ZERO))?;
    Ok(s.into())
}

enum Held {
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
    Plain(TcpStream),
}

impl Read for Held {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Tls(s) => s.read(b),
            Self::Plain(s) => s.read(b),
        }
    }
}

impl Write for Held {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Tls(s) => s.write(b),
            Self::Plain(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Tls(s) => s.flush(),
            Self::Plain(s) => s.flush(),
        }
    }
}

fn open(o: &Opts, cfg: &Arc<rustls::ClientConfig>, i: usize) -> std::io::Result<Held> {
    let tcp = connect(o.target, i)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    if o.plain {
        return Ok(Held::Plain(tcp));
    }
    let name = ServerName::try_from("localhost").expect("name");
    let conn = ClientConnection::new(cfg.clone(), name).map_err(std::io::Error::other)?;
    let mut s = StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(Held::Tls(Box::new(s)))
}

/// Reads one HTTP response (head and Content-Length body) from `s`.
fn read_response(s: &mut Held, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some((resp, used))) = http::parse_response(buf, http::MAX_HEAD) {
            let len: usize = resp
                .header("content-length")
                .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= used + len {
                buf.drain(..used + len);
                return Ok(resp.status);
            }
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn request(s: &mut Held, path: &str, close: bool, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    let conn = if close { "close" } else { "keep-alive" };
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: {conn}\r\n\r\n");
    s.write_all(req.as_bytes())?;
    s.flush()?;
    read_response(s, buf)
}

fn upgrade(s: &mut Held) -> std::io::Result<()> {
    let key = ws::client_key(fastrand::u128(..).to_le_bytes());
    let mut out = Vec::new();
    ws::write_upgrade_request(&mut out, "localhost", "/bench", &key);
    s.write_all(&out)?;
    s.flush()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some((resp, used)) =
            http::parse_response(&buf, http::MAX_HEAD).map_err(std::io::Error::other)?
        {
            ws::client_verify(&resp, &key).map_err(std::io::Error::other)?;
            if used != buf.len() {
                return Err(std::io::Error::other("bytes after the upgrade"));
            }
            return Ok(());
        }
    }
}

/// Opens an event stream on `/sse/bench`: the response head and the
/// `retry:` hint that follows it. Returns the status.
fn subscribe_sse(s: &mut Held, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    s.write_all(b"GET /sse/bench HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
    s.flush()?;
    let mut chunk = [0u8; 1024];
    loop {
        if let Some((resp, used)) =
            http::parse_response(buf, http::MAX_HEAD).map_err(std::io::Error::other)?
        {
            // The head and the retry hint ("retry: N\n\n") after it.
            if resp.status != 200 || buf[used..].ends_with(b"\n\n") {
                buf.clear();
                return Ok(resp.status);
            }
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// A plain HTTP request to throng's plain listener; returns the body.
fn plain_http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the plain listener");
    let mut out = Vec::new();
    http::write_request(
        &mut out,
        method,
        path,
        &[("Host", b"x"), ("Connection", b"close")],
        body,
    );
    s.write_all(&out).expect("request");
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let used = http::parse_response(&resp, http::MAX_HEAD)
        .ok()
        .flatten()
        .map_or(0, |(_, u)| u);
    String::from_utf8_lossy(&resp[used..]).into_owned()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l.as_bytes().get(name.len()) == Some(&b' '))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn idle(o: &Opts) -> serde_json::Value {
    let cfg = client_config();
    let rss0 = rss_kib(o.pid);
    let t = Instant::now();
    let failed = AtomicU64::new(0);
    let per = o.conns.div_ceil(o.threads);
    let mut held: Vec<Held> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..o.threads)
            .map(|k| {
                let (cfg, failed) = (&cfg, &failed);
                sc.spawn(move || {
                    let mut mine = Vec::new();
                    let mut buf = Vec::new();
                    for i in k * per..((k + 1) * per).min(o.conns) {
                        let r = open(o, cfg, i).and_then(|mut s| {
                            let st = match o.state {
                                State::Waiting => 200,
                                State::Ws => upgrade(&mut s).map(|()| 200)?,
                                State::Kept => request(&mut s, "/healthz", false, &mut buf)?,
                                State::Sse => subscribe_sse(&mut s, &mut buf)?,
                            };
                            if st != 200 {
                                return Err(std::io::Error::other(format!("status {st}")));
                            }
                            Ok(s)
                        });
                        match r {
                            Ok(s) => mine.push(s),
                            Err(e) => {
                                if failed.fetch_add(1, Ordering::Relaxed) == 0 {
                                    eprintln!("connection {i} failed: {e}");
                                }
                            }
                        }
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("opener thread"))
            .collect()
    });
    let open_secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(3));
    let rss_n = rss_kib(o.pid);
    let n = held.len();
    let mut report = serde_json::json!({
        "mode": "idle",
        "tls": !o.plain,
        "websocket": o.state == State::Ws,
        "state": format!("{:?}", o.state).to_lowercase(),
        "connections": n,
        "failed": failed.load(Ordering::Relaxed),
        "open_seconds": open_secs,
        "pid": o.pid,
        "rss_kib_before": rss0,
        "rss_kib_after": rss_n,
        "user_bytes_per_conn": ((rss_n as f64 - rss0 as f64) * 1024.0 / n as f64).round(),
    });
    if let Some(publish) = o.publish {
        let before = plain_http(publish, "GET", "/metrics", b"");
        let payload = vec![b'x'; o.payload];
        let mut subscribers = Vec::new();
        for r in 0..o.rounds {
            let mut p = payload.clone();
            let tag = format!("{r:08}");
            p[..8].copy_from_slice(tag.as_bytes());
            let reply = plain_http(publish, "POST", "/publish/bench", &p);
            let v: serde_json::Value = serde_json::from_str(&reply).unwrap_or_default();
            subscribers.push(v["subscribers"].as_u64().unwrap_or(0));
            std::thread::sleep(Duration::from_millis(50));
        }
        let after = plain_http(publish, "GET", "/metrics", b"");
        let d = |name: &str| metric(&after, name) - metric(&before, name);
        let frames = d("throng_frames_delivered_total");
        let cpu = d("throng_fanout_cpu_seconds_total");
        let wall = d("throng_fanout_duration_seconds_sum");
        // Every subscriber: every frame, in order.
        let frame_len = ws::server_frame(ws::OpCode::Text, &payload).len();
        let mut missing = 0u64;
        let mut buf = vec![0u8; frame_len];
        for s in &mut held {
            for r in 0..o.rounds {
                let ok =
                    s.read_exact(&mut buf).is_ok() && buf[2..10] == *format!("{r:08}").as_bytes();
                if !ok {
                    missing += (o.rounds - r) as u64;
                    break;
                }
            }
        }
        report["rounds"] = o.rounds.into();
        report["payload_bytes"] = o.payload.into();
        report["subscribers_per_publish"] = subscribers.into();
        report["frames_delivered"] = frames.into();
        report["fanout_cpu_ns_per_frame"] = (cpu * 1e9 / frames).round().into();
        report["fanout_wall_ns_per_frame"] = (wall * 1e9 / frames).round().into();
        report["frames_missing_or_out_of_order"] = missing.into();
    }
    drop(held);
    report
}

/// CPU seconds this process has used (all threads).
fn own_cpu() -> f64 {
    throng_host::process::process_cpu().as_secs_f64()
}

/// Runs `work` on `--threads` threads for `--secs`; returns what they
/// completed and failed, the seconds taken, and this process's CPU seconds.
fn timed(
    o: &Opts,
    work: impl Fn(usize, &AtomicBool, &AtomicU64, &AtomicU64) + Sync,
) -> (u64, u64, f64, f64) {
    let cpu0 = own_cpu();
    let stop = AtomicBool::new(false);
    let (done, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let t = Instant::now();
    std::thread::scope(|sc| {
        for k in 0..o.threads {
            let (work, stop, done, failed) = (&work, &stop, &done, &failed);
            sc.spawn(move || work(k, stop, done, failed));
        }
        std::thread::sleep(Duration::from_secs_f64(o.secs));
        stop.store(true, Ordering::Relaxed);
    });
    (
        done.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        t.elapsed().as_secs_f64(),
        own_cpu() - cpu0,
    )
}

fn handshakes(o: &Opts) -> serde_json::Value {
    let cfg = client_config();
    // What the server chose, seen on the first connection.
    let chosen = OnceLock::<(String, String)>::new();
    let (done, failed, secs, cpu) = timed(o, |k, stop, done, failed| {
        let mut buf = Vec::new();
        let mut i = k;
        while !stop.load(Ordering::Relaxed) {
            i += o.threads;
            buf.clear();
            let opened = open(o, &cfg, i).inspect(|s| {
                if let (Held::Tls(s), None) = (s, chosen.get()) {
                    let name = |x: Option<String>| x.unwrap_or_default();
                    let _ = chosen.set((
                        name(
                            s.conn
                                .negotiated_cipher_suite()
                                .map(|c| format!("{:?}", c.suite())),
                        ),
                        name(
                            s.conn
                                .negotiated_key_exchange_group()
                                .map(|g| format!("{:?}", g.name())),
                        ),
                    ));
                }
            });
            match opened.and_then(|mut s| request(&mut s, "/healthz", true, &mut buf)) {
                Ok(200) => done.fetch_add(1, Ordering::Relaxed),
                Ok(_) | Err(_) => failed.fetch_add(1, Ordering::Relaxed),
            };
        }
    });
    serde_json::json!({
        "mode": "handshakes",
        "target": o.target.to_string(),
        "threads": o.threads,
        "seconds": secs,
        "completed": done,
        "failed": failed,
        "handshakes_per_sec": (done as f64 / secs).round(),
        "client_cpu_seconds": (cpu * 100.0).round() / 100.0,
        "cipher_suite": chosen.get().map(|c| c.0.clone()),
        "key_exchange": chosen.get().map(|c| c.1.clone()),
    })
}

fn requests(o: &Opts) -> serde_json::Value {
    let cfg = client_config();
    let (done, failed, secs, cpu) = timed(o, |k, stop, done, failed| {
        let mut buf = Vec::new();
        let Ok(mut s) = open(o, &cfg, k) else {
            failed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        while !stop.load(Ordering::Relaxed) {
            match request(&mut s, "/healthz", false, &mut buf) {
                Ok(200) => done.fetch_add(1, Ordering::Relaxed),
                _ => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
        }
    });
    serde_json::json!({
        "mode": "requests",
        "target": o.target.to_string(),
        "connections": o.threads,
        "seconds": secs,
        "completed": done,
        "failed": failed,
        "requests_per_sec": (done as f64 / secs).round(),
        "client_cpu_seconds": (cpu * 100.0).round() / 100.0,
    })
}

fn main() {
    let o = opts();
    let _ = throng_host::limits::raise_nofile();
    let report = match o.mode.as_str() {
        "idle" => idle(&o),
        "handshakes" => handshakes(&o),
        "requests" => requests(&o),
        m => panic!("unknown mode {m} (idle, handshakes, requests)"),
    };
    println!("{report}");
}
