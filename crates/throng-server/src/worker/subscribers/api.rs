//! What the server API asks of a worker's subscriber tables
//! (docs/api.md): a page of its channels with their subscriber counts,
//! and closing every subscriber of one channel. Kept apart from the
//! delivery paths: nothing here runs per message.

use std::rc::Rc;

use super::{Outside, Subscribers};
use crate::metrics::CloseReason;
use crate::worker::conn::Conn;

impl<O: Outside> Subscribers<O> {
    /// The channels here whose name starts with `prefix` and sorts after
    /// `after`, with their subscribers (those of exactly that name), sorted
    /// by name: the first `take` of them.
    pub(crate) fn channel_page(
        &self,
        prefix: &str,
        after: &str,
        take: usize,
    ) -> Vec<(String, u64)> {
        let channels = self.channels.borrow();
        let mut page: Vec<(&str, u64)> = channels
            .iter()
            .filter(|(name, _)| name.starts_with(prefix) && *name > after)
            .map(|(name, ch)| (name, ch.len() as u64))
            .collect();
        // Only the first `take` names are sorted: a node with a million
        // channels pages through them without sorting all each time.
        if page.len() > take && take > 0 {
            page.select_nth_unstable(take - 1);
        }
        page.truncate(take);
        page.sort_unstable();
        page.into_iter().map(|(n, c)| (n.to_owned(), c)).collect()
    }

    /// Closes every subscriber of `channel` here (WebSocket: a close frame
    /// with `code` and `reason`; SSE: the stream ends; MQTT 5.0: a
    /// DISCONNECT, Administrative action). Returns how many.
    pub(crate) fn close_channel(&self, channel: &str, code: u16, reason: &str) -> u64 {
        let conns: Vec<Rc<Conn<O::Wire>>> = match self.channels.borrow().get(channel) {
            Some(ch) => ch
                .subs
                .iter()
                .cloned()
                .chain(ch.mqtt.iter().map(|(c, _, _)| c.clone()))
                .collect(),
            None => Vec::new(),
        };
        for c in &conns {
            self.close(c, code, reason, CloseReason::Disconnected);
        }
        conns.len() as u64
    }
}
