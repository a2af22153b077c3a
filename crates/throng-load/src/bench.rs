//! The machinery of `throng bench` beside `hold`'s: the server as a child
//! process (started, waited for, stopped, never left behind), a monitor
//! thread that samples the host with the server's and the harness's
//! processes labelled, and the figures a bench prints that `hold` alone
//! cannot give: memory per connection on each side and in the kernel,
//! measured as deltas, CPU per side, and delivery per message.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use thiserror::Error;
use throng_host::sample::{HostSample, Sampler, hostname};
use throng_report::format::{Event, Reader, Record, Writer};
use throng_report::interval::new_histogram;

use crate::supervisor::Latency;

/// Why a bench could not run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The server could not be started.
    #[error("cannot start the server: {0}")]
    Spawn(io::Error),
    /// The server did not say it was listening, or did not answer /healthz, in time.
    #[error("the server did not become ready: {0}")]
    NotReady(String),
    /// Reading or writing a result file.
    #[error("{0}")]
    Results(String),
}

/// `throng serve` as a child process in its own process group, killed with
/// its parent (`PR_SET_PDEATHSIG`) so that a bench that dies leaves no server.
#[derive(Debug)]
pub struct Server {
    child: Child,
    addr: SocketAddr,
    /// The JSON start line it printed.
    start_line: serde_json::Value,
    done: Option<ExitStatus>,
}

impl Server {
    /// Starts `program args...` (which must print a JSON line with
    /// `"listen":["ADDR",..]` on stdout when bound) and waits until it
    /// answers `GET /healthz`.
    pub fn start(program: &Path, args: &[String], timeout: Duration) -> Result<Self, BenchError> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        {
            use std::os::unix::process::CommandExt as _;
            // Own group: the terminal's Ctrl-C reaches the bench only, which
            // stops the server itself after the harness closed its connections.
            cmd.process_group(0);
            // SAFETY: prctl is async-signal-safe and touches only this child.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().map_err(BenchError::Spawn)?;
        let Some(stdout) = child.stdout.take() else {
            return Err(BenchError::NotReady("no stdout".into()));
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let mut sent = false;
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if !sent => {
                        sent = true;
                        let _ = tx.send(line.clone());
                    }
                    // Later lines are drained so the server never blocks on a full pipe.
                    Ok(_) => {}
                }
            }
        });
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            start_line: serde_json::Value::Null,
            done: None,
        };
        let deadline = Instant::now() + timeout;
        let Ok(line) = rx.recv_timeout(timeout) else {
            let status = server.stop(Duration::from_secs(2));
            return Err(BenchError::NotReady(format!(
                "no start line within {timeout:?} (server {})",
                status.map_or_else(|| "killed".to_owned(), |s| s.to_string())
            )));
        };
        let start_line = serde_json::from_str::<serde_json::Value>(&line).unwrap_or_default();
        let addr = start_line["listen"][0]
            .as_str()
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            server.stop(Duration::from_secs(2));
            return Err(BenchError::NotReady(format!(
                "start line has no listen address: {}",
                line.trim()
            )));
        };
        server.addr = addr;
        server.start_line = start_line;
        loop {
            if let Some(status) = server.exited() {
                return Err(BenchError::NotReady(format!("server exited: {status}")));
            }
            if http_get(addr, "/healthz").is_ok_and(|(code, _)| code == 200) {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                server.stop(Duration::from_secs(2));
                return Err(BenchError::NotReady(format!(
                    "no answer on http://{addr}/healthz within {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The JSON line it printed when it was ready.
    pub fn start_line(&self) -> &serde_json::Value {
        &self.start_line
    }

    /// The supervisor's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.done.is_none() {
            self.done = self.child.try_wait().ok().flatten();
        }
        self.done
    }

    /// SIGTERM (the server closes every connection with 1001 and exits),
    /// then after `timeout` SIGKILL to its whole process group. `None`: killed.
    pub fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exited() {
            return Some(s);
        }
        let pid = i32::try_from(self.child.id()).unwrap_or(i32::MAX);
        // SAFETY: plain kill(2) on our own child, which has not been reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: the child leads its own process group (process_group(0)).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = self.child.wait();
        self.done = None;
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.exited().is_none() {
            self.stop(Duration::from_secs(5));
        }
    }
}

/// One `GET path` over HTTP/1.0: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.take(16 << 20).read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other("not an HTTP response"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    Ok((code, body))
}

/// The first of `n` consecutive free TCP ports on `ip`, below the usual
/// ephemeral range (so outgoing connections do not take them meanwhile).
/// Several listening ports give the server several accept queues, which a
/// burst of connects on a busy machine needs.
pub fn free_port_range(ip: std::net::IpAddr, n: u16) -> io::Result<u16> {
    for _ in 0..200 {
        let first = fastrand::u16(20_000..30_000 - n);
        let bound: Result<Vec<_>, _> = (first..first + n)
            .map(|p| std::net::TcpListener::bind((ip, p)))
            .collect();
        if bound.is_ok() {
            return Ok(first);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no {n} consecutive free ports on {ip} in 20000-30000"),
    ))
}

/// The children of `pid` (from `/proc/<pid>/task/*/children`).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` has exited (gone, or a zombie not yet reaped).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Label prefixes of the monitor's processes.
pub mod label {
    /// The server's supervisor (`<host>/serve`) and workers (`<host>/serve-<i>`).
    pub const SERVE: &str = "/serve";
    /// The harness's workers (`<host>/hold-pid<pid>`).
    pub const HOLD: &str = "/hold-pid";
    /// The bench process itself (the harness's supervisor and publisher).
    pub const BENCH: &str = "/bench";
}

/// A thread that samples the host every `every`, with the server's
/// processes, the harness's worker processes and this process labelled.
#[derive(Debug)]
pub struct Monitor {
    stop: Arc<AtomicBool>,
    armed: Arc<AtomicBool>,
    server_died: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<HostSample>>>,
}

/// Most samples a monitor keeps (a bench is bounded in time; this bounds memory too).
pub const MAX_SAMPLES: usize = 20_000;

impl Monitor {
    /// Starts sampling. While [`Self::arm`]ed, a server that dies makes the
    /// monitor send SIGINT to this process: `hold` then stops as on Ctrl-C.
    pub fn start(server_pid: u32, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let armed = Arc::new(AtomicBool::new(false));
        let server_died = Arc::new(AtomicBool::new(false));
        let (s, a, d) = (stop.clone(), armed.clone(), server_died.clone());
        let handle = std::thread::spawn(move || {
            let host = hostname();
            let me = std::process::id();
            let mut sampler = Sampler::new();
            let mut samples = Vec::new();
            while !s.load(Ordering::Relaxed) {
                let mut procs: Vec<(String, u32)> = vec![(format!("{host}{}", label::BENCH), me)];
                if !d.load(Ordering::Relaxed) && dead(server_pid) {
                    d.store(true, Ordering::Relaxed);
                    if a.load(Ordering::Relaxed) {
                        eprintln!("\nthrong bench: the server exited; stopping the harness");
                        // SAFETY: kill(2) to ourselves; hold's Ctrl-C handler is installed while armed.
                        unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
                    }
                }
                procs.push((format!("{host}{}", label::SERVE), server_pid));
                for pid in children(server_pid) {
                    let args = cmdline(pid);
                    let index = args
                        .iter()
                        .position(|a| a == "--worker-index")
                        .and_then(|i| args.get(i + 1));
                    if let Some(i) = index {
                        procs.push((format!("{host}{}-{i}", label::SERVE), pid));
                    }
                }
                for pid in children(me) {
                    // Only once it runs the worker code: before exec a fork
                    // shows this process's memory.
                    let args = cmdline(pid);
                    if pid != server_pid
                        && args.iter().any(|a| a == "hold")
                        && args.iter().any(|a| a == "--worker")
                    {
                        procs.push((format!("{host}{}{pid}", label::HOLD), pid));
                    }
                }
                if let Ok(sample) = sampler.sample(&procs) {
                    if samples.len() < MAX_SAMPLES {
                        samples.push(sample);
                    }
                }
                std::thread::sleep(every);
            }
            samples
        });
        Self {
            stop,
            armed,
            server_died,
            handle: Some(handle),
        }
    }

    /// Sets whether a dead server interrupts the harness.
    pub fn arm(&self, on: bool) {
        self.armed.store(on, Ordering::Relaxed);
    }

    /// Whether the server was seen dead.
    pub fn server_died(&self) -> bool {
        self.server_died.load(Ordering::Relaxed)
    }

    /// Stops the thread; every sample taken.
    pub fn finish(mut self) -> Vec<HostSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn sum_rss(s: &HostSample, part: &str) -> u64 {
    s.rss_bytes
        .iter()
        .filter(|(l, _)| l.contains(part))
        .map(|(_, v)| v)
        .sum()
}

/// Memory per connection, measured as deltas between the idle server (and
/// each harness worker before its first connection) and the moment every
/// connection was still open.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Memory {
    /// Connections the deltas are divided by.
    pub connections: u64,
    /// Server RSS (supervisor + workers) before the first connection, bytes.
    pub server_before: u64,
    /// Server RSS with every connection open, bytes.
    pub server_loaded: u64,
    /// Harness worker RSS before their first connection (the last sample before any opened), bytes.
    pub harness_before: u64,
    /// Harness worker RSS with every connection open, bytes.
    pub harness_loaded: u64,
    /// `/proc/meminfo` Slab before and loaded, bytes.
    pub slab_before: u64,
    /// See `slab_before`.
    pub slab_loaded: u64,
    /// `/proc/net/sockstat` TCP mem before and loaded, bytes.
    pub tcp_mem_before: u64,
    /// See `tcp_mem_before`.
    pub tcp_mem_loaded: u64,
    /// TCP sockets in use before and loaded (both ends of every connection are here).
    pub tcp_inuse_before: u64,
    /// See `tcp_inuse_before`.
    pub tcp_inuse_loaded: u64,
    /// Server user space per connection, bytes.
    pub server_per_connection: f64,
    /// Harness user space per connection, bytes.
    pub harness_per_connection: f64,
    /// Kernel (slab + TCP buffers) per connection, both sockets of it, bytes.
    pub kernel_per_connection: f64,
    /// When the loaded sample was taken, ns since the epoch.
    pub loaded_at_ns: u64,
}

/// CPU used, seconds (user + system).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cpu {
    /// Server supervisor and workers, from before the first connection to the end.
    pub server_s: f64,
    /// Harness workers and the bench process (supervisor, publisher).
    pub harness_s: f64,
}

/// Memory and CPU from the monitor's samples. `before_ns`: when the harness
/// started (the last sample before it is the idle baseline); `held`:
/// connections open at the plateau.
pub fn costs(samples: &[HostSample], before_ns: u64, held: u64) -> (Memory, Cpu) {
    let mut m = Memory {
        connections: held,
        ..Memory::default()
    };
    let mut cpu = Cpu::default();
    let Some(base) = samples.iter().rev().find(|s| s.at_ns <= before_ns) else {
        return (m, cpu);
    };
    let max_inuse = samples.iter().map(|s| s.tcp_inuse).max().unwrap_or(0);
    let grown = max_inuse.saturating_sub(base.tcp_inuse);
    let Some(loaded) = samples
        .iter()
        .rev()
        .find(|s| s.at_ns > before_ns && s.tcp_inuse >= max_inuse - grown / 100)
    else {
        return (m, cpu);
    };
    m.server_before = sum_rss(base, label::SERVE);
    m.server_loaded = sum_rss(loaded, label::SERVE);
    // Each harness worker's RSS in the last sample before the connections
    // began (its runtime up, the schedule not yet started); a worker first
    // seen later falls back to its smallest RSS.
    let mut least: BTreeMap<&str, u64> = BTreeMap::new();
    let mut idle: BTreeMap<&str, u64> = BTreeMap::new();
    for s in samples {
        let quiet = s.tcp_inuse <= base.tcp_inuse + grown / 100;
        for (l, v) in &s.rss_bytes {
            if l.contains(label::HOLD) {
                let e = least.entry(l.as_str()).or_insert(u64::MAX);
                *e = (*e).min(*v);
                if quiet && s.at_ns < loaded.at_ns {
                    idle.insert(l.as_str(), *v);
                }
            }
        }
    }
    for (l, v) in idle {
        least.insert(l, v);
    }
    for (l, v) in &loaded.rss_bytes {
        if l.contains(label::HOLD) {
            m.harness_loaded += v;
            m.harness_before += least.get(l.as_str()).copied().unwrap_or(*v);
        }
    }
    m.slab_before = base.mem_slab_bytes;
    m.slab_loaded = loaded.mem_slab_bytes;
    m.tcp_mem_before = base.tcp_mem_bytes;
    m.tcp_mem_loaded = loaded.tcp_mem_bytes;
    m.tcp_inuse_before = base.tcp_inuse;
    m.tcp_inuse_loaded = loaded.tcp_inuse;
    m.loaded_at_ns = loaded.at_ns;
    if held > 0 {
        let n = held as f64;
        let d = |a: u64, b: u64| a as f64 - b as f64;
        m.server_per_connection = d(m.server_loaded, m.server_before) / n;
        m.harness_per_connection = d(m.harness_loaded, m.harness_before) / n;
        m.kernel_per_connection =
            (d(m.slab_loaded, m.slab_before) + d(m.tcp_mem_loaded, m.tcp_mem_before)) / n;
    }
    // CPU: each process's last figure minus its figure in the baseline.
    let mut first: BTreeMap<&str, u64> = BTreeMap::new();
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for (l, v) in &base.cpu_ns {
        first.insert(l.as_str(), *v);
    }
    for s in samples.iter().filter(|s| s.at_ns >= base.at_ns) {
        for (l, v) in &s.cpu_ns {
            last.insert(l.as_str(), *v);
        }
    }
    for (l, v) in last {
        let used = v.saturating_sub(first.get(l).copied().unwrap_or(0)) as f64 / 1e9;
        if l.contains(label::SERVE) {
            cpu.server_s += used;
        } else {
            cpu.harness_s += used;
        }
    }
    (m, cpu)
}

/// Delivery of one published message to every subscriber.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MessageStats {
    /// 1, 2, ... in publish order.
    pub seq: u64,
    /// Deliveries counted.
    pub delivered: u64,
    /// Latency from publish to arrival, µs (`max` is the time to the last subscriber).
    pub latency_us: Latency,
}

/// A histogram's statistics, µs.
pub fn latency(h: &Histogram<u64>) -> Latency {
    if h.is_empty() {
        return Latency::default();
    }
    Latency {
        count: h.len(),
        min: h.min(),
        mean: h.mean(),
        p50: h.value_at_quantile(0.5),
        p90: h.value_at_quantile(0.9),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
    }
}

/// Per-message delivery from a `hold` result file. Deliveries are counted
/// per interval; each interval's deliveries belong to the latest message
/// published at or before it. `hold` publishes just after an interval
/// boundary, so this is exact when messages are at least two intervals apart
/// and each reaches every subscriber before the next one is published.
pub fn per_message(path: &Path) -> Result<Vec<MessageStats>, BenchError> {
    let reader = Reader::open(path).map_err(|e| BenchError::Results(e.to_string()))?;
    let mut sent: BTreeMap<u64, u64> = BTreeMap::new();
    let mut delivered: BTreeMap<u64, Histogram<u64>> = BTreeMap::new();
    for rec in reader {
        if let Record::Interval(iv) = rec {
            if let Some(n) = iv.counters.get("publish.sent") {
                *sent.entry(iv.start_ns).or_insert(0) += n;
            }
            if let Some(h) = iv.histograms.get("delivery") {
                let e = delivered.entry(iv.start_ns).or_insert_with(new_histogram);
                // Every interval histogram has the shared shape; a foreign one is skipped.
                let _ = e.add(h);
            }
        }
    }
    let mut out: Vec<(u64, Histogram<u64>)> = Vec::new();
    let mut seq = 0u64;
    let starts: std::collections::BTreeSet<u64> =
        sent.keys().chain(delivered.keys()).copied().collect();
    for start in starts {
        for _ in 0..sent.get(&start).copied().unwrap_or(0) {
            seq += 1;
            out.push((seq, new_histogram()));
        }
        if let (Some(h), Some((_, cur))) = (delivered.get(&start), out.last_mut()) {
            let _ = cur.add(h);
        }
    }
    Ok(out
        .into_iter()
        .map(|(seq, h)| MessageStats {
            seq,
            delivered: h.len(),
            latency_us: latency(&h),
        })
        .collect())
}

/// Copies `hold`'s result file to `to`, adding to each host sample the
/// server's processes (RSS and CPU) from the nearest monitor sample, and
/// then `events`. One host sample per interval stays one: the report plots
/// server and harness memory together.
pub fn write_results(
    hold_file: &Path,
    to: &Path,
    samples: &[HostSample],
    events: &[Event],
) -> Result<(), BenchError> {
    let err = |e: &dyn std::fmt::Display| BenchError::Results(e.to_string());
    let reader = Reader::open(hold_file).map_err(|e| err(&e))?;
    let mut writer = Writer::create(to, reader.header()).map_err(|e| err(&e))?;
    for rec in reader {
        match rec {
            Record::Interval(mut iv) => {
                if let Some(h) = iv.host.as_mut() {
                    let near = samples.iter().min_by_key(|s| s.at_ns.abs_diff(h.at_ns));
                    if let Some(near) = near {
                        for (l, v) in &near.rss_bytes {
                            if l.contains(label::SERVE) {
                                h.rss_bytes.push((l.clone(), *v));
                            }
                        }
                        for (l, v) in &near.cpu_ns {
                            if l.contains(label::SERVE) {
                                h.cpu_ns.push((l.clone(), *v));
                            }
                        }
                    }
                }
                writer.write_interval(&iv).map_err(|e| err(&e))?;
            }
            Record::Event(ev) => writer.write_event(&ev).map_err(|e| err(&e))?,
            _ => {}
        }
    }
    for ev in events {
        writer.write_event(ev).map_err(|e| err(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: u64, inuse: u64, slab: u64, rss: &[(&str, u64)]) -> HostSample {
        HostSample {
            at_ns: at,
            tcp_inuse: inuse,
            mem_slab_bytes: slab,
            rss_bytes: rss.iter().map(|(l, v)| ((*l).to_owned(), *v)).collect(),
            cpu_ns: rss.iter().map(|(l, v)| ((*l).to_owned(), *v)).collect(),
            ..HostSample::default()
        }
    }

    #[test]
    fn costs_are_deltas_at_the_plateau() {
        let s = vec![
            sample(1, 10, 1000, &[("h/serve-0", 100)]),
            sample(2, 10, 1000, &[("h/serve-0", 100), ("h/hold-pid9", 50)]),
            sample(3, 2010, 5000, &[("h/serve-0", 2100), ("h/hold-pid9", 1050)]),
            sample(4, 2010, 5000, &[("h/serve-0", 3100), ("h/hold-pid9", 2050)]),
            sample(5, 10, 1000, &[("h/serve-0", 3100)]),
        ];
        let (m, cpu) = costs(&s, 1, 1000);
        assert_eq!(m.loaded_at_ns, 4);
        assert!((m.server_per_connection - 3.0).abs() < 1e-9);
        assert!((m.harness_per_connection - 2.0).abs() < 1e-9);
        assert!((m.kernel_per_connection - 4.0).abs() < 1e-9);
        assert!((cpu.server_s - 3000e-9).abs() < 1e-12);
    }

    #[test]
    fn children_of_a_child_are_found() {
        let mut c = Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep starts");
        assert!(children(std::process::id()).contains(&c.id()));
        c.kill().expect("kill");
        c.wait().expect("wait");
        assert!(dead(c.id()));
    }
}
