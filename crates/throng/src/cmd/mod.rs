//! One module per subcommand: its arguments (clap) and its `run`, which
//! builds the library's request from them, calls the library and prints.

pub(crate) mod agent;
pub(crate) mod attack;
pub(crate) mod bench;
pub(crate) mod client;
pub(crate) mod doctor;
pub(crate) mod hold;
pub(crate) mod knee;
pub(crate) mod report;
pub(crate) mod serve;

use std::io::{self, Write as _};

/// How a command prints its result: `--format text` (the default) or
/// `--format json`, one JSON document on stdout with progress on stderr.
/// The one spelling every command takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
}

/// Writes `text` to stdout. A reader that went away (`throng hold | head`)
/// is no error: `print!` would panic there, while the run's outcome is its
/// exit status (and its result file), so what is left of the output is
/// dropped quietly. Any other failure to write is an error.
pub(crate) fn print(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        done => done,
    }
}
