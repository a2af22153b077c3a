//! Vegeta's result files (`vegeta attack | vegeta encode --to json` or
//! `--to csv`) read as one more `attack` run: each result is counted into
//! the one-second interval of its timestamp, so a report merges them with
//! throng's own attack files.
//!
//! A Vegeta result's timestamp is when its request began and its latency
//! runs to the end of the response, in nanoseconds; here latencies are
//! recorded in µs like every throng histogram. A result with a status code
//! counts as `status.<code>` and its latency as `latency`; one without (an
//! error before any response) as `requests.error.<kind>` with its latency
//! in `latency.timeout` or `latency.error`, as throng counts its own.
//! Vegeta's `bytes_in` and `bytes_out` count bodies only (throng's own
//! count the whole HTTP exchange).

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read as _};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::format::{
    Damage, FORMAT_VERSION, FileSummary, Header, MAX_RECORD_BYTES, ReadError, Record, rfc3339,
};
use crate::interval::{HISTOGRAM_MAX_US, Interval, new_histogram};

/// How a Vegeta result file is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// One JSON object per line (`vegeta encode --to json`, `vegeta attack -format json`... ).
    Json,
    /// Twelve comma-separated fields per line, no header (`vegeta encode --to csv`).
    Csv,
}

impl Encoding {
    fn name(self) -> &'static str {
        match self {
            Self::Json => "vegeta-json",
            Self::Csv => "vegeta-csv",
        }
    }
}

/// Intervals are this long, as throng's own attack writes them.
const WIDTH_NS: u64 = 1_000_000_000;

/// Results arrive in the order their responses ended, so a second's
/// results keep coming until its slowest request ends. An interval is
/// handed on once a result this much later has been read; a result that
/// comes later still goes into an interval of its own (a source of its own,
/// so nothing is counted twice or dropped). Bounds memory to this many
/// intervals' histograms.
const HORIZON_NS: u64 = 60 * WIDTH_NS;

/// One Vegeta result, the fields a report uses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hit {
    attack: String,
    timestamp_ns: u64,
    code: u16,
    latency_ns: u64,
    bytes_out: u64,
    bytes_in: u64,
    error: String,
}

/// Vegeta's JSON result, as `easyjson` writes it (body, method, URL and
/// headers are not needed for a report and are not kept).
#[derive(Debug, Deserialize)]
struct JsonHit {
    #[serde(default)]
    attack: String,
    #[serde(default)]
    code: u16,
    timestamp: String,
    #[serde(default)]
    latency: i64,
    #[serde(default)]
    bytes_out: u64,
    #[serde(default)]
    bytes_in: u64,
    #[serde(default)]
    error: String,
}

/// Decodes one line of `enc`.
fn decode(enc: Encoding, line: &str) -> Result<Hit, String> {
    match enc {
        Encoding::Json => {
            let j: JsonHit =
                serde_json::from_str(line).map_err(|e| format!("not a Vegeta JSON result: {e}"))?;
            Ok(Hit {
                timestamp_ns: parse_rfc3339(&j.timestamp)
                    .ok_or_else(|| format!("timestamp {:?} is not RFC 3339", j.timestamp))?,
                attack: j.attack,
                code: j.code,
                latency_ns: u64::try_from(j.latency)
                    .map_err(|_| "a negative latency".to_owned())?,
                bytes_out: j.bytes_out,
                bytes_in: j.bytes_in,
                error: j.error,
            })
        }
        Encoding::Csv => {
            let f = split_csv(line)?;
            if f.len() != 12 {
                return Err(format!(
                    "a Vegeta CSV result has 12 fields, this line {}",
                    f.len()
                ));
            }
            let num = |i: usize, what: &str| {
                f[i].parse::<u64>()
                    .map_err(|_| format!("field {} ({what}) {:?} is not a number", i + 1, f[i]))
            };
            Ok(Hit {
                timestamp_ns: num(0, "timestamp")?,
                code: u16::try_from(num(1, "code")?)
                    .map_err(|_| "a status code above 65535".to_owned())?,
                latency_ns: num(2, "latency")?,
                bytes_out: num(3, "bytes out")?,
                bytes_in: num(4, "bytes in")?,
                error: f[5].clone(),
                attack: f[7].clone(),
            })
        }
    }
}

/// One line of RFC 4180 CSV (as Go's `encoding/csv` writes it: a field
/// with a comma or quote is quoted, quotes doubled) split into fields.
fn split_csv(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = line.trim_end_matches(['\r', '\n']).chars().peekable();
    loop {
        let mut field = String::new();
        // Go's reader with TrimLeadingSpace, as Vegeta's decoder sets it.
        while chars.peek() == Some(&' ') {
            chars.next();
        }
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err("a quoted CSV field that does not end on its line".into()),
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(c) => return Err(format!("{c:?} after a quoted CSV field")),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
    }
}

/// RFC 3339 (`2026-11-28T02:01:50.123456789Z`, or with an offset such as
/// `+01:00`, as Go writes local times) to ns since the Unix epoch.
fn parse_rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let digits = |from: usize, n: usize| -> Option<i64> {
        let part = b.get(from..from + n)?;
        part.iter().all(u8::is_ascii_digit).then(|| {
            part.iter()
                .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'))
        })
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (y, mo, d) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (h, mi, sec) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            if i - start < 9 {
                nanos = nanos * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        if i == start {
            return None;
        }
        for _ in (i - start)..9 {
            nanos *= 10;
        }
    }
    let offset_s = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let off = digits(i + 1, 2)? * 3600 + digits(i + 4, 2)? * 60;
            if *sign == b'+' { off } else { -off }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    u64::try_from(secs)
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(u64::try_from(nanos).ok()?)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The failure kind (throng's `requests.error.<kind>`) of a Vegeta error
/// without a status code, from Go's error text.
fn error_kind(error: &str) -> &'static str {
    let e = error.to_ascii_lowercase();
    if e.contains("timeout") || e.contains("deadline exceeded") {
        "timeout"
    } else if e.contains("connection refused") {
        "refused"
    } else if e.contains("connection reset") || e.contains("broken pipe") || e.contains("eof") {
        "reset"
    } else if e.contains("assign requested address") || e.contains("address already in use") {
        "addr_not_available"
    } else if e.contains("tls") || e.contains("x509") || e.contains("certificate") {
        "tls"
    } else {
        "other"
    }
}

/// What the first line of `path` says it is: a Vegeta result file
/// (`Some`), or something else (`None`: a throng file, or neither).
pub fn sniff(path: &Path) -> Result<Option<Encoding>, ReadError> {
    sniff_io(path).map_err(|error| ReadError::Io {
        path: path.to_path_buf(),
        error,
    })
}

fn sniff_io(path: &Path) -> io::Result<Option<Encoding>> {
    let mut input = BufReader::new(File::open(path)?);
    let mut first = Vec::new();
    input
        .by_ref()
        .take(MAX_RECORD_BYTES as u64)
        .read_until(b'\n', &mut first)?;
    let Ok(line) = std::str::from_utf8(&first) else {
        return Ok(None);
    };
    if line.trim_start().starts_with('{') {
        return Ok(serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .filter(|v| {
                v.get("throng").is_none()
                    && ["code", "latency", "timestamp"]
                        .iter()
                        .all(|k| v.get(k).is_some())
            })
            .map(|_| Encoding::Json));
    }
    Ok(decode(Encoding::Csv, line).ok().map(|_| Encoding::Csv))
}

/// [`crate::format::read_files`], with Vegeta's result files read too
/// (each as one attack run).
pub fn read_files<P: AsRef<Path>>(
    paths: &[P],
    mut visit: impl FnMut(usize, Record),
) -> Result<Vec<FileSummary>, ReadError> {
    let mut summaries = Vec::with_capacity(paths.len());
    for (i, path) in paths.iter().enumerate() {
        let Some(enc) = sniff(path.as_ref())? else {
            summaries.push(crate::format::read_file(i, path, &mut visit)?);
            continue;
        };
        let mut reader = VegetaReader::open(path.as_ref(), enc)?;
        visit(i, Record::Header(reader.header.clone()));
        for record in reader.by_ref() {
            visit(i, record);
        }
        summaries.push(FileSummary {
            path: reader.path,
            header: reader.header,
            records: reader.results,
            skipped: 0,
            damage: reader.damage,
        });
    }
    Ok(summaries)
}

/// Reads a Vegeta result file as the records of one `attack` run: a header
/// (made up: Vegeta's files have none), then its intervals.
#[derive(Debug)]
pub struct VegetaReader {
    path: PathBuf,
    enc: Encoding,
    input: BufReader<File>,
    header: Header,
    buf: Vec<u8>,
    offset: u64,
    line: u64,
    results: u64,
    damage: Option<Damage>,
    done: bool,
    source: String,
    /// Intervals still taking results, by start.
    open: BTreeMap<u64, Interval>,
    /// Starts below this were handed on: a later result for them is late.
    handed_below: u64,
    /// Late results' intervals are `<source>/late-<n>`.
    late_round: u64,
    late: BTreeMap<u64, Interval>,
    latest_ns: u64,
    ready: VecDeque<Interval>,
}

impl VegetaReader {
    /// Opens `path`, a Vegeta result file in `enc`, and reads its first result.
    pub fn open(path: &Path, enc: Encoding) -> Result<Self, ReadError> {
        let io_err = |error| ReadError::Io {
            path: path.to_path_buf(),
            error,
        };
        let mut input = BufReader::with_capacity(64 << 10, File::open(path).map_err(io_err)?);
        let mut buf = Vec::new();
        input.read_until(b'\n', &mut buf).map_err(io_err)?;
        let first = std::str::from_utf8(&buf)
            .ok()
            .and_then(|l| decode(enc, l).ok())
            .ok_or_else(|| ReadError::NotResults {
                path: path.to_path_buf(),
                reason: "its first line is no longer a Vegeta result".into(),
            })?;
        let name = if first.attack.is_empty() {
            path.file_stem()
                .map_or_else(|| "results".into(), |s| s.to_string_lossy().into_owned())
        } else {
            first.attack.clone()
        };
        let header = Header {
            version: FORMAT_VERSION,
            tool: "vegeta".into(),
            tool_version: String::new(),
            started_ns: first.timestamp_ns,
            started: rfc3339(first.timestamp_ns),
            host: "(not in Vegeta's results)".into(),
            command: vec![
                "vegeta".into(),
                "attack".into(),
                format!("-name={}", first.attack),
            ],
            settings: serde_json::json!({"subcommand": "attack", "format": enc.name(), "attack": first.attack}),
            // The same file given twice is the same run (counted once).
            run: format!("vegeta-{}", first.timestamp_ns),
        };
        let input = {
            // Read again from the start: the first result counts too.
            let mut file = input.into_inner();
            io::Seek::rewind(&mut file).map_err(io_err)?;
            BufReader::with_capacity(64 << 10, file)
        };
        Ok(Self {
            path: path.to_path_buf(),
            enc,
            input,
            header,
            buf,
            offset: 0,
            line: 1,
            results: 0,
            damage: None,
            done: false,
            source: format!("vegeta/{name}"),
            open: BTreeMap::new(),
            handed_below: 0,
            late_round: 0,
            late: BTreeMap::new(),
            latest_ns: 0,
            ready: VecDeque::new(),
        })
    }

    /// The made-up header: kind `attack`, started at the first result.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where reading stopped early, if it did.
    pub fn damage(&self) -> Option<&Damage> {
        self.damage.as_ref()
    }

    /// Results read so far.
    pub fn results(&self) -> u64 {
        self.results
    }

    /// Counts one result into the interval of its timestamp.
    fn add(&mut self, hit: &Hit) {
        let start = hit.timestamp_ns - hit.timestamp_ns % WIDTH_NS;
        let iv = if start >= self.handed_below {
            self.open
                .entry(start)
                .or_insert_with(|| Interval::empty(start, WIDTH_NS, self.source.clone()))
        } else {
            let source = format!("{}/late-{}", self.source, self.late_round);
            self.late
                .entry(start)
                .or_insert_with(|| Interval::empty(start, WIDTH_NS, source))
        };
        count(iv, hit);
        self.latest_ns = self.latest_ns.max(hit.timestamp_ns);
        self.hand_on(false);
    }

    /// Hands on the intervals no result is expected for any more (all at the end).
    fn hand_on(&mut self, all: bool) {
        let below = if all {
            u64::MAX
        } else {
            self.latest_ns.saturating_sub(HORIZON_NS)
        };
        while let Some(entry) = self.open.first_entry() {
            if *entry.key() + WIDTH_NS > below {
                break;
            }
            self.handed_below = *entry.key() + WIDTH_NS;
            self.ready.push_back(entry.remove());
        }
        if !self.late.is_empty() && (all || self.late.len() > 4) {
            self.ready
                .extend(std::mem::take(&mut self.late).into_values());
            self.late_round += 1;
        }
    }

    fn stop(&mut self, reason: String) {
        self.damage = Some(Damage {
            path: self.path.clone(),
            offset: self.offset,
            line: self.line,
            reason,
            records_before: self.results,
        });
        self.done = true;
        self.hand_on(true);
    }

    /// Reads one line and counts its result; false at the end.
    fn step(&mut self) -> bool {
        self.buf.clear();
        let read = self
            .input
            .by_ref()
            .take(MAX_RECORD_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.buf);
        match read {
            Err(e) => self.stop(format!("read error: {e}")),
            Ok(0) => {
                self.done = true;
                self.hand_on(true);
            }
            Ok(n) if n > MAX_RECORD_BYTES => {
                self.stop(format!("a line longer than {MAX_RECORD_BYTES} bytes"));
            }
            Ok(n) => {
                let complete = self.buf.last() == Some(&b'\n');
                let text = std::str::from_utf8(&self.buf).map_err(|_| "not UTF-8 text".to_owned());
                match text.and_then(|t| if t.trim().is_empty() { Ok(None) } else { decode(self.enc, t).map(Some) }) {
                    Ok(Some(hit)) => {
                        self.add(&hit);
                        self.results += 1;
                    }
                    Ok(None) => {}
                    Err(_) if !complete => self.stop(
                        "the last result is incomplete (no line break): the file was cut off while writing"
                            .into(),
                    ),
                    Err(e) => self.stop(e),
                }
                self.offset += n as u64;
                self.line += 1;
            }
        }
        !self.done
    }
}

/// Counts `hit` into `iv`, by throng's names.
fn count(iv: &mut Interval, hit: &Hit) {
    let mut add = |name: &str, n: u64| *iv.counters.entry(name.to_owned()).or_default() += n;
    add("requests.sent", 1);
    add("bytes.in", hit.bytes_in);
    add("bytes.out", hit.bytes_out);
    let histogram = if hit.code != 0 {
        add(&format!("status.{}", hit.code), 1);
        "latency"
    } else {
        let kind = error_kind(&hit.error);
        add(&format!("requests.error.{kind}"), 1);
        if kind == "timeout" {
            "latency.timeout"
        } else {
            "latency.error"
        }
    };
    let us = (hit.latency_ns / 1000).clamp(1, HISTOGRAM_MAX_US);
    iv.histograms
        .entry(histogram.to_owned())
        .or_insert_with(new_histogram)
        .saturating_record(us);
}

impl Iterator for VegetaReader {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        loop {
            if let Some(iv) = self.ready.pop_front() {
                return Some(Record::Interval(iv));
            }
            if self.done || !self.step() && self.ready.is_empty() {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_with_offsets() {
        let ns = 1_795_831_310_123_456_789;
        assert_eq!(parse_rfc3339(&crate::format::rfc3339_nanos(ns)), Some(ns));
        // Go's local time with an offset: the same instant.
        let utc = parse_rfc3339("2026-11-28T02:01:50.5Z").unwrap();
        assert_eq!(parse_rfc3339("2026-11-28T03:01:50.5+01:00"), Some(utc));
        assert_eq!(parse_rfc3339("2026-11-27T21:01:50.500-05:00"), Some(utc));
        assert_eq!(
            parse_rfc3339("2026-11-28T02:01:50Z"),
            Some(utc - 500_000_000)
        );
        for bad in [
            "",
            "2026-11-28",
            "2026-13-28T02:01:50Z",
            "2026-11-28T02:01:50",
            "2026-11-28T02:01:50.Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn csv_fields_follow_go_quoting() {
        let line = "1,0,5,0,0,\"Get \"\"http://x/\"\": dial tcp: connection refused\",,a,3,GET,http://x/,\n";
        let f = split_csv(line).unwrap();
        assert_eq!(f.len(), 12);
        assert_eq!(f[5], "Get \"http://x/\": dial tcp: connection refused");
        assert_eq!(f[11], "");
        assert!(split_csv("1,\"open").is_err());
        let hit = decode(Encoding::Csv, line).unwrap();
        assert_eq!((hit.timestamp_ns, hit.code, hit.latency_ns), (1, 0, 5));
        assert_eq!(error_kind(&hit.error), "refused");
        assert!(decode(Encoding::Csv, "1,2,3\n").is_err());
    }
}
