//! `throng doctor`: what on this machine will stop a run of N connections,
//! and the exact commands that fix it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use throng_host::doctor::{self, Plan, Role};
use throng_load::bench;
use throng_load::harness::machine::Machine;

use super::Format;

/// Arguments of `throng doctor`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
With no --source-ips or --ports, --role both (the default) checks the run
'throng bench' would make: the same connection count (-c, or bench's own
default from this machine's memory), and the source addresses and 8 server
ports bench picks itself.

Checks, for a run of N connections: the open-file limit per process (and how
many worker processes that means), fs.nr_open, fs.file-max, the ephemeral
port range against source addresses × target ports, the listen backlogs
(somaxconn, tcp_max_syn_backlog), tcp_mem against the socket buffers one
push to every connection queues, the conntrack table if that module is
loaded, and free memory against the cost per connection (with a warning
before the OOM killer would act).

Each line is ok, WARN (works, but slower or near the edge) or STOP (this
will stop the run). Each fix is a command that works as printed (what it
changes follows as a # comment); a note says what no command can. Exit
status 1 when something will stop the run, so scripts can check first.

Examples:
  throng doctor
  throng doctor --connections 1000000 --role client \\
      --source-ips 127.0.0.2-127.0.0.40
  sudo throng doctor --connections 1000000 --apply
  throng doctor --format json | jq '.findings[] | select(.status != \"ok\")'")]
pub(crate) struct Args {
    /// Connections the run will hold. Default: what 'throng bench' picks on this machine
    /// (100,000 where memory allows).
    #[arg(long, short = 'c', value_name = "N")]
    connections: Option<u64>,

    /// Which sides run on this machine: both (bench: two sockets per
    /// connection), client (hold, attack) or server (serve).
    #[arg(long, value_enum, default_value_t = RoleArg::Both)]
    role: RoleArg,

    /// Source addresses the client side will use: 127.0.0.2-127.0.0.60 or a
    /// comma-separated list (default: one; with --role both, those bench picks).
    #[arg(long, value_name = "LIST")]
    source_ips: Option<String>,

    /// Target ports the client side will spread over: 10000-10015 or a
    /// comma-separated list (default: one; with --role both, bench's 8).
    #[arg(long, value_name = "LIST")]
    ports: Option<String>,

    /// Kernel memory per socket, bytes (a measured default for an idle TCP socket).
    #[arg(long, value_name = "BYTES", default_value_t = doctor::DEFAULT_KERNEL_BYTES_PER_SOCKET)]
    kernel_per_socket: u64,

    /// User-space memory per socket, bytes (throng's own target for an idle connection).
    #[arg(long, value_name = "BYTES", default_value_t = doctor::DEFAULT_USER_BYTES_PER_SOCKET)]
    user_per_socket: u64,

    /// Write the sysctl fixes now (needs root), then check again. Open-file
    /// limits and anything else are printed for you to apply.
    #[arg(long)]
    apply: bool,

    /// Output: human text, or JSON with the plan, the machine, every finding and fix.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,

    /// Read the limits from this /proc tree instead (a fake one, for tests).
    #[arg(long, value_name = "DIR", default_value = "/proc", hide = true)]
    proc_root: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RoleArg {
    Both,
    Client,
    Server,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let snapshot = doctor::HostLimits::read(&args.proc_root);
    let connections = args
        .connections
        .unwrap_or_else(|| bench::default_connections(&snapshot));
    let role = match args.role {
        RoleArg::Both => Role::Both,
        RoleArg::Client => Role::Client,
        RoleArg::Server => Role::Server,
    };
    let mut plan = if role == Role::Both && args.source_ips.is_none() && args.ports.is_none() {
        // Bench's own layout, on the limits read here, so doctor and bench
        // never disagree about one run.
        let (_, plan) = bench::layout(connections, &Machine::from_snapshot(&snapshot))
            .context("the run throng bench would make")?;
        plan
    } else {
        Plan::new(connections, role)
    };
    if let Some(list) = &args.source_ips {
        let ips = throng_load::hold::target::parse_sources(list).context("--source-ips")?;
        plan.source_ips = ips.len() as u64;
        plan.source_list = Some(list.clone());
        plan.source_addrs = ips;
    }
    if let Some(list) = &args.ports {
        plan.target_ports =
            doctor::count_ports(list).map_err(|e| anyhow::anyhow!("--ports {list:?}: {e}"))?;
        plan.port_list = Some(list.clone());
    }
    plan.kernel_bytes_per_socket = args.kernel_per_socket;
    plan.user_bytes_per_socket = args.user_per_socket;
    let report = doctor::examine(plan, &args.proc_root, args.apply);
    match args.format {
        Format::Json => super::print(&format!("{}\n", serde_json::to_string_pretty(&report)?))?,
        Format::Text => super::print(&report.render())?,
    }
    Ok(if report.stops > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
