//! The figures a `hold` threshold may name (`--threshold 'lost==0'`,
//! `'delivery_p99<100ms'`, `'connect_p99<1s'`), read from its summary at the
//! end and from its running totals for `--abort-on-fail`; and what fails a
//! run ([`Thresholds`]).

use throng_report::interval::Interval;

use super::summary::Summary;
use crate::harness::collect::kinds;
use crate::threshold::{Catalogue, Figure, Figures, Live, Threshold, count_over};

/// `hold`'s figures: a bare `p99` is the delivery latency.
pub const FIGURES: Catalogue = Catalogue {
    command: "hold",
    latencies: &["delivery", "connect", "publish", "pushed"],
    ratios: &["loss_rate"],
    rates: &["connect_rate"],
    counts: &COUNTS,
};

/// `hold`'s counts (`bench` has them too).
pub const COUNTS: [&str; 7] = [
    "lost",
    "connect_errors",
    "duplicated",
    "out_of_order",
    "received",
    "opened",
    "publish_errors",
];

impl Figures for Summary {
    fn value(&self, figure: &Figure) -> Option<f64> {
        match figure {
            Figure::Latency { of, stat } => {
                let h = match *of {
                    "connect" => &self.connect_us,
                    "publish" => &self.publish_us,
                    "pushed" => &self.pushed_delivery_us,
                    _ => &self.delivery_us,
                };
                (h.count > 0).then(|| stat.of(h))
            }
            Figure::Ratio(_) => {
                (self.expected > 0).then(|| self.lost as f64 / self.expected as f64)
            }
            Figure::Rate(_) => Some(self.connect_rate),
            Figure::Count(c) => Some(match *c {
                "lost" => self.lost,
                "connect_errors" => self.failed.values().sum(),
                "duplicated" => self.duplicated,
                "out_of_order" => self.out_of_order,
                "received" => self.received,
                "opened" => self.opened,
                _ => self.publish_errors.values().sum(),
            } as f64),
        }
    }
}

/// A running hold's totals, for `--abort-on-fail`: counts and maxima (no
/// request count is planned, so no budget can be spent early).
pub(super) struct Running<'a>(pub(super) &'a Interval);

impl Live for Running<'_> {
    fn planned(&self) -> Option<u64> {
        None
    }

    fn count(&self, name: &str) -> Option<u64> {
        let t = self.0;
        let under = |prefix: &str| {
            t.counters
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(_, v)| v)
                .sum()
        };
        Some(match name {
            "lost" => t.counter("messages.lost"),
            "connect_errors" => under("connect.error."),
            "duplicated" => t.counter("messages.duplicated"),
            "out_of_order" => t.counter("messages.out_of_order"),
            "publish_errors" => under("publish.error."),
            // Counts that only a run's end makes final for a lower bound.
            _ => return None,
        })
    }

    fn at_least(&self, of: &str, bound_us: f64, inclusive: bool) -> Option<u64> {
        let name = match of {
            "connect" => "connect",
            "publish" => "publish",
            "pushed" => "delivery.pushed",
            _ => "delivery",
        };
        self.0
            .histograms
            .get(name)
            .map(|h| count_over(h, bound_us, inclusive))
    }

    fn failures(&self) -> Option<u64> {
        None
    }
}

/// What fails a run (exit status 1).
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    /// Connections that may fail to open.
    pub max_connect_errors: u64,
    /// Messages that may be lost.
    pub max_lost: u64,
    /// `--threshold`s on any figure ([`FIGURES`]).
    pub given: Vec<Threshold>,
    /// `--abort-on-fail`: stop once one of `given` can no longer pass.
    pub abort_on_fail: bool,
}

impl Default for Thresholds {
    /// Nothing may fail.
    fn default() -> Self {
        Self {
            max_connect_errors: 0,
            max_lost: 0,
            given: Vec::new(),
            abort_on_fail: false,
        }
    }
}

impl Thresholds {
    /// Every threshold: `--max-connect-errors N` and `--max-lost N` as the
    /// thresholds they are aliases of (`connect_errors<=N`, `lost<=N`),
    /// then the `--threshold`s.
    pub fn all(&self) -> Vec<Threshold> {
        let aliases = [
            (
                format!("connect_errors<={}", self.max_connect_errors),
                "--max-connect-errors",
            ),
            (format!("lost<={}", self.max_lost), "--max-lost"),
        ];
        let mut out: Vec<Threshold> = aliases
            .into_iter()
            // A count bound by a whole number always parses.
            .filter_map(|(expr, flag)| {
                Threshold::parse(&expr, &FIGURES)
                    .ok()
                    .map(|t| t.alias(flag))
            })
            .collect();
        out.extend(self.given.iter().cloned());
        out
    }

    /// The start lines that state them.
    pub fn line(&self) -> String {
        let mut line =
            "  fails (exit 1) when a message cannot be published, or a threshold fails".to_owned();
        if let Some(more) = crate::threshold::start_line(&self.all(), self.abort_on_fail) {
            line.push('\n');
            line.push_str(&more);
        }
        line
    }

    /// The thresholds checked as the run goes (`--abort-on-fail`).
    pub fn live(&self) -> Vec<Threshold> {
        crate::threshold::live(&self.all(), self.abort_on_fail)
    }

    /// What `s` broke, one line each (empty: it passed).
    pub fn check(&self, s: &Summary) -> Vec<String> {
        let mut out: Vec<String> = crate::threshold::check_all(&self.all(), s)
            .into_iter()
            .map(|line| {
                // Which kinds of failure, beside their count.
                if line.starts_with("connect_errors") && !s.failed.is_empty() {
                    format!("{line} ({})", kinds(&s.failed, " ", ", "))
                } else {
                    line
                }
            })
            .collect();
        if let Some(n) = s.closed.get("read_timeout") {
            out.push(format!(
                "{n} held connections received nothing, not even a ping, for --read-timeout"
            ));
        }
        if let Some(why) = &s.aborted {
            out.push(format!("stopped early (--abort-on-fail): {why}"));
        }
        if let Some(sessions) = &s.sessions {
            out.extend(sessions.failures());
        }
        let unpublished: u64 = s.publish_errors.values().sum();
        if unpublished > 0 {
            out.push(format!(
                "{unpublished} messages could not be published ({})",
                kinds(&s.publish_errors, ": ", ", ")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threshold::Threshold;

    #[test]
    fn hold_figures_parse_and_abort_on_counts() {
        let lost = Threshold::parse("lost==0", &FIGURES).unwrap();
        let mut iv = Interval::empty(0, 1, "h/hold-0".into());
        assert!(lost.doomed(&Running(&iv)).is_none());
        iv.counters.insert("messages.lost".into(), 2);
        assert!(lost.doomed(&Running(&iv)).is_some());
        let p99 = Threshold::parse("delivery_p99<100ms", &FIGURES).unwrap();
        // No planned count: a percentile is known only at the end.
        assert!(p99.doomed(&Running(&iv)).is_none());
        assert!(Threshold::parse("connect_p99<1s", &FIGURES).is_ok());
        assert!(Threshold::parse("error_rate<1%", &FIGURES).is_err());
        let s = Summary {
            lost: 3,
            expected: 300,
            ..Summary::default()
        };
        let loss = Threshold::parse("loss_rate<0.1%", &FIGURES).unwrap();
        assert_eq!(
            loss.check(&s).as_deref(),
            Some("loss_rate<0.1%: loss_rate was 1.0000%")
        );
    }
}
