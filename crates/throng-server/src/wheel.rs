//! The worker's one coarse timer: a clock that counts ticks and a sweep that
//! visits a slice of the connection table on each tick, so every connection
//! is visited once per ping interval without a timer of its own.
//!
//! A connection costs the wheel nothing: it is visited by its index in the
//! worker's table, and its deadlines are computed from one `u32` (the tick it
//! was last heard from).

use std::ops::Range;
use std::time::Duration;

/// How often the worker's clock ticks.
pub const TICK: Duration = Duration::from_millis(100);

/// Whole ticks in `d`, at least 1.
pub fn ticks(d: Duration) -> u32 {
    let t = d.as_nanos() / TICK.as_nanos();
    u32::try_from(t).unwrap_or(u32::MAX).max(1)
}

/// Walks a table of `len` slots in `slots` steps: one step per tick, the
/// whole table once per period. Pings and idle checks are spread evenly over
/// the period instead of all firing at once.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Steps per period (ticks in the ping interval).
    slots: u32,
    /// The next step, `0..slots`.
    cursor: u32,
}

impl Sweep {
    /// A sweep covering the table once per `period`.
    pub fn new(period: Duration) -> Self {
        Self {
            slots: ticks(period),
            cursor: 0,
        }
    }

    /// The indices to visit on this tick for a table of `len` slots, and
    /// advances. Over `slots` consecutive calls with the same `len`, every
    /// index is returned exactly once.
    pub fn step(&mut self, len: usize) -> Range<usize> {
        let slots = self.slots as usize;
        let c = self.cursor as usize;
        self.cursor = (self.cursor + 1) % self.slots;
        (c * len / slots)..((c + 1) * len / slots)
    }
}

/// Whether a connection last heard from at tick `last` has been silent for
/// `limit` ticks at tick `now` (wrap-safe).
pub fn expired(now: u32, last: u32, limit: u32) -> bool {
    now.wrapping_sub(last) >= limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_once_per_period() {
        for (period_ms, len) in [
            (100, 7),
            (1000, 0),
            (1000, 3),
            (1000, 10),
            (30_000, 18_000),
            (2500, 1001),
        ] {
            let mut s = Sweep::new(Duration::from_millis(period_ms));
            let mut seen = vec![0u32; len];
            for _ in 0..ticks(Duration::from_millis(period_ms)) {
                for i in s.step(len) {
                    seen[i] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "period {period_ms} len {len}");
            // The next period starts over at the front.
            let next = s.step(len.max(1) * 1000);
            assert_eq!(next.start, 0);
        }
    }

    #[test]
    fn ping_load_is_spread() {
        let mut s = Sweep::new(Duration::from_secs(30));
        let sizes: Vec<usize> = (0..300).map(|_| s.step(18_000).len()).collect();
        assert!(sizes.iter().all(|&n| n == 60), "{sizes:?}");
    }

    #[test]
    fn ticks_and_expiry() {
        assert_eq!(ticks(Duration::from_secs(30)), 300);
        assert_eq!(ticks(Duration::from_millis(1)), 1);
        assert!(expired(10, 5, 5));
        assert!(!expired(10, 6, 5));
        assert!(expired(3, u32::MAX - 1, 5));
        assert!(!expired(2, u32::MAX - 1, 5));
    }
}
