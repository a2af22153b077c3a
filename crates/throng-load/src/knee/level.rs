//! One run of one level: the role of `attack` or `hold` at the level's
//! load, inside a role of the knee's own ([`Level`]) that keeps every
//! interval the run flushed, knows which are warm-up and which are
//! measured, draws each progress line with the level and its time left,
//! stops a run that already failed beyond doubt, and (hold, publish) runs
//! the level's publisher beside the held connections.
//!
//! The inner role does everything it does alone (its plan, its workers'
//! events, its end); being stopped early is its Ctrl-C.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use throng_report::format::Event;
use throng_report::interval::Interval;

use super::publisher::{self, Publishing};
use crate::harness::clock::{nanos, now_unix_ns};
use crate::harness::collect::Totals;
use crate::harness::progress::View;
use crate::harness::worker::CPU_COUNTER;
use crate::harness::{Role, Run};

/// Decides, from what was flushed so far (every interval, and the measured
/// ones), whether the run already failed beyond doubt, and why.
pub type Check = Box<dyn FnMut(&Interval, &Interval) -> Option<String>>;

/// What the progress lines say about the level.
#[derive(Debug, Clone)]
pub struct Banner {
    /// `run 3 · 2000/s · refine`.
    pub title: String,
    /// When the run is expected to end.
    pub ends: Instant,
}

/// Where measuring starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// This long after the schedule's start (attack), for this long.
    AfterStart {
        /// The warm-up.
        warmup: Duration,
        /// The step measured after it.
        step: Duration,
    },
    /// From the publisher's warm-up end to its last message (hold, publish).
    Publisher,
}

/// What one run of a level flushed.
#[derive(Debug)]
pub struct Measured {
    /// Every interval, in order (merged over the workers, with the host
    /// sample), without its histograms.
    pub intervals: Vec<Interval>,
    /// Every interval added up.
    pub all: Interval,
    /// The measured intervals added up.
    pub window: Interval,
    /// Seconds the measured intervals span.
    pub window_s: f64,
    /// Intervals that lie wholly inside the measured span: their count
    /// and their sum, for rates (the tail after the schedule only
    /// collects answers).
    pub steady: Interval,
    /// Seconds those span.
    pub steady_s: f64,
    /// Where measuring started and was meant to end, Unix ns (`u64::MAX`
    /// when it never started).
    pub from_ns: u64,
    /// See `from_ns`.
    pub to_ns: u64,
    /// The reason the run was stopped early, when it failed beyond doubt.
    pub failed_early: Option<String>,
    /// Stopped by Ctrl-C.
    pub interrupted: bool,
    /// The longest a generator worker (a subscriber's included) was held
    /// up in the measured span: how late its record came, ns; and whose.
    pub stall_ns: u64,
    /// See `stall_ns`.
    pub stalled: String,
    /// The worker that used the most CPU over the measured span, by its
    /// own records (`worker.cpu_us`: on agents too), and how much (cores).
    pub busiest_worker: (String, f64),
}

/// The knee's role around a level's `attack` or `hold`.
pub struct Level<R: Role> {
    inner: R,
    banner: Banner,
    window: Window,
    /// Measuring starts and ends (Unix ns); `u64::MAX` until known.
    from_ns: u64,
    to_ns: u64,
    intervals: Vec<Interval>,
    all: Interval,
    measured: Interval,
    check: Check,
    failed_early: Option<String>,
    /// The inner role was told to stop.
    stopping: bool,
    /// When it was stopped early (Unix ns): rates are measured before it.
    stopped_ns: u64,
    interrupted: bool,
    publishing: Option<Rc<Publishing>>,
    /// Workers through their ramp (or gone), for the publisher.
    ramps_done: usize,
    /// The longest lateness of a worker's record in the measured span, and whose.
    stall: (u64, String),
    /// Each worker's CPU over the measured span, by source: the start of
    /// the last record counted, and the µs added up.
    cpu: BTreeMap<String, (u64, u64)>,
}

impl<R: Role> std::fmt::Debug for Level<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Level")
            .field("banner", &self.banner)
            .field("window", &self.window)
            .finish()
    }
}

impl<R: Role> Level<R> {
    /// `inner` as one level's run.
    pub fn new(
        inner: R,
        banner: Banner,
        window: Window,
        check: Check,
        publishing: Option<Rc<Publishing>>,
    ) -> Self {
        Self {
            inner,
            banner,
            window,
            from_ns: u64::MAX,
            to_ns: u64::MAX,
            intervals: Vec::new(),
            all: Interval::empty(0, 0, String::new()),
            measured: Interval::empty(0, 0, String::new()),
            check,
            failed_early: None,
            stopping: false,
            stopped_ns: u64::MAX,
            interrupted: false,
            publishing,
            ramps_done: 0,
            stall: (0, String::new()),
            cpu: BTreeMap::new(),
        }
    }

    /// One more worker is through its ramp (or gone): after the last, publishing begins.
    fn ramp_step(&mut self) {
        self.ramps_done += 1;
        if self.ramps_done >= self.inner.workers().max(1) as usize
            && let Some(p) = &self.publishing
        {
            p.ramp_done();
        }
    }

    /// Ends the inner role's run (its Ctrl-C), once.
    fn stop_inner(&mut self, run: &Rc<Run>) {
        if !self.stopping {
            self.stopping = true;
            let _ = self.inner.interrupted(run);
        }
    }

    /// The measuring window, once known.
    fn window_ns(&self) -> (u64, u64) {
        match (&self.window, &self.publishing) {
            (Window::Publisher, Some(p)) => p.window(),
            _ => (self.from_ns, self.to_ns),
        }
    }
}

impl<R: Role> Role for Level<R> {
    /// Workers are `<host>/knee-<i>`, notes `throng knee: ...`.
    const NAME: &'static str = "knee";
    const WORKER: &'static str = R::WORKER;
    type Plan = R::Plan;
    type Summary = Measured;

    fn workers(&self) -> u32 {
        self.inner.workers()
    }

    fn interval_ns(&self) -> u64 {
        self.inner.interval_ns()
    }

    fn plan(&self, index: u32, label: String, start_unix_ns: u64) -> R::Plan {
        self.inner.plan(index, label, start_unix_ns)
    }

    fn started(&mut self, run: &Rc<Run>) {
        if let Window::AfterStart { warmup, step } = self.window {
            self.from_ns = run.start().unix_ns() + nanos(warmup);
            self.to_ns = self.from_ns + nanos(step);
        }
        self.inner.started(run);
        if let Some(p) = &self.publishing {
            tokio::task::spawn_local(publisher::publish(p.clone(), run.clone()));
        }
    }

    fn event(&mut self, worker: usize, ev: &Event, run: &Rc<Run>) -> bool {
        if ev.kind == "worker.ramp_done" {
            self.ramp_step();
        }
        self.inner.event(worker, ev, run)
    }

    fn gone(&mut self, worker: usize, done: bool, run: &Rc<Run>) {
        if !done {
            // A worker that died never reports its ramp.
            self.ramp_step();
        }
        self.inner.gone(worker, done, run);
    }

    fn interrupted(&mut self, run: &Rc<Run>) -> &'static str {
        self.interrupted = true;
        if let Some(p) = &self.publishing {
            p.stop();
        }
        self.stop_inner(run);
        "Ctrl-C: stopping this level and the search (press again to kill the workers)"
    }

    fn tick(&mut self, run: &Rc<Run>) {
        // Once: the publisher may take a while to end the hold after it.
        if let Some(why) = &self.failed_early
            && !self.stopping
            && self.stopped_ns == u64::MAX
        {
            run.note(&format!(
                "{}: failed beyond doubt ({why}); stopping it early",
                self.banner.title
            ));
            self.stopped_ns = now_unix_ns();
            match &self.publishing {
                // The publisher tells the workers the last message, then the hold ends.
                Some(p) => p.stop(),
                None => self.stop_inner(run),
            }
        }
        if self.publishing.as_ref().is_some_and(|p| p.finished()) {
            self.stop_inner(run);
        }
        self.inner.tick(run);
    }

    fn own(&mut self, start_ns: u64, length_ns: u64) -> Interval {
        let mut own = self.inner.own(start_ns, length_ns);
        if let Some(p) = &self.publishing {
            own.add(&p.own(start_ns, length_ns));
        }
        own
    }

    fn late(&mut self, merged: &Interval) {
        self.inner.late(merged);
    }

    fn absorb(&mut self, merged: &Interval) {
        self.inner.absorb(merged);
        self.all.add(merged);
        let (from, _) = self.window_ns();
        if merged.start_ns >= from {
            self.measured.add(merged);
        }
        // Without its histograms (they are in the sums): the publisher shares
        // this thread, and copying them every second would delay it.
        self.intervals.push(Interval {
            start_ns: merged.start_ns,
            length_ns: merged.length_ns,
            source: merged.source.clone(),
            counters: merged.counters.clone(),
            gauges: merged.gauges.clone(),
            peaks: merged.peaks.clone(),
            histograms: Default::default(),
            host: merged.host.clone(),
        });
        if self.failed_early.is_none() && !self.stopping {
            self.failed_early = (self.check)(&self.all, &self.measured);
        }
    }

    fn progress(&mut self, view: &View<'_>) -> String {
        let (from, to) = self.window_ns();
        let end = view.merged.start_ns + view.merged.length_ns;
        if from != u64::MAX && view.merged.start_ns >= from && end <= to {
            // A worker held up sends its record late: a subscriber worker
            // that stalls reads its deliveries late, and the target is not
            // to blame for that.
            for w in view.workers.iter().flatten() {
                if w.start_ns >= from && w.late_ns > self.stall.0 {
                    self.stall = (w.late_ns, w.source.clone());
                }
                // Each record once, however many flushes it is the latest of.
                let (last, sum) = self.cpu.entry(w.source.clone()).or_default();
                if w.start_ns >= from && w.start_ns < to && (*last == 0 || w.start_ns > *last) {
                    *last = w.start_ns;
                    *sum += w.counters.get(CPU_COUNTER).copied().unwrap_or(0);
                }
            }
        }
        let stage = if from == u64::MAX || end <= from {
            "warm-up"
        } else if end <= to {
            "measuring"
        } else {
            "ending"
        };
        let left = self
            .banner
            .ends
            .saturating_duration_since(Instant::now())
            .as_secs();
        format!(
            "{} · {stage} · {left}s left | {}",
            self.banner.title,
            self.inner.progress(view)
        )
    }

    fn finish(self, totals: Totals, run: &Rc<Run>) -> Measured {
        let (from, to) = self.window_ns();
        let to = to.min(self.stopped_ns);
        let _ = self.inner.finish(totals, run);
        let mut window_s = 0.0;
        let mut steady = Interval::empty(0, 0, String::new());
        let mut steady_s = 0.0;
        for iv in self.intervals.iter().filter(|iv| iv.start_ns >= from) {
            let length_s = iv.length_ns as f64 / 1e9;
            window_s += length_s;
            if iv.start_ns + iv.length_ns <= to {
                steady.add(iv);
                steady_s += length_s;
            }
        }
        Measured {
            intervals: self.intervals,
            all: self.all,
            window: self.measured,
            window_s,
            steady,
            steady_s,
            from_ns: from,
            to_ns: to,
            failed_early: self.failed_early,
            interrupted: self.interrupted,
            stall_ns: self.stall.0,
            stalled: self.stall.1,
            busiest_worker: busiest(&self.cpu, from, to),
        }
    }
}
/// The worker whose CPU over the span `from_ns..to_ns` was the most, in cores.
fn busiest(cpu: &BTreeMap<String, (u64, u64)>, from_ns: u64, to_ns: u64) -> (String, f64) {
    if from_ns == u64::MAX || to_ns == u64::MAX || to_ns <= from_ns {
        return (String::new(), 0.0);
    }
    let span_ns = to_ns - from_ns;
    cpu.iter()
        .map(|(who, (_, us))| (who.clone(), *us as f64 * 1e3 / span_ns as f64))
        .fold((String::new(), 0.0), |a, b| if b.1 > a.1 { b } else { a })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_worker_is_the_most_cpu_over_the_span() {
        let cpu = BTreeMap::from([
            ("a1/knee-0".to_owned(), (0, 400_000)),
            ("b2/knee-1".to_owned(), (0, 1_800_000)),
        ]);
        let (who, cores) = busiest(&cpu, 10_000_000_000, 12_000_000_000);
        assert_eq!(who, "b2/knee-1");
        assert!((cores - 0.9).abs() < 1e-9, "{cores}");
        assert_eq!(busiest(&cpu, u64::MAX, u64::MAX), (String::new(), 0.0));
    }
}
