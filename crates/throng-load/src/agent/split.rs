//! Sharing a run out over agents by capacity, before anything starts.
//!
//! Workers take connections round-robin over the whole run (connection
//! `i` on worker `i % workers`, as on one machine), so an agent's share is
//! its number of workers. Each agent first gets a part of the run in
//! proportion to its cores and is fitted onto its own machine the way a
//! one-machine run is ([`crate::hold::plan::fit`]: one worker per core or
//! more when its open-file limit needs them; its `--source-ips`, or on a
//! loopback target picked ones); then the share its workers really get is
//! fitted again, and an agent whose limits cannot take it is named with
//! the limit and the fix. An `attack` has one worker per core of each
//! agent ([`attack`]).

use std::net::IpAddr;

use thiserror::Error;

use super::list::Listed;
use crate::harness::machine::Machine;
use crate::hold::plan::{self, PlanError};
use crate::hold::target::WsTarget;

/// One agent's part of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The agent.
    pub agent: String,
    /// Its first worker's number in the run.
    pub first: u32,
    /// Its workers: `first..first + workers`.
    pub workers: u32,
    /// The source addresses its workers bind.
    pub sources: Vec<IpAddr>,
    /// Connections its workers open.
    pub connections: u64,
}

/// A run shared out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Workers in the whole run.
    pub workers: u32,
    /// Each agent's part, in worker order.
    pub shares: Vec<Share>,
}

impl Split {
    /// The agent running worker `index`, and its share.
    pub fn of_worker(&self, index: u32) -> Option<&Share> {
        self.shares
            .iter()
            .find(|s| (s.first..s.first + s.workers).contains(&index))
    }
}

/// Why a run cannot be shared out.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SplitError {
    /// No agent to run it.
    #[error("no live agents")]
    NoAgents,
    /// An agent has too little free memory for its share.
    #[error(
        "agent {agent} cannot take its share of {connections} connections: memory: {available_mib} MiB available, they need ~{need_mib} MiB ({per_socket} bytes each, as throng doctor counts)\n  fix: hold at most ~{fits} connections there (80% of what is available), or add agents"
    )]
    Memory {
        /// The agent.
        agent: String,
        /// Its share.
        connections: u64,
        /// What they need, MiB.
        need_mib: u64,
        /// What it has, MiB.
        available_mib: u64,
        /// Kernel and user memory per connection, bytes.
        per_socket: u64,
        /// Connections that fit.
        fits: u64,
    },
    /// An agent cannot take its share.
    #[error("agent {agent} cannot take its share of {connections} connections: {error}")]
    Agent {
        /// The agent.
        agent: String,
        /// Its share.
        connections: u64,
        /// Which limit, and the fix.
        error: PlanError,
    },
}

/// The machine an agent registered.
fn machine(l: &Listed) -> Machine {
    let c = &l.reg.capacity;
    Machine {
        nofile: c.nofile,
        local_ports: c.local_ports,
        cores: c.cores as usize,
    }
}

/// Refuses `n` connections on agent `a` when they would take more than 80%
/// of its free memory (at `throng doctor`'s cost per socket).
fn memory(a: &Listed, n: u64) -> Result<(), SplitError> {
    use throng_host::doctor::{DEFAULT_KERNEL_BYTES_PER_SOCKET, DEFAULT_USER_BYTES_PER_SOCKET};
    let available = a.reg.capacity.free_memory;
    let per_socket = DEFAULT_KERNEL_BYTES_PER_SOCKET + DEFAULT_USER_BYTES_PER_SOCKET;
    let usable = available / 5 * 4;
    // 0: the agent could not read it; nothing to check.
    if available == 0 || n.saturating_mul(per_socket) <= usable {
        return Ok(());
    }
    Err(SplitError::Memory {
        agent: a.reg.name.clone(),
        connections: n,
        need_mib: n.saturating_mul(per_socket) >> 20,
        available_mib: available >> 20,
        per_socket,
        fits: usable / per_socket,
    })
}

/// Shares `connections` to `target` over `agents` by their capacity.
pub fn hold(agents: &[Listed], connections: u64, target: &WsTarget) -> Result<Split, SplitError> {
    if agents.is_empty() {
        return Err(SplitError::NoAgents);
    }
    let cores: u64 = agents
        .iter()
        .map(|a| u64::from(a.reg.capacity.cores.max(1)))
        .sum();
    let request =
        |a: &Listed, n: u64, workers: Option<u32>, sources: Option<Vec<IpAddr>>| plan::Request {
            connections: n.max(1),
            target: target.clone(),
            sources: sources.or_else(|| {
                let s = &a.reg.capacity.sources;
                (!s.is_empty()).then(|| s.clone())
            }),
            workers,
        };
    let mut fits = Vec::with_capacity(agents.len());
    for a in agents {
        let part = (u128::from(connections) * u128::from(a.reg.capacity.cores.max(1))
            / u128::from(cores)) as u64;
        memory(a, part)?;
        let fit = plan::fit(&request(a, part, None, None), &machine(a)).map_err(|error| {
            SplitError::Agent {
                agent: a.reg.name.clone(),
                connections: part,
                error,
            }
        })?;
        fits.push(fit);
    }
    let workers: u32 = fits.iter().map(|f| f.workers).sum();
    let mut shares = Vec::with_capacity(agents.len());
    let mut first = 0;
    for (a, fit) in agents.iter().zip(fits) {
        let n: u64 = (first..first + fit.workers)
            .map(|i| crate::harness::share(connections, i, workers))
            .sum();
        memory(a, n)?;
        if n > 0 {
            plan::fit(
                &request(a, n, Some(fit.workers), Some(fit.sources.clone())),
                &machine(a),
            )
            .map_err(|error| SplitError::Agent {
                agent: a.reg.name.clone(),
                connections: n,
                error,
            })?;
        }
        shares.push(Share {
            agent: a.reg.name.clone(),
            first,
            workers: fit.workers,
            sources: fit.sources,
            connections: n,
        });
        first += fit.workers;
    }
    Ok(Split { workers, shares })
}

/// Shares an `attack` over `agents`: one worker per core of each (request
/// `i` goes to worker `i % workers`), each worker holding its share of
/// `max_connections`, which must fit its agent's open-file limit; sources
/// are each agent's own (or the kernel's pick).
pub fn attack(agents: &[Listed], max_connections: u64) -> Result<Split, SplitError> {
    if agents.is_empty() {
        return Err(SplitError::NoAgents);
    }
    let workers: u32 = agents.iter().map(|a| a.reg.capacity.cores.max(1)).sum();
    let per_worker = max_connections.div_ceil(u64::from(workers));
    let mut shares = Vec::with_capacity(agents.len());
    let mut first = 0;
    for a in agents {
        let w = a.reg.capacity.cores.max(1);
        let n: u64 = (first..first + w)
            .map(|i| crate::harness::share(max_connections, i, workers))
            .sum();
        let m = machine(a);
        if per_worker > m.per_worker() {
            return Err(SplitError::Agent {
                agent: a.reg.name.clone(),
                connections: n,
                error: PlanError::Files {
                    connections: n,
                    workers: w,
                    per_worker,
                    nofile: m.nofile,
                    needed: n.div_ceil(m.per_worker().max(1)),
                },
            });
        }
        shares.push(Share {
            agent: a.reg.name.clone(),
            first,
            workers: w,
            sources: a.reg.capacity.sources.clone(),
            connections: n,
        });
        first += w;
    }
    Ok(Split { workers, shares })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{Capacity, Registration};

    fn agent(name: &str, cores: u32, nofile: u64, source: &str) -> Listed {
        Listed {
            reg: Registration {
                name: name.into(),
                group: None,
                version: crate::agent::VERSION.into(),
                capacity: Capacity {
                    cores,
                    nofile,
                    free_memory: 1 << 30,
                    local_ports: (32768, 60999),
                    sources: vec![source.parse().unwrap()],
                },
                clock_offset_ns: 0,
                clock_rtt_ns: 0,
                running: None,
                at_unix_ns: 0,
                instance: 0,
            },
            offset_ns: 0,
            offset_error_ns: 0,
        }
    }

    #[test]
    fn connections_follow_cores_and_add_up() {
        let target: WsTarget = "ws://10.0.0.9:9000/news".parse().unwrap();
        let agents = [
            agent("a", 2, 20_000, "10.0.0.1"),
            agent("b", 4, 20_000, "10.0.0.2"),
        ];
        let s = hold(&agents, 12_000, &target).unwrap();
        assert_eq!(s.workers, 6);
        assert_eq!((s.shares[0].first, s.shares[0].workers), (0, 2));
        assert_eq!((s.shares[1].first, s.shares[1].workers), (2, 4));
        assert_eq!(s.shares[0].connections, 4_000);
        assert_eq!(s.shares[1].connections, 8_000);
        assert_eq!(
            s.shares[1].sources,
            vec!["10.0.0.2".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(s.of_worker(5).unwrap().agent, "b");
        assert!(s.of_worker(6).is_none());
    }

    #[test]
    fn an_agent_that_cannot_take_its_share_is_named_with_the_limit() {
        let target: WsTarget = "ws://10.0.0.9:9000/news".parse().unwrap();
        // One source address and one port: at most ~26,000 per agent.
        let agents = [
            agent("a", 1, 100_000, "10.0.0.1"),
            agent("b", 1, 100_000, "10.0.0.2"),
        ];
        let e = hold(&agents, 80_000, &target).unwrap_err().to_string();
        assert!(e.contains("agent a cannot take its share of 40000"), "{e}");
        assert!(e.contains("source address"), "{e}");
        assert!(matches!(hold(&[], 10, &target), Err(SplitError::NoAgents)));
        // 1 GiB free holds ~180,000 connections, not 200,000.
        let e = hold(&[agent("m", 8, 100_000, "10.0.0.1")], 200_000, &target)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("agent m cannot take its share of 200000 connections: memory"),
            "{e}"
        );
    }

    #[test]
    fn an_attack_gives_each_core_a_worker_and_checks_the_file_limit() {
        let agents = [
            agent("a", 1, 20_000, "10.0.0.1"),
            agent("b", 3, 20_000, "10.0.0.2"),
        ];
        let s = attack(&agents, 10_000).unwrap();
        assert_eq!(s.workers, 4);
        assert_eq!(s.shares[1].first, 1);
        assert_eq!(s.shares[0].connections + s.shares[1].connections, 10_000);
        let small = [agent("a", 1, 1_000, "10.0.0.1")];
        let e = attack(&small, 5_000).unwrap_err().to_string();
        assert!(e.contains("agent a cannot take its share of 5000"), "{e}");
        assert!(e.contains("may open only 1000 files"), "{e}");
    }
}
