//! A condition that can repeat thousands of times a second (a failing
//! `accept`), logged once and then counted: one line per interval while
//! it lasts.

use std::time::{Duration, Instant};

/// How often a condition that repeats (a failing `accept`) is logged again.
const REPEAT_EVERY: Duration = Duration::from_secs(10);

/// A condition that can repeat thousands of times a second (`accept:
/// Too many open files`): its first occurrence is logged at once, the rest
/// are counted and logged as one line per [`REPEAT_EVERY`] while it lasts.
pub(crate) struct Recurring {
    worker: usize,
    /// The last line logged, and when.
    last: Option<(String, Instant)>,
    /// Occurrences since then.
    since: u64,
}

impl Recurring {
    pub(crate) fn new(worker: usize) -> Self {
        Self {
            worker,
            last: None,
            since: 0,
        }
    }

    /// It happened (again) at `now`; returns the line to log, if one is due.
    pub(crate) fn note(&mut self, what: &str, now: Instant) -> Option<String> {
        self.since += 1;
        match &self.last {
            Some((_, at)) if now.duration_since(*at) < REPEAT_EVERY => None,
            _ => Some(self.line(what, now)),
        }
    }

    /// The count of what happened since the last line, once its interval
    /// is over (the tick asks, so the count of a condition that stopped is
    /// logged too).
    pub(crate) fn flush(&mut self, now: Instant) -> Option<String> {
        let (what, at) = self.last.clone()?;
        (self.since > 0 && now.duration_since(at) >= REPEAT_EVERY).then(|| self.line(&what, now))
    }

    fn line(&mut self, what: &str, now: Instant) -> String {
        let line = match &self.last {
            None => format!("throng: worker {}: {what}", self.worker),
            Some((_, at)) => format!(
                "throng: worker {}: {what} (x{} in the last {:.0}s)",
                self.worker,
                self.since,
                now.duration_since(*at).as_secs_f64()
            ),
        };
        self.last = Some((what.to_owned(), now));
        self.since = 0;
        line
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::Recurring;

    #[test]
    fn a_recurring_error_is_logged_once_then_counted_per_interval() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut r = Recurring::new(3);
        let what = "accept: Too many open files";
        assert_eq!(
            r.note(what, at(0)).as_deref(),
            Some("throng: worker 3: accept: Too many open files")
        );
        let lines: Vec<String> = (1..159).filter_map(|i| r.note(what, at(i * 20))).collect();
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(r.flush(at(5_000)), None, "not before the interval is over");
        assert_eq!(
            r.flush(at(10_000)).as_deref(),
            Some("throng: worker 3: accept: Too many open files (x158 in the last 10s)")
        );
        assert_eq!(r.flush(at(30_000)), None, "nothing since");
        let again = r.note(what, at(31_000)).unwrap();
        assert!(again.ends_with("(x1 in the last 21s)"), "{again}");
    }
}
