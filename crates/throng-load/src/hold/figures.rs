//! The figures a `hold` threshold may name (`--threshold 'lost==0'`,
//! `'delivery_p99<100ms'`, `'connect_p99<1s'`), read from its summary at the
//! end and from its running totals for `--abort-on-fail`.

use throng_report::interval::Interval;

use super::summary::Summary;
use crate::threshold::{Catalogue, Figure, Figures, Live, count_over};

/// `hold`'s figures: a bare `p99` is the delivery latency.
pub const FIGURES: Catalogue = Catalogue {
    command: "hold",
    latencies: &["delivery", "connect", "publish", "pushed"],
    ratios: &["loss_rate"],
    rates: &["connect_rate"],
    counts: &[
        "lost",
        "connect_errors",
        "duplicated",
        "out_of_order",
        "received",
        "opened",
        "publish_errors",
    ],
};

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
