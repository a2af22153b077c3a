//! `--metrics-listen`: a run's live figures as Prometheus text on
//! `/metrics`, for Grafana beside an hour-long hold (what Vegeta's
//! `-prometheus-addr` and emqtt-bench's `--prometheus` give their users).
//!
//! The figures are the supervisor's, after each flushed interval: the
//! run's totals so far (every worker's, on this machine or an agent,
//! merged exactly as the summary will be) as counters and latency
//! histograms, and the last interval's levels as gauges: what the progress
//! line shows. [`Exposition`] renders them, without sockets; [`Metrics`]
//! serves the latest on a thread of its own, so the endpoint outlives each
//! run's runtime (a knee's levels are one run each) and a slow scraper
//! never holds up the supervisor.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use throng_report::interval::Interval;

/// Every family's prefix.
const PREFIX: &str = "throng_load_";

/// Histogram bucket bounds, µs (shown in seconds): 100 µs to 60 s.
const BUCKETS_US: [u64; 19] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 20_000_000, 30_000_000, 60_000_000,
];

/// Counters whose names end in a kind become one family with that kind as
/// a label: (name prefix, family, label).
const GROUPED: [(&str, &str, &str); 7] = [
    ("connect.error.", "connect_errors_total", "kind"),
    ("requests.error.", "request_errors_total", "kind"),
    ("publish.error.", "publish_errors_total", "kind"),
    ("publish.refused.", "publish_refused_total", "kind"),
    ("publish.unanswered.", "publish_unanswered_total", "kind"),
    ("closed.", "closed_total", "how"),
    ("status.", "responses_total", "code"),
];

/// Counters each role shows from the start, 0 until counted (a result
/// file leaves zeroes out; a dashboard wants a line at 0, not "no data").
const KNOWN: [(&str, &[&str]); 2] = [
    (
        "hold",
        &[
            "connect.ok",
            "messages.received",
            "messages.lost",
            "messages.duplicated",
            "messages.out_of_order",
            "bytes.in",
        ],
    ),
    (
        "attack",
        &[
            "requests.sent",
            "connections.opened",
            "bytes.in",
            "bytes.out",
        ],
    ),
];

/// The longest request head read; anything longer is refused.
const MAX_REQUEST: usize = 8 * 1024;

/// What a scraper gets: the run's figures as of its last flushed interval.
#[derive(Debug, Clone)]
pub struct Exposition {
    role: String,
    /// Every interval flushed so far, added (late records included).
    totals: Interval,
    /// The levels at the last flushed interval's end (every worker's last known).
    gauges: BTreeMap<String, i64>,
    /// The largest of each `*lag` histogram in the last flushed interval, µs.
    lag_us: BTreeMap<String, u64>,
    /// Workers whose record of the last interval had not come.
    late: usize,
    /// Intervals flushed.
    flushed: u64,
    /// When the run's schedule started, ns since the epoch.
    start_unix_ns: u64,
    /// The level a knee search is running (requests or messages per
    /// second, or connections), when it is one.
    level: Option<f64>,
}

impl Default for Exposition {
    fn default() -> Self {
        Self {
            role: String::new(),
            totals: Interval::empty(0, 0, String::new()),
            gauges: BTreeMap::new(),
            lag_us: BTreeMap::new(),
            late: 0,
            flushed: 0,
            start_unix_ns: 0,
            level: None,
        }
    }
}

impl Exposition {
    /// Takes one flushed interval of `role`'s run: its levels, and the run's
    /// `totals` so far. `show`: the interval's first flush (a late record
    /// flushed again has no levels of its own).
    pub fn flushed(&mut self, role: &str, totals: &Interval, merged: &Interval, show: bool) {
        role.clone_into(&mut self.role);
        self.totals = totals.clone();
        if show {
            self.gauges.clone_from(&merged.gauges);
            self.lag_us = merged
                .histograms
                .iter()
                .filter(|(name, _)| name.ends_with("lag"))
                .map(|(name, h)| (name.clone(), h.max()))
                .collect();
            self.flushed += 1;
        }
    }

    /// A knee search runs `level` now: its counters start again from zero.
    pub fn level(&mut self, level: f64) {
        self.level = Some(level);
    }

    /// Workers late with the last interval, and when the run started.
    pub fn progress(&mut self, late: usize, start_unix_ns: u64) {
        self.late = late;
        self.start_unix_ns = start_unix_ns;
    }

    /// Prometheus text (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let role = escape(&self.role);
        // Every grouped family is declared, counted or not: a dashboard's
        // query of it finds the family.
        let mut families: BTreeMap<String, Vec<(String, u64)>> = GROUPED
            .iter()
            .map(|(_, family, _)| ((*family).to_owned(), Vec::new()))
            .collect();
        let known = KNOWN
            .iter()
            .filter(|(r, _)| *r == self.role)
            .flat_map(|(_, names)| names.iter())
            .filter(|n| !self.totals.counters.contains_key(**n))
            .map(|n| ((*n).to_owned(), 0));
        let counters: Vec<(String, u64)> = self
            .totals
            .counters
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .chain(known)
            .collect();
        for (name, v) in &counters {
            let (family, label) = match GROUPED.iter().find(|(p, ..)| name.starts_with(p)) {
                Some((p, family, label)) => (
                    (*family).to_owned(),
                    format!(",{label}=\"{}\"", escape(&name[p.len()..])),
                ),
                None => (format!("{}_total", metric_name(name)), String::new()),
            };
            families.entry(family).or_default().push((label, *v));
        }
        for (family, rows) in &families {
            let _ = writeln!(out, "# TYPE {PREFIX}{family} counter");
            for (label, v) in rows {
                let _ = writeln!(out, "{PREFIX}{family}{{role=\"{role}\"{label}}} {v}");
            }
        }
        for (name, v) in &self.gauges {
            let family = metric_name(name);
            let _ = writeln!(out, "# TYPE {PREFIX}{family} gauge");
            let _ = writeln!(out, "{PREFIX}{family}{{role=\"{role}\"}} {v}");
        }
        if !self.lag_us.is_empty() {
            let _ = writeln!(
                out,
                "# HELP {PREFIX}lag_max_seconds the generator's largest lag behind its schedule in the last interval"
            );
            let _ = writeln!(out, "# TYPE {PREFIX}lag_max_seconds gauge");
            for (name, us) in &self.lag_us {
                let _ = writeln!(
                    out,
                    "{PREFIX}lag_max_seconds{{role=\"{role}\",histogram=\"{}\"}} {}",
                    escape(name),
                    seconds(*us)
                );
            }
        }
        for (name, h) in &self.totals.histograms {
            histogram(&mut out, &role, &metric_name(name), h);
        }
        let scalars = [
            ("intervals_flushed_total", "counter", self.flushed as f64),
            ("workers_late", "gauge", self.late as f64),
            (
                "start_time_seconds",
                "gauge",
                self.start_unix_ns as f64 / 1e9,
            ),
        ];
        for (family, kind, v) in scalars {
            let _ = writeln!(out, "# TYPE {PREFIX}{family} {kind}");
            let _ = writeln!(out, "{PREFIX}{family}{{role=\"{role}\"}} {v}");
        }
        if let Some(level) = self.level {
            let _ = writeln!(out, "# TYPE {PREFIX}knee_level gauge");
            let _ = writeln!(out, "{PREFIX}knee_level{{role=\"{role}\"}} {level}");
        }
        out
    }
}

/// One latency histogram (µs) as a Prometheus histogram in seconds.
fn histogram(out: &mut String, role: &str, name: &str, h: &Histogram<u64>) {
    let family = format!("{PREFIX}{name}_seconds");
    let _ = writeln!(out, "# TYPE {family} histogram");
    for le in BUCKETS_US {
        let n = if h.is_empty() {
            0
        } else {
            h.count_between(0, le)
        };
        let _ = writeln!(
            out,
            "{family}_bucket{{role=\"{role}\",le=\"{}\"}} {n}",
            seconds(le)
        );
    }
    let sum_us: f64 = h
        .iter_recorded()
        .map(|v| v.value_iterated_to() as f64 * v.count_at_value() as f64)
        .sum();
    let _ = writeln!(
        out,
        "{family}_bucket{{role=\"{role}\",le=\"+Inf\"}} {}",
        h.len()
    );
    let _ = writeln!(out, "{family}_sum{{role=\"{role}\"}} {}", sum_us / 1e6);
    let _ = writeln!(out, "{family}_count{{role=\"{role}\"}} {}", h.len());
}

/// µs as seconds, as Prometheus writes them.
fn seconds(us: u64) -> String {
    format!("{}", us as f64 / 1e6)
}

/// A dotted result-file name as a metric name: `connect.tcp` -> `connect_tcp`.
fn metric_name(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// A label value with `\`, `"` and line breaks escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The endpoint: a listening socket served by a thread of its own, and the
/// latest [`Exposition`] it answers with. Clones share both.
#[derive(Debug, Clone)]
pub struct Metrics {
    addr: SocketAddr,
    board: Arc<Mutex<Exposition>>,
}

impl Metrics {
    /// Listens on `addr` (port 0: any free one) and serves `/metrics` until
    /// the process ends.
    pub fn listen(addr: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("--metrics-listen {addr}: {e}")))?;
        let metrics = Self {
            addr: listener.local_addr()?,
            board: Arc::new(Mutex::new(Exposition::default())),
        };
        let board = metrics.board.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    // One scraper at a time, each bounded by its timeouts.
                    let _ = answer(stream, &board);
                }
            })?;
        Ok(metrics)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes what scrapers get.
    pub fn update(&self, change: impl FnOnce(&mut Exposition)) {
        // A panic elsewhere while holding the lock leaves figures still worth showing.
        let mut board = self
            .board
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(&mut board);
    }

    /// The start line that says where the figures are.
    pub fn line(&self) -> String {
        format!(
            "  metrics: http://{}/metrics (Prometheus text: totals, levels and latency histograms, every worker merged, after each interval)",
            self.addr
        )
    }
}

/// Reads one request and answers it: `/metrics` with the figures, anything
/// else 404 (or 405 for a method other than GET/HEAD); the connection closes.
fn answer(mut stream: TcpStream, board: &Mutex<Exposition>) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST {
            return respond(&mut stream, "431 Request Header Fields Too Large", "", b"");
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, target) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET" | b"HEAD", b"/metrics") => {
            let text = board
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .render();
            let body = if method == b"HEAD" {
                &b""[..]
            } else {
                text.as_bytes()
            };
            respond(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                body,
            )
        }
        (b"GET" | b"HEAD", _) => respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            b"the figures are on /metrics\n",
        ),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            b"GET /metrics\n",
        ),
    }
}

fn respond(stream: &mut TcpStream, status: &str, kind: &str, body: &[u8]) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if !kind.is_empty() {
        head.push_str(&format!("Content-Type: {kind}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use throng_report::interval::new_histogram;

    fn interval() -> Interval {
        let mut iv = Interval::empty(0, 1_000_000_000, "h/hold".into());
        iv.counters.insert("connect.ok".into(), 7);
        iv.counters.insert("connect.error.refused".into(), 2);
        iv.counters.insert("closed.server.1008".into(), 1);
        iv.gauges.insert("connections.open".into(), 5);
        let mut h = new_histogram();
        for us in [50, 900, 3_000, 2_000_000] {
            h.record(us).unwrap();
        }
        iv.histograms.insert("connect".into(), h);
        let mut lag = new_histogram();
        lag.record(1_500).unwrap();
        iv.histograms.insert("connect.lag".into(), lag);
        iv
    }

    #[test]
    fn counters_gauges_and_histograms_as_prometheus_text() {
        let mut e = Exposition::default();
        let iv = interval();
        e.flushed("hold", &iv, &iv, true);
        e.progress(1, 2_000_000_000);
        let text = e.render();
        for line in [
            "# TYPE throng_load_connect_ok_total counter",
            "throng_load_connect_ok_total{role=\"hold\"} 7",
            "throng_load_connect_errors_total{role=\"hold\",kind=\"refused\"} 2",
            "throng_load_closed_total{role=\"hold\",how=\"server.1008\"} 1",
            "throng_load_connections_open{role=\"hold\"} 5",
            "throng_load_lag_max_seconds{role=\"hold\",histogram=\"connect.lag\"} 0.0015",
            "# TYPE throng_load_connect_seconds histogram",
            "throng_load_connect_seconds_bucket{role=\"hold\",le=\"0.0001\"} 1",
            "throng_load_connect_seconds_bucket{role=\"hold\",le=\"0.001\"} 2",
            "throng_load_connect_seconds_bucket{role=\"hold\",le=\"2.5\"} 4",
            "throng_load_connect_seconds_bucket{role=\"hold\",le=\"+Inf\"} 4",
            "throng_load_connect_seconds_count{role=\"hold\"} 4",
            "throng_load_workers_late{role=\"hold\"} 1",
            "throng_load_start_time_seconds{role=\"hold\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // Each family typed once (a `lag` histogram and the lag gauge apart).
        let mut lag = Interval::empty(0, 1_000_000_000, "h/attack".into());
        lag.histograms.insert("lag".into(), new_histogram());
        let mut totals = iv.clone();
        totals.add(&lag);
        e.flushed("attack", &totals, &totals, true);
        let text = e.render();
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let unique: std::collections::BTreeSet<&str> = types.iter().copied().collect();
        assert_eq!(types.len(), unique.len(), "{text}");
        // Buckets never go down.
        let buckets: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with("throng_load_connect_seconds_bucket"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    }

    #[test]
    fn a_late_record_changes_the_totals_not_the_levels() {
        let mut e = Exposition::default();
        let iv = interval();
        e.flushed("hold", &iv, &iv, true);
        let mut late = Interval::empty(0, 1_000_000_000, "h/hold".into());
        late.counters.insert("connect.ok".into(), 3);
        let mut totals = iv.clone();
        totals.add(&late);
        e.flushed("hold", &totals, &late, false);
        let text = e.render();
        assert!(
            text.contains("throng_load_connect_ok_total{role=\"hold\"} 10\n"),
            "{text}"
        );
        assert!(
            text.contains("throng_load_connections_open{role=\"hold\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("throng_load_intervals_flushed_total{role=\"hold\"} 1\n"),
            "{text}"
        );
    }

    /// A real socket: /metrics answers, another path is 404, a request
    /// that never ends is cut off.
    #[test]
    fn the_endpoint_answers_over_a_socket() {
        let m = Metrics::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let iv = interval();
        m.update(|e| e.flushed("attack", &iv, &iv, true));
        let ask = |req: &[u8]| {
            let mut s = TcpStream::connect(m.addr()).unwrap();
            s.write_all(req).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let ok = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("throng_load_connect_ok_total{role=\"attack\"} 7"),
            "{ok}"
        );
        assert!(ask(b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(ask(b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let long = [b'a'; MAX_REQUEST + 10];
        assert!(ask(&long).starts_with("HTTP/1.1 431"));
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let err = Metrics::listen(taken.local_addr().unwrap()).unwrap_err();
        assert!(err.to_string().contains("--metrics-listen"), "{err}");
    }
}
