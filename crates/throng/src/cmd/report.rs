//! `throng report`: read and merge result files into text, JSON or an HTML page.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use throng_report::merge::{Merger, merge_files_into};
use throng_report::summary::Report;

use super::Format;

/// Arguments of `throng report`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Give any number of files: from the workers of one run, from several machines,
or from runs you want to add up. Intervals are aligned on wall-clock time and
merged exactly: counters and latency histograms add, gauges such as
connections.open add across sources, and host samples count each machine once.
An interval that appears twice (the same file given twice) is counted once.
Each run has its own id: two runs at once on one host (whose workers share
names) merge as two runs, every interval counted. Runs of different kinds
(hold, attack, bench, knee) do not add up: report refuses them (exit 2)
unless --mixed, which shows each kind as a report of its own.

A file cut short (a killed run) is read up to the damage, with a warning that
names the file and byte offset. A file that is not a result file is refused.
The format is documented in docs/results-format.md.

Examples:
  throng report run.throng
  throng report box1.throng box2.throng --every 10s
  throng report run.throng --format json | jq '.latency_us.delivery.p99'
  throng report run.throng --html run.html
  throng report vegeta.json run.throng --hist 0,10ms,50ms,100ms

Vegeta's result files (JSON or CSV, as `vegeta encode --to json` or
`--to csv` writes them) are read as attacks: each result counted in the
second of its timestamp, so they merge with throng's own attack files.")]
pub(crate) struct Args {
    /// Result files to read and merge (written by hold, attack or bench with --output, and by knee).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,

    /// Output: human text, or JSON (the same figures, latencies in µs, times in ns).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// Add a time series with one row per bucket this wide: 1s, 10s, 500ms, 1m.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ns)]
    every: Option<u64>,

    /// Also write a self-contained HTML page with plots over time (latency
    /// percentiles, connections, throughput, host) to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,

    /// Files of different kinds of run (hold, attack, bench, knee): show
    /// each kind as a report of its own, one after the other, instead of
    /// refusing them.
    #[arg(long, conflicts_with = "html")]
    mixed: bool,

    /// Also count the latencies into buckets, as `vegeta report -type=hist[...]`
    /// draws them: 0,10ms,50ms,100ms gives [0,10ms) [10ms,50ms) [50ms,100ms)
    /// [100ms,+Inf). Every request's latency (an attack's; a hold's delivery).
    #[arg(long, value_name = "BOUNDS", value_parser = throng_report::hist::Buckets::parse)]
    hist: Option<throng_report::hist::Buckets>,
}

/// Points a plot of the HTML page holds at most: a long run is drawn in
/// wider buckets rather than in more memory than a screen can show.
const HTML_MAX_POINTS: usize = 1_000;

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let groups = throng_report::merge::group_by_kind(&args.files)?;
    if groups.len() > 1 {
        let kinds: Vec<String> = groups
            .iter()
            .map(|(kind, files)| {
                let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
                format!("{kind} ({})", names.join(", "))
            })
            .collect();
        if !args.mixed {
            eprintln!(
                "throng report: these files hold different kinds of run, whose figures do not add up: {}; give --mixed to show each kind apart",
                kinds.join("; ")
            );
            return Ok(ExitCode::from(2));
        }
        return mixed(&args, groups);
    }
    super::print(&render(&args, &args.files)?)?;
    if let Some(path) = &args.html {
        eprintln!("throng report: wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `--mixed`: each kind of run as a report of its own.
fn mixed(args: &Args, groups: Vec<(String, Vec<PathBuf>)>) -> anyhow::Result<ExitCode> {
    let mut runs = Vec::new();
    for (kind, files) in groups {
        let out = render(args, &files)?;
        match args.format {
            Format::Text => super::print(&format!("=== {kind} ===\n{out}\n"))?,
            Format::Json => runs.push(serde_json::json!({
                "kind": kind,
                "report": serde_json::from_str::<serde_json::Value>(&out)?,
            })),
        }
    }
    if args.format == Format::Json {
        let json = serde_json::json!({ "mixed": runs });
        super::print(&format!("{}\n", serde_json::to_string_pretty(&json)?))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The report of `files` (of one kind), as `args` asks: text or JSON, and
/// the HTML page written.
fn render(args: &Args, files: &[PathBuf]) -> anyhow::Result<String> {
    const SECOND: u64 = 1_000_000_000;
    let mut text = Merger::new(args.every.unwrap_or(SECOND));
    if args.every.is_none() {
        // No time series in the text: only whole-run histograms are needed.
        text = text.without_bucket_histograms();
    }
    let mut mergers = vec![text];
    let separate_plot = args.html.is_some() && args.every.is_none();
    if separate_plot {
        mergers.push(Merger::new(SECOND).with_max_buckets(HTML_MAX_POINTS));
    }
    // The error names the file and what is wrong with it: no context to add.
    let paths = files;
    let files = merge_files_into(paths, &mut mergers)?;
    let mut merged = mergers.into_iter().map(Merger::finish);
    // Invariant: `mergers` held at least the text merger.
    let text_merged = merged.next().expect("the text merger");
    let report = Report::build(&text_merged, &files, args.every.is_some());
    let hist = args
        .hist
        .as_ref()
        .map(|b| latency_buckets(b, &text_merged))
        .transpose()?;
    // A knee search's file carries its result: its table and page lead.
    let knees = throng_report::knee::read_all(paths);

    if let Some(path) = &args.html {
        let plot = merged.next().map(|plot| Report::build(&plot, &files, true));
        let over_time = plot.as_ref().unwrap_or(&report);
        let page = match knees.as_slice() {
            [knee] => throng_report::knee::render_html(knee, Some(over_time)),
            _ => throng_report::html::render(over_time),
        };
        std::fs::write(path, page).with_context(|| format!("cannot write {}", path.display()))?;
    }

    let mut out = String::new();
    match args.format {
        Format::Text => {
            for knee in &knees {
                out.push_str(&format!("{}\n", throng_report::knee::render_text(knee)));
            }
            out.push_str(&throng_report::text::render(&report));
            if let Some((name, buckets)) = &hist {
                out.push_str(&format!(
                    "\nLatency buckets ({name}):\n{}",
                    throng_report::hist::render_hist(buckets)
                ));
            }
        }
        Format::Json => {
            for f in &report.files {
                if let Some(d) = &f.damage {
                    eprintln!("throng report: warning: {d}");
                }
            }
            let mut json = serde_json::to_value(&report)?;
            if let Some(fields) = json.as_object_mut() {
                // A knee search's result goes beside the merged figures, as
                // `knees` (the same object `throng knee --format json` prints).
                if !knees.is_empty() {
                    fields.insert("knees".into(), serde_json::to_value(&knees)?);
                }
                if let Some((name, buckets)) = &hist {
                    fields.insert(
                        "hist".into(),
                        serde_json::json!({"histogram": name, "buckets": buckets}),
                    );
                }
            }
            out.push_str(&format!("{}\n", serde_json::to_string_pretty(&json)?));
        }
    }
    Ok(out)
}

/// `--hist`: the run's latency counted into `buckets`, with the name of
/// the histogram counted: every request of an attack (`latency`, timed-out
/// and failed ones included), else a hold's `delivery`.
fn latency_buckets(
    buckets: &throng_report::hist::Buckets,
    merged: &throng_report::merge::Merged,
) -> anyhow::Result<(String, Vec<throng_report::hist::HistBucket>)> {
    if let Some(all) = throng_report::interval::every_request(&merged.histograms) {
        return Ok(("latency, every request".into(), buckets.count(&all)));
    }
    for name in ["latency", "delivery"] {
        if let Some(h) = merged.histograms.get(name) {
            return Ok((name.into(), buckets.count(h)));
        }
    }
    anyhow::bail!(
        "--hist: these files hold no request latency (latency) or delivery latency to count into buckets"
    )
}

/// `--every`: a duration in the one grammar (`10s`, `500ms`, `1m`), as ns.
fn parse_duration_ns(text: &str) -> Result<u64, String> {
    let d = throng_host::units::parse_duration(text).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(format!(
            "--every {text:?} is zero; give a bucket width such as 1s or 10s"
        ));
    }
    // Invariant: the grammar caps durations at a century, far below u64::MAX ns.
    Ok(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_takes_the_shared_grammar_but_not_zero() {
        assert_eq!(parse_duration_ns("10s"), Ok(10_000_000_000));
        assert_eq!(parse_duration_ns("500ms"), Ok(500_000_000));
        assert_eq!(parse_duration_ns("1m30s"), Ok(90_000_000_000));
        assert!(parse_duration_ns("0s").is_err());
        assert!(parse_duration_ns("5y").is_err());
    }
}
