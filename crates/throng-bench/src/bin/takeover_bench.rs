//! The takeover measurement of issue 28 (`scripts/bench-takeover.sh`): N
//! `throng.v1` subscribers, spread over subscriber processes (each opens
//! at most `--per-process`, from a source address of its own), on a
//! `throng serve --history` (embedded, or `--redis URL`); a publisher at a
//! steady rate and a prober connecting every 5 ms; then `serve --takeover`
//! on the same port. Every subscriber rejoins with `?since=` its last id
//! when closed. Printed (human lines, and one JSON object with `--json`):
//! refused probes, publishes refused and retried, messages lost after the
//! rejoins (and recoveries answered incomplete), rejoins per second, and
//! when the old process was gone.
//!
//! ```text
//! cargo build --release -p throng -p throng-bench
//! target/release/takeover_bench --throng target/release/throng --subs 10000 [--redis redis://127.0.0.1:6379]
//! ```
//!
//! A subscriber process is this binary with `--role subs`: it prints
//! `ready` once all of its subscribers are in, and after the driver's
//! `last N` on its stdin waits (up to 30 s) for each to have 0..=N, then
//! prints its tallies as one JSON line.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use throng_proto::{http, ws};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

struct Opts {
    throng: String,
    subs: usize,
    per_process: usize,
    pub_rate: f64,
    spread: String,
    workers: String,
    history: String,
    redis: Option<String>,
    json: bool,
    logdir: String,
    limit: Duration,
}

const USAGE: &str = "takeover_bench --throng PATH --subs N --per-process N --pub-rate PER_SEC \
     --spread DUR --workers N --history N [--redis URL] [--json] [--logdir DIR] [--limit SECS]";

fn opts(mut args: impl Iterator<Item = String>) -> Opts {
    let mut o = Opts {
        throng: "target/release/throng".into(),
        subs: 10_000,
        per_process: 15_000,
        pub_rate: 20.0,
        spread: "10s".into(),
        workers: "2".into(),
        history: "10000".into(),
        redis: None,
        json: false,
        logdir: "/tmp".into(),
        limit: Duration::from_secs(120),
    };
    while let Some(a) = args.next() {
        let mut v = || {
            args.next()
                .unwrap_or_else(|| panic!("{a} needs a value\n{USAGE}"))
        };
        let num = |s: String| {
            s.parse::<f64>()
                .unwrap_or_else(|_| panic!("{s}: a number\n{USAGE}"))
        };
        match a.as_str() {
            "--throng" => o.throng = v(),
            "--subs" => o.subs = num(v()) as usize,
            "--per-process" => o.per_process = (num(v()) as usize).clamp(1, 19_000),
            "--pub-rate" => o.pub_rate = num(v()).max(0.1),
            "--spread" => o.spread = v(),
            "--workers" => o.workers = v(),
            "--history" => o.history = v(),
            "--redis" => o.redis = Some(v()),
            "--json" => o.json = true,
            "--logdir" => o.logdir = v(),
            "--limit" => o.limit = Duration::from_secs_f64(num(v())),
            _ => panic!("unknown argument {a}\n{USAGE}"),
        }
    }
    o
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn main() {
    let _ = throng_host::limits::raise_nofile();
    let mut args = std::env::args().skip(1).peekable();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    if args.peek().map(String::as_str) == Some("--role") {
        let a: Vec<String> = args.collect();
        let get = |k: &str| {
            let i = a
                .iter()
                .position(|x| x == k)
                .unwrap_or_else(|| panic!("{k}"));
            a[i + 1].clone()
        };
        let addr: SocketAddr = get("--addr").parse().expect("--addr");
        let n: usize = get("--subs").parse().expect("--subs");
        let source: IpAddr = get("--source").parse().expect("--source");
        let t0: u64 = get("--t0").parse().expect("--t0");
        local.block_on(&rt, subs_role(addr, n, source, t0));
    } else {
        local.block_on(&rt, drive(opts(args)));
    }
}

// ---- the subscriber processes ----

/// One subscriber process's tallies.
#[derive(Default)]
struct Tally {
    /// Per subscriber: the payload numbers it got, as bits.
    seen: RefCell<Vec<Vec<u64>>>,
    connected: Cell<usize>,
    rejoins: RefCell<BTreeMap<u64, u64>>,
    failed: RefCell<BTreeMap<String, u64>>,
    closes: RefCell<BTreeMap<u16, u64>>,
    incomplete: Cell<u64>,
    duplicates: Cell<u64>,
    /// Upgrades in flight at once: a process that asks for thousands at
    /// the same instant meets full accept queues and handshake timeouts,
    /// which would measure its own haste, not the takeover.
    upgrading: Upgrading,
}

/// Upgrades one subscriber process has in flight at most.
const UPGRADING: usize = 256;

struct Upgrading(tokio::sync::Semaphore);

impl Default for Upgrading {
    fn default() -> Self {
        Self(tokio::sync::Semaphore::new(UPGRADING))
    }
}

impl Tally {
    fn mark(&self, sub: usize, n: u64) {
        let mut seen = self.seen.borrow_mut();
        let bits = &mut seen[sub];
        let (w, b) = ((n / 64) as usize, n % 64);
        if bits.len() <= w {
            bits.resize(w + 1, 0);
        }
        if bits[w] & (1 << b) != 0 {
            self.duplicates.set(self.duplicates.get() + 1);
        }
        bits[w] |= 1 << b;
    }

    fn has(&self, sub: usize, n: u64) -> bool {
        let seen = self.seen.borrow();
        let w = (n / 64) as usize;
        seen[sub].get(w).is_some_and(|x| x & (1 << (n % 64)) != 0)
    }

    fn missing(&self, sub: usize, last: Option<u64>) -> u64 {
        last.map_or(0, |l| (0..=l).filter(|&n| !self.has(sub, n)).count() as u64)
    }

    fn fail(&self, why: String) {
        *self.failed.borrow_mut().entry(why).or_default() += 1;
    }
}

async fn subs_role(addr: SocketAddr, n: usize, source: IpAddr, t0: u64) {
    let tally = Rc::new(Tally::default());
    *tally.seen.borrow_mut() = vec![Vec::new(); n];
    for i in 0..n {
        tokio::task::spawn_local(subscriber(addr, source, i, tally.clone(), t0));
        if i % 256 == 255 {
            // Let the first ones in before the next batch: no SYN flood.
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    while tally.connected.get() < n {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("ready");
    let last = read_last().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && (0..n).any(|s| tally.missing(s, last) > 0) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lost: u64 = (0..n).map(|s| tally.missing(s, last)).sum();
    let lost_subs = (0..n).filter(|&s| tally.missing(s, last) > 0).count();
    let out = serde_json::json!({
        "subscribers": n,
        "lost": lost,
        "subscribers_missing_some": lost_subs,
        "incomplete": tally.incomplete.get(),
        "duplicates": tally.duplicates.get(),
        "rejoins_per_second": *tally.rejoins.borrow(),
        "failed_rejoins": *tally.failed.borrow(),
        "closes": *tally.closes.borrow(),
    });
    println!("{out}");
    std::process::exit(0);
}

/// The driver's `last N` (None: it published nothing).
async fn read_last() -> Option<u64> {
    let line = tokio::task::spawn_blocking(|| {
        let mut l = String::new();
        let _ = std::io::stdin().lock().read_line(&mut l);
        l
    })
    .await
    .unwrap_or_default();
    line.trim().strip_prefix("last ")?.parse().ok()
}

/// One subscriber for the whole run: subscribes, and after every close
/// (or failure) rejoins with `?since=` the last id it saw.
async fn subscriber(addr: SocketAddr, source: IpAddr, i: usize, tally: Rc<Tally>, t0: u64) {
    let mut since: Option<String> = None;
    let mut joined = false;
    loop {
        if let Err(why) = session(addr, source, i, &tally, &mut since, &mut joined, t0).await {
            tally.fail(why);
            tokio::time::sleep(Duration::from_millis(100 + fastrand::u64(..200))).await;
        }
    }
}

/// One connection: upgrade, read until the server's close (answered, and
/// its end awaited so the server closes first); Err: why it broke.
async fn session(
    addr: SocketAddr,
    source: IpAddr,
    i: usize,
    tally: &Tally,
    since: &mut Option<String>,
    joined: &mut bool,
    t0: u64,
) -> Result<(), String> {
    let turn = tally.upgrading.0.acquire().await;
    let (mut s, mut buf) = upgrade(addr, source, since.as_deref()).await?;
    drop(turn);
    if *joined {
        // A rejoin, counted by the second it got in.
        let sec = unix_ms().saturating_sub(t0) / 1000;
        *tally.rejoins.borrow_mut().entry(sec).or_default() += 1;
    } else {
        *joined = true;
        tally.connected.set(tally.connected.get() + 1);
    }
    let mut dec = ws::Decoder::new(ws::Role::Client, 1 << 20);
    loop {
        let mut pos = 0;
        while let Some(d) = dec
            .decode(&mut buf[pos..])
            .map_err(|e| format!("frames: {e}"))?
        {
            pos += d.consumed;
            match d.frame {
                Some(ws::Frame::Text(t)) => {
                    if t.starts_with(b"!incomplete") {
                        tally.incomplete.set(tally.incomplete.get() + 1);
                        continue;
                    }
                    let text = String::from_utf8_lossy(t);
                    let (id, body) = text.split_once('\n').ok_or("a message without an id")?;
                    *since = Some(id.to_owned());
                    let n = body.parse().map_err(|_| "a payload not a number")?;
                    tally.mark(i, n);
                }
                Some(ws::Frame::Ping(p)) => {
                    let mut out = Vec::new();
                    ws::encode_into(&mut out, true, ws::OpCode::Pong, p, Some(mask()));
                    s.write_all(&out).await.map_err(|e| format!("pong: {e}"))?;
                }
                Some(ws::Frame::Close { code, .. }) => {
                    *tally
                        .closes
                        .borrow_mut()
                        .entry(code.unwrap_or(0))
                        .or_default() += 1;
                    let mut out = Vec::new();
                    let payload = code.unwrap_or(1000).to_be_bytes();
                    ws::encode_into(&mut out, true, ws::OpCode::Close, &payload, Some(mask()));
                    let _ = s.write_all(&out).await;
                    let mut rest = [0u8; 1024];
                    let end = tokio::time::timeout(Duration::from_secs(2), s.read(&mut rest));
                    let _ = end.await;
                    return Ok(());
                }
                _ => {}
            }
        }
        buf.drain(..pos);
        match s.read_buf(&mut buf).await {
            Ok(0) => return Err("closed without a close frame".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("read: {}", e.kind())),
        }
    }
}

fn mask() -> [u8; 4] {
    fastrand::u32(..).to_le_bytes()
}

/// Leaves the port to `connect` (`IP_BIND_ADDRESS_NO_PORT`), which needs
/// only the whole address pair to be new: a port `bind` picks must be
/// free of every socket of the source address, the last run's thousands
/// in TIME_WAIT included, and finding one gets slow, then fails.
fn no_port_at_bind(sock: &TcpSocket) {
    use std::os::fd::AsRawFd as _;
    let one: libc::c_int = 1;
    // SAFETY: a live socket, and an int option of its size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Connects from `source` and upgrades to `/feed` as `throng.v1`.
async fn upgrade(
    addr: SocketAddr,
    source: IpAddr,
    since: Option<&str>,
) -> Result<(TcpStream, Vec<u8>), String> {
    let sock = TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
    no_port_at_bind(&sock);
    sock.bind(SocketAddr::new(source, 0))
        .map_err(|e| format!("bind: {}", e.kind()))?;
    let mut s = sock
        .connect(addr)
        .await
        .map_err(|e| format!("connect: {}", e.kind()))?;
    let key = ws::client_key(fastrand::u128(..).to_le_bytes());
    let query = since.map_or(String::new(), |s| format!("?since={s}"));
    let req = format!(
        "GET /feed{query} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: throng.v1\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("upgrade: {}", e.kind()))?;
    let mut buf = Vec::with_capacity(4096);
    loop {
        match s.read_buf(&mut buf).await {
            Ok(0) => return Err("closed before the upgrade's answer".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("upgrade: {}", e.kind())),
        }
        if let Some((resp, used)) =
            http::parse_response(&buf, http::MAX_HEAD).map_err(|e| format!("answer: {e}"))?
        {
            ws::client_verify(&resp, &key).map_err(|e| format!("upgrade refused: {e}"))?;
            buf.drain(..used);
            return Ok((s, buf));
        }
    }
}

// ---- the driver ----

/// The publisher's and the prober's tallies.
#[derive(Default)]
struct Side {
    sent: Cell<Option<u64>>,
    refused_publishes: Cell<u64>,
    probes: Cell<u64>,
    refused: Cell<u64>,
    /// Why probes failed: connect, reset, no answer...
    refused_why: RefCell<BTreeMap<String, u64>>,
    stop: Cell<bool>,
}

/// Publishes 0, 1, ... at `rate` per second, each on a new connection
/// and again until a serve takes it (a refusal is counted, never skipped).
async fn publisher(addr: SocketAddr, rate: f64, side: Rc<Side>) {
    let every = Duration::from_secs_f64(1.0 / rate);
    let mut n = 0u64;
    let mut next = tokio::time::Instant::now();
    while !side.stop.get() {
        match publish(addr, n).await {
            Ok(()) => {
                side.sent.set(Some(n));
                n += 1;
            }
            Err(()) => side.refused_publishes.set(side.refused_publishes.get() + 1),
        }
        next += every;
        tokio::time::sleep_until(next).await;
    }
}

async fn publish(addr: SocketAddr, n: u64) -> Result<(), ()> {
    let ask = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        let body = n.to_string();
        let mut out = Vec::new();
        let host = addr.to_string();
        let headers: [(&str, &[u8]); 2] = [("Host", host.as_bytes()), ("Connection", b"close")];
        http::write_request(&mut out, "POST", "/publish/feed", &headers, body.as_bytes());
        s.write_all(&out).await.ok()?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await.ok()?;
        Some(resp.starts_with(b"HTTP/1.1 200"))
    };
    match tokio::time::timeout(Duration::from_secs(5), ask).await {
        Ok(Some(true)) => Ok(()),
        _ => Err(()),
    }
}

/// Connects and asks `/healthz` every 5 ms; counts what was refused,
/// reset or not answered.
async fn prober(addr: SocketAddr, side: Rc<Side>) {
    while !side.stop.get() {
        side.probes.set(side.probes.get() + 1);
        let ask = async {
            let mut s = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connect: {}", e.kind()))?;
            let req = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            s.write_all(req.as_bytes())
                .await
                .map_err(|e| format!("write: {}", e.kind()))?;
            let mut resp = Vec::new();
            s.read_to_end(&mut resp)
                .await
                .map_err(|e| format!("read: {}", e.kind()))?;
            if resp.starts_with(b"HTTP/1.1 ") {
                Ok(())
            } else {
                Err(format!("answered {} bytes, not HTTP", resp.len()))
            }
        };
        let why = match tokio::time::timeout(Duration::from_secs(5), ask).await {
            Ok(Ok(())) => None,
            Ok(Err(why)) => Some(why),
            Err(_) => Some("no answer within 5 s".to_owned()),
        };
        if let Some(why) = why {
            side.refused.set(side.refused.get() + 1);
            *side.refused_why.borrow_mut().entry(why).or_default() += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts a serve on `port` with the run's options (and `extra`); its
/// log goes to `<logdir>/takeover-<name>.log`.
fn serve(o: &Opts, port: u16, name: &str, extra: &[&str]) -> Child {
    let log = std::fs::File::create(format!("{}/takeover-{name}.log", o.logdir)).expect("log file");
    let listen = format!("127.0.0.1:{port}");
    let mut c = Command::new(&o.throng);
    c.args(["serve", "--listen", &listen, "--workers", &o.workers])
        .args(["--history", &o.history, "--drain-spread", &o.spread])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log);
    if let Some(r) = &o.redis {
        c.args(["--redis", r]);
    }
    c.spawn()
        .expect("start throng serve (cargo build --release -p throng)")
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    l.local_addr().expect("its address").port()
}

/// The subscriber processes: `n` subscribers over processes of at most
/// `per`, each from its own source address 127.0.0.(2+k).
fn spawn_subs(o: &Opts, addr: SocketAddr, t0: u64) -> Vec<Child> {
    let me = std::env::current_exe().expect("this binary");
    let k = o.subs.div_ceil(o.per_process);
    (0..k)
        .map(|j| {
            let n = o.subs / k + usize::from(j < o.subs % k);
            Command::new(&me)
                .args(["--role", "subs", "--addr", &addr.to_string()])
                .args(["--subs", &n.to_string(), "--t0", &t0.to_string()])
                .args(["--source", &format!("127.0.0.{}", 2 + j)])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("a subscriber process")
        })
        .collect()
}

/// Waits for `child` to exit, up to `limit`; whether it did.
async fn exited(child: &mut Child, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if child.try_wait().ok().flatten().is_some() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

async fn drive(o: Opts) {
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut old = serve(&o, port, "old", &[]);
    let up = Instant::now();
    while publish_probe(addr).await.is_err() {
        let log = format!("{}/takeover-old.log", o.logdir);
        if let Ok(Some(status)) = old.try_wait() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("the serve exited ({status}) before it listened:\n{log}");
        }
        assert!(
            up.elapsed() < Duration::from_secs(30),
            "the serve did not start: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t_open = Instant::now();
    let t0 = unix_ms();
    let mut subs = spawn_subs(&o, addr, t0);
    let outs: Vec<_> = subs
        .iter_mut()
        .map(|c| c.stdout.take().expect("stdout"))
        .collect();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for out in outs {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    let mut ready = 0;
    while ready < subs.len() {
        let line = tokio::time::timeout(o.limit, rx.recv()).await;
        match line {
            Ok(Some(l)) if l == "ready" => ready += 1,
            Ok(Some(_)) => {}
            _ => panic!("the subscribers did not all connect within {:?}", o.limit),
        }
    }
    let opened = t_open.elapsed();
    let side = Rc::new(Side::default());
    tokio::task::spawn_local(publisher(addr, o.pub_rate, side.clone()));
    tokio::task::spawn_local(prober(addr, side.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t1 = Instant::now();
    let since_t0 = unix_ms().saturating_sub(t0) / 1000;
    let mut new = serve(&o, port, "new", &["--takeover"]);
    let gone = exited(&mut old, o.limit).await;
    let old_gone = t1.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    side.stop.set(true);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let last = side.sent.get();
    let mut results = Vec::new();
    for c in &mut subs {
        let mut stdin = c.stdin.take().expect("stdin");
        let line = last.map_or("last none\n".to_owned(), |l| format!("last {l}\n"));
        let _ = stdin.write_all(line.as_bytes());
    }
    while results.len() < subs.len() {
        match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Ok(Some(l)) if l.starts_with('{') => {
                results.push(serde_json::from_str::<serde_json::Value>(&l).expect("tallies"));
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    for c in &mut subs {
        let _ = c.kill();
        let _ = c.wait();
    }
    stop(&mut new);
    if !gone {
        stop(&mut old);
    }
    let run = Run {
        o: &o,
        opened,
        side: &side,
        results,
        old_gone: gone.then_some(old_gone),
        takeover_at: since_t0,
    };
    run.print();
}

async fn publish_probe(addr: SocketAddr) -> Result<(), ()> {
    let s = TcpStream::connect(addr).await.map_err(|_| ())?;
    drop(s);
    Ok(())
}

fn stop(c: &mut Child) {
    let _ = throng_host::process::signal(c.id(), throng_host::process::Signal::Term);
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        if c.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// What a run measured, to print.
struct Run<'a> {
    o: &'a Opts,
    opened: Duration,
    side: &'a Side,
    results: Vec<serde_json::Value>,
    old_gone: Option<Duration>,
    /// Seconds from the subscribers' start to the takeover.
    takeover_at: u64,
}

impl Run<'_> {
    fn sum(&self, key: &str) -> u64 {
        self.results
            .iter()
            .map(|r| r[key].as_u64().unwrap_or(0))
            .sum()
    }

    /// A map of counts summed over the subscriber processes.
    fn merged(&self, key: &str) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for r in &self.results {
            for (k, v) in r[key].as_object().into_iter().flatten() {
                *m.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
            }
        }
        m
    }

    fn print(&self) {
        let o = self.o;
        let published = self.side.sent.get().map_or(0, |l| l + 1);
        // Rejoins by second after the takeover started.
        let mut per: BTreeMap<i64, u64> = BTreeMap::new();
        for (k, v) in self.merged("rejoins_per_second") {
            let s = k.parse::<i64>().unwrap_or(0) - self.takeover_at as i64;
            *per.entry(s).or_default() += v;
        }
        let broker = if o.redis.is_some() {
            "redis"
        } else {
            "embedded"
        };
        let reported = self.results.len();
        let procs = o.subs.div_ceil(o.per_process);
        println!(
            "N={} over {procs} subscriber processes, broker={broker}, --history {}, --workers {}, \
             --drain-spread {}, publisher {}/s",
            o.subs, o.history, o.workers, o.spread, o.pub_rate
        );
        println!(
            "subscribers: {} opened in {:.1} s",
            o.subs,
            self.opened.as_secs_f64()
        );
        println!(
            "refused connections: {} of {} probes; publishes refused and sent again: {}",
            self.side.refused.get(),
            self.side.probes.get(),
            self.side.refused_publishes.get()
        );
        println!(
            "messages published: {published}; lost after ?since= rejoin: {} (subscribers missing \
             any: {}; recoveries answered incomplete: {}; duplicates: {}; {reported} of {procs} \
             processes reported)",
            self.sum("lost"),
            self.sum("subscribers_missing_some"),
            self.sum("incomplete"),
            self.sum("duplicates"),
        );
        let why = self.side.refused_why.borrow();
        if !why.is_empty() {
            println!("why probes failed: {why:?}");
        }
        println!("close codes: {:?}", self.merged("closes"));
        let failed = self.merged("failed_rejoins");
        if !failed.is_empty() {
            println!("failed connects (retried): {failed:?}");
        }
        match self.old_gone {
            Some(d) => println!(
                "old process gone {:.1} s after the takeover started",
                d.as_secs_f64()
            ),
            None => println!("old process STILL RUNNING after {:?} (stopped)", o.limit),
        }
        let line: Vec<String> = per.iter().map(|(s, n)| format!("{s}s:{n}")).collect();
        println!("rejoins per second after the takeover: {}", line.join(" "));
        if o.json {
            let json = serde_json::json!({
                "subscribers": o.subs,
                "subscriber_processes": procs,
                "processes_reported": reported,
                "broker": broker,
                "history": o.history,
                "workers": o.workers,
                "drain_spread": o.spread,
                "publish_rate": o.pub_rate,
                "open_seconds": self.opened.as_secs_f64(),
                "probes": self.side.probes.get(),
                "refused_connections": self.side.refused.get(),
                "refused_why": *self.side.refused_why.borrow(),
                "publishes_refused": self.side.refused_publishes.get(),
                "messages_published": published,
                "lost": self.sum("lost"),
                "subscribers_missing_some": self.sum("subscribers_missing_some"),
                "recoveries_incomplete": self.sum("incomplete"),
                "duplicates": self.sum("duplicates"),
                "close_codes": self.merged("closes"),
                "failed_connects": failed,
                "old_gone_seconds": self.old_gone.map(|d| d.as_secs_f64()),
                // [second after the takeover, rejoins], in time order.
                "rejoins_per_second": per.iter().map(|(s, n)| [*s, *n as i64]).collect::<Vec<_>>(),
                "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
            });
            println!("{json}");
        }
    }
}
