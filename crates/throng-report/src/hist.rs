//! Latency buckets as Vegeta draws them (`throng report --hist`, after
//! `vegeta report -type=hist[...]`): counted from a run's histogram.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency buckets as `vegeta report -type=hist[...]` draws them: each
/// bound starts a bucket that ends at the next (the last one is open), and
/// a first bound above 0 gets a bucket from 0 before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buckets(Vec<u64>);

impl Buckets {
    /// Parses `0,10ms,50ms,100ms` (or Vegeta's own `[0,10ms,50ms]`):
    /// increasing durations in the one grammar (`throng_host::units`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let inner = text.trim().trim_start_matches('[').trim_end_matches(']');
        let mut bounds = Vec::new();
        for part in inner.split(',') {
            let part = part.trim();
            let d = if part == "0" {
                std::time::Duration::ZERO
            } else {
                throng_host::units::parse_duration(part)
                    .map_err(|e| format!("--hist bound {part:?}: {e}"))?
            };
            let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            if bounds.last().is_some_and(|&last| ns <= last) {
                return Err(format!(
                    "--hist bounds go up: {part} is not above the bound before it (as in 0,10ms,50ms,100ms)"
                ));
            }
            if bounds.is_empty() && ns > 0 {
                bounds.push(0);
            }
            bounds.push(ns);
        }
        Ok(Self(bounds))
    }

    /// Counts the values of `h` (µs) into the buckets. A value is placed by
    /// the middle of its histogram step (3 significant digits): a latency
    /// within 0.1% of a bound may count on either side of it.
    pub fn count(&self, h: &Histogram<u64>) -> Vec<HistBucket> {
        let mut counts = vec![0u64; self.0.len()];
        for v in h.iter_recorded() {
            let ns = h
                .median_equivalent(v.value_iterated_to())
                .saturating_mul(1000);
            let i = self.0.iter().rposition(|&b| b <= ns).unwrap_or(0);
            counts[i] += v.count_at_value();
        }
        let total: u64 = counts.iter().sum();
        self.0
            .iter()
            .enumerate()
            .map(|(i, &from)| HistBucket {
                from_ns: from,
                to_ns: self.0.get(i + 1).copied(),
                count: counts[i],
                share: if total == 0 {
                    0.0
                } else {
                    counts[i] as f64 / total as f64
                },
            })
            .collect()
    }
}

/// One latency bucket and how many requests fell in it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistBucket {
    /// Its lower bound (included), ns.
    pub from_ns: u64,
    /// Its upper bound (excluded), ns; none for the last.
    pub to_ns: Option<u64>,
    /// Requests whose latency is in it.
    pub count: u64,
    /// Their share of all requests, 0 to 1.
    pub share: f64,
}

/// The buckets as Vegeta's text shows them: bounds, count, percentage
/// and a bar of `#` (75 wide for every request).
pub fn render_hist(buckets: &[HistBucket]) -> String {
    let show = |ns: u64| crate::text::latency(ns as f64 / 1000.0);
    let rows: Vec<[String; 4]> = buckets
        .iter()
        .map(|b| {
            [
                format!("[{},", show(b.from_ns)),
                format!("{}]", b.to_ns.map_or("+Inf".to_owned(), show)),
                b.count.to_string(),
                format!("{:.2}%", b.share * 100.0),
            ]
        })
        .collect();
    let width = |i: usize| rows.iter().map(|r| r[i].len()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0).max(6), width(1), width(2).max(1));
    let mut out = format!(
        "{:<w0$} {:<w1$}  {:>w2$}  {:>7}  Histogram\n",
        "Bucket", "", "#", "%"
    );
    for (r, b) in rows.iter().zip(buckets) {
        // Truncated, as Vegeta draws it.
        let bar = "#".repeat((b.share * 75.0) as usize);
        out.push_str(&format!(
            "{:<w0$} {:<w1$}  {:>w2$}  {:>7}  {bar}\n",
            r[0], r[1], r[2], r[3]
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interval::new_histogram;

    #[test]
    fn buckets_parse_like_vegeta_and_count() {
        assert_eq!(
            Buckets::parse("10ms,50ms").unwrap(),
            Buckets(vec![0, 10_000_000, 50_000_000])
        );
        assert_eq!(
            Buckets::parse("[0,1ms]").unwrap(),
            Buckets(vec![0, 1_000_000])
        );
        assert!(Buckets::parse("10ms,5ms").is_err());
        assert!(Buckets::parse("10ms,soon").is_err());
        let b = Buckets::parse("0,10ms,50ms").unwrap();
        let mut h = new_histogram();
        for us in [5_000, 9_000, 20_000, 70_000] {
            h.record(us).unwrap();
        }
        let got = b.count(&h);
        let counts: Vec<u64> = got.iter().map(|b| b.count).collect();
        assert_eq!(counts, [2, 1, 1]);
        assert_eq!(got[2].to_ns, None);
        assert!((got[0].share - 0.5).abs() < 1e-9);
        let text = render_hist(&got);
        assert!(text.contains("+Inf]"), "{text}");
        assert!(
            text.lines().nth(1).unwrap().contains(&"#".repeat(37)),
            "{text}"
        );
    }
}
