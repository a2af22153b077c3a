//! `throng bench`.

use std::process::ExitCode;

/// Arguments of `throng bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'throng bench' is not built yet")
}
