//! `attack` on the supervisor's side, a [`Role`] of the harness core: each
//! worker gets the same plan with its own index, the run ends when every
//! worker has sent its share (or at Ctrl-C, which stops them at once), and
//! the summary adds what each worker said at its end.

use std::io;
use std::rc::Rc;

use throng_report::format::Event;
use throng_report::interval::Interval;

use super::record::LATE_US;
use super::summary::{Running, Summary, progress_line};
use super::worker::Done;
use super::{Load, WorkerPlan};
use crate::harness::collect::Totals;
use crate::harness::progress::View;
use crate::harness::worker::{LATE, Order};
use crate::harness::{Role, Run, Setup};
use crate::pacer::{Pacer, RateSpec, stage_note};
use crate::threshold::Threshold;

/// A whole `attack` run, planned.
#[derive(Debug, Clone)]
pub struct AttackRun {
    /// The plan every worker gets (its `index`, `label` and start are filled in).
    pub plan: WorkerPlan,
    /// Requests the schedule plans (rate mode), for the progress and summary.
    pub planned: Option<u64>,
    /// Thresholds checked as the run goes (`--abort-on-fail`): the first
    /// that can no longer pass stops it.
    pub abort: Vec<Threshold>,
}

/// Runs a whole attack.
pub fn run(attack: AttackRun, setup: Setup) -> io::Result<Summary> {
    crate::harness::supervise::run(role(attack), setup)
}

/// The role of a whole attack, for a caller that runs it inside a role of
/// its own (`knee` runs one per level).
pub fn role(attack: AttackRun) -> Attack {
    let workers = attack.plan.workers.max(1) as usize;
    Attack {
        summary: Summary {
            workers: workers as u32,
            planned: attack.planned,
            late_threshold_us: LATE_US,
            ..Summary::default()
        },
        schedule: match attack.plan.load {
            Load::Rate(spec) => super::pacer(
                spec,
                attack.plan.duration_ns.map(std::time::Duration::from_nanos),
                attack.plan.requests,
            )
            .ok(),
            Load::Max { .. } => None,
        },
        start_ns: 0,
        planned_counted: 0,
        attack,
        dones: vec![None; workers],
        doomed: None,
    }
}

/// The `attack` role.
#[derive(Debug)]
pub struct Attack {
    attack: AttackRun,
    /// What each worker said at its end.
    dones: Vec<Option<Done>>,
    /// Figures kept while the run goes (peaks, stopped).
    summary: Summary,
    /// A threshold that can no longer pass, to stop the run at the next tick.
    doomed: Option<String>,
    /// The open model's schedule: what each interval planned.
    schedule: Option<Pacer>,
    /// When it started, ns since the epoch: the run's start, or the latest
    /// worker's if one was ready only after it.
    start_ns: u64,
    /// `requests.planned` counted in the intervals flushed so far (a
    /// later start does not count them again).
    planned_counted: u64,
}

impl Attack {
    /// Requests the schedule plans before `t_ns` (ns since the epoch):
    /// those due strictly before it, up to the run's planned total.
    fn planned_before(&self, t_ns: u64) -> u64 {
        let Some(pacer) = &self.schedule else {
            return 0;
        };
        if t_ns <= self.start_ns || self.start_ns == 0 {
            return 0;
        }
        let due = pacer.due(std::time::Duration::from_nanos(t_ns - self.start_ns - 1));
        self.attack.planned.map_or(due, |p| due.min(p))
    }
}

impl Role for Attack {
    const NAME: &'static str = "attack";
    type Plan = WorkerPlan;
    type Summary = Summary;

    fn workers(&self) -> u32 {
        self.attack.plan.workers.max(1)
    }

    fn interval_ns(&self) -> u64 {
        self.attack.plan.settings.interval_ns
    }

    fn plan(&self, index: u32, label: String, start_unix_ns: u64) -> WorkerPlan {
        WorkerPlan {
            index,
            workers: self.workers(),
            label,
            start_unix_ns,
            ..self.attack.plan.clone()
        }
    }

    fn event(&mut self, worker: usize, ev: &Event, _run: &Rc<Run>) -> bool {
        if ev.kind == LATE {
            // It started its schedule when it said so: plan from there.
            self.start_ns = self.start_ns.max(ev.at_ns);
            return false;
        }
        if ev.kind != "worker.done" {
            return false;
        }
        if let Some(slot) = self.dones.get_mut(worker) {
            *slot = Some(serde_json::from_str(&ev.text).unwrap_or_default());
        }
        true
    }

    fn gone(&mut self, worker: usize, done: bool, run: &Rc<Run>) {
        if !done {
            run.note(&format!(
                "{}: worker exited early; its requests are not counted",
                run.crew().label(worker)
            ));
        }
    }

    fn interrupted(&mut self, run: &Rc<Run>) -> &'static str {
        self.summary.stopped = true;
        run.crew().stop_all(&Order::Stop(0));
        "Ctrl-C: stopping; requests in flight count as canceled (press again to kill)"
    }

    fn started(&mut self, run: &Rc<Run>) {
        self.start_ns = run.start().unix_ns();
    }

    /// `requests.planned`: what the schedule planned in the interval, beside
    /// what was sent (`requests.sent`), so a report shows both.
    fn own(&mut self, start_ns: u64, length_ns: u64) -> Interval {
        let mut iv = Interval::empty(start_ns, length_ns, String::new());
        let n = self
            .planned_before(start_ns + length_ns)
            .saturating_sub(self.planned_counted);
        self.planned_counted += n;
        if n > 0 {
            iv.counters.insert("requests.planned".into(), n);
        }
        iv
    }

    fn counted(&mut self, totals: &Interval) {
        if self.doomed.is_some() || self.summary.aborted.is_some() {
            return;
        }
        let live = Running {
            totals,
            planned: self.attack.planned,
        };
        self.doomed = self.attack.abort.iter().find_map(|t| t.doomed(&live));
    }

    fn tick(&mut self, run: &Rc<Run>) {
        if let Some(why) = self.doomed.take() {
            run.note(&format!(
                "--abort-on-fail: {why}; stopping (requests in flight count as canceled)"
            ));
            self.summary.stopped = true;
            self.summary.aborted = Some(why);
            run.crew().stop_all(&Order::Stop(0));
        }
    }

    fn late(&mut self, merged: &Interval) {
        self.absorb(merged);
    }

    fn absorb(&mut self, merged: &Interval) {
        let s = &mut self.summary;
        s.peak_in_flight = s.peak_in_flight.max(merged.peak("requests.in_flight"));
        s.peak_connections = s.peak_connections.max(merged.peak("connections.open"));
    }

    fn progress(&mut self, view: &View<'_>) -> String {
        let mut line = progress_line(view, self.attack.planned);
        if let (Load::Rate(RateSpec::Stages(st)), Some(p)) = (self.attack.plan.load, &self.schedule)
        {
            line.push_str(&stage_note(&st, p, view.elapsed_s()));
        }
        line
    }

    fn finish(mut self, totals: Totals, run: &Rc<Run>) -> Summary {
        let open_model = matches!(self.attack.plan.load, Load::Rate(_));
        self.summary
            .finish(totals, &self.dones, run.start().unix_ns(), open_model);
        self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker ready late moves the schedule's start: the intervals after
    /// it plan from there, and no request is planned twice.
    #[test]
    fn a_later_start_plans_each_request_once() {
        let second = 1_000_000_000;
        let mut role = role(AttackRun {
            plan: WorkerPlan {
                index: 0,
                workers: 1,
                label: String::new(),
                load: Load::Rate(RateSpec::Constant(100.0)),
                duration_ns: Some(2 * second),
                requests: None,
                targets: Vec::new(),
                lazy: None,
                addrs: Vec::new(),
                sources: Vec::new(),
                start_unix_ns: 0,
                settings: super::super::Settings::default(),
                per_request: None,
                tls: None,
                row_format: None,
            },
            planned: Some(200),
            abort: Vec::new(),
        });
        let start = 10 * second;
        role.start_ns = start;
        let planned =
            |role: &mut Attack, from: u64| role.own(from, second).counter("requests.planned");
        assert_eq!(planned(&mut role, start), 100);
        // The worker was ready half a second late.
        role.start_ns = start + second / 2;
        assert_eq!(planned(&mut role, start + second), 50);
        assert_eq!(planned(&mut role, start + 2 * second), 50);
        assert_eq!(planned(&mut role, start + 3 * second), 0);
    }
}
