//! A JSON Web Key Set (RFC 7517) as an OIDC provider publishes it at its
//! `jwks_uri`: the URL it is read from (`--auth-jwks-url`) and the keys it
//! holds, turned into the same [`Key`]s a PEM file gives. Reading only:
//! the supervisor fetches (`supervisor::jwks`), this module checks.
//!
//! A set may hold keys for other uses (encryption, algorithms we do not
//! verify): those are skipped and named in the outcome, so the log says
//! why a `kid` is not there; a set with no usable key is refused.

use std::fmt;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::keys::{Key, KeyAlg};

/// The largest key set read (a provider's is a few KiB).
pub const MAX_JWKS: usize = 256 * 1024;

/// Where the key set is fetched from: `https://`, or `http://` to a
/// loopback address only (a key set read in the clear from another host
/// could be anyone's).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JwksUrl {
    /// The URL as given.
    pub url: String,
    /// `https`.
    pub tls: bool,
    /// The host, without brackets for IPv6.
    pub host: String,
    /// The port (443 or 80 when not given).
    pub port: u16,
    /// Path and query, at least `/`.
    pub target: String,
}

impl fmt::Debug for JwksUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

impl fmt::Display for JwksUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

/// Why a key set URL or a key set was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwksError {
    /// Not a URL this server fetches from.
    #[error("'{url}': {why}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Not a key set.
    #[error("not a JSON Web Key Set ({0})")]
    Malformed(String),
    /// A key set with no key tokens can be checked with.
    #[error("no key this server can verify tokens with ({0})")]
    NoUsableKey(String),
}

impl std::str::FromStr for JwksUrl {
    type Err = JwksError;

    fn from_str(url: &str) -> Result<Self, JwksError> {
        let bad = |why| JwksError::Url {
            url: url.to_owned(),
            why,
        };
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad(
                "a key set URL starts with https:// (or http:// on loopback)",
            ));
        };
        let (authority, target) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_owned()),
            None => (rest, "/".to_owned()),
        };
        if authority.contains('@') {
            return Err(bad("credentials in the URL are not sent; give a plain URL"));
        }
        if target.contains('#') || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(bad(
                "the path has a fragment, a space or a control character",
            ));
        }
        let default = if tls { 443 } else { 80 };
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(|| bad("an unclosed '['"))?;
                match after.strip_prefix(':') {
                    Some(p) => (host, p.parse().map_err(|_| bad("a bad port"))?),
                    None if after.is_empty() => (host, default),
                    None => return Err(bad("text after the IPv6 address")),
                }
            }
            None => match authority.rsplit_once(':') {
                Some((h, p)) => (h, p.parse().map_err(|_| bad("a bad port"))?),
                None => (authority, default),
            },
        };
        if host.is_empty() || port == 0 {
            return Err(bad("no host, or port 0"));
        }
        if !tls && !loopback(host) {
            return Err(bad(
                "http:// is only for a loopback address (127.0.0.1, ::1, localhost); \
                 fetch keys from another host over https://",
            ));
        }
        Ok(Self {
            url: url.to_owned(),
            tls,
            host: host.to_owned(),
            port,
            target,
        })
    }
}

fn loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// One key of a set as sent; fields we do not use are ignored.
#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

#[derive(Deserialize)]
struct Set {
    keys: Vec<serde_json::Value>,
}

/// What a key set gave: the keys, and one line per key skipped (why).
#[derive(Debug)]
pub struct Parsed {
    /// The keys tokens can be checked with.
    pub keys: Vec<Key>,
    /// `kid ...: why` for each key left out.
    pub skipped: Vec<String>,
}

/// Reads a key set fetched from `source`: RSA (RS256, 2048 bits or more),
/// EC P-256 (ES256) and P-384 (ES384), and Ed25519 (EdDSA) signing keys.
pub fn parse(body: &[u8], source: &str) -> Result<Parsed, JwksError> {
    if body.len() > MAX_JWKS {
        return Err(JwksError::Malformed(format!(
            "{} bytes, more than {MAX_JWKS}",
            body.len()
        )));
    }
    let set: Set = serde_json::from_slice(body)
        .map_err(|e| JwksError::Malformed(format!("expected {{\"keys\":[...]}}: {e}")))?;
    let mut out = Parsed {
        keys: Vec::new(),
        skipped: Vec::new(),
    };
    for (i, v) in set.keys.into_iter().enumerate() {
        let jwk: Jwk = match serde_json::from_value(v) {
            Ok(j) => j,
            Err(e) => {
                out.skipped.push(format!("key {i}: {e}"));
                continue;
            }
        };
        let name = match &jwk.kid {
            Some(k) => format!("kid {k:?}"),
            None => format!("key {i} (no kid)"),
        };
        match key_of(&jwk) {
            Ok((alg, material)) => {
                out.keys
                    .push(Key::from_parts(jwk.kid, alg, source.to_owned(), material));
            }
            Err(why) => out.skipped.push(format!("{name}: {why}")),
        }
    }
    if out.keys.is_empty() {
        let why = if out.skipped.is_empty() {
            "the set is empty".to_owned()
        } else {
            out.skipped.join("; ")
        };
        return Err(JwksError::NoUsableKey(why));
    }
    Ok(out)
}

/// The algorithm and `ring` form of one key, or why it is left out.
fn key_of(jwk: &Jwk) -> Result<(KeyAlg, Vec<u8>), String> {
    if jwk.use_.as_deref().is_some_and(|u| u != "sig") {
        return Err("not a signing key (use is not \"sig\")".to_owned());
    }
    let field = |name: &str, v: &Option<String>| -> Result<Vec<u8>, String> {
        let v = v.as_deref().ok_or_else(|| format!("no \"{name}\""))?;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(v.trim_end_matches('='))
            .map_err(|_| format!("\"{name}\" is not base64url"))
    };
    let (alg, material) = match (jwk.kty.as_str(), jwk.crv.as_deref()) {
        ("RSA", _) => {
            let n = field("n", &jwk.n)?;
            let e = field("e", &jwk.e)?;
            let n = strip_zeros(&n);
            let bits = n
                .first()
                .map_or(0, |&top| n.len() * 8 - top.leading_zeros() as usize);
            if bits < 2048 {
                return Err(format!(
                    "an RSA key of {bits} bits (RS256 needs 2048 or more)"
                ));
            }
            (KeyAlg::RS256, rsa_public_key_der(n, strip_zeros(&e)))
        }
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let (alg, len) = if crv == "P-256" {
                (KeyAlg::ES256, 32)
            } else {
                (KeyAlg::ES384, 48)
            };
            let (x, y) = (field("x", &jwk.x)?, field("y", &jwk.y)?);
            if x.len() != len || y.len() != len {
                return Err(format!("{crv} coordinates must be {len} bytes each"));
            }
            let mut point = Vec::with_capacity(1 + 2 * len);
            point.push(0x04);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            (alg, point)
        }
        ("OKP", Some("Ed25519")) => {
            let x = field("x", &jwk.x)?;
            if x.len() != 32 {
                return Err("an Ed25519 key must be 32 bytes".to_owned());
            }
            (KeyAlg::EdDSA, x)
        }
        (kty, crv) => {
            return Err(format!(
                "key type {kty}{} is not one tokens are checked with here \
                 (RSA, EC P-256, EC P-384, OKP Ed25519)",
                crv.map(|c| format!(" {c}")).unwrap_or_default()
            ));
        }
    };
    // A key that names its algorithm must name the one its type gives.
    match jwk.alg.as_deref() {
        Some(a) if a != alg.name() => Err(format!(
            "alg {a} is not verified here (a key of this type verifies {})",
            alg.name()
        )),
        _ => Ok((alg, material)),
    }
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    &b[start..]
}

/// An RSAPublicKey (PKCS#1): `SEQUENCE { INTEGER n, INTEGER e }`, the
/// form `ring` verifies RS256 with.
fn rsa_public_key_der(n: &[u8], e: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(n.len() + e.len() + 16);
    der_integer(&mut body, n);
    der_integer(&mut body, e);
    let mut out = Vec::with_capacity(body.len() + 4);
    out.push(0x30);
    der_len(&mut out, body.len());
    out.extend_from_slice(&body);
    out
}

/// A DER INTEGER of the unsigned big-endian `v` (a leading 0 when its
/// top bit is set, so it stays positive).
fn der_integer(out: &mut Vec<u8>, v: &[u8]) {
    let pad = v.first().is_none_or(|&b| b & 0x80 != 0);
    out.push(0x02);
    der_len(out, v.len() + usize::from(pad));
    if pad {
        out.push(0);
    }
    out.extend_from_slice(v);
}

fn der_len(out: &mut Vec<u8>, len: usize) {
    match len {
        0..=0x7f => out.push(len as u8),
        0x80..=0xff => out.extend_from_slice(&[0x81, len as u8]),
        _ => {
            let [hi, lo] = u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes();
            out.extend_from_slice(&[0x82, hi, lo]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    }

    #[test]
    fn urls_https_anywhere_http_only_on_loopback() {
        let u: JwksUrl = "https://id.example.com/.well-known/jwks.json"
            .parse()
            .unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.target.as_str()),
            (true, "id.example.com", 443, "/.well-known/jwks.json")
        );
        let u: JwksUrl = "http://127.0.0.1:8081?x=1".parse().unwrap();
        assert_eq!((u.port, u.target.as_str()), (8081, "/?x=1"));
        let u: JwksUrl = "http://[::1]:9/k".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 9));
        for bad in [
            "http://id.example.com/jwks",
            "http://10.0.0.1/jwks",
            "ftp://x/",
            "https://user:pw@x/",
            "https:///jwks",
            "https://x:0/",
            "https://x:99999/",
            "https://x/a b",
            "https://[::1/",
        ] {
            assert!(bad.parse::<JwksUrl>().is_err(), "{bad}");
        }
        let e = "http://id.example.com/".parse::<JwksUrl>().unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
    }

    #[test]
    fn ec_and_ed25519_keys_become_points_and_other_keys_are_skipped_with_a_reason() {
        let set = serde_json::json!({"keys": [
            {"kty": "EC", "crv": "P-256", "kid": "e1", "x": b64(&[1; 32]), "y": b64(&[2; 32])},
            {"kty": "EC", "crv": "P-384", "kid": "e2", "alg": "ES384",
             "x": b64(&[3; 48]), "y": b64(&[4; 48])},
            {"kty": "OKP", "crv": "Ed25519", "kid": "d", "x": b64(&[5; 32])},
            {"kty": "EC", "crv": "P-256", "kid": "enc", "use": "enc",
             "x": b64(&[1; 32]), "y": b64(&[2; 32])},
            {"kty": "EC", "crv": "P-521", "kid": "big", "x": "AA", "y": "AA"},
            {"kty": "RSA", "kid": "ps", "alg": "PS256", "n": b64(&[0xc1; 256]), "e": "AQAB"},
            {"kty": "RSA", "kid": "small", "n": b64(&[0xc1; 128]), "e": "AQAB"},
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            {"kid": "no-kty"},
        ]});
        let p = parse(set.to_string().as_bytes(), "https://x/").unwrap();
        let got: Vec<_> = p
            .keys
            .iter()
            .map(|k| (k.kid.clone().unwrap(), k.alg))
            .collect();
        assert_eq!(
            got,
            [
                ("e1".to_owned(), KeyAlg::ES256),
                ("e2".to_owned(), KeyAlg::ES384),
                ("d".to_owned(), KeyAlg::EdDSA),
            ]
        );
        let skipped = p.skipped.join("\n");
        for why in [
            "not a signing key",
            "P-521",
            "alg PS256",
            "1024 bits",
            "oct",
            "kty",
        ] {
            assert!(skipped.contains(why), "{why} in {skipped}");
        }
        assert_eq!(p.skipped.len(), 6, "{skipped}");
    }

    #[test]
    fn an_rsa_key_is_pkcs1_der_with_positive_integers() {
        let n = [0xc1u8; 256];
        let set = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r", "use": "sig", "alg": "RS256", "n": b64(&n), "e": "AQAB"},
        ]});
        let p = parse(set.to_string().as_bytes(), "https://x/").unwrap();
        let der = p.keys[0].material_for_tests();
        // SEQUENCE (long form, 2 bytes), INTEGER n with a leading 0, INTEGER e.
        assert_eq!(&der[..4], &[0x30, 0x82, 0x01, 0x0a]);
        assert_eq!(&der[4..8], &[0x02, 0x82, 0x01, 0x01]);
        assert_eq!(der[8], 0);
        assert_eq!(&der[9..265], &n);
        assert_eq!(&der[265..], &[0x02, 0x03, 1, 0, 1]);
    }

    #[test]
    fn what_is_not_a_key_set_is_refused_clearly() {
        for (body, want) in [
            (&b"<html>"[..], "not a JSON Web Key Set"),
            (b"{\"keys\": 3}", "not a JSON Web Key Set"),
            (b"{\"keys\": []}", "the set is empty"),
            (b"{\"keys\": [{\"kty\":\"oct\"}]}", "oct"),
        ] {
            let e = parse(body, "u").unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let big = vec![b' '; MAX_JWKS + 1];
        assert!(
            parse(&big, "u")
                .unwrap_err()
                .to_string()
                .contains("more than")
        );
    }
}
