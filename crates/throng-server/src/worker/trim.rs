//! Gives the allocator's free memory back after a burst of new connections.
//!
//! A connection costs its handshake task (~2 KB) only while it upgrades, but
//! a storm of them (`throng bench --rate 40000/s`, clients reconnecting after
//! a restart) has thousands of such tasks at once, and glibc keeps the heap
//! they grew: 100,000 idle subscribers connected at ~15,000/s read 588 B each
//! in serve's RSS against ~160 B at 10,000/s. Once connections stop coming
//! for a second, the worker trims its heap, once per burst.

/// When to trim: the worker's accepted-connections count, read twice a
/// second, has grown and then stood still for [`QUIET_READINGS`] readings.
#[derive(Debug, Default)]
pub(super) struct AfterBurst {
    /// The count at the last reading.
    seen: u64,
    /// Readings since it last changed, while a trim is owed.
    quiet: u32,
    /// Connections came since the last trim.
    owed: bool,
}

/// Readings (half a second apart) without a new connection before a trim.
const QUIET_READINGS: u32 = 2;

impl AfterBurst {
    /// Takes a reading of the accepted count; true when the heap should be
    /// trimmed now.
    pub(super) fn due(&mut self, accepted: u64) -> bool {
        if accepted != self.seen {
            self.seen = accepted;
            self.quiet = 0;
            self.owed = true;
            return false;
        }
        if !self.owed {
            return false;
        }
        self.quiet += 1;
        if self.quiet < QUIET_READINGS {
            return false;
        }
        self.owed = false;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_a_second_after_the_connections_stop() {
        let mut t = AfterBurst::default();
        // Nothing came: nothing to give back.
        assert!(!t.due(0));
        assert!(!t.due(0));
        // A burst, still going.
        assert!(!t.due(5_000));
        assert!(!t.due(12_000));
        // Quiet for one reading, then a second: trim, once.
        assert!(!t.due(12_000));
        assert!(t.due(12_000));
        assert!(!t.due(12_000));
        assert!(!t.due(12_000));
        // One more connection owes another trim, a second later.
        assert!(!t.due(12_001));
        assert!(!t.due(12_001));
        assert!(t.due(12_001));
    }
}
