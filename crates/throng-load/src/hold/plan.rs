//! Fitting a `hold` run onto the machine before it starts: how many worker
//! processes the open-file limit needs, which source addresses spread the
//! connections, and whether (source address × target port) leaves enough
//! local ports. A plan that cannot fit is refused up front with the reason
//! and the fix, rather than failing at connection 28,233.
//!
//! Connection `i` of a run goes to worker `i % workers`, source address
//! `i % sources` and target port `(i / sources) % ports`: the spread over
//! (source, port) pairs is even whatever the number of workers.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use throng_host::doctor::PORT_USE;
use throng_host::limits::DEFAULT_FD_RESERVE;

use super::target::{WsTarget, format_sources, loopback_sources};
use crate::harness::machine::Machine;

/// Loopback source addresses picked by default, when no more are needed.
pub const DEFAULT_LOOPBACK_SOURCES: usize = 4;

/// What the user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Connections to open.
    pub connections: u64,
    /// The target (with its port range).
    pub target: WsTarget,
    /// `--source-ips`, if given.
    pub sources: Option<Vec<IpAddr>>,
    /// `--workers`, if given.
    pub workers: Option<u32>,
}

/// A plan that fits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fit {
    /// Worker processes.
    pub workers: u32,
    /// Source addresses to bind (empty: let the kernel choose).
    pub sources: Vec<IpAddr>,
    /// The most connections any worker holds.
    pub per_worker: u64,
    /// The most connections any (source, target port) pair carries.
    pub per_pair: u64,
    /// Why the worker count is what it is, for the start-up print.
    pub workers_reason: String,
    /// Where the sources came from, for the start-up print.
    pub sources_reason: String,
}

/// A plan that cannot fit, with what to do about it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// Too few workers for the open-file limit.
    #[error(
        "{connections} connections over {workers} worker(s) is {per_worker} per process, but a process may open only {nofile} files\n  fix: use --workers {needed} or more (or leave --workers out), or raise the hard limit (ulimit -Hn, limits.conf nofile)"
    )]
    Files {
        /// Connections asked for.
        connections: u64,
        /// Workers asked for.
        workers: u32,
        /// Connections per worker that would make.
        per_worker: u64,
        /// The open-file limit.
        nofile: u64,
        /// Workers needed.
        needed: u64,
    },
    /// Not enough local ports for the (source, port) pairs.
    #[error(
        "{connections} connections over {sources} source address(es) × {ports} target port(s) is {per_pair} per pair, but only {usable} local ports are usable per pair (ip_local_port_range {lo}-{hi}, {pct}% of it)\n  fix: {fix}"
    )]
    Ports {
        /// Connections asked for.
        connections: u64,
        /// Source addresses.
        sources: usize,
        /// Target ports.
        ports: u32,
        /// Connections per pair that would make.
        per_pair: u64,
        /// Usable local ports per pair.
        usable: u64,
        /// The local port range.
        lo: u16,
        /// See `lo`.
        hi: u16,
        /// [`PORT_USE`] as a percentage.
        pct: u32,
        /// What would make it fit.
        fix: String,
    },
    /// Source addresses of another family than the target.
    #[error(
        "source address {source_ip} is not of the same family as the target {target}\n  fix: give --source-ips of the target's family"
    )]
    Family {
        /// The offending source.
        source_ip: IpAddr,
        /// The target address.
        target: IpAddr,
    },
    /// A source address that does not bind here.
    #[error(
        "source address {source_ip} cannot be used here: {reason}\n  fix: give --source-ips of this host (ip -brief address), or add the address to an interface first"
    )]
    NotHere {
        /// The offending source.
        source_ip: IpAddr,
        /// What binding to it said.
        reason: String,
    },
    /// Nothing to do.
    #[error("--connections must be at least 1")]
    NoConnections,
    /// `--workers 0`.
    #[error("--workers must be at least 1")]
    NoWorkers,
}

fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

/// Checks that every source address `req` names binds on this host, as
/// its connections will (a plan run here; an agent's are its own).
pub fn check_sources(req: &Request) -> Result<(), PlanError> {
    let Some(list) = &req.sources else {
        return Ok(());
    };
    crate::harness::source::check_bindable(list).map_err(|(ip, e)| PlanError::NotHere {
        source_ip: ip,
        reason: e.to_string(),
    })
}

/// Fits `req` onto `machine`, or says why it cannot.
pub fn fit(req: &Request, machine: &Machine) -> Result<Fit, PlanError> {
    let n = req.connections;
    if n == 0 {
        return Err(PlanError::NoConnections);
    }
    let per_proc = machine.per_worker().max(1);
    let needed = div_ceil(n, per_proc);
    let (workers, workers_reason) = match req.workers {
        Some(0) => return Err(PlanError::NoWorkers),
        // More workers than connections would start processes with nothing to do.
        Some(w) if u64::from(w) > n => (
            u32::try_from(n).unwrap_or(w),
            format!("--workers {w}, capped at one per connection"),
        ),
        Some(w) => {
            if u64::from(w) < needed {
                return Err(PlanError::Files {
                    connections: n,
                    workers: w,
                    per_worker: div_ceil(n, u64::from(w)),
                    nofile: machine.nofile,
                    needed,
                });
            }
            (w, "--workers".to_owned())
        }
        None => {
            // At least one per core (the harness must not be the bottleneck),
            // more when the file limit needs it, never more than connections.
            let by_cores = machine.cores.max(1) as u64;
            let w = needed.max(by_cores.min(n));
            let reason = if needed >= by_cores.min(n) {
                format!(
                    "{n} connections / {per_proc} per process (open-file limit {} - {DEFAULT_FD_RESERVE})",
                    machine.nofile
                )
            } else {
                format!(
                    "one per core ({} cores); the file limit needs {needed}",
                    machine.cores
                )
            };
            (u32::try_from(w).unwrap_or(u32::MAX), reason)
        }
    };

    let ports = req.target.port_count();
    let usable = machine.usable_ports().max(1);
    let (sources, sources_reason) = match &req.sources {
        Some(list) => {
            for ip in list {
                if ip.is_ipv4() != req.target.ip.is_ipv4() {
                    return Err(PlanError::Family {
                        source_ip: *ip,
                        target: req.target.ip,
                    });
                }
            }
            (list.clone(), "--source-ips".to_owned())
        }
        None if req.target.ip.is_ipv4() && req.target.is_loopback() => {
            // Loopback sources cost nothing: as many as keep each pair where
            // connect() is cheap (see `PORT_FAST`).
            let pairs_needed = div_ceil(n, machine.fast_ports().max(1));
            let count =
                div_ceil(pairs_needed, u64::from(ports)).max(DEFAULT_LOOPBACK_SOURCES as u64);
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            (
                loopback_sources(count),
                "loopback: picked automatically".to_owned(),
            )
        }
        None => (
            Vec::new(),
            "none given: the kernel picks the source address".to_owned(),
        ),
    };
    let source_count = sources.len().max(1);
    let pairs = source_count as u64 * u64::from(ports);
    let per_pair = div_ceil(n, pairs);
    if per_pair > usable {
        let (lo, hi) = machine.local_ports;
        let more_sources = div_ceil(div_ceil(n, usable), u64::from(ports));
        let fix = if req.target.is_loopback() && req.target.ip.is_ipv4() {
            format!(
                "give --source-ips 127.0.0.2-{} ({more_sources} addresses), or more target ports, or widen net.ipv4.ip_local_port_range (sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\")",
                loopback_sources(usize::try_from(more_sources).unwrap_or(1))
                    .last()
                    .map_or(String::new(), |ip| ip.to_string())
            )
        } else {
            format!(
                "give {more_sources} source addresses (--source-ips; add them to an interface first), or more target ports (ws://HOST:P1-P2/chan), or widen net.ipv4.ip_local_port_range (sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\")"
            )
        };
        return Err(PlanError::Ports {
            connections: n,
            sources: source_count,
            ports,
            per_pair,
            usable,
            lo,
            hi,
            pct: (PORT_USE * 100.0) as u32,
            fix,
        });
    }
    Ok(Fit {
        workers,
        per_worker: div_ceil(n, u64::from(workers)),
        per_pair,
        workers_reason,
        sources_reason: if sources.is_empty() {
            sources_reason
        } else {
            format!(
                "{} ({} addresses; {sources_reason})",
                format_sources(&sources),
                sources.len()
            )
        },
        sources,
    })
}

/// Which worker, source and port connection `i` uses.
pub fn assign(i: u64, workers: u32, sources: usize, ports: u32) -> (u32, usize, u32) {
    let s = sources.max(1) as u64;
    // Invariant: each remainder is below a divisor that fits the result type.
    let worker = (i % u64::from(workers.max(1))) as u32;
    let source = (i % s) as usize;
    let port = ((i / s) % u64::from(ports.max(1))) as u32;
    (worker, source, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            nofile: 20_000,
            local_ports: (32768, 60999),
            cores: 2,
        }
    }

    fn req(n: u64, url: &str) -> Request {
        Request {
            connections: n,
            target: url.parse().unwrap(),
            sources: None,
            workers: None,
        }
    }

    #[test]
    fn workers_are_capped_by_the_connections_and_sources_must_bind() {
        let mut r = req(1, "ws://127.0.0.1:9000/c");
        r.workers = Some(100_000);
        let f = fit(&r, &machine()).unwrap();
        assert_eq!(f.workers, 1);
        assert!(f.workers_reason.contains("capped"), "{}", f.workers_reason);
        let mut r = req(10, "ws://127.0.0.1:9000/c");
        r.sources = Some(vec!["192.0.2.1".parse().unwrap()]);
        let mut r2 = r.clone();
        r2.target = "ws://192.0.2.7:9000/c".parse().unwrap();
        for r in [r, r2] {
            assert!(fit(&r, &machine()).is_ok());
            let err = check_sources(&r).unwrap_err();
            assert!(matches!(err, PlanError::NotHere { .. }), "{err}");
            assert!(err.to_string().contains("192.0.2.1"), "{err}");
        }
    }

    #[test]
    fn small_run_uses_a_worker_per_core_and_four_loopback_sources() {
        let f = fit(&req(1000, "ws://127.0.0.1:9000/c"), &machine()).unwrap();
        assert_eq!(f.workers, 2);
        assert_eq!(f.sources.len(), DEFAULT_LOOPBACK_SOURCES);
        assert_eq!(f.per_worker, 500);
        assert_eq!(f.per_pair, 250);
        let f = fit(&req(1, "ws://127.0.0.1:9000/c"), &machine()).unwrap();
        assert_eq!(f.workers, 1);
    }

    #[test]
    fn file_limit_sets_the_worker_count() {
        let f = fit(&req(100_000, "ws://127.0.0.1:10000-10015/c"), &machine()).unwrap();
        // 19,936 per process: 100,000 needs 6.
        assert_eq!(f.workers, 6);
        assert!(f.per_worker <= machine().per_worker());
        let mut r = req(100_000, "ws://127.0.0.1:10000-10015/c");
        r.workers = Some(3);
        let err = fit(&r, &machine()).unwrap_err();
        assert!(matches!(err, PlanError::Files { needed: 6, .. }), "{err}");
        assert!(err.to_string().contains("--workers 6"));
    }

    #[test]
    fn loopback_picks_sources_that_keep_connects_cheap() {
        // 28,232 × 0.45 = 12,704 cheap per pair (past half of the range
        // connect() walks it all): 300,000 on one port takes 24 sources,
        // not the 12 that merely fit.
        let f = fit(&req(300_000, "ws://127.0.0.1:9000/c"), &machine()).unwrap();
        assert_eq!(f.sources.len(), 24);
        assert!(f.per_pair <= machine().fast_ports());
        // Given sources may go past it (up to the usable 90%).
        let mut r = req(300_000, "ws://127.0.0.1:9000/c");
        r.sources = Some(loopback_sources(12));
        let f = fit(&r, &machine()).unwrap();
        assert!(f.per_pair > machine().fast_ports() && f.per_pair <= machine().usable_ports());
    }

    #[test]
    fn refuses_too_few_ports_with_the_fix() {
        let mut r = req(60_000, "ws://10.0.0.1:9000/c");
        let err = fit(&r, &machine()).unwrap_err();
        assert!(
            matches!(
                err,
                PlanError::Ports {
                    per_pair: 60_000,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("3 source addresses"), "{err}");
        r.sources = Some(crate::hold::target::parse_sources("127.0.0.2").unwrap());
        r.target = "ws://127.0.0.1:9000-9001/c".parse().unwrap();
        let err = fit(&r, &machine()).unwrap_err();
        assert!(
            err.to_string().contains("--source-ips 127.0.0.2-127.0.0.3"),
            "{err}"
        );
        // Two sources × two ports fit.
        r.sources = Some(crate::hold::target::parse_sources("127.0.0.2-127.0.0.3").unwrap());
        assert_eq!(fit(&r, &machine()).unwrap().per_pair, 15_000);
    }

    #[test]
    fn refuses_mixed_families_and_zeroes() {
        let mut r = req(10, "ws://[::1]:9000/c");
        r.sources = Some(vec!["127.0.0.2".parse().unwrap()]);
        assert!(matches!(fit(&r, &machine()), Err(PlanError::Family { .. })));
        assert_eq!(
            fit(&req(0, "ws://127.0.0.1:1/c"), &machine()),
            Err(PlanError::NoConnections)
        );
        let mut r = req(10, "ws://127.0.0.1:1/c");
        r.workers = Some(0);
        assert_eq!(fit(&r, &machine()), Err(PlanError::NoWorkers));
        // IPv6 loopback: no automatic sources.
        assert!(
            fit(&req(10, "ws://[::1]:9000/c"), &machine())
                .unwrap()
                .sources
                .is_empty()
        );
    }

    #[test]
    fn assignment_spreads_evenly_over_pairs() {
        let mut count = std::collections::HashMap::new();
        for i in 0..4 * 3 * 10 {
            let (_, s, p) = assign(i, 5, 4, 3);
            *count.entry((s, p)).or_insert(0) += 1;
        }
        assert_eq!(count.len(), 12);
        assert!(count.values().all(|&c| c == 10));
        assert_eq!(assign(7, 2, 4, 3), (1, 3, 1));
    }
}
