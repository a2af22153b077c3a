//! What one worker owns, shared by its tasks (the control loop, the
//! accept loops, the epoll reactor, the tick, one task per HTTP
//! connection): its settings, counters, subscribers and supervisor link.
//! Nothing here is shared between threads or locked.

use std::cell::Cell;
use std::io;
use std::net::TcpStream;
use std::rc::Rc;

use throng_host::poll::{Interest, Poller};

use super::link::Link;
use super::subscribers::{Outside, Subscribers};
use crate::auth::{PublishKey, Verifier};
use crate::config::Config;
use crate::metrics::Counters;

/// Everything one worker owns.
pub(crate) struct Worker {
    pub(crate) cfg: Config,
    pub(crate) index: usize,
    pub(crate) counters: Rc<Counters>,
    pub(crate) subs: Subscribers<Around>,
    pub(crate) link: Rc<Link>,
    /// SIGTERM/SIGINT came: no new subscribers, no more fan-out.
    pub(crate) draining: Cell<bool>,
    /// Checks tokens, when keys are configured.
    pub(crate) verifier: Option<Verifier>,
    /// The publish API key, when one is configured.
    pub(crate) publish_key: Option<PublishKey>,
}

/// What the subscribers need around them in a worker: its one epoll set,
/// and its link to report channel interest on.
pub(crate) struct Around {
    pub(crate) poller: Poller,
    pub(crate) link: Rc<Link>,
}

impl Outside for Around {
    type Wire = TcpStream;

    fn watch(&self, wire: &TcpStream, slot: u32) -> io::Result<()> {
        self.poller.add(wire, u64::from(slot), Interest::Read)
    }

    fn want_write(&self, wire: &TcpStream, slot: u32, on: bool) {
        let interest = if on {
            Interest::ReadWrite
        } else {
            Interest::Read
        };
        let _ = self.poller.modify(wire, u64::from(slot), interest);
    }

    fn forget(&self, wire: &TcpStream) {
        let _ = self.poller.remove(wire);
    }

    fn channel_interest(&self, channel: &str, subscribed: bool) {
        self.link.interest(channel, subscribed);
    }
}
