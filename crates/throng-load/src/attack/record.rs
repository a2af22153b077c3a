//! What an `attack` worker counts, turned into one [`Interval`] per second,
//! and the optional per-request rows (`--per-request`).
//!
//! Names in the interval (the result-file contract, `docs/results-format.md`):
//!
//! - counters: `requests.sent`, `requests.late` (started more than
//!   [`LATE_US`] after the intended time), `requests.retried` (a reused
//!   keep-alive connection was found closed and the request went again on a
//!   new one), `requests.error.<kind>` ([`RequestError`]; TLS failures are
//!   `requests.error.tls.<reason>`), `status.<code>`, `bytes.in`,
//!   `bytes.out` (HTTP bytes: before encryption on `https://`),
//!   `connections.opened`, `tls.handshakes.full`, `tls.handshakes.resumed`;
//! - gauges: `requests.in_flight`, `connections.open`;
//! - histograms (µs): `latency` (intended start → last response byte),
//!   `latency.timeout` and `latency.error` (intended start → the moment a
//!   request was given up at `--timeout`, or failed: with `latency`, every
//!   request),
//!   `service` (actual send → last response byte; a new connection's
//!   connect included), `lag` (intended start → actual send: the
//!   generator's own delay, waiting for a free connection included),
//!   `connect.tcp` (TCP connect of each new connection) and `connect.tls`
//!   (its TLS handshake, `https://` only).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use throng_report::interval::{Interval, new_histogram};

use crate::harness::failure::{Failure, NetCause, OwnKind, Tally};
use crate::harness::recorder::{Level, Recorder, Take, record};

/// One request's own figures, for its row.
#[derive(Debug)]
pub(super) struct Io {
    pub(super) bytes_in: u64,
    pub(super) bytes_out: u64,
    /// When the generator started it.
    pub(super) began: Instant,
    /// When it went on the wire: a connection was taken from the pool, or
    /// a new one began to connect.
    pub(super) sent_at: Option<Instant>,
}

/// A request started more than this after its intended time counts as late.
pub const LATE_US: u64 = 10_000;

/// `attack`'s own ways for a request to fail, beside the socket's and TLS's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// The server closed the connection before the response ended.
    Closed,
    /// The response was not valid HTTP/1.x (head or body framing).
    BadResponse,
    /// Still in flight when the run was stopped (Ctrl-C).
    Canceled,
    /// The server reset the HTTP/2 stream (RST_STREAM other than
    /// REFUSED_STREAM, which is retried).
    StreamReset,
}

impl OwnKind for Exchange {
    const ALL: &'static [Self] = &[
        Self::Closed,
        Self::BadResponse,
        Self::Canceled,
        Self::StreamReset,
    ];
    const TLS_CLOSED: Failure<Self> = Failure::Own(Self::Closed);

    fn label(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::BadResponse => "bad_response",
            Self::Canceled => "canceled",
            Self::StreamReset => "stream_reset",
        }
    }
}

/// Why a request got no (complete) response; each is `requests.error.<label>`
/// (a timeout is the socket's `timeout`: no complete response within `--timeout`).
pub type RequestError = Failure<Exchange>;

/// Per-interval counts and histograms of one `attack` worker.
#[derive(Debug)]
pub struct AttackRecorder {
    source: String,
    length_ns: u64,
    sent: u64,
    late: u64,
    retried: u64,
    opened: u64,
    failed: Tally<Exchange>,
    tls_full: u64,
    tls_resumed: u64,
    /// Responses by status code; index = code (100..=999 fit).
    status: Box<[u64; 1000]>,
    bytes_in: u64,
    bytes_out: u64,
    /// Requests started and not yet finished (a level).
    in_flight: Level,
    /// Connections open, idle ones included (a level).
    open: Level,
    latency: Histogram<u64>,
    /// Requests given up at `--timeout`, at that time (the result file's
    /// `latency.timeout`).
    latency_timeout: Histogram<u64>,
    /// Requests that failed otherwise, at the time they failed (`latency.error`).
    latency_error: Histogram<u64>,
    service: Histogram<u64>,
    lag: Histogram<u64>,
    connect_tcp: Histogram<u64>,
    connect_tls: Histogram<u64>,
}

impl AttackRecorder {
    /// A recorder for `source` (`"host/attack-0"`) with intervals of `length_ns`.
    pub fn new(source: String, length_ns: u64) -> Self {
        Self {
            source,
            length_ns,
            sent: 0,
            late: 0,
            retried: 0,
            opened: 0,
            failed: Tally::default(),
            tls_full: 0,
            tls_resumed: 0,
            status: Box::new([0; 1000]),
            bytes_in: 0,
            bytes_out: 0,
            in_flight: Level::default(),
            open: Level::default(),
            latency: new_histogram(),
            latency_timeout: new_histogram(),
            latency_error: new_histogram(),
            service: new_histogram(),
            lag: new_histogram(),
            connect_tcp: new_histogram(),
            connect_tls: new_histogram(),
        }
    }

    /// A request was started (at or after its intended time).
    pub fn started(&mut self) {
        self.sent += 1;
        self.in_flight.up();
    }

    /// A request went on the wire `lag_us` after its intended time.
    pub fn lag(&mut self, lag_us: u64) {
        if lag_us > LATE_US {
            self.late += 1;
        }
        record(&mut self.lag, lag_us);
    }

    /// A whole response arrived.
    pub fn answered(&mut self, status: u16, latency_us: u64, service_us: u64) {
        self.in_flight.down();
        if let Some(n) = self.status.get_mut(usize::from(status)) {
            *n += 1;
        }
        record(&mut self.latency, latency_us);
        record(&mut self.service, service_us);
    }

    /// A request failed `latency_us` after its intended start: a timeout
    /// counts at its timeout, another failure when it failed, so that the
    /// run's latency leaves no request out.
    pub fn failed(&mut self, why: RequestError, latency_us: u64) {
        self.in_flight.down();
        self.failed.add(why);
        if why == Failure::Net(NetCause::Timeout) {
            record(&mut self.latency_timeout, latency_us);
        } else {
            record(&mut self.latency_error, latency_us);
        }
    }

    /// Requests still in flight are abandoned (the run was stopped).
    pub fn cancel_in_flight(&mut self) {
        let n = u64::try_from(self.in_flight.get()).unwrap_or(0);
        self.failed.add_n(Failure::Own(Exchange::Canceled), n);
        self.in_flight.set(0);
    }

    /// A request is sent again on a new connection.
    pub fn retried(&mut self) {
        self.retried += 1;
    }

    /// A new connection's TCP connect took `tcp_us`, and its TLS handshake
    /// (`https://`) `tls_us`, resumed or full.
    pub fn connect_phases(&mut self, tcp_us: u64, tls: Option<(u64, bool)>) {
        record(&mut self.connect_tcp, tcp_us);
        if let Some((us, resumed)) = tls {
            record(&mut self.connect_tls, us);
            if resumed {
                self.tls_resumed += 1;
            } else {
                self.tls_full += 1;
            }
        }
    }

    /// A connection was opened.
    pub fn connection_opened(&mut self) {
        self.opened += 1;
        self.open.up();
    }

    /// A connection was closed.
    pub fn connection_closed(&mut self) {
        self.open.down();
    }

    /// Bytes written.
    pub fn bytes_out(&mut self, n: usize) {
        self.bytes_out += n as u64;
    }

    /// Bytes read.
    pub fn bytes_in(&mut self, n: usize) {
        self.bytes_in += n as u64;
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }
}

impl Recorder for AttackRecorder {
    fn take(&mut self, start_ns: u64) -> Interval {
        let mut t = Take::default();
        t.count("requests.sent", &mut self.sent)
            .count("requests.late", &mut self.late)
            .count("requests.retried", &mut self.retried)
            .count("connections.opened", &mut self.opened)
            .count("bytes.in", &mut self.bytes_in)
            .count("bytes.out", &mut self.bytes_out)
            .count("tls.handshakes.full", &mut self.tls_full)
            .count("tls.handshakes.resumed", &mut self.tls_resumed);
        self.failed.take_into("requests.error", &mut t);
        for (code, n) in self.status.iter_mut().enumerate() {
            if *n > 0 {
                t.count(&format!("status.{code}"), n);
            }
        }
        t.histogram("latency", &mut self.latency)
            .histogram("latency.timeout", &mut self.latency_timeout)
            .histogram("latency.error", &mut self.latency_error)
            .histogram("service", &mut self.service)
            .histogram("lag", &mut self.lag)
            .histogram("connect.tcp", &mut self.connect_tcp)
            .histogram("connect.tls", &mut self.connect_tls)
            .level("requests.in_flight", &mut self.in_flight)
            .level("connections.open", &mut self.open);
        t.into_interval(start_ns, self.length_ns, self.source.clone())
    }
}

/// How per-request rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowFormat {
    /// Comma-separated, with a header line ([`CSV_HEADER`]).
    Csv,
    /// One JSON object per line.
    JsonLines,
    /// Vegeta's JSON results, one per line (`attack --format vegeta`), for
    /// `vegeta report`, `vegeta plot` and `vegeta encode`.
    Vegeta,
}

impl RowFormat {
    /// CSV for a `.csv` file name, JSON lines otherwise.
    pub fn for_path(path: &Path) -> Self {
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
        {
            Self::Csv
        } else {
            Self::JsonLines
        }
    }
}

/// The CSV header line.
pub const CSV_HEADER: &str = "seq,worker,target,intended_ns,started_ns,latency_us,service_us,status,error,bytes_in,bytes_out\n";

/// One request's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The request's number in the schedule (0-based, over all workers).
    pub seq: u64,
    /// The worker that sent it.
    pub worker: u32,
    /// Which target (0-based, in the targets' order).
    pub target: usize,
    /// Intended start, ns since the Unix epoch.
    pub intended_ns: u64,
    /// Actual start, ns since the Unix epoch.
    pub started_ns: u64,
    /// Intended start → end (µs).
    pub latency_us: u64,
    /// Actual start → end (µs).
    pub service_us: u64,
    /// The status code (0 when there was no response).
    pub status: u16,
    /// The failure kind, empty when a response arrived.
    pub error: &'static str,
    /// Bytes read.
    pub bytes_in: u64,
    /// Bytes written.
    pub bytes_out: u64,
    /// Intended start → end (ns): Vegeta's latency.
    #[serde(skip)]
    pub latency_ns: u64,
}

/// One result as Vegeta's `easyjson` encoder writes it: its field names,
/// latency in ns, the timestamp as Go's RFC 3339 with nanoseconds.
#[derive(Serialize)]
struct VegetaRow<'a> {
    attack: &'a str,
    seq: u64,
    code: u16,
    timestamp: String,
    latency: u64,
    bytes_out: u64,
    bytes_in: u64,
    error: String,
    /// The response body, base64 (as Go writes `[]byte`); `null` when
    /// none was kept (HTTP/2, a failed request).
    body: Option<String>,
    method: &'a str,
    url: &'a str,
    /// The response headers as Go's `http.Header`: canonical names, each
    /// with its values.
    headers: Option<BTreeMap<String, Vec<String>>>,
}

/// A response's headers and body, kept for Vegeta's results (`--format
/// vegeta`); other runs read and drop responses as they arrive.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Header lines in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, decoded, up to [`MAX_KEPT_BODY`].
    pub body: Vec<u8>,
}

/// The most of a response body kept for a result (Vegeta's `-max-body`
/// keeps all; a bound here keeps memory bounded).
pub const MAX_KEPT_BODY: usize = 1 << 20;

impl Answer {
    /// The headers as Go's `http.Header`.
    fn header_map(&self) -> BTreeMap<String, Vec<String>> {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in &self.headers {
            map.entry(canonical_header(name))
                .or_default()
                .push(String::from_utf8_lossy(value).into_owned());
        }
        map
    }
}

/// A header name as Go's `CanonicalMIMEHeaderKey` writes it: each word
/// (split by `-`) capitalised, the rest lower case.
fn canonical_header(name: &str) -> String {
    let mut upper = true;
    name.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

/// The name of Vegeta's results throng writes (`vegeta plot` labels by it).
pub const VEGETA_ATTACK: &str = "throng";

/// What Vegeta's `error` says of a row: the failure, or for a status
/// outside 2xx and 3xx the status line as Go's client gives it.
fn vegeta_error(r: &Row) -> String {
    if !r.error.is_empty() {
        return r.error.to_owned();
    }
    if (200..400).contains(&r.status) {
        return String::new();
    }
    let reason = match throng_proto::http::reason_phrase(r.status) {
        "Unknown" => "",
        known => known,
    };
    format!("{} {reason}", r.status).trim_end().to_owned()
}

/// Appends rows to a file shared by every worker: each write is a block of
/// whole lines on an `O_APPEND` file, so workers' rows never interleave
/// within a line.
#[derive(Debug)]
pub struct RowWriter {
    file: std::fs::File,
    format: RowFormat,
    buf: Vec<u8>,
    /// Writes of at most this many bytes: a pipe (`| vegeta report`)
    /// keeps only writes up to `PIPE_BUF` whole among many writers.
    max_write: usize,
}

/// Flush when the buffer passes this.
const ROW_FLUSH: usize = 32 * 1024;

impl RowWriter {
    /// Opens `path` for appending (the supervisor created it).
    pub fn open(path: &Path, format: RowFormat) -> io::Result<Self> {
        use std::os::unix::fs::FileTypeExt as _;
        let file = std::fs::OpenOptions::new().append(true).open(path)?;
        let max_write = if file.metadata()?.file_type().is_fifo() {
            libc::PIPE_BUF
        } else {
            usize::MAX
        };
        Ok(Self {
            file,
            format,
            buf: Vec::with_capacity(ROW_FLUSH + 512),
            max_write,
        })
    }

    /// Adds one row, of a request to `method` `url` answered `answer`
    /// (Vegeta's rows name them, and carry the answer's headers and body).
    pub fn push(
        &mut self,
        r: &Row,
        (method, url): (&str, &str),
        answer: Option<&Answer>,
    ) -> io::Result<()> {
        match self.format {
            RowFormat::Csv => {
                let _ = writeln!(
                    self.buf,
                    "{},{},{},{},{},{},{},{},{},{},{}",
                    r.seq,
                    r.worker,
                    r.target,
                    r.intended_ns,
                    r.started_ns,
                    r.latency_us,
                    r.service_us,
                    r.status,
                    r.error,
                    r.bytes_in,
                    r.bytes_out
                );
            }
            RowFormat::JsonLines => {
                serde_json::to_writer(&mut self.buf, r).map_err(io::Error::other)?;
                self.buf.push(b'\n');
            }
            RowFormat::Vegeta => {
                let row = VegetaRow {
                    attack: VEGETA_ATTACK,
                    seq: r.seq,
                    code: r.status,
                    timestamp: throng_report::format::rfc3339_nanos(r.intended_ns),
                    latency: r.latency_ns,
                    bytes_out: r.bytes_out,
                    bytes_in: r.bytes_in,
                    error: vegeta_error(r),
                    body: answer.map(|a| {
                        use base64::Engine as _;
                        base64::engine::general_purpose::STANDARD.encode(&a.body)
                    }),
                    method,
                    url,
                    headers: answer.map(Answer::header_map),
                };
                serde_json::to_writer(&mut self.buf, &row).map_err(io::Error::other)?;
                self.buf.push(b'\n');
            }
        }
        if self.buf.len() >= ROW_FLUSH {
            self.flush()
        } else {
            Ok(())
        }
    }

    /// Writes what is buffered, whole lines only: in one `write`, or on a
    /// pipe in writes of at most `PIPE_BUF` (a longer line alone).
    pub fn flush(&mut self) -> io::Result<()> {
        let mut rest = &self.buf[..];
        while !rest.is_empty() {
            let cut = if rest.len() <= self.max_write {
                rest.len()
            } else {
                rest[..self.max_write]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .or_else(|| rest.iter().position(|&b| b == b'\n'))
                    .map_or(rest.len(), |i| i + 1)
            };
            self.file.write_all(&rest[..cut])?;
            rest = &rest[cut..];
        }
        self.buf.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_resets_counts_keeps_levels() {
        let mut r = AttackRecorder::new("h/attack-0".into(), 1_000_000_000);
        for lag in [5, LATE_US + 1, 1] {
            r.started();
            r.lag(lag);
        }
        r.answered(200, 1500, 900);
        r.answered(503, 10, 9);
        r.connection_opened();
        r.bytes_out(100);
        let iv = r.take(1_000_000_000);
        assert_eq!(iv.counters["requests.sent"], 3);
        assert_eq!(iv.counters["requests.late"], 1);
        assert_eq!(iv.counters["status.200"], 1);
        assert_eq!(iv.counters["status.503"], 1);
        assert_eq!(iv.gauges["requests.in_flight"], 1);
        assert_eq!(iv.gauges["connections.open"], 1);
        assert_eq!(iv.histograms["latency"].len(), 2);
        assert_eq!(iv.histograms["lag"].len(), 3);
        r.failed(Failure::Net(NetCause::Timeout), 2_000_000);
        let next = r.take(2_000_000_000);
        assert_eq!(next.counters.len(), 1);
        assert_eq!(next.counters["requests.error.timeout"], 1);
        assert_eq!(next.gauges["requests.in_flight"], 0);
        assert_eq!(next.histograms.len(), 1);
        assert!(next.histograms["latency.timeout"].max() >= 1_999_000);
        r.started();
        r.failed(Failure::Net(NetCause::Refused), 300);
        let third = r.take(3_000_000_000);
        assert_eq!(third.histograms["latency.error"].len(), 1);
        assert_eq!(third.every_request_stats().count, 1);
    }

    #[test]
    fn vegeta_rows_carry_vegetas_fields_and_units() {
        let dir = throng_testkit::TempDir::new("vegeta-rows");
        let path = dir.file("rows.json");
        std::fs::write(&path, "").unwrap();
        let mut w = RowWriter::open(&path, RowFormat::Vegeta).unwrap();
        let url = "http://h:1/p?q=\"x\"";
        let row = |status, error| Row {
            seq: 7,
            worker: 1,
            target: 0,
            intended_ns: 1_795_831_310_000_000_123,
            started_ns: 1_795_831_310_000_500_000,
            latency_us: 1_234,
            service_us: 700,
            status,
            error,
            bytes_in: 92,
            bytes_out: 45,
            latency_ns: 1_234_567,
        };
        let answer = Answer {
            headers: vec![
                ("content-type".into(), b"text/plain".to_vec()),
                ("x-many".into(), b"a".to_vec()),
                ("X-MANY".into(), b"b".to_vec()),
            ],
            body: b"ok".to_vec(),
        };
        w.push(&row(200, ""), ("POST", url), Some(&answer)).unwrap();
        w.push(&row(503, ""), ("POST", url), None).unwrap();
        w.push(&row(0, "timeout"), ("POST", url), None).unwrap();
        w.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        let ok = &lines[0];
        assert_eq!(ok["attack"], VEGETA_ATTACK);
        assert_eq!(ok["seq"], 7);
        assert_eq!(ok["code"], 200);
        // The intended start, to the ns; the latency in ns.
        assert_eq!(ok["timestamp"], "2026-11-28T02:01:50.000000123Z");
        assert_eq!(ok["latency"], 1_234_567);
        assert_eq!(
            (ok["bytes_in"].as_u64(), ok["bytes_out"].as_u64()),
            (Some(92), Some(45))
        );
        assert_eq!(ok["error"], "");
        assert_eq!(ok["method"], "POST");
        assert_eq!(ok["url"], "http://h:1/p?q=\"x\"");
        // Go's []byte is base64; http.Header canonical names, values in order.
        assert_eq!(ok["body"], "b2s=");
        assert_eq!(
            ok["headers"],
            serde_json::json!({"Content-Type": ["text/plain"], "X-Many": ["a", "b"]})
        );
        assert!(lines[1]["body"].is_null() && lines[1]["headers"].is_null());
        assert_eq!(lines[1]["error"], "503 Service Unavailable");
        assert_eq!(
            (lines[2]["code"].as_u64(), lines[2]["error"].as_str()),
            (Some(0), Some("timeout"))
        );
    }
}
