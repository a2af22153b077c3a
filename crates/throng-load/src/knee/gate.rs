//! `knee --threshold`: a gate on what the search found, for CI (fail the
//! build when the capacity regressed): `knee>=5000/s` for the rate modes,
//! `knee_connections>=100000` for `hold`.
//!
//! The figure is the highest level the target met the objective at: the
//! knee, or, without one in the range, the highest level passed (`--to`
//! when every level passed, 0 when none did).

use throng_report::knee::{Knee, Mode, Outcome};

use crate::threshold::{Catalogue, Figure, Figures, Threshold};

/// `knee`'s figures.
pub const FIGURES: Catalogue = Catalogue {
    command: "knee",
    latencies: &[],
    ratios: &[],
    rates: &["knee"],
    counts: &["knee_connections"],
};

/// The search's result, read as figures.
struct Found<'a>(&'a Knee);

impl Found<'_> {
    /// The highest level the target passed, if the search says.
    fn passed(&self) -> Option<f64> {
        match self.0.outcome {
            Outcome::Knee { knee, .. } => Some(knee),
            Outcome::NoKnee { to } => Some(to),
            Outcome::FailedAtFrom { .. } => Some(0.0),
            Outcome::GeneratorSaturated { passed, .. }
            | Outcome::CutShort { passed, .. }
            | Outcome::Interrupted { passed, .. } => passed,
        }
    }
}

impl Figures for Found<'_> {
    fn value(&self, figure: &Figure) -> Option<f64> {
        let hold = self.0.mode == Mode::Hold;
        match figure {
            Figure::Rate(_) if !hold => self.passed(),
            Figure::Count(_) if hold => self.passed(),
            _ => None,
        }
    }
}

/// What `knee` broke of `thresholds`, one line each (empty: it passed).
pub fn check(knee: &Knee, thresholds: &[Threshold]) -> Vec<String> {
    crate::threshold::check_all(thresholds, &Found(knee))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(mode: Mode, outcome: Outcome) -> Knee {
        Knee {
            mode,
            target: String::new(),
            objective: Vec::new(),
            slo_p99_us: None,
            slo_p999_us: None,
            search: Vec::new(),
            runs: Vec::new(),
            outcome,
            elapsed_s: 0.0,
        }
    }

    #[test]
    fn the_gate_reads_the_highest_level_passed() {
        let at_least = Threshold::parse("knee>=5000/s", &FIGURES).unwrap();
        let knee = |k| Outcome::Knee {
            knee: k,
            first_failing: k * 2.0,
        };
        assert!(
            check(
                &found(Mode::Attack, knee(6000.0)),
                std::slice::from_ref(&at_least)
            )
            .is_empty()
        );
        assert_eq!(
            check(
                &found(Mode::Attack, knee(4000.0)),
                std::slice::from_ref(&at_least)
            ),
            ["knee>=5000/s: knee was 4000.00/s"]
        );
        // Every level passed up to --to: the capacity is at least that.
        let all = found(Mode::Publish, Outcome::NoKnee { to: 8000.0 });
        assert!(check(&all, std::slice::from_ref(&at_least)).is_empty());
        // None passed.
        let none = found(Mode::Attack, Outcome::FailedAtFrom { from: 100.0 });
        assert_eq!(check(&none, std::slice::from_ref(&at_least)).len(), 1);
        // The rate figure says nothing of a hold search, and the other way round.
        let conns = Threshold::parse("knee_connections>=1000", &FIGURES).unwrap();
        let held = found(Mode::Hold, knee(2000.0));
        assert!(check(&held, std::slice::from_ref(&conns)).is_empty());
        assert!(check(&held, std::slice::from_ref(&at_least))[0].contains("unknown"));
        assert!(
            check(
                &found(Mode::Attack, knee(1.0)),
                std::slice::from_ref(&conns)
            )[0]
            .contains("unknown")
        );
        assert!(Threshold::parse("p99<1s", &FIGURES).is_err());
    }
}
