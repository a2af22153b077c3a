//! TLS for `throng serve`: wss subscriptions and the https endpoints on the
//! listeners given with `--tls-listen`, terminated by rustls on the `ring`
//! provider (TLS 1.2 and 1.3, ALPN `http/1.1`, resumption on by default).
//!
//! Every TLS connection uses rustls's *unbuffered* API
//! ([`UnbufferedServerConnection`]): the caller owns every byte buffer, so an
//! idle subscriber holds only the connection's state (keys, sequence
//! numbers) and none of the 4 KiB+ read buffer a buffered `ServerConnection`
//! keeps for its whole life. Records are decrypted from the worker's one
//! scratch buffer and encrypted into the worker's one output buffer.
//!
//! - [`Material`]: the certificate chain and key (from PEM files or made
//!   here for trials), plus the session-ticket key every worker shares, as
//!   the supervisor hands them to the workers.
//! - [`server_config`]: the rustls settings built from it, once per worker.
//! - `pump` and `seal`: the two things the worker does with a
//!   connection: feed it received bytes, and encrypt a frame for it.
//! - `stream`: the handshake and the HTTP phase, as a tokio stream.
//! - `park`: connections waiting between requests, out of their task and
//!   in the worker's epoll.

pub(crate) mod park;
pub(crate) mod stream;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use ring::aead::{self, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::{ProducesTickets, ServerSessionMemoryCache, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

/// Sessions each worker remembers for TLS 1.2 clients that resume by
/// session id instead of a ticket (tickets need no memory on the server).
pub const SESSION_CACHE: usize = 1024;

/// How long a session ticket may be used, in seconds (tickets are honoured
/// for one to two of these: see `SharedTicketer`).
pub const TICKET_LIFETIME: u32 = 6 * 3600;

/// Why TLS could not be set up. Each says what to check.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read the TLS {what} file '{path}': {source} (check --tls-{what})")]
    Read {
        /// `cert` or `key`.
        what: &'static str,
        /// The path given.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A PEM file has no usable section of the kind needed, or a broken one.
    #[error("the TLS {what} file '{path}' {why}")]
    Pem {
        /// `cert` or `key`.
        what: &'static str,
        /// The path given (or `self-signed`).
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the certificate and key together.
    #[error(
        "the TLS certificate and key were refused: {0} (does the key belong to the certificate's first entry?)"
    )]
    Rejected(rustls::Error),
    /// The trial certificate could not be made.
    #[error("cannot make a self-signed certificate: {0}")]
    SelfSigned(String),
    /// No randomness for the session-ticket key.
    #[error("no system randomness for the session-ticket key")]
    Random,
}

/// A certificate chain and its private key in PEM, where they came from, and
/// the key that seals session tickets. Made once by the supervisor and sent
/// to every worker, so all workers present the same certificate and accept
/// each other's tickets (the kernel spreads a client's connections over
/// workers). Secrets never appear in `Debug` or in the start line.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Material {
    /// Where the certificate came from: its path, or `self-signed`.
    pub source: String,
    /// The certificate chain, leaf first, in PEM.
    pub cert_pem: String,
    key_pem: String,
    /// 32 bytes for ChaCha20-Poly1305, hex.
    ticket_key: String,
}

impl fmt::Debug for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Material")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Material {
    /// Reads and checks `--tls-cert` and `--tls-key`.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let read = |what: &'static str, p: &Path| {
            std::fs::read_to_string(p).map_err(|source| TlsError::Read {
                what,
                path: p.display().to_string(),
                source,
            })
        };
        let m = Self {
            source: cert.display().to_string(),
            cert_pem: read("cert", cert)?,
            key_pem: read("key", key)?,
            ticket_key: ticket_key()?,
        };
        m.check(&key.display().to_string())?;
        Ok(m)
    }

    /// A fresh ECDSA P-256 certificate for `localhost`, `127.0.0.1` and
    /// `::1`, for trials (`--tls-self-signed`). Clients must be told to trust
    /// it: the start line carries its PEM.
    pub fn self_signed() -> Result<Self, TlsError> {
        let names = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        let made = rcgen::generate_simple_self_signed(names)
            .map_err(|e| TlsError::SelfSigned(e.to_string()))?;
        let m = Self {
            source: "self-signed".to_owned(),
            cert_pem: made.cert.pem(),
            key_pem: made.signing_key.serialize_pem(),
            ticket_key: ticket_key()?,
        };
        m.check("self-signed")?;
        Ok(m)
    }

    /// Takes `old`'s ticket key, so the tickets given before a reload
    /// (SIGHUP) still resume on the new certificate.
    pub fn keep_ticket_key(&mut self, old: &Self) {
        self.ticket_key.clone_from(&old.ticket_key);
    }

    /// Parses both PEMs and lets rustls check that they fit together.
    fn check(&self, key_path: &str) -> Result<(), TlsError> {
        server_config(self).map(drop).map_err(|e| match e {
            TlsError::Pem {
                what: "key", why, ..
            } => TlsError::Pem {
                what: "key",
                path: key_path.to_owned(),
                why,
            },
            other => other,
        })
    }

    /// What the start line shows: the source, the (public) certificate and
    /// its fingerprint.
    pub fn public_json(&self) -> serde_json::Value {
        serde_json::json!({
            "source": self.source,
            "cert_pem": self.cert_pem,
            "sha256": self.fingerprint(),
            "key": self.key_algorithm(),
        })
    }

    /// The key's algorithm (`RSA`, `ECDSA`, `ED25519`), or `None` if
    /// unusable.
    pub fn key_algorithm(&self) -> Option<String> {
        let key = self.key().ok()?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key).ok()?;
        Some(format!("{:?}", signer.algorithm()))
    }

    /// SHA-256 of the leaf certificate, as `AB:CD:...` (what browsers and
    /// `openssl x509 -fingerprint -sha256` show), or empty if unparsable.
    pub fn fingerprint(&self) -> String {
        let Some(leaf) = self.certs().ok().and_then(|c| c.into_iter().next()) else {
            return String::new();
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, &leaf);
        let hex: Vec<String> = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
        hex.join(":")
    }

    fn certs(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let bad = |why: String| TlsError::Pem {
            what: "cert",
            path: self.source.clone(),
            why,
        };
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(format!("has a broken PEM section: {e}")))?;
        if certs.is_empty() {
            return Err(bad(
                "has no '-----BEGIN CERTIFICATE-----' section (is it the key, or DER?)".to_owned(),
            ));
        }
        Ok(certs)
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| TlsError::Pem {
            what: "key",
            path: self.source.clone(),
            why: format!(
                "has no usable private key ({e}); expected a PKCS#8, PKCS#1 (RSA) or SEC1 (EC) PEM key"
            ),
        })
    }
}

/// 32 random bytes, hex.
fn ticket_key() -> Result<String, TlsError> {
    let mut key = [0u8; 32];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| TlsError::Random)?;
    Ok(key.iter().map(|b| format!("{b:02x}")).collect())
}

/// The `ring` provider with the cipher suites reordered so that those on
/// SHA-256 come first (AES-128-GCM, then ChaCha20-Poly1305, then the
/// AES-256-GCM/SHA-384 ones), for the server to choose in that order.
///
/// Measured (docs/tls.md): ring computes SHA-384 with its generic code on
/// CPUs that are not Intel's (its AVX code is enabled for Intel only) but
/// SHA-256 with the SHA extensions, and a TLS 1.3 handshake runs its key
/// schedule through HKDF a dozen times; on the AMD EPYC here the SHA-384
/// suite spent 10% of the server's handshake CPU in SHA-512 blocks.
/// AES-128-GCM is the suite TLS 1.3 requires every client to have.
pub fn provider() -> rustls::crypto::CryptoProvider {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| {
        let common = match s {
            rustls::SupportedCipherSuite::Tls13(s) => &s.common,
            rustls::SupportedCipherSuite::Tls12(s) => &s.common,
        };
        common.hash_provider.algorithm() != rustls::crypto::hash::HashAlgorithm::SHA256
    });
    p
}

/// The rustls settings for one worker: TLS 1.2 and 1.3 on `ring` with the
/// suites of [`provider`] in the server's order, ALPN `http/1.1`, one
/// ticket per handshake sealed with the shared key, a session cache of
/// [`SESSION_CACHE`] entries.
pub fn server_config(m: &Material) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(provider());
    let certs = m.certs()?;
    let key = m.key()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Rejected)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::Rejected)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE);
    cfg.ticketer = Arc::new(SharedTicketer::new(&m.ticket_key)?);
    cfg.ignore_client_order = true;
    // One ticket, not rustls's default two: each costs a key derivation, a
    // seal and 180 bytes on every full handshake. A resumed handshake
    // gets a fresh one, so a client reconnecting one connection at a time
    // never runs out; tickets open any number of times (they are
    // stateless), so a client that opens several at once may reuse one.
    cfg.send_tls13_tickets = 1;
    Ok(Arc::new(cfg))
}

/// Seals session tickets with ChaCha20-Poly1305 keys that every worker of
/// this server derives alike (rustls's own ticketer makes a key per process,
/// so a client reconnecting to another worker would always get a full
/// handshake).
///
/// Keys roll: the key for period `n` (`n` = Unix time / [`TICKET_LIFETIME`])
/// is HKDF-SHA256 of the shared secret with `n`; a ticket opens with the
/// key of its own period only while that is the current or the previous
/// one, so no ticket is honoured after two lifetimes. The shared secret
/// itself lives as long as the server (a restart replaces it).
///
/// A ticket is: the low byte of its period, a random 96-bit nonce, the
/// sealed session state (the period byte is authenticated too).
struct SharedTicketer {
    secret: ring::hkdf::Prk,
    rng: SystemRandom,
    /// The key of the period last used for sealing.
    current: std::sync::Mutex<Option<(u64, LessSafeKey)>>,
}

impl fmt::Debug for SharedTicketer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedTicketer").finish_non_exhaustive()
    }
}

impl SharedTicketer {
    fn new(hex: &str) -> Result<Self, TlsError> {
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect();
        if bytes.len() != 32 {
            return Err(TlsError::Random);
        }
        Ok(Self {
            secret: ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"throng session tickets")
                .extract(&bytes),
            rng: SystemRandom::new(),
            current: std::sync::Mutex::new(None),
        })
    }

    fn period(unix_secs: u64) -> u64 {
        unix_secs / u64::from(TICKET_LIFETIME)
    }

    fn key(&self, period: u64) -> Option<LessSafeKey> {
        let period = period.to_be_bytes();
        let info: [&[u8]; 2] = [b"key", &period];
        let okm = self.secret.expand(&info, &aead::CHACHA20_POLY1305).ok()?;
        Some(LessSafeKey::new(UnboundKey::from(okm)))
    }

    fn seal_at(&self, unix_secs: u64, plain: &[u8]) -> Option<Vec<u8>> {
        let period = Self::period(unix_secs);
        let mut nonce = [0u8; aead::NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let tag_byte = [period as u8];
        let mut out = Vec::with_capacity(1 + nonce.len() + plain.len() + aead::MAX_TAG_LEN);
        out.extend_from_slice(&tag_byte);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let mut current = self.current.lock().ok()?;
        if current.as_ref().is_none_or(|(p, _)| *p != period) {
            *current = Some((period, self.key(period)?));
        }
        let (_, key) = current.as_ref()?;
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(tag_byte),
                &mut out[1 + aead::NONCE_LEN..],
            )
            .ok()?;
        out.extend_from_slice(tag.as_ref());
        Some(out)
    }

    fn open_at(&self, unix_secs: u64, cipher: &[u8]) -> Option<Vec<u8>> {
        let (&low, rest) = cipher.split_first()?;
        let (nonce, sealed) = rest.split_at_checked(aead::NONCE_LEN)?;
        let now = Self::period(unix_secs);
        let period = [now, now.checked_sub(1)?]
            .into_iter()
            .find(|p| *p as u8 == low)?;
        let key = self.key(period)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let n = key
            .open_in_place(nonce, aead::Aad::from([low]), &mut buf)
            .ok()?
            .len();
        buf.truncate(n);
        Some(buf)
    }
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ProducesTickets for SharedTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        TICKET_LIFETIME
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal_at(unix_secs(), plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.open_at(unix_secs(), cipher)
    }
}

/// Whether a connection ended cleanly while being pumped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pumped {
    /// Everything complete in the input was handled; more input is needed.
    NeedInput,
    /// The peer sent close_notify (or both sides did): no more data will come.
    Closed,
}

/// Runs `conn` over the received bytes `incoming`: decrypted application
/// data is appended to `plain`, records it must send (handshake messages,
/// tickets, a key update, alerts) to `out`. Returns how many bytes of
/// `incoming` were consumed and whether the peer closed.
///
/// The bytes not consumed must be passed again, first, on the next call
/// (and to [`seal`]): rustls remembers how far into them it has read (a
/// handshake message split over records stays there while it is joined)
/// and panics if handed a shorter buffer. After an error, the alert rustls
/// has for the client is in `out`, and the connection must not be used
/// again.
pub(crate) fn pump(
    conn: &mut UnbufferedServerConnection,
    incoming: &mut [u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(usize, Pumped), rustls::Error> {
    let mut start = 0;
    loop {
        let status = conn.process_tls_records(&mut incoming[start..]);
        let discard = status.discard;
        let mut done = None;
        let mut failed = None;
        match status.state {
            Err(e) => failed = Some(e),
            Ok(ConnectionState::ReadTraffic(mut r)) => {
                while let Some(rec) = r.next_record() {
                    match rec {
                        Ok(rec) => plain.extend_from_slice(rec.payload),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
            }
            Ok(ConnectionState::EncodeTlsData(mut e)) => encode(&mut e, out),
            Ok(ConnectionState::TransmitTlsData(t)) => t.done(),
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                done = Some(Pumped::Closed);
            }
            // WriteTraffic, BlockedHandshake, and early data (never enabled):
            // nothing more to do until more bytes arrive.
            Ok(_) => done = Some(Pumped::NeedInput),
        }
        if let Some(e) = failed {
            // The same bytes again: rustls's position in them still holds.
            alert(conn, &mut incoming[start..], out);
            return Err(e);
        }
        start += discard;
        if let Some(done) = done {
            return Ok((start, done));
        }
    }
}

/// Appends the record an `EncodeTlsData` state holds to `out`.
fn encode(
    e: &mut rustls::unbuffered::EncodeTlsData<'_, rustls::server::ServerConnectionData>,
    out: &mut Vec<u8>,
) {
    let len = out.len();
    out.resize(len + 1024, 0);
    loop {
        match e.encode(&mut out[len..]) {
            Ok(n) => {
                out.truncate(len + n);
                return;
            }
            Err(EncodeError::InsufficientSize(s)) => out.resize(len + s.required_size, 0),
            Err(EncodeError::AlreadyEncoded) => {
                out.truncate(len);
                return;
            }
        }
    }
}

/// Why application data could not be encrypted for a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SealError {
    /// The connection is closed, broken, or not in a state to send.
    Closed,
}

/// Encrypts `data` for `conn` and appends the records to `out` (after any
/// record the connection had pending). `incoming` is the connection's
/// unprocessed input, which must hold no complete record (pump first).
pub(crate) fn seal(
    conn: &mut UnbufferedServerConnection,
    incoming: &mut [u8],
    data: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), SealError> {
    // Room for the data and one record's overhead per 16 KiB.
    let room = data.len() + 64 * (1 + data.len() / 16_384);
    write_traffic(conn, incoming, out, room, |w, buf| w.encrypt(data, buf))
}

/// Appends a close_notify alert for `conn` to `out`: the last thing sent
/// on a connection that ends cleanly, so the client can tell the end from
/// a truncation.
pub(crate) fn close_notify(
    conn: &mut UnbufferedServerConnection,
    incoming: &mut [u8],
    out: &mut Vec<u8>,
) -> Result<(), SealError> {
    write_traffic(conn, incoming, out, 64, |w, buf| w.queue_close_notify(buf))
}

/// Brings `conn` to its `WriteTraffic` state (encoding whatever it has
/// pending into `out` first) and appends what `write` produces there.
fn write_traffic(
    conn: &mut UnbufferedServerConnection,
    incoming: &mut [u8],
    out: &mut Vec<u8>,
    room: usize,
    mut write: impl FnMut(
        &mut rustls::unbuffered::WriteTraffic<'_, rustls::server::ServerConnectionData>,
        &mut [u8],
    ) -> Result<usize, EncryptError>,
) -> Result<(), SealError> {
    loop {
        let status = conn.process_tls_records(incoming);
        if status.discard != 0 {
            return Err(SealError::Closed);
        }
        match status.state.map_err(|_| SealError::Closed)? {
            ConnectionState::WriteTraffic(mut w) => {
                let len = out.len();
                out.resize(len + room, 0);
                loop {
                    match write(&mut w, &mut out[len..]) {
                        Ok(n) => {
                            out.truncate(len + n);
                            return Ok(());
                        }
                        Err(EncryptError::InsufficientSize(s)) => {
                            out.resize(len + s.required_size, 0);
                        }
                        Err(_) => {
                            out.truncate(len);
                            return Err(SealError::Closed);
                        }
                    }
                }
            }
            ConnectionState::EncodeTlsData(mut e) => encode(&mut e, out),
            ConnectionState::TransmitTlsData(t) => t.done(),
            // Reported once; sending is still allowed after it.
            ConnectionState::PeerClosed => {}
            _ => return Err(SealError::Closed),
        }
    }
}

/// After a protocol error rustls may have an alert ready: append it to
/// `out` so the client learns why. `incoming` is what the failing call had.
fn alert(conn: &mut UnbufferedServerConnection, incoming: &mut [u8], out: &mut Vec<u8>) {
    let status = conn.process_tls_records(incoming);
    if let Ok(ConnectionState::EncodeTlsData(mut e)) = status.state {
        encode(&mut e, out);
    }
}

/// The `throng_tls_handshakes_total` label for a completed handshake:
/// version and whether it resumed a session.
pub(crate) fn handshake_label(conn: &UnbufferedServerConnection) -> &'static str {
    let resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    match (conn.protocol_version(), resumed) {
        (Some(rustls::ProtocolVersion::TLSv1_2), false) => "tls1.2_full",
        (Some(rustls::ProtocolVersion::TLSv1_2), true) => "tls1.2_resumed",
        (_, false) => "tls1.3_full",
        (_, true) => "tls1.3_resumed",
    }
}

/// The `throng_handshake_failures_total` reason for a rustls error.
pub(crate) fn failure_label(e: &rustls::Error) -> &'static str {
    match e {
        rustls::Error::AlertReceived(_) => "tls_peer_alert",
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "tls_bad_message"
        }
        rustls::Error::PeerIncompatible(_) => "tls_incompatible",
        _ => "tls_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_round_trip_and_refuse_tampering() {
        let t = SharedTicketer::new(&ticket_key().unwrap()).unwrap();
        let sealed = t.encrypt(b"session state").unwrap();
        assert_eq!(t.decrypt(&sealed).unwrap(), b"session state");
        let mut bad = sealed.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(t.decrypt(&bad).is_none());
        assert!(t.decrypt(&sealed[..5]).is_none());
        let other = SharedTicketer::new(&ticket_key().unwrap()).unwrap();
        assert!(other.decrypt(&sealed).is_none());
    }

    #[test]
    fn tickets_open_for_two_lifetimes_at_most() {
        let hex = ticket_key().unwrap();
        let t = SharedTicketer::new(&hex).unwrap();
        let life = u64::from(TICKET_LIFETIME);
        let start = 1_000 * life + 10;
        let sealed = t.seal_at(start, b"state").unwrap();
        assert_eq!(t.open_at(start + life - 11, &sealed).unwrap(), b"state");
        assert_eq!(t.open_at(start + life, &sealed).unwrap(), b"state");
        assert!(t.open_at(start + 2 * life, &sealed).is_none());
        // A ticket from the future (a clock set back) is refused too.
        assert!(t.open_at(start - life, &sealed).is_none());
        // Another worker of the same server opens it.
        let same = SharedTicketer::new(&hex).unwrap();
        assert_eq!(same.open_at(start, &sealed).unwrap(), b"state");
    }

    #[test]
    fn material_self_signed_builds_and_hides_secrets() {
        let m = Material::self_signed().unwrap();
        assert!(server_config(&m).is_ok());
        let shown = format!("{m:?}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
        assert!(!m.public_json().to_string().contains("PRIVATE"));
        assert_eq!(m.fingerprint().split(':').count(), 32);
    }

    /// A rustls client that trusts `m`'s certificate.
    fn client(m: &Material) -> rustls::ClientConnection {
        let mut roots = rustls::RootCertStore::empty();
        for c in m.certs().unwrap() {
            roots.add(c).unwrap();
        }
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        rustls::ClientConnection::new(Arc::new(cfg), name).unwrap()
    }

    /// Feeds `wire` to the server `split` bytes at a time, as a socket
    /// might deliver it, keeping what `pump` leaves unconsumed.
    fn feed(
        s: &mut UnbufferedServerConnection,
        pending: &mut Vec<u8>,
        wire: &[u8],
        split: usize,
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Pumped {
        let mut state = Pumped::NeedInput;
        for chunk in wire.chunks(split) {
            pending.extend_from_slice(chunk);
            let (used, st) = pump(s, pending, plain, out).unwrap();
            pending.drain(..used);
            state = st;
        }
        state
    }

    /// Runs the handshake between `s` and `c` in memory.
    fn handshake(s: &mut UnbufferedServerConnection, c: &mut rustls::ClientConnection) {
        let (mut pending, mut plain, mut out) = (Vec::new(), Vec::new(), Vec::new());
        while c.is_handshaking() || s.is_handshaking() {
            let mut wire = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            feed(s, &mut pending, &wire, 4096, &mut plain, &mut out);
            let mut rd = &out[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).unwrap();
                c.process_new_packets().unwrap();
            }
            out.clear();
        }
    }

    #[test]
    fn the_server_picks_a_sha256_suite_over_the_clients_first_choice() {
        let m = Material::self_signed().unwrap();
        let mut s = UnbufferedServerConnection::new(server_config(&m).unwrap()).unwrap();
        // rustls's client lists TLS13_AES_256_GCM_SHA384 first.
        let mut c = client(&m);
        handshake(&mut s, &mut c);
        assert_eq!(
            c.negotiated_cipher_suite().unwrap().suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        );
        let suites = provider().cipher_suites;
        assert_eq!(
            suites.len(),
            rustls::crypto::ring::default_provider().cipher_suites.len()
        );
        let names: Vec<String> = suites.iter().map(|s| format!("{:?}", s.suite())).collect();
        let first_sha384 = names.iter().position(|n| n.ends_with("SHA384")).unwrap();
        assert!(
            names[first_sha384..].iter().all(|n| n.ends_with("SHA384")),
            "{names:?}"
        );
    }

    #[test]
    fn pump_and_seal_carry_a_session_over_split_records() {
        let m = Material::self_signed().unwrap();
        let mut s = UnbufferedServerConnection::new(server_config(&m).unwrap()).unwrap();
        let mut c = client(&m);
        let (mut pending, mut plain, mut out) = (Vec::new(), Vec::new(), Vec::new());
        while c.is_handshaking() || s.is_handshaking() {
            let mut wire = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            // Seven bytes at a time: every record arrives split.
            feed(&mut s, &mut pending, &wire, 7, &mut plain, &mut out);
            let mut rd = &out[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).unwrap();
                c.process_new_packets().unwrap();
            }
            out.clear();
        }
        // Client to server, split.
        std::io::Write::write_all(&mut c.writer(), b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut wire = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut wire).unwrap();
        }
        feed(&mut s, &mut pending, &wire, 3, &mut plain, &mut out);
        assert!(pending.is_empty());
        assert_eq!(plain, b"GET / HTTP/1.1\r\n\r\n");
        // Server to client: a frame bigger than one record.
        let big: Vec<u8> = (0..40_000).map(|i| (i % 251) as u8).collect();
        seal(&mut s, &mut [], &big, &mut out).unwrap();
        let mut rd = &out[..];
        let mut got = Vec::new();
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
            c.process_new_packets().unwrap();
            let mut chunk = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut c.reader(), &mut chunk) {
                got.extend_from_slice(&chunk[..n]);
            }
        }
        assert_eq!(got, big);
        // The client's close_notify ends the session; ours answers it.
        c.send_close_notify();
        let mut wire = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut wire).unwrap();
        }
        out.clear();
        let state = feed(&mut s, &mut pending, &wire, 5, &mut plain, &mut out);
        assert_eq!(state, Pumped::Closed);
        close_notify(&mut s, &mut [], &mut out).unwrap();
        assert!(!out.is_empty());
    }

    #[test]
    fn garbage_is_an_error_with_an_alert_for_the_client() {
        let m = Material::self_signed().unwrap();
        let mut s = UnbufferedServerConnection::new(server_config(&m).unwrap()).unwrap();
        let (mut plain, mut out) = (Vec::new(), Vec::new());
        // A ClientHello record whose body is nonsense.
        let mut junk = *b"\x16\x03\x01\x00\x08\x01\x00\x00\x04\xde\xad\xbe\xef";
        let e = pump(&mut s, &mut junk, &mut plain, &mut out).unwrap_err();
        assert_eq!(failure_label(&e), "tls_bad_message");
        assert_eq!(out.first(), Some(&0x15), "an alert record");
        // A handshake header announcing megabytes: an error, and (the
        // regression) no panic while looking for the alert with the bytes
        // rustls had already read.
        let mut s = UnbufferedServerConnection::new(server_config(&m).unwrap()).unwrap();
        let mut junk = *b"\x16\x03\x01\x00\x05hello";
        assert!(pump(&mut s, &mut junk, &mut plain, &mut out).is_err());
    }

    #[test]
    fn random_bytes_in_random_splits_never_panic() {
        let m = Material::self_signed().unwrap();
        let cfg = server_config(&m).unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..2000 {
            let mut s = UnbufferedServerConnection::new(cfg.clone()).unwrap();
            // Mostly TLS-shaped: a record header of any type and length.
            let len = rng.usize(0..300);
            let mut wire = vec![rng.u8(20..=24), 3, rng.u8(0..=4)];
            wire.extend_from_slice(&(len as u16).to_be_bytes());
            wire.extend((0..rng.usize(0..len + 20)).map(|_| rng.u8(..)));
            let (mut pending, mut plain, mut out) = (Vec::new(), Vec::new(), Vec::new());
            for chunk in wire.chunks(rng.usize(1..40)) {
                pending.extend_from_slice(chunk);
                match pump(&mut s, &mut pending, &mut plain, &mut out) {
                    Ok((used, _)) => drop(pending.drain(..used)),
                    Err(_) => break,
                }
            }
        }
    }

    #[test]
    fn bad_pem_is_a_clear_error() {
        let mut m = Material::self_signed().unwrap();
        m.cert_pem = "not a certificate".to_owned();
        let e = server_config(&m).unwrap_err().to_string();
        assert!(e.contains("BEGIN CERTIFICATE"), "{e}");
        let mut m = Material::self_signed().unwrap();
        m.key_pem = String::new();
        assert!(
            server_config(&m)
                .unwrap_err()
                .to_string()
                .contains("private key")
        );
        // A key that is not the certificate's.
        let mut m = Material::self_signed().unwrap();
        m.key_pem = Material::self_signed().unwrap().key_pem;
        let e = server_config(&m).unwrap_err().to_string();
        assert!(e.contains("refused"), "{e}");
    }
}
