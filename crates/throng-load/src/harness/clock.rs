//! The harness's one clock. Records, schedules and intervals are in
//! wall-clock ns since the Unix epoch, because they cross processes (and
//! later machines); waiting is on this process's monotonic `Instant`. An
//! [`Anchor`] is one moment known both ways, so a schedule the supervisor
//! fixed in wall-clock time is waited for on the monotonic clock.

use std::time::{Duration, Instant};

/// Wall-clock time, ns since the Unix epoch.
pub fn now_unix_ns() -> u64 {
    throng_host::sample::now_ns()
}

/// `d` in whole µs, the unit of every histogram (saturating).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// `d` in ns (saturating).
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `d` in ms (saturating), as worker plans carry timeouts.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The start of the interval of `length_ns` that holds `unix_ns`: intervals
/// are aligned on wall-clock time, so every worker's records line up.
pub fn interval_start(unix_ns: u64, length_ns: u64) -> u64 {
    let length = length_ns.max(1);
    unix_ns / length * length
}

/// A worker ready after its schedule's start (sending and parsing a large
/// plan, or starting a slow build, can take longer than the lead the
/// supervisor gave): moves the start to now, so that the worker still sends
/// for its whole duration at its planned pace, instead of silently losing
/// the time (a shorter window) or bursting to catch up. Returns how late it
/// was, ns; the worker says so (`worker.late`).
pub fn start_late(start_unix_ns: &mut u64) -> Option<u64> {
    let now = now_unix_ns();
    let late = now.checked_sub(*start_unix_ns).filter(|&l| l > 0)?;
    *start_unix_ns = now;
    Some(late)
}

/// One moment as wall-clock ns and as an `Instant` of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    at: Instant,
    unix_ns: u64,
}

impl Anchor {
    /// The moment `unix_ns` (past or future) on this process's monotonic clock.
    pub fn at_unix_ns(unix_ns: u64) -> Self {
        let now_ns = now_unix_ns();
        let now = Instant::now();
        let at = if unix_ns >= now_ns {
            now + Duration::from_nanos(unix_ns - now_ns)
        } else {
            now.checked_sub(Duration::from_nanos(now_ns - unix_ns))
                .unwrap_or(now)
        };
        Self { at, unix_ns }
    }

    /// The moment on the monotonic clock.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// The moment in wall-clock ns.
    pub fn unix_ns(&self) -> u64 {
        self.unix_ns
    }

    /// Wall-clock ns of `at`, counted from this anchor (so that one
    /// process's times stay monotonic even if the wall clock steps).
    pub fn unix_ns_of(&self, at: Instant) -> u64 {
        if at >= self.at {
            self.unix_ns.saturating_add(nanos(at - self.at))
        } else {
            self.unix_ns.saturating_sub(nanos(self.at - at))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchor_converts_both_ways() {
        let soon = now_unix_ns() + 2_000_000_000;
        let a = Anchor::at_unix_ns(soon);
        assert!(a.instant() > Instant::now() + Duration::from_secs(1));
        let later = a.instant() + Duration::from_millis(5);
        assert_eq!(a.unix_ns_of(later), soon + 5_000_000);
        assert_eq!(
            a.unix_ns_of(a.instant() - Duration::from_millis(5)),
            soon - 5_000_000
        );
        assert_eq!(interval_start(1_999_999_999, 1_000_000_000), 1_000_000_000);
    }

    #[test]
    fn a_start_already_past_moves_to_now_and_says_how_late() {
        let mut ahead = now_unix_ns() + 60_000_000_000;
        let planned = ahead;
        assert_eq!(start_late(&mut ahead), None);
        assert_eq!(ahead, planned);
        let past = now_unix_ns() - 1_500_000_000;
        let mut start = past;
        let late = start_late(&mut start).expect("late");
        assert!(late >= 1_500_000_000);
        assert_eq!(start, past + late);
    }
}
