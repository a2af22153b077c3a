//! Client connections to Redis, shared by the server's broker (`throng serve
//! --redis`) and the harness's publisher (`throng hold --publish`), so both
//! read the same URLs, trust certificates the same way and greet Redis with
//! the same `AUTH`/`SELECT`/`PING`.
//!
//! - [`RedisUrl`]: `redis://` or `rediss://` (TLS), `[user:password@]HOST[:PORT][/DB]`.
//! - [`Trust`]: which certificates a `rediss://` server may present: a CA
//!   file, the system bundle, or (for trials) none checked at all.
//! - [`open`]: TCP connect, TLS handshake (SNI from the URL host, none for
//!   an IP address), hello; hands back a [`Stream`] that is plain or TLS, so
//!   the callers' read/write loops, reconnects and resubscriptions are the
//!   same code either way.
//!
//! TLS is rustls on the `ring` provider (no aws-lc: build time), through
//! tokio-rustls: there are only two or three of these connections per
//! process, so nothing here is tuned for memory.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use thiserror::Error;
use throng_proto::resp::{self, Value};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;

/// Where the system's CA bundle usually is (Debian/Ubuntu/Alpine, then
/// Fedora/RHEL): the default trust of every TLS client here (`rediss://`,
/// `https://` publishing, `hold`/`attack`) when no CA file is given.
pub const SYSTEM_CA_BUNDLES: [&str; 2] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// The first of [`SYSTEM_CA_BUNDLES`] that exists.
pub fn system_ca_bundle() -> Option<&'static str> {
    SYSTEM_CA_BUNDLES
        .into_iter()
        .find(|p| Path::new(p).is_file())
}

/// The certificates to trust: those in the PEM file `ca` (every one must be
/// usable as a CA: a file given by hand with a broken certificate is a
/// mistake to show), or, without one, the parsable ones of the system
/// bundle.
pub fn trust_roots(ca: Option<&Path>) -> Result<RootCertStore, TrustError> {
    let path = match ca {
        Some(p) => p,
        None => Path::new(system_ca_bundle().ok_or(TrustError::NoSystemBundle)?),
    };
    let ca_err = |why: String| TrustError::Ca {
        path: path.to_owned(),
        why,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| ca_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ca_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(ca_err(
            "no certificate in the file (expected PEM '-----BEGIN CERTIFICATE-----' blocks)"
                .to_owned(),
        ));
    }
    let mut roots = RootCertStore::empty();
    if ca.is_some() {
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| ca_err(format!("not a usable CA certificate: {e}")))?;
        }
    } else {
        roots.add_parsable_certificates(certs);
        if roots.is_empty() {
            return Err(ca_err("no usable CA certificate in it".to_owned()));
        }
    }
    Ok(roots)
}

/// A parsed `redis[s]://[user:password@]HOST[:PORT][/DB]`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// Host name or IP address (IPv6 without brackets); also the TLS server name.
    pub host: String,
    /// TCP port (6379 when not given).
    pub port: u16,
    /// ACL user name, if any.
    pub user: Option<String>,
    /// Password (for `AUTH`), if any. Never printed.
    pub password: Option<String>,
    /// Database number for `SELECT` (pub/sub itself ignores it).
    pub db: u32,
    /// `rediss://`: the connection is TLS.
    pub tls: bool,
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Prints the URL with the password replaced by `***`.
impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "rediss://" } else { "redis://" })?;
        match (&self.user, &self.password) {
            (Some(u), Some(_)) => write!(f, "{u}:***@")?,
            (Some(u), None) => write!(f, "{u}@")?,
            (None, Some(_)) => f.write_str(":***@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}/{}", self.host, self.port, self.db)
        } else {
            write!(f, "{}:{}/{}", self.host, self.port, self.db)
        }
    }
}

impl FromStr for RedisUrl {
    type Err = String;
    fn from_str(url: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "invalid Redis URL '{}': {why} (expected redis://[user:password@]HOST[:PORT][/DB], \
                 or rediss:// for TLS)",
                redact(url)
            )
        };
        let (tls, rest) = if let Some(r) = url.strip_prefix("rediss://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("redis://") {
            (false, r)
        } else {
            return Err(bad("it must start with redis:// or rediss://"));
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (Some(a), r),
            None => (None, rest),
        };
        let (hostport, db) = match rest.split_once('/') {
            Some((h, "")) => (h, 0),
            Some((h, d)) => (
                h,
                d.parse()
                    .map_err(|_| bad("the database after '/' must be a number"))?,
            ),
            None => (rest, 0),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, p) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed '[' in host"))?;
            (h, p.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            Some(p) => p
                .parse()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad("the port must be a number 1-65535"))?,
            None => 6379,
        };
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => {
                let (u, p) = match a.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (a, None),
                };
                let u = percent_decode(u).ok_or_else(|| bad("bad %-escape in the user"))?;
                let p = match p {
                    Some(p) => {
                        Some(percent_decode(p).ok_or_else(|| bad("bad %-escape in the password"))?)
                    }
                    None => None,
                }
                .filter(|p| !p.is_empty());
                ((!u.is_empty()).then_some(u), p)
            }
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            user,
            password,
            db,
            tls,
        })
    }
}

impl RedisUrl {
    /// The commands sent on every new connection before anything else
    /// (`AUTH`, `SELECT`, `PING`), and how many replies they get.
    pub fn hello(&self) -> (BytesMut, usize) {
        let mut out = BytesMut::new();
        let mut n = 0;
        if let Some(p) = &self.password {
            match &self.user {
                Some(u) => resp::encode_command(&mut out, &[b"AUTH", u.as_bytes(), p.as_bytes()]),
                None => resp::encode_command(&mut out, &[b"AUTH", p.as_bytes()]),
            }
            n += 1;
        }
        if self.db != 0 {
            resp::encode_command(&mut out, &[b"SELECT", self.db.to_string().as_bytes()]);
            n += 1;
        }
        resp::encode_command(&mut out, &[b"PING"]);
        (out, n + 1)
    }
}

/// The URL with anything between `//` and `@` hidden, for error messages.
fn redact(url: &str) -> String {
    match (url.find("//"), url.rfind('@')) {
        (Some(s), Some(a)) if a > s => format!("{}***{}", &url[..s + 2], &url[a..]),
        _ => url.to_owned(),
    }
}

/// Decodes `%XX` escapes (for user names and passwords with `@`, `:` or `/`).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Which certificates a `rediss://` server may present.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust {
    /// PEM file of the CA certificates to trust. `None`: the system bundle
    /// ([`system_ca_bundle`]).
    pub ca: Option<PathBuf>,
    /// Check nothing: any certificate, any name (trials only: anyone on the
    /// path can read and change the traffic).
    pub insecure: bool,
}

impl Trust {
    /// One line for start-up output.
    pub fn describe(&self) -> String {
        match (&self.ca, self.insecure) {
            (_, true) => "TLS, certificate NOT checked (insecure)".to_owned(),
            (Some(ca), false) => format!("TLS, CA {}", ca.display()),
            (None, false) => match system_ca_bundle() {
                Some(p) => format!("TLS, CA {p} (system)"),
                None => "TLS, no system CA bundle found".to_owned(),
            },
        }
    }

    /// The rustls configuration for `url`: `None` for `redis://`.
    pub fn client_config(&self, url: &RedisUrl) -> Result<Option<Arc<ClientConfig>>, TrustError> {
        if !url.tls {
            return Ok(None);
        }
        self.tls_config().map(Some)
    }

    /// The rustls configuration for a TLS client that trusts what `self`
    /// says (also used for `https://` publish endpoints).
    pub fn tls_config(&self) -> Result<Arc<ClientConfig>, TrustError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TrustError::Rustls(e.to_string()))?;
        let config = if self.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(
                    provider.signature_verification_algorithms,
                )))
                .with_no_client_auth()
        } else {
            builder
                .with_root_certificates(trust_roots(self.ca.as_deref())?)
                .with_no_client_auth()
        };
        Ok(Arc::new(config))
    }
}

/// Why a [`Trust`] could not be turned into a TLS configuration.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TrustError {
    /// No CA file given and no system bundle either.
    #[error(
        "no CA certificates to check the server with: none of {} exists; give the CA file \
         that signed the server's certificate, or skip the check for a trial",
        SYSTEM_CA_BUNDLES.join(", ")
    )]
    NoSystemBundle,
    /// The CA file could not be read or holds no usable certificate.
    #[error("CA file {path}: {why}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(String),
}

/// `--tls-insecure` and its kin: accepts any certificate for any name, but
/// still checks that the server signed the handshake with the key of the
/// certificate it sent (so the session keys are the server's). Shared by the
/// Redis link, the harness's publisher and its `wss://`/`https://` client.
#[derive(Debug)]
pub struct AnyCertificate(pub WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// Why a connection to Redis could not be made or greeted.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LinkError {
    /// TCP connect failed (or the name did not resolve).
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    /// A step took longer than allowed.
    #[error("no {what} within {limit:?}")]
    Timeout {
        /// The step: "connection", "answer".
        what: &'static str,
        /// The limit.
        limit: Duration,
    },
    /// The server did not complete the TLS handshake in time: typically a
    /// plain Redis behind a `rediss://` URL (it waits for a command line).
    #[error(
        "no TLS handshake within {0:?} (is it a TLS port? a plain Redis or HTTP port waits \
         silently; use redis:// or http:// for it)"
    )]
    TlsTimeout(Duration),
    /// The TLS handshake failed: a certificate not signed by the trusted
    /// CA, a name mismatch, or a server that does not speak TLS there.
    #[error("TLS handshake failed: {error} ({hint})")]
    Tls {
        /// What rustls (or the socket) said.
        error: io::Error,
        /// What to check.
        hint: &'static str,
    },
    /// The URL host is not a valid TLS server name.
    #[error("'{0}' is not a valid TLS server name")]
    ServerName(String),
    /// Redis answered an error (wrong password, unknown database).
    #[error("Redis refused: {0}")]
    Refused(String),
    /// Redis closed the connection.
    #[error("Redis closed the connection")]
    Closed,
    /// Reading or writing failed.
    #[error("{0}")]
    Io(io::Error),
    /// Not RESP.
    #[error("bad answer from Redis: {0}")]
    Protocol(String),
}

impl LinkError {
    /// A short stable label for counters.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Timeout { .. } => "timeout",
            Self::Tls { .. } | Self::TlsTimeout(_) | Self::ServerName(_) => "tls",
            Self::Refused(_) => "refused",
            Self::Closed | Self::Io(_) => "io",
            Self::Protocol(_) => "protocol",
        }
    }
}

/// A connection to Redis, plain or TLS.
#[derive(Debug)]
pub enum Stream {
    /// `redis://`.
    Plain(TcpStream),
    /// `rediss://`.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Connects to `url` (over TLS with `tls`, from [`Trust::client_config`]),
/// sends the hello and checks its replies. Each step gets `timeout`.
/// Returns the stream and any bytes read past the hello replies.
pub async fn open(
    url: &RedisUrl,
    tls: Option<&Arc<ClientConfig>>,
    timeout: Duration,
) -> Result<(Stream, BytesMut), LinkError> {
    let tcp = tokio::time::timeout(timeout, TcpStream::connect((url.host.as_str(), url.port)))
        .await
        .map_err(|_| LinkError::Timeout {
            what: "connection",
            limit: timeout,
        })?
        .map_err(LinkError::Connect)?;
    let _ = tcp.set_nodelay(true);
    let mut s = match tls {
        None => Stream::Plain(tcp),
        Some(config) => tls_handshake(tcp, &url.host, config, timeout).await?,
    };
    let (hello, replies) = url.hello();
    write_all(&mut s, &hello).await.map_err(LinkError::Io)?;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let dec = resp::Decoder::default();
    for _ in 0..replies {
        let v = tokio::time::timeout(timeout, read_value(&mut s, &mut buf, &dec))
            .await
            .map_err(|_| LinkError::Timeout {
                what: "answer",
                limit: timeout,
            })??;
        if let Value::Error(e) = v {
            return Err(LinkError::Refused(String::from_utf8_lossy(&e).into_owned()));
        }
    }
    Ok((s, buf))
}

/// The TLS handshake on `tcp` as a client of `host` (its name for SNI and
/// the certificate check; an IP address sends no SNI and must be named by the
/// certificate), within `timeout`.
pub async fn tls_handshake(
    tcp: TcpStream,
    host: &str,
    config: &Arc<ClientConfig>,
    timeout: Duration,
) -> Result<Stream, LinkError> {
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| LinkError::ServerName(host.to_owned()))?;
    let tls = tokio::time::timeout(
        timeout,
        tokio_rustls::TlsConnector::from(config.clone()).connect(name, tcp),
    )
    .await
    .map_err(|_| LinkError::TlsTimeout(timeout))?
    .map_err(|error| {
        let hint = match error
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
        {
            Some(rustls::Error::InvalidCertificate(_)) => {
                "the certificate the server presented is not signed by a trusted CA, or does \
                 not name the URL's host: check the CA file given"
            }
            _ => "is it a TLS port, with TLS 1.2 or 1.3?",
        };
        LinkError::Tls { error, hint }
    })?;
    Ok(Stream::Tls(Box::new(tls)))
}

/// Writes all of `bytes` and flushes (TLS keeps records in rustls until
/// flushed; plain TCP's flush does nothing).
pub async fn write_all<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}

/// Reads until `buf` holds one whole RESP value.
pub async fn read_value<R: AsyncRead + Unpin>(
    s: &mut R,
    buf: &mut BytesMut,
    dec: &resp::Decoder,
) -> Result<Value, LinkError> {
    loop {
        if let Some(v) = dec
            .decode(buf)
            .map_err(|e| LinkError::Protocol(e.to_string()))?
        {
            return Ok(v);
        }
        buf.reserve(4096);
        match s.read_buf(buf).await {
            Ok(0) => return Err(LinkError::Closed),
            Ok(_) => {}
            Err(e) => return Err(LinkError::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u: RedisUrl = "redis://127.0.0.1:6380/2".parse().unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.db, u.tls),
            ("127.0.0.1", 6380, 2, false)
        );
        assert_eq!(u.user, None);
        let u: RedisUrl = "redis://alice:s%40cret%3A1@redis.local".parse().unwrap();
        assert_eq!(u.user.as_deref(), Some("alice"));
        assert_eq!(u.password.as_deref(), Some("s@cret:1"));
        assert_eq!((u.port, u.db), (6379, 0));
        assert_eq!(u.to_string(), "redis://alice:***@redis.local:6379/0");
        let u: RedisUrl = "redis://:pw@[::1]:7000/".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 7000));
        assert_eq!((u.user, u.password.as_deref()), (None, Some("pw")));
        let u: RedisUrl = "rediss://bob:pw@cache.example:6380/1".parse().unwrap();
        assert!(u.tls);
        assert_eq!(u.to_string(), "rediss://bob:***@cache.example:6380/1");
        for bad in [
            "http://x",
            "redis://",
            "rediss://",
            "redis://h:0",
            "redis://h:99999",
            "redis://h/x",
            "redis://u:%zz@h",
        ] {
            assert!(bad.parse::<RedisUrl>().is_err(), "{bad}");
        }
        let e = "redis://u:topsecret@h:1/x".parse::<RedisUrl>().unwrap_err();
        assert!(!e.contains("topsecret"), "{e}");
    }

    #[test]
    fn hello_authenticates_and_selects() {
        let u: RedisUrl = "redis://bob:pw@h/3".parse().unwrap();
        let (out, n) = u.hello();
        assert_eq!(n, 3);
        assert_eq!(
            &out[..],
            b"*3\r\n$4\r\nAUTH\r\n$3\r\nbob\r\n$2\r\npw\r\n*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n*1\r\n$4\r\nPING\r\n"
        );
        let u: RedisUrl = "redis://h".parse().unwrap();
        assert_eq!(u.hello().1, 1);
    }

    #[test]
    fn trust() {
        let plain: RedisUrl = "redis://h".parse().unwrap();
        assert!(Trust::default().client_config(&plain).unwrap().is_none());
        let tls: RedisUrl = "rediss://h".parse().unwrap();
        let insecure = Trust {
            ca: None,
            insecure: true,
        };
        assert!(insecure.client_config(&tls).unwrap().is_some());
        let missing = Trust {
            ca: Some("/nonexistent/ca.pem".into()),
            insecure: false,
        };
        let e = missing.client_config(&tls).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        // A file that is not PEM is refused by name, not taken as "trust nothing".
        let not_pem =
            std::env::temp_dir().join(format!("throng-redis-notpem-{}", std::process::id()));
        std::fs::write(&not_pem, "hello\n").unwrap();
        let e = Trust {
            ca: Some(not_pem.clone()),
            insecure: false,
        }
        .client_config(&tls)
        .unwrap_err()
        .to_string();
        let _ = std::fs::remove_file(&not_pem);
        assert!(
            e.contains("no certificate in the file") && e.contains("BEGIN CERTIFICATE"),
            "{e}"
        );
        assert!(e.contains(not_pem.to_str().unwrap()), "{e}");
    }
}
