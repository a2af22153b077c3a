//! The service objective every level must meet, and the verdict on what a
//! level's run measured: it passed; it failed, and why (which percentile,
//! which error kind); or the generator, not the target, fell behind.
//!
//! The generator is blamed only when both are true: it fell behind its own
//! schedule (its lag), and either one of its processes was out of CPU or
//! the same latency measured from the moment it actually sent would have
//! met the objective. A slow target makes the generator wait too (for
//! connections, for answers), but then the latency from the actual send
//! is slow as well, and the target is the one that failed.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use throng_host::units::fmt_duration;
use throng_report::knee::Verdict;
use throng_report::summary::HistStats;
use throng_report::text::micros;

use crate::attack::record::LATE_US;
use crate::harness::clock;

/// The default `--slo-p99`.
pub const DEFAULT_P99: Duration = Duration::from_millis(100);
/// The default `--max-error-rate`: 0.1%.
pub const DEFAULT_MAX_ERROR_RATE: f64 = 0.001;
/// A generator process using this share of its one core is out of CPU.
pub const GENERATOR_CPU: f64 = 0.9;
/// The generator's lag p99 above which it fell behind (the harness's
/// "late" threshold).
pub const GENERATOR_LAG_US: u64 = LATE_US;
/// A generator worker whose record of a measured interval came this late
/// (µs after the interval's end) was held up that long: the level is the
/// generator's, whatever it measured meanwhile. A second: far above a busy
/// machine's usual few hundred ms, below the 1.5 s stalls that misled.
pub const GENERATOR_STALL_US: u64 = 1_000_000;
/// Share of events started late above which the generator fell behind.
pub const GENERATOR_LATE_SHARE: f64 = 0.01;

/// What every level must meet.
#[derive(Debug, Clone, PartialEq)]
pub struct Objective {
    /// The most the 99th percentile may be (`--slo-p99`).
    pub p99: Option<Duration>,
    /// The most the 99.9th percentile may be (`--slo-p999`).
    pub p999: Option<Duration>,
    /// The most failures may be, over attempts (`--max-error-rate`).
    pub max_error_rate: f64,
    /// Messages that may be lost (`--max-lost`; hold and publish).
    pub max_lost: Option<u64>,
}

/// What one run of a level measured, as the objective reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// The latency judged (from the intended start), µs.
    pub latency: HistStats,
    /// What that latency is called (`request latency`, `connect latency`).
    pub latency_name: &'static str,
    /// The same latency measured from the actual start (attack's service
    /// time, hold's connect from its actual start, publish's call), µs.
    pub from_actual: Option<HistStats>,
    /// Delivery latency, judged too (hold), µs.
    pub delivery: Option<HistStats>,
    /// Failures by kind.
    pub errors: BTreeMap<String, u64>,
    /// What failures are counted against.
    pub attempts: u64,
    /// Messages lost, net of late arrivals (hold, publish).
    pub lost: Option<u64>,
    /// The generator's lag behind its schedule, µs.
    pub lag: HistStats,
    /// Share of events started more than [`GENERATOR_LAG_US`] late.
    pub late_share: f64,
    /// CPU of the generator's busiest process, cores.
    pub generator_cpu: f64,
    /// That process.
    pub generator_busiest: String,
    /// The longest a generator worker (a subscriber's included) was held
    /// up in the measured span, µs (its record came that late), and whose.
    pub stall_us: u64,
    /// See `stall_us`.
    pub stalled: String,
}

impl Figures {
    /// Failures over attempts (0 without attempts).
    pub fn error_rate(&self) -> f64 {
        let errors: u64 = self.errors.values().sum();
        if self.attempts == 0 {
            0.0
        } else {
            errors as f64 / self.attempts as f64
        }
    }
}

impl Objective {
    /// The objective, one rule per line, as printed at start.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(d) = self.p99 {
            out.push(format!("p99 <= {} (--slo-p99)", fmt_duration(d)));
        }
        if let Some(d) = self.p999 {
            out.push(format!("p99.9 <= {} (--slo-p999)", fmt_duration(d)));
        }
        out.push(format!(
            "error rate <= {} (--max-error-rate)",
            percent(self.max_error_rate)
        ));
        if let Some(n) = self.max_lost {
            out.push(format!("messages lost <= {n} (--max-lost)"));
        }
        out
    }

    /// The verdict on `f`, with the reasons of a failure, most telling first.
    pub fn judge(&self, f: &Figures) -> (Verdict, Vec<String>) {
        let mut reasons = self.misses(&f.latency, f.latency_name, f.attempts > 0);
        if let Some(d) = &f.delivery {
            reasons.extend(self.misses(d, "delivery latency", false));
        }
        let errors = self.errors_over(f);
        reasons.extend(errors.clone());
        if let (Some(lost), Some(max)) = (f.lost, self.max_lost)
            && lost > max
        {
            reasons.push(format!("{lost} messages lost, over --max-lost {max}"));
        }
        if reasons.is_empty() {
            return (Verdict::Pass, reasons);
        }
        let behind = f.lag.p99 > GENERATOR_LAG_US || f.late_share > GENERATOR_LATE_SHARE;
        let out_of_cpu = f.generator_cpu >= GENERATOR_CPU;
        // Measured from the actual send, would the latency have passed (and nothing else failed)?
        let fine_from_actual = f.from_actual.as_ref().is_some_and(|h| {
            h.count > 0
                && self.misses(h, f.latency_name, false).is_empty()
                && f.delivery
                    .as_ref()
                    .is_none_or(|d| self.misses(d, "", false).is_empty())
        }) && errors.is_empty()
            && f.lost.zip(self.max_lost).is_none_or(|(l, m)| l <= m);
        // A stall explains a miss that is mostly the stall itself (a
        // subscriber held up 1.5 s reads a delivery 1.46 s late); a target
        // far slower than any hiccup of a busy machine is still the target's.
        let worst_p99 = f
            .delivery
            .as_ref()
            .map_or(f.latency.p99, |d| d.p99.max(f.latency.p99));
        let stall_explains = f.stall_us >= GENERATOR_STALL_US
            && f.stall_us.saturating_mul(5) >= worst_p99.saturating_mul(4)
            && errors.is_empty()
            && f.lost.zip(self.max_lost).is_none_or(|(l, m)| l <= m);
        if stall_explains {
            let mut why = vec![format!(
                "a generator worker ({}) was held up {}: what it measured then (deliveries read late) is its own delay, not the target's",
                f.stalled,
                micros(f.stall_us)
            )];
            why.extend(reasons);
            return (Verdict::Generator, why);
        }
        if behind && (out_of_cpu || fine_from_actual) {
            let mut why = vec![format!(
                "the generator fell behind its schedule: lag p99 {}, {} of its events started over {} late",
                micros(f.lag.p99),
                percent(f.late_share),
                micros(GENERATOR_LAG_US)
            )];
            if out_of_cpu {
                why.push(format!(
                    "its busiest process ({}) used {:.2} of a core",
                    f.generator_busiest, f.generator_cpu
                ));
            }
            if fine_from_actual && let Some(h) = &f.from_actual {
                why.push(format!(
                    "measured from the actual send, {} p99 was {}, within the objective",
                    f.latency_name,
                    micros(h.p99)
                ));
            }
            why.extend(reasons);
            return (Verdict::Generator, why);
        }
        (Verdict::Fail, reasons)
    }

    /// The percentiles of `h` over the objective. `expected`: values were
    /// due, so none at all is a failure in itself.
    fn misses(&self, h: &HistStats, name: &str, expected: bool) -> Vec<String> {
        let mut out = Vec::new();
        if h.count == 0 {
            if expected {
                out.push(format!("no {name} measured: nothing was answered"));
            }
            return out;
        }
        for (slo, value, p, flag) in [
            (self.p99, h.p99, "p99", "--slo-p99"),
            (self.p999, h.p999, "p99.9", "--slo-p999"),
        ] {
            if let Some(slo) = slo
                && value > clock::micros(slo)
            {
                out.push(format!(
                    "{name} {p} {} is over {flag} {}",
                    micros(value),
                    fmt_duration(slo)
                ));
            }
        }
        out
    }

    /// The error rate over the objective, with its kinds, largest first.
    fn errors_over(&self, f: &Figures) -> Vec<String> {
        let rate = f.error_rate();
        if rate <= self.max_error_rate || f.errors.values().sum::<u64>() == 0 {
            return Vec::new();
        }
        let mut kinds: Vec<(&String, &u64)> = f.errors.iter().filter(|(_, n)| **n > 0).collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        vec![format!(
            "error rate {} is over --max-error-rate {} ({})",
            percent(rate),
            percent(self.max_error_rate),
            kinds.join(", ")
        )]
    }

    /// Whether a run already failed beyond doubt, before its end: more of
    /// `latency`'s values are over the objective than its percentiles
    /// allow of everything `planned` (with room to spare), or more
    /// failures than the error rate allows of `planned` attempts.
    pub fn clearly_missed(
        &self,
        latency: Option<&Histogram<u64>>,
        errors: u64,
        planned: u64,
    ) -> Option<String> {
        if planned == 0 {
            return None;
        }
        if let Some(h) = latency {
            for (slo, share, p, flag) in [
                (self.p99, 0.015, "p99", "--slo-p99"),
                (self.p999, 0.0015, "p99.9", "--slo-p999"),
            ] {
                let Some(slo) = slo else { continue };
                let over = count_over(h, clock::micros(slo));
                if over as f64 > share * planned as f64 {
                    return Some(format!(
                        "{over} of the {planned} planned already took over {} ({flag}), so its {p} is over",
                        fmt_duration(slo)
                    ));
                }
            }
        }
        if errors as f64 > self.max_error_rate * planned as f64 {
            return Some(format!(
                "{errors} of the {planned} planned already failed, over --max-error-rate {}",
                percent(self.max_error_rate)
            ));
        }
        None
    }
}

/// Values of `h` above `us`.
fn count_over(h: &Histogram<u64>, us: u64) -> u64 {
    h.iter_recorded()
        .filter(|v| v.value_iterated_to() > us)
        .map(|v| v.count_at_value())
        .sum()
}

/// `0.1%`, `12.5%`, `0%`.
pub fn percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if p == 0.0 || p >= 10.0 {
        format!("{p:.0}%")
    } else if p >= 1.0 {
        let s = format!("{p:.1}");
        format!("{}%", s.trim_end_matches(".0"))
    } else {
        let s = format!("{p:.3}");
        format!("{}%", s.trim_end_matches('0').trim_end_matches('.'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use throng_report::interval::new_histogram;

    fn objective() -> Objective {
        Objective {
            p99: Some(Duration::from_millis(100)),
            p999: None,
            max_error_rate: 0.001,
            max_lost: None,
        }
    }

    fn stats(p99_us: u64) -> HistStats {
        HistStats {
            count: 1000,
            p50: p99_us / 10,
            p99: p99_us,
            p999: p99_us,
            ..HistStats::default()
        }
    }

    fn figures(p99_us: u64) -> Figures {
        Figures {
            latency: stats(p99_us),
            latency_name: "request latency",
            from_actual: Some(stats(p99_us)),
            attempts: 1000,
            lag: stats(50),
            generator_cpu: 0.2,
            generator_busiest: "h/attack-0".into(),
            ..Figures::default()
        }
    }

    #[test]
    fn a_level_within_the_objective_passes() {
        assert_eq!(objective().judge(&figures(80_000)), (Verdict::Pass, vec![]));
    }

    #[test]
    fn a_stalled_subscriber_worker_is_the_generators_fault() {
        // knee publish: the publisher kept its schedule, a subscriber worker
        // stalled 1.5 s and read its deliveries late.
        let mut f = figures(2_000);
        f.delivery = Some(stats(1_460_000));
        f.stall_us = 1_500_000;
        f.stalled = "h/knee-1".into();
        let (v, why) = objective().judge(&f);
        assert_eq!(v, Verdict::Generator, "{why:?}");
        assert!(
            why[0].contains("h/knee-1") && why[0].contains("1.50s"),
            "{why:?}"
        );
        // A short hiccup is not a stall: the target is judged.
        f.stall_us = 200_000;
        assert_eq!(objective().judge(&f).0, Verdict::Fail);
        // Nor is a stall far shorter than the target's own slowness.
        f.stall_us = 1_200_000;
        f.delivery = Some(stats(6_000_000));
        assert_eq!(objective().judge(&f).0, Verdict::Fail);
    }

    #[test]
    fn a_slow_target_fails_on_its_percentile() {
        let (v, why) = objective().judge(&figures(412_000));
        assert_eq!(v, Verdict::Fail);
        assert_eq!(why, ["request latency p99 412ms is over --slo-p99 100ms"]);
    }

    #[test]
    fn errors_fail_a_level_by_kind_largest_first() {
        let mut f = figures(1_000);
        f.errors.insert("timeout".into(), 2);
        f.errors.insert("status.503".into(), 7);
        let (v, why) = objective().judge(&f);
        assert_eq!(v, Verdict::Fail);
        assert_eq!(
            why,
            ["error rate 0.9% is over --max-error-rate 0.1% (status.503 7, timeout 2)"]
        );
        f.errors.clear();
        f.errors.insert("timeout".into(), 1);
        assert_eq!(objective().judge(&f).0, Verdict::Pass);
    }

    #[test]
    fn nothing_answered_is_a_failure_not_a_pass() {
        let mut f = figures(1_000);
        f.latency = HistStats::default();
        f.from_actual = None;
        let (v, why) = objective().judge(&f);
        assert_eq!(v, Verdict::Fail);
        assert!(why[0].contains("no request latency measured"), "{why:?}");
    }

    #[test]
    fn a_generator_behind_with_a_fast_target_is_blamed() {
        // Waiting for a connection of its own: late, slow from the intended
        // start, fast from the actual send.
        let mut f = figures(900_000);
        f.from_actual = Some(stats(300));
        f.lag = stats(850_000);
        let (v, why) = objective().judge(&f);
        assert_eq!(v, Verdict::Generator);
        assert!(
            why[0].starts_with("the generator fell behind its schedule: lag p99 850ms"),
            "{why:?}"
        );
        assert!(
            why[1].contains("from the actual send, request latency p99 was 300µs"),
            "{why:?}"
        );
    }

    #[test]
    fn a_generator_out_of_cpu_is_blamed_even_when_everything_looks_slow() {
        let mut f = figures(900_000);
        f.lag = stats(800_000);
        f.generator_cpu = 0.97;
        let (v, why) = objective().judge(&f);
        assert_eq!(v, Verdict::Generator);
        assert!(
            why[1].contains("(h/attack-0) used 0.97 of a core"),
            "{why:?}"
        );
    }

    #[test]
    fn a_slow_target_that_makes_the_generator_wait_is_still_the_target() {
        // Late because every connection waits on the target: slow from the
        // actual send too, and the generator had CPU to spare.
        let mut f = figures(900_000);
        f.lag = stats(400_000);
        let (v, _) = objective().judge(&f);
        assert_eq!(v, Verdict::Fail);
    }

    #[test]
    fn losses_count_against_max_lost() {
        let o = Objective {
            max_lost: Some(0),
            ..objective()
        };
        let mut f = figures(1_000);
        f.lost = Some(3);
        let (v, why) = o.judge(&f);
        assert_eq!(
            (v, why[0].as_str()),
            (Verdict::Fail, "3 messages lost, over --max-lost 0")
        );
        f.lost = Some(0);
        assert_eq!(o.judge(&f).0, Verdict::Pass);
    }

    #[test]
    fn a_run_fails_beyond_doubt_once_too_many_are_over() {
        let o = objective();
        let mut h = new_histogram();
        h.record_n(1_000, 90).unwrap();
        h.record_n(500_000, 14).unwrap();
        // 14 of 1000 planned over 100 ms: under 1.5%, not yet beyond doubt.
        assert_eq!(o.clearly_missed(Some(&h), 0, 1000), None);
        h.record_n(500_000, 2).unwrap();
        let why = o.clearly_missed(Some(&h), 0, 1000).unwrap();
        assert!(
            why.starts_with("16 of the 1000 planned already took over 100ms"),
            "{why}"
        );
        assert!(o.clearly_missed(None, 2, 1000).is_some());
        assert!(o.clearly_missed(None, 1, 1000).is_none());
        assert!(o.clearly_missed(Some(&h), 5, 0).is_none());
    }

    #[test]
    fn percents_read_like_people_write_them() {
        assert_eq!(percent(0.001), "0.1%");
        assert_eq!(percent(0.0), "0%");
        assert_eq!(percent(0.123), "12%");
        assert_eq!(percent(0.05), "5%");
        assert_eq!(percent(0.025), "2.5%");
        assert_eq!(percent(0.00025), "0.025%");
        assert_eq!(percent(1.0), "100%");
    }
}
