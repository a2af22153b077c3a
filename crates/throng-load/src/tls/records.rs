//! The record layer of an established TLS connection, once rustls has
//! handed over its traffic keys (the API rustls offers for kernel TLS).
//!
//! Why: rustls keeps its whole connection state for as long as the
//! connection lives (about 4 KB of heap per idle connection against
//! HAProxy: the ~1 KB connection struct, both directions' record keys, the
//! TLS 1.3 key schedule, the server's certificates, queues). A held
//! subscriber needs only its two AEAD keys, their IVs and sequence numbers.
//! So after the WebSocket upgrade the connection leaves rustls, and
//! [`Records`] keeps just the two ring keys (measured: 3.4 KB per idle
//! connection with rustls's `KernelConnection` kept beside them, for key
//! updates; ~1.2 KB without it).
//!
//! Only what a client of an established connection needs is here: TLS 1.3
//! records (RFC 8446 §5.2: nonce = IV xor sequence number, the record header
//! as additional data, the real content type inside), and TLS 1.2 AES-GCM
//! (RFC 5288: an explicit 8-byte nonce in each record) and ChaCha20-Poly1305
//! (RFC 7905) records, with TLS 1.2's additional data (sequence number, type,
//! version, length). Handshake messages after the handshake: a TLS 1.3
//! NewSessionTicket arriving this late is ignored (tickets from HAProxy and
//! OpenSSL come with the handshake, before the upgrade's answer, and rustls
//! files them); a KeyUpdate ends the connection with an error that says so
//! (following it would need the traffic secrets rustls keeps, the memory
//! this module exists to save); anything else is an error.

use std::fmt;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;

use super::{Phase, TlsError, after_pending};

const HEADER: usize = 5;
const TAG: usize = 16;
const EXPLICIT_NONCE: usize = 8;
/// The largest plaintext in one record.
const MAX_FRAGMENT: usize = 16 * 1024;
/// The largest record body accepted (TLS 1.3's limit; TLS 1.2's is larger
/// only with compression, which nobody negotiates).
const MAX_BODY: usize = MAX_FRAGMENT + 256;

const APPLICATION_DATA: u8 = 23;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const CHANGE_CIPHER_SPEC: u8 = 20;

const NEW_SESSION_TICKET: u8 = 4;
/// Not followed: see the module doc.
const KEY_UPDATE: u8 = 24;

fn err(why: &str) -> TlsError {
    TlsError::Tls(rustls::Error::General(why.to_owned()))
}

/// Which record format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Tls13,
    /// TLS 1.2 AES-GCM: salt || explicit nonce.
    Tls12Gcm,
    /// TLS 1.2 ChaCha20-Poly1305: IV xor sequence number.
    Tls12Chacha,
}

/// One direction: its key, IV and the next record's sequence number.
struct Direction {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl Direction {
    fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> Result<Self, TlsError> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(err("a cipher suite this client cannot take over")),
        };
        let key = UnboundKey::new(alg, key.as_ref())
            .map_err(|_| err("a traffic key of the wrong length"))?;
        let iv: [u8; 12] = iv
            .as_ref()
            .try_into()
            .map_err(|_| err("a traffic IV of the wrong length"))?;
        Ok(Self {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// IV xor sequence number (TLS 1.3, TLS 1.2 ChaCha, and TLS 1.2 GCM's
    /// sending side, whose explicit nonce is then the last 8 bytes).
    fn nonce(&self) -> [u8; 12] {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        n
    }

    fn next(&mut self) -> Result<(), TlsError> {
        self.seq = self
            .seq
            .checked_add(1)
            .ok_or_else(|| err("record sequence number exhausted"))?;
        Ok(())
    }
}

/// TLS 1.2 additional data: sequence number, type, version, plaintext length.
fn aad12(seq: u64, typ: u8, len: usize) -> [u8; 13] {
    let mut a = [0u8; 13];
    a[..8].copy_from_slice(&seq.to_be_bytes());
    a[8] = typ;
    a[9] = 3;
    a[10] = 3;
    // Invariant: callers pass len <= MAX_BODY, which fits in a u16.
    a[11..].copy_from_slice(&(len as u16).to_be_bytes());
    a
}

/// An established TLS connection outside rustls: keys, sequence numbers,
/// and the bytes of a record that arrived split.
pub struct Records {
    format: Format,
    rx: Direction,
    tx: Direction,
    /// The start of a record not yet whole (empty, no allocation, otherwise).
    pub pending: Vec<u8>,
    /// A handshake message split across records (TLS 1.3 allows it; rare).
    handshake: Vec<u8>,
}

impl fmt::Debug for Records {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Records")
            .field("format", &self.format)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl Records {
    /// Takes over from rustls.
    pub(super) fn new(
        secrets: rustls::ExtractedSecrets,
        tls13: bool,
        pending: Vec<u8>,
    ) -> Result<Self, TlsError> {
        let chacha = matches!(
            secrets.rx.1,
            ConnectionTrafficSecrets::Chacha20Poly1305 { .. }
        );
        let format = match (tls13, chacha) {
            (true, _) => Format::Tls13,
            (false, true) => Format::Tls12Chacha,
            (false, false) => Format::Tls12Gcm,
        };
        Ok(Self {
            format,
            rx: Direction::new(secrets.rx.0, secrets.rx.1)?,
            tx: Direction::new(secrets.tx.0, secrets.tx.1)?,
            pending,
            handshake: Vec::new(),
        })
    }

    /// Decrypts the records in `incoming` (after any pending partial one),
    /// appending application data to `plain`.
    pub fn receive(&mut self, incoming: &mut [u8], plain: &mut Vec<u8>) -> Result<Phase, TlsError> {
        let mut pending = std::mem::take(&mut self.pending);
        let phase = after_pending(&mut pending, incoming, |buf| self.open_all(buf, plain));
        self.pending = pending;
        phase
    }

    fn open_all(
        &mut self,
        buf: &mut [u8],
        plain: &mut Vec<u8>,
    ) -> Result<(usize, Phase), TlsError> {
        let mut off = 0;
        while buf.len() - off >= HEADER {
            let rec = &mut buf[off..];
            let typ = rec[0];
            let len = usize::from(u16::from_be_bytes([rec[3], rec[4]]));
            if len > MAX_BODY + EXPLICIT_NONCE {
                return Err(TlsError::Tls(rustls::Error::PeerSentOversizedRecord));
            }
            if rec.len() < HEADER + len {
                break;
            }
            off += HEADER + len;
            let (head, body) = rec[..HEADER + len].split_at_mut(HEADER);
            if typ == CHANGE_CIPHER_SPEC && self.format == Format::Tls13 {
                // TLS 1.3 middlebox compatibility: never protected, ignored.
                continue;
            }
            let (inner, content) = self.open(head, body)?;
            match inner {
                APPLICATION_DATA => plain.extend_from_slice(content),
                ALERT => {
                    return match content {
                        [_, 0] => Ok((off, Phase::PeerClosed)),
                        [_, d] => Err(TlsError::Tls(rustls::Error::AlertReceived(
                            rustls::AlertDescription::from(*d),
                        ))),
                        _ => Err(err("a malformed alert")),
                    };
                }
                HANDSHAKE => self.handshake_messages(content)?,
                _ => return Err(err("an unexpected record type after the handshake")),
            }
        }
        Ok((off, Phase::Open))
    }

    /// Decrypts one record in place: its inner content type and content.
    fn open<'a>(&mut self, head: &[u8], body: &'a mut [u8]) -> Result<(u8, &'a [u8]), TlsError> {
        let bad = || TlsError::Tls(rustls::Error::DecryptError);
        let opened = match self.format {
            Format::Tls13 => {
                let nonce = Nonce::assume_unique_for_key(self.rx.nonce());
                self.rx
                    .key
                    .open_in_place(nonce, Aad::from(head), body)
                    .map_err(|_| bad())?
            }
            Format::Tls12Chacha => {
                let len = body.len().checked_sub(TAG).ok_or_else(bad)?;
                let aad = aad12(self.rx.seq, head[0], len);
                let nonce = Nonce::assume_unique_for_key(self.rx.nonce());
                self.rx
                    .key
                    .open_in_place(nonce, Aad::from(aad), body)
                    .map_err(|_| bad())?
            }
            Format::Tls12Gcm => {
                let len = body
                    .len()
                    .checked_sub(EXPLICIT_NONCE + TAG)
                    .ok_or_else(bad)?;
                let mut n = [0u8; 12];
                n[..4].copy_from_slice(&self.rx.iv[..4]);
                n[4..].copy_from_slice(&body[..EXPLICIT_NONCE]);
                let aad = aad12(self.rx.seq, head[0], len);
                self.rx
                    .key
                    .open_in_place(
                        Nonce::assume_unique_for_key(n),
                        Aad::from(aad),
                        &mut body[EXPLICIT_NONCE..],
                    )
                    .map_err(|_| bad())?
            }
        };
        self.rx.next()?;
        if self.format != Format::Tls13 {
            return Ok((head[0], opened));
        }
        // TLS 1.3: content, then the real type, then zero padding.
        let end = opened
            .iter()
            .rposition(|&b| b != 0)
            .ok_or_else(|| err("a record with no content type"))?;
        if end > MAX_FRAGMENT {
            return Err(TlsError::Tls(rustls::Error::PeerSentOversizedRecord));
        }
        Ok((opened[end], &opened[..end]))
    }

    /// Handshake messages after the handshake (TLS 1.3 only).
    fn handshake_messages(&mut self, content: &[u8]) -> Result<(), TlsError> {
        if self.format != Format::Tls13 {
            return Err(err(
                "a handshake message after a TLS 1.2 handshake (renegotiation is not supported)",
            ));
        }
        self.handshake.extend_from_slice(content);
        let mut off = 0;
        while self.handshake.len() - off >= 4 {
            let m = &self.handshake[off..];
            let len = usize::from(m[1]) << 16 | usize::from(m[2]) << 8 | usize::from(m[3]);
            if len > 64 * 1024 {
                return Err(err("a handshake message over 64 KiB after the handshake"));
            }
            if m.len() < 4 + len {
                break;
            }
            match m[0] {
                NEW_SESSION_TICKET => {}
                KEY_UPDATE => {
                    return Err(err(
                        "the server sent a KeyUpdate; held connections do not follow key updates",
                    ));
                }
                _ => return Err(err("an unexpected handshake message after the handshake")),
            }
            off += 4 + len;
        }
        self.handshake.drain(..off);
        if self.handshake.is_empty() {
            self.handshake = Vec::new();
        }
        Ok(())
    }

    /// Encrypts `data` (application data) into `out`.
    pub fn send(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), TlsError> {
        for chunk in data.chunks(MAX_FRAGMENT) {
            seal(self.format, &mut self.tx, APPLICATION_DATA, chunk, out)?;
        }
        Ok(())
    }

    /// Encodes a close_notify alert into `out`.
    pub fn close_notify(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        seal(self.format, &mut self.tx, ALERT, &[1, 0], out)
    }
}

/// Appends one protected record of type `typ` carrying `data` to `out`.
/// Invariant: `data` is at most [`MAX_FRAGMENT`] bytes (callers split), so
/// every record length below fits in a `u16`.
fn seal(
    format: Format,
    tx: &mut Direction,
    typ: u8,
    data: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), TlsError> {
    let fail = || err("encryption failed");
    let start = out.len();
    let nonce = tx.nonce();
    match format {
        Format::Tls13 => {
            let len = data.len() + 1 + TAG;
            out.extend_from_slice(&[APPLICATION_DATA, 3, 3]);
            out.extend_from_slice(&(len as u16).to_be_bytes());
            out.extend_from_slice(data);
            out.push(typ);
            let (head, body) = out[start..].split_at_mut(HEADER);
            let tag = tx
                .key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(&*head),
                    body,
                )
                .map_err(|_| fail())?;
            out.extend_from_slice(tag.as_ref());
        }
        Format::Tls12Gcm | Format::Tls12Chacha => {
            let explicit = if format == Format::Tls12Gcm {
                EXPLICIT_NONCE
            } else {
                0
            };
            let len = explicit + data.len() + TAG;
            out.extend_from_slice(&[typ, 3, 3]);
            out.extend_from_slice(&(len as u16).to_be_bytes());
            out.extend_from_slice(&nonce[12 - explicit..]);
            out.extend_from_slice(data);
            let aad = aad12(tx.seq, typ, data.len());
            let body = &mut out[start + HEADER + explicit..];
            let tag = tx
                .key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(aad),
                    body,
                )
                .map_err(|_| fail())?;
            out.extend_from_slice(tag.as_ref());
        }
    }
    tx.next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(format: Format, alg: &'static aead::Algorithm) -> (Direction, Direction) {
        let key = [7u8; 32];
        let key = &key[..alg.key_len()];
        let iv = [9u8; 12];
        let d = || Direction {
            key: LessSafeKey::new(UnboundKey::new(alg, key).unwrap()),
            iv,
            seq: 5,
        };
        let _ = format;
        (d(), d())
    }

    fn records(format: Format, alg: &'static aead::Algorithm) -> (Records, Direction) {
        let (rx, tx) = pair(format, alg);
        let (_, peer) = pair(format, alg);
        (
            Records {
                format,
                rx,
                tx,
                pending: Vec::new(),
                handshake: Vec::new(),
            },
            peer,
        )
    }

    /// What this side seals, the same keys open; split anywhere, records
    /// are reassembled; a flipped bit is a decrypt error.
    #[test]
    fn round_trips_every_format_split_anywhere() {
        for (format, alg) in [
            (Format::Tls13, &aead::AES_256_GCM),
            (Format::Tls13, &aead::CHACHA20_POLY1305),
            (Format::Tls12Gcm, &aead::AES_128_GCM),
            (Format::Tls12Chacha, &aead::CHACHA20_POLY1305),
        ] {
            let (mut me, mut peer) = records(format, alg);
            let mut wire = Vec::new();
            seal(format, &mut peer, APPLICATION_DATA, b"hello", &mut wire).unwrap();
            seal(format, &mut peer, APPLICATION_DATA, &[0xab; 300], &mut wire).unwrap();
            seal(format, &mut peer, ALERT, &[1, 0], &mut wire).unwrap();
            for split in 0..wire.len() {
                let (mut me2, _) = records(format, alg);
                let mut plain = Vec::new();
                let mut a = wire[..split].to_vec();
                let mut b = wire[split..].to_vec();
                let p1 = me2.receive(&mut a, &mut plain).unwrap();
                let p2 = if p1 == Phase::PeerClosed {
                    p1
                } else {
                    me2.receive(&mut b, &mut plain).unwrap()
                };
                assert_eq!(p2, Phase::PeerClosed, "{format:?} split {split}");
                assert_eq!(plain.len(), 305, "{format:?} split {split}");
                assert!(me2.pending.is_empty());
            }
            let mut bad = wire.clone();
            bad[HEADER + 2] ^= 1;
            let mut plain = Vec::new();
            assert!(me.receive(&mut bad, &mut plain).is_err(), "{format:?}");
        }
    }

    /// A late session ticket is skipped; a KeyUpdate ends the connection.
    #[test]
    fn late_tickets_are_ignored_and_key_updates_refused() {
        let (mut me, mut peer) = records(Format::Tls13, &aead::AES_128_GCM);
        let mut wire = Vec::new();
        // A ticket split over two records, then data.
        let ticket = [NEW_SESSION_TICKET, 0, 0, 3, 1, 2, 3];
        seal(Format::Tls13, &mut peer, HANDSHAKE, &ticket[..5], &mut wire).unwrap();
        seal(Format::Tls13, &mut peer, HANDSHAKE, &ticket[5..], &mut wire).unwrap();
        seal(
            Format::Tls13,
            &mut peer,
            APPLICATION_DATA,
            b"after",
            &mut wire,
        )
        .unwrap();
        let mut plain = Vec::new();
        assert_eq!(me.receive(&mut wire, &mut plain).unwrap(), Phase::Open);
        assert_eq!(plain, b"after");
        let mut wire = Vec::new();
        seal(
            Format::Tls13,
            &mut peer,
            HANDSHAKE,
            &[KEY_UPDATE, 0, 0, 1, 0],
            &mut wire,
        )
        .unwrap();
        let e = me.receive(&mut wire, &mut plain).unwrap_err();
        assert!(e.to_string().contains("KeyUpdate"), "{e}");
    }

    #[test]
    fn oversized_and_unexpected_records_are_errors() {
        let (mut me, _) = records(Format::Tls13, &aead::AES_128_GCM);
        let mut rec = vec![APPLICATION_DATA, 3, 3, 0xff, 0xff];
        assert!(matches!(
            me.receive(&mut rec, &mut Vec::new()),
            Err(TlsError::Tls(rustls::Error::PeerSentOversizedRecord))
        ));
        let (mut me, mut peer) = records(Format::Tls12Gcm, &aead::AES_128_GCM);
        let mut wire = Vec::new();
        seal(
            Format::Tls12Gcm,
            &mut peer,
            HANDSHAKE,
            &[0, 0, 0, 0],
            &mut wire,
        )
        .unwrap();
        assert!(me.receive(&mut wire, &mut Vec::new()).is_err());
    }
}
