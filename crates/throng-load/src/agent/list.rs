//! The live agents as a controller sees them: every registration under
//! the prefix (of one group, if asked), with each agent's clock offset to
//! this machine (both measured against Redis's `TIME`), and `throng
//! agents`'s table of them.

use std::fmt::Write as _;

use throng_client::link::LinkError;

use super::redis::{Conn, Redis};
use super::{Keys, Registration};

/// One live agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// What it registered.
    pub reg: Registration,
    /// Its clock less this machine's, ns.
    pub offset_ns: i64,
    /// How uncertain that is: half of both round trips, ns.
    pub offset_error_ns: u64,
}

/// Every live agent (of `group`, if given), by name.
pub async fn discover(
    conn: &mut Conn,
    keys: &Keys,
    group: Option<&str>,
) -> Result<Vec<Listed>, LinkError> {
    let (mine, my_rtt) = conn.clock_offset().await?;
    let mut out = Vec::new();
    for key in conn.scan(&keys.agents_pattern()).await? {
        // Expired between SCAN and GET: gone.
        let Some(value) = conn.get(&key).await? else {
            continue;
        };
        // Not an agent's key (another program under the prefix): skipped.
        let Ok(reg) = serde_json::from_slice::<Registration>(&value) else {
            continue;
        };
        if group.is_some_and(|g| reg.group.as_deref() != Some(g)) {
            continue;
        }
        out.push(Listed {
            offset_ns: reg.clock_offset_ns.saturating_sub(mine),
            offset_error_ns: (reg.clock_rtt_ns + my_rtt) / 2,
            reg,
        });
    }
    out.sort_by(|a, b| a.reg.name.cmp(&b.reg.name));
    Ok(out)
}

/// [`discover`] on a runtime of its own, for a command that only lists.
pub fn list(redis: &Redis, keys: &Keys, group: Option<&str>) -> Result<Vec<Listed>, LinkError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LinkError::Io)?;
    rt.block_on(async {
        let mut conn = Conn::open(redis).await?;
        discover(&mut conn, keys, group).await
    })
}

/// Milliseconds with a sign and one decimal, for offsets.
pub fn fmt_offset(ns: i64) -> String {
    format!("{:+.1} ms", ns as f64 / 1e6)
}

/// `throng agents`'s table.
pub fn render(listed: &[Listed]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<20} {:<10} {:<10} {:>5} {:>9} {:>10} {:<13} {:<16} {:>18}  running",
        "agent",
        "group",
        "version",
        "cores",
        "files",
        "free mem",
        "ports",
        "sources",
        "clock offset"
    );
    for l in listed {
        let c = &l.reg.capacity;
        let sources = super::describe_sources(&c.sources);
        let running = match &l.reg.running {
            Some(r) => format!("{} run {} ({} workers)", r.role, r.run, r.workers),
            None => "idle".to_owned(),
        };
        let _ = writeln!(
            out,
            "{:<20} {:<10} {:<10} {:>5} {:>9} {:>10} {:<13} {:<16} {:>18}  {running}",
            l.reg.name,
            l.reg.group.as_deref().unwrap_or("-"),
            l.reg.version,
            c.cores,
            c.nofile,
            format!("{:.1} GiB", c.free_memory as f64 / f64::from(1u32 << 30)),
            format!("{}-{}", c.local_ports.0, c.local_ports.1),
            sources,
            format!(
                "{} ±{:.1}",
                fmt_offset(l.offset_ns),
                l.offset_error_ns as f64 / 1e6
            ),
        );
    }
    out
}
