//! What one worker owns, shared by its tasks (the control loop, the
//! accept loops, the epoll reactor, the tick, one task per HTTP
//! connection): its settings, counters, subscribers and supervisor link.
//! Nothing here is shared between threads or locked.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::rc::Rc;

use throng_host::poll::{Interest, Poller};
use tokio::sync::Notify;

use super::link::Link;
use super::sleepers::Sleepers;
use super::subscribers::{Outside, Subscribers};
use crate::config::Config;
use crate::control::Message;
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
    /// Messages counted and answered for, still to be written (in order).
    pub(crate) outbox: RefCell<VecDeque<Message>>,
    /// Wakes the fan-out task when `outbox` gains a message.
    pub(crate) outbox_ready: Notify,
    /// `/ping` connections sleeping outside their task.
    pub(crate) sleepers: Sleepers,
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
