//! The kernel's own fan-out, without throng (issue 13, item 5): how long
//! one small frame takes to reach N loopback TCP connections, and what it
//! costs the machine per delivery, when nothing but `write(2)`,
//! `epoll_wait(2)` and `read(2)` runs.
//!
//! It holds the connections the way `throng bench` does: writer processes
//! (the server's workers) and reader processes (the harness's), each with
//! at most `--per-process` connections (the 20,000-file limit), the
//! readers' sockets in one level-triggered epoll set each. With `--layout
//! spread` each reader's connections go to every writer in turn, as
//! `throng bench`'s do (`SO_REUSEPORT` hands each harness worker's
//! connections to all of serve's workers), so every writer wakes every
//! reader; the default, `paired`, connects each reader to one writer only,
//! which wakes fewer readers and costs less on both sides (measured on
//! 2026-11-28 at 100,000: writers ~8.3 against ~10 µs per delivery,
//! readers ~2.6 against ~5.3 µs, docs/scale.md).
//! A round tells every writer to write one frame to each of its sockets,
//! in the order they were accepted; the round's time is from that word to
//! the last reader's last byte, on the system-wide monotonic clock. The
//! machine's CPU per delivery is `/proc/stat`'s busy time over the round,
//! each process's its own CPU clock.
//!
//! Run it where `throng bench` would run the same size (a namespace with a
//! TCP table of its own: `scripts/bench-scale.sh` with `RUNS=kernel-sweep`
//! does that). If this floor grows faster than linearly with N, so must
//! anything built on the same system calls.
//!
//! ```text
//! cargo run --release -p throng-bench --bin fanout_floor -- --conns 100000 --rounds 3 --layout spread
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use throng_host::process;
use throng_host::sample::Sampler;

struct Opts {
    role: String,
    conns: usize,
    per_process: usize,
    rounds: usize,
    payload: usize,
    gap: Duration,
    port: u16,
    source: Ipv4Addr,
    /// `spread`: each reader's connections go to every writer in turn.
    layout: String,
    /// A reader's writer ports, when spread.
    ports: Vec<u16>,
    /// A reader's first connection's place among all connections, when spread.
    first: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        role: "main".into(),
        conns: 100_000,
        per_process: 19_600,
        rounds: 3,
        payload: 64,
        gap: Duration::from_secs(2),
        port: 0,
        source: Ipv4Addr::LOCALHOST,
        layout: "paired".into(),
        ports: Vec::new(),
        first: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args
            .next()
            .unwrap_or_else(|| fail(&format!("{a} needs a value")));
        let num = |what: &str| -> usize {
            v.parse()
                .unwrap_or_else(|_| fail(&format!("{a}: '{v}' is not {what}")))
        };
        match a.as_str() {
            "--conns" => o.conns = num("a count").max(1),
            "--per-process" => o.per_process = num("a count").clamp(1, 19_900),
            "--rounds" => o.rounds = num("a count").max(1),
            "--payload" => o.payload = num("a byte count").clamp(1, 125),
            "--gap-ms" => o.gap = Duration::from_millis(num("milliseconds") as u64),
            "--role" => o.role = v,
            "--port" => o.port = num("a port") as u16,
            "--layout" if v == "paired" || v == "spread" => o.layout = v,
            "--ports" => {
                o.ports = v
                    .split(',')
                    .map(|p| {
                        p.parse()
                            .unwrap_or_else(|_| fail(&format!("--ports: '{p}'")))
                    })
                    .collect()
            }
            "--first" => o.first = num("a count"),
            "--source" => {
                o.source = v
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("--source: '{v}' is not an IPv4 address")))
            }
            _ => fail(&format!(
                "unknown option {a} (or a bad value); options: --conns N --per-process N --rounds N --payload BYTES --gap-ms MS --layout paired|spread"
            )),
        }
    }
    o
}

fn fail(msg: &str) -> ! {
    eprintln!("fanout_floor: {msg}");
    std::process::exit(2)
}

/// The system-wide monotonic clock in nanoseconds: comparable across processes.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This process's CPU time (user + system), ns: throng-host's clock.
fn cpu_ns() -> u64 {
    u64::try_from(process::process_cpu().as_nanos()).unwrap_or(u64::MAX)
}

/// (busy, all) CPU ns of the whole machine since boot, from throng-host's
/// sampler (`/proc/stat`); zeros if it cannot be read.
fn machine_cpu(sampler: &mut Sampler) -> (u64, u64) {
    let none: &[(&str, u32)] = &[];
    sampler
        .sample(none)
        .map_or((0, 0), |s| (s.cpu_busy_ns, s.cpu_all_ns))
}

fn main() {
    let o = opts();
    if o.role != "main" {
        // A worker ends with the run, however the run ends (a writer
        // blocked in accept(2) would otherwise wait forever).
        // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number only.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    }
    match o.role.as_str() {
        "writer" => writer(&o),
        "reader" => reader(&o),
        _ => coordinate(&o),
    }
}

/// Accepts `conns` connections, says `ready`, then writes one frame to each
/// on every `go` line and answers `wrote <cpu ns>`.
fn writer(o: &Opts) {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| fail(&format!("bind: {e}")));
    // Listen again with the largest backlog (std's is 128): the reader connects fast.
    // SAFETY: a valid listening socket; listen(2) may be called again to resize its queue.
    unsafe { libc::listen(listener.as_raw_fd(), 65_535) };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "port {port}");
    let _ = out.flush();
    let mut socks = Vec::with_capacity(o.conns);
    while socks.len() < o.conns {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                socks.push(s);
            }
            Err(e) => fail(&format!("accept: {e}")),
        }
    }
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    let mut frame = vec![0x81, o.payload as u8];
    frame.resize(2 + o.payload, b'x');
    for line in std::io::stdin().lock().lines() {
        if line.map_or(true, |l| l != "go") {
            break;
        }
        let c0 = cpu_ns();
        for s in &mut socks {
            if let Err(e) = s.write_all(&frame) {
                fail(&format!("write: {e}"));
            }
        }
        let _ = writeln!(out, "wrote {}", cpu_ns() - c0);
        let _ = out.flush();
    }
}

/// Source addresses per reader: a connect's search for a free port slows
/// down sharply once most of an address's ports are taken.
const SOURCES_PER_READER: u32 = 4;

/// Connects `conns` connections from `source` and the next
/// [`SOURCES_PER_READER`]` - 1` addresses to the writer's `port`, says
/// `ready`, then reads; after each round's bytes have all come, answers
/// `read <monotonic ns of the last byte> <cpu ns>`. Ends after the last round.
fn reader(o: &Opts) {
    let to = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, o.port));
    let mut socks = Vec::with_capacity(o.conns);
    for i in 0..o.conns {
        let source = Ipv4Addr::from(u32::from(o.source) + i as u32 % SOURCES_PER_READER);
        let to = match o.ports.len() {
            0 => to,
            k => SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::LOCALHOST,
                o.ports[(o.first + i) % k],
            )),
        };
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .unwrap_or_else(|e| fail(&format!("socket: {e}")));
        let one: libc::c_int = 1;
        // SAFETY: a valid socket and a c_int option value of the right size.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        s.bind(&SocketAddr::V4(SocketAddrV4::new(source, 0)).into())
            .unwrap_or_else(|e| fail(&format!("bind {source}: {e}")));
        s.connect(&to.into())
            .unwrap_or_else(|e| fail(&format!("connect {to}: {e}")));
        let s: TcpStream = s.into();
        let _ = s.set_nonblocking(true);
        socks.push(s);
    }
    // SAFETY: epoll_create1 with valid flags.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        fail("epoll_create1 failed");
    }
    for (i, s) in socks.iter().enumerate() {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: i as u64,
        };
        // SAFETY: valid epoll and socket descriptors and a valid event.
        if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) } != 0 {
            fail("epoll_ctl failed");
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    let per_round = (o.conns * (2 + o.payload)) as u64;
    let mut got = 0u64;
    let mut round = 1u64;
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let mut buf = [0u8; 4096];
    let mut c0 = cpu_ns();
    while round <= o.rounds as u64 {
        // SAFETY: `events` is a valid buffer of its length.
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, -1) };
        for ev in events.iter().take(n.max(0) as usize) {
            let s = &mut socks[ev.u64 as usize];
            match s.read(&mut buf) {
                Ok(0) => fail("a writer closed a connection"),
                Ok(k) => got += k as u64,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => fail(&format!("read: {e}")),
            }
        }
        if got >= per_round * round {
            let c1 = cpu_ns();
            let _ = writeln!(out, "read {} {}", now_ns(), c1 - c0);
            let _ = out.flush();
            c0 = c1;
            round += 1;
        }
    }
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Proc {
    fn start(args: &[String]) -> Self {
        let exe = std::env::current_exe().unwrap_or_else(|e| fail(&format!("current_exe: {e}")));
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| fail(&format!("spawn: {e}")));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// The next line's words; a child that ended early ends the run.
    fn line(&mut self) -> Vec<String> {
        let mut l = String::new();
        match self.stdout.read_line(&mut l) {
            Ok(n) if n > 0 => l.split_whitespace().map(str::to_owned).collect(),
            _ => fail("a worker process ended early (see its error above)"),
        }
    }

    fn say(&mut self, word: &str) {
        if let Some(i) = self.stdin.as_mut() {
            let _ = writeln!(i, "{word}");
            let _ = i.flush();
        }
    }
}

/// What reader `i` is told besides its count: its rounds, its writer's
/// port and its first source address; when spread, every writer's port and
/// where its connections start among all (`before`: the connections of the
/// readers before it), so that connection g of all goes to writer g % k and
/// each writer still gets its share, from every reader.
fn reader_args(o: &Opts, i: usize, before: usize, ports: &[String]) -> Vec<String> {
    // Source addresses of their own per reader, from 127.0.1.0 on.
    let first = u32::from(Ipv4Addr::new(127, 0, 1, 0)) + i as u32 * SOURCES_PER_READER;
    let mut more = vec![
        "--rounds".into(),
        o.rounds.to_string(),
        "--port".into(),
        ports[i].clone(),
        "--source".into(),
        Ipv4Addr::from(first).to_string(),
    ];
    if o.layout == "spread" {
        more.extend([
            "--ports".into(),
            ports.join(","),
            "--first".into(),
            before.to_string(),
        ]);
    }
    more
}

fn coordinate(o: &Opts) {
    let n = o.conns;
    let k = n.div_ceil(o.per_process);
    let share = |i: usize| n / k + usize::from(i < n % k);
    eprintln!(
        "fanout_floor: {n} connections over {k} writer and {k} reader processes (at most {} each), {} rounds of one {}-byte frame to all",
        o.per_process,
        o.rounds,
        o.payload + 2
    );
    let t_setup = now_ns();
    // What both roles of worker i are told; a reader more besides.
    let args = |role: &str, i: usize, more: &[String]| {
        let mut a: Vec<String> = ["--role", role, "--conns", &share(i).to_string()]
            .map(String::from)
            .to_vec();
        a.extend(["--payload".into(), o.payload.to_string()]);
        a.extend_from_slice(more);
        a
    };
    let mut writers: Vec<Proc> = (0..k)
        .map(|i| Proc::start(&args("writer", i, &[])))
        .collect();
    let ports: Vec<String> = writers.iter_mut().map(|w| w.line()[1].clone()).collect();
    let mut readers: Vec<Proc> = (0..k)
        .map(|i| {
            let before: usize = (0..i).map(share).sum();
            Proc::start(&args("reader", i, &reader_args(o, i, before, &ports)))
        })
        .collect();
    for p in writers.iter_mut().chain(readers.iter_mut()) {
        p.line();
    }
    eprintln!(
        "fanout_floor: {n} connected in {:.1} s",
        (now_ns() - t_setup) as f64 / 1e9
    );
    std::thread::sleep(o.gap);
    let mut sampler = Sampler::new();
    let mut rows = Vec::new();
    for round in 1..=o.rounds {
        let (b0, a0) = machine_cpu(&mut sampler);
        let t0 = now_ns();
        for w in &mut writers {
            w.say("go");
        }
        let mut write_cpu = 0u64;
        for w in &mut writers {
            write_cpu += w.line()[1].parse::<u64>().unwrap_or(0);
        }
        let (mut last, mut read_cpu) = (0u64, 0u64);
        for r in &mut readers {
            let l = r.line();
            last = last.max(l[1].parse().unwrap_or(0));
            read_cpu += l[2].parse::<u64>().unwrap_or(0);
        }
        let (b1, a1) = machine_cpu(&mut sampler);
        let secs = last.saturating_sub(t0) as f64 / 1e9;
        // The machine's busy share over the round, times its length and the cores.
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
        let busy = (b1 - b0) as f64 / (a1 - a0).max(1) as f64;
        let machine_ns = busy * cores * secs * 1e9 / n as f64;
        let row = (
            secs,
            write_cpu as f64 / n as f64,
            read_cpu as f64 / n as f64,
            machine_ns,
            busy,
        );
        eprintln!(
            "round {round}: last byte after {:.3} s; CPU per delivery: writers {:.0} ns, readers {:.0} ns (since the last round), machine {:.0} ns ({:.0}% busy)",
            row.0,
            row.1,
            row.2,
            row.3,
            row.4 * 100.0
        );
        rows.push(row);
        if round < o.rounds {
            std::thread::sleep(o.gap);
        }
    }
    for p in writers.iter_mut().chain(readers.iter_mut()) {
        p.stdin = None;
    }
    for mut p in writers.into_iter().chain(readers) {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    let median = |f: fn(&(f64, f64, f64, f64, f64)) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{}",
        serde_json::json!({
            "conns": n,
            "processes_a_side": k,
            "layout": o.layout,
            "rounds": o.rounds,
            "frame_bytes": o.payload + 2,
            "last_byte_s": rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            "median_last_byte_s": median(|r| r.0),
            "median_writer_cpu_ns_per_delivery": median(|r| r.1),
            "median_reader_cpu_ns_per_delivery": median(|r| r.2),
            "median_machine_cpu_ns_per_delivery": median(|r| r.3),
        })
    );
}
