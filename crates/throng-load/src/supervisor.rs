//! The `hold` supervisor: starts the worker processes, publishes the
//! timestamped messages, merges the workers' intervals for the live view and
//! the result file (with a host sample each second), and ends the run
//! cleanly: stop publishing, let messages in flight land, tell every worker
//! to close its connections, wait for them, summarise.
//!
//! Workers are separate processes (the caller says how to start one: the
//! `throng` binary re-executes itself), each holding its share of the
//! connections under the per-process file limit. They get their
//! [`WorkerPlan`] on stdin and send result-file records on stdout.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use throng_host::sample::{HostSample, Sampler};
use throng_report::format::{Header, Record, Writer, decode_record};
use throng_report::interval::{Interval, new_histogram};
use tokio::sync::mpsc;

use crate::hold::{Settings, WorkerPlan, now_unix_ns};
use crate::message;
use crate::pacer::{Pacer, RateSpec};
use crate::plan::Fit;
use crate::publish::Publisher;
use crate::target::{PublishTarget, WsTarget};
use crate::tls::TlsOptions;

/// How long after every connection is open (or failed) before publishing
/// starts, so that the server has registered every subscriber.
pub const PUBLISH_SETTLE: Duration = Duration::from_millis(500);
/// How long after the last publish before connections are closed, so that
/// messages in flight arrive.
pub const DRAIN: Duration = Duration::from_secs(1);
/// Timeout of one publish call.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishing during a run.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishPlan {
    /// Where to publish.
    pub target: PublishTarget,
    /// Messages per second.
    pub rate: f64,
    /// Size of each message, bytes.
    pub message_size: usize,
    /// The Redis channel name (`throng:<channel>`).
    pub redis_channel: String,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// One line rewritten in place each second (a terminal).
    Tty,
    /// One plain line per second (a pipe or file).
    Lines,
    /// Nothing.
    Quiet,
}

/// A whole `hold` run, as the CLI resolved it.
#[derive(Debug, Clone)]
pub struct HoldRun {
    /// Connections in total.
    pub connections: u64,
    /// The connection rate.
    pub rate: RateSpec,
    /// Where to connect.
    pub target: WsTarget,
    /// TLS settings of a `wss://` target.
    pub tls: Option<TlsOptions>,
    /// Workers and sources.
    pub fit: Fit,
    /// Timeouts and limits.
    pub settings: Settings,
    /// How long to hold once every connection is open or failed (`None`: until Ctrl-C).
    pub duration: Option<Duration>,
    /// Publishing, if any.
    pub publish: Option<PublishPlan>,
    /// The result file, if any.
    pub output: Option<PathBuf>,
    /// The command line and settings for the result file's header.
    pub header: Option<Header>,
    /// Where progress lines go.
    pub progress: Progress,
    /// Progress to stderr instead of stdout (when stdout carries JSON).
    pub progress_to_stderr: bool,
}

/// Statistics of one latency histogram, µs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    /// Values recorded.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

impl Latency {
    fn of(h: Option<&Histogram<u64>>) -> Self {
        match h {
            Some(h) if !h.is_empty() => Self {
                count: h.len(),
                min: h.min(),
                mean: h.mean(),
                p50: h.value_at_quantile(0.5),
                p90: h.value_at_quantile(0.9),
                p99: h.value_at_quantile(0.99),
                p999: h.value_at_quantile(0.999),
                max: h.max(),
            },
            _ => Self::default(),
        }
    }
}

/// What a run did, for the final print and `--json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Connections asked for.
    pub target: u64,
    /// Worker processes.
    pub workers: u32,
    /// Handshakes completed.
    pub opened: u64,
    /// The most connections open at an interval's end.
    pub peak_open: i64,
    /// Failed attempts by kind.
    pub failed: BTreeMap<String, u64>,
    /// Ended connections by how (`server.1008`, `eof`, `clean`, ...).
    pub closed: BTreeMap<String, u64>,
    /// Connections opened per second, from the schedule's start until every
    /// worker had opened (or failed) its whole share.
    pub connect_rate: f64,
    /// Seconds from the schedule's start until every connection was open or failed.
    pub ramp_s: f64,
    /// Connect latency from the intended start (TCP + upgrade), µs.
    pub connect_us: Latency,
    /// Connect latency from the actual start, µs.
    pub connect_service_us: Latency,
    /// How late connections were started against the schedule, µs.
    pub connect_lag_us: Latency,
    /// TCP connect alone, µs.
    pub connect_tcp_us: Latency,
    /// The TLS handshake alone (`wss://`), µs.
    pub connect_tls_us: Latency,
    /// The WebSocket upgrade alone, µs.
    pub connect_upgrade_us: Latency,
    /// TLS handshakes that were full (not resumed).
    pub tls_full: u64,
    /// TLS handshakes that resumed an earlier session.
    pub tls_resumed: u64,
    /// Messages published (calls that succeeded).
    pub published: u64,
    /// Publish calls that failed, by kind.
    pub publish_errors: BTreeMap<String, u64>,
    /// Duration of publish calls, µs.
    pub publish_us: Latency,
    /// Messages received over all subscribers.
    pub received: u64,
    /// Messages lost (sequence gaps, and the tail missing at the end).
    pub lost: u64,
    /// Messages received twice.
    pub duplicated: u64,
    /// Messages received after a later one.
    pub out_of_order: u64,
    /// Data messages that were not ours.
    pub foreign: u64,
    /// Bytes received on held connections.
    pub bytes_in: u64,
    /// Delivery latency (publish start to arrival), µs.
    pub delivery_us: Latency,
    /// The largest RSS seen per process, bytes.
    pub peak_rss_bytes: BTreeMap<String, u64>,
    /// CPU time used per process, ns.
    pub cpu_ns: BTreeMap<String, u64>,
    /// Seconds from the schedule's start to the end.
    pub elapsed_s: f64,
}

/// Adds `src` into `dst` (counters and gauges add, histograms add).
pub fn merge_into(dst: &mut Interval, src: &Interval) {
    for (k, v) in &src.counters {
        *dst.counters.entry(k.clone()).or_insert(0) += v;
    }
    for (k, v) in &src.gauges {
        *dst.gauges.entry(k.clone()).or_insert(0) += v;
    }
    for (k, h) in &src.histograms {
        let d = dst
            .histograms
            .entry(k.clone())
            .or_insert_with(new_histogram);
        // Every interval histogram has the same shape; adding cannot overflow
        // the range. A failure would mean a foreign record: skip it.
        let _ = d.add(h);
    }
}

fn empty_interval(start_ns: u64, length_ns: u64, source: String) -> Interval {
    Interval {
        start_ns,
        length_ns,
        source,
        counters: BTreeMap::new(),
        gauges: BTreeMap::new(),
        histograms: BTreeMap::new(),
        host: None,
    }
}

/// What the publisher task counts, read by the supervisor each second.
struct PubStats {
    /// When each message not yet counted in an interval was sent (Unix
    /// ns): a message counts in the interval it was sent in, however late
    /// the supervisor closes that interval (a busy machine delays it past
    /// the next boundary, and a message counted a second early takes the
    /// previous one's last deliveries in per-message figures).
    sent_at: Vec<u64>,
    ok: u64,
    errors: BTreeMap<String, u64>,
    call: Histogram<u64>,
    lag: Histogram<u64>,
    subscribers: Option<u64>,
    /// Last sequence number attempted.
    last_seq: u64,
    last_error: Option<String>,
}

/// A worker process and its pipes.
struct Worker {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    done: bool,
}

enum FromWorker {
    Line(usize, String),
    Eof(usize),
}

/// Runs a whole `hold`: `worker_command` makes the command that starts one
/// worker (it reads its plan from stdin).
pub fn run(run: HoldRun, worker_command: &dyn Fn() -> Command) -> io::Result<Summary> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, supervise(run, worker_command))
}

async fn supervise(run: HoldRun, worker_command: &dyn Fn() -> Command) -> io::Result<Summary> {
    let host = throng_host::sample::hostname();
    let length_ns = run.settings.interval_ns.max(1);
    // Workers build the same pacer; refuse a bad rate here, once.
    Pacer::for_count(run.rate, run.connections)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let mut writer = match (&run.output, &run.header) {
        (Some(path), Some(header)) => Some(Writer::create(path, header).map_err(io::Error::other)?),
        _ => None,
    };

    // Start the workers; the schedule starts once they have all had time to exec.
    let workers_n = run.fit.workers;
    let start_unix_ns = now_unix_ns() + 300_000_000 + 20_000_000 * u64::from(workers_n.min(50));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut workers: Vec<Worker> = Vec::new();
    for index in 0..workers_n {
        let label = format!("{host}/hold-{index}");
        let plan = WorkerPlan {
            index,
            workers: workers_n,
            connections: run.connections,
            rate: run.rate,
            start_unix_ns,
            target: run.target.clone(),
            sources: run.fit.sources.clone(),
            settings: run.settings,
            label: label.clone(),
            tls: run.tls.clone(),
        };
        let mut cmd = worker_command();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        {
            use std::os::unix::process::CommandExt as _;
            // Own process group: Ctrl-C reaches only the supervisor, which then
            // closes every connection cleanly through the workers.
            cmd.process_group(0);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start worker {index}: {e}")))?;
        let mut stdin = child.stdin.take();
        let stdout = child.stdout.take();
        if let Some(stdin) = stdin.as_mut() {
            // Invariant: a plan of plain fields always serializes.
            let line = serde_json::to_string(&plan).expect("worker plan serializes");
            stdin.write_all(line.as_bytes())?;
            stdin.write_all(b"\n")?;
            stdin.flush()?;
        }
        if let Some(stdout) = stdout {
            let tx = tx.clone();
            let i = workers.len();
            std::thread::spawn(move || {
                let mut r = BufReader::new(stdout);
                let mut line = String::new();
                loop {
                    line.clear();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            if tx
                                .send(FromWorker::Line(i, line.trim_end().to_owned()))
                                .is_err()
                            {
                                return;
                            }
                        }
                    }
                }
                let _ = tx.send(FromWorker::Eof(i));
            });
        }
        workers.push(Worker {
            label,
            child,
            stdin,
            done: false,
        });
    }
    drop(tx);

    // The hold time starts when every worker has opened (or failed) its whole
    // share, not when the schedule says it should have: a harness or server
    // that falls behind still gets every connection attempted and held.
    let mut hold_end: Option<Instant> = None;
    let mut ramps_done = 0usize;
    let ramp_done_at: Rc<Cell<Option<Instant>>> = Rc::new(Cell::new(None));
    let t0 = Instant::now() + Duration::from_nanos(start_unix_ns.saturating_sub(now_unix_ns()));
    let ramp_done_note = Rc::new(tokio::sync::Notify::new());

    // The publisher runs beside the main loop, from after the ramp to the hold's end.
    let stats = Rc::new(RefCell::new(PubStats::new()));
    let publishing_stop = Rc::new(Cell::new(false));
    let stdins: Rc<RefCell<Vec<Option<ChildStdin>>>> = Rc::new(RefCell::new(
        workers.iter_mut().map(|w| w.stdin.take()).collect(),
    ));
    let publisher = run.publish.clone().map(|p| {
        tokio::task::spawn_local(publish_loop(
            p,
            ramp_done_at.clone(),
            ramp_done_note.clone(),
            PublishTiming {
                hold: run.duration,
                interval_ns: length_ns,
            },
            stats.clone(),
            publishing_stop.clone(),
            stdins.clone(),
        ))
    });

    let mut out = ProgressOut::new(run.progress, run.progress_to_stderr);
    let mut sampler = Sampler::new();
    let mut pending: BTreeMap<u64, Interval> = BTreeMap::new();
    let mut reported: BTreeMap<u64, usize> = BTreeMap::new();
    let mut total = empty_interval(start_unix_ns, length_ns, format!("{host}/hold"));
    let mut summary = Summary {
        target: run.connections,
        workers: workers_n,
        ..Summary::default()
    };
    let mut first_open_start: Option<u64> = None;
    let mut last_open_end: u64 = 0;
    let mut stop_at: Option<Instant> = None;
    let mut stopped = false;
    let mut kill_at: Option<Instant> = None;
    let mut open_workers = workers.len();
    let mut last_flushed = 0u64;
    let mut last_host: Option<HostSample> = None;
    let mut last_sup_start = 0u64;

    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut ctrl_c_seen = false;
    let mut tick = tokio::time::interval(Duration::from_millis(250));

    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(FromWorker::Line(i, line)) => {
                    match decode_record(&line) {
                        Ok(Record::Interval(iv)) => {
                            if let Some(w) = writer.as_mut() {
                                w.write_encoded(&line).map_err(io::Error::other)?;
                            }
                            *reported.entry(iv.start_ns).or_insert(0) += 1;
                            let slot = pending
                                .entry(iv.start_ns)
                                .or_insert_with(|| empty_interval(iv.start_ns, iv.length_ns, format!("{host}/hold")));
                            merge_into(slot, &iv);
                        }
                        Ok(Record::Event(ev)) => {
                            if let Some(w) = writer.as_mut() {
                                w.write_encoded(&line).map_err(io::Error::other)?;
                            }
                            if ev.kind == "worker.done" {
                                workers[i].done = true;
                            } else if ev.kind == "worker.ramp_done" {
                                ramps_done += 1;
                                if ramps_done == workers.len() {
                                    let now = Instant::now();
                                    ramp_done_at.set(Some(now));
                                    ramp_done_note.notify_one();
                                    hold_end = run.duration.map(|d| now + d);
                                }
                            } else {
                                out.note(&format!("{}: {}: {}", ev.source, ev.kind, ev.text));
                            }
                        }
                        Ok(_) => {}
                        Err(_) => out.note(&format!("{}: {line}", workers[i].label)),
                    }
                }
                Some(FromWorker::Eof(i)) => {
                    open_workers -= 1;
                    if !workers[i].done {
                        // A worker that died never reports its ramp: do not wait for it.
                        ramps_done += 1;
                        if ramps_done == workers.len() && ramp_done_at.get().is_none() {
                            let now = Instant::now();
                            ramp_done_at.set(Some(now));
                            ramp_done_note.notify_one();
                            hold_end = run.duration.map(|d| now + d);
                        }
                    }
                    if !workers[i].done && !stopped {
                        out.note(&format!("{}: worker exited early; its connections are gone", workers[i].label));
                    }
                    if open_workers == 0 {
                        break;
                    }
                }
                None => break,
            },
            r = &mut ctrl_c, if !ctrl_c_seen => {
                ctrl_c_seen = true;
                if r.is_ok() {
                    out.note("Ctrl-C: stopping (press again to kill the workers)");
                    stop_at = Some(Instant::now());
                    // A second Ctrl-C kills.
                    tokio::task::spawn_local(async {
                        if tokio::signal::ctrl_c().await.is_ok() {
                            std::process::exit(130);
                        }
                    });
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                if stop_at.is_none() && hold_end.is_some_and(|e| now >= e) {
                    stop_at = Some(now);
                }
                if !stopped && stop_at.is_some_and(|at| now >= at) {
                    // Stop publishing first, then let messages in flight land.
                    publishing_stop.set(true);
                    if let Some(p) = publisher.as_ref() {
                        let _ = tokio::time::timeout(PUBLISH_TIMEOUT, async { while !p.is_finished() { tokio::time::sleep(Duration::from_millis(20)).await } }).await;
                        tokio::time::sleep(DRAIN).await;
                    }
                    let final_seq = stats.borrow().last_seq;
                    for stdin in stdins.borrow_mut().iter_mut() {
                        if let Some(mut s) = stdin.take() {
                            let _ = writeln!(s, "stop {final_seq}");
                        }
                    }
                    stopped = true;
                    kill_at = Some(Instant::now() + Duration::from_millis(run.settings.close_timeout_ms) + Duration::from_secs(10));
                }
                if kill_at.is_some_and(|k| now >= k) {
                    out.note("workers did not finish closing in time; killing them");
                    for w in &mut workers {
                        let _ = w.child.kill();
                    }
                    kill_at = None;
                }
                // Flush intervals every worker has reported, or that are overdue.
                let now_ns = now_unix_ns();
                let ready: Vec<u64> = pending
                    .keys()
                    .copied()
                    .filter(|s| reported.get(s).copied().unwrap_or(0) >= workers.len() || s + 2 * length_ns + length_ns / 2 < now_ns)
                    .collect();
                for start in ready {
                    if let Some(iv) = pending.remove(&start) {
                        reported.remove(&start);
                        let merged = absorb(iv, &mut Absorb {
                            host: &host, length_ns, stats: &stats, sampler: &mut sampler, workers: &workers,
                            writer: &mut writer, summary: &mut summary, total: &mut total,
                            first_open_start: &mut first_open_start, last_open_end: &mut last_open_end,
                            last_host: &mut last_host,
                            last_sup_start: &mut last_sup_start,
                        })?;
                        if start > last_flushed {
                            last_flushed = start;
                            out.line(&progress_line(&merged, start_unix_ns, run.connections));
                        }
                    }
                }
            }
        }
    }
    // Everything the workers sent is in; flush what is left.
    for (start, iv) in std::mem::take(&mut pending) {
        let merged = absorb(
            iv,
            &mut Absorb {
                host: &host,
                length_ns,
                stats: &stats,
                sampler: &mut sampler,
                workers: &workers,
                writer: &mut writer,
                summary: &mut summary,
                total: &mut total,
                first_open_start: &mut first_open_start,
                last_open_end: &mut last_open_end,
                last_host: &mut last_host,
                last_sup_start: &mut last_sup_start,
            },
        )?;
        if start > last_flushed {
            last_flushed = start;
            out.line(&progress_line(&merged, start_unix_ns, run.connections));
        }
    }
    out.finish();
    for w in &mut workers {
        let _ = w.child.wait();
    }
    if let Some(p) = publisher {
        p.abort();
    }

    let c = &total.counters;
    let get = |k: &str| c.get(k).copied().unwrap_or(0);
    summary.opened = get("connect.ok");
    for (k, v) in c {
        if let Some(kind) = k.strip_prefix("connect.error.") {
            summary.failed.insert(kind.to_owned(), *v);
        } else if let Some(how) = k.strip_prefix("closed.") {
            summary.closed.insert(how.to_owned(), *v);
        } else if let Some(kind) = k.strip_prefix("publish.error.") {
            summary.publish_errors.insert(kind.to_owned(), *v);
        }
    }
    summary.published = get("publish.ok");
    summary.received = get("messages.received");
    summary.lost = get("messages.lost");
    summary.duplicated = get("messages.duplicated");
    summary.out_of_order = get("messages.out_of_order");
    summary.foreign = get("messages.foreign");
    summary.bytes_in = get("bytes.in");
    let h = &total.histograms;
    summary.connect_us = Latency::of(h.get("connect"));
    summary.connect_service_us = Latency::of(h.get("connect.service"));
    summary.connect_lag_us = Latency::of(h.get("connect.lag"));
    summary.connect_tcp_us = Latency::of(h.get("connect.tcp"));
    summary.connect_tls_us = Latency::of(h.get("connect.tls"));
    summary.connect_upgrade_us = Latency::of(h.get("connect.upgrade"));
    summary.tls_full = get("tls.handshakes.full");
    summary.tls_resumed = get("tls.handshakes.resumed");
    summary.publish_us = Latency::of(h.get("publish"));
    summary.delivery_us = Latency::of(h.get("delivery"));
    if let Some(done) = ramp_done_at.get() {
        let span = done.saturating_duration_since(t0).as_secs_f64();
        summary.ramp_s = span;
        if span > 0.0 {
            summary.connect_rate = summary.opened as f64 / span;
        }
    } else if let Some(first) = first_open_start {
        // Stopped before the ramp ended: per-second intervals are all there is.
        let span = (last_open_end.saturating_sub(first)) as f64 / 1e9;
        if span > 0.0 {
            summary.connect_rate = summary.opened as f64 / span;
        }
    }
    if let Some(h) = last_host {
        summary.cpu_ns = h.cpu_ns.into_iter().collect();
    }
    summary.elapsed_s = now_unix_ns().saturating_sub(start_unix_ns) as f64 / 1e9;
    Ok(summary)
}

/// Where a merged interval goes once every worker has reported it.
struct Absorb<'a> {
    host: &'a str,
    length_ns: u64,
    stats: &'a Rc<RefCell<PubStats>>,
    sampler: &'a mut Sampler,
    workers: &'a [Worker],
    writer: &'a mut Option<Writer>,
    summary: &'a mut Summary,
    total: &'a mut Interval,
    first_open_start: &'a mut Option<u64>,
    last_open_end: &'a mut u64,
    last_host: &'a mut Option<HostSample>,
    /// The start of the last interval the supervisor wrote its own record for.
    last_sup_start: &'a mut u64,
}

/// Adds the supervisor's record (publisher counts, host sample) to the
/// workers' merged interval, writes it, and folds it into the run's totals.
fn absorb(iv: Interval, a: &mut Absorb<'_>) -> io::Result<Interval> {
    let start = iv.start_ns;
    // A worker's record that arrives after its interval was flushed (a worker
    // held up for seconds) is merged on its own: the supervisor's record for
    // that start is written once only.
    if start <= *a.last_sup_start {
        let mut merged = iv;
        merged.gauges.clear();
        merge_into(a.total, &merged);
        return Ok(merged);
    }
    *a.last_sup_start = start;
    let sup = supervisor_interval(a.host, start, a.length_ns, a.stats, a.sampler, a.workers);
    if let Some(w) = a.writer.as_mut() {
        w.write_interval(&sup).map_err(io::Error::other)?;
    }
    if let Some(h) = &sup.host {
        for (k, v) in &h.rss_bytes {
            let e = a.summary.peak_rss_bytes.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        *a.last_host = Some(h.clone());
    }
    let mut merged = iv;
    merge_into(&mut merged, &sup);
    if merged.counters.get("connect.ok").copied().unwrap_or(0) > 0 {
        a.first_open_start.get_or_insert(start);
        *a.last_open_end = start + a.length_ns;
    }
    let open_now = merged.gauges.get("connections.open").copied().unwrap_or(0);
    a.summary.peak_open = a.summary.peak_open.max(open_now);
    merge_into(a.total, &merged);
    Ok(merged)
}

/// The supervisor's own record for one interval: publisher counts and the host sample.
fn supervisor_interval(
    host: &str,
    start_ns: u64,
    length_ns: u64,
    stats: &Rc<RefCell<PubStats>>,
    sampler: &mut Sampler,
    workers: &[Worker],
) -> Interval {
    let mut iv = empty_interval(start_ns, length_ns, format!("{host}/hold-supervisor"));
    let mut s = stats.borrow_mut();
    let sent = s.take_sent_before(start_ns + length_ns);
    if sent > 0 {
        iv.counters.insert("publish.sent".into(), sent);
    }
    if s.ok > 0 {
        iv.counters.insert("publish.ok".into(), s.ok);
    }
    for (k, v) in std::mem::take(&mut s.errors) {
        iv.counters.insert(format!("publish.error.{k}"), v);
    }
    if !s.call.is_empty() {
        iv.histograms.insert("publish".into(), s.call.clone());
        s.call.reset();
    }
    if !s.lag.is_empty() {
        iv.histograms.insert("publish.lag".into(), s.lag.clone());
        s.lag.reset();
    }
    if let Some(n) = s.subscribers {
        iv.gauges.insert(
            "publish.subscribers".into(),
            i64::try_from(n).unwrap_or(i64::MAX),
        );
    }
    s.ok = 0;
    let mut procs: Vec<(String, u32)> =
        vec![(format!("{host}/hold-supervisor"), std::process::id())];
    procs.extend(workers.iter().map(|w| (w.label.clone(), w.child.id())));
    iv.host = sampler.sample(&procs).ok();
    iv
}

impl PubStats {
    fn new() -> Self {
        Self {
            sent_at: Vec::new(),
            ok: 0,
            errors: BTreeMap::new(),
            call: new_histogram(),
            lag: new_histogram(),
            subscribers: None,
            last_seq: 0,
            last_error: None,
        }
    }

    /// How many messages were sent before `end_ns`; they are counted now.
    fn take_sent_before(&mut self, end_ns: u64) -> u64 {
        let before = self.sent_at.len();
        self.sent_at.retain(|&at| at >= end_ns);
        (before - self.sent_at.len()) as u64
    }
}

/// When the publisher runs: how long the hold lasts (from the end of the
/// ramp), and the interval length it aligns its first message to.
struct PublishTiming {
    hold: Option<Duration>,
    interval_ns: u64,
}

/// Publishes timestamped messages at `plan.rate`, from [`PUBLISH_SETTLE`]
/// after every worker has opened its share until the hold ends (or the run
/// is stopped), over one connection, one call at a time.
async fn publish_loop(
    plan: PublishPlan,
    ramp_done_at: Rc<Cell<Option<Instant>>>,
    ramp_done: Rc<tokio::sync::Notify>,
    timing: PublishTiming,
    stats: Rc<RefCell<PubStats>>,
    stop: Rc<Cell<bool>>,
    stdins: Rc<RefCell<Vec<Option<ChildStdin>>>>,
) {
    let PublishTiming { hold, interval_ns } = timing;
    let Ok(pacer) = Pacer::constant(plan.rate) else {
        return;
    };
    while ramp_done_at.get().is_none() {
        ramp_done.notified().await;
    }
    let Some(ramp_end) = ramp_done_at.get() else {
        return;
    };
    let until = hold.map(|d| ramp_end + d);
    tokio::time::sleep_until((ramp_end + PUBLISH_SETTLE).into()).await;
    if stop.get() {
        return;
    }
    // Tell the workers first, so a connection open before the first message
    // expects sequence number 1.
    let first_ns = now_unix_ns();
    for s in stdins.borrow_mut().iter_mut().flatten() {
        let _ = writeln!(s, "publishing {first_ns}");
        let _ = s.flush();
    }
    // At one message per interval or slower, start just after an interval
    // boundary (intervals are aligned on wall time), and at least 50 ms after
    // telling the workers: each message's deliveries then fall in its own
    // interval and the ones after it, never in the interval of an earlier
    // publish, which is what per-message figures (`throng bench`) attribute
    // by. A random phase put a slow fan-out's tail in the next message's
    // interval. Faster rates gain nothing from it and would lose up to an
    // interval of a short hold, so they start after the 50 ms.
    let mut wait = 50_000_000;
    if plan.rate * interval_ns as f64 <= 1e9 {
        let into = (now_unix_ns() + wait) % interval_ns;
        let phase = interval_ns / 100;
        wait += (interval_ns + phase - into) % interval_ns;
    }
    tokio::time::sleep(Duration::from_nanos(wait)).await;
    let mut publisher = Publisher::new(
        plan.target.clone(),
        plan.redis_channel.clone(),
        PUBLISH_TIMEOUT,
    );
    let start = Instant::now();
    let mut buf = Vec::with_capacity(plan.message_size.max(message::MAX_HEADER));
    let mut seq = 0u64;
    loop {
        let intended = start + pacer.intended(seq);
        if until.is_some_and(|u| intended >= u) {
            break;
        }
        while Instant::now() < intended && !stop.get() {
            tokio::time::sleep_until(
                intended
                    .min(Instant::now() + Duration::from_millis(100))
                    .into(),
            )
            .await;
        }
        if stop.get() {
            break;
        }
        seq += 1;
        let began = Instant::now();
        let sent_ns = now_unix_ns();
        buf.clear();
        message::encode(&mut buf, seq, sent_ns, plan.message_size);
        {
            let mut s = stats.borrow_mut();
            s.sent_at.push(sent_ns);
            s.last_seq = seq;
            let lag = u64::try_from(began.saturating_duration_since(intended).as_micros())
                .unwrap_or(u64::MAX);
            let _ = s.lag.record(lag.max(1));
        }
        let result = publisher.publish(&buf).await;
        let took = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut s = stats.borrow_mut();
        let _ = s.call.record(took.max(1));
        match result {
            Ok(n) => {
                s.ok += 1;
                if n.is_some() {
                    s.subscribers = n;
                }
            }
            Err(e) => {
                *s.errors.entry(e.label().to_owned()).or_insert(0) += 1;
                if s.last_error.is_none() {
                    eprintln!("throng hold: publish failed (first error shown): {e}");
                }
                s.last_error = Some(e.to_string());
            }
        }
    }
}

/// The live view: one line per second.
struct ProgressOut {
    mode: Progress,
    stderr: bool,
    /// A line is on screen without a line break (Tty mode).
    open_line: bool,
}

impl ProgressOut {
    fn new(mode: Progress, stderr: bool) -> Self {
        Self {
            mode,
            stderr,
            open_line: false,
        }
    }

    fn write(&mut self, text: &str) {
        if self.stderr {
            let mut e = io::stderr().lock();
            let _ = e.write_all(text.as_bytes());
            let _ = e.flush();
        } else {
            let mut o = io::stdout().lock();
            let _ = o.write_all(text.as_bytes());
            let _ = o.flush();
        }
    }

    fn line(&mut self, text: &str) {
        match self.mode {
            Progress::Quiet => {}
            Progress::Lines => self.write(&format!("{text}\n")),
            Progress::Tty => {
                self.write(&format!("\r\x1b[2K{text}"));
                self.open_line = true;
            }
        }
    }

    /// A message that must not be overwritten by the next progress line.
    fn note(&mut self, text: &str) {
        if self.open_line {
            self.write("\n");
            self.open_line = false;
        }
        eprintln!("throng hold: {text}");
    }

    fn finish(&mut self) {
        if self.open_line {
            self.write("\n");
            self.open_line = false;
        }
    }
}

fn fmt_us(us: u64) -> String {
    if us >= 10_000_000 {
        format!("{:.1}s", us as f64 / 1e6)
    } else if us >= 10_000 {
        format!("{}ms", us / 1000)
    } else if us >= 1000 {
        format!("{:.1}ms", us as f64 / 1000.0)
    } else {
        format!("{us}µs")
    }
}

fn progress_line(iv: &Interval, start_unix_ns: u64, target: u64) -> String {
    let c = |k: &str| iv.counters.get(k).copied().unwrap_or(0);
    let errors: u64 = iv
        .counters
        .iter()
        .filter(|(k, _)| k.starts_with("connect.error."))
        .map(|(_, v)| v)
        .sum();
    let closed: u64 = iv
        .counters
        .iter()
        .filter(|(k, _)| k.starts_with("closed.") && !k.ends_with(".clean"))
        .map(|(_, v)| v)
        .sum();
    let secs = (iv.start_ns + iv.length_ns).saturating_sub(start_unix_ns) as f64 / 1e9;
    let open = iv.gauges.get("connections.open").copied().unwrap_or(0);
    let mut s = format!(
        "[{secs:>6.1}s] open {open}/{target}  +{}/s  err {errors}  closed {closed}",
        c("connect.ok")
    );
    if let Some(h) = iv.histograms.get("connect") {
        s.push_str(&format!(
            "  connect p99 {}",
            fmt_us(h.value_at_quantile(0.99))
        ));
    }
    let lag = iv.histograms.get("connect.lag").map_or(0, Histogram::max);
    if lag >= 1000 {
        s.push_str(&format!("  lag {}", fmt_us(lag)));
    }
    if c("publish.sent") > 0 || c("messages.received") > 0 {
        s.push_str(&format!(
            "  pub {}/s  msgs {}/s  lost {}",
            c("publish.ok"),
            c("messages.received"),
            c("messages.lost")
        ));
        if let Some(h) = iv.histograms.get("delivery") {
            s.push_str(&format!(
                "  delivery p50 {} p99 {}",
                fmt_us(h.value_at_quantile(0.5)),
                fmt_us(h.value_at_quantile(0.99))
            ));
        }
    }
    s
}

/// The final human summary.
pub fn render_summary(s: &Summary) -> String {
    let mut out = String::new();
    let lat = |l: &Latency| {
        if l.count == 0 {
            return "none measured".to_owned();
        }
        format!(
            "p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (n={})",
            fmt_us(l.p50),
            fmt_us(l.p90),
            fmt_us(l.p99),
            fmt_us(l.p999),
            fmt_us(l.max),
            l.count
        )
    };
    out.push_str(&format!(
        "connections: {} opened of {} over {} worker(s) in {:.2}s ({:.0}/s), peak {} open\n",
        s.opened, s.target, s.workers, s.ramp_s, s.connect_rate, s.peak_open
    ));
    let failed: u64 = s.failed.values().sum();
    if failed > 0 {
        let kinds: Vec<String> = s.failed.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out.push_str(&format!("  failed: {failed} ({})\n", kinds.join(", ")));
    }
    if !s.closed.is_empty() {
        let kinds: Vec<String> = s.closed.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out.push_str(&format!("  closed: {}\n", kinds.join(", ")));
    }
    out.push_str(&format!(
        "  connect (from intended start): {}\n",
        lat(&s.connect_us)
    ));
    out.push_str(&format!(
        "  connect (from actual start):   {}\n",
        lat(&s.connect_service_us)
    ));
    out.push_str(&format!("    TCP connect:  {}\n", lat(&s.connect_tcp_us)));
    if s.connect_tls_us.count > 0 {
        out.push_str(&format!(
            "    TLS handshake: {}  ({} full, {} resumed)\n",
            lat(&s.connect_tls_us),
            s.tls_full,
            s.tls_resumed
        ));
    }
    out.push_str(&format!(
        "    WS upgrade:   {}\n",
        lat(&s.connect_upgrade_us)
    ));
    if s.connect_lag_us.max >= 1000 {
        out.push_str(&format!(
            "  harness lag behind schedule: {}\n",
            lat(&s.connect_lag_us)
        ));
    }
    if s.published > 0 || !s.publish_errors.is_empty() || s.received > 0 {
        let errs: u64 = s.publish_errors.values().sum();
        out.push_str(&format!(
            "messages: {} published ({} failed), {} received, {} lost, {} duplicated, {} out of order\n",
            s.published, errs, s.received, s.lost, s.duplicated, s.out_of_order
        ));
        out.push_str(&format!("  delivery: {}\n", lat(&s.delivery_us)));
        out.push_str(&format!("  publish call: {}\n", lat(&s.publish_us)));
    }
    if !s.peak_rss_bytes.is_empty() {
        let rss: Vec<String> = s
            .peak_rss_bytes
            .iter()
            .map(|(k, v)| {
                format!(
                    "{} {:.1} MiB",
                    k.rsplit('/').next().unwrap_or(k),
                    *v as f64 / 1048576.0
                )
            })
            .collect();
        out.push_str(&format!("peak RSS: {}\n", rss.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_counts_in_the_interval_it_was_sent_in_however_late_that_closes() {
        let mut s = PubStats::new();
        let sec = 1_000_000_000;
        // Message 1 at 10.01 s; interval [10 s, 11 s) closes late, at 12.3 s,
        // by when message 2 went at 12.01 s.
        s.sent_at
            .extend([10 * sec + sec / 100, 12 * sec + sec / 100]);
        assert_eq!(s.take_sent_before(11 * sec), 1);
        assert_eq!(s.take_sent_before(12 * sec), 0);
        assert_eq!(s.take_sent_before(13 * sec), 1);
        assert!(s.sent_at.is_empty());
    }
}
