//! The pacer: when event `i` of an open-model schedule is *meant* to start.
//!
//! An open-model load generator fixes its schedule in advance: event `i`
//! (a connection, a request, a publish) is due at `start + pacer.intended(i)`
//! however the system under test behaves. The caller waits until that
//! moment, starts the event, and measures latency from the intended time, so
//! a stalled server cannot hide its stall by slowing the generator down (no
//! coordinated omission). When the caller itself falls behind, the difference
//! `actual - intended` is its *lag*: report it (see [`lag`]) rather than
//! silently sending less.
//!
//! The pacer has no clock and no I/O: it maps event indices to offsets from
//! the start and back. Two shapes are supported:
//!
//! - constant: `r` events per second, event `i` at `i / r`;
//! - linear ramp: the rate grows from `a` to `b` per second over `T`, then
//!   stays at `b`. The number of events due by `t` is the integral of the
//!   rate, `a·t + (b-a)·t²/(2T)`, and the intended time of event `i` solves
//!   that for `t`.
//!
//! ```
//! use std::time::Duration;
//! use throng_load::pacer::{Pacer, RateSpec};
//!
//! let spec: RateSpec = "100/s..5000/s".parse().unwrap();
//! // A ramp that covers 10,000 events exactly.
//! let pacer = Pacer::for_count(spec, 10_000).unwrap();
//! assert_eq!(pacer.intended(0), Duration::ZERO);
//! assert!(pacer.intended(9_999) <= pacer.span(10_000));
//! ```

use std::time::Duration;

use thiserror::Error;
pub use throng_host::units::RateSpec;

/// Why a pacer could not be made (a rate's text is parsed, and refused, by
/// [`throng_host::units`]).
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum PacerError {
    /// A rate of zero, negative, or not finite.
    #[error("rate must be a positive finite number of events per second, not {0}")]
    NotPositive(f64),
    /// A ramp needs a positive span (duration or event count).
    #[error("a ramp needs a positive duration or event count")]
    EmptyRamp,
}

fn check_rate(r: f64) -> Result<(), PacerError> {
    if r.is_finite() && r > 0.0 {
        Ok(())
    } else {
        Err(PacerError::NotPositive(r))
    }
}

/// Maps event indices to intended start offsets for a constant rate or a
/// linear ramp. Pure arithmetic: cheap to copy and to call per event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacer {
    /// Starting rate, events per second (> 0).
    from: f64,
    /// Rate at and after the end of the ramp, events per second (> 0).
    to: f64,
    /// Length of the ramp, seconds; 0 for a constant rate.
    ramp_secs: f64,
}

impl Pacer {
    /// A constant rate of `per_sec` events per second.
    pub fn constant(per_sec: f64) -> Result<Self, PacerError> {
        check_rate(per_sec)?;
        Ok(Self {
            from: per_sec,
            to: per_sec,
            ramp_secs: 0.0,
        })
    }

    /// A linear ramp from `from` to `to` events per second over `over`, then
    /// constant at `to`.
    pub fn ramp(from: f64, to: f64, over: Duration) -> Result<Self, PacerError> {
        check_rate(from)?;
        check_rate(to)?;
        if over.is_zero() {
            return Err(PacerError::EmptyRamp);
        }
        Ok(Self {
            from,
            to,
            ramp_secs: over.as_secs_f64(),
        })
    }

    /// The pacer for `spec` when the run has a known length (`attack
    /// --duration`): a ramp spans the whole duration.
    pub fn for_duration(spec: RateSpec, duration: Duration) -> Result<Self, PacerError> {
        match spec {
            RateSpec::Constant(r) => Self::constant(r),
            RateSpec::Ramp(a, b) => Self::ramp(a, b, duration),
        }
    }

    /// The pacer for `spec` when the run has a known number of events (`hold
    /// --connections N`): a ramp ends exactly as event `count` is due, i.e.
    /// its length is `2·count / (a + b)`.
    pub fn for_count(spec: RateSpec, count: u64) -> Result<Self, PacerError> {
        match spec {
            RateSpec::Constant(r) => Self::constant(r),
            RateSpec::Ramp(a, b) => {
                if count == 0 {
                    return Err(PacerError::EmptyRamp);
                }
                let secs = 2.0 * count as f64 / (a + b);
                Self::ramp(a, b, Duration::from_secs_f64(secs))
            }
        }
    }

    /// The rate at offset `t`, events per second.
    pub fn rate_at(&self, t: Duration) -> f64 {
        let t = t.as_secs_f64();
        if t >= self.ramp_secs {
            self.to
        } else {
            self.from + (self.to - self.from) * t / self.ramp_secs
        }
    }

    /// Events due in `[0, t]`, as a real number (the integral of the rate).
    fn due_f(&self, t: f64) -> f64 {
        if t <= self.ramp_secs {
            self.from * t + (self.to - self.from) * t * t / (2.0 * self.ramp_secs)
        } else {
            let at_end = (self.from + self.to) * self.ramp_secs / 2.0;
            at_end + self.to * (t - self.ramp_secs)
        }
    }

    /// The offset from the start at which event `i` (0-based) is meant to
    /// start. Event 0 is due at once; the offsets never decrease with `i`.
    pub fn intended(&self, i: u64) -> Duration {
        let i = i as f64;
        let at_end = (self.from + self.to) * self.ramp_secs / 2.0;
        let secs = if i >= at_end {
            self.ramp_secs + (i - at_end) / self.to
        } else {
            // Solve from·t + k/2·t² = i for t, k = (to - from) / T. Written in
            // the form 2i / (from + sqrt(from² + 2ki)), which stays exact as
            // k approaches 0 and never divides by k.
            let k = (self.to - self.from) / self.ramp_secs;
            let disc = (self.from * self.from + 2.0 * k * i).max(0.0);
            2.0 * i / (self.from + disc.sqrt())
        };
        Duration::from_secs_f64(secs.max(0.0))
    }

    /// How many events are due by offset `t` (those with `intended(i) <= t`).
    /// A loop that wakes up late starts all of them at once and reports lag.
    pub fn due(&self, t: Duration) -> u64 {
        // The float integral may sit a hair under an integer; nudge it, then
        // correct with `intended`, which is what callers compare against.
        let mut n = (self.due_f(t.as_secs_f64()) + 1e-9).floor() as u64 + 1;
        while n > 0 && self.intended(n - 1) > t {
            n -= 1;
        }
        while self.intended(n) <= t {
            n += 1;
        }
        n
    }

    /// The time from the first to the last of `count` events (the schedule's
    /// length): `intended(count - 1)`, zero for 0 or 1 events.
    pub fn span(&self, count: u64) -> Duration {
        if count == 0 {
            Duration::ZERO
        } else {
            self.intended(count - 1)
        }
    }
}

/// `actual - intended`, or zero when the event started early or on time: how
/// far behind its schedule the caller was.
pub fn lag(intended: Duration, actual: Duration) -> Duration {
    actual.saturating_sub(intended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_rate_spaces_events_evenly() {
        let p = Pacer::constant(1000.0).unwrap();
        assert_eq!(p.intended(0), Duration::ZERO);
        assert_eq!(p.intended(1), Duration::from_millis(1));
        assert_eq!(p.intended(1500), Duration::from_millis(1500));
        assert_eq!(p.span(1001), Duration::from_secs(1));
        assert_eq!(p.due(Duration::ZERO), 1);
        assert_eq!(p.due(Duration::from_micros(999)), 1);
        assert_eq!(p.due(Duration::from_millis(1)), 2);
        assert_eq!(p.due(Duration::from_secs(1)), 1001);
    }

    #[test]
    fn ramp_matches_its_integral() {
        // 100/s rising to 300/s over 10 s: 2000 events in the ramp.
        let p = Pacer::ramp(100.0, 300.0, Duration::from_secs(10)).unwrap();
        let end = p.intended(2000).as_secs_f64();
        assert!((end - 10.0).abs() < 1e-6, "{end}");
        // Past the ramp: 300/s.
        let after = p.intended(2300).as_secs_f64();
        assert!((after - 11.0).abs() < 1e-6, "{after}");
        // Half-way in time, rate 200/s, due = 100·5 + 200/(20)·25 = 750.
        assert_eq!(p.due(Duration::from_secs(5)), 751);
        assert!((p.rate_at(Duration::from_secs(5)) - 200.0).abs() < 1e-9);
    }

    #[test]
    fn down_ramp_works_too() {
        let p = Pacer::ramp(500.0, 100.0, Duration::from_secs(4)).unwrap();
        // (500 + 100) / 2 · 4 = 1200 events over the ramp.
        let end = p.intended(1200).as_secs_f64();
        assert!((end - 4.0).abs() < 1e-6, "{end}");
    }

    #[test]
    fn intended_never_decreases_and_due_inverts_it() {
        for p in [
            Pacer::constant(7.0).unwrap(),
            Pacer::ramp(100.0, 5000.0, Duration::from_secs(3)).unwrap(),
            Pacer::ramp(5000.0, 10.0, Duration::from_millis(700)).unwrap(),
            Pacer::for_count(RateSpec::Ramp(1.0, 1.0), 50).unwrap(),
        ] {
            let mut last = Duration::ZERO;
            for i in 0..20_000 {
                let t = p.intended(i);
                assert!(t >= last, "{p:?}: event {i} at {t:?} before {last:?}");
                last = t;
                assert!(p.due(t) > i, "{p:?}: due({t:?}) = {} <= {i}", p.due(t));
            }
        }
    }

    #[test]
    fn ramp_for_count_ends_with_the_last_event() {
        let p = Pacer::for_count(RateSpec::Ramp(100.0, 5000.0), 10_000).unwrap();
        let ramp_end = 2.0 * 10_000.0 / 5100.0;
        let last = p.span(10_000).as_secs_f64();
        assert!(
            last <= ramp_end + 1e-9 && last > ramp_end - 0.001,
            "{last} vs {ramp_end}"
        );
        assert!((p.rate_at(p.span(10_000)) - 5000.0).abs() < 1.0);
    }

    #[test]
    fn refuses_empty_ramps() {
        assert_eq!(
            Pacer::for_count(RateSpec::Ramp(1.0, 2.0), 0),
            Err(PacerError::EmptyRamp)
        );
        assert_eq!(
            Pacer::ramp(1.0, 2.0, Duration::ZERO),
            Err(PacerError::EmptyRamp)
        );
        assert!(Pacer::constant(0.0).is_err());
    }

    #[test]
    fn lag_is_never_negative() {
        assert_eq!(
            lag(Duration::from_millis(5), Duration::from_millis(3)),
            Duration::ZERO
        );
        assert_eq!(
            lag(Duration::from_millis(5), Duration::from_millis(8)),
            Duration::from_millis(3)
        );
    }
}
