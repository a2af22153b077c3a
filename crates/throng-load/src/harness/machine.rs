//! What this machine gives a run, read once before planning: open files
//! per process, local ports per (source, target) pair, cores.

use std::io;

use throng_host::doctor::{self, Finding, PORT_FAST, PORT_USE};
use throng_host::limits::{self, DEFAULT_FD_RESERVE, DEFAULT_LOCAL_PORTS, Sysctls};

/// What the machine allows (see `throng-host`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    /// Open files one process may have (the hard limit: workers raise their soft limit to it).
    pub nofile: u64,
    /// `net.ipv4.ip_local_port_range`, inclusive.
    pub local_ports: (u16, u16),
    /// CPU cores.
    pub cores: usize,
}

impl Machine {
    /// This machine, with this process's open-file limit raised to its hard
    /// limit (as every worker's will be).
    pub fn probe() -> io::Result<Self> {
        let nofile = limits::raise_nofile()
            .map_err(|e| io::Error::new(e.kind(), format!("raising the open-file limit: {e}")))?;
        Ok(Self {
            nofile,
            local_ports: Sysctls::system().local_port_range(),
            cores: limits::cores(),
        })
    }

    /// The machine as `throng doctor` read it (from `/proc`, or a fake tree
    /// in tests), without raising anything: so doctor plans on the limits it
    /// checks.
    pub fn from_snapshot(m: &doctor::HostLimits) -> Self {
        let port = |p: u64, default: u16| u16::try_from(p).unwrap_or(default);
        Self {
            nofile: m.nofile.hard,
            local_ports: m.port_range.map_or(DEFAULT_LOCAL_PORTS, |(lo, hi)| {
                (
                    port(lo, DEFAULT_LOCAL_PORTS.0),
                    port(hi, DEFAULT_LOCAL_PORTS.1),
                )
            }),
            cores: limits::cores(),
        }
    }

    /// Local ports a plan may use per (source, target) pair: [`PORT_USE`]
    /// of the range, the rest left for TIME_WAIT and other programs.
    pub fn usable_ports(&self) -> u64 {
        let (lo, hi) = self.local_ports;
        let range = u64::from(hi.saturating_sub(lo)) + 1;
        (range as f64 * PORT_USE) as u64
    }

    /// Local ports per (source, target) pair that connect cheaply
    /// ([`PORT_FAST`]): what plans aim at when they pick sources themselves.
    pub fn fast_ports(&self) -> u64 {
        let (lo, hi) = self.local_ports;
        let range = u64::from(hi.saturating_sub(lo)) + 1;
        (range as f64 * PORT_FAST) as u64
    }

    /// Connections one worker may hold (`throng-host`'s file budget).
    pub fn per_worker(&self) -> u64 {
        limits::budget(1, self.nofile, DEFAULT_FD_RESERVE).map_or(0, |b| b.per_worker)
    }
}

/// The start lines' section on this machine's limits, from `throng doctor
/// --role client`'s findings for a run of `connections`: how many limits
/// were checked, and each that is not OK, worst first (the one that will
/// stop or slow this plan first), one line each. The same checks as
/// doctor's, so a run says at start what doctor would.
pub fn limit_lines(connections: u64, findings: &[Finding]) -> Vec<String> {
    let bad = doctor::warning_lines(findings);
    let mut out = vec![format!(
        "  limits (the checks of 'throng doctor --connections {connections} --role client'): {} checked, {}",
        findings.len(),
        if bad.is_empty() {
            "all OK for this plan".to_owned()
        } else {
            format!("{} to watch, the worst first:", bad.len())
        }
    )];
    out.extend(bad.into_iter().map(|l| format!("    {l}")));
    out
}
