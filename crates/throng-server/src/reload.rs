//! What SIGHUP re-reads: the files named at start whose contents may
//! change under a running server (a renewed certificate, a rotated token
//! key or publish key). Each is read and checked again; one that fails
//! keeps what the server had, so a bad file never stops the server. The
//! supervisor then sends the settings to every worker
//! ([`crate::control::Record::Reload`]).
//!
//! What a reload cannot do: add or remove a key, a listener or any other
//! setting; those need a restart.

use std::path::PathBuf;

use crate::auth::{Key, PublishKeyFile};
use crate::config::Config;
use crate::tls::Material;

/// The files a SIGHUP reads again, as given on the command line.
#[derive(Debug, Clone, Default)]
pub struct Files {
    /// `--tls-cert` and `--tls-key`.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `--auth-hs256-secret-file`, `[KID=]FILE` each.
    pub hs256: Vec<String>,
    /// `--auth-public-key`, `[KID=]FILE` each.
    pub public_keys: Vec<String>,
    /// `--publish-key-file`.
    pub publish_key: Option<String>,
}

/// What one reload did, one line per kind of material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What was read and is now in use.
    pub reloaded: Vec<String>,
    /// What failed, and that the old material stays.
    pub kept: Vec<String>,
}

impl Outcome {
    /// Whether anything changed in `config`.
    pub fn changed(&self) -> bool {
        !self.reloaded.is_empty()
    }
}

impl Files {
    /// Whether there is anything to read again.
    pub fn is_empty(&self) -> bool {
        self.tls.is_none()
            && self.hs256.is_empty()
            && self.public_keys.is_empty()
            && self.publish_key.is_none()
    }

    /// Reads every file again into `config`; what fails leaves `config`'s
    /// material as it was.
    pub fn reload(&self, config: &mut Config) -> Outcome {
        let mut out = Outcome {
            reloaded: Vec::new(),
            kept: Vec::new(),
        };
        if let Some((cert, key)) = &self.tls {
            match Material::from_files(cert, key) {
                Ok(mut m) => {
                    // Tickets issued before the reload still resume.
                    if let Some(old) = &config.tls {
                        m.keep_ticket_key(old);
                    }
                    out.reloaded.push(format!(
                        "tls certificate {} (SHA-256 {})",
                        m.source,
                        m.fingerprint()
                    ));
                    config.tls = Some(m);
                }
                Err(e) => out
                    .kept
                    .push(format!("tls certificate: {e}; the old one stays in use")),
            }
        }
        if !self.hs256.is_empty() || !self.public_keys.is_empty() {
            match self.keys() {
                Ok(keys) => {
                    let names: Vec<String> = keys.iter().map(Key::describe).collect();
                    out.reloaded
                        .push(format!("token keys: {}", names.join(", ")));
                    config.auth.keys = keys;
                }
                Err(e) => out
                    .kept
                    .push(format!("token keys: {e}; the old keys stay in use")),
            }
        }
        if let Some(path) = &self.publish_key {
            match PublishKeyFile::read(path) {
                Ok(k) => {
                    out.reloaded.push(format!("publish key {}", k.source));
                    config.auth.publish_key = Some(k);
                }
                Err(e) => out
                    .kept
                    .push(format!("publish key: {e}; the old key stays in use")),
            }
        }
        out
    }

    /// Every token key, or the first that fails: keys are replaced as a set.
    fn keys(&self) -> Result<Vec<Key>, crate::auth::KeyError> {
        let hs = self.hs256.iter().map(|s| Key::hs256_secret_file(s));
        let public = self.public_keys.iter().map(|s| Key::public_key_file(s));
        hs.chain(public).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_file_keeps_the_old_material_and_a_good_one_replaces_it() {
        let dir = std::env::temp_dir().join(format!("throng-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        let publish = dir.join("publish");
        std::fs::write(&secret, "a".repeat(40)).unwrap();
        std::fs::write(&publish, "p".repeat(20)).unwrap();
        let files = Files {
            hs256: vec![secret.display().to_string()],
            publish_key: Some(publish.display().to_string()),
            ..Files::default()
        };
        let mut config = Config::default();
        let first = files.reload(&mut config);
        assert_eq!(first.reloaded.len(), 2, "{first:?}");
        assert!(first.kept.is_empty());
        let before = config.auth.keys.clone();
        std::fs::write(&secret, "short").unwrap();
        std::fs::write(&publish, "q".repeat(20)).unwrap();
        let second = files.reload(&mut config);
        assert_eq!(config.auth.keys, before, "the short secret was not taken");
        assert_eq!(second.kept.len(), 1, "{second:?}");
        assert!(second.kept[0].contains("at least 32 bytes"), "{second:?}");
        assert_eq!(
            second.reloaded,
            vec![format!("publish key {}", publish.display())]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
