//! What `throng attack` sends: targets in Vegeta's text or JSON format, or
//! one target built from `--url`, `-H`, `--body` and `--method`.
//!
//! The format, one target after another (blank lines and `#` comments are
//! ignored):
//!
//! ```text
//! GET http://127.0.0.1:8080/ping
//! sleep: 1000
//! times: 2
//!
//! POST http://127.0.0.1:8080/ping
//! Content-Type: application/json
//! @body.json
//! ```
//!
//! A target line is `METHOD URL`; `Name: value` lines under it are its
//! headers; one `@path` line names a file whose bytes are its body (relative
//! paths are relative to the current directory, as in Vegeta). Requests take
//! the targets in turn: request `i` uses target `i % targets`.
//!
//! Or Vegeta's JSON format, one object per line (its `-format=json`):
//! `{"method":"POST","url":"http://...","header":{"Content-Type":["application/json"]},"body":"eyJhIjoxfQ=="}`.
//! A file is read line by line as it comes; every target is kept (each
//! worker sends them in turn), up to [`MAX_TARGET_BYTES`].

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use throng_proto::http;

/// Why targets could not be read.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TargetError {
    /// A line of the targets text is not a target, a header or a body line.
    #[error("{source_name} line {line}: {reason}")]
    Line {
        /// Where the text came from (a path or `stdin`).
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The URL cannot be attacked.
    #[error("invalid URL '{url}': {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file (the targets, or a body) could not be read.
    #[error("cannot read {path}: {err}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        err: std::io::Error,
    },
    /// The targets text holds no target.
    #[error("{0}: no targets (expected lines like 'GET http://127.0.0.1:8080/ping')")]
    Empty(String),
    /// The flags that say what to send do not go together.
    #[error("{0}")]
    Flags(String),
    /// Targets that must be held are too many.
    #[error("{0}")]
    Held(String),
    /// A targets file read as the run goes no longer has what was checked.
    #[error("{0}")]
    Changed(String),
    /// The host name does not resolve.
    #[error("cannot resolve {host}: {reason}")]
    Resolve {
        /// `host:port`.
        host: String,
        /// Why.
        reason: String,
    },
}

/// An `http://` or `https://` URL split for a client: where to connect and what to ask for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpUrl {
    /// `host[:port]` as written (the `Host` header).
    pub authority: String,
    /// The host name or address (IPv6 without brackets).
    pub host: String,
    /// The port (80 when not written).
    pub port: u16,
    /// Path and query, at least `/`.
    pub path: String,
    /// `https://`: TLS on the connection.
    #[serde(default)]
    pub tls: bool,
}

impl HttpUrl {
    /// Parses `http[s]://host[:port][/path][?query]`.
    pub fn parse(url: &str) -> Result<Self, TargetError> {
        let bad = |reason: &str| TargetError::Url {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (tls, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (None, Some(rest)) => (true, rest),
            (None, None) => return Err(bad("expected http://HOST[:PORT]/PATH or https://...")),
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_owned()),
        };
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        if authority.contains('@') {
            return Err(bad(
                "user information in URLs is not supported; send an Authorization header",
            ));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed '[' in host"))?;
            match after.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None if after.is_empty() => (h, None),
                None => return Err(bad("junk after ']'")),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad("port is not a number 1-65535"))?,
            None if tls => 443,
            None => 80,
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(bad(
                "spaces or control characters in the path (percent-encode them)",
            ));
        }
        Ok(Self {
            authority: authority.to_owned(),
            host: host.to_owned(),
            port,
            path,
            tls,
        })
    }

    /// Resolves the host to the first address it has.
    pub fn resolve(&self) -> Result<SocketAddr, TargetError> {
        let host = format!("{}:{}", self.host, self.port);
        let err = |reason: String| TargetError::Resolve {
            host: host.clone(),
            reason,
        };
        if let Ok(ip) = self.host.parse::<std::net::IpAddr>() {
            return Ok(SocketAddr::new(ip, self.port));
        }
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| err(e.to_string()))?
            .next()
            .ok_or_else(|| err("no address".to_owned()))
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.path)
    }
}

/// One request to send, as many times as its turn comes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Where.
    pub url: HttpUrl,
    /// Header lines, in order (never `Content-Length`: it is computed).
    pub headers: Vec<(String, String)>,
    /// The body (empty: none).
    pub body: Vec<u8>,
}

impl Target {
    /// Adds `headers` (from `-H`) that the target does not set itself.
    pub fn add_defaults(&mut self, headers: &[(String, String)]) {
        for (name, value) in headers {
            if !self
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                self.headers.push((name.clone(), value.clone()));
            }
        }
    }

    /// The whole request as bytes on the wire: written once, sent many times.
    /// Without keep-alive it asks the server to close (`Connection: close`).
    pub fn encode(&self, keepalive: bool) -> Vec<u8> {
        let mut headers: Vec<(&str, &[u8])> = Vec::with_capacity(self.headers.len() + 2);
        if !self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("host"))
        {
            headers.push(("Host", self.url.authority.as_bytes()));
        }
        for (n, v) in &self.headers {
            if !keepalive && n.eq_ignore_ascii_case("connection") {
                continue;
            }
            headers.push((n.as_str(), v.as_bytes()));
        }
        if !keepalive {
            headers.push(("Connection", b"close"));
        }
        let mut out = Vec::new();
        http::write_request(&mut out, &self.method, &self.url.path, &headers, &self.body);
        out
    }
}

/// Why a header (`-H` or a targets line) cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// No `:` in the line.
    #[error("'{0}' is not a header: expected 'Name: value'")]
    NoColon(String),
    /// The name is empty or not an HTTP token.
    #[error("'{0}' is not a header name")]
    Name(String),
    /// The value holds control characters (a CR or LF would split the request).
    #[error("header '{0}' has control characters in its value")]
    Control(String),
    /// `Content-Length`, which the body sets.
    #[error("do not set Content-Length: it is computed from the body")]
    ContentLength,
    /// `Transfer-Encoding`, which the client does not do.
    #[error("Transfer-Encoding is not supported: bodies are sent with a Content-Length")]
    TransferEncoding,
}

/// Parses one `Name: value` header (`-H` or a targets line).
pub fn parse_header(line: &str) -> Result<(String, String), HeaderError> {
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| HeaderError::NoColon(line.to_owned()))?;
    let name = name.trim();
    if name.is_empty() || !name.bytes().all(is_token_byte) {
        return Err(HeaderError::Name(name.to_owned()));
    }
    let value = value.trim();
    if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
        return Err(HeaderError::Control(name.to_owned()));
    }
    if name.eq_ignore_ascii_case("content-length") {
        return Err(HeaderError::ContentLength);
    }
    if name.eq_ignore_ascii_case("transfer-encoding") {
        return Err(HeaderError::TransferEncoding);
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_method(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b == b'-' || b == b'_')
}

/// How a targets file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TargetFormat {
    /// Whichever the first line says: `{` starts JSON, anything else is text.
    #[default]
    Auto,
    /// Vegeta's text format (`-format=http`): `METHOD URL`, headers, `@body`.
    Http,
    /// Vegeta's JSON format (`-format=json`): one object per line,
    /// `{"method":"GET","url":"...","header":{"Name":["v"]},"body":"<base64>"}`.
    Json,
}

impl std::str::FromStr for TargetFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "http" | "text" => Ok(Self::Http),
            "json" => Ok(Self::Json),
            _ => Err(format!(
                "{s:?} is not a targets format: http (Vegeta's text), json, or auto (the first line tells)"
            )),
        }
    }
}

/// Vegeta's JSON target (its `target.schema.json`: nothing else allowed).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonTarget {
    method: String,
    url: String,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    header: Option<std::collections::BTreeMap<String, Vec<String>>>,
}

/// What a JSON target line starts with.
const OPEN_BRACE: char = '\u{7b}';

/// Reads an `@path` body.
type ReadBody<'a> = dyn FnMut(&Path) -> Result<Vec<u8>, std::io::Error> + 'a;

/// Targets parsed line by line, as they are read (sans I/O: the caller
/// reads the lines).
pub struct Parser<'a> {
    source_name: String,
    format: TargetFormat,
    read_body: Box<ReadBody<'a>>,
    targets: Vec<Target>,
    /// Whether the current (text) target already has its body.
    has_body: bool,
    /// Bytes the targets hold so far (bounded by [`MAX_TARGET_BYTES`]).
    held: usize,
}

/// The most the targets of one run may hold (URLs, headers, bodies): a
/// larger file is refused with a clear error instead of filling memory.
pub const MAX_TARGET_BYTES: usize = 256 << 20;

impl<'a> Parser<'a> {
    /// A parser of `format`; `source_name` names the input in errors and
    /// `read_body` reads an `@path` body (a closure so tests need no files).
    pub fn new(
        source_name: &str,
        format: TargetFormat,
        read_body: impl FnMut(&Path) -> Result<Vec<u8>, std::io::Error> + 'a,
    ) -> Self {
        Self {
            source_name: source_name.to_owned(),
            format,
            read_body: Box::new(read_body),
            targets: Vec::new(),
            has_body: false,
            held: 0,
        }
    }

    fn err(&self, line: usize, reason: String) -> TargetError {
        line_error(&self.source_name, line, reason)
    }

    /// Takes line `line_no` (1-based) of the input.
    pub fn line(&mut self, line_no: usize, raw: &str) -> Result<(), TargetError> {
        let line = raw.trim();
        if line.is_empty() || (self.format != TargetFormat::Json && line.starts_with('#')) {
            return Ok(());
        }
        if self.format == TargetFormat::Auto {
            self.format = if line.starts_with(OPEN_BRACE) {
                TargetFormat::Json
            } else {
                TargetFormat::Http
            };
        }
        match self.format {
            TargetFormat::Json => self.json_line(line_no, line)?,
            _ => self.text_line(line_no, line)?,
        }
        if let Some(t) = self.targets.last() {
            // Counted again as a text target grows: an upper bound.
            self.held += t.body.len()
                + t.url.path.len()
                + t.url.authority.len()
                + t.headers
                    .iter()
                    .map(|(n, v)| n.len() + v.len())
                    .sum::<usize>();
        }
        if self.held > MAX_TARGET_BYTES {
            return Err(self.err(
                line_no,
                format!(
                    "the targets so far hold over {} MiB; throng keeps every target in memory (each worker sends them in turn), so a file this large is refused: split it, or reuse bodies",
                    MAX_TARGET_BYTES >> 20
                ),
            ));
        }
        Ok(())
    }

    fn json_line(&mut self, line_no: usize, line: &str) -> Result<(), TargetError> {
        let t: JsonTarget = serde_json::from_str(line).map_err(|e| {
            self.err(
                line_no,
                format!(
                    "not a JSON target ({e}); expected {{\"method\":\"GET\",\"url\":\"http://...\",\"header\":{{\"Name\":[\"value\"]}},\"body\":\"<base64>\"}}"
                ),
            )
        })?;
        if !is_method(&t.method) {
            return Err(self.err(
                line_no,
                format!("\"method\": {:?} is not an HTTP method", t.method),
            ));
        }
        let url = HttpUrl::parse(&t.url).map_err(|e| self.err(line_no, e.to_string()))?;
        let body = match t.body.as_deref() {
            None | Some("") => Vec::new(),
            Some(b) => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| self.err(line_no, format!("\"body\" is not base64: {e}")))?
            }
        };
        let mut headers = Vec::new();
        for (name, values) in t.header.unwrap_or_default() {
            for v in values {
                headers.push(
                    parse_header(&format!("{name}: {v}"))
                        .map_err(|e| self.err(line_no, format!("\"header\": {e}")))?,
                );
            }
        }
        self.targets.push(Target {
            method: t.method,
            url,
            headers,
            body,
        });
        Ok(())
    }

    fn text_line(&mut self, line_no: usize, line: &str) -> Result<(), TargetError> {
        let first = line.split_whitespace().next().unwrap_or("");
        if is_method(first) && line[first.len()..].trim_start().contains("://") {
            let url_text = line[first.len()..].trim();
            if url_text.contains(char::is_whitespace) {
                return Err(self.err(line_no, format!("expected 'METHOD URL', got '{line}'")));
            }
            let url = HttpUrl::parse(url_text).map_err(|e| self.err(line_no, e.to_string()))?;
            self.targets.push(Target {
                method: first.to_owned(),
                url,
                headers: Vec::new(),
                body: Vec::new(),
            });
            self.has_body = false;
            return Ok(());
        }
        if self.targets.is_empty() {
            return Err(self.err(
                line_no,
                format!(
                    "expected a target line 'METHOD http://HOST:PORT/PATH' first, got '{line}'"
                ),
            ));
        }
        if self.has_body {
            return Err(self.err(
                line_no,
                format!("'{line}' after the body line: a target ends with its '@file' line"),
            ));
        }
        if let Some(path) = line.strip_prefix('@') {
            let path = Path::new(path.trim());
            let body = (self.read_body)(path).map_err(|e| {
                self.err(
                    line_no,
                    format!("cannot read body file {}: {e}", path.display()),
                )
            })?;
            if let Some(t) = self.targets.last_mut() {
                t.body = body;
            }
            self.has_body = true;
            return Ok(());
        }
        if first.contains("://") {
            return Err(self.err(
                line_no,
                format!("'{line}': a target line needs a method first, e.g. 'GET {first}'"),
            ));
        }
        let header = parse_header(line).map_err(|reason| {
            self.err(
                line_no,
                format!("{reason} (lines are 'METHOD URL', 'Name: value' or '@bodyfile')"),
            )
        })?;
        if let Some(t) = self.targets.last_mut() {
            t.headers.push(header);
        }
        Ok(())
    }

    /// The targets read; an input without any is an error.
    pub fn finish(self) -> Result<Vec<Target>, TargetError> {
        if self.targets.is_empty() {
            return Err(TargetError::Empty(self.source_name));
        }
        Ok(self.targets)
    }
}

/// Parses targets text (either format, told by its first line).
/// `source_name` names it in errors; `read_body` reads an `@path` body.
pub fn parse(
    text: &str,
    source_name: &str,
    read_body: impl FnMut(&Path) -> Result<Vec<u8>, std::io::Error>,
) -> Result<Vec<Target>, TargetError> {
    let mut p = Parser::new(source_name, TargetFormat::Auto, read_body);
    for (n, line) in text.lines().enumerate() {
        p.line(n + 1, line)?;
    }
    p.finish()
}

/// The longest line a targets file may have (a JSON target's base64 body included).
const MAX_LINE: u64 = 64 << 20;

/// A line error of input `name`.
fn line_error(name: &str, line: usize, reason: String) -> TargetError {
    TargetError::Line {
        source_name: name.to_owned(),
        line,
        reason,
    }
}

/// A targets input read line by line (never whole), each line checked
/// for its length and UTF-8.
struct Lines {
    input: Box<dyn std::io::BufRead>,
    name: String,
    buf: Vec<u8>,
    /// The number of the line last read (1-based).
    line_no: usize,
}

impl Lines {
    /// Opens `path` (`-`: stdin).
    fn open(path: &Path) -> Result<Self, TargetError> {
        let (input, name): (Box<dyn std::io::BufRead>, String) = if path == Path::new("-") {
            (Box::new(std::io::stdin().lock()), "stdin".to_owned())
        } else {
            let file = std::fs::File::open(path).map_err(|err| TargetError::Read {
                path: path.to_owned(),
                err,
            })?;
            (
                Box::new(std::io::BufReader::with_capacity(64 << 10, file)),
                path.display().to_string(),
            )
        };
        Ok(Self {
            input,
            name,
            buf: Vec::new(),
            line_no: 0,
        })
    }

    /// The next line and its number, or `None` at the end of the input.
    fn next(&mut self) -> Result<Option<(usize, &str)>, TargetError> {
        use std::io::BufRead as _;
        self.buf.clear();
        let n = std::io::Read::take(&mut self.input, MAX_LINE + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(|err| TargetError::Read {
                path: PathBuf::from(&self.name),
                err,
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        let no = self.line_no;
        if n as u64 > MAX_LINE {
            return Err(line_error(
                &self.name,
                no,
                format!("a line longer than {} MiB", MAX_LINE >> 20),
            ));
        }
        match std::str::from_utf8(&self.buf) {
            Ok(line) => Ok(Some((no, line))),
            Err(_) => Err(line_error(&self.name, no, "not UTF-8 text".to_owned())),
        }
    }
}

/// Whether `raw` begins a target in `format` (a JSON line; a text
/// `METHOD URL` line).
fn starts_target(format: TargetFormat, raw: &str) -> bool {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return false;
    }
    match format {
        TargetFormat::Json => true,
        TargetFormat::Http => {
            let first = line.split_whitespace().next().unwrap_or("");
            is_method(first) && line[first.len()..].trim_start().contains("://")
        }
        // Told by this very line.
        TargetFormat::Auto => true,
    }
}

/// What a target holds in memory (URL, headers, body), roughly.
fn weight(t: &Target) -> usize {
    t.body.len()
        + t.url.path.len()
        + t.url.authority.len()
        + t.headers
            .iter()
            .map(|(n, v)| n.len() + v.len())
            .sum::<usize>()
}

/// Reads the targets of `lines` in turn, no further than the first
/// `limit`, and gives each whole one to `each` (none is kept here); the
/// format found.
fn scan(
    mut lines: Lines,
    format: TargetFormat,
    limit: u64,
    mut each: impl FnMut(Target) -> Result<(), TargetError>,
) -> Result<TargetFormat, TargetError> {
    let mut p = Parser::new(&lines.name, format, |p| std::fs::read(p));
    let mut given = 0u64;
    while let Some((no, line)) = lines.next()? {
        // The next target begins: the ones before it are whole, and the run
        // uses no more (nor is this one parsed).
        if given + p.targets.len() as u64 >= limit && starts_target(p.format, line) {
            break;
        }
        p.line(no, line)?;
        // All but the last are whole (a text target grows by its lines).
        if p.targets.len() > 1 {
            let whole: Vec<Target> = p.targets.drain(..p.targets.len() - 1).collect();
            // The parser's bound now covers the target it builds.
            p.held = 0;
            for t in whole {
                given += 1;
                each(t)?;
            }
        }
    }
    let found = p.format;
    for t in p.finish()? {
        each(t)?;
    }
    Ok(found)
}

/// Targets past this many are not held: each worker reads them from the
/// file as the run takes them ([`LazyFile`]).
pub const HOLD_TARGETS: u64 = 10_000;

/// Targets holding more than this (URLs, headers, bodies) are not held either.
pub const HOLD_BYTES: usize = 16 << 20;

/// Whether the targets read are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Holding {
    /// Held when few ([`HOLD_TARGETS`], [`HOLD_BYTES`]), else read as the
    /// run goes; stdin (which cannot be read twice) is always held.
    #[default]
    Auto,
    /// Every target held (a run on agents: they cannot read this
    /// machine's file), up to [`MAX_TARGET_BYTES`].
    All,
    /// Read as the run goes however few (`--lazy`).
    Lazy,
}

/// A targets file too large to hold: each worker reads it as the run takes
/// its targets (a [`Cursor`]), holding only those of the requests in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LazyFile {
    /// The file (absolute: a worker reads it too).
    pub path: PathBuf,
    /// Its format, as the checking pass found it.
    pub format: TargetFormat,
    /// The targets the run takes in turn: the file's first `count`.
    pub count: u64,
    /// `-H` headers, added to each target that does not set them.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
}

/// The targets of a run.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    /// Every target; or, read as the run goes (`lazy`), the first target
    /// of each endpoint (where connections go).
    pub list: Vec<Target>,
    /// The file the workers read as the run goes, when not held.
    pub lazy: Option<LazyFile>,
}

impl Targets {
    /// How many the run takes in turn.
    pub fn count(&self) -> u64 {
        self.lazy
            .as_ref()
            .map_or(self.list.len() as u64, |l| l.count)
    }

    /// Whether any is `https://`.
    pub fn any_tls(&self) -> bool {
        self.list.iter().any(|t| t.url.tls)
    }
}

/// Reads targets from a file, or from stdin for `-`, line by line as they
/// come (never the whole input at once), and no further than the first
/// `limit` targets: request `i` takes target `i % targets`, so a run of
/// `limit` requests uses no other. Every target is checked; they are held
/// as `holding` says.
pub fn read(
    path: &Path,
    format: TargetFormat,
    limit: Option<u64>,
    holding: Holding,
) -> Result<Targets, TargetError> {
    let lines = Lines::open(path)?;
    let name = lines.name.clone();
    let stdin = path == Path::new("-");
    let holding = if stdin { Holding::All } else { holding };
    let mut held: Option<Vec<Target>> = (holding != Holding::Lazy).then(Vec::new);
    let mut bytes = 0usize;
    let mut count = 0u64;
    let mut firsts: Vec<Target> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let found = scan(lines, format, limit.unwrap_or(u64::MAX).max(1), |t| {
        count += 1;
        bytes += weight(&t);
        if seen.insert((t.url.host.clone(), t.url.port, t.url.tls)) {
            firsts.push(t.clone());
        }
        if holding == Holding::Auto && (count > HOLD_TARGETS || bytes > HOLD_BYTES) {
            held = None;
        }
        if let Some(list) = held.as_mut() {
            if bytes > MAX_TARGET_BYTES {
                return Err(TargetError::Held(format!(
                    "{name}: the targets hold over {} MiB; throng keeps every target {} in memory, so this much is refused: {}",
                    MAX_TARGET_BYTES >> 20,
                    if stdin {
                        "read from stdin"
                    } else {
                        "of a run on agents"
                    },
                    if stdin {
                        "give a file (--targets FILE), which is read as the run goes"
                    } else {
                        "split the file, or reuse bodies"
                    }
                )));
            }
            list.push(t);
        }
        Ok(())
    })?;
    if let Some(list) = held {
        return Ok(Targets { list, lazy: None });
    }
    let path = std::fs::canonicalize(path).map_err(|err| TargetError::Read {
        path: path.to_owned(),
        err,
    })?;
    Ok(Targets {
        list: firsts,
        lazy: Some(LazyFile {
            path,
            format: found,
            count,
            headers: Vec::new(),
        }),
    })
}

/// A worker's place in a [`LazyFile`]: it reads target `t` when the run
/// takes it, passing over those between (other workers take them), and
/// opens the file again to go round from the first.
pub struct Cursor {
    file: LazyFile,
    lines: Option<Lines>,
    /// The number of the target whose first line is `pending` (or, none
    /// pending, the next one found).
    next: u64,
    /// The first line of target `next`, read already (it ended the one before).
    pending: String,
    pending_no: Option<usize>,
}

impl Cursor {
    /// A cursor before the first target of `file`.
    pub fn new(file: LazyFile) -> Self {
        Self {
            file,
            lines: None,
            next: 0,
            pending: String::new(),
            pending_no: None,
        }
    }

    /// The targets the run takes in turn.
    pub fn count(&self) -> u64 {
        self.file.count
    }

    /// The file no longer has the targets the run checked.
    fn changed(&self) -> TargetError {
        TargetError::Changed(format!(
            "{} changed during the run: it no longer has the {} targets checked at the start",
            self.file.path.display(),
            self.file.count
        ))
    }

    /// Target `t` (`0..count`), with the `-H` headers: read on from here,
    /// or from the start again when `t` is behind.
    pub fn read(&mut self, t: u64) -> Result<Target, TargetError> {
        if t >= self.file.count {
            return Err(self.changed());
        }
        if self.lines.is_none() || t < self.next {
            self.lines = Some(Lines::open(&self.file.path)?);
            self.next = 0;
            self.pending_no = None;
        }
        let format = self.file.format;
        loop {
            let Some(lines) = self.lines.as_mut() else {
                return Err(self.changed());
            };
            let first = match self.pending_no.take() {
                Some(no) => no,
                None => loop {
                    match lines.next()? {
                        Some((no, line)) if starts_target(format, line) => {
                            self.pending.clear();
                            self.pending.push_str(line);
                            break no;
                        }
                        Some(_) => {}
                        None => return Err(self.changed()),
                    }
                },
            };
            let here = self.next;
            self.next += 1;
            let mut parser =
                (here == t).then(|| Parser::new(&lines.name, format, |p| std::fs::read(p)));
            if let Some(p) = parser.as_mut() {
                p.line(first, &self.pending)?;
            }
            // Its other lines, up to the next target's first.
            while let Some((no, line)) = lines.next()? {
                if starts_target(format, line) {
                    self.pending.clear();
                    self.pending.push_str(line);
                    self.pending_no = Some(no);
                    break;
                }
                if let Some(p) = parser.as_mut() {
                    p.line(no, line)?;
                }
            }
            if let Some(p) = parser {
                let mut target = p.finish()?.pop().ok_or_else(|| self.changed())?;
                target.add_defaults(&self.file.headers);
                return Ok(target);
            }
        }
    }
}

/// What to send, as the command line says it: a targets file (`-` for
/// stdin) or one `--url` with its method and body; `-H` headers go to every
/// target that does not set them itself.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--targets FILE`.
    pub file: Option<PathBuf>,
    /// `--url URL`.
    pub url: Option<String>,
    /// `--method` (for `--url`).
    pub method: Option<String>,
    /// `-H 'Name: value'`, each.
    pub headers: Vec<String>,
    /// `--body TEXT` (for `--url`).
    pub body: Option<String>,
    /// `--body-file FILE` (for `--url`).
    pub body_file: Option<PathBuf>,
    /// `--targets-format` (Vegeta's `-format`).
    pub format: TargetFormat,
    /// The most targets the run can use (its planned requests), if known:
    /// a targets file is read no further.
    pub limit: Option<u64>,
    /// Whether a targets file's targets are held in memory.
    pub holding: Holding,
}

impl Flags {
    /// The targets: read from the file, or the one `--url` target.
    pub fn targets(&self) -> Result<Targets, TargetError> {
        let defaults = self
            .headers
            .iter()
            .map(|h| parse_header(h).map_err(|e| TargetError::Flags(format!("-H {h:?}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut list = match (&self.file, &self.url) {
            (Some(path), _) => {
                if self.body.is_some() || self.body_file.is_some() || self.method.is_some() {
                    return Err(TargetError::Flags(
                        "--body, --body-file and --method go with --url; a targets file says \
                         these per target"
                            .into(),
                    ));
                }
                read(path, self.format, self.limit, self.holding)?
            }
            (None, Some(url)) => Targets {
                list: vec![self.one(url)?],
                lazy: None,
            },
            (None, None) => {
                return Err(TargetError::Flags(
                    "give --url URL or --targets FILE".into(),
                ));
            }
        };
        for t in &mut list.list {
            t.add_defaults(&defaults);
        }
        if let Some(lazy) = list.lazy.as_mut() {
            lazy.headers = defaults;
        }
        Ok(list)
    }

    /// The `--url` target: GET without a body, POST with one, unless `--method` says.
    fn one(&self, url: &str) -> Result<Target, TargetError> {
        let body = match (&self.body, &self.body_file) {
            (Some(b), _) => b.clone().into_bytes(),
            (None, Some(p)) => std::fs::read(p).map_err(|err| TargetError::Read {
                path: p.clone(),
                err,
            })?,
            (None, None) => Vec::new(),
        };
        let method = match &self.method {
            Some(m) => m.to_ascii_uppercase(),
            None if body.is_empty() => "GET".to_owned(),
            None => "POST".to_owned(),
        };
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(TargetError::Flags(format!(
                "--method {method:?} is not an HTTP method"
            )));
        }
        Ok(Target {
            method,
            url: HttpUrl::parse(url)?,
            headers: Vec::new(),
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_files(p: &Path) -> Result<Vec<u8>, std::io::Error> {
        match p.to_str() {
            Some("body.json") => Ok(b"{\"a\":1}".to_vec()),
            _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        }
    }

    fn line_of(e: &TargetError) -> usize {
        match e {
            TargetError::Line { line, .. } => *line,
            other => panic!("not a line error: {other}"),
        }
    }

    #[test]
    fn vegeta_format() {
        let text = "# comment\nGET http://127.0.0.1:8080/ping?x=1\nsleep: 1000\ntimes:2\n\n\
                    POST http://localhost/things\nContent-Type: application/json\n@body.json\n\
                    DELETE http://[::1]:9000\n";
        let t = parse(text, "t", no_files).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].method, "GET");
        assert_eq!(t[0].url.port, 8080);
        assert_eq!(t[0].url.path, "/ping?x=1");
        assert_eq!(
            t[0].headers,
            vec![
                ("sleep".into(), "1000".into()),
                ("times".into(), "2".into())
            ]
        );
        assert_eq!(t[1].url.port, 80);
        assert_eq!(t[1].url.authority, "localhost");
        assert_eq!(t[1].body, b"{\"a\":1}");
        assert_eq!(t[2].url.host, "::1");
        assert_eq!(t[2].url.path, "/");
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("Host: x\nGET http://a/\n", 1),
            ("GET http://a/\nnot a header\n", 2),
            ("GET http://a/\n\nGET ftp://a/\n", 3),
            ("GET http://a/\n@missing.txt\n", 2),
            ("GET http://a/\n@body.json\nX: y\n", 3),
            ("GET http://a/\nContent-Length: 5\n", 2),
            ("http://a/\n", 1),
            ("GET http://a/ extra\n", 1),
            ("GET http://a:99999/\n", 1),
            ("GET http://a/\nBad Name: v\n", 2),
        ];
        for (text, line) in cases {
            let e = parse(text, "t", no_files).unwrap_err();
            assert_eq!(line_of(&e), line, "{text:?}: {e}");
        }
        assert!(matches!(
            parse("# nothing\n\n", "t", no_files),
            Err(TargetError::Empty(_))
        ));
    }

    #[test]
    fn urls() {
        let u = HttpUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 8080, "/")
        );
        let u = HttpUrl::parse("http://h?q=1").unwrap();
        assert_eq!(u.path, "/?q=1");
        let u = HttpUrl::parse("https://localhost/ping").unwrap();
        assert_eq!((u.port, u.tls), (443, true));
        assert_eq!(u.to_string(), "https://localhost/ping");
        for bad in [
            "ftp://h/",
            "http://",
            "http://:80/",
            "http://h:0/",
            "http://u@h/",
            "http://[::1/",
            "https://",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn encodes_host_and_close() {
        let mut t = parse("POST http://127.0.0.1:9/ping\nsleep: 5\n", "t", no_files)
            .unwrap()
            .remove(0);
        t.add_defaults(&[("sleep".into(), "9".into()), ("X-A".into(), "b".into())]);
        t.body = b"hi".to_vec();
        let wire = String::from_utf8(t.encode(false)).unwrap();
        assert!(
            wire.starts_with("POST /ping HTTP/1.1\r\nHost: 127.0.0.1:9\r\nsleep: 5\r\nX-A: b\r\n"),
            "{wire}"
        );
        assert!(wire.contains("Connection: close\r\n"));
        assert!(wire.ends_with("Content-Length: 2\r\n\r\nhi"), "{wire}");
        let (req, used) = http::parse_request(wire.as_bytes(), http::MAX_HEAD)
            .unwrap()
            .unwrap();
        assert_eq!(req.body_kind(), Ok(http::BodyKind::Length(2)));
        assert_eq!(&wire.as_bytes()[used..], b"hi");
        assert!(
            !String::from_utf8(t.encode(true))
                .unwrap()
                .contains("Connection")
        );
    }

    #[test]
    fn flags_make_one_target_or_refuse_what_does_not_go_together() {
        let url = |u: &str| Flags {
            url: Some(u.into()),
            ..Flags::default()
        };
        let get = url("http://127.0.0.1:9/ping").targets().unwrap().list;
        assert_eq!((get.len(), get[0].method.as_str()), (1, "GET"));
        let post = Flags {
            body: Some("hi".into()),
            headers: vec!["sleep: 5".into()],
            ..url("http://127.0.0.1:9/ping")
        }
        .targets()
        .unwrap()
        .list;
        assert_eq!(post[0].method, "POST");
        assert_eq!(post[0].headers, [("sleep".to_owned(), "5".to_owned())]);
        let bad = [
            Flags {
                method: Some("G3T".into()),
                ..url("http://127.0.0.1:9/")
            },
            Flags {
                file: Some("targets.txt".into()),
                body: Some("x".into()),
                ..Flags::default()
            },
            Flags {
                headers: vec!["no colon".into()],
                ..url("http://127.0.0.1:9/")
            },
            Flags::default(),
        ];
        for f in bad {
            assert!(matches!(f.targets(), Err(TargetError::Flags(_))), "{f:?}");
        }
    }

    #[test]
    fn json_targets_as_vegeta_writes_them() {
        let text = concat!(
            "{\"method\":\"POST\",\"url\":\"http://127.0.0.1:8080/p?x=1\",\"body\":\"eyJhIjoxfQ==\",",
            "\"header\":{\"Content-Type\":[\"application/json\"],\"X-Many\":[\"a\",\"b\"]}}\n",
            "\n",
            "{\"method\":\"GET\",\"url\":\"https://h:8443/\"}\n"
        );
        let t = parse(text, "t.json", no_files).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].method, "POST");
        assert_eq!(t[0].url.path, "/p?x=1");
        assert_eq!(t[0].body, b"{\"a\":1}");
        assert_eq!(
            t[0].headers,
            [
                ("Content-Type".to_owned(), "application/json".to_owned()),
                ("X-Many".to_owned(), "a".to_owned()),
                ("X-Many".to_owned(), "b".to_owned())
            ]
        );
        assert!(t[1].url.tls && t[1].body.is_empty());
        let err = |text: &str| parse(text, "t.json", no_files).unwrap_err().to_string();
        assert!(err("{\"method\":\"GET\"}\n").contains("t.json line 1: not a JSON target"));
        assert!(
            err("{\"method\":\"GET\",\"url\":\"http://h/\",\"extra\":1}").contains("unknown field")
        );
        assert!(
            err("{\"method\":\"GET\",\"url\":\"http://h/\",\"body\":\"!!\"}")
                .contains("not base64")
        );
        assert!(err("{\"method\":\"get\",\"url\":\"http://h/\"}").contains("not an HTTP method"));
        assert!(err("{\"method\":\"GET\",\"url\":\"ftp://h/\"}").contains("expected http://"));
        let crlf = "{\"method\":\"GET\",\"url\":\"http://h/\",\"header\":{\"A\":[\"x\\r\\ny\"]}}";
        assert!(err(crlf).contains("control characters"), "{}", err(crlf));
        // A text file stays text; a JSON line in it is no target line.
        assert!(parse("GET http://h/\n{\"method\":1}\n", "t", no_files).is_err());
    }

    #[test]
    fn a_file_is_read_line_by_line_in_either_format() {
        let dir = throng_testkit::TempDir::new("targets-read");
        let json = dir.file("t.json");
        std::fs::write(&json, "{\"method\":\"GET\",\"url\":\"http://h/a\"}\n{\"method\":\"GET\",\"url\":\"http://h/b\"}").unwrap();
        let t = read(&json, TargetFormat::Auto, None, Holding::Auto)
            .unwrap()
            .list;
        assert_eq!(
            t.iter().map(|t| t.url.path.as_str()).collect::<Vec<_>>(),
            ["/a", "/b"]
        );
        // Told it is text, the JSON is refused with its line.
        let err = read(&json, TargetFormat::Http, None, Holding::Auto)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1"), "{err}");
        assert_eq!("json".parse::<TargetFormat>(), Ok(TargetFormat::Json));
        assert!("yaml".parse::<TargetFormat>().is_err());
    }

    #[test]
    fn a_file_is_read_no_further_than_the_run_needs() {
        let dir = throng_testkit::TempDir::new("targets-limit");
        let text = dir.file("t.txt");
        // The third target is broken: a run of two requests never reads it.
        std::fs::write(
            &text,
            "GET http://h/a\nA: 1\n\nGET http://h/b\nB: 2\nGET ftp://h/c\n",
        )
        .unwrap();
        let two = read(&text, TargetFormat::Auto, Some(2), Holding::Auto)
            .unwrap()
            .list;
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].headers, [("B".to_owned(), "2".to_owned())]);
        assert!(read(&text, TargetFormat::Auto, Some(3), Holding::Auto).is_err());
        assert!(read(&text, TargetFormat::Auto, None, Holding::Auto).is_err());
        let json = dir.file("t.json");
        std::fs::write(
            &json,
            "{\"method\":\"GET\",\"url\":\"http://h/a\"}\nnot json\n",
        )
        .unwrap();
        assert_eq!(
            read(&json, TargetFormat::Auto, Some(1), Holding::Auto)
                .unwrap()
                .count(),
            1
        );
    }

    /// A cursor reads target `t` of either format wherever it stands,
    /// going round from the start when `t` is behind it; the checking pass
    /// holds none of a lazily read file but the first target per endpoint.
    #[test]
    fn a_cursor_reads_any_target_in_turn() {
        let dir = throng_testkit::TempDir::new("targets-cursor");
        let text = dir.file("t.txt");
        std::fs::write(
            &text,
            "# c\nGET http://h/0\nA: 0\n\nPOST http://h:81/1\n# inside\nB: 1\nGET http://h/2\n",
        )
        .unwrap();
        let json = dir.file("t.json");
        let lines: String = (0..5)
            .map(|i| format!("{{\"method\":\"GET\",\"url\":\"http://h/{i}\"}}\n\n"))
            .collect();
        std::fs::write(&json, lines).unwrap();
        for (path, n) in [(&text, 3u64), (&json, 5)] {
            let t = read(path, TargetFormat::Auto, None, Holding::Lazy).unwrap();
            let mut lazy = t.lazy.clone().unwrap();
            assert_eq!(lazy.count, n);
            lazy.headers = vec![("X".into(), "y".into())];
            let endpoints = if n == 3 { 2 } else { 1 };
            assert_eq!(t.list.len(), endpoints, "{t:?}");
            let mut c = Cursor::new(lazy);
            // Two workers' turns, then one going round twice.
            for t in [0, 2, 1, 0, 1, 2, 2, 0, 2] {
                let got = c.read(t % n).unwrap();
                assert_eq!(got.url.path, format!("/{}", t % n), "{path:?}");
                assert_eq!(got.headers.last().unwrap().0, "X");
            }
            assert!(c.read(n).is_err());
        }
        let first = Cursor::new(
            read(&text, TargetFormat::Auto, None, Holding::Lazy)
                .unwrap()
                .lazy
                .unwrap(),
        )
        .read(0)
        .unwrap();
        assert_eq!(first.headers[0], ("A".to_owned(), "0".to_owned()));
        // The file shrank under the run: said, not a panic.
        let mut c = Cursor::new(
            read(&json, TargetFormat::Auto, None, Holding::Lazy)
                .unwrap()
                .lazy
                .unwrap(),
        );
        std::fs::write(&json, "{\"method\":\"GET\",\"url\":\"http://h/0\"}\n").unwrap();
        let err = c.read(3).unwrap_err().to_string();
        assert!(err.contains("changed during the run"), "{err}");
    }
}
