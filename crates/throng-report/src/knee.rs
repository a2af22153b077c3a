//! A knee search as data, and how it reads: the conclusion in a sentence,
//! a table of every level run, and an HTML page with latency percentiles
//! against the load and achieved against offered, the knee marked.
//!
//! `throng knee` builds a [`Knee`] as it searches, prints it, writes it as
//! JSON, and keeps it as the last event of its result file
//! ([`RESULT_EVENT`]), so `throng report` reads the same page back.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::format::{Reader, Record};
use crate::html::{self, Mark, Plot, Unit, XAxis, esc, line};
use crate::interval::HistStats;
use crate::summary::Report;
use crate::text::{bytes, count, micros};

/// The kind of the event that carries a whole search's [`Knee`] as JSON,
/// written last in its result file.
pub const RESULT_EVENT: &str = "knee.result";
/// The kind of the event written for each level run, with its [`Run`] as JSON.
pub const LEVEL_EVENT: &str = "knee.level";

/// What rises from level to level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The request rate of `attack`.
    Attack,
    /// The connections `hold` opens and holds.
    Hold,
    /// The publish rate to subscribers `hold` holds.
    Publish,
}

impl Mode {
    /// `attack`, `hold`, `publish`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Attack => "attack",
            Self::Hold => "hold",
            Self::Publish => "publish",
        }
    }

    /// A level as people read it: `2000/s`, `5000 connections`.
    pub fn level(self, v: f64) -> String {
        match self {
            Self::Attack | Self::Publish => format!("{}/s", count(v)),
            Self::Hold => format!("{} connections", count(v)),
        }
    }

    /// What the level counts, for axis titles.
    fn what(self) -> &'static str {
        match self {
            Self::Attack => "requests per second offered",
            Self::Hold => "connections held",
            Self::Publish => "messages per second published",
        }
    }

    /// The unit after an x-axis number.
    fn x_unit(self) -> &'static str {
        match self {
            Self::Attack | Self::Publish => "/s",
            Self::Hold => "",
        }
    }

    /// The latency the objective judges, as the table heads it.
    fn latency_name(self) -> &'static str {
        match self {
            Self::Attack => "request latency",
            Self::Hold => "connect latency",
            Self::Publish => "delivery latency",
        }
    }
}

/// Why a level was run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// A step of the coarse geometric ramp.
    Ramp,
    /// A bisection step between the last passing and the first failing level.
    Refine,
    /// A decisive level run again (`--repeat`).
    Repeat,
}

/// What one run of a level showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The target met the objective.
    Pass,
    /// The target missed the objective.
    Fail,
    /// The objective was missed, but the generator, not the target, fell
    /// behind: the level says nothing about the target.
    Generator,
}

impl Verdict {
    /// `pass`, `FAIL`, `GENERATOR`.
    pub fn word(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "FAIL",
            Self::Generator => "GENERATOR",
        }
    }
}

/// One run of one level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Runs are numbered from 1, in the order they ran.
    pub run: u32,
    /// The level: requests or messages per second, or connections.
    pub level: f64,
    /// Why it ran.
    pub phase: Phase,
    /// When its schedule started, ns since the Unix epoch.
    pub started_ns: u64,
    /// Seconds measured (after the warm-up).
    pub measured_s: f64,
    /// The load offered, as measured: requests or messages per second sent,
    /// or connections attempted.
    pub offered: f64,
    /// What the target sustained: 2xx/3xx answers per second (attack),
    /// connections open at once (hold), deliveries per second (publish).
    pub achieved: f64,
    /// Publish: the deliveries per second the messages sent asked for
    /// (messages per second × subscribers).
    #[serde(default)]
    pub offered_deliveries: Option<f64>,
    /// The latency the objective judges, µs: a request from its intended
    /// start (attack), a connect from its intended start (hold), a delivery
    /// from its intended publish (publish).
    pub latency_us: HistStats,
    /// Hold: delivery latency of the level's messages, µs.
    #[serde(default)]
    pub delivery_us: Option<HistStats>,
    /// Failures by kind (`timeout`, `status.503`, `connect.refused`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Failures over attempts.
    pub error_rate: f64,
    /// Hold and publish: messages lost, net of those that came late.
    #[serde(default)]
    pub lost: Option<u64>,
    /// The generator's own delay behind its schedule, µs.
    pub lag_us: HistStats,
    /// Share of events the generator started more than 10 ms late.
    pub late_share: f64,
    /// CPU of the busiest generator process, in cores (1.0: one core all
    /// the time; each worker is one thread).
    pub generator_cpu: f64,
    /// Which process that was.
    pub generator_busiest: String,
    /// How busy the whole machine was, 0 to 1.
    #[serde(default)]
    pub host_cpu: Option<f64>,
    /// Memory in use on the machine at the level's end (total − available), bytes.
    #[serde(default)]
    pub host_mem_used_bytes: Option<u64>,
    /// What the run showed.
    pub verdict: Verdict,
    /// Why it failed, or why the generator is blamed, most telling first.
    pub reasons: Vec<String>,
    /// Stopped before its time, once it had failed beyond doubt.
    pub stopped_early: bool,
}

/// Where a search ended.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The highest level that met the objective, and the lowest that did
    /// not, within the search's precision.
    Knee {
        /// The knee.
        knee: f64,
        /// The first failing level above it.
        first_failing: f64,
    },
    /// Every level met the objective, up to `--to`.
    NoKnee {
        /// `--to`.
        to: f64,
    },
    /// The first level already missed the objective.
    FailedAtFrom {
        /// `--from`.
        from: f64,
    },
    /// The generator fell behind at `at`: the target's knee is above it.
    GeneratorSaturated {
        /// The level where the generator fell behind.
        at: f64,
        /// The highest level the target passed below it.
        passed: Option<f64>,
    },
    /// `--max-duration` ended the search first.
    CutShort {
        /// The highest level that passed.
        passed: Option<f64>,
        /// The lowest level that failed.
        first_failing: Option<f64>,
    },
    /// Stopped by Ctrl-C.
    Interrupted {
        /// The highest level that passed.
        passed: Option<f64>,
        /// The lowest level that failed.
        first_failing: Option<f64>,
    },
}

impl Outcome {
    /// The exit status: 0 a knee found within the range (a search cut short
    /// counts when it had both sides), 1 no knee (every level passed, the
    /// first failed, or the generator saturated), 2 an interrupted run.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Knee { .. }
            | Self::CutShort {
                passed: Some(_),
                first_failing: Some(_),
            } => 0,
            Self::NoKnee { .. }
            | Self::FailedAtFrom { .. }
            | Self::GeneratorSaturated { .. }
            | Self::CutShort { .. } => 1,
            Self::Interrupted { .. } => 2,
        }
    }

    /// The knee, if the search found one.
    pub fn knee(&self) -> Option<f64> {
        match *self {
            Self::Knee { knee, .. } => Some(knee),
            Self::CutShort {
                passed: Some(p),
                first_failing: Some(_),
            } => Some(p),
            _ => None,
        }
    }

    /// The lowest failing level, if one failed.
    fn first_failing(&self) -> Option<f64> {
        match *self {
            Self::Knee { first_failing, .. } => Some(first_failing),
            Self::FailedAtFrom { from } => Some(from),
            Self::CutShort { first_failing, .. } | Self::Interrupted { first_failing, .. } => {
                first_failing
            }
            _ => None,
        }
    }
}

/// A whole knee search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Knee {
    /// What rose.
    pub mode: Mode,
    /// What was loaded (the URL).
    pub target: String,
    /// The objective, one rule per line.
    pub objective: Vec<String>,
    /// The p99 the objective allows, µs (for the plot).
    #[serde(default)]
    pub slo_p99_us: Option<u64>,
    /// The p99.9 the objective allows, µs.
    #[serde(default)]
    pub slo_p999_us: Option<u64>,
    /// How the search ran, one setting per line.
    pub search: Vec<String>,
    /// Every level run, in order.
    pub runs: Vec<Run>,
    /// Where it ended.
    pub outcome: Outcome,
    /// Seconds from the first level's start to the end.
    pub elapsed_s: f64,
}

impl Knee {
    /// The answer: one line, then the reason or what to do, each a line.
    pub fn conclusion(&self) -> Vec<String> {
        let m = self.mode;
        let lv = |v: f64| m.level(v);
        let why = |at: f64| {
            self.reasons_at(at)
                .map_or(String::new(), |r| format!(": {}", r.join("; ")))
        };
        match self.outcome {
            Outcome::Knee {
                knee,
                first_failing,
            } => vec![
                format!(
                    "knee: {}, the highest level that met the objective",
                    lv(knee)
                ),
                format!("first failing level: {}{}", lv(first_failing), why(first_failing)),
            ],
            Outcome::NoKnee { to } => vec![
                format!(
                    "no knee below --to {}: the target met the objective at every level up to it",
                    lv(to)
                ),
                "raise --to to search further".to_owned(),
            ],
            Outcome::FailedAtFrom { from } => vec![
                format!(
                    "the target failed the objective at the first level, --from {}{}",
                    lv(from),
                    why(from)
                ),
                "lower --from, or loosen the objective if it is stricter than the target can ever be"
                    .to_owned(),
            ],
            Outcome::GeneratorSaturated { at, passed } => {
                let mut out = vec![
                    format!(
                        "the generator saturated at {}; the target's knee is above {}",
                        lv(at),
                        lv(at)
                    ),
                    format!("why the generator is blamed{}", why(at)),
                ];
                if let Some(p) = passed {
                    out.push(format!("the target met the objective up to {}", lv(p)));
                }
                out.push(
                    "give the generator more room: more --workers, a higher --max-connections, \
                     or more machines"
                        .to_owned(),
                );
                out
            }
            Outcome::CutShort {
                passed,
                first_failing,
            }
            | Outcome::Interrupted {
                passed,
                first_failing,
            } => {
                let what = if matches!(self.outcome, Outcome::CutShort { .. }) {
                    "--max-duration ended the search"
                } else {
                    "the search was interrupted"
                };
                let mut out = vec![match (passed, first_failing) {
                    (Some(p), Some(f)) => {
                        format!("{what}: the knee is between {} and {}", lv(p), lv(f))
                    }
                    (Some(p), None) => {
                        format!("{what}: the target met the objective up to {}", lv(p))
                    }
                    (None, Some(f)) => format!("{what}: the first level run, {}, failed", lv(f)),
                    (None, None) => format!("{what} before any level ended"),
                }];
                if let Some(f) = first_failing {
                    out.push(format!("{} failed{}", lv(f), why(f)));
                }
                out
            }
        }
    }

    /// The reasons of the last run at `level` that did not pass.
    fn reasons_at(&self, level: f64) -> Option<&[String]> {
        self.runs
            .iter()
            .rev()
            .find(|r| same(r.level, level) && r.verdict != Verdict::Pass)
            .map(|r| r.reasons.as_slice())
            .filter(|r| !r.is_empty())
    }

    /// The runs of each level, by level: the median of each figure across
    /// a level's runs (repeats disagree a little; the plot shows the middle).
    fn by_level(&self) -> Vec<(f64, Vec<&Run>)> {
        let mut levels: Vec<(f64, Vec<&Run>)> = Vec::new();
        for r in &self.runs {
            match levels.iter_mut().find(|(l, _)| same(*l, r.level)) {
                Some((_, runs)) => runs.push(r),
                None => levels.push((r.level, vec![r])),
            }
        }
        levels.sort_by(|a, b| a.0.total_cmp(&b.0));
        levels
    }
}

/// The searches kept in result files (the last [`RESULT_EVENT`] of each
/// file a knee search wrote); other files are not read past their header.
pub fn read_all<P: AsRef<Path>>(paths: &[P]) -> Vec<Knee> {
    let mut out = Vec::new();
    for path in paths {
        let Ok(reader) = Reader::open(path) else {
            continue;
        };
        if reader
            .header()
            .settings
            .get("subcommand")
            .and_then(|v| v.as_str())
            != Some("knee")
        {
            continue;
        }
        let last = reader
            .filter_map(|r| match r {
                Record::Event(ev) if ev.kind == RESULT_EVENT => Some(ev.text),
                _ => None,
            })
            .last();
        if let Some(knee) = last.and_then(|text| serde_json::from_str(&text).ok()) {
            out.push(knee);
        }
    }
    out
}

/// Two levels are the same level (they come from the same arithmetic, but
/// a result read back from JSON may differ in the last bit).
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// The median of `values` (the lower middle of an even count).
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    values.get(values.len().saturating_sub(1) / 2).copied()
}

/// The text: the conclusion, the objective and search, and a table of every run.
pub fn render_text(k: &Knee) -> String {
    let mut o = String::new();
    for (i, line) in k.conclusion().iter().enumerate() {
        let indent = if i == 0 { "" } else { "  " };
        let _ = writeln!(o, "{indent}{line}");
    }
    let _ = writeln!(
        o,
        "  {} runs of {} levels in {:.0}s; objective: {}",
        k.runs.len(),
        k.by_level().len(),
        k.elapsed_s,
        k.objective.join(", ")
    );
    o.push('\n');
    o.push_str(&table(k));
    o
}

/// The table of every run, one line each.
pub fn table(k: &Knee) -> String {
    let hold = k.mode == Mode::Hold;
    let mut head = vec![
        "run", "level", "phase", "offered", "achieved", "p50", "p90", "p99", "p99.9",
    ];
    if hold {
        head.push("deliv p99");
    }
    head.extend([
        "errors", "lag p99", "gen CPU", "host CPU", "mem used", "verdict",
    ]);
    let mut rows = vec![head.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()];
    for r in &k.runs {
        let l = &r.latency_us;
        let lat = |v: u64| {
            if l.count == 0 {
                "-".to_owned()
            } else {
                micros(v)
            }
        };
        let mut row = vec![
            r.run.to_string(),
            k.mode.level(r.level).replace(" connections", ""),
            match r.phase {
                Phase::Ramp => "ramp",
                Phase::Refine => "refine",
                Phase::Repeat => "repeat",
            }
            .to_owned(),
            rate(r.offered),
            rate(r.achieved),
            lat(l.p50),
            lat(l.p90),
            lat(l.p99),
            lat(l.p999),
        ];
        if hold {
            row.push(
                r.delivery_us
                    .filter(|d| d.count > 0)
                    .map_or("-".to_owned(), |d| micros(d.p99)),
            );
        }
        let mut errors = if r.errors.is_empty() {
            "0".to_owned()
        } else {
            r.errors
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Some(lost) = r.lost.filter(|n| *n > 0) {
            errors.push_str(&format!(", lost {lost}"));
        }
        row.extend([
            errors,
            micros(r.lag_us.p99),
            format!("{:.2}", r.generator_cpu),
            r.host_cpu
                .map_or("-".to_owned(), |c| format!("{:.0}%", c * 100.0)),
            r.host_mem_used_bytes
                .map_or("-".to_owned(), |b| bytes(b as f64)),
            format!(
                "{}{}",
                r.verdict.word(),
                if r.stopped_early {
                    " (stopped early)"
                } else {
                    ""
                }
            ),
        ]);
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut o = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, w))| {
                // Numbers right, words (phase, errors, verdict) left.
                if matches!(c, 2) || c + 1 == row.len() || head[c] == "errors" {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        let _ = writeln!(o, "{}", cells.join("  ").trim_end());
    }
    o
}

/// A measured rate for the table: whole from 100 on (a tenth of one in
/// 8000.5/s says nothing), as measured below that (32.8/s).
fn rate(v: f64) -> String {
    count(if v.abs() >= 100.0 { v.round() } else { v })
}

/// The HTML page: the conclusion, latency percentiles and achieved load
/// against the level with the knee marked, the table of runs, and, when
/// given, the whole search over time (`over_time`, from its result file).
pub fn render_html(k: &Knee, over_time: Option<&Report>) -> String {
    let mut o = String::with_capacity(64 << 10);
    let title = format!("throng knee {} {}", k.mode.name(), k.target);
    html::head(&mut o, &title);
    let _ = writeln!(o, "<h1>{}</h1>", esc(&title));
    let mut lines = k.conclusion().into_iter();
    if let Some(first) = lines.next() {
        let _ = writeln!(o, "<p class=\"conclusion\"><b>{}</b></p>", esc(&first));
    }
    for l in lines {
        let _ = writeln!(o, "<p>{}</p>", esc(&l));
    }
    let _ = writeln!(
        o,
        "<p class=\"muted\">objective: {}<br/>search: {}<br/>{} runs in {:.0} s</p>",
        esc(&k.objective.join(", ")),
        esc(&k.search.join(", ")),
        k.runs.len(),
        k.elapsed_s
    );
    for plot in plots(k) {
        plot.render(&mut o);
    }
    o.push_str("<h2>Every run</h2>\n<pre>");
    o.push_str(&esc(&table(k)));
    o.push_str("</pre>\n");
    if let Some(r) = over_time {
        o.push_str("<h2>The whole search over time</h2>\n");
        html::body(&mut o, r);
    }
    o.push_str("</body>\n</html>\n");
    o
}

/// Latency percentiles against the level, and achieved against offered.
fn plots(k: &Knee) -> Vec<Plot> {
    let levels = k.by_level();
    if levels.is_empty() {
        return Vec::new();
    }
    let top = levels.last().map_or(1.0, |(l, _)| *l);
    let x = XAxis {
        span: top * 1.05,
        unit: k.mode.x_unit(),
        title: k.mode.what(),
    };
    let at: Vec<(f64, bool)> = levels.iter().map(|(l, _)| (*l, true)).collect();
    let mut marks = Vec::new();
    if let Some(knee) = k.outcome.knee() {
        marks.push(Mark {
            x: knee,
            label: format!("knee {}", k.mode.level(knee)),
            dashed: false,
        });
    }
    if let Some(f) = k.outcome.first_failing() {
        marks.push(Mark {
            x: f,
            label: String::new(),
            dashed: true,
        });
    }
    if let Outcome::GeneratorSaturated { at, .. } = k.outcome {
        marks.push(Mark {
            x: at,
            label: format!("generator saturated {}", k.mode.level(at)),
            dashed: true,
        });
    }
    let per_level = |f: &dyn Fn(&Run) -> Option<f64>| -> Vec<Option<f64>> {
        levels
            .iter()
            .map(|(_, runs)| median(runs.iter().filter_map(|r| f(r)).collect()))
            .collect()
    };
    let pct = |q: fn(&HistStats) -> u64| {
        per_level(&|r: &Run| (r.latency_us.count > 0).then(|| q(&r.latency_us) as f64))
    };
    let mut latency_lines = vec![
        line("p50", pct(|h| h.p50)),
        line("p90", pct(|h| h.p90)),
        line("p99", pct(|h| h.p99)),
        line("p99.9", pct(|h| h.p999)),
    ];
    if k.mode == Mode::Hold {
        latency_lines.push(line(
            "delivery p99",
            per_level(&|r: &Run| r.delivery_us.filter(|d| d.count > 0).map(|d| d.p99 as f64)),
        ));
    }
    for (name, slo) in [
        ("objective p99", k.slo_p99_us),
        ("objective p99.9", k.slo_p999_us),
    ] {
        if let Some(us) = slo {
            latency_lines.push(line(name, vec![Some(us as f64); levels.len()]));
        }
    }
    let (achieved_name, offered_of): (&str, fn(&Run) -> Option<f64>) = match k.mode {
        Mode::Attack => ("2xx/3xx answers per second", |r| Some(r.offered)),
        Mode::Hold => ("connections open", |r| Some(r.offered)),
        Mode::Publish => ("deliveries per second", |r| r.offered_deliveries),
    };
    let achieved_y = match k.mode {
        Mode::Hold => "connections",
        Mode::Attack | Mode::Publish => "per second",
    };
    let plot = |id: &str, title: String, y_title, unit, lines| Plot {
        marks: marks.clone(),
        ..Plot::new((id, title), (y_title, unit), lines, at.clone(), x)
    };
    vec![
        plot(
            "knee-latency",
            format!(
                "{} percentiles against {} (log scale)",
                k.mode.latency_name(),
                k.mode.what()
            ),
            "latency",
            Unit::Latency,
            latency_lines,
        ),
        plot(
            "knee-achieved",
            format!("achieved against offered, by {}", k.mode.what()),
            achieved_y,
            Unit::Count,
            vec![
                line("offered", per_level(&offered_of)),
                line(achieved_name, per_level(&|r: &Run| Some(r.achieved))),
            ],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: u32, level: f64, p99: u64, verdict: Verdict) -> Run {
        Run {
            run: n,
            level,
            phase: Phase::Ramp,
            started_ns: 0,
            measured_s: 2.0,
            offered: level,
            achieved: level.min(1500.0),
            offered_deliveries: None,
            latency_us: HistStats {
                count: 100,
                p50: p99 / 4,
                p90: p99 / 2,
                p99,
                p999: p99 * 2,
                ..HistStats::default()
            },
            delivery_us: None,
            errors: BTreeMap::new(),
            error_rate: 0.0,
            lost: None,
            lag_us: HistStats::default(),
            late_share: 0.0,
            generator_cpu: 0.1,
            generator_busiest: "h/attack-0".into(),
            host_cpu: Some(0.4),
            host_mem_used_bytes: Some(1 << 30),
            verdict,
            reasons: if verdict == Verdict::Pass {
                Vec::new()
            } else {
                vec!["p99 latency 412ms is over --slo-p99 100ms".into()]
            },
            stopped_early: false,
        }
    }

    fn search() -> Knee {
        Knee {
            mode: Mode::Attack,
            target: "GET http://127.0.0.1:8080/ping".into(),
            objective: vec!["p99 <= 100ms".into()],
            slo_p99_us: Some(100_000),
            slo_p999_us: None,
            search: vec!["--from 500/s".into()],
            runs: vec![
                run(1, 500.0, 2_000, Verdict::Pass),
                run(2, 1000.0, 3_000, Verdict::Pass),
                run(3, 2000.0, 412_000, Verdict::Fail),
                run(4, 2000.0, 500_000, Verdict::Fail),
                run(5, 1500.0, 9_000, Verdict::Pass),
            ],
            outcome: Outcome::Knee {
                knee: 1500.0,
                first_failing: 2000.0,
            },
            elapsed_s: 60.0,
        }
    }

    #[test]
    fn the_conclusion_names_the_knee_and_why_the_next_level_failed() {
        let k = search();
        let c = k.conclusion();
        assert_eq!(
            c[0],
            "knee: 1500/s, the highest level that met the objective"
        );
        assert_eq!(
            c[1],
            "first failing level: 2000/s: p99 latency 412ms is over --slo-p99 100ms"
        );
        let text = render_text(&k);
        assert!(text.contains("5 runs of 4 levels"), "{text}");
        // A header and one line per run.
        assert_eq!(table(&k).lines().count(), 6);
        assert!(table(&k).contains("412ms"));
    }

    #[test]
    fn exit_codes_follow_the_outcome() {
        let knee = Outcome::Knee {
            knee: 1.0,
            first_failing: 2.0,
        };
        assert_eq!(knee.exit_code(), 0);
        assert_eq!(Outcome::NoKnee { to: 5.0 }.exit_code(), 1);
        assert_eq!(Outcome::FailedAtFrom { from: 5.0 }.exit_code(), 1);
        let generator = Outcome::GeneratorSaturated {
            at: 5.0,
            passed: None,
        };
        assert_eq!(generator.exit_code(), 1);
        let both = Outcome::CutShort {
            passed: Some(1.0),
            first_failing: Some(2.0),
        };
        assert_eq!((both.exit_code(), both.knee()), (0, Some(1.0)));
        let half = Outcome::CutShort {
            passed: Some(1.0),
            first_failing: None,
        };
        assert_eq!((half.exit_code(), half.knee()), (1, None));
        let ctrl_c = Outcome::Interrupted {
            passed: None,
            first_failing: None,
        };
        assert_eq!(ctrl_c.exit_code(), 2);
    }

    #[test]
    fn the_page_plots_each_level_once_with_the_knee_marked() {
        let page = render_html(&search(), None);
        // Well-formed enough to find the plots; one point per level (4), not per run (5).
        assert!(page.contains("id=\"knee-latency\""));
        assert!(page.contains("id=\"knee-achieved\""));
        assert!(
            page.contains("data-name=\"p99\" data-points=\"4\""),
            "{page}"
        );
        assert!(page.contains("data-name=\"objective p99\" data-points=\"4\""));
        assert!(page.contains(">knee 1500/s</text>"));
        assert!(page.contains("stroke-dasharray"));
        assert!(page.contains("first failing level: 2000/s"));
    }

    #[test]
    fn a_result_reads_back_from_its_json() {
        let k = search();
        let text = serde_json::to_string(&k).unwrap();
        let back: Knee = serde_json::from_str(&text).unwrap();
        assert_eq!(back, k);
        assert!(text.contains("\"kind\":\"knee\""), "{text}");
    }

    #[test]
    fn medians_take_the_lower_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(1.0));
        assert_eq!(median(vec![f64::NAN]), None);
        assert_eq!(median(Vec::new()), None);
    }

    // 7998.5 requests/s offered read as more precise than a rate measured
    // over a few seconds is.
    #[test]
    fn measured_rates_are_whole_from_a_hundred_on() {
        assert_eq!(rate(7998.5), "7999");
        assert_eq!(rate(16_040.0), "16.0k");
        assert_eq!(rate(32.8), "32.8");
    }
}
