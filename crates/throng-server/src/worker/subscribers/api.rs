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
    /// DISCONNECT, Administrative action). A connection of several
    /// channels leaves only this one, told why (an event stream of several
    /// ends). Returns how many.
    pub(crate) fn close_channel(&self, channel: &str, code: u16, reason: &str) -> u64 {
        // Connections of several channels (this one kept as their own, or
        // not) leave it; the others close.
        let (many, conns): (Vec<Rc<Conn<O::Wire>>>, Vec<_>) =
            match self.channels.borrow().get(channel) {
                Some(ch) => ch
                    .subs
                    .iter()
                    .chain(ch.multi.iter().map(|(c, _)| c))
                    .cloned()
                    .chain(ch.mqtt.iter().map(|(c, _, _)| c.clone()))
                    .partition(|c| c.kind().is_multi()),
                None => Default::default(),
            };
        for c in &many {
            self.end_subscription(c, channel, reason);
        }
        for c in &conns {
            self.close(c, code, reason, CloseReason::Disconnected);
        }
        (conns.len() + many.len()) as u64
    }
}

#[cfg(test)]
mod tests {
    use crate::worker::pair::{Got, Pair};

    #[test]
    fn a_page_is_the_first_names_after_the_cursor_with_their_counts() {
        let mut p = Pair::defaults();
        for ch in ["b", "a", "a", "c", "ab", "d", "a"] {
            p.connect(ch);
        }
        let page = |prefix, after, take| p.subs.channel_page(prefix, after, take);
        let names = |v: Vec<(String, u64)>| {
            v.into_iter()
                .map(|(n, c)| format!("{n}={c}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(page("", "", 3)), ["a=3", "ab=1", "b=1"]);
        assert_eq!(names(page("", "ab", 2)), ["b=1", "c=1"]);
        assert_eq!(names(page("a", "", 10)), ["a=3", "ab=1"]);
        assert_eq!(names(page("", "d", 10)), Vec::<String>::new());
        assert_eq!(names(page("", "", 0)), Vec::<String>::new());
    }

    #[test]
    fn closing_a_channel_sends_its_subscribers_the_code_and_leaves_the_rest() {
        let mut p = Pair::defaults();
        let (a, b, c) = (p.connect("x"), p.connect("x"), p.connect("y"));
        assert_eq!(p.subs.close_channel("x", 4000, "revoked"), 2);
        assert_eq!(p.subs.close_channel("nobody", 4000, ""), 0);
        p.drive();
        for i in [a, b] {
            assert_eq!(
                p.clients[i].take(),
                [Got::Close(Some(4000), "revoked".into())]
            );
        }
        assert_eq!(p.clients[c].take(), []);
        assert_eq!(p.subs.subscribers_of("x"), 0);
        assert_eq!(p.subs.subscribers_of("y"), 1);
        let closed = p.counters().closed.borrow().get("api_disconnect").copied();
        assert_eq!(closed, Some(2));
    }
}
