//! `throng doctor`.

use std::process::ExitCode;

/// Arguments of `throng doctor`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("'throng doctor' is not built yet")
}
