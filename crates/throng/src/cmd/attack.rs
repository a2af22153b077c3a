//! `throng attack`.

use std::process::ExitCode;

/// Arguments of `throng attack`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'throng attack' is not built yet")
}
