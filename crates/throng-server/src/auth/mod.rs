//! Who may subscribe and who may publish: JSON Web Tokens (RFC 7519)
//! checked against the keys given at start, the channel grants they carry,
//! and the publish API key.
//!
//! A check is a function of (token bytes, action, channel, now):
//! [`Verifier::check`]. It knows nothing of HTTP, so the WebSocket upgrade,
//! the publish route and an SSE request call the same function, and an
//! MQTT CONNECT's password goes through [`Verifier::verify`]; where the
//! token was found is the caller's business (`worker::gate` for HTTP,
//! `worker::mqtt_auth` for MQTT). What a WebSocket connection keeps of a
//! token is its expiry ([`Access::expires`]); an MQTT one keeps its grants
//! too, since it subscribes and publishes later. Neither keeps a copy of
//! the token or its subject.
//!
//! Verification is `jsonwebtoken` on `ring`: every key has one algorithm,
//! chosen by its type (`keys`), and a token whose `alg` is another is
//! refused before any signature is computed, so an RSA public key can never
//! be used as an HMAC secret, and `alg: none` is never accepted. Times
//! (`exp`, `nbf`) are checked here against the `now` the caller passes,
//! with no leeway.

pub mod grant;
pub mod jwks;
pub mod keys;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

pub use grant::{Grants, Pattern, PatternError};
pub use jwks::{JwksError, JwksUrl};
pub use keys::{Key, KeyAlg, KeyError};

/// The close code of a subscriber whose token expired (4001; throng keeps
/// 4001-4099 for its own reasons): the client should get a new token and
/// reconnect.
pub const CLOSE_TOKEN_EXPIRED: u16 = 4001;

/// The longest token looked at; longer ones are refused as malformed
/// before any decoding (a request head is at most 16 KiB anyway).
pub const MAX_TOKEN: usize = 8 * 1024;

/// What the operator configured: the keys, the claims every token must
/// carry, and the publish key. Made by the CLI, sent to every worker
/// inside [`crate::Config`]; secrets never appear in `Debug` or the start
/// line ([`Settings::public_json`]).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// Keys tokens are verified with (none: tokens are not used).
    pub keys: Vec<Key>,
    /// A token's `iss` must be this (`--auth-issuer`).
    pub issuer: Option<String>,
    /// A token's `aud` must hold this (`--auth-audience`).
    pub audience: Option<String>,
    /// Accept tokens without `exp` (`--auth-allow-no-exp`).
    pub allow_no_exp: bool,
    /// The publish API key (`--publish-key-file`).
    pub publish_key: Option<PublishKeyFile>,
    /// Keys from a JSON Web Key Set URL (`--auth-jwks-url`), beside `keys`.
    #[serde(default)]
    pub jwks: Option<Jwks>,
}

/// `--auth-jwks-url`: where the key set is read, how often, and the keys
/// it held when last read (the supervisor replaces them as it reads again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwks {
    /// The set's URL.
    pub url: JwksUrl,
    /// `--auth-jwks-ca`: the CA file its certificate must chain to (`None`:
    /// the system bundle).
    pub ca: Option<std::path::PathBuf>,
    /// `--auth-jwks-refresh`: how often it is read again.
    pub refresh: std::time::Duration,
    /// The keys of its last good read.
    pub keys: Vec<Key>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("keys", &self.keys)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("allow_no_exp", &self.allow_no_exp)
            .field("publish_key", &self.publish_key)
            .field("jwks", &self.jwks)
            .finish()
    }
}

/// The publish API key as read from its file.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishKeyFile {
    /// The file.
    pub source: String,
    secret: Vec<u8>,
}

impl fmt::Debug for PublishKeyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishKeyFile")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl PublishKeyFile {
    /// Reads `--publish-key-file`: its bytes less one trailing line ending,
    /// at least [`MIN_PUBLISH_KEY`] of them.
    pub fn read(path: &str) -> Result<Self, KeyError> {
        let secret = keys::read_secret(path)?;
        if secret.len() < MIN_PUBLISH_KEY {
            return Err(KeyError::Unusable {
                path: path.to_owned(),
                why: format!(
                    "a publish key must be at least {MIN_PUBLISH_KEY} bytes (it has {}); \
                     make a new one with: (set -C; umask 077; head -c 24 /dev/urandom | base64 \
                     > throng-publish.key) and give --publish-key-file throng-publish.key \
                     (this writes no existing file)",
                    secret.len()
                ),
            });
        }
        Ok(Self {
            source: path.to_owned(),
            secret,
        })
    }
}

/// The shortest publish key accepted.
pub const MIN_PUBLISH_KEY: usize = 16;

impl Settings {
    /// Whether subscribers need a token.
    pub fn tokens(&self) -> bool {
        !self.keys.is_empty() || self.jwks.is_some()
    }

    /// Every key a token may be checked with: the files', then the key set's.
    pub fn all_keys(&self) -> impl Iterator<Item = &Key> {
        self.keys
            .iter()
            .chain(self.jwks.iter().flat_map(|j| j.keys.iter()))
    }

    /// Whether publishing needs a credential (a token or the key).
    pub fn publish_guarded(&self) -> bool {
        self.tokens() || self.publish_key.is_some()
    }

    /// The settings as the start line shows them: files, algorithms and
    /// kids, never a key.
    pub fn public_json(&self) -> serde_json::Value {
        serde_json::json!({
            "keys": self.keys.iter().map(|k| serde_json::json!({
                "alg": k.alg.name(), "kid": k.kid, "source": k.source,
            })).collect::<Vec<_>>(),
            "issuer": self.issuer,
            "audience": self.audience,
            "allow_no_exp": self.allow_no_exp,
            "publish_key_file": self.publish_key.as_ref().map(|k| &k.source),
            "jwks": self.jwks.as_ref().map(|j| serde_json::json!({
                "url": j.url.url,
                "ca": j.ca,
                "refresh": throng_host::units::fmt_duration(j.refresh),
                "keys": j.keys.iter().map(|k| serde_json::json!({
                    "alg": k.alg.name(), "kid": k.kid,
                })).collect::<Vec<_>>(),
            })),
        })
    }
}

/// What a token is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Receive a channel's messages (the `channels` claim).
    Subscribe,
    /// Publish to a channel (the `publish` claim).
    Publish,
}

/// Why a request was refused. [`Refusal::status`] is the HTTP answer:
/// 401 (no usable token, with `WWW-Authenticate`) or 403 (a valid token
/// that does not grant the channel). Nothing in a refusal comes from the
/// token or the key: the descriptions are fixed text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// No token where one was looked for.
    #[error("a token is required")]
    Missing,
    /// Not three base64url parts with JSON in the first two, or too long.
    #[error("malformed token")]
    Malformed,
    /// `alg: none`: an unsigned token.
    #[error("unsigned tokens (alg none) are not accepted")]
    AlgNone,
    /// An `alg` no configured key verifies (HS/RS confusion lands here).
    #[error("no key for the token's algorithm")]
    Algorithm,
    /// A `kid` naming no key.
    #[error("no key with the token's key id")]
    UnknownKid,
    /// The signature does not verify.
    #[error("invalid signature")]
    Signature,
    /// `exp` is past.
    #[error("token expired")]
    Expired,
    /// `nbf` is still ahead.
    #[error("token not valid yet")]
    NotYetValid,
    /// No `exp`, and `--auth-allow-no-exp` was not given.
    #[error("token has no expiry (exp)")]
    NoExpiry,
    /// `iss` is not `--auth-issuer`.
    #[error("wrong issuer")]
    Issuer,
    /// `aud` does not name `--auth-audience` (or names an audience when
    /// none was configured: RFC 7519 section 4.1.3).
    #[error("wrong audience")]
    Audience,
    /// The claims are not what this server reads (`exp` not a number,
    /// `channels` not a list of patterns, an invalid pattern).
    #[error("malformed claims")]
    Claims,
    /// A `crit` header: extensions the token says must be understood, and
    /// this server understands none (RFC 7515 section 4.1.11).
    #[error("the token's crit header names extensions this server does not understand")]
    Critical,
    /// The wrong publish key.
    #[error("invalid publish key")]
    PublishKey,
    /// A valid token that does not grant this channel for this action.
    #[error("the token does not grant this channel")]
    NotGranted,
}

impl Refusal {
    /// 401 or 403.
    pub fn status(self) -> u16 {
        match self {
            Self::NotGranted => 403,
            _ => 401,
        }
    }

    /// The `reason` label of `throng_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "token_missing",
            Self::Malformed => "token_malformed",
            Self::AlgNone => "token_alg_none",
            Self::Algorithm => "token_algorithm",
            Self::UnknownKid => "token_kid",
            Self::Signature => "token_signature",
            Self::Expired => "token_expired",
            Self::NotYetValid => "token_not_yet_valid",
            Self::NoExpiry => "token_no_exp",
            Self::Issuer => "token_issuer",
            Self::Audience => "token_audience",
            Self::Claims => "token_claims",
            Self::Critical => "token_crit",
            Self::PublishKey => "publish_key",
            Self::NotGranted => "not_granted",
        }
    }

    /// The `WWW-Authenticate` value (RFC 6750 section 3): no error code
    /// when no credential came, `insufficient_scope` on 403,
    /// `invalid_token` otherwise, with this refusal's text.
    pub fn www_authenticate(self) -> String {
        match self {
            Self::Missing => "Bearer realm=\"throng\"".to_owned(),
            Self::NotGranted => format!(
                "Bearer realm=\"throng\", error=\"insufficient_scope\", error_description=\"{self}\""
            ),
            _ => format!(
                "Bearer realm=\"throng\", error=\"invalid_token\", error_description=\"{self}\""
            ),
        }
    }
}

/// What a granted request keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// The token's `exp` (Unix seconds); `None`: no expiry, or not a token
    /// (the publish key).
    pub expires: Option<u64>,
    /// The token's `sub`, when it has one: what `POST /api/disconnect`
    /// finds its connections by.
    pub subject: Option<Box<str>>,
}

/// A verified token: its expiry and grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// `exp`, Unix seconds.
    pub expires: Option<u64>,
    /// `channels`: what it may subscribe to.
    pub channels: Grants,
    /// `publish`: where it may publish.
    pub publish: Grants,
    /// `sub`, when it has one (at most [`MAX_SUBJECT`] bytes).
    pub subject: Option<Box<str>>,
}

/// The longest `sub` kept: a longer one is refused as a bad claim, so one
/// connection cannot make the server keep a large string.
pub const MAX_SUBJECT: usize = 255;

impl Token {
    /// Whether the token allows `action` on `channel`.
    pub fn allows(&self, action: Action, channel: &str) -> bool {
        match action {
            Action::Subscribe => self.channels.allows(channel),
            Action::Publish => self.publish.allows(channel),
        }
    }
}

/// A JWT NumericDate: seconds since the epoch, possibly fractional.
#[derive(Debug, Clone, Copy)]
struct NumericDate(u64);

impl<'de> Deserialize<'de> for NumericDate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !v.is_finite() || v < 0.0 {
            return Err(serde::de::Error::custom("not a date"));
        }
        // Whole seconds; saturates far beyond any real date.
        Ok(Self(v.floor() as u64))
    }
}

/// The claims this server reads; any others are ignored. `sub` is kept by
/// the connection (not logged), for disconnecting a user.
#[derive(Deserialize)]
struct Claims {
    exp: Option<NumericDate>,
    sub: Option<serde_json::Value>,
    nbf: Option<NumericDate>,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
}

/// The header fields a key is chosen by.
#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    /// Any value at all is refused: no extension is understood here.
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// One key ready to verify with.
struct Verifying {
    kid: Option<String>,
    alg: KeyAlg,
    key: jsonwebtoken::DecodingKey,
    validation: jsonwebtoken::Validation,
}

/// Checks tokens against the configured keys. Built by each worker from
/// [`Settings`].
pub struct Verifier {
    keys: Vec<Verifying>,
    allow_no_exp: bool,
    /// Keys come from a key set that may have gained one since it was read.
    watch_kids: bool,
    /// A token named a `kid` no key has since [`Verifier::take_unknown_kid`]
    /// last asked: the key set may have rotated. (Atomic only so that a
    /// verifier stays `Sync`; each worker has its own.)
    unknown_kid: AtomicBool,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// The verifier of `settings`, or `None` when no key is configured.
    pub fn new(settings: &Settings) -> Option<Self> {
        if !settings.tokens() {
            return None;
        }
        let keys = settings
            .all_keys()
            .map(|k| {
                let alg = match k.alg {
                    KeyAlg::HS256 => jsonwebtoken::Algorithm::HS256,
                    KeyAlg::RS256 => jsonwebtoken::Algorithm::RS256,
                    KeyAlg::ES256 => jsonwebtoken::Algorithm::ES256,
                    KeyAlg::ES384 => jsonwebtoken::Algorithm::ES384,
                    KeyAlg::EdDSA => jsonwebtoken::Algorithm::EdDSA,
                };
                let mut v = jsonwebtoken::Validation::new(alg);
                // Times are checked below against the caller's clock.
                v.validate_exp = false;
                v.validate_nbf = false;
                v.leeway = 0;
                v.required_spec_claims.clear();
                if let Some(iss) = &settings.issuer {
                    v.set_issuer(&[iss]);
                    v.required_spec_claims.insert("iss".to_owned());
                }
                match &settings.audience {
                    Some(aud) => {
                        v.set_audience(&[aud]);
                        v.required_spec_claims.insert("aud".to_owned());
                    }
                    // A token addressed to someone is refused by a server
                    // that was not told it is that someone.
                    None => v.validate_aud = true,
                }
                Verifying {
                    kid: k.kid.clone(),
                    alg: k.alg,
                    key: k.decoding_key(),
                    validation: v,
                }
            })
            .collect();
        Some(Self {
            keys,
            allow_no_exp: settings.allow_no_exp,
            watch_kids: settings.jwks.is_some(),
            unknown_kid: AtomicBool::new(false),
        })
    }

    /// Verifies `token` at Unix time `now`: the signature with a key of the
    /// token's algorithm (the key its `kid` names, else the keys without a
    /// kid; with no `kid`, any key), then the issuer, audience and times.
    pub fn verify(&self, token: &[u8], now: u64) -> Result<Token, Refusal> {
        if token.is_empty() {
            return Err(Refusal::Missing);
        }
        if token.len() > MAX_TOKEN {
            return Err(Refusal::Malformed);
        }
        let token = std::str::from_utf8(token).map_err(|_| Refusal::Malformed)?;
        let header = header(token)?;
        if header.alg.eq_ignore_ascii_case("none") {
            return Err(Refusal::AlgNone);
        }
        let alg = KeyAlg::from_name(&header.alg).ok_or(Refusal::Algorithm)?;
        // A kid that names a key picks it; a kid that names none falls back
        // to the keys given without one (an issuer may label its only key);
        // no kid: every key. Each must still be of the token's algorithm.
        let named = header
            .kid
            .as_deref()
            .filter(|kid| self.keys.iter().any(|k| k.kid.as_deref() == Some(*kid)));
        if named.is_none() && header.kid.is_some() && self.watch_kids {
            self.unknown_kid.store(true, Ordering::Relaxed);
        }
        let mut candidates = self
            .keys
            .iter()
            .filter(|k| match (named, &header.kid) {
                (Some(kid), _) => k.kid.as_deref() == Some(kid),
                (None, Some(_)) => k.kid.is_none(),
                (None, None) => true,
            })
            .peekable();
        if candidates.peek().is_none() {
            return Err(Refusal::UnknownKid);
        }
        let mut refusal = Refusal::Algorithm;
        for k in candidates.filter(|k| k.alg == alg) {
            match jsonwebtoken::decode::<Claims>(token, &k.key, &k.validation) {
                Ok(data) => return self.accept(data.claims, now),
                Err(e) => {
                    refusal = refusal_of(&e);
                    if refusal != Refusal::Signature {
                        // Signed by this key: another one will not do better.
                        return Err(refusal);
                    }
                }
            }
        }
        Err(refusal)
    }

    /// Whether a token named an unknown `kid` (with a key set configured)
    /// since the last call: the worker's tick asks, and tells the
    /// supervisor, which reads the set again (at most so often).
    pub fn take_unknown_kid(&self) -> bool {
        self.unknown_kid.swap(false, Ordering::Relaxed)
    }

    /// The claims of a token whose signature, issuer and audience are right.
    fn accept(&self, claims: Claims, now: u64) -> Result<Token, Refusal> {
        match claims.exp {
            Some(NumericDate(exp)) if exp <= now => return Err(Refusal::Expired),
            None if !self.allow_no_exp => return Err(Refusal::NoExpiry),
            _ => {}
        }
        if claims.nbf.is_some_and(|NumericDate(nbf)| nbf > now) {
            return Err(Refusal::NotYetValid);
        }
        // RFC 7519 makes `sub` a string; a number, which some issuers
        // send, is kept as its text (the decoder refused anything else).
        let subject = match claims.sub {
            Some(serde_json::Value::String(s)) => Some(s),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        if subject.as_ref().is_some_and(|s| s.len() > MAX_SUBJECT) {
            return Err(Refusal::Claims);
        }
        Ok(Token {
            subject: subject.map(String::into_boxed_str),
            expires: claims.exp.map(|NumericDate(e)| e),
            channels: Grants::parse(&claims.channels).map_err(|_| Refusal::Claims)?,
            publish: Grants::parse(&claims.publish).map_err(|_| Refusal::Claims)?,
        })
    }

    /// The one check every transport makes: may the bearer of `token` do
    /// `action` on `channel` at Unix time `now`?
    pub fn check(
        &self,
        token: &[u8],
        action: Action,
        channel: &str,
        now: u64,
    ) -> Result<Access, Refusal> {
        let t = self.verify(token, now)?;
        if !t.allows(action, channel) {
            return Err(Refusal::NotGranted);
        }
        Ok(Access {
            expires: t.expires,
            subject: t.subject,
        })
    }
}

/// The token's header, read before any key is chosen.
fn header(token: &str) -> Result<Header, Refusal> {
    let mut parts = token.split('.');
    let (Some(head), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Malformed);
    };
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .map_err(|_| Refusal::Malformed)?;
    let h: Header = serde_json::from_slice(&json).map_err(|_| Refusal::Malformed)?;
    if h.crit.is_some() {
        return Err(Refusal::Critical);
    }
    Ok(h)
}

/// The refusal a `jsonwebtoken` error stands for, once a key was chosen.
fn refusal_of(e: &jsonwebtoken::errors::Error) -> Refusal {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidSignature => Refusal::Signature,
        K::InvalidAlgorithm | K::InvalidAlgorithmName | K::MissingAlgorithm => Refusal::Algorithm,
        K::InvalidIssuer => Refusal::Issuer,
        K::InvalidAudience => Refusal::Audience,
        K::MissingRequiredClaim(c) if c == "iss" => Refusal::Issuer,
        K::MissingRequiredClaim(c) if c == "aud" => Refusal::Audience,
        // The signature held: the claims are what is wrong.
        K::Json(_) => Refusal::Claims,
        _ => Refusal::Malformed,
    }
}

/// The publish API key, held as an HMAC tag under a key made at start, so
/// that comparing a presented key is `ring`'s constant-time HMAC check and
/// its time says nothing about how much of the key was right.
pub struct PublishKey {
    mac: ring::hmac::Key,
    tag: ring::hmac::Tag,
}

impl fmt::Debug for PublishKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PublishKey")
    }
}

impl PublishKey {
    /// The key of `file`; fails only when the system has no randomness.
    pub fn new(file: &PublishKeyFile) -> Result<Self, ring::error::Unspecified> {
        let mac =
            ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())?;
        let tag = ring::hmac::sign(&mac, &file.secret);
        Ok(Self { mac, tag })
    }

    /// Whether `presented` is the key.
    pub fn matches(&self, presented: &[u8]) -> bool {
        ring::hmac::verify(&self.mac, presented, self.tag.as_ref()).is_ok()
    }
}

/// A token's `exp` as a subscriber keeps it: Unix seconds in four bytes, 0
/// for none. An expiry past 2106 is as good as none.
pub(crate) fn expiry(exp: Option<u64>) -> u32 {
    exp.and_then(|e| u32::try_from(e).ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    //! Tokens made with `jsonwebtoken`'s own encoder: these pin this
    //! module's rules (key choice, times, grants, refusals); the CLI tests
    //! check the same against tokens from an independent library (PyJWT).

    use std::path::PathBuf;

    use jsonwebtoken::{Algorithm, EncodingKey, Header as JwtHeader, encode};
    use serde_json::json;

    use super::*;

    const NOW: u64 = 1_700_000_000;
    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    struct Dir(PathBuf);

    impl Dir {
        fn new() -> Self {
            let d = std::env::temp_dir().join(format!(
                "throng-auth-{}-{}",
                std::process::id(),
                fastrand::u64(..)
            ));
            std::fs::create_dir_all(&d).unwrap();
            Self(d)
        }

        fn write(&self, name: &str, bytes: &[u8]) -> String {
            let p = self.0.join(name);
            std::fs::write(&p, bytes).unwrap();
            p.display().to_string()
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn sign(
        alg: Algorithm,
        kid: Option<&str>,
        key: &EncodingKey,
        claims: serde_json::Value,
    ) -> String {
        let mut h = JwtHeader::new(alg);
        h.kid = kid.map(str::to_owned);
        encode(&h, &claims, key).unwrap()
    }

    fn hs(claims: serde_json::Value) -> String {
        sign(
            Algorithm::HS256,
            None,
            &EncodingKey::from_secret(SECRET),
            claims,
        )
    }

    /// Settings with one HS256 key (kid `hs`) and nothing else.
    fn hs_settings(dir: &Dir) -> Settings {
        Settings {
            keys: vec![Key::hs256_secret_file(&dir.write("s", SECRET)).unwrap()],
            ..Settings::default()
        }
    }

    fn verifier(settings: &Settings) -> Verifier {
        Verifier::new(settings).unwrap()
    }

    fn b64(json: &serde_json::Value) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string())
    }

    #[test]
    fn a_valid_token_grants_its_channels_and_patterns_and_nothing_else() {
        let dir = Dir::new();
        let v = verifier(&hs_settings(&dir));
        let t = hs(json!({
            "sub": "alice", "exp": NOW + 60,
            "channels": ["news", "room.*"], "publish": ["news"],
        }));
        let ok = v.check(t.as_bytes(), Action::Subscribe, "room.7", NOW);
        assert_eq!(
            ok,
            Ok(Access {
                expires: Some(NOW + 60),
                subject: Some("alice".into()),
            })
        );
        assert!(
            v.check(t.as_bytes(), Action::Subscribe, "news", NOW)
                .is_ok()
        );
        assert!(v.check(t.as_bytes(), Action::Publish, "news", NOW).is_ok());
        let subject = |sub| {
            let t = hs(json!({ "sub": sub, "exp": NOW + 60 }));
            v.verify(t.as_bytes(), NOW).map(|t| t.subject)
        };
        assert_eq!(subject(json!(42)), Ok(Some("42".into())));
        // The decoder refuses a `sub` that is not a string or a number.
        assert_eq!(subject(json!(["a"])), Err(Refusal::Claims));
        assert_eq!(
            subject(json!("x".repeat(MAX_SUBJECT))).map(|s| s.map(|s| s.len())),
            Ok(Some(MAX_SUBJECT))
        );
        assert_eq!(
            subject(json!("x".repeat(MAX_SUBJECT + 1))),
            Err(Refusal::Claims)
        );
        let refused = v.check(t.as_bytes(), Action::Subscribe, "sport", NOW);
        assert_eq!(refused, Err(Refusal::NotGranted));
        assert_eq!(Refusal::NotGranted.status(), 403);
        assert_eq!(
            v.check(t.as_bytes(), Action::Publish, "room.7", NOW),
            Err(Refusal::NotGranted),
            "publish rights are their own claim"
        );
        let none = hs(json!({"exp": NOW + 60}));
        assert_eq!(
            v.check(none.as_bytes(), Action::Subscribe, "news", NOW),
            Err(Refusal::NotGranted),
            "no channels claim: no channel"
        );
    }

    #[test]
    fn exp_is_required_and_checked_with_no_leeway_and_nbf_too() {
        let dir = Dir::new();
        let mut settings = hs_settings(&dir);
        let v = verifier(&settings);
        let at = |claims| v.verify(hs(claims).as_bytes(), NOW).map(|t| t.expires);
        assert_eq!(at(json!({"exp": NOW + 1})), Ok(Some(NOW + 1)));
        assert_eq!(at(json!({"exp": NOW})), Err(Refusal::Expired));
        assert_eq!(at(json!({"exp": NOW as f64 + 0.5})), Err(Refusal::Expired));
        assert_eq!(at(json!({})), Err(Refusal::NoExpiry));
        assert_eq!(
            at(json!({"exp": NOW + 9, "nbf": NOW + 1})),
            Err(Refusal::NotYetValid)
        );
        assert_eq!(at(json!({"exp": NOW + 9, "nbf": NOW})), Ok(Some(NOW + 9)));
        assert_eq!(at(json!({"exp": "tomorrow"})), Err(Refusal::Claims));
        settings.allow_no_exp = true;
        let v = verifier(&settings);
        assert_eq!(
            v.verify(hs(json!({})).as_bytes(), NOW).map(|t| t.expires),
            Ok(None)
        );
    }

    #[test]
    fn a_crit_header_is_refused_even_when_the_signature_holds() {
        let dir = Dir::new();
        let v = verifier(&hs_settings(&dir));
        let signed = |header: serde_json::Value| {
            let body = format!(
                "{}.{}",
                b64(&header),
                b64(&json!({"exp": NOW + 60, "channels": ["*"]}))
            );
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET);
            let tag = ring::hmac::sign(&key, body.as_bytes());
            let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref());
            format!("{body}.{sig}")
        };
        let plain = signed(json!({"alg": "HS256", "typ": "JWT"}));
        assert!(
            v.check(plain.as_bytes(), Action::Subscribe, "x", NOW)
                .is_ok()
        );
        let crit = signed(json!({"alg": "HS256", "crit": ["b64"], "b64": false}));
        assert_eq!(v.verify(crit.as_bytes(), NOW), Err(Refusal::Critical));
        assert_eq!(Refusal::Critical.label(), "token_crit");
    }

    #[test]
    fn alg_none_and_a_public_key_used_as_an_hmac_secret_are_refused() {
        let dir = Dir::new();
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let public = pair.public_key_pem();
        let settings = Settings {
            keys: vec![Key::public_key_file(&dir.write("ec.pem", public.as_bytes())).unwrap()],
            ..Settings::default()
        };
        let v = verifier(&settings);
        let claims = json!({"exp": NOW + 60, "channels": ["*"]});
        let good = sign(
            Algorithm::ES256,
            None,
            &EncodingKey::from_ec_der(&pair.serialize_der()),
            claims.clone(),
        );
        assert!(
            v.check(good.as_bytes(), Action::Subscribe, "x", NOW)
                .is_ok()
        );
        // The classic attack: HS256 with the server's public key as the secret.
        let forged = sign(
            Algorithm::HS256,
            None,
            &EncodingKey::from_secret(public.as_bytes()),
            claims.clone(),
        );
        assert_eq!(v.verify(forged.as_bytes(), NOW), Err(Refusal::Algorithm));
        // Unsigned, any spelling.
        for alg in ["none", "None", "NONE"] {
            let unsigned = format!("{}.{}.", b64(&json!({"alg": alg})), b64(&claims));
            assert_eq!(v.verify(unsigned.as_bytes(), NOW), Err(Refusal::AlgNone));
        }
        // Another algorithm of the same family is not this key's either.
        let es384 = format!("{}.{}.", b64(&json!({"alg": "ES384"})), b64(&claims));
        assert_eq!(v.verify(es384.as_bytes(), NOW), Err(Refusal::Algorithm));
        // A good signature moved onto other claims.
        let sig = good.rsplit('.').next().unwrap();
        let more = json!({"exp": NOW + 99_999, "channels": ["*"]});
        let spliced = format!("{}.{}.{sig}", good.split('.').next().unwrap(), b64(&more));
        assert_eq!(v.verify(spliced.as_bytes(), NOW), Err(Refusal::Signature));
    }

    #[test]
    fn ed25519_keys_verify_eddsa() {
        let dir = Dir::new();
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let file = dir.write("ed.pem", pair.public_key_pem().as_bytes());
        let v = verifier(&Settings {
            keys: vec![Key::public_key_file(&file).unwrap()],
            ..Settings::default()
        });
        let t = sign(
            Algorithm::EdDSA,
            None,
            &EncodingKey::from_ed_der(&pair.serialize_der()),
            json!({"exp": NOW + 5, "publish": ["a/#"]}),
        );
        assert!(v.check(t.as_bytes(), Action::Publish, "a/b", NOW).is_ok());
    }

    #[test]
    fn kid_picks_the_key() {
        let dir = Dir::new();
        let other: &[u8] = b"another secret of thirty-two byt";
        let settings = Settings {
            keys: vec![
                Key::hs256_secret_file(&format!("a={}", dir.write("a", SECRET))).unwrap(),
                Key::hs256_secret_file(&format!("b={}", dir.write("b", other))).unwrap(),
            ],
            ..Settings::default()
        };
        let v = verifier(&settings);
        let claims = json!({"exp": NOW + 60});
        let with = |kid, secret| {
            let t = sign(
                Algorithm::HS256,
                kid,
                &EncodingKey::from_secret(secret),
                claims.clone(),
            );
            v.verify(t.as_bytes(), NOW).map(|_| ())
        };
        assert_eq!(with(Some("b"), other), Ok(()));
        assert_eq!(with(Some("a"), SECRET), Ok(()));
        assert_eq!(
            with(Some("a"), other),
            Err(Refusal::Signature),
            "kid a means key a only"
        );
        assert_eq!(with(Some("c"), SECRET), Err(Refusal::UnknownKid));
        assert_eq!(
            with(None, other),
            Ok(()),
            "no kid: any key of the algorithm"
        );
        // A key given without a kid takes tokens whose kid names no key.
        let plain = verifier(&hs_settings(&dir));
        let t = sign(
            Algorithm::HS256,
            Some("issuer-label"),
            &EncodingKey::from_secret(SECRET),
            claims,
        );
        assert!(plain.verify(t.as_bytes(), NOW).is_ok());
    }

    #[test]
    fn issuer_and_audience() {
        let dir = Dir::new();
        let mut settings = hs_settings(&dir);
        let v = verifier(&settings);
        let at = |v: &Verifier, claims| v.verify(hs(claims).as_bytes(), NOW).map(|_| ());
        assert_eq!(
            at(&v, json!({"exp": NOW + 5, "aud": "elsewhere"})),
            Err(Refusal::Audience),
            "addressed to someone this server was not told it is"
        );
        settings.issuer = Some("https://id.example".into());
        settings.audience = Some("push".into());
        let v = verifier(&settings);
        let good = json!({"exp": NOW + 5, "iss": "https://id.example", "aud": ["web", "push"]});
        assert_eq!(at(&v, good), Ok(()));
        assert_eq!(
            at(
                &v,
                json!({"exp": NOW + 5, "iss": "https://evil", "aud": "push"})
            ),
            Err(Refusal::Issuer)
        );
        assert_eq!(
            at(&v, json!({"exp": NOW + 5, "aud": "push"})),
            Err(Refusal::Issuer),
            "a missing issuer is a wrong one"
        );
        assert_eq!(
            at(
                &v,
                json!({"exp": NOW + 5, "iss": "https://id.example", "aud": "web"})
            ),
            Err(Refusal::Audience)
        );
        assert_eq!(
            at(&v, json!({"exp": NOW + 5, "iss": "https://id.example"})),
            Err(Refusal::Audience)
        );
    }

    #[test]
    fn malformed_tokens_and_claims() {
        let dir = Dir::new();
        let v = verifier(&hs_settings(&dir));
        for bad in [
            &b"abc"[..],
            b"a.b",
            b"a.b.c.d",
            b"!!!.e30.x",
            b"e30.e30.x",
            b"\xff\xfe.e30.x",
        ] {
            assert_eq!(
                v.verify(bad, NOW).map(|_| ()),
                Err(Refusal::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(v.verify(b"", NOW).map(|_| ()), Err(Refusal::Missing));
        let huge = vec![b'a'; MAX_TOKEN + 1];
        assert_eq!(v.verify(&huge, NOW).map(|_| ()), Err(Refusal::Malformed));
        for claims in [
            json!({"exp": NOW + 5, "channels": "news"}),
            json!({"exp": NOW + 5, "channels": ["a*b"]}),
            json!({"exp": NOW + 5, "publish": [1]}),
        ] {
            assert_eq!(
                v.verify(hs(claims.clone()).as_bytes(), NOW).map(|_| ()),
                Err(Refusal::Claims),
                "{claims}"
            );
        }
    }

    #[test]
    fn refusals_say_why_without_echoing_anything() {
        assert_eq!(
            Refusal::Missing.www_authenticate(),
            "Bearer realm=\"throng\""
        );
        assert_eq!(
            Refusal::Expired.www_authenticate(),
            "Bearer realm=\"throng\", error=\"invalid_token\", error_description=\"token expired\""
        );
        assert!(
            Refusal::NotGranted
                .www_authenticate()
                .contains("insufficient_scope")
        );
        assert_eq!(Refusal::Signature.status(), 401);
    }

    #[test]
    fn the_publish_key_matches_only_itself() {
        let dir = Dir::new();
        let file = PublishKeyFile::read(&dir.write("k", b"0123456789abcdef\n")).unwrap();
        let key = PublishKey::new(&file).unwrap();
        assert!(key.matches(b"0123456789abcdef"));
        assert!(!key.matches(b"0123456789abcdeX"));
        assert!(!key.matches(b"0123456789abcdef0"));
        assert!(!key.matches(b""));
        let short = dir.write("short", b"abc");
        assert!(
            PublishKeyFile::read(&short)
                .unwrap_err()
                .to_string()
                .contains("at least 16")
        );
        let settings = Settings {
            publish_key: Some(file),
            ..Settings::default()
        };
        assert!(settings.publish_guarded() && !settings.tokens());
        let shown = format!("{settings:?} {}", settings.public_json());
        assert!(!shown.contains("0123456789"), "{shown}");
    }
}
