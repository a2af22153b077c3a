//! `throng serve`.

use std::process::ExitCode;

/// Arguments of `throng serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'throng serve' is not built yet")
}
