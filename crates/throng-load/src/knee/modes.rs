//! What rises, and how one level of it runs and is read: `attack`'s
//! request rate, `hold`'s connections (with a publish each level, so
//! delivery is judged too), or the publish rate to subscribers `hold`
//! holds. Each mode builds its level's run from the plan the command
//! prepared once, runs it inside a [`Level`], and turns what it flushed
//! into the [`Figures`] the objective judges and the row the table shows.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use throng_report::format::Header;
use throng_report::interval::{Interval, every_request, new_histogram};
use throng_report::knee::Mode;
use throng_report::summary::HistStats;

use super::level::{Banner, Check, Level, Measured, Window};
use super::objective::{Figures, GENERATOR_LAG_US, Objective};
use super::publisher::{PublishPlan, Publishing};
use super::{KneeError, PublishSettings};
use crate::agent::crew::{self, Agents, AgentsError, OnLoss};
use crate::attack::supervisor::AttackRun;
use crate::attack::{self, Load};
use crate::harness::Setup;
use crate::harness::clock::nanos;
use crate::harness::collect::ResultFile;
use crate::harness::metrics::Metrics;
use crate::harness::pool::Remote;
use crate::hold::supervisor::{DRAIN, HoldRun, PUBLISH_SETTLE};
use crate::hold::{self};
use crate::pacer::RateSpec;

/// How long a level's connections take to open when no connect rate is
/// given (`hold`: the level over this; `publish`: the subscribers).
pub const OPEN_IN: Duration = Duration::from_secs(5);
/// The slowest default connect rate.
pub const MIN_CONNECT_RATE: f64 = 100.0;

/// A mode, planned once before the search.
#[derive(Debug)]
// One plan per search: the size of its variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Plan {
    /// Requests per second.
    Attack {
        /// The run at `--from`; each level changes its rate.
        run: AttackRun,
        setup: Setup,
    },
    /// Connections.
    Hold {
        /// The command's hold, fitted again at each level's count.
        template: hold::Request,
        /// `--rate`, or each level opened in [`OPEN_IN`].
        connect_rate: Option<RateSpec>,
        publish: PublishSettings,
    },
    /// Messages per second to `subscribers`.
    Publish {
        run: HoldRun,
        setup: Setup,
        subscribers: u64,
        publish: PublishSettings,
    },
}

/// What every level's run shares.
#[derive(Debug, Clone)]
pub(crate) struct Common {
    pub(crate) objective: Objective,
    pub(crate) warmup: Duration,
    pub(crate) step: Duration,
    pub(crate) results: std::path::PathBuf,
    pub(crate) command_line: Vec<String>,
    /// Where every level's live figures are served (`--metrics-listen`).
    pub(crate) metrics: Option<Metrics>,
    /// The agents every level runs on (`--agents`), if any.
    pub(crate) agents: Option<crew::Options>,
}

/// How long a level waits for agents still busy with the level before
/// (an agent says it is idle again once its last worker has exited).
const AGENTS_IDLE_WITHIN: Duration = Duration::from_secs(20);

/// A level's workers on the agents, a run of its own on them (`None`
/// without `--agents`): `share` fits the level over the live agents. An
/// agent still busy with the level before is waited for.
fn on_agents(
    c: &Common,
    share: impl Fn(crew::Options) -> Result<(Remote, Rc<Agents>), AgentsError>,
) -> Result<Option<(Remote, Rc<Agents>)>, KneeError> {
    let Some(o) = &c.agents else {
        return Ok(None);
    };
    // A level that loses an agent cannot be judged: stop it, as Ctrl-C does.
    let o = crew::Options {
        on_loss: OnLoss::Stop,
        ..o.clone()
    };
    let until = Instant::now() + AGENTS_IDLE_WITHIN;
    loop {
        match share(o.clone()) {
            Err(AgentsError::Busy { .. }) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(200));
            }
            r => return Ok(Some(r?)),
        }
    }
}

/// `seen` with the agents the level lost, if any: the level was stopped
/// for it (as a Ctrl-C stops one), which is not the user's interruption,
/// and its verdict names them (see [`super::Finder`]'s loop).
fn with_lost(agents: Option<&Rc<Agents>>, mut seen: Seen) -> Seen {
    if let Some(lost) = agents.map(|a| a.lost())
        && !lost.is_empty()
    {
        seen.lost_agents = Some(lost.join(", "));
        seen.interrupted = false;
    }
    seen
}

/// What one run of a level showed, before the verdict.
#[derive(Debug)]
pub(crate) struct Seen {
    pub(crate) figures: Figures,
    pub(crate) started_ns: u64,
    pub(crate) measured_s: f64,
    pub(crate) offered: f64,
    pub(crate) achieved: f64,
    pub(crate) offered_deliveries: Option<f64>,
    pub(crate) host_cpu: Option<f64>,
    pub(crate) host_mem_used_bytes: Option<u64>,
    pub(crate) failed_early: Option<String>,
    pub(crate) interrupted: bool,
    /// Agents lost during the level (`--agents`): their share of the load
    /// was not generated.
    pub(crate) lost_agents: Option<String>,
}

impl Plan {
    /// Which mode this is.
    pub(crate) fn mode(&self) -> Mode {
        match self {
            Self::Attack { .. } => Mode::Attack,
            Self::Hold { .. } => Mode::Hold,
            Self::Publish { .. } => Mode::Publish,
        }
    }

    /// How long a run of `level` should take, start to end.
    pub(crate) fn estimate(&self, level: f64, c: &Common) -> Duration {
        // Workers starting, the last answers, the last interval flushed.
        let overhead = Duration::from_secs(4);
        let measured = c.warmup + c.step + overhead;
        match self {
            Self::Attack { .. } => measured,
            Self::Hold { connect_rate, .. } => {
                open_time(level, *connect_rate) + PUBLISH_SETTLE + DRAIN + measured
            }
            Self::Publish { run, .. } => {
                open_time(run.connections as f64, Some(run.rate))
                    + PUBLISH_SETTLE
                    + DRAIN
                    + measured
            }
        }
    }

    /// Runs `level` once: the one level runner, a function of the plan
    /// alone, so another driver of levels (the harness spread over agents,
    /// say) runs a level as the search does. The search judges what it
    /// returns; this neither judges nor decides what runs next.
    pub(crate) fn run_level(
        &self,
        level: f64,
        banner: &str,
        header: serde_json::Value,
        c: &Common,
    ) -> Result<Seen, KneeError> {
        let ends = Instant::now() + self.estimate(level, c);
        if let Some(m) = &c.metrics {
            m.update(|e| e.level(level));
        }
        let banner = Banner {
            title: banner.to_owned(),
            ends,
        };
        let results = |setup: &Setup| Setup {
            results: Some(ResultFile {
                path: c.results.clone(),
                header: Header::new(c.command_line.clone(), header.clone()),
                append: true,
            }),
            metrics: c.metrics.clone(),
            ..setup.clone()
        };
        match self {
            Self::Attack { run, setup } => attack_level(run, setup, level, banner, c, &results),
            Self::Hold {
                template,
                connect_rate,
                publish,
            } => {
                let connections = level.round().max(1.0) as u64;
                let rate = connect_rate.unwrap_or_else(|| default_connect_rate(connections));
                let req = hold::Request {
                    connections,
                    rate,
                    duration: Some(hold_time(c)),
                    publish: None,
                    output: None,
                    ..template.clone()
                };
                let target = req.target.clone();
                let interval_ns = req.settings.interval_ns;
                let (remote, agents) =
                    on_agents(c, |o| crew::hold(o, connections, &target, interval_ns))?.unzip();
                let (run, setup) = hold::prepare_on(req, remote)?.into_parts();
                let publishing = Rc::new(Publishing::new(publish.plan(publish.rate, c)));
                let objective = c.objective.clone();
                let check: Check = Box::new(move |all: &Interval, _window: &Interval| {
                    let errors = all.counters_under("connect.error.");
                    objective.clearly_missed(all.histograms.get("connect"), errors, connections)
                });
                let role = Level::new(
                    hold::supervisor::role(run)?,
                    banner,
                    Window::Publisher,
                    check,
                    Some(publishing),
                );
                let m = crate::harness::supervise::run(role, results(&setup))?;
                Ok(with_lost(agents.as_ref(), hold_seen(&m, connections)))
            }
            Self::Publish {
                run,
                setup,
                subscribers,
                publish,
            } => {
                let mut run = run.clone();
                let mut setup = setup.clone();
                let interval_ns = run.settings.interval_ns;
                let agents =
                    on_agents(c, |o| crew::hold(o, *subscribers, &run.target, interval_ns))?.map(
                        |(remote, agents)| {
                            run.fit.workers = remote.workers;
                            setup.remote = Some(remote.launch);
                            agents
                        },
                    );
                let publishing = Rc::new(Publishing::new(publish.plan(level, c)));
                let objective = c.objective.clone();
                let messages = (level * c.step.as_secs_f64()).round() as u64;
                let deliveries = messages * subscribers;
                let check: Check = Box::new(move |_all: &Interval, window: &Interval| {
                    let errors = window.counters_under("publish.error.");
                    objective
                        .clearly_missed(window.histograms.get("delivery"), 0, deliveries)
                        .or_else(|| objective.clearly_missed(None, errors, messages))
                });
                let role = Level::new(
                    hold::supervisor::role(HoldRun {
                        duration: Some(hold_time(c)),
                        ..run
                    })?,
                    banner,
                    Window::Publisher,
                    check,
                    Some(publishing),
                );
                let m = crate::harness::supervise::run(role, results(&setup))?;
                Ok(with_lost(agents.as_ref(), publish_seen(&m, *subscribers)))
            }
        }
    }
}

/// One level of an attack search: `run` at `level` requests per second,
/// on the agents when there are any.
fn attack_level(
    run: &AttackRun,
    setup: &Setup,
    level: f64,
    banner: Banner,
    c: &Common,
    results: &dyn Fn(&Setup) -> Setup,
) -> Result<Seen, KneeError> {
    let mut run = run.clone();
    let mut setup = setup.clone();
    let s = run.plan.settings;
    let agents = on_agents(c, |o| crew::attack(o, s.max_connections, s.interval_ns))?.map(
        |(remote, agents)| {
            (run.plan.workers, setup.remote) = (remote.workers, Some(remote.launch));
            agents
        },
    );
    let span = c.warmup + c.step;
    let spec = RateSpec::Constant(level);
    run.plan.load = Load::Rate(spec);
    run.plan.duration_ns = Some(nanos(span));
    run.planned = attack::pacer(spec, Some(span), None)
        .ok()
        .and_then(|p| attack::planned(&p, Some(span), None));
    let planned = (level * c.step.as_secs_f64()).round() as u64;
    let objective = c.objective.clone();
    let check: Check = Box::new(move |_all: &Interval, window: &Interval| {
        let errors = attack_errors(window).values().sum();
        // Every request's latency: a timeout counts at its timeout.
        let every = every_request(&window.histograms);
        let latency = every.as_ref().or(window.histograms.get("latency"));
        objective.clearly_missed(latency, errors, planned)
    });
    let role = Level::new(
        attack::supervisor::role(run),
        banner,
        Window::AfterStart {
            warmup: c.warmup,
            step: c.step,
        },
        check,
        None,
    );
    let m = crate::harness::supervise::run(role, results(&setup))?;
    Ok(with_lost(agents.as_ref(), attack_seen(&m)))
}

impl PublishSettings {
    /// The publisher of one level at `rate` messages per second.
    fn plan(&self, rate: f64, c: &Common) -> PublishPlan {
        PublishPlan {
            target: self.target.clone(),
            redis_channel: self.redis_channel.clone(),
            rate,
            message_size: self.message_size,
            connections: self.connections,
            warmup: c.warmup,
            span: c.warmup + c.step,
        }
    }
}

/// Connections open in [`OPEN_IN`], never slower than [`MIN_CONNECT_RATE`].
pub fn default_connect_rate(connections: u64) -> RateSpec {
    RateSpec::Constant((connections as f64 / OPEN_IN.as_secs_f64()).max(MIN_CONNECT_RATE))
}

fn open_time(connections: f64, rate: Option<RateSpec>) -> Duration {
    let rate = rate.map_or(
        (connections / OPEN_IN.as_secs_f64()).max(MIN_CONNECT_RATE),
        |r| r.peak(),
    );
    Duration::from_secs_f64(connections / rate.max(1.0))
}

/// How long `hold` itself would hold: longer than the publisher needs, so
/// the publisher's end (which tells the workers the last message) comes first.
fn hold_time(c: &Common) -> Duration {
    PUBLISH_SETTLE + c.warmup + c.step + DRAIN + Duration::from_secs(30)
}

/// `attack`'s failures in `iv`: every request error but `canceled` (the
/// requests the knee itself cut off), and answers that are not 2xx/3xx.
fn attack_errors(iv: &Interval) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (k, v) in &iv.counters {
        if let Some(kind) = k.strip_prefix("requests.error.") {
            if kind != "canceled" {
                out.insert(kind.to_owned(), *v);
            }
        } else if let Some(code) = k.strip_prefix("status.")
            && !(code.starts_with('2') || code.starts_with('3'))
        {
            out.insert(k.clone(), *v);
        }
    }
    out
}

fn attack_seen(m: &Measured) -> Seen {
    let w = &m.window;
    let errors = attack_errors(w);
    let answered = w.counters_under("status.");
    let figures = Figures {
        latency: w.every_request_stats(),
        latency_name: "request latency",
        from_actual: Some(w.stats("service")),
        delivery: None,
        attempts: answered + errors.values().sum::<u64>(),
        errors,
        lost: None,
        lag: w.stats("lag"),
        late_share: late_share(w.histograms.get("lag")),
        ..Figures::default()
    };
    let steady_ok: u64 = m
        .steady
        .counters
        .iter()
        .filter(|(k, _)| k.starts_with("status.2") || k.starts_with("status.3"))
        .map(|(_, v)| v)
        .sum();
    let per_s = |n: u64| per_second(n, m.steady_s);
    Seen {
        offered: per_s(m.steady.counter("requests.sent")),
        achieved: per_s(steady_ok),
        offered_deliveries: None,
        ..seen(m, figures)
    }
}

fn hold_seen(m: &Measured, connections: u64) -> Seen {
    let (a, w) = (&m.all, &m.window);
    let errors = held_errors(a, w);
    let mut lag = new_histogram();
    for h in [
        a.histograms.get("connect.lag"),
        w.histograms.get("publish.lag"),
    ]
    .into_iter()
    .flatten()
    {
        let _ = lag.add(h);
    }
    let figures = Figures {
        latency: a.stats("connect"),
        latency_name: "connect latency",
        from_actual: Some(a.stats("connect.service")),
        delivery: Some(w.stats("delivery")),
        // What was tried: a run stopped early tried fewer than the level.
        attempts: a.counter("connect.ok")
            + a.counters_under("connect.error.")
            + w.counter("publish.sent"),
        errors,
        lost: Some(net_lost(a)),
        lag: HistStats::of(&lag),
        late_share: late_share(Some(&lag)),
        ..Figures::default()
    };
    let peak_open = m
        .intervals
        .iter()
        .map(|iv| iv.gauge("connections.open"))
        .max()
        .unwrap_or(0);
    Seen {
        offered: connections as f64,
        achieved: peak_open.max(0) as f64,
        offered_deliveries: None,
        ..seen(m, figures)
    }
}

fn publish_seen(m: &Measured, subscribers: u64) -> Seen {
    let (a, w) = (&m.all, &m.window);
    let errors = held_errors(a, w);
    let figures = Figures {
        latency: w.stats("delivery"),
        latency_name: "delivery latency",
        from_actual: Some(w.stats("publish")),
        delivery: None,
        attempts: w.counter("publish.sent") + subscribers,
        errors,
        lost: Some(net_lost(a)),
        lag: w.stats("publish.lag"),
        late_share: late_share(w.histograms.get("publish.lag")),
        ..Figures::default()
    };
    let offered = per_second(m.steady.counter("publish.sent"), m.steady_s);
    Seen {
        offered,
        achieved: per_second(m.steady.counter("messages.received"), m.steady_s),
        offered_deliveries: Some(offered * subscribers as f64),
        ..seen(m, figures)
    }
}

/// The failures of a hold level: connects that failed and connections the
/// server dropped (every close but the run's own) over the whole run `a`,
/// and the publishes that failed in the measured window `w`.
fn held_errors(a: &Interval, w: &Interval) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (k, v) in &w.counters {
        if let Some(kind) = k.strip_prefix("publish.error.") {
            out.insert(format!("publish.{kind}"), *v);
        }
    }
    for (k, v) in &a.counters {
        if let Some(kind) = k.strip_prefix("connect.error.") {
            out.insert(format!("connect.{kind}"), *v);
        } else if let Some(how) = k.strip_prefix("closed.")
            && how != "clean"
            && how != "timeout"
        {
            out.insert(k.clone(), *v);
        }
    }
    out
}

/// Messages lost, net of those counted lost when overtaken and then
/// received late (concurrent publishes may arrive out of order).
fn net_lost(a: &Interval) -> u64 {
    a.counter("messages.lost")
        .saturating_sub(a.counter("messages.out_of_order"))
}

fn per_second(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

/// Share of `lag`'s values over the generator's lag threshold.
fn late_share(lag: Option<&Histogram<u64>>) -> f64 {
    let Some(h) = lag.filter(|h| !h.is_empty()) else {
        return 0.0;
    };
    let late: u64 = h
        .iter_recorded()
        .filter(|v| v.value_iterated_to() > GENERATOR_LAG_US)
        .map(|v| v.count_at_value())
        .sum();
    late as f64 / h.len() as f64
}

/// What every mode reads the same way: the machine and the generator's CPU
/// over the measured span, the run's start and its flags.
fn seen(m: &Measured, mut figures: Figures) -> Seen {
    let used = HostUse::over(m);
    // The busiest by host samples (this machine's processes) or by the
    // workers' own records (every agent's too), whichever used more.
    let (who, cores) = &m.busiest_worker;
    if *cores > used.busiest_cpu {
        figures.generator_cpu = *cores;
        figures.generator_busiest.clone_from(who);
    } else {
        figures.generator_cpu = used.busiest_cpu;
        figures.generator_busiest = used.busiest;
    }
    figures.stall_us = m.stall_ns / 1000;
    figures.stalled.clone_from(&m.stalled);
    Seen {
        figures,
        started_ns: m.intervals.first().map_or(0, |iv| iv.start_ns),
        measured_s: m.window_s,
        offered: 0.0,
        achieved: 0.0,
        offered_deliveries: None,
        host_cpu: used.host_cpu,
        host_mem_used_bytes: used.mem_used,
        failed_early: m.failed_early.clone(),
        interrupted: m.interrupted,
        lost_agents: None,
    }
}

/// A host sample is taken at its interval's end: one interval after its start.
const SAMPLE_AT_END: u64 = 1_000_000_000;

/// How the host was used over a run's measured span (the busiest generator
/// process's CPU, the whole machine's CPU and memory), from its host samples.
#[derive(Debug, Default, PartialEq)]
struct HostUse {
    /// The generator process that used the most CPU, and how much (cores).
    busiest: String,
    busiest_cpu: f64,
    /// The whole machine's CPU, busy share.
    host_cpu: Option<f64>,
    /// Memory in use at the end.
    mem_used: Option<u64>,
}

impl HostUse {
    /// From the sample before the steady span (or its first) to the
    /// sample at its end (or the last one taken).
    fn over(m: &Measured) -> Self {
        let samples: Vec<(u64, &throng_host::sample::HostSample)> = m
            .intervals
            .iter()
            .filter_map(|iv| iv.host.as_ref().map(|h| (iv.start_ns, h)))
            .collect();
        // A sample is taken at its interval's end.
        let base = samples
            .iter()
            .rev()
            .find(|(start, _)| *start < m.from_ns)
            .or(samples.first());
        let end = samples
            .iter()
            .rev()
            .find(|(start, _)| start.saturating_add(SAMPLE_AT_END) <= m.to_ns)
            .or(samples.last());
        let (Some((_, a)), Some((_, b))) = (base, end) else {
            return Self::default();
        };
        let mut out = Self {
            mem_used: Some(b.mem_total_bytes.saturating_sub(b.mem_available_bytes))
                .filter(|_| b.mem_total_bytes > 0),
            ..Self::default()
        };
        let wall = b.at_ns.saturating_sub(a.at_ns);
        if wall == 0 {
            return out;
        }
        for (label, cpu) in &b.cpu_ns {
            if let Some((_, before)) = a.cpu_ns.iter().find(|(l, _)| l == label) {
                let cores = cpu.saturating_sub(*before) as f64 / wall as f64;
                if cores > out.busiest_cpu || out.busiest.is_empty() {
                    out.busiest_cpu = cores;
                    out.busiest.clone_from(label);
                }
            }
        }
        let total = b.cpu_all_ns.saturating_sub(a.cpu_all_ns);
        if total > 0 {
            let busy = b.cpu_busy_ns.saturating_sub(a.cpu_busy_ns);
            out.host_cpu = Some(busy as f64 / total as f64);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use throng_host::sample::HostSample;

    const SEC: u64 = 1_000_000_000;

    fn interval(start_s: u64, cpu: &[(&str, u64)], busy: u64, total: u64) -> Interval {
        let mut iv = Interval::empty(start_s * SEC, SEC, "h/attack".into());
        iv.host = Some(HostSample {
            at_ns: (start_s + 1) * SEC,
            cpu_ns: cpu.iter().map(|(l, n)| ((*l).to_owned(), *n)).collect(),
            cpu_busy_ns: busy,
            cpu_all_ns: total,
            mem_total_bytes: 8 << 30,
            mem_available_bytes: 6 << 30,
            ..HostSample::default()
        });
        iv
    }

    fn measured(intervals: Vec<Interval>, window_s: f64, steady_s: f64) -> Measured {
        Measured {
            from_ns: 11 * SEC,
            to_ns: 13 * SEC,
            all: Interval::empty(0, 0, String::new()),
            window: Interval::empty(0, 0, String::new()),
            steady: Interval::empty(0, 0, String::new()),
            intervals,
            window_s,
            steady_s,
            failed_early: None,
            interrupted: false,
            stall_ns: 0,
            stalled: String::new(),
            busiest_worker: (String::new(), 0.0),
        }
    }

    /// A worker on an agent (no host sample of it here) that used more CPU
    /// by its own records than any process sampled here is the busiest.
    #[test]
    fn an_agents_busy_worker_counts_by_its_own_records() {
        let here = vec![
            interval(10, &[("h/knee-0", 0)], 0, 10),
            interval(12, &[("h/knee-0", 200_000_000)], 5, 10),
        ];
        let mut m = measured(here, 2.0, 2.0);
        let seen_here = seen(&m, Figures::default());
        assert_eq!(seen_here.figures.generator_busiest, "h/knee-0");
        assert!((seen_here.figures.generator_cpu - 0.1).abs() < 1e-9);
        m.busiest_worker = ("a1/knee-3".into(), 0.95);
        let on_agent = seen(&m, Figures::default());
        assert_eq!(on_agent.figures.generator_busiest, "a1/knee-3");
        assert!((on_agent.figures.generator_cpu - 0.95).abs() < 1e-9);
    }

    #[test]
    fn the_busiest_generator_process_and_the_machine_over_the_steady_span() {
        // Warm-up at 10 s, measured 11..13 s (steady), tail 13 s.
        let m = measured(
            vec![
                interval(
                    10,
                    &[("h/attack-0", 100 * 1_000_000), ("h/attack-1", 0)],
                    100,
                    1000,
                ),
                interval(
                    11,
                    &[("h/attack-0", 500 * 1_000_000), ("h/attack-1", 10)],
                    700,
                    2000,
                ),
                interval(
                    12,
                    &[("h/attack-0", 1_500 * 1_000_000), ("h/attack-1", 20)],
                    1700,
                    3000,
                ),
                interval(
                    13,
                    &[("h/attack-0", 1_500 * 1_000_000), ("h/attack-1", 30)],
                    1700,
                    4000,
                ),
            ],
            3.0,
            2.0,
        );
        let used = HostUse::over(&m);
        // From the 10 s sample to the 12 s sample: 1.4 s of CPU in 2 s.
        assert_eq!(used.busiest, "h/attack-0");
        assert!((used.busiest_cpu - 0.7).abs() < 1e-9, "{used:?}");
        assert_eq!(used.host_cpu, Some(0.8));
        assert_eq!(used.mem_used, Some(2 << 30));
    }

    #[test]
    fn requests_the_knee_canceled_are_not_the_targets_failures() {
        let mut iv = Interval::empty(0, SEC, String::new());
        for (k, v) in [
            ("requests.error.canceled", 9),
            ("requests.error.timeout", 2),
            ("status.200", 90),
            ("status.302", 1),
            ("status.503", 4),
        ] {
            iv.counters.insert(k.into(), v);
        }
        let errors = attack_errors(&iv);
        assert_eq!(
            errors.into_iter().collect::<Vec<_>>(),
            [("status.503".to_owned(), 4), ("timeout".to_owned(), 2)]
        );
    }

    #[test]
    fn overtaken_messages_are_not_lost() {
        let mut iv = Interval::empty(0, SEC, String::new());
        iv.counters.insert("messages.lost".into(), 5);
        iv.counters.insert("messages.out_of_order".into(), 3);
        assert_eq!(net_lost(&iv), 2);
        iv.counters.insert("messages.out_of_order".into(), 9);
        assert_eq!(net_lost(&iv), 0);
    }

    #[test]
    fn late_share_counts_lag_over_the_threshold() {
        let mut h = new_histogram();
        h.record_n(100, 97).unwrap();
        h.record_n(50_000, 3).unwrap();
        assert!((late_share(Some(&h)) - 0.03).abs() < 1e-9);
        assert_eq!(late_share(None), 0.0);
    }

    #[test]
    fn default_connect_rates_open_a_level_in_five_seconds() {
        assert_eq!(default_connect_rate(50_000), RateSpec::Constant(10_000.0));
        assert_eq!(default_connect_rate(10), RateSpec::Constant(100.0));
        assert_eq!(open_time(50_000.0, None), Duration::from_secs(5));
    }
}
