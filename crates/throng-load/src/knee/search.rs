//! The search for the knee as a state machine: no I/O, no clock. It says
//! which level to run next; the driver runs it and tells it what the run
//! showed; the tests drive it against targets made of arithmetic.
//!
//! 1. **Ramp**: geometric steps from `from` (× `factor` each) up to `to`,
//!    once each; a level that fails is run again (up to `repeat` times, a
//!    majority decides) before the ramp stops there, because one noisy
//!    run must not end it. A level that failed beyond doubt (stopped
//!    early) needs no second opinion.
//! 2. **Refinement**: bisection between the highest passing and the lowest
//!    failing level until they are within `precision` of each other.
//! 3. **Confirmation**: those two decisive levels are repeated until a
//!    majority of `repeat` runs agrees; a level that changes its mind moves
//!    the bracket and the bisection goes on.
//!
//! A level the generator could not drive (by a majority of its runs, as
//! for a failure) ends the search: nothing above it can be measured with
//! this generator.

use thiserror::Error;
use throng_report::knee::{Outcome, Phase};

/// How to search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchPlan {
    /// The first level.
    pub from: f64,
    /// The last level; never exceeded.
    pub to: f64,
    /// Each ramp level is the one before × this (> 1).
    pub factor: f64,
    /// The bisection stops once (failing − passing) / passing is this or less.
    pub precision: f64,
    /// Runs of a decisive level; a majority decides.
    pub repeat: u32,
    /// Levels are whole numbers (connections), not rates.
    pub whole: bool,
}

/// A plan that makes no search.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum SearchError {
    /// `--from` is not positive.
    #[error("--from must be more than zero")]
    From,
    /// `--from` is above `--to`.
    #[error("--from {from} is above --to {to}; give a range from low to high")]
    Range {
        /// `--from`.
        from: f64,
        /// `--to`.
        to: f64,
    },
    /// `--factor` is 1 or less.
    #[error("--factor {0} must be more than 1 (each ramp level is the one before times it)")]
    Factor(f64),
    /// `--precision` is not between 0 and 1.
    #[error("--precision {0} must be more than 0% and less than 100%")]
    Precision(f64),
    /// `--repeat` is zero.
    #[error("--repeat must be at least 1")]
    Repeat,
}

/// What the driver should do next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Run this level.
    Run {
        /// The level.
        level: f64,
        /// Why.
        phase: Phase,
    },
    /// The search is over.
    Done(Outcome),
}

/// What one run of a level showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The objective was met.
    Pass,
    /// The objective was missed; `clear`: beyond doubt (it was stopped
    /// early), so it needs no repeat.
    Fail {
        /// Failed beyond doubt.
        clear: bool,
    },
    /// The generator, not the target, fell behind.
    Generator,
}

/// The runs of one level so far.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tally {
    level: f64,
    passes: u32,
    fails: u32,
    generator: u32,
    clear_fail: bool,
}

/// What a majority of a level's runs showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decided {
    Pass,
    Fail,
    Generator,
}

/// Where a level stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Not run yet.
    Unknown,
    /// Run, no majority yet; `pass`: its runs lean that way.
    Leaning { pass: bool },
    /// A majority (or a clear failure) decided it.
    Decided(Decided),
}

impl Status {
    fn passes(self) -> bool {
        matches!(
            self,
            Self::Leaning { pass: true } | Self::Decided(Decided::Pass)
        )
    }

    fn fails(self) -> bool {
        matches!(
            self,
            Self::Leaning { pass: false } | Self::Decided(Decided::Fail | Decided::Generator)
        )
    }
}

/// The search.
#[derive(Debug, Clone)]
pub struct Search {
    plan: SearchPlan,
    /// The ramp's levels, from `from` up to `to` (which is last).
    ramp: Vec<f64>,
    tallies: Vec<Tally>,
}

impl Search {
    /// A search by `plan`, checked.
    pub fn new(plan: SearchPlan) -> Result<Self, SearchError> {
        if !(plan.from > 0.0 && plan.from.is_finite()) {
            return Err(SearchError::From);
        }
        if !(plan.to >= plan.from && plan.to.is_finite()) {
            return Err(SearchError::Range {
                from: plan.from,
                to: plan.to,
            });
        }
        if !(plan.factor > 1.0 && plan.factor.is_finite()) {
            return Err(SearchError::Factor(plan.factor));
        }
        if !(plan.precision > 0.0 && plan.precision < 1.0) {
            return Err(SearchError::Precision(plan.precision));
        }
        if plan.repeat == 0 {
            return Err(SearchError::Repeat);
        }
        let round = |v: f64| round_level(v, plan.whole);
        let (from, to) = (round(plan.from), round(plan.to).max(round(plan.from)));
        let mut ramp = vec![from];
        let mut next = from * plan.factor;
        while next < to {
            let r = round(next);
            // Rounding small whole levels may repeat one (1 × 1.2 is still 1).
            if ramp.last().is_some_and(|l| r > *l) {
                ramp.push(r);
            }
            next *= plan.factor;
        }
        if ramp.last().is_some_and(|l| *l < to) {
            ramp.push(to);
        }
        Ok(Self {
            plan,
            ramp,
            tallies: Vec::new(),
        })
    }

    /// The ramp's levels.
    pub fn ramp(&self) -> &[f64] {
        &self.ramp
    }

    /// Records what a run of `level` showed.
    pub fn record(&mut self, level: f64, seen: Seen) {
        let t = match self.tallies.iter_mut().find(|t| t.level == level) {
            Some(t) => t,
            None => {
                self.tallies.push(Tally {
                    level,
                    passes: 0,
                    fails: 0,
                    generator: 0,
                    clear_fail: false,
                });
                // Invariant: just pushed.
                self.tallies.last_mut().expect("a tally was just pushed")
            }
        };
        match seen {
            Seen::Pass => t.passes += 1,
            Seen::Fail { clear } => {
                t.fails += 1;
                t.clear_fail |= clear;
            }
            Seen::Generator => t.generator += 1,
        }
    }

    /// What to do next.
    pub fn next(&self) -> Step {
        if let Some(at) = self
            .tallies
            .iter()
            .filter(|t| self.status(t.level) == Status::Decided(Decided::Generator))
            .map(|t| t.level)
            .min_by(f64::total_cmp)
        {
            return Step::Done(Outcome::GeneratorSaturated {
                at,
                passed: self.highest_pass_below(at),
            });
        }
        // The ramp, until a level fails for sure.
        let mut failed_at = None;
        for &level in &self.ramp {
            match self.status(level) {
                Status::Unknown => {
                    return Step::Run {
                        level,
                        phase: Phase::Ramp,
                    };
                }
                Status::Leaning { pass: false } => {
                    return Step::Run {
                        level,
                        phase: Phase::Repeat,
                    };
                }
                Status::Decided(Decided::Fail | Decided::Generator) => {
                    failed_at = Some(level);
                    break;
                }
                Status::Leaning { pass: true } | Status::Decided(Decided::Pass) => {}
            }
        }
        if failed_at.is_none() {
            // Every ramp level passed: confirm the top one.
            let to = *self.ramp.last().unwrap_or(&self.plan.to);
            return match self.status(to) {
                Status::Decided(Decided::Pass) => Step::Done(Outcome::NoKnee { to }),
                _ => Step::Run {
                    level: to,
                    phase: Phase::Repeat,
                },
            };
        }
        self.refine()
    }

    /// The bisection and the confirmation of its two ends.
    fn refine(&self) -> Step {
        // Invariant: called once a ramp level failed for sure, so a failing level exists.
        let Some(hi) = self.lowest_fail() else {
            return Step::Done(Outcome::NoKnee { to: self.plan.to });
        };
        let Some(lo) = self.highest_pass_below(hi) else {
            // Nothing below the lowest failure passed: that is the first level.
            return match self.status(hi) {
                Status::Decided { .. } => Step::Done(Outcome::FailedAtFrom { from: hi }),
                _ => Step::Run {
                    level: hi,
                    phase: Phase::Repeat,
                },
            };
        };
        if (hi - lo) / lo > self.plan.precision {
            let mid = round_level((lo + hi) / 2.0, self.plan.whole);
            if mid > lo && mid < hi {
                return Step::Run {
                    level: mid,
                    phase: Phase::Refine,
                };
            }
        }
        for level in [hi, lo] {
            if let Status::Leaning { .. } = self.status(level) {
                return Step::Run {
                    level,
                    phase: Phase::Repeat,
                };
            }
        }
        Step::Done(Outcome::Knee {
            knee: lo,
            first_failing: hi,
        })
    }

    /// Where the search stands if it ends now (`--max-duration`).
    pub fn cut_short(&self) -> Outcome {
        let first_failing = self.lowest_fail();
        Outcome::CutShort {
            passed: self.highest_pass_below(first_failing.unwrap_or(f64::INFINITY)),
            first_failing,
        }
    }

    /// Where the search stands when it is interrupted.
    pub fn interrupted(&self) -> Outcome {
        match self.cut_short() {
            Outcome::CutShort {
                passed,
                first_failing,
            } => Outcome::Interrupted {
                passed,
                first_failing,
            },
            other => other,
        }
    }

    fn status(&self, level: f64) -> Status {
        let Some(t) = self.tallies.iter().find(|t| t.level == level) else {
            return Status::Unknown;
        };
        let r = self.plan.repeat;
        let majority = r / 2 + 1;
        let left = r.saturating_sub(t.passes + t.fails + t.generator);
        if t.clear_fail {
            Status::Decided(Decided::Fail)
        } else if t.passes >= majority {
            Status::Decided(Decided::Pass)
        } else if t.generator >= majority {
            Status::Decided(Decided::Generator)
        } else if t.fails >= majority
            || (t.passes + left < majority && t.generator + left < majority)
        {
            // A failure, or no majority left to reach: the target did not
            // show it sustains the level.
            Status::Decided(Decided::Fail)
        } else {
            Status::Leaning {
                pass: t.passes > t.fails + t.generator,
            }
        }
    }

    fn lowest_fail(&self) -> Option<f64> {
        self.tallies
            .iter()
            .filter(|t| self.status(t.level).fails())
            .map(|t| t.level)
            .min_by(f64::total_cmp)
    }

    fn highest_pass_below(&self, below: f64) -> Option<f64> {
        self.tallies
            .iter()
            .filter(|t| t.level < below && self.status(t.level).passes())
            .map(|t| t.level)
            .max_by(f64::total_cmp)
    }
}

/// A level rounded to three significant figures (whole levels to at least
/// a whole number), so that levels read as people write them.
pub fn round_level(v: f64, whole: bool) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return v;
    }
    // Scale by a power of ten that is exact as a float, so 2.346 gives 2.35 and 1414 gives 1410.
    let k = 2 - v.log10().floor() as i32;
    let r = if k >= 0 {
        let scale = 10f64.powi(k);
        (v * scale).round() / scale
    } else {
        let scale = 10f64.powi(-k);
        (v / scale).round() * scale
    };
    if whole { r.round().max(1.0) } else { r }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(from: f64, to: f64, repeat: u32) -> SearchPlan {
        SearchPlan {
            from,
            to,
            factor: 2.0,
            precision: 0.05,
            repeat,
            whole: false,
        }
    }

    /// Runs the search against `target` (level → what a run shows, given
    /// how many times that level ran before); returns the outcome and the
    /// levels run, in order.
    fn drive(
        p: SearchPlan,
        mut target: impl FnMut(f64, u32) -> Seen,
    ) -> (Outcome, Vec<(f64, Phase)>) {
        let mut s = Search::new(p).unwrap();
        let mut ran: Vec<(f64, Phase)> = Vec::new();
        loop {
            match s.next() {
                Step::Done(o) => return (o, ran),
                Step::Run { level, phase } => {
                    let before = ran.iter().filter(|(l, _)| *l == level).count() as u32;
                    ran.push((level, phase));
                    assert!(ran.len() < 200, "the search does not end: {ran:?}");
                    assert!(
                        level <= p.to && level >= p.from,
                        "{level} outside the range"
                    );
                    s.record(level, target(level, before));
                }
            }
        }
    }

    fn knee_at(knee: f64) -> impl FnMut(f64, u32) -> Seen {
        move |level, _| {
            if level <= knee {
                Seen::Pass
            } else {
                Seen::Fail { clear: false }
            }
        }
    }

    #[test]
    fn ramps_then_bisects_to_within_the_precision() {
        let (o, ran) = drive(plan(100.0, 100_000.0, 1), knee_at(1900.0));
        let Outcome::Knee {
            knee,
            first_failing,
        } = o
        else {
            panic!("{o:?}");
        };
        assert!(knee <= 1900.0 && first_failing > 1900.0, "{o:?}");
        assert!((first_failing - knee) / knee <= 0.05, "{o:?}");
        let ramp: Vec<f64> = ran
            .iter()
            .take_while(|(_, p)| *p == Phase::Ramp)
            .map(|(l, _)| *l)
            .collect();
        assert_eq!(ramp, [100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0]);
        // Never above the first failing ramp level.
        assert!(ran.iter().all(|(l, _)| *l <= 3200.0));
    }

    #[test]
    fn decisive_levels_are_repeated_and_a_majority_decides() {
        let (o, ran) = drive(plan(100.0, 100_000.0, 3), knee_at(1900.0));
        assert!(matches!(o, Outcome::Knee { .. }), "{o:?}");
        let Outcome::Knee {
            knee,
            first_failing,
        } = o
        else {
            unreachable!()
        };
        for level in [knee, first_failing] {
            let n = ran.iter().filter(|(l, _)| *l == level).count();
            assert_eq!(
                n, 2,
                "{level} ran {n} times: two agreeing runs of three decide"
            );
        }
        // The first failing ramp level (3200) was confirmed before the ramp stopped.
        assert_eq!(ran.iter().filter(|(l, _)| *l == 3200.0).count(), 2);
    }

    #[test]
    fn one_noisy_failure_does_not_end_the_ramp() {
        // 800/s fails once, then passes twice: the ramp goes on.
        let (o, ran) = drive(plan(100.0, 100_000.0, 3), |level, before| {
            if level == 800.0 && before == 0 {
                Seen::Fail { clear: false }
            } else {
                knee_at(1900.0)(level, before)
            }
        });
        assert!(
            matches!(o, Outcome::Knee { knee, .. } if knee > 1700.0),
            "{o:?}"
        );
        assert_eq!(ran.iter().filter(|(l, _)| *l == 800.0).count(), 3);
    }

    #[test]
    fn a_clear_failure_needs_no_repeat() {
        let (o, ran) = drive(plan(100.0, 100_000.0, 3), |level, _| {
            if level <= 1900.0 {
                Seen::Pass
            } else {
                Seen::Fail { clear: true }
            }
        });
        let Outcome::Knee { first_failing, .. } = o else {
            panic!("{o:?}");
        };
        assert_eq!(ran.iter().filter(|(l, _)| *l == first_failing).count(), 1);
        assert_eq!(ran.iter().filter(|(l, _)| *l == 3200.0).count(), 1);
    }

    #[test]
    fn a_target_that_never_fails_has_no_knee_below_to() {
        let (o, ran) = drive(plan(100.0, 1000.0, 3), |_, _| Seen::Pass);
        assert_eq!(o, Outcome::NoKnee { to: 1000.0 });
        let levels: Vec<f64> = ran.iter().map(|(l, _)| *l).collect();
        // The ramp ends exactly at --to, which is confirmed.
        assert_eq!(levels, [100.0, 200.0, 400.0, 800.0, 1000.0, 1000.0]);
    }

    #[test]
    fn a_target_failing_at_the_first_level_is_confirmed_then_reported() {
        let (o, ran) = drive(plan(100.0, 1000.0, 3), |_, _| Seen::Fail { clear: false });
        assert_eq!(o, Outcome::FailedAtFrom { from: 100.0 });
        assert_eq!(ran.len(), 2);
    }

    #[test]
    fn the_generator_ends_the_search_where_it_fell_behind() {
        let (o, ran) = drive(plan(100.0, 100_000.0, 3), |level, _| {
            if level >= 1600.0 {
                Seen::Generator
            } else {
                Seen::Pass
            }
        });
        assert_eq!(
            o,
            Outcome::GeneratorSaturated {
                at: 1600.0,
                passed: Some(800.0)
            }
        );
        assert_eq!(ran.last().map(|r| r.0), Some(1600.0));
    }

    #[test]
    fn one_generator_hiccup_is_repeated_like_a_failure() {
        let (o, ran) = drive(plan(100.0, 100_000.0, 3), |level, before| {
            if level == 400.0 && before == 0 {
                Seen::Generator
            } else {
                knee_at(1900.0)(level, before)
            }
        });
        assert!(matches!(o, Outcome::Knee { .. }), "{o:?}");
        assert_eq!(ran.iter().filter(|(l, _)| *l == 400.0).count(), 3);
    }

    #[test]
    fn a_level_that_changes_its_mind_moves_the_bracket() {
        // The bisection's passing end fails its confirmation: the knee is lower.
        let mut flaky_seen = 0;
        let (o, _) = drive(plan(1000.0, 4000.0, 3), |level, _| {
            if level == 1940.0 {
                flaky_seen += 1;
                if flaky_seen == 1 {
                    return Seen::Pass;
                }
                return Seen::Fail { clear: false };
            }
            knee_at(1950.0)(level, 0)
        });
        let Outcome::Knee {
            knee,
            first_failing,
        } = o
        else {
            panic!("{o:?}");
        };
        assert!(knee < 1940.0 && first_failing <= 1940.0, "{o:?}");
    }

    #[test]
    fn where_a_search_stands_when_it_is_cut_short() {
        let mut s = Search::new(plan(100.0, 1000.0, 1)).unwrap();
        assert_eq!(
            s.cut_short(),
            Outcome::CutShort {
                passed: None,
                first_failing: None
            }
        );
        s.record(100.0, Seen::Pass);
        s.record(200.0, Seen::Fail { clear: false });
        assert_eq!(
            s.interrupted(),
            Outcome::Interrupted {
                passed: Some(100.0),
                first_failing: Some(200.0)
            }
        );
    }

    #[test]
    fn whole_levels_stay_whole_and_distinct() {
        let s = Search::new(SearchPlan {
            from: 1.0,
            to: 10.0,
            factor: 1.3,
            whole: true,
            ..plan(1.0, 10.0, 1)
        })
        .unwrap();
        assert_eq!(s.ramp(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]);
        assert_eq!(round_level(1414.2, false), 1410.0);
        assert_eq!(round_level(2.346, false), 2.35);
        assert_eq!(round_level(0.4, true), 1.0);
        assert_eq!(round_level(123_456.0, true), 123_000.0);
    }

    #[test]
    fn plans_that_make_no_search_are_refused() {
        let bad = [
            (plan(0.0, 10.0, 1), "--from must be more than zero"),
            (plan(500.0, 100.0, 1), "--from 500 is above --to 100"),
            (
                SearchPlan {
                    factor: 1.0,
                    ..plan(1.0, 10.0, 1)
                },
                "--factor 1",
            ),
            (
                SearchPlan {
                    precision: 0.0,
                    ..plan(1.0, 10.0, 1)
                },
                "--precision",
            ),
            (plan(1.0, 10.0, 0), "--repeat"),
        ];
        for (p, want) in bad {
            let err = Search::new(p).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }
}
