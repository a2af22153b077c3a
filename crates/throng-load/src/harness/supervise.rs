//! The supervisor's loop, the same for every role: start the workers, take
//! their records as they come (into the result file, merged per interval),
//! flush each interval once it is complete with a host sample and a
//! progress line, handle Ctrl-C (a second one kills), kill workers that
//! outlive their deadline, and sum the run up once every worker is gone.
//!
//! What differs between `hold` and `attack` is a [`Role`]: the plan each
//! worker gets, what its events mean, when the run ends, the supervisor's
//! own counts (`hold`'s publisher), the progress line and the summary.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::Serialize;
use throng_report::events::Groups;
use throng_report::format::Event;
use throng_report::interval::Interval;
use tokio::sync::mpsc;

use super::clock::{Anchor, now_unix_ns};
use super::collect::{Arrival, Collector, ResultFile, Totals};
use super::metrics::Metrics;
use super::pool::{Crew, Feed, Launch, Pool, WorkerCommand};
use super::progress::{Progress, Screen, View};

/// What a role does on the supervisor's side.
pub trait Role {
    /// `hold`, `attack`: workers are `<host>/<NAME>-<i>`, notes `throng <NAME>: ...`.
    const NAME: &'static str;
    /// The role its workers run (`throng <WORKER> --worker`): what an
    /// agent is asked to start. A role that wraps another (a knee level)
    /// runs the other's workers.
    const WORKER: &'static str = Self::NAME;
    /// What each worker is told.
    type Plan: Serialize;
    /// What the run returns.
    type Summary;

    /// Worker processes.
    fn workers(&self) -> u32;
    /// Interval length, ns.
    fn interval_ns(&self) -> u64;
    /// Worker `index`'s plan; its records carry `label`, its schedule
    /// starts at `start_unix_ns`.
    fn plan(&self, index: u32, label: String, start_unix_ns: u64) -> Self::Plan;
    /// The workers are started.
    fn started(&mut self, _run: &Rc<Run>) {}
    /// An event from `worker` (its `worker.done` included); `false` to
    /// show it as a note.
    fn event(&mut self, _worker: usize, _ev: &Event, _run: &Rc<Run>) -> bool {
        false
    }
    /// `worker` is gone; `done`: it said `worker.done` first.
    fn gone(&mut self, worker: usize, done: bool, run: &Rc<Run>);
    /// Ctrl-C: begin to stop; returns the note to show.
    fn interrupted(&mut self, run: &Rc<Run>) -> &'static str;
    /// A quarter of a second passed.
    fn tick(&mut self, _run: &Rc<Run>) {}
    /// The supervisor's own counts for the interval at `start_ns` (empty by default).
    fn own(&mut self, start_ns: u64, length_ns: u64) -> Interval {
        Interval::empty(start_ns, length_ns, String::new())
    }
    /// A flushed interval, before its progress line.
    fn absorb(&mut self, _merged: &Interval) {}
    /// Late records of an interval flushed before: their counts, and their
    /// peaks beside every other source's last known level (no gauges).
    fn late(&mut self, _merged: &Interval) {}
    /// The run's totals so far (late records included), after each flush.
    fn counted(&mut self, _totals: &Interval) {}
    /// The progress line of a flushed interval.
    fn progress(&mut self, view: &View<'_>) -> String;
    /// The summary, once every worker is gone.
    fn finish(self, totals: Totals, run: &Rc<Run>) -> Self::Summary;
}

/// What a run needs besides its role: how to start a worker, where the
/// results go, how progress shows.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Starts one worker.
    pub command: WorkerCommand,
    /// The result file, if any.
    pub results: Option<ResultFile>,
    /// The live view.
    pub progress: Progress,
    /// Where the workers run instead of child processes (agents), if elsewhere.
    pub remote: Option<Rc<dyn Launch>>,
    /// Where the live figures are served (`--metrics-listen`), if anywhere.
    pub metrics: Option<Metrics>,
}

/// A running run, as its role sees it.
pub struct Run {
    crew: Box<dyn Crew>,
    screen: RefCell<Screen>,
    start: Anchor,
    kill_at: Cell<Option<Instant>>,
    metrics: Option<Metrics>,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run").field("start", &self.start).finish()
    }
}

impl Run {
    /// The workers.
    pub fn crew(&self) -> &dyn Crew {
        self.crew.as_ref()
    }

    /// When the schedule starts (event 0 is due).
    pub fn start(&self) -> Anchor {
        self.start
    }

    /// Shows a note that the next progress line does not overwrite.
    pub fn note(&self, text: &str) {
        self.screen.borrow_mut().note(text);
    }

    /// Kills the workers still running `after` from now.
    pub fn kill_after(&self, after: Duration) {
        self.kill_at.set(Some(Instant::now() + after));
    }
}

/// When the schedule starts: once every worker has had time to exec.
fn schedule_start(workers: u32) -> u64 {
    now_unix_ns() + 300_000_000 + 20_000_000 * u64::from(workers.min(50))
}

/// Runs `role` to the end on a runtime of its own.
pub fn run<R: Role>(role: R, setup: Setup) -> io::Result<R::Summary> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, supervise(role, setup))
}

/// Runs `role`: starts its workers, then takes their records, flushes
/// intervals, handles Ctrl-C and deadlines until every worker is gone.
async fn supervise<R: Role>(mut role: R, setup: Setup) -> io::Result<R::Summary> {
    let workers = role.workers().max(1);
    let (mut collector, run, mut feed) = start(&mut role, &setup)?;

    let mut done = vec![false; workers as usize];
    let mut open = done.len();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut interrupted = false;
    // A worker's crew asked to stop the run (a lost agent).
    let mut stopped = false;
    // The same thing from many workers is shown once, and listed once at the end.
    let mut events = Groups::default();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            got = feed.recv() => match got {
                Some(Feed::Line { worker, line }) => match collector.arrive(worker, &line)? {
                    Arrival::Event(ev) => {
                        let is_done = ev.kind == "worker.done";
                        if is_done && let Some(d) = done.get_mut(worker) {
                            *d = true;
                        }
                        if !role.event(worker, &ev, &run) && !is_done && events.add(&ev) {
                            run.note(&format!(
                                "{}: {}: {} (the same from other workers is counted, listed at the end)",
                                ev.source, ev.kind, ev.text
                            ));
                        }
                    }
                    Arrival::Garbage => run.note(&format!("{}: {line}", run.crew().label(worker))),
                    Arrival::Interval | Arrival::Other => {}
                },
                Some(Feed::Gone { worker }) => {
                    open -= 1;
                    let was_done = done.get(worker).copied().unwrap_or(true);
                    collector.gone(worker, !was_done);
                    role.gone(worker, was_done, &run);
                    if open == 0 {
                        break;
                    }
                }
                Some(Feed::Note { text, stop }) => {
                    run.note(&text);
                    if stop && !interrupted && !stopped {
                        stopped = true;
                        role.interrupted(&run);
                    }
                }
                None => break,
            },
            r = &mut ctrl_c, if !interrupted => {
                interrupted = true;
                if r.is_ok() {
                    let note = role.interrupted(&run);
                    run.note(note);
                    // A second Ctrl-C kills.
                    tokio::task::spawn_local(async {
                        if tokio::signal::ctrl_c().await.is_ok() {
                            std::process::exit(130);
                        }
                    });
                }
            }
            _ = tick.tick() => {
                role.tick(&run);
                if run.kill_at.get().is_some_and(|k| Instant::now() >= k) {
                    run.note("workers did not finish closing in time; killing them");
                    run.crew().kill_all();
                    run.kill_at.set(None);
                }
                for start in collector.due(now_unix_ns()) {
                    flush(&mut role, &mut collector, start, &run)?;
                }
            }
        }
    }
    // Everything the workers sent is in.
    for start in collector.open() {
        flush(&mut role, &mut collector, start, &run)?;
    }
    run.screen.borrow_mut().finish();
    run.crew().wait_all();
    let mut totals = collector.finish();
    totals.events = events.into_groups();
    Ok(role.finish(totals, &run))
}

/// Starts `role`'s workers (child processes, or on agents): the collector
/// of their records, the run, and the feed their records come on.
fn start<R: Role>(
    role: &mut R,
    setup: &Setup,
) -> io::Result<(Collector, Rc<Run>, mpsc::UnboundedReceiver<Feed>)> {
    let workers = role.workers().max(1);
    let length_ns = role.interval_ns().max(1);
    let start_ns = match &setup.remote {
        Some(r) => now_unix_ns() + super::clock::nanos(r.lead()),
        None => schedule_start(workers),
    };
    let collector = Collector::new(
        R::NAME,
        workers as usize,
        length_ns,
        start_ns,
        setup.results.as_ref(),
    )?;
    let host = throng_host::sample::hostname();
    let plans = (0..workers)
        .map(|i| {
            let label = match &setup.remote {
                Some(r) => r.label(R::NAME, i),
                None => format!("{host}/{}-{i}", R::NAME),
            };
            (label.clone(), role.plan(i, label, start_ns))
        })
        .collect::<Vec<_>>();
    let (tx, feed) = mpsc::unbounded_channel();
    let crew: Box<dyn Crew> = match &setup.remote {
        None => Box::new(Pool::spawn(&setup.command, plans, &tx)?),
        Some(r) => {
            let plans = plans
                .into_iter()
                .map(|(l, p)| serde_json::to_value(p).map(|v| (l, v)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(io::Error::other)?;
            r.launch(R::WORKER, plans, &tx)?
        }
    };
    drop(tx);
    let run = Rc::new(Run {
        crew,
        screen: RefCell::new(Screen::new(setup.progress, R::NAME)),
        start: Anchor::at_unix_ns(start_ns),
        kill_at: Cell::new(None),
        metrics: setup.metrics.clone(),
    });
    role.started(&run);
    Ok((collector, run, feed))
}

/// Flushes one interval and shows it.
fn flush<R: Role>(
    role: &mut R,
    collector: &mut Collector,
    start: u64,
    run: &Rc<Run>,
) -> io::Result<()> {
    let processes = run.crew().processes();
    let Some(flushed) = collector.flush(start, processes, |s, l| role.own(s, l))? else {
        return Ok(());
    };
    role.counted(collector.total());
    if let Some(m) = &run.metrics {
        m.update(|e| {
            e.flushed(R::NAME, collector.total(), &flushed.merged, flushed.show);
            e.progress(flushed.late, run.start().unix_ns());
        });
    }
    if !flushed.show {
        role.late(&flushed.merged);
    }
    if flushed.show {
        role.absorb(&flushed.merged);
        // Over before the schedule starts (on agents it starts 2 s ahead): nothing to show.
        if flushed.merged.start_ns + flushed.merged.length_ns <= run.start().unix_ns() {
            return Ok(());
        }
        let view = View {
            merged: &flushed.merged,
            totals: collector.total(),
            late: flushed.late,
            start_unix_ns: run.start().unix_ns(),
            workers: collector.latest(),
        };
        let line = role.progress(&view);
        run.screen.borrow_mut().line(&line);
    }
    Ok(())
}
