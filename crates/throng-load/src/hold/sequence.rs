//! Loss, duplicate and order accounting of one subscriber. Every published
//! message carries a sequence number (1, 2, ... over the run), so a gap is
//! a loss, a repeat a duplicate and a step back a message out of order; at
//! the end of the run, the messages after the last one received are lost
//! too. A connection that opened after publishing began is not owed the
//! messages before its first.
//!
//! No I/O and no clock: the worker feeds it what arrives (`held`), the
//! tests feed it in memory.

/// What one held connection has received of the sequence (16 bytes per
/// held connection, so kept small).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequence {
    /// The highest sequence number received; 0 before the first.
    last: u64,
    /// When the connection opened, ns since the epoch.
    opened_ns: u64,
}

/// What one message meant for the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// A newer message than any before; `lost` were skipped to get here.
    Next {
        /// Messages that never arrived before this one.
        lost: u64,
    },
    /// The same message as the last one, again.
    Duplicate,
    /// An older message than the last one.
    OutOfOrder,
}

impl Sequence {
    /// A connection that opened at `opened_ns` and has received nothing yet.
    pub fn new(opened_ns: u64) -> Self {
        Self { last: 0, opened_ns }
    }

    /// The highest sequence number received; 0 before the first.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Message `seq` arrived; publishing began at `first_publish_ns` (0: not
    /// known yet).
    pub fn receive(&mut self, seq: u64, first_publish_ns: u64) -> Arrival {
        let last = self.last;
        if last == 0 {
            // The first message: a connection open before publishing began
            // should have received every message from 1.
            let lost = if self.open_before(first_publish_ns) {
                seq.saturating_sub(1)
            } else {
                0
            };
            self.last = seq;
            Arrival::Next { lost }
        } else if seq > last {
            self.last = seq;
            Arrival::Next {
                lost: seq - last - 1,
            }
        } else if seq == last {
            Arrival::Duplicate
        } else {
            Arrival::OutOfOrder
        }
    }

    /// The run ended after message `final_seq` was published: the messages
    /// this connection should have received after its last one, and did not.
    pub fn missing_at_end(&self, final_seq: u64, first_publish_ns: u64) -> u64 {
        if self.last > 0 {
            final_seq.saturating_sub(self.last)
        } else if self.open_before(first_publish_ns) {
            final_seq
        } else {
            0
        }
    }

    fn open_before(&self, first_publish_ns: u64) -> bool {
        first_publish_ns != 0 && self.opened_ns < first_publish_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Publishing began at 1000 ns; connections open at 500 (before) or 2000 (after).
    const PUBLISH: u64 = 1000;

    /// Feeds `seqs` to a connection opened at `opened`; the run ends after `last`.
    fn count(opened: u64, seqs: &[u64], last: u64) -> (u64, u64, u64) {
        let mut s = Sequence::new(opened);
        let (mut lost, mut dup, mut order) = (0, 0, 0);
        for &seq in seqs {
            match s.receive(seq, PUBLISH) {
                Arrival::Next { lost: n } => lost += n,
                Arrival::Duplicate => dup += 1,
                Arrival::OutOfOrder => order += 1,
            }
        }
        (lost + s.missing_at_end(last, PUBLISH), dup, order)
    }

    #[test]
    fn every_message_in_order_loses_nothing() {
        assert_eq!(count(500, &[1, 2, 3, 4], 4), (0, 0, 0));
    }

    #[test]
    fn gaps_are_losses() {
        assert_eq!(count(500, &[1, 2, 5, 6], 6), (2, 0, 0));
    }

    #[test]
    fn a_repeat_is_a_duplicate_and_a_step_back_is_out_of_order() {
        assert_eq!(count(500, &[1, 2, 2, 3], 3), (0, 1, 0));
        // 3 was skipped (lost) when 4 came, then came late: out of order.
        assert_eq!(count(500, &[1, 2, 4, 3], 4), (1, 0, 1));
    }

    #[test]
    fn the_tail_missing_at_the_end_is_lost() {
        assert_eq!(count(500, &[1, 2], 5), (3, 0, 0));
        // Open from the start, and not one message arrived.
        assert_eq!(count(500, &[], 5), (5, 0, 0));
    }

    #[test]
    fn a_connection_open_before_publishing_is_owed_every_message() {
        assert_eq!(count(500, &[3, 4], 4), (2, 0, 0));
    }

    #[test]
    fn a_connection_that_joined_late_is_owed_only_what_followed_its_first() {
        assert_eq!(count(2000, &[3, 4], 4), (0, 0, 0));
        assert_eq!(count(2000, &[3], 5), (2, 0, 0));
        assert_eq!(count(2000, &[], 5), (0, 0, 0));
    }

    #[test]
    fn before_the_publishing_time_is_known_nothing_is_owed() {
        let mut s = Sequence::new(500);
        assert_eq!(s.receive(3, 0), Arrival::Next { lost: 0 });
        assert_eq!(s.last(), 3);
        assert_eq!(Sequence::new(500).missing_at_end(5, 0), 0);
    }
}
