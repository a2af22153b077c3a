//! `throng doctor`: what on this machine will stop a run of N connections,
//! and the exact commands that fix it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use throng_host::doctor::{self, Finding, Machine, Plan, Role, Status};

/// Arguments of `throng doctor`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Checks, for a run of N connections: the open-file limit per process (and how
many worker processes that means), fs.nr_open, fs.file-max, the ephemeral
port range against source addresses × target ports, the listen backlogs
(somaxconn, tcp_max_syn_backlog), tcp_mem against the socket buffers one
push to every connection queues, the conntrack table if that module is
loaded, and free memory against the cost per connection (with a warning
before the OOM killer would act).

Each line is ok, WARN (works, but slower or near the edge) or STOP (this
will stop the run), with the exact fix. Exit status 1 when something will
stop the run, so scripts can check first.

Examples:
  throng doctor
  throng doctor --connections 1000000 --role client --source-ips 127.0.0.2-127.0.0.40
  sudo throng doctor --connections 1000000 --apply
  throng doctor --format json | jq '.findings[] | select(.status != \"ok\")'")]
pub(crate) struct Args {
    /// Connections the run will hold.
    #[arg(long, short = 'c', default_value_t = 100_000, value_name = "N")]
    connections: u64,

    /// Which sides run on this machine: both (bench: two sockets per
    /// connection), client (hold, attack) or server (serve).
    #[arg(long, value_enum, default_value_t = RoleArg::Both)]
    role: RoleArg,

    /// Source addresses the client side will use: 127.0.0.2-127.0.0.60 or a
    /// comma-separated list (default: one).
    #[arg(long, value_name = "LIST")]
    source_ips: Option<String>,

    /// Target ports the client side will spread over: 10000-10015 or a
    /// comma-separated list (default: one).
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut plan = Plan::new(
        args.connections,
        match args.role {
            RoleArg::Both => Role::Both,
            RoleArg::Client => Role::Client,
            RoleArg::Server => Role::Server,
        },
    );
    if let Some(list) = &args.source_ips {
        let ips = throng_load::hold::target::parse_sources(list).context("--source-ips")?;
        plan.source_ips = ips.len() as u64;
    }
    if let Some(list) = &args.ports {
        plan.target_ports =
            count_ports(list).map_err(|e| anyhow::anyhow!("--ports {list:?}: {e}"))?;
    }
    plan.kernel_bytes_per_socket = args.kernel_per_socket;
    plan.user_bytes_per_socket = args.user_per_socket;

    let mut findings = doctor::check_machine(&plan, &Machine::read(&args.proc_root));
    let mut applied = Vec::new();
    if args.apply {
        applied = doctor::apply(&findings, &args.proc_root);
        findings = doctor::check_machine(&plan, &Machine::read(&args.proc_root));
    }
    let stops = findings.iter().filter(|f| f.status == Status::Stop).count();
    let warnings = findings.iter().filter(|f| f.status == Status::Warn).count();
    let persist = doctor::sysctl_d(&findings);

    match args.format {
        Format::Json => {
            let out = serde_json::json!({
                "plan": plan,
                "machine": Machine::read(&args.proc_root),
                "findings": findings,
                "applied": applied,
                "stops": stops,
                "warnings": warnings,
                "sysctl_d": persist,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Format::Text => print!(
            "{}",
            text(
                &plan, &findings, &applied, stops, warnings, &persist, args.apply
            )
        ),
    }
    Ok(if stops > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn text(
    plan: &Plan,
    findings: &[Finding],
    applied: &[doctor::Applied],
    stops: usize,
    warnings: usize,
    persist: &str,
    apply: bool,
) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let role = match plan.role {
        Role::Both => "client and server on this machine, 2 sockets each",
        Role::Client => "the client side on this machine",
        Role::Server => "the server side on this machine",
    };
    let _ = writeln!(
        o,
        "throng doctor: can this machine hold {} connections ({role})?",
        plan.connections
    );
    let _ = writeln!(
        o,
        "  assuming {:.1} KiB kernel + {:.1} KiB user memory per socket (--kernel-per-socket, --user-per-socket),",
        plan.kernel_bytes_per_socket as f64 / 1024.0,
        plan.user_bytes_per_socket as f64 / 1024.0
    );
    let _ = writeln!(
        o,
        "  {} source address(es), {} target port(s), {} files per process kept for other uses\n",
        plan.source_ips, plan.target_ports, plan.fd_reserve
    );
    for a in applied {
        match &a.error {
            None => {
                let _ = writeln!(o, "  applied  {} = {}", a.name, a.value);
            }
            Some(e) => {
                let _ = writeln!(o, "  could not apply {} = {}: {e}", a.name, a.value);
            }
        }
    }
    if !applied.is_empty() {
        let _ = writeln!(o, "  (checked again after applying)\n");
    }
    for f in findings {
        let tag = match f.status {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Stop => "STOP",
        };
        let _ = writeln!(o, "  {tag:<5} {:<29} {}", f.check, f.message);
        if f.status != Status::Ok {
            for fix in &f.fixes {
                let _ = writeln!(o, "        fix: {}", fix.line());
            }
        }
    }
    let _ = writeln!(o);
    if stops == 0 && warnings == 0 {
        let _ = writeln!(
            o,
            "Nothing here will stop a run of {} connections.",
            plan.connections
        );
    } else {
        let _ = writeln!(
            o,
            "{stops} limit(s) will stop this run, {warnings} warning(s). Apply the fixes{}, then run throng doctor again.",
            if apply || persist.is_empty() {
                ""
            } else {
                " (the sysctls: throng doctor --apply, as root)"
            }
        );
    }
    if !persist.is_empty() {
        let _ = writeln!(
            o,
            "To keep the sysctl fixes after a reboot, put these lines in /etc/sysctl.d/60-throng.conf:"
        );
        for line in persist.lines() {
            let _ = writeln!(o, "  {line}");
        }
    }
    o
}

/// How many ports `10000-10015` or `9000,9001,9005-9006` names.
fn count_ports(list: &str) -> Result<u64, String> {
    let mut n = 0u64;
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let port = |s: &str| {
            s.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("'{s}' is not a port (1-65535)"))
        };
        n += match item.split_once('-') {
            None => port(item).map(|_| 1)?,
            Some((a, b)) => {
                let (a, b) = (port(a)?, port(b)?);
                if a > b {
                    return Err(format!("range '{item}' runs backwards"));
                }
                u64::from(b - a) + 1
            }
        };
    }
    if n == 0 {
        return Err("no ports".to_owned());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_count() {
        assert_eq!(count_ports("10000-10015"), Ok(16));
        assert_eq!(count_ports("9000,9001,9005-9006"), Ok(4));
        assert!(count_ports("").is_err());
        assert!(count_ports("70000").is_err());
        assert!(count_ports("9-1").is_err());
    }
}
