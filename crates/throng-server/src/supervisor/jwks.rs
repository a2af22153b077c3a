//! The supervisor's side of `--auth-jwks-url` ([`crate::jwks`]): starts the
//! reader, wakes it when a worker saw an unknown `kid`, and hands a key set
//! that changed to every worker, as a SIGHUP's reload does.

use std::rc::Rc;

use tokio::sync::Notify;

use super::{Event, Supervisor};
use crate::auth::jwks::Parsed;
use crate::jwks::FetchError;

impl Supervisor {
    /// Starts reading the key set again (it was read at start, just now).
    pub(super) fn start_jwks(&mut self) {
        let Some(set) = self.config.auth.jwks.clone() else {
            return;
        };
        let stale = Rc::new(Notify::new());
        self.keys_stale = Some(stale.clone());
        let events = self.events.clone();
        tokio::task::spawn_local(crate::jwks::refresh(
            set,
            stale,
            tokio::time::Instant::now(),
            move |r| {
                let _ = events.send(Event::Jwks(r));
            },
        ));
    }

    /// A worker saw a token naming a `kid` no key has.
    pub(super) fn keys_stale(&self) {
        if let Some(n) = &self.keys_stale {
            // One stored wake-up, however many workers ask.
            n.notify_one();
        }
    }

    /// A read of the key set ended: new keys go to every worker; the same
    /// keys change nothing; a failed read keeps what the workers have.
    pub(super) fn jwks_read(&mut self, got: Result<Parsed, FetchError>) {
        let Some(set) = &mut self.config.auth.jwks else {
            return;
        };
        match got {
            Err(e) => log!(
                "throng: --auth-jwks-url {}: cannot read the key set ({e}); keeping its {} keys",
                set.url,
                set.keys.len()
            ),
            Ok(p) if p.keys == set.keys => {}
            Ok(p) => {
                let kids = |keys: &[crate::auth::Key]| {
                    keys.iter()
                        .map(|k| k.kid.clone().unwrap_or_else(|| "(no kid)".into()))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                log!(
                    "throng: --auth-jwks-url {}: the key set changed: kids {} (were {})",
                    set.url,
                    kids(&p.keys),
                    kids(&set.keys)
                );
                for s in &p.skipped {
                    log!("throng: --auth-jwks-url: skipped {s}");
                }
                set.keys = p.keys;
                self.push_config("--auth-jwks-url");
            }
        }
    }
}
