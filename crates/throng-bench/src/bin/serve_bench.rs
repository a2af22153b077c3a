//! The committed benchmark of `throng serve` on one machine (issue 2):
//!
//! 1. user-space memory per idle subscriber: worker RSS with N subscribers
//!    minus RSS at 0, over N; and from N/2 to N (`user_bytes_per_more_conn`),
//!    which leaves out what the connect phase's peak left in the heap;
//! 2. fan-out of one 64-byte message to all N: worker CPU per delivered
//!    frame against a bare loop of the same socket write of the same frame
//!    to the same sockets in the same run (the server's benchmark-only
//!    `/bench/floor`, on with `--bench-floor`: `--throng` must name a binary
//!    built with `--features bench-floor`, as `scripts/bench-serve.sh`
//!    builds it; `serve` as shipped has no such route), and the
//!    time from the publish request to its reply (sent after the last
//!    frame is written);
//! 3. accepted upgrades per second;
//! 4. kernel memory per connection (`/proc/meminfo`, `/proc/net/sockstat`).
//!
//! `--kind sse` holds Server-Sent Events subscribers (`GET /sse/bench`)
//! instead of WebSocket ones: the same figures, for issue 18's "an idle SSE
//! subscriber costs about what an idle WebSocket subscriber does".
//!
//! `--channels N` holds connections of several channels instead
//! (docs/channels.md: `throng.v1` at `/?channel=bench&channel=o1..`, N in
//! all, the other N-1 shared by every subscriber): what each further
//! channel costs an idle connection, and the fan-out CPU per delivery to
//! a channel whose subscribers hold others too (`scripts/bench-channels.sh`
//! runs 1, 3 and 10 against today's one-channel URL). The bare write loop
//! reaches one-channel subscribers only, so it is not run then.
//!
//! `--deflate` offers permessage-deflate on every upgrade (and starts the
//! server with `--ws-deflate`): memory per idle compressed subscriber and
//! fan-out CPU per compressed delivery, the same figures as without
//! (`scripts/bench-deflate.sh` runs both in turns). The bare write loop
//! writes uncompressed frames, so it is not run then; the payload, with or
//! without, is JSON-like text (`--payload` bytes) that compresses as such
//! messages do, not a run of one byte.
//!
//! A WebSocket subscriber's deliveries are counted by frame (headers read
//! off the stream, with the frames that came compressed), not by byte
//! length, so a compressed frame, whose length the client cannot know
//! beforehand, is checked as well as a plain one.
//!
//! `--serve-arg ARG` (repeated) passes more options to the server, and
//! `--token JWT` sends every upgrade with `?token=JWT` and every publish
//! with `Authorization: Bearer JWT`: `scripts/bench-auth.sh` runs the same
//! figures with tokens and without.
//!
//! This process is the client: it holds every subscriber itself (stay under
//! the 20,000-file limit) and starts the server as a separate process with
//! one worker. Its subscriber sockets sit in no epoll while a message fans
//! out (see [`Held`]) and are drained and checked (one whole frame each)
//! after every publish.
//!
//! ```text
//! cargo build --release -p throng && cargo run --release -p throng-bench --bin serve_bench -- \
//!     --throng target/release/throng --conns 18000 --rounds 15
//! ```

use std::cell::{Cell, RefCell};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use throng_bench::served::{self, cpu_ticks, request, request_as};
use throng_proto::{http, ws};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

struct Opts {
    throng: String,
    conns: usize,
    rounds: usize,
    concurrency: usize,
    payload: usize,
    serve_args: Vec<String>,
    token: Option<String>,
    /// Hold SSE subscribers rather than WebSocket ones.
    sse: bool,
    /// Hold `throng.v1` connections of this many channels (0: the
    /// one-channel URL).
    channels: usize,
    /// Offer permessage-deflate (and serve with `--ws-deflate`).
    deflate: bool,
}

fn opts() -> Opts {
    let mut o = Opts {
        throng: "target/release/throng".into(),
        conns: 18_000,
        rounds: 15,
        concurrency: 200,
        payload: 64,
        serve_args: Vec::new(),
        token: None,
        sse: false,
        channels: 0,
        deflate: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut v = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--throng" => o.throng = v(),
            "--conns" => o.conns = v().parse().expect("--conns N"),
            "--rounds" => o.rounds = v().parse().expect("--rounds N"),
            "--concurrency" => o.concurrency = v().parse().expect("--concurrency N"),
            "--payload" => o.payload = v().parse().expect("--payload BYTES"),
            "--serve-arg" => o.serve_args.push(v()),
            "--token" => o.token = Some(v()),
            "--channels" => o.channels = v().parse().expect("--channels N"),
            "--deflate" => o.deflate = true,
            "--kind" => {
                o.sse = match v().as_str() {
                    "ws" => false,
                    "sse" => true,
                    k => panic!("--kind {k}: ws or sse"),
                };
            }
            _ => panic!(
                "unknown argument {a} (--throng PATH --conns N --rounds N --concurrency N --payload BYTES \
                 --serve-arg ARG --token JWT --kind ws|sse --channels N --deflate)"
            ),
        }
    }
    o
}

/// The subscribers this process holds: plain non-blocking sockets in no
/// epoll at all, so a fan-out wakes nobody here (on loopback the kernel
/// charges a woken reader's wake-up to the writer; real subscribers are on
/// other machines). They are drained by a read loop after each publish.
#[derive(Default)]
struct Held {
    socks: RefCell<Vec<std::net::TcpStream>>,
    /// Bytes received per socket since the last check.
    got: RefCell<Vec<u64>>,
    /// A WebSocket subscriber's bytes past its last whole frame (empty,
    /// costing nothing, between rounds).
    rest: RefCell<Vec<Vec<u8>>>,
    /// Whole frames read with RSV1 set (compressed), over every check.
    compressed: Cell<u64>,
    /// Whole frames read, and their bytes, over every check.
    frames: Cell<u64>,
    frame_bytes: Cell<u64>,
    closed: Cell<u64>,
}

/// The length of the WebSocket frame (from the server: unmasked) at the
/// start of `b`, and whether it is compressed; `None` until its header
/// and payload are all there.
fn whole_frame(b: &[u8]) -> Option<(usize, bool)> {
    let (&b0, &b1) = (b.first()?, b.get(1)?);
    let (len, head) = match b1 & 0x7f {
        126 => (u64::from(u16::from_be_bytes([*b.get(2)?, *b.get(3)?])), 4),
        127 => (u64::from_be_bytes(b.get(2..10)?.try_into().ok()?), 10),
        n => (u64::from(n), 2),
    };
    let total = head + usize::try_from(len).ok()?;
    (b.len() >= total).then_some((total, b0 & 0x40 != 0))
}

impl Held {
    /// Reads every socket until each has `per_sock` more bytes (or `limit`
    /// passes); returns how many sockets got exactly that.
    fn drain(&self, per_sock: u64, limit: Duration) -> usize {
        self.drain_by(per_sock, limit, |_, b| b.len() as u64)
    }

    /// Reads every socket until each has `per_sock` more whole WebSocket
    /// frames (or `limit` passes); returns how many got exactly that.
    fn drain_frames(&self, per_sock: u64, limit: Duration) -> usize {
        let mut rest = self.rest.borrow_mut();
        self.drain_by(per_sock, limit, |i, b| {
            let mine = &mut rest[i];
            mine.extend_from_slice(b);
            let (mut at, mut frames) = (0, 0);
            while let Some((n, z)) = whole_frame(&mine[at..]) {
                at += n;
                frames += 1;
                self.compressed.set(self.compressed.get() + u64::from(z));
                self.frames.set(self.frames.get() + 1);
                self.frame_bytes.set(self.frame_bytes.get() + n as u64);
            }
            mine.drain(..at);
            if mine.is_empty() {
                *mine = Vec::new();
            }
            frames
        })
    }

    /// Reads every socket until `add` (given the socket's index and what
    /// was read) has counted `per_sock` for each (or `limit` passes);
    /// returns how many counted exactly that.
    fn drain_by(
        &self,
        per_sock: u64,
        limit: Duration,
        mut add: impl FnMut(usize, &[u8]) -> u64,
    ) -> usize {
        let socks = self.socks.borrow();
        let mut got = self.got.borrow_mut();
        got.iter_mut().for_each(|g| *g = 0);
        let mut buf = [0u8; 4096];
        let start = Instant::now();
        let mut pending: Vec<usize> = (0..socks.len()).collect();
        while !pending.is_empty() && start.elapsed() < limit {
            pending.retain(|&i| {
                loop {
                    match io::Read::read(&mut &socks[i], &mut buf) {
                        Ok(0) => {
                            self.closed.set(self.closed.get() + 1);
                            return false;
                        }
                        Ok(n) => got[i] += add(i, &buf[..n]),
                        Err(_) => break,
                    }
                }
                got[i] < per_sock
            });
        }
        got.iter().filter(|&&g| g == per_sock).count()
    }
}

fn proc_field(path: &str, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    proc_field(&format!("/proc/{pid}/status"), "VmRSS:")
}

/// TCP `mem` (pages) and `inuse` from /proc/net/sockstat.
fn sockstat() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
    let line = s.lines().find(|l| l.starts_with("TCP:")).unwrap_or("");
    let f: Vec<&str> = line.split_whitespace().collect();
    let get = |k: &str| {
        f.iter()
            .position(|x| *x == k)
            .and_then(|i| f.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (get("mem"), get("inuse"))
}

fn meminfo() -> (u64, u64, u64) {
    let m = "/proc/meminfo";
    (
        proc_field(m, "MemAvailable:"),
        proc_field(m, "Slab:"),
        proc_field(m, "MemFree:"),
    )
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

async fn subscribe(
    addr: SocketAddr,
    src: Ipv4Addr,
    target: &str,
    (sse, deflate): (bool, bool),
    holder: Rc<Held>,
) -> io::Result<()> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::from((src, 0)))
        .map_err(|e| io::Error::other(format!("bind {src}: {e}")))?;
    let mut s = sock
        .connect(addr)
        .await
        .map_err(|e| io::Error::other(format!("connect: {e}")))?;
    if sse {
        return subscribe_sse(s, addr, target, holder).await;
    }
    let key = ws::client_key(fastrand::u128(..).to_le_bytes());
    let mut out = Vec::new();
    ws::write_upgrade_request(&mut out, &addr.to_string(), target, &key);
    if target.starts_with("/?") {
        // Several channels: the subprotocol that speaks them.
        out.truncate(out.len() - 2);
        out.extend_from_slice(b"Sec-WebSocket-Protocol: throng.v1\r\n\r\n");
    }
    if deflate {
        // What a browser offers.
        out.truncate(out.len() - 2);
        out.extend_from_slice(
            b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n",
        );
    }
    s.write_all(&out).await?;
    let mut buf = Vec::with_capacity(512);
    let used = loop {
        if s.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::other("closed during handshake"));
        }
        if let Some((resp, used)) =
            http::parse_response(&buf, http::MAX_HEAD).map_err(io::Error::other)?
        {
            ws::client_verify(&resp, &key).map_err(io::Error::other)?;
            let agreed = resp.headers.iter().any(|(k, v)| {
                k.eq_ignore_ascii_case("sec-websocket-extensions")
                    && v.starts_with(b"permessage-deflate")
            });
            if agreed != deflate {
                return Err(io::Error::other(format!(
                    "permessage-deflate offered: {deflate}, agreed: {agreed}"
                )));
            }
            break used;
        }
    };
    if buf.len() != used {
        return Err(io::Error::other("unexpected bytes after the upgrade"));
    }
    // Out of tokio's epoll: nothing in this process is woken by a fan-out.
    let std = s.into_std()?;
    holder.socks.borrow_mut().push(std);
    holder.got.borrow_mut().push(0);
    holder.rest.borrow_mut().push(Vec::new());
    Ok(())
}

/// An SSE subscriber on `/sse/<channel>`: the head and the `retry:` hint
/// read, then held like a WebSocket one.
async fn subscribe_sse(
    mut s: TcpStream,
    addr: SocketAddr,
    target: &str,
    holder: Rc<Held>,
) -> io::Result<()> {
    let target = format!("/sse{target}");
    let req = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::with_capacity(512);
    loop {
        if s.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::other("closed before the stream began"));
        }
        if let Some((resp, used)) =
            http::parse_response(&buf, http::MAX_HEAD).map_err(io::Error::other)?
        {
            if resp.status != 200 {
                return Err(io::Error::other(format!("status {}", resp.status)));
            }
            // The head, then one `retry:` line and an empty line.
            if buf[used..].ends_with(b"\n\n") {
                break;
            }
        }
    }
    let std = s.into_std()?;
    holder.socks.borrow_mut().push(std);
    holder.got.borrow_mut().push(0);
    Ok(())
}

fn main() {
    let o = opts();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&rt, bench(o));
}

async fn bench(o: Opts) {
    // A busy machine stretches wall times (not CPU per frame): say how busy.
    let load0 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // This process holds every subscriber: raise its own open-file limit.
    let _ = throng_host::limits::raise_nofile();
    let mut args = vec![
        "--workers",
        "1",
        "--ping-interval",
        // Heartbeat pings would land between the benchmark's frames.
        "10000h",
        "--bench-floor",
    ];
    if o.deflate {
        args.push("--ws-deflate");
    }
    args.extend(o.serve_args.iter().map(String::as_str));
    let (mut server, addr) = served::start(&o.throng, &args);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let pid = served::worker_pid(addr).await;

    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss0 = rss_kib(pid);
    let (avail0, slab0, _) = meminfo();
    let (sockmem0, inuse0) = sockstat();

    // (3) upgrades per second, holding every connection.
    let holder = Rc::new(Held::default());
    let opened = open_subscribers(&o, addr, pid, &holder).await;
    let (held, failed, open_secs) = (opened.held, opened.failed, opened.secs);
    let upgrades_per_sec = held as f64 / open_secs;

    // (1) and (4): let the worker settle, then measure. From 0 to N the
    // figure includes what the connect phase's peak left in the heap (the
    // upgrades in flight); from N/2 to N it is what each more connection costs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_n = rss_kib(pid);
    let (avail_n, slab_n, _) = meminfo();
    let (sockmem_n, inuse_n) = sockstat();
    let user_bytes_per_conn = (rss_n as f64 - rss0 as f64) * 1024.0 / held as f64;
    let user_bytes_per_more_conn =
        (rss_n as f64 - opened.rss_half as f64) * 1024.0 / (o.conns - o.conns / 2) as f64;

    // (2) fan-out vs the bare write loop, interleaved.
    let FanOut {
        mut pub_ms,
        mut pub_last_ms,
        mut pub_cpu,
        mut floor_cpu,
        mut floor_wall_ms,
        incomplete,
        pub_ticks,
        floor_ticks,
    } = fan_out(&o, addr, pid, &holder, held).await;
    let closed = holder.closed.get();
    let deflated = metric(addr, "throng_frames_deflated_total").await;

    let hz = 100.0; // USER_HZ on Linux
    let per_frame = |ticks: u64| ticks as f64 / hz * 1e9 / (o.rounds * held) as f64;
    let fan_ns = median(&mut pub_cpu);
    let floor_ns = median(&mut floor_cpu);
    let report = serde_json::json!({
        "loadavg_at_start": load0.trim(),
        "loadavg_at_end": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "serve_args": o.serve_args,
        "token": o.token.is_some(),
        "kind": if o.sse { "sse" } else { "ws" },
        "channels_per_connection": o.channels.max(1),
        "several_channels_url": o.channels > 0,
        "deflate": o.deflate,
        "frames_received_compressed": holder.compressed.get(),
        "bytes_per_frame_received": holder.frame_bytes.get() as f64 / holder.frames.get().max(1) as f64,
        "server_frames_deflated": deflated,
        "connections": held,
        "failed": failed,
        "upgrades_per_sec": upgrades_per_sec.round(),
        "open_seconds": open_secs,
        "worker_rss_kib_at_0": rss0,
        "worker_rss_kib_at_n": rss_n,
        "user_bytes_per_conn": user_bytes_per_conn.round(),
        "worker_rss_kib_at_half": opened.rss_half,
        "user_bytes_per_more_conn": user_bytes_per_more_conn.round(),
        "kernel_sockstat_tcp_mem_bytes_per_conn": ((sockmem_n as f64 - sockmem0 as f64) * 4096.0 / held as f64).round(),
        "kernel_tcp_sockets_added": inuse_n as i64 - inuse0 as i64,
        "kernel_slab_bytes_per_conn": ((slab_n as f64 - slab0 as f64) * 1024.0 / held as f64).round(),
        "memavailable_drop_bytes_per_conn_both_ends": ((avail0 as f64 - avail_n as f64) * 1024.0 / held as f64).round(),
        "rounds": o.rounds,
        "payload_bytes": o.payload,
        "fanout_cpu_ns_per_frame_in_loop": fan_ns,
        "floor_write_cpu_ns_per_frame": floor_ns,
        "ratio_in_loop": fan_ns / floor_ns,
        "process_cpu_ns_per_frame_publish": per_frame(pub_ticks),
        "process_cpu_ns_per_frame_floor": per_frame(floor_ticks),
        "ratio_process": per_frame(pub_ticks) / per_frame(floor_ticks),
        "publish_to_reply_ms_median": median(&mut pub_ms),
        "publish_to_last_frame_ms_median": median(&mut pub_last_ms),
        "floor_loop_wall_ms_median": median(&mut floor_wall_ms),
        "subscribers_missing_a_frame": incomplete,
        "client_connections_closed": closed,
    });
    println!("{}", serde_json::to_string_pretty(&report).expect("json"));
    let _ = throng_host::process::signal(server.id(), throng_host::process::Signal::Term);
    let _ = server.wait();
}

/// What opening the subscribers did.
struct Opened {
    /// Subscribers held.
    held: usize,
    /// Subscribers that failed to open.
    failed: usize,
    /// Seconds spent opening.
    secs: f64,
    /// The worker's RSS with half of them open (KiB).
    rss_half: u64,
}

/// (3) Opens `o.conns` subscribers into `holder`, `o.concurrency` at a
/// time, in two halves, with the worker's (`pid`) RSS measured after the
/// first.
async fn open_subscribers(o: &Opts, addr: SocketAddr, pid: u32, holder: &Rc<Held>) -> Opened {
    let mut target = if o.channels == 0 {
        "/bench".to_owned()
    } else {
        let others = (1..o.channels).map(|j| format!("&channel=o{j}"));
        format!("/?channel=bench{}", others.collect::<String>())
    };
    if let Some(t) = &o.token {
        target.push(if o.channels == 0 { '?' } else { '&' });
        target.push_str(&format!("token={t}"));
    }
    let target: Rc<str> = target.into();
    let how = (o.sse, o.deflate);
    let next = Rc::new(Cell::new(0usize));
    let failed = Rc::new(Cell::new(0usize));
    let half = o.conns / 2;
    let mut open_secs = 0.0;
    let mut rss_half = 0;
    for upto in [half, o.conns] {
        let t = Instant::now();
        let mut openers = Vec::new();
        for _ in 0..o.concurrency {
            let (next, failed, holder, target) = (
                next.clone(),
                failed.clone(),
                Rc::clone(holder),
                target.clone(),
            );
            openers.push(tokio::task::spawn_local(async move {
                loop {
                    let i = next.get();
                    if i >= upto {
                        break;
                    }
                    next.set(i + 1);
                    let src = Ipv4Addr::new(127, 0, 0, 2 + (i % 8) as u8);
                    if let Err(e) = subscribe(addr, src, &target, how, holder.clone()).await {
                        if failed.get() == 0 {
                            eprintln!("subscribe failed: {e}");
                        }
                        failed.set(failed.get() + 1);
                    }
                }
            }));
        }
        for h in openers {
            let _ = h.await;
        }
        open_secs += t.elapsed().as_secs_f64();
        if upto == half {
            tokio::time::sleep(Duration::from_secs(2)).await;
            rss_half = rss_kib(pid);
        }
    }
    Opened {
        held: o.conns - failed.get(),
        failed: failed.get(),
        secs: open_secs,
        rss_half,
    }
}

/// The figures of the fan-out rounds.
struct FanOut {
    /// Publish to its reply, per round (ms).
    pub_ms: Vec<f64>,
    /// Publish to the last frame in, per round (ms).
    pub_last_ms: Vec<f64>,
    /// The server's fan-out CPU per frame (its own metric), per round (ns).
    pub_cpu: Vec<f64>,
    /// The bare write loop's CPU per frame, per round (ns).
    floor_cpu: Vec<f64>,
    /// The bare write loop's wall time, per round (ms).
    floor_wall_ms: Vec<f64>,
    /// Subscribers that missed a frame, over all rounds.
    incomplete: usize,
    /// The worker's CPU ticks over the publish rounds.
    pub_ticks: u64,
    /// The worker's CPU ticks over the floor rounds.
    floor_ticks: u64,
}

/// (2) `o.rounds` rounds of one publish to the `held` subscribers against
/// the server's bare write loop of the same frame, interleaved; each
/// checked by draining `holder`.
async fn fan_out(o: &Opts, addr: SocketAddr, pid: u32, holder: &Held, held: usize) -> FanOut {
    let payload = payload(o.payload);
    let (mut pub_ms, mut pub_last_ms, mut pub_cpu, mut floor_cpu, mut floor_wall_ms) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut incomplete = 0;
    let (mut pub_ticks, mut floor_ticks) = (0u64, 0u64);
    let fan_cpu0 = metric(addr, "throng_fanout_cpu_seconds_total").await;
    for _ in 0..o.rounds {
        // The floor's bare loop reaches one-channel subscribers only, with
        // uncompressed frames.
        let floors: &[bool] = if o.channels > 0 || o.deflate {
            &[false]
        } else {
            &[false, true]
        };
        for &floor in floors {
            let ticks0 = cpu_ticks(pid);
            let t = Instant::now();
            let path = if floor {
                "/bench/floor/bench"
            } else {
                "/publish/bench"
            };
            let (status, body) = request_as(addr, "POST", path, &payload, o.token.as_deref()).await;
            let rtt = t.elapsed().as_secs_f64() * 1e3;
            assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
            let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON reply");
            // Every subscriber got exactly one whole frame (an SSE event:
            // `id: ID\ndata: ...\n\n`, counted by its length). The publish
            // answer comes before the writes: the server's CPU is read once
            // the last frame is in.
            let whole = match v["id"].as_str() {
                Some(id) if o.sse && !floor => {
                    let want = (4 + id.len() + 1 + 6 + o.payload + 2) as u64;
                    holder.drain(want, Duration::from_secs(10))
                }
                _ => holder.drain_frames(1, Duration::from_secs(10)),
            };
            incomplete += held - whole;
            let last_frame = t.elapsed().as_secs_f64() * 1e3;
            let ticks = cpu_ticks(pid) - ticks0;
            if floor {
                floor_ticks += ticks;
                floor_cpu.push(v["cpu_ns"].as_f64().unwrap_or(f64::NAN) / held as f64);
                floor_wall_ms.push(v["wall_ns"].as_f64().unwrap_or(f64::NAN) / 1e6);
            } else {
                pub_ticks += ticks;
                assert_eq!(
                    v["subscribers"].as_u64(),
                    Some(held as u64),
                    "every subscriber counted"
                );
                pub_ms.push(rtt);
                pub_last_ms.push(last_frame);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let fan_cpu = metric(addr, "throng_fanout_cpu_seconds_total").await - fan_cpu0;
    for _ in 0..o.rounds {
        pub_cpu.push(fan_cpu * 1e9 / (o.rounds * held) as f64);
    }
    FanOut {
        pub_ms,
        pub_last_ms,
        pub_cpu,
        floor_cpu,
        floor_wall_ms,
        incomplete,
        pub_ticks,
        floor_ticks,
    }
}

/// A payload of `n` bytes of JSON-like text: records of a chat room, with
/// the variety of real ones (user, sequence, words), so that a compressed
/// run compresses as such messages do (a run of one byte would shrink to
/// nothing).
fn payload(n: usize) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "hello", "room", "ready", "joined", "price", "update", "ok", "seen", "typing", "left",
        "order", "status",
    ];
    let mut rng = fastrand::Rng::with_seed(31);
    let mut out = Vec::with_capacity(n + 96);
    out.push(b'[');
    while out.len() < n {
        let text: Vec<&str> = (0..4).map(|_| WORDS[rng.usize(..WORDS.len())]).collect();
        out.extend_from_slice(
            format!(
                r#"{{"user":"u{}","seq":{},"text":"{}"}},"#,
                rng.u32(..100_000),
                rng.u32(..1_000_000),
                text.join(" ")
            )
            .as_bytes(),
        );
    }
    out.truncate(n);
    out
}

async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, body) = request(addr, "GET", "/metrics", b"").await;
    String::from_utf8_lossy(&body)
        .lines()
        .find(|l| l.starts_with(name) && l.as_bytes().get(name.len()) == Some(&b' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}
