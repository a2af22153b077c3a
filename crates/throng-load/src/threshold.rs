//! Pass/fail thresholds on a run's summary figures (`--threshold
//! 'p99<100ms'`, k6's way): parsed against the figures a command has,
//! checked on its summary at the end, and checked on its running totals
//! for `--abort-on-fail`, where some can be known to fail before the end.
//!
//! A threshold is `FIGURE OP VALUE`, OP one of `<`, `<=`, `>`, `>=`,
//! `==`, `!=`. Figures are a command's own ([`Catalogue`]): latency
//! statistics (`p99`, `p99.9`, `mean`, `max`, `connect_p99`, ...) take a
//! duration (`100ms`); `error_rate` and `success_ratio` a fraction or a
//! percentage (`0.001`, `0.1%`); `rate` and `throughput` a rate (`900/s`);
//! counts (`lost`, `errors`, ...) a whole number.

use std::fmt;

use thiserror::Error;
use throng_host::units::parse_duration;
use throng_report::summary::HistStats;
use throng_report::text::micros;

/// How a figure is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `!=`
    Ne,
}

impl Op {
    const ALL: [(&'static str, Self); 6] = [
        ("<=", Self::Le),
        (">=", Self::Ge),
        ("==", Self::Eq),
        ("!=", Self::Ne),
        ("<", Self::Lt),
        (">", Self::Gt),
    ];

    fn holds(self, figure: f64, bound: f64) -> bool {
        match self {
            Self::Lt => figure < bound,
            Self::Le => figure <= bound,
            Self::Gt => figure > bound,
            Self::Ge => figure >= bound,
            Self::Eq => figure == bound,
            Self::Ne => figure != bound,
        }
    }

    /// Whether a figure that can only grow, once past `bound`, fails.
    fn fails_for_good_when_over(self) -> bool {
        matches!(self, Self::Lt | Self::Le | Self::Eq)
    }
}

/// A statistic of a latency histogram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stat {
    /// A percentile in tenths of a percent (only those a summary holds:
    /// 500, 750, 900, 950, 990, 999 for p50 ... p99.9).
    Percentile(u16),
    /// The mean.
    Mean,
    /// The smallest.
    Min,
    /// The largest.
    Max,
}

impl Stat {
    /// This statistic of `h`, µs.
    pub fn of(self, h: &HistStats) -> f64 {
        match self {
            Self::Mean => h.mean,
            Self::Min => h.min as f64,
            Self::Max => h.max as f64,
            Self::Percentile(p) => {
                let v = match p {
                    500 => h.p50,
                    750 => h.p75,
                    900 => h.p90,
                    950 => h.p95,
                    990 => h.p99,
                    _ => h.p999,
                };
                v as f64
            }
        }
    }
}

/// A figure a threshold is on.
#[derive(Debug, Clone, PartialEq)]
pub enum Figure {
    /// A statistic of the latency histogram named (one of the catalogue's).
    Latency {
        /// Which histogram (`latency`, `connect`, `delivery`, ...).
        of: &'static str,
        /// Which statistic.
        stat: Stat,
    },
    /// A fraction, 0 to 1 (`error_rate`, `success_ratio`).
    Ratio(&'static str),
    /// Per second (`rate`, `throughput`).
    Rate(&'static str),
    /// A whole count that only grows during a run (`lost`, `errors`, ...).
    Count(&'static str),
}

/// The figures a command has, for parsing its thresholds.
#[derive(Debug, Clone, Copy)]
pub struct Catalogue {
    /// The command, for messages.
    pub command: &'static str,
    /// Latency histograms: the first is what a bare `p99` means.
    pub latencies: &'static [&'static str],
    /// Fractions.
    pub ratios: &'static [&'static str],
    /// Rates.
    pub rates: &'static [&'static str],
    /// Counts.
    pub counts: &'static [&'static str],
}

impl Catalogue {
    /// Every figure name, for the error that lists them.
    fn names(&self) -> String {
        let main = self.latencies.first().copied().unwrap_or("latency");
        let mut out = vec![format!(
            "p50, p75, p90, p95, p99, p99.9, mean, min, max (of {main})"
        )];
        for l in self.latencies {
            out.push(format!("{l}_p99, {l}_max, ..."));
        }
        out.extend(
            self.ratios
                .iter()
                .chain(self.rates)
                .chain(self.counts)
                .map(|s| (*s).to_owned()),
        );
        out.join(", ")
    }

    fn figure(&self, name: &str) -> Result<Figure, ThresholdError> {
        let unknown = || ThresholdError::Figure {
            name: name.to_owned(),
            command: self.command,
            known: self.names(),
        };
        let find = |list: &'static [&'static str]| list.iter().copied().find(|n| *n == name);
        if let Some(r) = find(self.ratios) {
            return Ok(Figure::Ratio(r));
        }
        if let Some(r) = find(self.rates) {
            return Ok(Figure::Rate(r));
        }
        if let Some(c) = find(self.counts) {
            return Ok(Figure::Count(c));
        }
        let (of, stat) = match name.rsplit_once('_') {
            Some((of, stat)) => (
                self.latencies
                    .iter()
                    .copied()
                    .find(|l| *l == of)
                    .ok_or_else(unknown)?,
                stat,
            ),
            None => (self.latencies.first().copied().ok_or_else(unknown)?, name),
        };
        let stat = match stat {
            "mean" | "avg" => Stat::Mean,
            "min" => Stat::Min,
            "max" => Stat::Max,
            p => {
                let n = p.strip_prefix('p').ok_or_else(unknown)?;
                let q = match n {
                    "50" | "75" | "90" | "95" | "99" => {
                        n.parse::<u16>().map_err(|_| unknown())? * 10
                    }
                    "99.9" | "999" => 999,
                    _ => {
                        return Err(ThresholdError::Percentile {
                            name: name.to_owned(),
                        });
                    }
                };
                Stat::Percentile(q)
            }
        };
        Ok(Figure::Latency { of, stat })
    }
}

/// Why a threshold expression is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ThresholdError {
    /// No comparison in it.
    #[error(
        "threshold {0:?} has no comparison: write FIGURE OP VALUE, e.g. 'p99<100ms', 'error_rate<0.1%', 'rate>=900/s', 'lost==0'"
    )]
    NoOp(String),
    /// A figure the command does not have.
    #[error("threshold figure {name:?} is not one of {command}'s: {known}")]
    Figure {
        /// The name given.
        name: String,
        /// The command.
        command: &'static str,
        /// What it has.
        known: String,
    },
    /// A percentile a summary does not keep.
    #[error("threshold figure {name:?}: the percentiles are p50, p75, p90, p95, p99 and p99.9")]
    Percentile {
        /// The name given.
        name: String,
    },
    /// A value of the wrong kind for the figure.
    #[error("threshold {expr:?}: {why}")]
    Value {
        /// The expression.
        expr: String,
        /// What the value should be.
        why: String,
    },
}

/// One threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// As written (or as an alias flag spells it), blanks left out.
    pub expr: String,
    /// The figure's name as written.
    name: String,
    /// The flag it came from when an alias (`--max-p99`).
    pub alias: Option<&'static str>,
    figure: Figure,
    op: Op,
    /// In the figure's unit: µs, a fraction, per second, a count.
    bound: f64,
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.alias {
            Some(flag) => write!(f, "{} ({flag})", self.expr),
            None => f.write_str(&self.expr),
        }
    }
}

impl Threshold {
    /// Parses `expr` against the figures of `catalogue`.
    pub fn parse(expr: &str, catalogue: &Catalogue) -> Result<Self, ThresholdError> {
        let compact: String = expr.chars().filter(|c| !c.is_whitespace()).collect();
        let (at, text, op) = Op::ALL
            .iter()
            .filter_map(|(t, op)| compact.find(t).map(|at| (at, *t, *op)))
            // The leftmost operator; `<=` before `<` at the same place.
            .min_by_key(|(at, t, _)| (*at, usize::MAX - t.len()))
            .ok_or_else(|| ThresholdError::NoOp(expr.to_owned()))?;
        let (name, value) = (&compact[..at], &compact[at + text.len()..]);
        let figure = catalogue.figure(name)?;
        let bad = |why: &str| ThresholdError::Value {
            expr: expr.to_owned(),
            why: why.to_owned(),
        };
        let bound = match &figure {
            Figure::Latency { .. } => {
                let d = if value == "0" {
                    std::time::Duration::ZERO
                } else {
                    parse_duration(value)
                        .map_err(|e| bad(&format!("{name} takes a duration such as 100ms ({e})")))?
                };
                d.as_secs_f64() * 1e6
            }
            Figure::Ratio(_) => {
                let (n, scale) = match value.strip_suffix('%') {
                    Some(p) => (p, 100.0),
                    None => (value, 1.0),
                };
                let v = n
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| {
                        bad(&format!(
                            "{name} takes a fraction (0.001) or a percentage (0.1%)"
                        ))
                    })?
                    / scale;
                if v > 1.0 {
                    return Err(bad(&format!("{name} is at most 1 (100%)")));
                }
                v
            }
            Figure::Rate(_) => value
                .strip_suffix("/s")
                .unwrap_or(value)
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| bad(&format!("{name} takes a rate such as 900/s")))?,
            Figure::Count(_) => value
                .parse::<u64>()
                .map_err(|_| bad(&format!("{name} takes a whole number such as 0")))?
                as f64,
        };
        Ok(Self {
            name: name.to_owned(),
            expr: compact.clone(),
            alias: None,
            figure,
            op,
            bound,
        })
    }

    /// The same threshold, said to come from `flag` (`--max-p99`).
    pub fn alias(mut self, flag: &'static str) -> Self {
        self.alias = Some(flag);
        self
    }

    /// Whether `value` (in the figure's unit) passes.
    fn passes(&self, value: f64) -> bool {
        self.op.holds(value, self.bound)
    }

    fn show(&self, value: f64) -> String {
        match self.figure {
            Figure::Latency { .. } => micros(value.round() as u64),
            Figure::Ratio(_) => format!("{:.4}%", value * 100.0),
            Figure::Rate(_) => format!("{value:.2}/s"),
            Figure::Count(_) => format!("{value}"),
        }
    }

    /// Checks the run's final figures: `None` when it passed, else why not.
    pub fn check(&self, figures: &dyn Figures) -> Option<String> {
        let name = &self.name;
        match figures.value(&self.figure) {
            None => Some(format!("{self}: {name} is unknown (nothing measured)")),
            Some(v) if self.passes(v) => None,
            Some(v) => Some(format!("{self}: {name} was {}", self.show(v))),
        }
    }

    /// Whether the run can no longer pass this threshold, whatever comes:
    /// `Some(why)` once a figure that only grows is past its bound (a count
    /// such as `errors`, a `max`), or, when the run's request count is
    /// planned, once more requests failed (`error_rate`, `success_ratio`)
    /// or took at least the bound (a percentile) than the threshold allows
    /// over the whole run. Means, minimums and rates are known only at the
    /// end.
    pub fn doomed(&self, live: &dyn Live) -> Option<String> {
        let over = |n: u64, allowed: f64| (n as f64 > allowed).then_some(n);
        match (&self.figure, self.op) {
            (Figure::Count(c), op) if op.fails_for_good_when_over() => {
                let n = live.count(c)?;
                (!self.passes(n as f64) && n as f64 >= self.bound)
                    .then(|| format!("{self}: {c} is already {n}"))
            }
            (
                Figure::Latency {
                    of,
                    stat: Stat::Max,
                },
                Op::Lt | Op::Le,
            ) => {
                let n = live.at_least(of, self.bound, self.op == Op::Le)?;
                (n > 0).then(|| format!("{self}: a latency over the bound was recorded"))
            }
            (
                Figure::Latency {
                    of,
                    stat: Stat::Percentile(q),
                },
                Op::Lt | Op::Le,
            ) => {
                let planned = live.planned()?;
                let n = live.at_least(of, self.bound, self.op == Op::Le)?;
                over(n, planned as f64 * f64::from(1000 - q) / 1000.0).map(|n| {
                    format!("{self}: {n} of the {planned} planned requests are already at or over the bound")
                })
            }
            (Figure::Ratio("error_rate"), Op::Lt | Op::Le) => {
                let planned = live.planned()?;
                over(live.failures()?, planned as f64 * self.bound).map(|n| {
                    format!("{self}: {n} of the {planned} planned requests already failed")
                })
            }
            (Figure::Ratio("success_ratio"), Op::Gt | Op::Ge) => {
                let planned = live.planned()?;
                over(live.failures()?, planned as f64 * (1.0 - self.bound)).map(|n| {
                    format!("{self}: {n} of the {planned} planned requests already failed")
                })
            }
            _ => None,
        }
    }

    /// Whether [`Threshold::doomed`] can ever say so for this threshold.
    pub fn can_abort(&self) -> bool {
        match (&self.figure, self.op) {
            (Figure::Count(_), op) => op.fails_for_good_when_over(),
            (
                Figure::Latency {
                    stat: Stat::Max | Stat::Percentile(_),
                    ..
                },
                Op::Lt | Op::Le,
            ) => true,
            (Figure::Ratio("error_rate"), Op::Lt | Op::Le) => true,
            (Figure::Ratio("success_ratio"), Op::Gt | Op::Ge) => true,
            _ => false,
        }
    }
}

/// A run's final figures, by the names of its [`Catalogue`].
pub trait Figures {
    /// The figure's value in its unit (µs, fraction, per second, count);
    /// `None` when nothing measured it.
    fn value(&self, figure: &Figure) -> Option<f64>;
}

/// A running run's totals, for [`Threshold::doomed`].
pub trait Live {
    /// Requests the run plans, when known in advance.
    fn planned(&self) -> Option<u64>;
    /// A count so far.
    fn count(&self, name: &str) -> Option<u64>;
    /// Values of latency histogram `of` so far at or over `bound_us`
    /// (`inclusive`), or strictly over it.
    fn at_least(&self, of: &str, bound_us: f64, inclusive: bool) -> Option<u64>;
    /// Requests that did not succeed so far.
    fn failures(&self) -> Option<u64>;
}

/// Checks every threshold on the final figures: one line per failure.
pub fn check_all(thresholds: &[Threshold], figures: &dyn Figures) -> Vec<String> {
    thresholds.iter().filter_map(|t| t.check(figures)).collect()
}

/// The thresholds to check as a run goes: under `--abort-on-fail` (`abort`)
/// those that can be known to fail before the end, else none.
pub fn live(thresholds: &[Threshold], abort: bool) -> Vec<Threshold> {
    if !abort {
        return Vec::new();
    }
    thresholds
        .iter()
        .filter(|t| t.can_abort())
        .cloned()
        .collect()
}

/// The start line that states the thresholds, and which can stop the run
/// early under `--abort-on-fail`.
pub fn start_line(thresholds: &[Threshold], abort: bool) -> Option<String> {
    if thresholds.is_empty() {
        return None;
    }
    let all: Vec<String> = thresholds.iter().map(ToString::to_string).collect();
    let mut line = format!("  thresholds (exit 1 when one fails): {}", all.join(", "));
    if abort {
        let early: Vec<&str> = thresholds
            .iter()
            .filter(|t| t.can_abort())
            .map(|t| t.expr.as_str())
            .collect();
        line.push_str(&if early.is_empty() {
            "; --abort-on-fail: none of them can be known to fail before the end".to_owned()
        } else {
            format!(
                "; --abort-on-fail stops the run once {} can no longer pass",
                early.join(", ")
            )
        });
    }
    Some(line)
}

/// Counts in a histogram of µs values at or over (or strictly over) `bound_us`.
pub fn count_over(h: &hdrhistogram::Histogram<u64>, bound_us: f64, inclusive: bool) -> u64 {
    h.iter_recorded()
        .filter(|v| {
            let x = h.median_equivalent(v.value_iterated_to()) as f64;
            if inclusive {
                x >= bound_us
            } else {
                x > bound_us
            }
        })
        .map(|v| v.count_at_value())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAT: Catalogue = Catalogue {
        command: "attack",
        latencies: &["latency", "connect", "lag"],
        ratios: &["error_rate", "success_ratio"],
        rates: &["rate"],
        counts: &["errors", "lost"],
    };

    fn t(expr: &str) -> Threshold {
        Threshold::parse(expr, &CAT).unwrap_or_else(|e| panic!("{expr}: {e}"))
    }

    struct Fixed(f64);
    impl Figures for Fixed {
        fn value(&self, _: &Figure) -> Option<f64> {
            Some(self.0)
        }
    }

    #[test]
    fn parses_each_kind_of_figure() {
        assert_eq!(t("p99<100ms").bound, 100_000.0);
        assert_eq!(
            t("p99.9 < 1s").figure,
            Figure::Latency {
                of: "latency",
                stat: Stat::Percentile(999)
            }
        );
        assert_eq!(
            t("connect_p99<1s").figure,
            Figure::Latency {
                of: "connect",
                stat: Stat::Percentile(990)
            }
        );
        assert_eq!(
            t("lag_max<=10ms").figure,
            Figure::Latency {
                of: "lag",
                stat: Stat::Max
            }
        );
        assert!((t("error_rate<0.1%").bound - 0.001).abs() < 1e-12);
        assert_eq!(t("error_rate<=0.5").bound, 0.5);
        assert_eq!(t("rate>=900/s").bound, 900.0);
        assert_eq!(t("rate>=900").op, Op::Ge);
        assert_eq!(t("lost==0").op, Op::Eq);
        assert_eq!(t("errors != 3").bound, 3.0);
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        let err = |e: &str| Threshold::parse(e, &CAT).unwrap_err().to_string();
        assert!(err("p99").contains("has no comparison"), "{}", err("p99"));
        assert!(err("p98<1s").contains("p50, p75, p90, p95, p99 and p99.9"));
        assert!(err("speed<1s").contains("not one of attack's"));
        assert!(err("speed<1s").contains("error_rate"));
        assert!(err("p99<fast").contains("takes a duration"));
        assert!(err("error_rate<150%").contains("at most 1"));
        assert!(err("error_rate<-1").contains("fraction"));
        assert!(err("lost==0.5").contains("whole number"));
        assert!(err("rate>=lots").contains("900/s"));
        assert!(err("tls_p99<1s").contains("not one of"));
    }

    #[test]
    fn checks_name_the_figure_and_its_value() {
        assert_eq!(t("p99<100ms").check(&Fixed(99_999.0)), None);
        let why = t("p99<100ms").check(&Fixed(100_000.0)).unwrap();
        assert_eq!(why, "p99<100ms: p99 was 100ms");
        let why = t("error_rate<0.1%")
            .alias("--max-error-rate")
            .check(&Fixed(0.5))
            .unwrap();
        assert!(
            why.starts_with("error_rate<0.1% (--max-error-rate): error_rate was 50.0000%"),
            "{why}"
        );
        assert!(t("rate>=900/s").check(&Fixed(899.0)).is_some());
    }

    struct Sofar {
        planned: Option<u64>,
        errors: u64,
        over: u64,
    }
    impl Live for Sofar {
        fn planned(&self) -> Option<u64> {
            self.planned
        }
        fn count(&self, _: &str) -> Option<u64> {
            Some(self.errors)
        }
        fn at_least(&self, _: &str, _: f64, _: bool) -> Option<u64> {
            Some(self.over)
        }
        fn failures(&self) -> Option<u64> {
            Some(self.errors)
        }
    }

    #[test]
    fn doomed_only_when_no_future_can_pass() {
        let live = |planned, errors, over| Sofar {
            planned,
            errors,
            over,
        };
        // 1% of 1000 planned is 10 failures: the 11th dooms the run.
        assert!(
            t("error_rate<=1%")
                .doomed(&live(Some(1000), 10, 0))
                .is_none()
        );
        assert!(
            t("error_rate<=1%")
                .doomed(&live(Some(1000), 11, 0))
                .is_some()
        );
        // Without a plan the rate is known only at the end.
        assert!(t("error_rate<=1%").doomed(&live(None, 500, 0)).is_none());
        assert!(t("errors<3").doomed(&live(None, 2, 0)).is_none());
        assert!(t("errors<3").doomed(&live(None, 3, 0)).is_some());
        assert!(t("errors>3").doomed(&live(None, 0, 0)).is_none());
        // p99 of 1000: 10 may be over, the 11th is past the 99th.
        assert!(t("p99<100ms").doomed(&live(Some(1000), 0, 10)).is_none());
        assert!(t("p99<100ms").doomed(&live(Some(1000), 0, 11)).is_some());
        assert!(t("max<1s").doomed(&live(None, 0, 1)).is_some());
        assert!(!t("mean<1s").can_abort() && !t("rate>=9").can_abort());
        assert!(t("mean<1s").doomed(&live(Some(1), 9, 9)).is_none());
    }

    #[test]
    fn start_line_says_which_can_abort() {
        let line = start_line(&[t("p99<1s"), t("rate>=9")], true).unwrap();
        assert!(
            line.contains("stops the run once p99<1s can no longer pass"),
            "{line}"
        );
        assert!(start_line(&[], true).is_none());
    }

    #[test]
    fn counts_over_a_bound() {
        let mut h = throng_report::interval::new_histogram();
        for v in [10, 100, 100, 1000] {
            h.record(v).unwrap();
        }
        assert_eq!(count_over(&h, 100.0, true), 3);
        assert_eq!(count_over(&h, 100.0, false), 1);
    }
}
