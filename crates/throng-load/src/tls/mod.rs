//! The TLS client of `hold` (`wss://`) and `attack` (`https://`): rustls on
//! the `ring` provider, driven through its *unbuffered* API.
//!
//! Why unbuffered: rustls's ordinary `ClientConnection` keeps a receive
//! buffer of at least 4 KiB per connection once anything has been read, and
//! never gives it back while the connection lives. A held subscriber is idle
//! almost all the time, so that buffer would be most of its memory. With the
//! unbuffered API the caller owns every buffer: reads go into the worker's
//! one scratch buffer, and a connection keeps only rustls's state plus, when
//! a record arrived split across reads, the bytes of that one partial record
//! ([`Session::pending`]). A held `hold` connection goes further once its
//! upgrade is done: it leaves rustls and keeps only its record keys
//! ([`Records`], in `records`).
//!
//! The certificate check: `--tls-ca FILE` trusts the PEM certificates in
//! FILE; without it the system bundle (`throng_client::trust::SYSTEM_CA_BUNDLES`) is used when there
//! is one; `--tls-insecure` accepts any certificate (the handshake signature
//! is still checked, so the server must hold the key of the certificate it
//! sends). SNI comes from the URL's host; an IP address sends no SNI and is
//! matched against the certificate's IP addresses. A chain verified for a
//! server name is remembered for a minute (`RecentChains`).
//!
//! Session resumption (`--tls-resume`): each worker keeps an in-memory
//! ticket/session cache shared by all its connections ([`Tickets`]), so
//! after the first full handshakes to a server the next ones resume. Off by
//! default: every connection then pays a full handshake, the server's worst
//! case, and the figures are not flattered by a warm cache.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    ClientSessionStore, Resumption, Tls12ClientSessionValue, Tls13ClientSessionValue,
    UnbufferedClientConnection, WebPkiServerVerifier,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError};
use rustls::{CertificateError, ClientConfig, HandshakeKind, NamedGroup};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use throng_client::trust::AnyCertificate;
use tokio::net::TcpStream;

mod records;
pub use records::Records;

/// The largest handshake flight accepted (rustls's own limit for buffered
/// handshake messages is 64 KiB; a record may add its header and tag).
const MAX_PENDING: usize = 64 * 1024 + 2048;

/// How the TLS client checks and resumes; sent to workers in their plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsOptions {
    /// Accept any certificate.
    pub insecure: bool,
    /// Trust the PEM certificates in this file (else the system bundle).
    pub ca_file: Option<PathBuf>,
    /// Resume sessions (tickets or session ids) from a per-worker cache.
    pub resume: bool,
}

impl TlsOptions {
    /// What the options mean, for the settings printed at start.
    pub fn describe(&self) -> String {
        let check = if self.insecure {
            "certificates NOT checked (--tls-insecure)".to_owned()
        } else {
            match &self.ca_file {
                Some(p) => format!("certificates checked against {}", p.display()),
                None => match throng_client::trust::system_ca_bundle() {
                    Some(p) => format!("certificates checked against the system bundle {p}"),
                    None => "no CA bundle found".to_owned(),
                },
            }
        };
        format!(
            "TLS 1.3/1.2 (rustls, ring), ALPN http/1.1, {check}; session resumption {}",
            if self.resume {
                "on (--tls-resume)"
            } else {
                "off (the default: every connection a full handshake)"
            }
        )
    }
}

/// Why a TLS client could not be set up.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TlsSetupError {
    /// The CA file could not be read or holds no certificate.
    #[error("--tls-ca {path}: {why}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// Neither `--tls-ca` nor `--tls-insecure`, and no system bundle.
    #[error(
        "no CA certificates to check the server with: none of {} exists; pass --tls-ca FILE (PEM) or, for a self-signed test server, --tls-insecure",
        throng_client::trust::SYSTEM_CA_BUNDLES.join(", ")
    )]
    NoRoots,
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// The host cannot be a TLS server name.
    #[error("'{0}' is not a valid TLS server name")]
    ServerName(String),
    /// The certificate check could not be built from the CA certificates.
    #[error("TLS certificate check: {0}")]
    Verifier(String),
}

/// A worker's TLS client: one configuration (and session cache) shared by
/// every connection.
#[derive(Debug, Clone)]
pub struct TlsClient {
    config: Arc<ClientConfig>,
}

/// TLS 1.3 tickets kept per server name. rustls's own cache keeps 8, and a
/// TLS 1.3 ticket is used once: with more connections opening at once than
/// tickets in hand, the rest would fall back to full handshakes.
const TICKETS_PER_SERVER: usize = 1024;
/// Server names remembered per worker.
const SERVERS: usize = 64;

/// The session cache of `--tls-resume`: per server name, the key exchange
/// group it chose, its TLS 1.2 session, and up to `TICKETS_PER_SERVER` (1024)
/// TLS 1.3 tickets (newest used first: the least likely to have expired).
/// A worker is one thread; the lock is only there because rustls asks for
/// `Sync`.
#[derive(Debug, Default)]
pub struct Tickets {
    servers: Mutex<HashMap<ServerName<'static>, Server>>,
}

#[derive(Debug, Default)]
struct Server {
    kx_hint: Option<NamedGroup>,
    tls12: Option<Tls12ClientSessionValue>,
    tls13: VecDeque<Tls13ClientSessionValue>,
}

impl Tickets {
    fn with<R>(&self, name: &ServerName<'_>, f: impl FnOnce(Option<&mut Server>) -> R) -> R {
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        f(servers.get_mut(&name.to_owned()))
    }

    fn with_new<R>(&self, name: ServerName<'static>, f: impl FnOnce(&mut Server) -> R) -> R {
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        if !servers.contains_key(&name) && servers.len() >= SERVERS {
            servers.clear();
        }
        f(servers.entry(name).or_default())
    }
}

impl ClientSessionStore for Tickets {
    fn set_kx_hint(&self, name: ServerName<'static>, group: NamedGroup) {
        self.with_new(name, |s| s.kx_hint = Some(group));
    }

    fn kx_hint(&self, name: &ServerName<'_>) -> Option<NamedGroup> {
        self.with(name, |s| s.and_then(|s| s.kx_hint))
    }

    fn set_tls12_session(&self, name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.with_new(name, |s| s.tls12 = Some(value));
    }

    fn tls12_session(&self, name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.with(name, |s| s.and_then(|s| s.tls12.clone()))
    }

    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.with(name, |s| {
            if let Some(s) = s {
                s.tls12 = None;
            }
        });
    }

    fn insert_tls13_ticket(&self, name: ServerName<'static>, value: Tls13ClientSessionValue) {
        self.with_new(name, |s| {
            if s.tls13.len() >= TICKETS_PER_SERVER {
                s.tls13.pop_front();
            }
            s.tls13.push_back(value);
        });
    }

    fn take_tls13_ticket(&self, name: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        self.with(name, |s| s.and_then(|s| s.tls13.pop_back()))
    }
}

impl TlsClient {
    /// Builds the client; reads the CA file (or the system bundle).
    pub fn new(opts: &TlsOptions) -> Result<Self, TlsSetupError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(rustls::ALL_VERSIONS)?;
        // Either way a verifier of our own: any certificate (`--tls-insecure`),
        // or webpki's checks with a verified chain remembered for a minute.
        let verifier: Arc<dyn ServerCertVerifier> = if opts.insecure {
            Arc::new(AnyCertificate::new(
                provider.signature_verification_algorithms,
            ))
        } else {
            let roots = throng_client::trust::trust_roots(opts.ca_file.as_deref()).map_err(
                |e| match e {
                    throng_client::trust::TrustError::NoSystemBundle => TlsSetupError::NoRoots,
                    throng_client::trust::TrustError::Ca { path, why } => {
                        TlsSetupError::CaFile { path, why }
                    }
                    other => TlsSetupError::Verifier(other.to_string()),
                },
            )?;
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsSetupError::Verifier(e.to_string()))?;
            Arc::new(RecentChains::new(webpki))
        };
        let mut config = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // Held connections leave rustls once established ([`Records`]).
        config.enable_secret_extraction = true;
        config.resumption = if opts.resume {
            Resumption::store(Arc::new(Tickets::default()))
        } else {
            Resumption::disabled()
        };
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// The same client offering only `h2` in ALPN (`attack --http2`).
    pub fn for_h2(&self) -> Self {
        let mut config = (*self.config).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Self {
            config: Arc::new(config),
        }
    }

    /// A new client session to `host` (the URL's host: a name is sent as SNI,
    /// an IP address is not).
    pub fn session(&self, host: &str) -> Result<Session, TlsSetupError> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host)
            .map_err(|_| TlsSetupError::ServerName(host.to_owned()))?
            .to_owned();
        let conn = UnbufferedClientConnection::new(self.config.clone(), name)?;
        Ok(Session {
            conn,
            pending: Vec::new(),
        })
    }
}

// Keep the provider type named so a change of provider is a compile error here.
const _: fn() -> CryptoProvider = rustls::crypto::ring::default_provider;

/// How long a verified certificate chain is taken as verified again.
const RECENT_CHAIN_TTL: Duration = Duration::from_secs(60);
/// Chains remembered at once (a run talks to a few servers).
const RECENT_CHAINS: usize = 32;

/// The certificate check with a memory: a chain it verified (path to a
/// trusted root, names, validity, the issuers' signatures) in the last
/// [`RECENT_CHAIN_TTL`] for the same server name is taken as verified,
/// without building the path and checking its signatures again. A run
/// opens thousands of connections to one server, and the chain check was
/// an ECDSA (or RSA) verification per connection: a third of the harness's
/// handshake CPU went to P-256 arithmetic, half of it for this. The
/// handshake's own signature (CertificateVerify), which proves the server
/// holds the certificate's key, is still checked on every connection.
#[derive(Debug)]
struct RecentChains {
    inner: Arc<WebPkiServerVerifier>,
    /// SHA-256 of (server name, chain) and when it was verified.
    seen: Mutex<VecDeque<([u8; 32], Instant)>>,
}

impl RecentChains {
    fn new(inner: Arc<WebPkiServerVerifier>) -> Self {
        Self {
            inner,
            seen: Mutex::new(VecDeque::new()),
        }
    }

    fn key(
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
    ) -> [u8; 32] {
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        let mut part = |b: &[u8]| {
            h.update(&(b.len() as u64).to_be_bytes());
            h.update(b);
        };
        part(server_name.to_str().as_bytes());
        part(end_entity);
        for c in intermediates {
            part(c);
        }
        let mut key = [0u8; 32];
        key.copy_from_slice(h.finish().as_ref());
        key
    }
}

impl ServerCertVerifier for RecentChains {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let key = Self::key(end_entity, intermediates, server_name);
        let fresh = |at: &Instant| at.elapsed() < RECENT_CHAIN_TTL;
        {
            let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            if seen.iter().any(|(k, at)| *k == key && fresh(at)) {
                return Ok(ServerCertVerified::assertion());
            }
        }
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.retain(|(k, at)| *k != key && fresh(at));
        if seen.len() >= RECENT_CHAINS {
            seen.pop_front();
        }
        seen.push_back((key, Instant::now()));
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

/// Why a TLS connection failed; each is a counter `<family>.error.tls.<reason>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// The certificate is not signed by a trusted CA (a wrong `--tls-ca`).
    UnknownIssuer,
    /// The certificate is not valid for the URL's host.
    NameMismatch,
    /// The certificate is expired or not valid yet.
    Expired,
    /// Any other problem with the certificate.
    BadCertificate,
    /// The server sent a fatal alert (it refused us: versions, ciphers, SNI...).
    AlertReceived,
    /// The server broke the TLS protocol, or is not speaking TLS at all.
    Protocol,
    /// Anything else.
    Other,
}

impl TlsFailure {
    /// Every reason, in counter order.
    pub const ALL: [Self; 7] = [
        Self::UnknownIssuer,
        Self::NameMismatch,
        Self::Expired,
        Self::BadCertificate,
        Self::AlertReceived,
        Self::Protocol,
        Self::Other,
    ];

    /// The counter suffix after `error.`: `tls.<reason>`.
    pub fn label(self) -> &'static str {
        match self {
            Self::UnknownIssuer => "tls.unknown_issuer",
            Self::NameMismatch => "tls.name_mismatch",
            Self::Expired => "tls.expired",
            Self::BadCertificate => "tls.bad_certificate",
            Self::AlertReceived => "tls.alert_received",
            Self::Protocol => "tls.protocol",
            Self::Other => "tls.other",
        }
    }

    /// Classifies a rustls error.
    pub fn of(err: &rustls::Error) -> Self {
        use rustls::Error as E;
        match err {
            E::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer => Self::UnknownIssuer,
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => Self::NameMismatch,
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => Self::Expired,
                _ => Self::BadCertificate,
            },
            E::AlertReceived(_) => Self::AlertReceived,
            E::InappropriateMessage { .. }
            | E::InappropriateHandshakeMessage { .. }
            | E::InvalidMessage(_)
            | E::PeerMisbehaved(_)
            | E::PeerIncompatible(_)
            | E::PeerSentOversizedRecord
            | E::DecryptError
            | E::NoCertificatesPresented => Self::Protocol,
            _ => Self::Other,
        }
    }
}

/// A connection's TLS failure: the rustls reason, or the socket's error.
#[derive(Debug, Error)]
pub enum TlsError {
    /// rustls refused the peer.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The server closed the connection during the handshake.
    #[error("the server closed the connection during the TLS handshake")]
    Closed,
    /// The server sent more handshake data than any sane server does.
    #[error("the server's TLS handshake is over {MAX_PENDING} bytes")]
    TooLarge,
}

/// Where a connection stands after [`Session::receive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Still handshaking: send what was produced, then read more.
    Handshaking,
    /// Established: application data flows.
    Open,
    /// The server sent close_notify: nothing more will arrive.
    PeerClosed,
}

/// What to encrypt once the connection is established.
enum Outgoing<'a> {
    Nothing,
    Data(&'a [u8]),
    CloseNotify,
}

/// One client TLS connection: rustls's state machine and the bytes of a
/// record that arrived split across reads. Nothing else: the caller brings
/// the buffers.
pub struct Session {
    conn: UnbufferedClientConnection,
    /// The start of a record not yet whole (empty, no allocation, otherwise).
    pub pending: Vec<u8>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Hands an established connection over to a [`Records`]: its keys
    /// and sequence numbers, and the partial record not yet read. rustls's
    /// own state is freed.
    pub fn into_records(self) -> Result<Records, TlsError> {
        let (secrets, kernel) = self.conn.dangerous_into_kernel_connection()?;
        let tls13 = kernel.protocol_version() == rustls::ProtocolVersion::TLSv1_3;
        // Dropped: see `records` for what that gives up and why.
        drop(kernel);
        Records::new(secrets, tls13, self.pending)
    }

    /// What was negotiated, for a log line: `TLSv1_3
    /// TLS13_AES_256_GCM_SHA384, ALPN http/1.1, full handshake`.
    pub fn describe(&self) -> String {
        let version = self
            .conn
            .protocol_version()
            .map_or("?".to_owned(), |v| format!("{v:?}"));
        let suite = self
            .conn
            .negotiated_cipher_suite()
            .map_or("?".to_owned(), |s| format!("{:?}", s.suite()));
        let alpn = self
            .conn
            .alpn_protocol()
            .map_or("none".into(), String::from_utf8_lossy);
        let kind = if self.resumed() { "resumed" } else { "full" };
        format!("{version} {suite}, ALPN {alpn}, {kind} handshake")
    }

    /// The protocol the server chose in ALPN (`None`: it chose none).
    pub fn alpn(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// Whether the handshake resumed an earlier session.
    pub fn resumed(&self) -> bool {
        self.conn.handshake_kind() == Some(HandshakeKind::Resumed)
    }

    /// Runs `incoming` (bytes just read from the socket; `&mut []` for none)
    /// through the connection, after any pending partial record: appends the
    /// application data it carried to `plain` and any TLS bytes to send
    /// (handshake messages) to `out`. A trailing partial record is kept.
    pub fn receive(
        &mut self,
        incoming: &mut [u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<Phase, TlsError> {
        self.step(incoming, plain, out, Outgoing::Nothing)
    }

    /// Encrypts `data` (application data) into `out`.
    pub fn send(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), TlsError> {
        let mut plain = Vec::new();
        self.step(&mut [], &mut plain, out, Outgoing::Data(data))
            .map(|_| ())
    }

    /// Encodes a close_notify alert into `out`.
    pub fn close_notify(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        let mut plain = Vec::new();
        self.step(&mut [], &mut plain, out, Outgoing::CloseNotify)
            .map(|_| ())
    }

    fn step(
        &mut self,
        incoming: &mut [u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
        send: Outgoing<'_>,
    ) -> Result<Phase, TlsError> {
        let conn = &mut self.conn;
        after_pending(&mut self.pending, incoming, |buf| {
            pump(conn, buf, plain, out, send)
        })
    }
}

/// Runs `f` over `incoming`, behind the partial record `pending` kept from
/// the last read if there is one, and keeps in `pending` what `f` did not
/// use (a record that arrived split) for the next read. `f` returns how
/// many bytes it used.
pub(crate) fn after_pending<T>(
    pending: &mut Vec<u8>,
    incoming: &mut [u8],
    f: impl FnOnce(&mut [u8]) -> Result<(usize, T), TlsError>,
) -> Result<T, TlsError> {
    if pending.is_empty() {
        let (used, out) = f(incoming)?;
        if used < incoming.len() {
            *pending = incoming[used..].to_vec();
        }
        Ok(out)
    } else {
        let mut joined = std::mem::take(pending);
        joined.extend_from_slice(incoming);
        let (used, out) = f(&mut joined)?;
        if used < joined.len() {
            joined.drain(..used);
            *pending = joined;
        }
        Ok(out)
    }
}

/// Drives rustls over `incoming` until it needs more bytes (or is
/// established and has encrypted `send`). Returns the bytes of `incoming`
/// it used up.
fn pump(
    conn: &mut UnbufferedClientConnection,
    incoming: &mut [u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
    mut send: Outgoing<'_>,
) -> Result<(usize, Phase), TlsError> {
    let mut used = 0;
    loop {
        let status = conn.process_tls_records(&mut incoming[used..]);
        let discard = status.discard;
        let state = status.state?;
        let done = match state {
            ConnectionState::ReadTraffic(mut traffic) => {
                while let Some(record) = traffic.next_record() {
                    plain.extend_from_slice(record?.payload);
                }
                None
            }
            ConnectionState::EncodeTlsData(mut encode) => {
                let start = out.len();
                out.resize(start + 4096, 0);
                let n = match encode.encode(&mut out[start..]) {
                    Ok(n) => n,
                    Err(EncodeError::InsufficientSize(need)) => {
                        out.resize(start + need.required_size, 0);
                        encode
                            .encode(&mut out[start..])
                            .map_err(|e| rustls::Error::General(e.to_string()))?
                    }
                    Err(e) => return Err(rustls::Error::General(e.to_string()).into()),
                };
                out.truncate(start + n);
                None
            }
            // The caller sends all of `out` as soon as this returns.
            ConnectionState::TransmitTlsData(transmit) => {
                transmit.done();
                None
            }
            ConnectionState::BlockedHandshake => Some(Phase::Handshaking),
            ConnectionState::WriteTraffic(mut write) => {
                let start = out.len();
                let r = match send {
                    Outgoing::Nothing => Ok(0),
                    Outgoing::Data(data) => {
                        out.resize(start + data.len() + 256, 0);
                        match write.encrypt(data, &mut out[start..]) {
                            Err(EncryptError::InsufficientSize(need)) => {
                                out.resize(start + need.required_size, 0);
                                write.encrypt(data, &mut out[start..])
                            }
                            r => r,
                        }
                    }
                    Outgoing::CloseNotify => {
                        out.resize(start + 64, 0);
                        write.queue_close_notify(&mut out[start..])
                    }
                };
                send = Outgoing::Nothing;
                let n = r.map_err(|e| rustls::Error::General(e.to_string()))?;
                out.truncate(start + n);
                Some(Phase::Open)
            }
            ConnectionState::PeerClosed | ConnectionState::Closed => Some(Phase::PeerClosed),
            _ => Some(Phase::Open),
        };
        used += discard;
        if let Some(phase) = done {
            return Ok((used, phase));
        }
    }
}

/// Writes all of `buf` to a tokio stream.
pub async fn write_all(stream: &TcpStream, buf: &[u8]) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        match stream.try_write(&buf[off..]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits until `stream` has bytes, reads them into `scratch` (a buffer
/// shared by a worker's connections, borrowed only here, never across an
/// await) and runs them through `session`. Returns the phase, or
/// `Ok(None)` at end of stream.
pub async fn receive_from(
    stream: &TcpStream,
    scratch: &RefCell<Box<[u8]>>,
    session: &mut Session,
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<Option<Phase>, TlsError> {
    loop {
        stream.readable().await?;
        let mut buf = scratch.borrow_mut();
        match stream.try_read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => return session.receive(&mut buf[..n], plain, out).map(Some),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Runs the handshake of `session` on `stream` to the end, reading through
/// the worker's `scratch` buffer: a handshake in flight owns no read buffer,
/// so the memory it frees when done leaves few holes between the
/// connections that stay. `plain` gets any application data that came with
/// the last flight.
pub async fn handshake(
    stream: &TcpStream,
    scratch: &RefCell<Box<[u8]>>,
    session: &mut Session,
    plain: &mut Vec<u8>,
) -> Result<(), TlsError> {
    let mut out = Vec::new();
    let mut phase = session.receive(&mut [], plain, &mut out)?;
    loop {
        if !out.is_empty() {
            write_all(stream, &out).await?;
            out.clear();
        }
        if phase != Phase::Handshaking {
            return if phase == Phase::Open {
                Ok(())
            } else {
                Err(TlsError::Closed)
            };
        }
        phase = receive_from(stream, scratch, session, plain, &mut out)
            .await?
            .ok_or(TlsError::Closed)?;
        if session.pending.len() > MAX_PENDING {
            return Err(TlsError::TooLarge);
        }
    }
}

#[cfg(test)]
mod tests {
    use rustls::RootCertStore;

    use super::*;

    #[test]
    fn a_verified_chain_is_remembered_per_server_name_and_an_untrusted_one_never() {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let cert = made.cert.der().clone();
        let mut roots = RootCertStore::empty();
        roots.add(cert.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let v = RecentChains::new(
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap(),
        );
        let now = rustls::pki_types::UnixTime::now();
        let name = ServerName::try_from("localhost").unwrap();
        let remembered = || v.seen.lock().unwrap().len();
        assert!(v.verify_server_cert(&cert, &[], &name, &[], now).is_ok());
        assert_eq!(remembered(), 1);
        // Within the minute it is not checked again: a time past the
        // certificate's end still passes, which only the memory explains.
        let far = rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_secs(1 << 40));
        assert!(v.verify_server_cert(&cert, &[], &name, &[], far).is_ok());
        assert_eq!(remembered(), 1);
        // Another name, or a certificate nobody trusts, is checked in full.
        let other = ServerName::try_from("example.com").unwrap();
        assert!(v.verify_server_cert(&cert, &[], &other, &[], now).is_err());
        let stranger = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        assert!(
            v.verify_server_cert(stranger.cert.der(), &[], &name, &[], now)
                .is_err()
        );
        assert_eq!(remembered(), 1);
    }

    #[test]
    fn classifies_rustls_errors() {
        let e = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert_eq!(TlsFailure::of(&e), TlsFailure::UnknownIssuer);
        let e = rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure);
        assert_eq!(TlsFailure::of(&e).label(), "tls.alert_received");
        let e = rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType);
        assert_eq!(TlsFailure::of(&e), TlsFailure::Protocol);
    }

    #[test]
    fn names_and_addresses() {
        let client = TlsClient::new(&TlsOptions {
            insecure: true,
            ca_file: None,
            resume: false,
        })
        .unwrap();
        assert!(client.session("127.0.0.1").is_ok());
        assert!(client.session("[::1]").is_ok());
        assert!(client.session("localhost").is_ok());
        assert!(client.session("bad name!").is_err());
    }

    #[test]
    fn ca_file_errors_are_clear() {
        let dir = std::env::temp_dir().join(format!("throng-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no pem here\n").unwrap();
        for path in [empty, dir.join("missing.pem")] {
            let err = TlsClient::new(&TlsOptions {
                insecure: false,
                ca_file: Some(path.clone()),
                resume: true,
            })
            .unwrap_err();
            assert!(err.to_string().contains("--tls-ca"), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
