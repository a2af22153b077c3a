//! `throng report`: read and merge result files into text, JSON or an HTML page.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use throng_report::merge::{Merger, merge_files_into};
use throng_report::summary::Report;

/// Arguments of `throng report`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Give any number of files: from the workers of one run, from several machines,
or from runs you want to add up. Intervals are aligned on wall-clock time and
merged exactly: counters and latency histograms add, gauges such as
connections.open add across sources, and host samples count each machine once.
An interval that appears twice (the same file given twice) is counted once.

A file cut short (a killed run) is read up to the damage, with a warning that
names the file and byte offset. A file that is not a result file is refused.
The format is documented in docs/results-format.md.

Examples:
  throng report run.throng
  throng report box1.throng box2.throng --every 10s
  throng report run.throng --format json | jq '.latency_us.delivery.p99'
  throng report run.throng --html run.html")]
pub(crate) struct Args {
    /// Result files to read and merge (written by hold, attack or bench with --output).
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Points a plot of the HTML page holds at most: a long run is drawn in
/// wider buckets rather than in more memory than a screen can show.
const HTML_MAX_POINTS: usize = 1_000;

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
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
    let files =
        merge_files_into(&args.files, &mut mergers).context("cannot read the result files")?;
    let mut merged = mergers.into_iter().map(Merger::finish);
    // Invariant: `mergers` held at least the text merger.
    let text_merged = merged.next().expect("the text merger");
    let report = Report::build(&text_merged, &files, args.every.is_some());

    if let Some(path) = &args.html {
        let page = match merged.next() {
            Some(plot) => throng_report::html::render(&Report::build(&plot, &files, true)),
            None => throng_report::html::render(&report),
        };
        std::fs::write(path, page).with_context(|| format!("cannot write {}", path.display()))?;
    }

    match args.format {
        Format::Text => print!("{}", throng_report::text::render(&report)),
        Format::Json => {
            for f in &report.files {
                if let Some(d) = &f.damage {
                    eprintln!("throng report: warning: {d}");
                }
            }
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
    }
    if let Some(path) = &args.html {
        eprintln!("throng report: wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `10s`, `500ms`, `1m`, `2h` (a bare number is seconds) as ns.
fn parse_duration_ns(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a duration; write e.g. 1s, 10s, 500ms, 1m"))?;
    let scale = match unit {
        "" | "s" => 1e9,
        "ms" => 1e6,
        "us" | "µs" => 1e3,
        "m" => 60e9,
        "h" => 3600e9,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}; use ms, s, m or h"
            ));
        }
    };
    let ns = n * scale;
    if !(1.0..=1e18).contains(&ns) {
        return Err(format!(
            "{text:?} is out of range; use something between 1ms and days"
        ));
    }
    Ok(ns as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_ns("1s"), Ok(1_000_000_000));
        assert_eq!(parse_duration_ns("10s"), Ok(10_000_000_000));
        assert_eq!(parse_duration_ns("500ms"), Ok(500_000_000));
        assert_eq!(parse_duration_ns("1m"), Ok(60_000_000_000));
        assert_eq!(parse_duration_ns("2"), Ok(2_000_000_000));
        assert!(parse_duration_ns("ten").is_err());
        assert!(parse_duration_ns("5y").is_err());
        assert!(parse_duration_ns("0s").is_err());
    }
}
