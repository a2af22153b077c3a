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
//! the start and back. The shapes:
//!
//! - constant: `r` events per second, event `i` at `i / r`;
//! - linear ramp: the rate grows from `a` to `b` per second over `T`, then
//!   stays at `b`. The number of events due by `t` is the integral of the
//!   rate, `a·t + (b-a)·t²/(2T)`, and the intended time of event `i` solves
//!   that for `t`;
//! - stages: constant rates and ramps one after another, each for its own
//!   time (`0/s..1000/s@30s,1000/s@5m,1000/s..0/s@30s`); event `i` falls in
//!   the stage whose events (the integral of its rate, added to those of
//!   the stages before) reach past `i`, and is solved within it as above, so
//!   the schedule stays exact across stage boundaries and from a rate of 0.
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
use throng_host::units::fmt_duration;
pub use throng_host::units::{MAX_STAGES, RateSpec, Stages};

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

/// One piece of a schedule: the rate goes linearly from `from` to `to` over
/// `secs` (infinite for the open end of a constant rate or a ramp), starting
/// at offset `t0` with `e0` events already due before it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Piece {
    from: f64,
    to: f64,
    secs: f64,
    t0: f64,
    e0: f64,
}

impl Piece {
    /// Events due within the piece (infinite for an open end).
    fn events(&self) -> f64 {
        if self.secs.is_infinite() {
            f64::INFINITY
        } else {
            (self.from + self.to) * self.secs / 2.0
        }
    }

    /// Events due in its first `tau` seconds (the integral of the rate).
    fn due_in(&self, tau: f64) -> f64 {
        if self.secs.is_infinite() {
            return self.from * tau;
        }
        self.from * tau + (self.to - self.from) * tau * tau / (2.0 * self.secs)
    }

    /// The offset into the piece at which its `j`-th event (real) is due.
    fn solve(&self, j: f64) -> f64 {
        if j <= 0.0 {
            return 0.0;
        }
        if self.secs.is_infinite() || self.from == self.to {
            return j / self.from;
        }
        // Solve from·t + k/2·t² = j for t, k = (to - from) / T. Written in
        // the form 2j / (from + sqrt(from² + 2kj)), which stays exact as k
        // approaches 0, never divides by k, and holds from a rate of 0.
        let k = (self.to - self.from) / self.secs;
        let disc = (self.from * self.from + 2.0 * k * j).max(0.0);
        (2.0 * j / (self.from + disc.sqrt())).min(self.secs)
    }
}

/// Maps event indices to intended start offsets for a constant rate, a
/// linear ramp, or stages of them (each piece exact: its events are the
/// integral of its rate). Pure arithmetic: cheap to copy and to call per
/// event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacer {
    /// The pieces, in time order; the last may be open-ended.
    pieces: [Piece; MAX_STAGES + 1],
    len: u8,
}

impl Pacer {
    /// Pieces of `(from, to, secs)` one after another, then `tail` events
    /// per second for ever (none when 0).
    fn of_pieces(list: &[(f64, f64, f64)], tail: f64) -> Self {
        let mut pieces = [Piece::default(); MAX_STAGES + 1];
        let (mut t0, mut e0, mut n) = (0.0, 0.0, 0usize);
        for &(from, to, secs) in list.iter().take(MAX_STAGES) {
            pieces[n] = Piece {
                from,
                to,
                secs,
                t0,
                e0,
            };
            t0 += secs;
            e0 += pieces[n].events();
            n += 1;
        }
        if tail > 0.0 {
            pieces[n] = Piece {
                from: tail,
                to: tail,
                secs: f64::INFINITY,
                t0,
                e0,
            };
            n += 1;
        }
        Self {
            pieces,
            // Invariant: at most MAX_STAGES + 1 (17) pieces.
            len: u8::try_from(n).unwrap_or(u8::MAX),
        }
    }

    fn pieces(&self) -> &[Piece] {
        &self.pieces[..usize::from(self.len)]
    }

    /// A constant rate of `per_sec` events per second.
    pub fn constant(per_sec: f64) -> Result<Self, PacerError> {
        check_rate(per_sec)?;
        Ok(Self::of_pieces(&[], per_sec))
    }

    /// A linear ramp from `from` to `to` events per second over `over`, then
    /// constant at `to`.
    pub fn ramp(from: f64, to: f64, over: Duration) -> Result<Self, PacerError> {
        check_rate(from)?;
        check_rate(to)?;
        if over.is_zero() {
            return Err(PacerError::EmptyRamp);
        }
        Ok(Self::of_pieces(&[(from, to, over.as_secs_f64())], to))
    }

    /// Stages one after another ([`RateSpec::Stages`]), then nothing more
    /// (when the last ends at 0/s) or its last rate for ever: the run's
    /// duration or count ends it.
    pub fn stages(stages: &Stages) -> Self {
        let list: Vec<(f64, f64, f64)> = stages
            .stages()
            .iter()
            .map(|s| (s.from, s.to, s.secs))
            .collect();
        let tail = stages.stages().last().map_or(0.0, |s| s.to);
        Self::of_pieces(&list, tail)
    }

    /// The pacer for `spec` when the run has a known length (`attack
    /// --duration`): a ramp spans the whole duration; stages keep their own times.
    pub fn for_duration(spec: RateSpec, duration: Duration) -> Result<Self, PacerError> {
        match spec {
            RateSpec::Constant(r) => Self::constant(r),
            RateSpec::Ramp(a, b) => Self::ramp(a, b, duration),
            RateSpec::Stages(s) => Ok(Self::stages(&s)),
        }
    }

    /// The pacer for `spec` when the run has a known number of events (`hold
    /// --connections N`): a ramp ends exactly as event `count` is due, i.e.
    /// its length is `2·count / (a + b)`; stages keep their own times.
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
            RateSpec::Stages(s) => Ok(Self::stages(&s)),
        }
    }

    /// The piece that holds offset `t` (seconds), if any.
    fn piece_at(&self, t: f64) -> Option<&Piece> {
        self.pieces()
            .iter()
            .find(|p| t >= p.t0 && t - p.t0 < p.secs)
    }

    /// The rate at offset `t`, events per second (0 past the last stage).
    pub fn rate_at(&self, t: Duration) -> f64 {
        let t = t.as_secs_f64();
        self.piece_at(t).map_or(0.0, |p| {
            if p.secs.is_infinite() {
                p.from
            } else {
                p.from + (p.to - p.from) * (t - p.t0) / p.secs
            }
        })
    }

    /// Events due in `[0, t]`, as a real number (the integral of the rate).
    fn due_f(&self, t: f64) -> f64 {
        match self.piece_at(t) {
            Some(p) => p.e0 + p.due_in(t - p.t0),
            None => self
                .pieces()
                .last()
                .map_or(0.0, |p| if t < p.t0 { 0.0 } else { p.e0 + p.events() }),
        }
    }

    /// The offset from the start at which event `i` (0-based) is meant to
    /// start. Event 0 is due at once; the offsets never decrease with `i`.
    /// An event past the end of the last stage is never due (`Duration::MAX`).
    pub fn intended(&self, i: u64) -> Duration {
        let i = i as f64;
        for p in self.pieces() {
            // A piece without events (a pause at 0/s) holds none of them.
            if i < p.e0 + p.events() {
                let secs = p.t0 + p.solve(i - p.e0);
                return Duration::from_secs_f64(secs.max(0.0));
            }
        }
        Duration::MAX
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

/// The plan of `stages`, one start line each: its rates, when it runs and
/// how many `noun` (requests, connections) it plans.
pub fn stage_lines(stages: &Stages, noun: &str) -> Vec<String> {
    let n = stages.stages().len();
    let mut at = 0.0;
    let mut out = Vec::with_capacity(n);
    for (i, s) in stages.stages().iter().enumerate() {
        let span = |secs: f64| fmt_duration(Duration::from_secs_f64(secs));
        let rates = if s.from == s.to {
            format!("{}/s", s.from)
        } else {
            format!("{}/s..{}/s", s.from, s.to)
        };
        out.push(format!(
            "  stage {}/{n}: {rates} for {} (from {} to {}): {} {noun}",
            i + 1,
            span(s.secs),
            span(at),
            span(at + s.secs),
            s.events().floor()
        ));
        at += s.secs;
    }
    out
}

/// The stage (1-based) that holds offset `t`, and how many there are;
/// `None` past the last.
pub fn stage_at(stages: &Stages, t: Duration) -> Option<(usize, usize)> {
    let t = t.as_secs_f64();
    let mut end = 0.0;
    let n = stages.stages().len();
    stages.stages().iter().enumerate().find_map(|(i, s)| {
        end += s.secs;
        (t < end).then_some((i + 1, n))
    })
}

/// What a progress line says of the stages `elapsed_s` into the schedule:
/// `  stage 2/3 1000/s`, or that they are over.
pub fn stage_note(stages: &Stages, pacer: &Pacer, elapsed_s: f64) -> String {
    let t = Duration::from_secs_f64(elapsed_s.max(0.0));
    match stage_at(stages, t) {
        Some((k, n)) => format!("  stage {k}/{n} {:.0}/s", pacer.rate_at(t)),
        None => "  stages over".to_owned(),
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

    fn stages(text: &str) -> Pacer {
        Pacer::for_duration(text.parse().unwrap(), Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn stages_send_times_follow_each_stage() {
        // 0 → 100/s over 10 s (500 events), 100/s for 5 s (500), 100 → 0/s
        // over 10 s (500).
        let p = stages("0/s..100/s@10s,100/s@5s,100/s..0/s@10s");
        assert_eq!(p.intended(0), Duration::ZERO);
        // In the up ramp, events due by t are 5·t²: event 5 at 1 s, 20 at 2 s.
        let at = |i: u64| p.intended(i).as_secs_f64();
        assert!((at(5) - 1.0).abs() < 1e-9, "{}", at(5));
        assert!((at(20) - 2.0).abs() < 1e-9, "{}", at(20));
        // The up ramp ends as event 500 is due, at 10 s; the plateau spaces them 10 ms.
        assert!((at(500) - 10.0).abs() < 1e-9, "{}", at(500));
        assert!((at(501) - 10.01).abs() < 1e-9, "{}", at(501));
        assert!((at(999) - 14.99).abs() < 1e-9, "{}", at(999));
        assert!((at(1000) - 15.0).abs() < 1e-9, "{}", at(1000));
        // The down ramp: 100·τ - 5·τ² events after 15 s; event 1095 at τ = 1.
        assert!((at(1095) - 16.0).abs() < 1e-9, "{}", at(1095));
        // 1500 events in all, the last before 25 s; none after.
        assert!(at(1499) < 25.0 && at(1499) > 24.0, "{}", at(1499));
        assert_eq!(p.intended(1500), Duration::MAX);
        assert_eq!(p.due(Duration::from_secs(3600)), 1500);
        assert_eq!(p.due(Duration::from_secs(10)), 501);
        assert!((p.rate_at(Duration::from_secs(5)) - 50.0).abs() < 1e-9);
        assert!((p.rate_at(Duration::from_secs(12)) - 100.0).abs() < 1e-9);
        assert!((p.rate_at(Duration::from_secs(20)) - 50.0).abs() < 1e-9);
        assert_eq!(p.rate_at(Duration::from_secs(26)), 0.0);
    }

    #[test]
    fn a_pause_and_a_last_rate_that_goes_on() {
        // 10/s for 1 s, nothing for 2 s, then 20/s for 1 s and on.
        let p = stages("10/s@1s,0/s@2s,20/s@1s");
        let at = |i: u64| p.intended(i).as_secs_f64();
        assert!((at(9) - 0.9).abs() < 1e-9);
        // Event 10 waits out the pause.
        assert!((at(10) - 3.0).abs() < 1e-9, "{}", at(10));
        assert!((at(11) - 3.05).abs() < 1e-9, "{}", at(11));
        // Past the stages the last rate goes on (a duration ends the run).
        assert!((at(40) - 4.5).abs() < 1e-9, "{}", at(40));
        assert_eq!(p.due(Duration::from_millis(2500)), 10);
    }

    #[test]
    fn stages_never_go_back_and_due_inverts_intended() {
        for text in [
            "0/s..1000/s@3s,1000/s@2s,1000/s..0/s@3s",
            "5/s@1s,0/s@1s,0/s..50/s@2s,50/s..7/s@1s",
            "1k/s..10/s@700ms",
        ] {
            let p = stages(text);
            let mut last = Duration::ZERO;
            for i in 0..20_000 {
                let t = p.intended(i);
                if t == Duration::MAX {
                    break;
                }
                assert!(t >= last, "{text}: event {i} at {t:?} before {last:?}");
                last = t;
                assert!(p.due(t) > i, "{text}: due({t:?}) = {} <= {i}", p.due(t));
            }
        }
    }

    #[test]
    fn stage_lines_and_where_a_time_falls() {
        let RateSpec::Stages(st) = "0/s..1000/s@30s,1000/s@5m,1000/s..0/s@30s".parse().unwrap()
        else {
            unreachable!()
        };
        let lines = stage_lines(&st, "requests");
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            "  stage 1/3: 0/s..1000/s for 30s (from 0s to 30s): 15000 requests"
        );
        assert_eq!(
            lines[1],
            "  stage 2/3: 1000/s for 5m (from 30s to 5m30s): 300000 requests"
        );
        assert_eq!(stage_at(&st, Duration::from_secs(29)), Some((1, 3)));
        assert_eq!(stage_at(&st, Duration::from_secs(30)), Some((2, 3)));
        assert_eq!(stage_at(&st, Duration::from_secs(360)), None);
    }
}
