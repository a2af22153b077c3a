//! The result-file format, version 1 (docs/results-format.md): append-only
//! JSON lines, a header record first, then one record per interval and
//! optional event records. Written one whole line per `write`, so a killed
//! run leaves every complete record readable; read back up to the first
//! damage, which is reported with the file name and byte offset.
//!
//! Histograms travel as base64 of HdrHistogram's V2 compressed ("deflate")
//! serialization, the encoding HdrHistogram's own interval log uses.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer as _, V2DeflateSerializer};
use serde::{Deserialize, Serialize};
use throng_host::sample::HostSample;

use crate::bench::BenchSummary;
use crate::interval::{HISTOGRAM_MAX_US, HISTOGRAM_SIGFIG, Interval};

/// The format version this crate writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
/// The value of the `"throng"` key that marks a header record.
pub const MAGIC: &str = "results";
/// A record longer than this is damage, not something to buffer.
pub const MAX_RECORD_BYTES: usize = 16 << 20;
/// A histogram that inflates past this is damage (the widest v1 histogram
/// serializes to well under 1 MiB).
const MAX_INFLATED_HISTOGRAM: usize = 4 << 20;

/// The first record of every result file: who wrote it, when, where, how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The format version of the file (written from [`FORMAT_VERSION`]).
    #[serde(skip_serializing, default)]
    pub version: u32,
    /// The program that wrote it (`"throng"`).
    pub tool: String,
    /// Its version.
    pub tool_version: String,
    /// Start of the run, ns since the Unix epoch.
    pub started_ns: u64,
    /// The same instant as RFC 3339 UTC, for people reading the file.
    pub started: String,
    /// Host name of the machine that wrote the file.
    pub host: String,
    /// The command line, one argument per element.
    pub command: Vec<String>,
    /// Every setting of the run that matters, defaults included, as the command saw them.
    #[serde(default)]
    pub settings: serde_json::Value,
    /// The run's own id ([`run_id`]): what keeps two runs apart whose
    /// sources share names (two attacks at once on one host both name
    /// theirs `<host>/attack-0`). Empty in files written before it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run: String,
}

/// What [`Header::kind`] says of a header that names no kind.
pub const UNKNOWN_KIND: &str = "unknown";

/// This process's run id: its pid and the moment it first asked, so that
/// every section it writes (a knee's levels, a bench's parts, each agent's
/// file) is one run, and two runs at once on one host are two.
pub fn run_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        format!(
            "{:x}-{:x}",
            std::process::id(),
            throng_host::sample::now_ns()
        )
    })
}

impl Header {
    /// A header for a run starting now on this host.
    pub fn new(command: Vec<String>, settings: serde_json::Value) -> Self {
        let started_ns = throng_host::sample::now_ns();
        Self {
            version: FORMAT_VERSION,
            tool: "throng".to_owned(),
            tool_version: env!("CARGO_PKG_VERSION").to_owned(),
            started_ns,
            started: rfc3339(started_ns),
            host: throng_host::sample::hostname(),
            command,
            settings,
            run: run_id().to_owned(),
        }
    }

    /// What kind of run wrote the section: `settings.subcommand` (`hold`,
    /// `attack`, `bench`, `knee`), else the command's subcommand, else
    /// `"unknown"`.
    pub fn kind(&self) -> String {
        if let Some(k) = self.settings.get("subcommand").and_then(|v| v.as_str()) {
            return k.to_owned();
        }
        self.command
            .iter()
            .skip(1)
            .find(|a| !a.starts_with('-'))
            .cloned()
            .unwrap_or_else(|| UNKNOWN_KIND.to_owned())
    }
}

/// Something that happened once during a run, kept beside the intervals:
/// a worker restarted, an error with its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When, ns since the Unix epoch.
    pub at_ns: u64,
    /// Who saw it, named like an interval's source (`box1/hold-0`).
    pub source: String,
    /// What kind, dotted (`worker.restarted`, `worker.exited`, `error`, `warning`).
    pub kind: String,
    /// The detail, for people.
    #[serde(default)]
    pub text: String,
}

/// One decoded line of a result file.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Record {
    /// A header: the first line, or a later one where files were concatenated.
    Header(Header),
    /// What one source recorded in one interval.
    Interval(Interval),
    /// A one-off event.
    Event(Event),
    /// What a bench found (its last record).
    Bench(BenchSummary),
    /// A record type this version does not know (written by a newer one); skipped.
    Unknown(String),
}

/// Why a line is not a record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Not JSON, or JSON of the wrong shape.
    #[error("not a valid record: {0}")]
    Json(#[from] serde_json::Error),
    /// A header of another program or format.
    #[error("not a throng results header (no \"throng\":\"results\")")]
    NotResults,
    /// Written by a newer throng.
    #[error(
        "format version {found} is newer than this throng reads ({FORMAT_VERSION}); use a newer throng"
    )]
    Version {
        /// The version the file declares.
        found: u64,
    },
    /// A histogram that cannot be decoded.
    #[error("histogram {name:?}: {reason}")]
    Histogram {
        /// Its name in the record.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A line given to [`Writer::write_encoded`] that holds a line break.
    #[error("an encoded record must be one line")]
    Multiline,
}

#[derive(Serialize)]
struct HeaderOut<'a> {
    throng: &'static str,
    version: u32,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    header: &'a Header,
}

#[derive(Serialize)]
struct IntervalOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    start_ns: u64,
    length_ns: u64,
    source: &'a str,
    counters: &'a BTreeMap<String, u64>,
    gauges: &'a BTreeMap<String, i64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    peaks: &'a BTreeMap<String, i64>,
    histograms: BTreeMap<&'a str, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a HostSample>,
}

#[derive(Serialize)]
struct EventOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    event: &'a Event,
}

#[derive(Serialize)]
struct BenchOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    summary: &'a BenchSummary,
}

#[derive(Deserialize)]
struct IntervalIn {
    start_ns: u64,
    length_ns: u64,
    source: String,
    #[serde(default)]
    counters: BTreeMap<String, u64>,
    #[serde(default)]
    gauges: BTreeMap<String, i64>,
    #[serde(default)]
    peaks: BTreeMap<String, i64>,
    #[serde(default)]
    histograms: BTreeMap<String, String>,
    #[serde(default)]
    host: Option<HostSample>,
}

/// Encodes a header as one line (no line break).
pub fn encode_header(header: &Header) -> String {
    let out = HeaderOut {
        throng: MAGIC,
        version: FORMAT_VERSION,
        kind: "header",
        header,
    };
    // Invariant: serializing plain structs, maps with string keys and a
    // serde_json::Value into a String cannot fail.
    serde_json::to_string(&out).expect("header serializes")
}

/// Encodes an interval as one line (no line break): what a worker sends its
/// supervisor over a pipe, and what the supervisor appends with
/// [`Writer::write_encoded`].
pub fn encode_interval(interval: &Interval) -> String {
    let out = IntervalOut {
        kind: "interval",
        start_ns: interval.start_ns,
        length_ns: interval.length_ns,
        source: &interval.source,
        counters: &interval.counters,
        gauges: &interval.gauges,
        peaks: &interval.peaks,
        histograms: interval
            .histograms
            .iter()
            .map(|(name, h)| (name.as_str(), encode_histogram(h)))
            .collect(),
        host: interval.host.as_ref(),
    };
    // Invariant: as in encode_header; every field is a number, string or string-keyed map.
    serde_json::to_string(&out).expect("interval serializes")
}

/// Encodes an event as one line (no line break).
pub fn encode_event(event: &Event) -> String {
    let out = EventOut {
        kind: "event",
        event,
    };
    // Invariant: as in encode_header.
    serde_json::to_string(&out).expect("event serializes")
}

/// Encodes a bench's summary as one line (no line break).
pub fn encode_bench(summary: &BenchSummary) -> String {
    let out = BenchOut {
        kind: "bench",
        summary,
    };
    // Invariant: as in encode_header.
    serde_json::to_string(&out).expect("bench summary serializes")
}

/// Base64 of the histogram's V2 compressed serialization.
pub fn encode_histogram(h: &Histogram<u64>) -> String {
    let mut bytes = Vec::new();
    // Invariant: writing into a Vec cannot fail, and the V2 serializer fails
    // otherwise only for a count above i64::MAX, which no interval reaches.
    V2DeflateSerializer::new()
        .serialize(h, &mut bytes)
        .expect("histogram serializes");
    BASE64.encode(bytes)
}

/// Decodes a histogram written by [`encode_histogram`]. Checks the encoded
/// header before anything is allocated from it, so a forged size cannot make
/// the reader allocate gigabytes, and accepts only the v1 shape
/// ([`crate::interval::new_histogram`]), so merging stays exact.
pub fn decode_histogram(text: &str) -> Result<Histogram<u64>, String> {
    const V2: u32 = 0x1c84_9313;
    const V2_COMPRESSED: u32 = 0x1c84_9314;
    const V2_HEADER: usize = 40;
    let bytes = BASE64
        .decode(text)
        .map_err(|e| format!("not base64: {e}"))?;
    let be32 = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    };
    let be64 = |b: &[u8], at: usize| {
        b.get(at..at + 8)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(u64::from_be_bytes)
    };
    let plain = match be32(&bytes, 0) {
        Some(V2_COMPRESSED) => {
            let len = be32(&bytes, 4).ok_or("too short")? as usize;
            let deflated = bytes
                .get(8..8 + len)
                .ok_or("compressed length beyond the data")?;
            let mut out = Vec::new();
            flate2::read::ZlibDecoder::new(deflated)
                .take(MAX_INFLATED_HISTOGRAM as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| format!("cannot inflate: {e}"))?;
            if out.len() > MAX_INFLATED_HISTOGRAM {
                return Err("inflates beyond any v1 histogram".to_owned());
            }
            out
        }
        Some(V2) => bytes,
        _ => return Err("not an HdrHistogram V2 encoding (bad cookie)".to_owned()),
    };
    if be32(&plain, 0) != Some(V2) {
        return Err("not an HdrHistogram V2 encoding (bad inner cookie)".to_owned());
    }
    let payload = be32(&plain, 4).ok_or("too short")? as usize;
    if payload > plain.len().saturating_sub(V2_HEADER) {
        return Err("payload length beyond the data".to_owned());
    }
    let shape = (be32(&plain, 12), be64(&plain, 16), be64(&plain, 24));
    let v1 = (
        Some(u32::from(HISTOGRAM_SIGFIG)),
        Some(1),
        Some(HISTOGRAM_MAX_US),
    );
    if shape != v1 {
        return Err(format!(
            "shape (digits, lowest, highest) = {shape:?} is not the v1 shape {v1:?}"
        ));
    }
    check_counts(&plain[V2_HEADER..V2_HEADER + payload])?;
    Deserializer::new()
        .deserialize(&mut plain.as_slice())
        .map_err(|e| format!("cannot decode: {e:?}"))
}

/// Walks the V2 payload's zig-zag varints (7 bits a byte, the 9th byte
/// whole) and refuses the one value hdrhistogram's decoder would panic on
/// (a zero run of 2^63, which it negates).
fn check_counts(payload: &[u8]) -> Result<(), String> {
    let mut i = 0;
    while i < payload.len() {
        let mut value = 0u64;
        let mut shift = 0;
        loop {
            let Some(&b) = payload.get(i) else {
                return Err("payload ends inside a number".to_owned());
            };
            i += 1;
            if shift == 56 {
                value |= u64::from(b) << 56;
                break;
            }
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        if value == u64::MAX {
            return Err("a run of zeros too long for any histogram".to_owned());
        }
    }
    Ok(())
}

/// Decodes one line of a result file (with or without its line break).
pub fn decode_record(line: &str) -> Result<Record, FormatError> {
    let value: serde_json::Value = serde_json::from_str(line)?;
    let kind = value.get("type").and_then(serde_json::Value::as_str);
    if value.get("throng").is_some() || kind == Some("header") {
        return decode_header_value(value).map(Record::Header);
    }
    match kind {
        Some("interval") => {
            let raw: IntervalIn = serde_json::from_value(value)?;
            let mut histograms = BTreeMap::new();
            for (name, text) in raw.histograms {
                let h = decode_histogram(&text).map_err(|reason| FormatError::Histogram {
                    name: name.clone(),
                    reason,
                })?;
                histograms.insert(name, h);
            }
            Ok(Record::Interval(Interval {
                start_ns: raw.start_ns,
                length_ns: raw.length_ns,
                source: raw.source,
                counters: raw.counters,
                gauges: raw.gauges,
                peaks: raw.peaks,
                histograms,
                host: raw.host,
            }))
        }
        Some("event") => Ok(Record::Event(serde_json::from_value(value)?)),
        Some("bench") => Ok(Record::Bench(serde_json::from_value(value)?)),
        Some(other) => Ok(Record::Unknown(other.to_owned())),
        None => Err(FormatError::Json(serde::de::Error::missing_field("type"))),
    }
}

fn decode_header_value(value: serde_json::Value) -> Result<Header, FormatError> {
    if value.get("throng").and_then(serde_json::Value::as_str) != Some(MAGIC) {
        return Err(FormatError::NotResults);
    }
    let version = value
        .get("version")
        .and_then(serde_json::Value::as_u64)
        .ok_or(FormatError::NotResults)?;
    if version > u64::from(FORMAT_VERSION) || version == 0 {
        return Err(FormatError::Version { found: version });
    }
    let mut header: Header = serde_json::from_value(value)?;
    header.version = u32::try_from(version).unwrap_or(FORMAT_VERSION);
    Ok(header)
}

/// Why a result file could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The file could not be created or written.
    #[error("cannot write {path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said (in the message, not a `source()`: a chain
        /// printed in full would say it twice).
        error: io::Error,
    },
    /// A pre-encoded record was not one line.
    #[error("{path}: {error}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What was wrong (in the message, as with `Io`).
        error: FormatError,
    },
}

/// Appends records to a result file, one `write` per whole line, so a run
/// killed at any moment leaves only complete records (or one torn last line,
/// which the reader reports as damage).
#[derive(Debug)]
pub struct Writer {
    file: File,
    path: PathBuf,
    line: String,
}

impl Writer {
    /// Creates (or truncates) `path` and writes the header.
    pub fn create(path: impl AsRef<Path>, header: &Header) -> Result<Self, WriteError> {
        Self::open(
            path.as_ref(),
            OpenOptions::new().write(true).truncate(true),
            header,
        )
    }

    /// Opens `path` for appending (creating it if missing) and writes a
    /// header there: a later header starts a new section of the same file,
    /// so runs appended to one file are read and merged together.
    pub fn append(path: impl AsRef<Path>, header: &Header) -> Result<Self, WriteError> {
        Self::open(path.as_ref(), OpenOptions::new().append(true), header)
    }

    fn open(path: &Path, how: &mut OpenOptions, header: &Header) -> Result<Self, WriteError> {
        let file = how
            .create(true)
            .open(path)
            .map_err(|error| WriteError::Io {
                path: path.to_path_buf(),
                error,
            })?;
        let mut writer = Self {
            file,
            path: path.to_path_buf(),
            line: String::new(),
        };
        writer.put(&encode_header(header))?;
        Ok(writer)
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one interval.
    pub fn write_interval(&mut self, interval: &Interval) -> Result<(), WriteError> {
        self.put(&encode_interval(interval))
    }

    /// Appends one event.
    pub fn write_event(&mut self, event: &Event) -> Result<(), WriteError> {
        self.put(&encode_event(event))
    }

    /// Appends a bench's summary.
    pub fn write_bench(&mut self, summary: &BenchSummary) -> Result<(), WriteError> {
        self.put(&encode_bench(summary))
    }

    /// Appends a record already encoded by [`encode_interval`] or
    /// [`encode_event`] (a worker's line received over a pipe). A trailing
    /// line break is allowed; any other is refused.
    pub fn write_encoded(&mut self, line: &str) -> Result<(), WriteError> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        if line.contains('\n') {
            return Err(WriteError::Format {
                path: self.path.clone(),
                error: FormatError::Multiline,
            });
        }
        self.put(line)
    }

    fn put(&mut self, record: &str) -> Result<(), WriteError> {
        self.line.clear();
        self.line.push_str(record);
        self.line.push('\n');
        self.file
            .write_all(self.line.as_bytes())
            .map_err(|error| WriteError::Io {
                path: self.path.clone(),
                error,
            })
    }
}

/// Why a file could not be read at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said (in the message, not a `source()`: a chain
        /// printed in full would say it twice).
        error: io::Error,
    },
    /// The file does not start with a throng results header.
    #[error(
        "{path}: not a throng result file ({reason}); result files start with {{\"throng\":\"results\",...}}"
    )]
    NotResults {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// Written by a newer throng.
    #[error("{path}: {error}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version error (in the message, as with `Io`).
        error: FormatError,
    },
}

/// Where and why a file stops being readable. Everything before `offset` was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The file.
    pub path: PathBuf,
    /// Byte offset of the first damaged line.
    pub offset: u64,
    /// Its line number, from 1.
    pub line: u64,
    /// What is wrong with it.
    pub reason: String,
    /// Records read before it (the header included).
    pub records_before: u64,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: damaged at byte {} (line {}): {}; read the {} complete records before it",
            self.path.display(),
            self.offset,
            self.line,
            self.reason,
            self.records_before
        )
    }
}

/// Reads the records of one result file in order, stopping at the first damage.
#[derive(Debug)]
pub struct Reader {
    path: PathBuf,
    input: BufReader<File>,
    header: Header,
    buf: Vec<u8>,
    /// Byte offset of the next line.
    offset: u64,
    /// Line number of the next line, from 1.
    line: u64,
    records: u64,
    skipped: u64,
    damage: Option<Damage>,
    done: bool,
}

/// One line read raw: its bytes are in the reader's buffer.
enum Line {
    Complete,
    Eof,
    Truncated,
    TooLong,
}

impl Reader {
    /// Opens `path` and reads its header; refuses a file that is not a result file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReadError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|error| ReadError::Io {
            path: path.clone(),
            error,
        })?;
        let mut input = BufReader::with_capacity(64 << 10, file);
        let mut buf = Vec::new();
        let not_results = |reason: &str| ReadError::NotResults {
            path: path.clone(),
            reason: reason.to_owned(),
        };
        let first = read_line(&mut input, &mut buf).map_err(|error| ReadError::Io {
            path: path.clone(),
            error,
        })?;
        match first {
            Line::Eof => return Err(not_results("the file is empty")),
            Line::TooLong => return Err(not_results("its first line is longer than any header")),
            Line::Truncated => {
                return Err(not_results("its first line is incomplete (no line break)"));
            }
            Line::Complete => {}
        }
        let text = std::str::from_utf8(&buf)
            .map_err(|_| not_results("its first line is not UTF-8 text"))?;
        let header = match serde_json::from_str::<serde_json::Value>(text) {
            Err(_) => return Err(not_results("its first line is not JSON")),
            Ok(value) => match decode_header_value(value) {
                Ok(h) => h,
                Err(e @ FormatError::Version { .. }) => {
                    return Err(ReadError::Version { path, error: e });
                }
                Err(FormatError::NotResults) => {
                    return Err(not_results("its first line has no \"throng\":\"results\""));
                }
                Err(e) => return Err(not_results(&format!("bad header: {e}"))),
            },
        };
        let offset = buf.len() as u64;
        Ok(Self {
            path,
            input,
            header,
            buf,
            offset,
            line: 2,
            records: 1,
            skipped: 0,
            damage: None,
            done: false,
        })
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's (first) header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Where reading stopped early, if it did.
    pub fn damage(&self) -> Option<&Damage> {
        self.damage.as_ref()
    }

    /// Records read so far, the header included.
    pub fn records_read(&self) -> u64 {
        self.records
    }

    /// Records of a type this version does not know, skipped.
    pub fn records_skipped(&self) -> u64 {
        self.skipped
    }

    fn stop(&mut self, reason: String) -> Option<Record> {
        self.damage = Some(Damage {
            path: self.path.clone(),
            offset: self.offset,
            line: self.line,
            reason,
            records_before: self.records,
        });
        self.done = true;
        None
    }
}

impl Iterator for Reader {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        while !self.done {
            let line = match read_line(&mut self.input, &mut self.buf) {
                Ok(line) => line,
                Err(e) => return self.stop(format!("read error: {e}")),
            };
            match line {
                Line::Eof => {
                    self.done = true;
                    return None;
                }
                Line::Truncated => {
                    return self.stop("the last record is incomplete (no line break): the run was cut off while writing".to_owned());
                }
                Line::TooLong => {
                    return self.stop(format!("a line longer than {MAX_RECORD_BYTES} bytes"));
                }
                Line::Complete => {}
            }
            let Ok(text) = std::str::from_utf8(&self.buf) else {
                return self.stop("not UTF-8 text".to_owned());
            };
            if text.trim().is_empty() {
                self.offset += self.buf.len() as u64;
                self.line += 1;
                continue;
            }
            let record = match decode_record(text) {
                Ok(r) => r,
                Err(e) => return self.stop(e.to_string()),
            };
            self.offset += self.buf.len() as u64;
            self.line += 1;
            if let Record::Unknown(_) = record {
                self.skipped += 1;
                continue;
            }
            self.records += 1;
            return Some(record);
        }
        None
    }
}

/// Reads one line (line break included) into `buf`, at most [`MAX_RECORD_BYTES`].
fn read_line(input: &mut BufReader<File>, buf: &mut Vec<u8>) -> io::Result<Line> {
    buf.clear();
    let n = input
        .by_ref()
        .take(MAX_RECORD_BYTES as u64 + 1)
        .read_until(b'\n', buf)?;
    Ok(if n == 0 {
        Line::Eof
    } else if buf.last() == Some(&b'\n') {
        Line::Complete
    } else if buf.len() > MAX_RECORD_BYTES {
        Line::TooLong
    } else {
        Line::Truncated
    })
}

/// What reading one file of many gave.
#[derive(Debug, Clone)]
pub struct FileSummary {
    /// The file.
    pub path: PathBuf,
    /// Its header.
    pub header: Header,
    /// Records read, the header included.
    pub records: u64,
    /// Records of unknown types skipped.
    pub skipped: u64,
    /// Where it stopped early, if it did.
    pub damage: Option<Damage>,
}

/// Reads every file in turn, handing its header and then each record (with
/// the index of its file) to `visit`. A file that is not a result file stops everything with an
/// error; damage stops only that file and is reported in its summary.
pub fn read_files<P: AsRef<Path>>(
    paths: &[P],
    mut visit: impl FnMut(usize, Record),
) -> Result<Vec<FileSummary>, ReadError> {
    paths
        .iter()
        .enumerate()
        .map(|(i, path)| read_file(i, path, &mut visit))
        .collect()
}

/// Reads one result file (number `i` of many), handing its header and
/// then each record to `visit`, as [`read_files`] does.
pub fn read_file(
    i: usize,
    path: impl AsRef<Path>,
    visit: &mut impl FnMut(usize, Record),
) -> Result<FileSummary, ReadError> {
    let mut reader = Reader::open(path)?;
    // The first header too: what follows is its run's.
    visit(i, Record::Header(reader.header.clone()));
    for record in reader.by_ref() {
        visit(i, record);
    }
    Ok(FileSummary {
        path: reader.path.clone(),
        header: reader.header.clone(),
        records: reader.records,
        skipped: reader.skipped,
        damage: reader.damage.clone(),
    })
}

/// `ns` since the Unix epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ns: u64) -> String {
    format!(
        "{}.{:03}Z",
        rfc3339_seconds(ns),
        (ns % 1_000_000_000) / 1_000_000
    )
}

/// `ns` since the Unix epoch as RFC 3339 UTC with nanoseconds, as Go's
/// `time.Time` writes it in JSON (Vegeta's result timestamps).
pub fn rfc3339_nanos(ns: u64) -> String {
    format!("{}.{:09}Z", rfc3339_seconds(ns), ns % 1_000_000_000)
}

/// The date and the whole seconds of `ns` since the Unix epoch, UTC.
fn rfc3339_seconds(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interval::new_histogram;

    fn sample_interval(start_s: u64, source: &str) -> Interval {
        let mut h = new_histogram();
        for v in [1u64, 7, 250, 1_000, 123_456, 3_000_000] {
            h.record(v).unwrap();
        }
        Interval {
            start_ns: start_s * 1_000_000_000,
            length_ns: 1_000_000_000,
            source: source.to_owned(),
            counters: BTreeMap::from([
                ("connect.ok".to_owned(), 10),
                ("messages.lost".to_owned(), 0),
            ]),
            gauges: BTreeMap::from([("connections.open".to_owned(), -3)]),
            peaks: BTreeMap::new(),
            histograms: BTreeMap::from([("delivery".to_owned(), h)]),
            host: Some(HostSample {
                host: "box1".to_owned(),
                at_ns: 5,
                tcp_established: 42,
                rss_bytes: vec![("hold/worker-0".to_owned(), 1 << 20)],
                ..HostSample::default()
            }),
        }
    }

    #[test]
    fn interval_round_trips_exactly() {
        let iv = sample_interval(1_700_000_000, "box1/hold-0");
        let line = encode_interval(&iv);
        assert!(!line.contains('\n'));
        match decode_record(&line).unwrap() {
            Record::Interval(back) => assert_eq!(back, iv),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn event_and_header_round_trip() {
        let ev = Event {
            at_ns: 9,
            source: "box1/hold".to_owned(),
            kind: "worker.restarted".to_owned(),
            text: "worker 3 exited with signal 9".to_owned(),
        };
        assert_eq!(
            decode_record(&encode_event(&ev)).unwrap(),
            Record::Event(ev)
        );
        let h = Header::new(
            vec!["throng".into(), "hold".into()],
            serde_json::json!({"rate": 100}),
        );
        let line = encode_header(&h);
        assert!(
            line.starts_with(r#"{"throng":"results","version":1,"#),
            "{line}"
        );
        assert_eq!(decode_record(&line).unwrap(), Record::Header(h));
    }

    #[test]
    fn a_bench_summary_round_trips_and_reads_with_parts_missing() {
        use crate::bench::{BenchSummary, Delivery, MessageDelivery};
        let mut b = BenchSummary {
            at_ns: 7,
            source: "box1/bench".into(),
            title: "3 connections".into(),
            ..BenchSummary::default()
        };
        b.connections.held = 3;
        b.memory.kernel_bytes = 9120.5;
        b.messages.each.push(MessageDelivery {
            seq: 1,
            delivered: 3,
            latency: Delivery {
                p50_us: 10,
                p99_us: 20,
                max_us: 30,
            },
        });
        let line = encode_bench(&b);
        assert!(line.starts_with(r#"{"type":"bench","#), "{line}");
        assert!(
            line.contains(r#""each":[{"seq":1,"delivered":3,"p50_us":10"#),
            "{line}"
        );
        assert_eq!(decode_record(&line).unwrap(), Record::Bench(b));
        // A record with parts missing (or from a newer throng, with more) reads.
        let sparse = r#"{"type":"bench","title":"t","connections":{"held":5},"new":1}"#;
        let Record::Bench(read) = decode_record(sparse).unwrap() else {
            panic!("not a bench record");
        };
        assert_eq!((read.title.as_str(), read.connections.held), ("t", 5));
        assert_eq!(read.messages.each, vec![]);
    }

    #[test]
    fn forged_histograms_are_refused_without_allocating() {
        // A V2 header claiming 4 GiB of payload.
        let mut forged = vec![];
        forged.extend_from_slice(&0x1c84_9313u32.to_be_bytes());
        forged.extend_from_slice(&u32::MAX.to_be_bytes());
        forged.extend_from_slice(&[0; 32]);
        assert!(decode_histogram(&BASE64.encode(&forged)).is_err());
        // Another shape.
        let mut other = Histogram::<u64>::new_with_bounds(1, 1000, 2).unwrap();
        other.record(5).unwrap();
        let err = decode_histogram(&encode_histogram(&other)).unwrap_err();
        assert!(err.contains("shape"), "{err}");
        assert!(decode_histogram("!!!").is_err());
        assert!(decode_histogram("").is_err());
    }

    proptest::proptest! {
        /// Any damage to a valid encoding is an error or a histogram, never a panic.
        #[test]
        fn damaged_histograms_never_panic(
            seed in proptest::collection::vec(1u64..5_000_000, 0..50),
            flips in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..8),
            cut in 0usize..4096,
        ) {
            let mut h = new_histogram();
            for v in &seed {
                h.record(*v).unwrap();
            }
            // The plain V2 form (accepted too), so flipped bytes reach the decoder.
            let mut plain = Vec::new();
            hdrhistogram::serialization::V2Serializer::new().serialize(&h, &mut plain).unwrap();
            for (at, b) in &flips {
                let n = plain.len();
                plain[at % n] ^= *b;
            }
            let _ = decode_histogram(&BASE64.encode(&plain));
            plain.truncate(cut % (plain.len() + 1));
            let _ = decode_histogram(&BASE64.encode(&plain));
            // And whole records cut anywhere.
            let line = encode_interval(&Interval {
                start_ns: 1,
                length_ns: 1,
                source: "s".to_owned(),
                counters: BTreeMap::new(),
                gauges: BTreeMap::new(),
                peaks: BTreeMap::new(),
                histograms: BTreeMap::from([("h".to_owned(), h)]),
                host: None,
            });
            let _ = decode_record(&line[..cut % (line.len() + 1)]);
        }
    }

    #[test]
    fn a_zero_run_of_two_to_the_63_is_refused() {
        // Header of a v1-shaped plain V2 histogram, then the varint of u64::MAX (9 bytes).
        let mut plain = Vec::new();
        plain.extend_from_slice(&0x1c84_9313u32.to_be_bytes());
        plain.extend_from_slice(&9u32.to_be_bytes());
        plain.extend_from_slice(&0u32.to_be_bytes());
        plain.extend_from_slice(&u32::from(HISTOGRAM_SIGFIG).to_be_bytes());
        plain.extend_from_slice(&1u64.to_be_bytes());
        plain.extend_from_slice(&HISTOGRAM_MAX_US.to_be_bytes());
        plain.extend_from_slice(&1f64.to_be_bytes());
        plain.extend_from_slice(&[0xff; 9]);
        let err = decode_histogram(&BASE64.encode(&plain)).unwrap_err();
        assert!(err.contains("zeros"), "{err}");
    }

    #[test]
    fn newer_versions_and_foreign_json_are_refused() {
        assert!(matches!(
            decode_record(r#"{"throng":"results","version":2,"tool":"t"}"#),
            Err(FormatError::Version { found: 2 })
        ));
        assert!(matches!(
            decode_record(r#"{"throng":"other","version":1}"#),
            Err(FormatError::NotResults)
        ));
        assert!(
            matches!(decode_record(r#"{"type":"future"}"#), Ok(Record::Unknown(t)) if t == "future")
        );
        assert!(decode_record(r#"{"a":1}"#).is_err());
        assert!(decode_record("[1,2]").is_err());
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123_000_000), "2000-02-29T00:00:00.123Z");
        assert_eq!(
            rfc3339(1_795_320_185_000_000_000),
            "2026-11-22T04:03:05.000Z"
        );
    }
}
