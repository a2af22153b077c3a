//! Reading `--auth-jwks-url`: one HTTP/1.1 GET over TLS (or plain HTTP to
//! loopback), at start by the CLI ([`read_now`]: a set that cannot be read
//! stops the start) and then by the supervisor ([`refresh`]): every
//! `--auth-jwks-refresh`, and sooner when a worker saw a token whose `kid`
//! no key has ([`crate::control::Record::KeysStale`]), but never more
//! often than once per [`MIN_GAP`], so a flood of made-up kids costs the
//! provider one request per gap. A read that fails keeps the keys the
//! server has.

use std::rc::Rc;
use std::time::Duration;

use throng_client::link::{self, LinkError, Stream};
use throng_client::trust::Trust;
use throng_proto::http::{self, BodyDecoder};
use tokio::io::AsyncReadExt as _;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::auth::jwks::{self, JwksError, MAX_JWKS, Parsed};
use crate::auth::{Jwks, JwksUrl};

/// The shortest time between two reads a token's unknown `kid` asks for.
pub const MIN_GAP: Duration = Duration::from_secs(5);

/// How long one read may take, connection to last byte.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The largest response head read.
const MAX_HEAD: usize = 16 * 1024;

/// Why a key set could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The CA file would not load.
    #[error("{0}")]
    Trust(String),
    /// No connection, or no TLS.
    #[error("{0}")]
    Link(#[from] LinkError),
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Not a usable HTTP answer.
    #[error("{0}")]
    Http(String),
    /// Not 200.
    #[error("answered {status} {reason}{hint}")]
    Status {
        /// The status code.
        status: u16,
        /// Its reason phrase.
        reason: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// Read, but not a usable key set.
    #[error("{0}")]
    Jwks(#[from] JwksError),
    /// The read took longer than [`TIMEOUT`].
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
}

/// Reads and checks the key set now (at start: the CLI calls it before
/// anything listens).
pub fn read_now(url: &JwksUrl, ca: Option<&std::path::Path>) -> Result<Parsed, FetchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(fetch(url, ca))
}

/// One read of the key set, within [`TIMEOUT`].
pub async fn fetch(url: &JwksUrl, ca: Option<&std::path::Path>) -> Result<Parsed, FetchError> {
    let body = tokio::time::timeout(TIMEOUT, get(url, ca))
        .await
        .map_err(|_| FetchError::Timeout(TIMEOUT))??;
    Ok(jwks::parse(&body, &url.url)?)
}

/// `GET url`, answered 200: the body.
async fn get(url: &JwksUrl, ca: Option<&std::path::Path>) -> Result<Vec<u8>, FetchError> {
    let tcp = tokio::net::TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(LinkError::Connect)?;
    let mut stream = if url.tls {
        let trust = Trust {
            ca: ca.map(std::path::Path::to_path_buf),
            insecure: false,
        };
        let config = trust
            .tls_config()
            .map_err(|e| FetchError::Trust(e.to_string()))?;
        link::tls_handshake(tcp, &url.host, &config, TIMEOUT).await?
    } else {
        Stream::Plain(tcp)
    };
    let host = match (
        url.host.contains(':'),
        url.port == if url.tls { 443 } else { 80 },
    ) {
        (true, true) => format!("[{}]", url.host),
        (true, false) => format!("[{}]:{}", url.host, url.port),
        (false, true) => url.host.clone(),
        (false, false) => format!("{}:{}", url.host, url.port),
    };
    let mut req = Vec::new();
    http::write_request(
        &mut req,
        "GET",
        &url.target,
        &[
            ("Host", host.as_bytes()),
            ("Accept", b"application/json, application/jwk-set+json"),
            ("User-Agent", b"throng"),
            ("Connection", b"close"),
        ],
        &[],
    );
    link::write_all(&mut stream, &req).await?;
    let mut buf = Vec::with_capacity(8 * 1024);
    let (resp, at) = loop {
        if let Some(head) = http::parse_response(&buf, MAX_HEAD)
            .map_err(|e| FetchError::Http(format!("not an HTTP answer: {e}")))?
        {
            break head;
        }
        if read_more(&mut stream, &mut buf).await? == 0 {
            return Err(FetchError::Http(
                "the connection closed before an HTTP answer".into(),
            ));
        }
    };
    if resp.status != 200 {
        let hint = match resp.status {
            300..=399 => " (redirects are not followed: give the URL it names)",
            _ => "",
        };
        return Err(FetchError::Status {
            status: resp.status,
            reason: resp.reason,
            hint,
        });
    }
    let kind = resp
        .body_kind("GET")
        .map_err(|e| FetchError::Http(format!("bad body framing: {e}")))?;
    read_body(&mut stream, buf.split_off(at), kind).await
}

/// The body after the head: `pending` is what was read past the head.
async fn read_body(
    stream: &mut Stream,
    mut pending: Vec<u8>,
    kind: http::BodyKind,
) -> Result<Vec<u8>, FetchError> {
    let mut decoder = BodyDecoder::new(kind, MAX_JWKS as u64);
    let mut body = Vec::new();
    let mut eof = false;
    loop {
        let step = decoder
            .decode(&pending, eof)
            .map_err(|e| FetchError::Http(format!("the key set's body: {e}")))?;
        body.extend_from_slice(&pending[step.data.0..step.data.1]);
        pending.drain(..step.consumed);
        if step.done {
            return Ok(body);
        }
        if step.consumed == 0 {
            if eof {
                return Err(FetchError::Http("the body ended early".into()));
            }
            eof = read_more(stream, &mut pending).await? == 0;
        }
    }
}

async fn read_more(stream: &mut Stream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// The supervisor's reader: reads `set` again every `set.refresh`, or
/// when `stale` is notified (at most once per [`MIN_GAP`]), and hands
/// each outcome to `done`. `last` is when the set was last read.
pub async fn refresh(
    set: Jwks,
    stale: Rc<Notify>,
    mut last: Instant,
    done: impl Fn(Result<Parsed, FetchError>),
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(last + set.refresh) => {}
            () = stale.notified() => tokio::time::sleep_until(last + MIN_GAP).await,
        }
        last = Instant::now();
        done(fetch(&set.url, set.ca.as_deref()).await);
    }
}
