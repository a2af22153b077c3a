//! `throng report`.

use std::process::ExitCode;

/// Arguments of `throng report`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'throng report' is not built yet")
}
