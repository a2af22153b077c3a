//! The broker seam: where the supervisor sends a published message and
//! where messages to relay come from.
//!
//! Today there is one broker, the supervisor's local relay: a message
//! published on this machine is relayed to this machine's workers at once.
//! A networked broker (Redis, issue 4) goes here: `publish` sends the message
//! out, and what the broker delivers back arrives as a relay.

use crate::control::Message;

/// What the supervisor does with a published message after the broker saw it.
#[derive(Debug)]
pub enum Route {
    /// Relay to the workers now (the local broker routes everything this way).
    RelayNow(Message),
}

/// The embedded broker: nothing to install, one machine.
#[derive(Debug, Default)]
pub struct Local;

impl Local {
    /// Routes a message published through one of our workers.
    pub fn publish(&mut self, m: Message) -> Route {
        Route::RelayNow(m)
    }

    /// A short name for the startup banner.
    pub fn describe(&self) -> &'static str {
        "local (embedded relay, one machine)"
    }
}
