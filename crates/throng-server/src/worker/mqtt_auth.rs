//! Who may do what on an MQTT connection when `--auth-*` keys or
//! `--publish-key-file` guard the server: the credential in CONNECT's
//! password field, checked once by the verifier WebSocket upgrades use
//! ([`crate::auth::Verifier`]), and the grants it carries, checked for each
//! SUBSCRIBE filter, each PUBLISH and the will.
//!
//! The password is a token (the user name is not read: MQTT 3.1.1 needs one
//! beside a password, so clients send something) or the publish key. A
//! connection keeps what the credential grants ([`MqttGrants`], boxed in
//! its state) and the token's expiry (the `Conn`'s, which the worker's
//! sweep closes as it closes a WebSocket's: 5.0 DISCONNECT 0x87, the 4001's
//! twin). Nothing is kept when the server is not guarded, so an MQTT
//! subscriber there pays one empty `Option`.
//!
//! What each refusal answers:
//!
//! - CONNECT without a password where tokens are required: not authorized
//!   (5.0 CONNACK 0x87, 3.1.1 return code 5); a password that is not a
//!   valid token nor the publish key: bad user name or password (0x86, 4).
//!   Counted in `throng_refused_total` by the reason HTTP uses
//!   (`token_expired`, `token_signature`, ...).
//! - A will on a topic the credential may not publish to: CONNACK 0x87 / 5.
//! - A SUBSCRIBE filter the grants do not cover: SUBACK 0x87 (3.1.1 0x80)
//!   for that filter; the others stand.
//! - A PUBLISH the grants do not allow: 5.0 PUBACK 0x87 at QoS 1; at QoS 0,
//!   and in 3.1.1 whose PUBACK has no reason, it is dropped.
//!
//! The last three are counted in `throng_mqtt_refused_total` by kind.

use throng_proto::mqtt::{ReasonCode, topic};

use crate::auth::{Grants, PublishKey, Refusal, Verifier};

/// What an MQTT connection's credential grants. `None` in its state when
/// it came without one where none is needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MqttGrants {
    /// What it may subscribe to (the token's `channels`).
    channels: Grants,
    /// Where it may publish (the token's `publish`).
    publish: Grants,
}

/// A connection the credential let in: its grants (`None`: no credential
/// and none needed) and its token's expiry in Unix seconds (0: none).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub(crate) grants: Option<Box<MqttGrants>>,
    pub(crate) expires: u32,
    /// The token's `sub`, when it has one.
    pub(crate) subject: Option<Box<str>>,
}

/// What the CONNACK of a refused credential says.
pub(crate) fn connack_code(refusal: Refusal) -> ReasonCode {
    match refusal {
        Refusal::Missing | Refusal::NotGranted => ReasonCode::NOT_AUTHORIZED,
        _ => ReasonCode::BAD_USERNAME_OR_PASSWORD,
    }
}

/// Checks a CONNECT's password at Unix second `now`: `guarded` when
/// publishing needs a credential; `verifier` when subscribing needs a
/// token too. An empty password is none (3.1.1 clients may have to send
/// one to send a user name). A refusal's CONNACK code is [`connack_code`].
pub(crate) fn check(
    guarded: bool,
    verifier: Option<&Verifier>,
    publish_key: Option<&PublishKey>,
    password: &[u8],
    now: u64,
) -> Result<Admitted, Refusal> {
    let open = Admitted {
        grants: None,
        expires: 0,
        subject: None,
    };
    if !guarded {
        // Nothing to check: a password is not read.
        return Ok(open);
    }
    if !password.is_empty() && publish_key.is_some_and(|k| k.matches(password)) {
        // The publish key: publish anywhere, as over HTTP; subscribe where
        // anyone may (nowhere, when subscribing takes a token).
        let channels = if verifier.is_some() {
            Grants::default()
        } else {
            Grants::all()
        };
        return Ok(Admitted {
            grants: Some(Box::new(MqttGrants {
                channels,
                publish: Grants::all(),
            })),
            expires: 0,
            subject: None,
        });
    }
    match verifier {
        Some(v) => {
            let token = v.verify(password, now)?;
            Ok(Admitted {
                expires: crate::auth::expiry(token.expires),
                subject: token.subject,
                grants: Some(Box::new(MqttGrants {
                    channels: token.channels,
                    publish: token.publish,
                })),
            })
        }
        // Only the publish key guards publishing: anyone subscribes, and a
        // wrong key is refused now rather than at each PUBLISH.
        None if password.is_empty() => Ok(open),
        None => Err(Refusal::PublishKey),
    }
}

/// Whether a connection with `grants` may publish to `channel` (a will
/// too): without a credential, only where publishing is open.
/// `guarded`: publishing takes a credential.
pub(crate) fn may_publish(guarded: bool, grants: Option<&MqttGrants>, channel: &str) -> bool {
    match grants {
        None => !guarded,
        Some(g) => g.publish.allows(channel),
    }
}

/// Whether a connection with `grants` may subscribe to `filter`: an exact
/// filter is a channel its grants must allow; a wildcard filter, a set of
/// channels some grant pattern must cover whole. Without a credential,
/// anyone may (a server that requires tokens lets no one in without).
pub(crate) fn may_subscribe(grants: Option<&MqttGrants>, filter: &str) -> bool {
    match grants {
        None => true,
        Some(g) if topic::is_wildcard(filter) => g.channels.covers(filter),
        Some(g) => g.channels.allows(filter),
    }
}

#[cfg(test)]
mod tests {
    //! The rules with tokens from `jsonwebtoken`'s own encoder; the CLI
    //! tests (`tests/cli/mqtt_auth.rs`) run them with real clients and
    //! tokens from PyJWT.

    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    use super::*;
    use crate::auth::{Key, PublishKeyFile, Settings};

    const NOW: u64 = 1_700_000_000;
    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const PUBLISH_KEY: &[u8] = b"the-publish-key-of-this-server";

    /// A verifier of one HS256 key and the publish key, from files in a
    /// fresh directory (removed when done).
    fn keys() -> (Verifier, PublishKey) {
        let dir = std::env::temp_dir().join(format!(
            "throng-mqtt-auth-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, SECRET).unwrap();
        let key = dir.join("publish");
        std::fs::write(&key, PUBLISH_KEY).unwrap();
        let settings = Settings {
            keys: vec![Key::hs256_secret_file(&secret.display().to_string()).unwrap()],
            ..Settings::default()
        };
        let file = PublishKeyFile::read(&key.display().to_string()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        (
            Verifier::new(&settings).unwrap(),
            PublishKey::new(&file).unwrap(),
        )
    }

    fn token(claims: serde_json::Value) -> Vec<u8> {
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap()
        .into_bytes()
    }

    /// Whether publishing takes a credential.
    fn limits(publish_guarded: bool) -> bool {
        publish_guarded
    }

    #[test]
    fn a_token_grants_its_channels_and_expires_with_its_exp() {
        let (v, k) = keys();
        let t = token(json!({
            "exp": NOW + 60, "channels": ["news", "sensors/#"], "publish": ["up/+"],
        }));
        let a = check(true, Some(&v), Some(&k), &t, NOW).unwrap();
        assert_eq!(a.expires, u32::try_from(NOW + 60).unwrap());
        let g = a.grants.as_deref();
        assert!(may_subscribe(g, "news") && may_subscribe(g, "sensors/+/temp"));
        assert!(!may_subscribe(g, "sport") && !may_subscribe(g, "#"));
        assert!(
            !may_subscribe(g, "news/+"),
            "an exact grant covers no filter"
        );
        let l = limits(true);
        assert!(may_publish(l, g, "up/1") && !may_publish(l, g, "news"));
    }

    #[test]
    fn refusals_say_which_connack_code() {
        let (v, k) = keys();
        let refused = |password: &[u8]| {
            check(true, Some(&v), Some(&k), password, NOW)
                .map(|_| ())
                .map_err(|r| (r, connack_code(r)))
        };
        assert_eq!(
            refused(b""),
            Err((Refusal::Missing, ReasonCode::NOT_AUTHORIZED))
        );
        assert_eq!(
            refused(&token(json!({"exp": NOW}))),
            Err((Refusal::Expired, ReasonCode::BAD_USERNAME_OR_PASSWORD))
        );
        assert_eq!(
            refused(b"not.a.token"),
            Err((Refusal::Malformed, ReasonCode::BAD_USERNAME_OR_PASSWORD))
        );
        assert_eq!(ReasonCode::NOT_AUTHORIZED.v3_connack(), Some(5));
        assert_eq!(ReasonCode::BAD_USERNAME_OR_PASSWORD.v3_connack(), Some(4));
    }

    #[test]
    fn the_publish_key_publishes_anywhere_and_subscribes_where_anyone_may() {
        let (v, k) = keys();
        let l = limits(true);
        let with_tokens = check(true, Some(&v), Some(&k), PUBLISH_KEY, NOW).unwrap();
        let g = with_tokens.grants.as_deref();
        assert_eq!(with_tokens.expires, 0);
        assert!(may_publish(l, g, "any/where"));
        assert!(!may_subscribe(g, "news"), "subscribing takes a token");
        let alone = check(true, None, Some(&k), PUBLISH_KEY, NOW).unwrap();
        assert!(may_subscribe(alone.grants.as_deref(), "#"));
        // Only the key guards publishing: no password subscribes, a wrong
        // one is refused.
        let anyone = check(true, None, Some(&k), b"", NOW).unwrap();
        assert_eq!(anyone.grants, None);
        assert!(may_subscribe(None, "news") && !may_publish(l, None, "news"));
        assert_eq!(
            check(true, None, Some(&k), b"the-publish-key-of-this-serveR", NOW),
            Err(Refusal::PublishKey)
        );
    }

    #[test]
    fn an_open_server_reads_no_password_and_keeps_nothing() {
        let a = check(false, None, None, b"anything", NOW).unwrap();
        assert_eq!(
            a,
            Admitted {
                grants: None,
                expires: 0,
                subject: None,
            }
        );
        assert!(may_publish(limits(false), None, "news"));
    }
}
