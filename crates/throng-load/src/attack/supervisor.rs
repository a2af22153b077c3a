//! The `attack` supervisor: starts the worker processes, merges their
//! intervals for the live view and the result file (with a host sample each
//! second), and sums the run up the way Vegeta's report does, with the
//! generator's own lag beside the latencies.
//!
//! Workers are separate processes (the `throng` binary re-executes itself);
//! each gets its [`WorkerPlan`] on stdin and sends result-file records on
//! stdout, as `hold`'s workers do.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use serde::Serialize;
use throng_host::sample::Sampler;
use throng_report::format::{Header, Record, Writer, decode_record};
use throng_report::interval::Interval;
use throng_report::summary::HistStats;

use super::record::LATE_US;
use super::worker::Done;
use super::{Load, WorkerPlan};
use crate::hold::now_unix_ns;
use crate::supervisor::{Progress, merge_into};

/// A whole run, as the CLI asks for it.
#[derive(Debug, Clone)]
pub struct AttackRun {
    /// The plan every worker gets (its `index` and `label` are filled in here).
    pub plan: WorkerPlan,
    /// Requests the schedule plans (rate mode), for the progress and summary.
    pub planned: Option<u64>,
    /// Append results (result-file format) here.
    pub output: Option<PathBuf>,
    /// The result file's header.
    pub header: Option<Header>,
    /// How progress is shown.
    pub progress: Progress,
    /// Progress to stderr (stdout carries JSON).
    pub progress_to_stderr: bool,
}

/// What a run did: the final print and `--format json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Worker processes.
    pub workers: u32,
    /// Requests the schedule planned (rate mode).
    pub planned: Option<u64>,
    /// Requests started.
    pub requests: u64,
    /// Requests started per second, first to last start.
    pub rate: f64,
    /// Successful (2xx/3xx) responses per second, from the start to the last end.
    pub throughput: f64,
    /// Seconds from the first to the last request start.
    pub attack_s: f64,
    /// Seconds from the last start to the last end.
    pub wait_s: f64,
    /// Responses that arrived whole.
    pub answered: u64,
    /// 2xx and 3xx responses.
    pub success: u64,
    /// `success / requests`.
    pub success_ratio: f64,
    /// Requests without a success: failures of every kind plus 1xx/4xx/5xx
    /// answers, over requests (0 when none were sent).
    pub error_rate: f64,
    /// Responses by status code.
    pub status: BTreeMap<String, u64>,
    /// Failures by kind (refused, timeout, reset, closed, bad_response, ...).
    pub errors: BTreeMap<String, u64>,
    /// Requests started more than `late_threshold_us` after their intended time.
    pub late: u64,
    /// The lateness that counts a request as late, µs.
    pub late_threshold_us: u64,
    /// Requests sent again because a reused connection had been closed.
    pub retried: u64,
    /// Connections opened.
    pub connections_opened: u64,
    /// Most requests in flight at an interval's end, over all workers.
    pub peak_in_flight: i64,
    /// Most connections open at an interval's end.
    pub peak_connections: i64,
    /// Bytes read.
    pub bytes_in: u64,
    /// Bytes written.
    pub bytes_out: u64,
    /// Intended start → response end, µs.
    pub latency_us: HistStats,
    /// Actual start → response end, µs.
    pub service_us: HistStats,
    /// Intended → actual start (the generator's lag), µs.
    pub lag_us: HistStats,
    /// TCP connect of new connections, µs.
    pub connect_tcp_us: HistStats,
    /// TLS handshake of new connections (`https://`), µs.
    pub connect_tls_us: HistStats,
    /// TLS handshakes that were full (not resumed).
    pub tls_full: u64,
    /// TLS handshakes that resumed an earlier session.
    pub tls_resumed: u64,
    /// Peak resident memory per process of the run, bytes.
    pub peak_rss_bytes: BTreeMap<String, u64>,
    /// The run was stopped (Ctrl-C) before its schedule ended.
    pub stopped: bool,
}

/// A worker process and its pipes.
struct Worker {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    done: Option<Done>,
}

enum FromWorker {
    Line(usize, String),
    Eof(usize),
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

/// Runs a whole attack: `worker_command` makes the command that starts one
/// worker (it reads its plan from stdin).
pub fn run(run: AttackRun, worker_command: &dyn Fn() -> Command) -> io::Result<Summary> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, supervise(run, worker_command))
}

async fn supervise(run: AttackRun, worker_command: &dyn Fn() -> Command) -> io::Result<Summary> {
    let host = throng_host::sample::hostname();
    let length_ns = run.plan.settings.interval_ns.max(1);
    let mut writer = match (&run.output, &run.header) {
        (Some(path), Some(header)) => Some(Writer::create(path, header).map_err(io::Error::other)?),
        _ => None,
    };
    let workers_n = run.plan.workers.max(1);
    // The schedule starts once every worker has had time to exec.
    let start_unix_ns = now_unix_ns() + 300_000_000 + 20_000_000 * u64::from(workers_n.min(50));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut workers: Vec<Worker> = Vec::new();
    for index in 0..workers_n {
        let label = format!("{host}/attack-{index}");
        let plan = WorkerPlan {
            index,
            workers: workers_n,
            label: label.clone(),
            start_unix_ns,
            ..run.plan.clone()
        };
        let mut cmd = worker_command();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        {
            use std::os::unix::process::CommandExt as _;
            // Own process group: Ctrl-C reaches only the supervisor, which
            // then stops the workers itself.
            cmd.process_group(0);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start worker {index}: {e}")))?;
        let mut stdin = child.stdin.take();
        if let Some(stdin) = stdin.as_mut() {
            // Invariant: a plan of plain fields always serializes.
            let line = serde_json::to_string(&plan).expect("worker plan serializes");
            stdin.write_all(line.as_bytes())?;
            stdin.write_all(b"\n")?;
            stdin.flush()?;
        }
        if let Some(stdout) = child.stdout.take() {
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
            done: None,
        });
    }
    drop(tx);

    let mut out = ProgressOut::new(run.progress, run.progress_to_stderr);
    let mut sampler = Sampler::new();
    let mut pending: BTreeMap<u64, Interval> = BTreeMap::new();
    let mut reported: BTreeMap<u64, usize> = BTreeMap::new();
    let mut total = empty_interval(start_unix_ns, length_ns, format!("{host}/attack"));
    let mut summary = Summary {
        workers: workers_n,
        planned: run.planned,
        late_threshold_us: LATE_US,
        ..Summary::default()
    };
    let mut open_workers = workers.len();
    let mut last_flushed = 0u64;
    let mut sent_so_far = 0u64;
    let mut stopped = false;

    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut tick = tokio::time::interval(Duration::from_millis(250));

    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(FromWorker::Line(i, line)) => match decode_record(&line) {
                    Ok(Record::Interval(iv)) => {
                        if let Some(w) = writer.as_mut() {
                            w.write_encoded(&line).map_err(io::Error::other)?;
                        }
                        *reported.entry(iv.start_ns).or_insert(0) += 1;
                        let slot = pending
                            .entry(iv.start_ns)
                            .or_insert_with(|| empty_interval(iv.start_ns, iv.length_ns, format!("{host}/attack")));
                        merge_into(slot, &iv);
                    }
                    Ok(Record::Event(ev)) => {
                        if let Some(w) = writer.as_mut() {
                            w.write_encoded(&line).map_err(io::Error::other)?;
                        }
                        if ev.kind == "worker.done" {
                            workers[i].done = Some(serde_json::from_str(&ev.text).unwrap_or_default());
                        } else {
                            out.note(&format!("{}: {}: {}", ev.source, ev.kind, ev.text));
                        }
                    }
                    Ok(_) => {}
                    Err(_) => out.note(&format!("{}: {line}", workers[i].label)),
                },
                Some(FromWorker::Eof(i)) => {
                    open_workers -= 1;
                    if workers[i].done.is_none() {
                        out.note(&format!("{}: worker exited early; its requests are not counted", workers[i].label));
                    }
                    if open_workers == 0 {
                        break;
                    }
                }
                None => break,
            },
            r = &mut ctrl_c, if !stopped => {
                stopped = true;
                if r.is_ok() {
                    out.note("Ctrl-C: stopping; requests in flight count as canceled (press again to kill)");
                    for w in &mut workers {
                        if let Some(mut s) = w.stdin.take() {
                            let _ = writeln!(s, "stop");
                        }
                    }
                    tokio::task::spawn_local(async {
                        if tokio::signal::ctrl_c().await.is_ok() {
                            std::process::exit(130);
                        }
                    });
                }
            }
            _ = tick.tick() => {
                let now_ns = now_unix_ns();
                let ready: Vec<u64> = pending
                    .keys()
                    .copied()
                    .filter(|s| reported.get(s).copied().unwrap_or(0) >= workers.len() || s + 2 * length_ns + length_ns / 2 < now_ns)
                    .collect();
                for start in ready {
                    if let Some(iv) = pending.remove(&start) {
                        reported.remove(&start);
                        let merged = flush(&host, iv, &mut sampler, &workers, &mut writer, &mut summary)?;
                        sent_so_far += merged.counters.get("requests.sent").copied().unwrap_or(0);
                        if start > last_flushed {
                            last_flushed = start;
                            out.line(&progress_line(&merged, start_unix_ns, sent_so_far, run.planned));
                        }
                        merge_into(&mut total, &merged);
                    }
                }
            }
        }
    }
    for (_, iv) in std::mem::take(&mut pending) {
        let merged = flush(&host, iv, &mut sampler, &workers, &mut writer, &mut summary)?;
        merge_into(&mut total, &merged);
    }
    out.finish();
    for w in &mut workers {
        let _ = w.child.wait();
    }
    summarise(
        &mut summary,
        &total,
        &workers,
        start_unix_ns,
        matches!(run.plan.load, Load::Rate(_)),
    );
    summary.stopped |= stopped;
    Ok(summary)
}

/// Adds the supervisor's own record (the host sample) to a merged interval,
/// writes that record, and keeps the peaks.
fn flush(
    host: &str,
    mut iv: Interval,
    sampler: &mut Sampler,
    workers: &[Worker],
    writer: &mut Option<Writer>,
    summary: &mut Summary,
) -> io::Result<Interval> {
    let mut sup = empty_interval(
        iv.start_ns,
        iv.length_ns,
        format!("{host}/attack-supervisor"),
    );
    let mut procs: Vec<(String, u32)> =
        vec![(format!("{host}/attack-supervisor"), std::process::id())];
    procs.extend(workers.iter().map(|w| (w.label.clone(), w.child.id())));
    sup.host = sampler.sample(&procs).ok();
    if let Some(w) = writer.as_mut() {
        w.write_interval(&sup).map_err(io::Error::other)?;
    }
    if let Some(h) = &sup.host {
        for (k, v) in &h.rss_bytes {
            let e = summary.peak_rss_bytes.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
    }
    let gauge = |k: &str| iv.gauges.get(k).copied().unwrap_or(0);
    summary.peak_in_flight = summary.peak_in_flight.max(gauge("requests.in_flight"));
    summary.peak_connections = summary.peak_connections.max(gauge("connections.open"));
    iv.host = sup.host.take();
    Ok(iv)
}

fn summarise(
    s: &mut Summary,
    total: &Interval,
    workers: &[Worker],
    start_ns: u64,
    open_model: bool,
) {
    let c = &total.counters;
    let get = |k: &str| c.get(k).copied().unwrap_or(0);
    s.requests = get("requests.sent");
    s.late = get("requests.late");
    s.retried = get("requests.retried");
    s.connections_opened = get("connections.opened");
    s.bytes_in = get("bytes.in");
    s.bytes_out = get("bytes.out");
    for (k, v) in c {
        if let Some(code) = k.strip_prefix("status.") {
            s.status.insert(code.to_owned(), *v);
            s.answered += v;
            if code.starts_with('2') || code.starts_with('3') {
                s.success += v;
            }
        } else if let Some(kind) = k.strip_prefix("requests.error.") {
            s.errors.insert(kind.to_owned(), *v);
        }
    }
    let h = &total.histograms;
    let stats = |k: &str| h.get(k).map(HistStats::of).unwrap_or_default();
    s.latency_us = stats("latency");
    s.service_us = stats("service");
    s.lag_us = stats("lag");
    s.connect_tcp_us = stats("connect.tcp");
    s.connect_tls_us = stats("connect.tls");
    s.tls_full = get("tls.handshakes.full");
    s.tls_resumed = get("tls.handshakes.resumed");
    if s.requests > 0 {
        s.success_ratio = s.success as f64 / s.requests as f64;
        s.error_rate = 1.0 - s.success_ratio;
    }
    let dones: Vec<Done> = workers.iter().filter_map(|w| w.done).collect();
    s.stopped = dones.iter().any(|d| d.stopped);
    let first = dones
        .iter()
        .map(|d| d.first_sent_ns)
        .filter(|&n| n > 0)
        .min();
    let last_sent = dones.iter().map(|d| d.last_sent_ns).max().unwrap_or(0);
    let last_done = dones.iter().map(|d| d.last_done_ns).max().unwrap_or(0);
    // The open model's schedule starts at `start_ns`; a closed pool at its first send.
    let from = if open_model { Some(start_ns) } else { first };
    if let Some(from) = from {
        let attack = last_sent.saturating_sub(from) as f64 / 1e9;
        s.attack_s = attack;
        s.wait_s = last_done.saturating_sub(last_sent) as f64 / 1e9;
        if attack > 0.0 && s.requests > 1 {
            // n starts span n - 1 gaps.
            s.rate = (s.requests - 1) as f64 / attack;
        }
        let until_done = last_done.saturating_sub(from) as f64 / 1e9;
        if until_done > 0.0 {
            s.throughput = s.success as f64 / until_done;
        }
    }
}

/// Checks `--max-error-rate` and `--max-p99` (µs): one line per threshold passed.
pub fn check(s: &Summary, max_error_rate: Option<f64>, max_p99_us: Option<u64>) -> Vec<String> {
    let mut failed = Vec::new();
    if let Some(max) = max_error_rate
        && s.error_rate > max
    {
        failed.push(format!(
            "error rate {:.4} is over --max-error-rate {max}",
            s.error_rate
        ));
    }
    if let Some(max) = max_p99_us {
        if s.latency_us.count == 0 {
            failed.push("no response arrived, so p99 latency is unknown (--max-p99)".to_owned());
        } else if s.latency_us.p99 > max {
            failed.push(format!(
                "p99 latency {} is over --max-p99 {}",
                fmt_us(s.latency_us.p99),
                fmt_us(max)
            ));
        }
    }
    failed
}

/// A latency in readable units.
pub fn fmt_us(us: u64) -> String {
    if us >= 10_000_000 {
        format!("{:.2}s", us as f64 / 1e6)
    } else if us >= 10_000 {
        format!("{:.1}ms", us as f64 / 1000.0)
    } else if us >= 1000 {
        format!("{:.2}ms", us as f64 / 1000.0)
    } else {
        format!("{us}µs")
    }
}

fn progress_line(iv: &Interval, start_unix_ns: u64, sent: u64, planned: Option<u64>) -> String {
    let c = |k: &str| iv.counters.get(k).copied().unwrap_or(0);
    let errors: u64 = iv
        .counters
        .iter()
        .filter(|(k, _)| k.starts_with("requests.error."))
        .map(|(_, v)| v)
        .sum();
    let answered: u64 = iv
        .counters
        .iter()
        .filter(|(k, _)| k.starts_with("status."))
        .map(|(_, v)| v)
        .sum();
    let secs = (iv.start_ns + iv.length_ns).saturating_sub(start_unix_ns) as f64 / 1e9;
    let in_flight = iv.gauges.get("requests.in_flight").copied().unwrap_or(0);
    let of = planned.map_or(String::new(), |p| format!("/{p}"));
    let mut s = format!(
        "[{secs:>6.1}s] sent {sent}{of}  +{}/s  answered {answered}/s  err {errors}  in flight {in_flight}",
        c("requests.sent")
    );
    if let Some(h) = iv.histograms.get("latency") {
        s.push_str(&format!(
            "  latency p50 {} p99 {}",
            fmt_us(h.value_at_quantile(0.5)),
            fmt_us(h.value_at_quantile(0.99))
        ));
    }
    let lag = iv
        .histograms
        .get("lag")
        .map_or(0, hdrhistogram::Histogram::max);
    if lag >= 1000 {
        s.push_str(&format!("  lag max {}", fmt_us(lag)));
    }
    if c("requests.late") > 0 {
        s.push_str(&format!("  late {}", c("requests.late")));
    }
    s
}

/// The final human summary, laid out like Vegeta's report.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let lat = |l: &HistStats| {
        format!(
            "{}, {}, {}, {}, {}, {}, {}",
            fmt_us(l.min),
            fmt_us(l.mean as u64),
            fmt_us(l.p50),
            fmt_us(l.p90),
            fmt_us(l.p99),
            fmt_us(l.p999),
            fmt_us(l.max)
        )
    };
    let planned = s
        .planned
        .map_or(String::new(), |p| format!(" (planned {p})"));
    out.push_str(&format!(
        "Requests      [total, rate, throughput]         {}{planned}, {:.2}/s, {:.2}/s\n",
        s.requests, s.rate, s.throughput
    ));
    out.push_str(&format!(
        "Duration      [total, attack, wait]             {:.3}s, {:.3}s, {:.3}s\n",
        s.attack_s + s.wait_s,
        s.attack_s,
        s.wait_s
    ));
    out.push_str(&format!(
        "Latencies     [min, mean, 50, 90, 99, 99.9, max]  {}   (from the intended start)\n",
        lat(&s.latency_us)
    ));
    out.push_str(&format!(
        "Service       [min, mean, 50, 90, 99, 99.9, max]  {}   (from the actual send)\n",
        lat(&s.service_us)
    ));
    out.push_str(&format!(
        "Lag           [mean, 99, max, late]             {}, {}, {}, {} late (> {})\n",
        fmt_us(s.lag_us.mean as u64),
        fmt_us(s.lag_us.p99),
        fmt_us(s.lag_us.max),
        s.late,
        fmt_us(s.late_threshold_us)
    ));
    let mean = |n: u64| {
        if s.requests > 0 {
            n as f64 / s.requests as f64
        } else {
            0.0
        }
    };
    out.push_str(&format!(
        "Bytes In      [total, mean]                     {}, {:.2}\n",
        s.bytes_in,
        mean(s.bytes_in)
    ));
    out.push_str(&format!(
        "Bytes Out     [total, mean]                     {}, {:.2}\n",
        s.bytes_out,
        mean(s.bytes_out)
    ));
    out.push_str(&format!(
        "Connections   [opened, peak open, peak in flight] {}, {}, {}{}\n",
        s.connections_opened,
        s.peak_connections,
        s.peak_in_flight,
        if s.retried > 0 {
            format!(", {} retried on a new connection", s.retried)
        } else {
            String::new()
        }
    ));
    if s.connect_tcp_us.count > 0 {
        out.push_str(&format!(
            "TCP Connect   [min, mean, 50, 90, 99, 99.9, max]  {}\n",
            lat(&s.connect_tcp_us)
        ));
    }
    if s.connect_tls_us.count > 0 {
        out.push_str(&format!(
            "TLS Handshake [min, mean, 50, 90, 99, 99.9, max]  {}   ({} full, {} resumed)\n",
            lat(&s.connect_tls_us),
            s.tls_full,
            s.tls_resumed
        ));
    }
    out.push_str(&format!(
        "Success       [ratio]                           {:.2}%\n",
        s.success_ratio * 100.0
    ));
    let codes: Vec<String> = s.status.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    out.push_str(&format!(
        "Status Codes  [code:count]                      {}\n",
        codes.join("  ")
    ));
    if !s.errors.is_empty() {
        let kinds: Vec<String> = s.errors.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        out.push_str(&format!(
            "Error Set     [kind:count]                      {}\n",
            kinds.join("  ")
        ));
    }
    if !s.peak_rss_bytes.is_empty() {
        let rss: Vec<String> = s
            .peak_rss_bytes
            .iter()
            .map(|(k, v)| {
                format!(
                    "{} {:.1} MiB",
                    k.rsplit('/').next().unwrap_or(k),
                    *v as f64 / 1_048_576.0
                )
            })
            .collect();
        out.push_str(&format!("Peak RSS      {}\n", rss.join(", ")));
    }
    if s.stopped {
        out.push_str("Stopped before the schedule ended.\n");
    }
    out
}

/// The live view: one line per interval.
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

    fn write(&self, text: &str) {
        if self.stderr {
            let mut e = io::stderr().lock();
            let _ = e.write_all(text.as_bytes()).and_then(|()| e.flush());
        } else {
            let mut o = io::stdout().lock();
            let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
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
        self.finish();
        eprintln!("throng attack: {text}");
    }

    fn finish(&mut self) {
        if self.open_line {
            self.write("\n");
            self.open_line = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds() {
        let mut s = Summary {
            requests: 100,
            success: 97,
            error_rate: 0.03,
            ..Summary::default()
        };
        s.latency_us = HistStats {
            count: 100,
            p99: 250_000,
            ..HistStats::default()
        };
        assert!(check(&s, Some(0.05), Some(300_000)).is_empty());
        assert_eq!(check(&s, Some(0.01), None).len(), 1);
        assert_eq!(check(&s, None, Some(200_000)).len(), 1);
        s.latency_us = HistStats::default();
        assert_eq!(check(&s, None, Some(200_000)).len(), 1);
    }
}
