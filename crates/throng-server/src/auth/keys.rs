//! The keys tokens are checked with, read once by the supervisor from the
//! files named on the command line and sent to every worker: an HS256
//! secret, or a public key in PEM whose type decides its one algorithm
//! (RSA: RS256, EC P-256: ES256, EC P-384: ES384, Ed25519: EdDSA).
//!
//! A public key arrives as a PEM `PUBLIC KEY` (SubjectPublicKeyInfo, what
//! `openssl pkey -pubout` writes). Its algorithm identifier says the type;
//! the key itself goes to the workers in the form `ring` verifies with, so
//! they parse nothing. This module reads structure only (a few DER
//! headers); every signature is checked by `jsonwebtoken` on `ring`.

use std::fmt;
use std::path::Path;

use rustls_pki_types::pem::{self, SectionKind};
use serde::{Deserialize, Serialize};

/// An HS256 secret shorter than this is refused: RFC 7518 section 3.2 asks
/// for a key at least as long as the hash (32 bytes).
pub const MIN_SECRET: usize = 32;

/// The one algorithm a key verifies. A token naming another is refused, so
/// a public key can never be used as an HMAC secret (HS/RS confusion).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KeyAlg {
    /// HMAC with SHA-256 and a shared secret.
    HS256,
    /// RSASSA-PKCS1-v1_5 with SHA-256, RSA key of 2048 bits or more.
    RS256,
    /// ECDSA on P-256 with SHA-256.
    ES256,
    /// ECDSA on P-384 with SHA-384.
    ES384,
    /// Ed25519.
    EdDSA,
}

impl KeyAlg {
    /// The `alg` header value of tokens this key verifies.
    pub fn name(self) -> &'static str {
        match self {
            Self::HS256 => "HS256",
            Self::RS256 => "RS256",
            Self::ES256 => "ES256",
            Self::ES384 => "ES384",
            Self::EdDSA => "EdDSA",
        }
    }

    /// The algorithm a token's `alg` header names, if it is one of ours.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::HS256,
            Self::RS256,
            Self::ES256,
            Self::ES384,
            Self::EdDSA,
        ]
        .into_iter()
        .find(|a| a.name() == name)
    }
}

/// One verification key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// The `kid` tokens name it by (`KID=FILE` on the command line).
    pub kid: Option<String>,
    /// Its one algorithm.
    pub alg: KeyAlg,
    /// The file it was read from.
    pub source: String,
    /// HS256: the secret. RS256: the RSAPublicKey (PKCS#1) DER. ES256 and
    /// ES384: the uncompressed curve point. EdDSA: the 32-byte key.
    material: Vec<u8>,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Why a key file was refused at start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// An HS256 secret under [`MIN_SECRET`] bytes.
    // The fix names a new file and refuses to overwrite one (`set -C`):
    // the file given may be anything (`/etc/hostname`), never to be replaced.
    #[error(
        "{path}: an HS256 secret must be at least 32 bytes (it has {len}); make a new one \
         with: (set -C; umask 077; head -c 32 /dev/urandom | base64 > throng-hs256.key) and \
         give --auth-hs256-secret-file throng-hs256.key (this writes no existing file)"
    )]
    ShortSecret {
        /// The file.
        path: String,
        /// Its length without the trailing newline.
        len: usize,
    },
    /// Not a public key this server can use, and what to do instead.
    #[error("{path}: {why}")]
    Unusable {
        /// The file.
        path: String,
        /// What is wrong and how to fix it.
        why: String,
    },
    /// `KID=` with nothing before the `=`.
    #[error("'{0}': the key id before '=' is empty (write KID=FILE, or just FILE)")]
    EmptyKid(String),
}

/// Splits `KID=FILE` (a kid is any text without `/` before the first `=`);
/// anything else is a file name with no kid.
pub fn split_kid(spec: &str) -> Result<(Option<String>, &str), KeyError> {
    match spec.split_once('=') {
        Some(("", _)) => Err(KeyError::EmptyKid(spec.to_owned())),
        Some((kid, file)) if !kid.contains('/') => Ok((Some(kid.to_owned()), file)),
        _ => Ok((None, spec)),
    }
}

impl Key {
    /// Reads an HS256 secret from `[KID=]FILE`: the file's bytes, less one
    /// trailing line ending (what `echo` or an editor adds).
    pub fn hs256_secret_file(spec: &str) -> Result<Self, KeyError> {
        let (kid, path) = split_kid(spec)?;
        let secret = read_secret(path)?;
        if secret.len() < MIN_SECRET {
            return Err(KeyError::ShortSecret {
                path: path.to_owned(),
                len: secret.len(),
            });
        }
        Ok(Self {
            kid,
            alg: KeyAlg::HS256,
            source: path.to_owned(),
            material: secret,
        })
    }

    /// Reads a PEM public key from `[KID=]FILE`; its type decides its algorithm.
    pub fn public_key_file(spec: &str) -> Result<Self, KeyError> {
        let (kid, path) = split_kid(spec)?;
        let unusable = |why: String| KeyError::Unusable {
            path: path.to_owned(),
            why,
        };
        let text = read(path)?;
        let mut reader = &text[..];
        let mut seen = Vec::new();
        let spki = loop {
            match pem::from_buf(&mut reader) {
                Ok(Some((SectionKind::PublicKey, der))) => break der,
                Ok(Some((kind, _))) => seen.push(kind),
                Ok(None) => return Err(unusable(not_a_public_key(&seen))),
                Err(e) => return Err(unusable(format!("not PEM: {e}"))),
            }
        };
        let (alg, material) = parse_spki(&spki).map_err(|why| unusable(why.to_owned()))?;
        Ok(Self {
            kid,
            alg,
            source: path.to_owned(),
            material,
        })
    }

    /// A key read elsewhere (a JSON Web Key Set, `jwks`), already in the
    /// form [`Key::decoding_key`] takes for `alg`.
    pub(crate) fn from_parts(
        kid: Option<String>,
        alg: KeyAlg,
        source: String,
        material: Vec<u8>,
    ) -> Self {
        Self {
            kid,
            alg,
            source,
            material,
        }
    }

    #[cfg(test)]
    pub(crate) fn material_for_tests(&self) -> &[u8] {
        &self.material
    }

    /// The key as `jsonwebtoken` verifies with it.
    pub(crate) fn decoding_key(&self) -> jsonwebtoken::DecodingKey {
        use jsonwebtoken::DecodingKey;
        match self.alg {
            KeyAlg::HS256 => DecodingKey::from_secret(&self.material),
            KeyAlg::RS256 => DecodingKey::from_rsa_der(&self.material),
            KeyAlg::ES256 | KeyAlg::ES384 => DecodingKey::from_ec_der(&self.material),
            KeyAlg::EdDSA => DecodingKey::from_ed_der(&self.material),
        }
    }

    /// How the start lines show it: algorithm, file and kid, never the key.
    pub fn describe(&self) -> String {
        match &self.kid {
            Some(kid) => format!("{} ({}, kid {kid:?})", self.alg.name(), self.source),
            None => format!("{} ({})", self.alg.name(), self.source),
        }
    }
}

/// A secret file's bytes, less one trailing line ending (what `echo` or an
/// editor adds).
pub(crate) fn read_secret(path: &str) -> Result<Vec<u8>, KeyError> {
    let mut secret = read(path)?;
    if secret.last() == Some(&b'\n') {
        secret.pop();
        if secret.last() == Some(&b'\r') {
            secret.pop();
        }
    }
    Ok(secret)
}

fn read(path: &str) -> Result<Vec<u8>, KeyError> {
    std::fs::read(Path::new(path)).map_err(|source| KeyError::Read {
        path: path.to_owned(),
        source,
    })
}

/// What to say about a PEM file that holds no `PUBLIC KEY`.
fn not_a_public_key(seen: &[SectionKind]) -> String {
    if seen.iter().any(|k| {
        matches!(
            k,
            SectionKind::PrivateKey | SectionKind::RsaPrivateKey | SectionKind::EcPrivateKey
        )
    }) {
        return "this is a private key; give the server only the public key \
                (openssl pkey -in KEY -pubout -out KEY.pub)"
            .to_owned();
    }
    if seen.contains(&SectionKind::Certificate) {
        return "this is a certificate; give its public key \
                (openssl x509 -in CERT -pubkey -noout > KEY.pub)"
            .to_owned();
    }
    "no '-----BEGIN PUBLIC KEY-----' section (an RSA, EC P-256/P-384 or Ed25519 public key \
     in PEM, as openssl pkey -pubout writes it; for 'BEGIN RSA PUBLIC KEY' convert with \
     openssl rsa -RSAPublicKey_in -in KEY -pubout)"
        .to_owned()
}

const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;
const BIT_STRING: u8 = 0x03;
const INTEGER: u8 = 0x02;

/// One DER element off the front of `der`: its tag, its contents and what follows.
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        0..=0x7f => (usize::from(first), rest),
        0x81 => {
            let (&n, rest) = rest.split_first()?;
            (usize::from(n), rest)
        }
        0x82 => {
            let (n, rest) = rest.split_at_checked(2)?;
            (usize::from(u16::from_be_bytes([n[0], n[1]])), rest)
        }
        // Longer than 64 KiB: no public key is.
        _ => return None,
    };
    let (contents, rest) = rest.split_at_checked(len)?;
    Some((tag, contents, rest))
}

/// Reads a SubjectPublicKeyInfo: the algorithm its identifier names, and
/// the key in the form `ring` takes.
fn parse_spki(der: &[u8]) -> Result<(KeyAlg, Vec<u8>), &'static str> {
    const BAD: &str = "the PUBLIC KEY section is not a valid SubjectPublicKeyInfo";
    let Some((SEQUENCE, spki, [])) = element(der) else {
        return Err(BAD);
    };
    let Some((SEQUENCE, ident, rest)) = element(spki) else {
        return Err(BAD);
    };
    let Some((BIT_STRING, bits, [])) = element(rest) else {
        return Err(BAD);
    };
    // The key's bits are whole bytes: no unused bits at the end.
    let Some((0, key)) = bits.split_first() else {
        return Err(BAD);
    };
    let Some((OID, oid, params)) = element(ident) else {
        return Err(BAD);
    };
    let alg = match oid {
        OID_RSA => {
            rsa_bits(key)
                .filter(|&b| b >= 2048)
                .ok_or("an RSA key for RS256 must have at least 2048 bits")?;
            KeyAlg::RS256
        }
        OID_EC => {
            let Some((OID, curve, [])) = element(params) else {
                return Err("an EC key without a named curve");
            };
            let (alg, len) = match curve {
                OID_P256 => (KeyAlg::ES256, 65),
                OID_P384 => (KeyAlg::ES384, 97),
                _ => return Err("an EC key on a curve other than P-256 (ES256) or P-384 (ES384)"),
            };
            if key.len() != len || key[0] != 0x04 {
                return Err("an EC key whose point is not in uncompressed form \
                            (export it with openssl pkey -pubout -ec_conv_form uncompressed)");
            }
            alg
        }
        OID_ED25519 => {
            if key.len() != 32 {
                return Err(BAD);
            }
            KeyAlg::EdDSA
        }
        _ => {
            return Err("a key type tokens cannot be checked with here \
                        (RSA, EC P-256, EC P-384 or Ed25519)");
        }
    };
    Ok((alg, key.to_vec()))
}

/// The modulus size of an RSAPublicKey (PKCS#1), in bits.
fn rsa_bits(key: &[u8]) -> Option<usize> {
    let (SEQUENCE, seq, []) = element(key)? else {
        return None;
    };
    let (INTEGER, n, _) = element(seq)? else {
        return None;
    };
    let n = match n {
        [0, rest @ ..] => rest,
        n => n,
    };
    let top = *n.first()?;
    Some((n.len() - 1) * 8 + (8 - top.leading_zeros() as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PEM file holding `der` under `label`.
    fn pem(label: &str, der: &[u8]) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    fn write(dir: &Path, name: &str, text: &[u8]) -> String {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    fn scratch() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "throng-keys-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn key_types_decide_the_algorithm() {
        let dir = scratch();
        for (alg, want) in [
            (&rcgen::PKCS_ECDSA_P256_SHA256, KeyAlg::ES256),
            (&rcgen::PKCS_ECDSA_P384_SHA384, KeyAlg::ES384),
            (&rcgen::PKCS_ED25519, KeyAlg::EdDSA),
        ] {
            let pair = rcgen::KeyPair::generate_for(alg).unwrap();
            let file = write(&dir, "k.pem", pair.public_key_pem().as_bytes());
            let key = Key::public_key_file(&format!("main={file}")).unwrap();
            assert_eq!(key.alg, want);
            assert_eq!(key.kid.as_deref(), Some("main"));
            let raw = pair.public_key_raw();
            assert_eq!(key.material, raw, "the key as ring takes it");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_rsa_key_is_rs256_and_must_have_2048_bits() {
        // SubjectPublicKeyInfo of a 2048-bit modulus (all ones) and e = 65537.
        let rsa = |bits: usize| {
            let mut n = vec![0x00];
            n.extend(std::iter::repeat_n(0xff, bits / 8));
            let mut int = vec![INTEGER, 0x82];
            int.extend((n.len() as u16).to_be_bytes());
            int.extend(&n);
            int.extend([INTEGER, 3, 1, 0, 1]);
            let mut key = vec![SEQUENCE, 0x82];
            key.extend((int.len() as u16).to_be_bytes());
            key.extend(int);
            let mut ident = vec![SEQUENCE, 13, OID, 9];
            ident.extend(OID_RSA);
            ident.extend([0x05, 0x00]);
            let mut bits = vec![BIT_STRING, 0x82];
            bits.extend(((key.len() + 1) as u16).to_be_bytes());
            bits.push(0);
            bits.extend(&key);
            let mut body = ident;
            body.extend(bits);
            let mut spki = vec![SEQUENCE, 0x82];
            spki.extend((body.len() as u16).to_be_bytes());
            spki.extend(body);
            (spki, key)
        };
        let (spki, key) = rsa(2048);
        assert_eq!(parse_spki(&spki), Ok((KeyAlg::RS256, key)));
        let (small, _) = rsa(1024);
        assert!(parse_spki(&small).unwrap_err().contains("2048"));
    }

    #[test]
    fn what_is_not_a_public_key_says_what_to_do() {
        let dir = scratch();
        let pair = rcgen::KeyPair::generate().unwrap();
        let private = write(&dir, "private.pem", pair.serialize_pem().as_bytes());
        let e = Key::public_key_file(&private).unwrap_err().to_string();
        assert!(e.contains("private key") && e.contains("-pubout"), "{e}");
        let other = write(&dir, "junk.pem", b"hello");
        let e = Key::public_key_file(&other).unwrap_err().to_string();
        assert!(e.contains("BEGIN PUBLIC KEY"), "{e}");
        let garbage = write(
            &dir,
            "bad.pem",
            pem("PUBLIC KEY", &[0x30, 0x03, 1, 2]).as_bytes(),
        );
        let e = Key::public_key_file(&garbage).unwrap_err().to_string();
        assert!(e.contains("SubjectPublicKeyInfo"), "{e}");
        let e = Key::public_key_file("/nonexistent/key.pem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read /nonexistent/key.pem"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_secret_loses_its_trailing_newline_and_must_be_long_enough() {
        let dir = scratch();
        let file = write(&dir, "s", format!("{}\r\n", "k".repeat(32)).as_bytes());
        let key = Key::hs256_secret_file(&file).unwrap();
        assert_eq!(key.material, b"k".repeat(32));
        assert_eq!(key.kid, None);
        let short = write(&dir, "short", b"tooshort\n");
        let e = Key::hs256_secret_file(&short).unwrap_err().to_string();
        assert!(e.contains("at least 32 bytes (it has 8)"), "{e}");
        // The fix never names the file given: it may be /etc/hostname.
        let fix = e
            .split("make a new one")
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        assert!(fix.contains("set -C") && !fix.contains("> /"), "{e}");
        assert!(
            !format!("{key:?}").contains("kkkk"),
            "Debug never shows a secret"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn kid_and_file() {
        assert_eq!(split_kid("a=/k.pem").unwrap(), (Some("a".into()), "/k.pem"));
        assert_eq!(split_kid("/dir/a=b.pem").unwrap(), (None, "/dir/a=b.pem"));
        assert_eq!(split_kid("k.pem").unwrap(), (None, "k.pem"));
        assert!(split_kid("=k.pem").is_err());
    }
}
