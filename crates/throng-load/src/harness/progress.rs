//! The live view of a run: one line per interval, rewritten in place on a
//! terminal, appended in a pipe, or nothing; notes (a worker's first error,
//! Ctrl-C) on stderr, never overwritten by the next line.
//!
//! A role draws each line from a [`View`]: the merged interval, and each
//! worker's last record, so that a view can show a worker that is behind
//! or gone.

use std::collections::BTreeMap;
use std::io::{self, IsTerminal as _, Write};

use throng_report::interval::Interval;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One line rewritten in place each interval (a terminal).
    Tty,
    /// One plain line per interval (a pipe or file).
    Lines,
    /// Nothing.
    Quiet,
}

/// Where and how progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// How lines are drawn.
    pub mode: Mode,
    /// To stderr instead of stdout (when stdout carries the JSON summary).
    pub to_stderr: bool,
}

impl Progress {
    /// No progress at all.
    pub const QUIET: Self = Self {
        mode: Mode::Quiet,
        to_stderr: false,
    };

    /// The usual choice: nothing with `quiet`; else on stdout, or on stderr
    /// when stdout carries `json`; rewritten in place when that is a terminal.
    pub fn choose(quiet: bool, json: bool) -> Self {
        let terminal = if json {
            io::stderr().is_terminal()
        } else {
            io::stdout().is_terminal()
        };
        let mode = match (quiet, terminal) {
            (true, _) => Mode::Quiet,
            (false, true) => Mode::Tty,
            (false, false) => Mode::Lines,
        };
        Self {
            mode,
            to_stderr: json,
        }
    }
}

impl Progress {
    /// Prints one line of what the run is (its start lines): on stdout, or
    /// on stderr when stdout carries the JSON summary; quiet or not.
    pub fn say(&self, line: &str) {
        if self.to_stderr {
            eprintln!("{line}");
        } else {
            // Not `println!`, which panics once the reader is gone
            // (`throng hold | head`): the run goes on, and says the rest
            // (the summary, the exit status) as well as it can.
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{line}").and_then(|()| out.flush());
        }
    }
}

/// A worker's last record, as the view knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Latest {
    /// The start of its last interval, ns since the epoch.
    pub start_ns: u64,
    /// Its counters in that interval.
    pub counters: BTreeMap<String, u64>,
    /// Its levels at that interval's end.
    pub gauges: BTreeMap<String, i64>,
    /// How long after that interval's end its record came, ns: a worker
    /// held up (a stalled subscriber) sends it late.
    pub late_ns: u64,
    /// Its source (`host/knee-3`).
    pub source: String,
}

/// What one progress line is drawn from.
#[derive(Debug)]
pub struct View<'a> {
    /// The workers' records of the interval, merged, with the
    /// supervisor's. Its counts are those that came in time; its levels
    /// (gauges) are every worker's last known, a late one's from an
    /// earlier record.
    pub merged: &'a Interval,
    /// Everything counted so far in the run, late records included.
    pub totals: &'a Interval,
    /// Workers whose record of this interval had not come when it was shown.
    pub late: usize,
    /// When the run's schedule started, ns since the epoch.
    pub start_unix_ns: u64,
    /// Each worker's last record (`None`: nothing from it yet).
    pub workers: &'a [Option<Latest>],
}

impl View<'_> {
    /// Seconds from the schedule's start to the end of the interval.
    pub fn elapsed_s(&self) -> f64 {
        let end = self.merged.start_ns + self.merged.length_ns;
        end.saturating_sub(self.start_unix_ns) as f64 / 1e9
    }

    /// `  (3 of 51 workers late, last heard 4.2s ago)` when some worker's
    /// record of this interval had not come; empty otherwise.
    pub fn late_note(&self) -> String {
        if self.late == 0 {
            return String::new();
        }
        let end = self.merged.start_ns + self.merged.length_ns;
        let oldest = self
            .workers
            .iter()
            .flatten()
            .map(|l| l.start_ns + self.merged.length_ns)
            .filter(|&e| e < end)
            .min();
        let heard = match oldest {
            Some(e) => format!(", oldest {:.1}s behind", (end - e) as f64 / 1e9),
            None => String::new(),
        };
        format!(
            "  ({} of {} workers late{heard}: their counts come later)",
            self.late,
            self.workers.len()
        )
    }
}

/// The live view's output.
#[derive(Debug)]
pub(crate) struct Screen {
    progress: Progress,
    /// `throng hold`: the prefix of notes.
    who: String,
    /// A line is on screen without a line break (Tty mode).
    open_line: bool,
}

impl Screen {
    pub(crate) fn new(progress: Progress, role: &str) -> Self {
        Self {
            progress,
            who: format!("throng {role}"),
            open_line: false,
        }
    }

    fn write(&self, text: &str) {
        let _ = if self.progress.to_stderr {
            let mut e = io::stderr().lock();
            e.write_all(text.as_bytes()).and_then(|()| e.flush())
        } else {
            let mut o = io::stdout().lock();
            o.write_all(text.as_bytes()).and_then(|()| o.flush())
        };
    }

    /// One progress line.
    pub(crate) fn line(&mut self, text: &str) {
        match self.progress.mode {
            Mode::Quiet => {}
            Mode::Lines => self.write(&format!("{text}\n")),
            Mode::Tty => {
                self.write(&format!("\r\x1b[2K{text}"));
                self.open_line = true;
            }
        }
    }

    /// A message that must not be overwritten by the next progress line.
    pub(crate) fn note(&mut self, text: &str) {
        self.finish();
        eprintln!("{}: {text}", self.who);
    }

    /// Ends a line left open on a terminal.
    pub(crate) fn finish(&mut self) {
        if self.open_line {
            self.write("\n");
            self.open_line = false;
        }
    }
}
