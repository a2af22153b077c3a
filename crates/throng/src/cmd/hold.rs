//! `throng hold`.

use std::process::ExitCode;

/// Arguments of `throng hold`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'throng hold' is not built yet")
}
