//! One sample of the host, taken once a second beside the latency intervals:
//! what the seeds read off a separate monitoring system.

use serde::{Deserialize, Serialize};

/// Host-wide counters and gauges at one instant. Counters (`*_total`) are
/// cumulative since boot as the kernel reports them; a report turns two
/// samples into rates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSample {
    /// Host name, so samples from several machines stay apart when merged.
    pub host: String,
    /// Wall-clock time of the sample, ns since the Unix epoch.
    pub at_ns: u64,
    /// Established TCP sockets (IPv4 + IPv6), from `/proc/net/snmp` `CurrEstab`
    /// and `/proc/net/snmp6`/sockstat.
    pub tcp_established: u64,
    /// TCP sockets in use (`/proc/net/sockstat` `TCP: inuse`).
    pub tcp_inuse: u64,
    /// Kernel memory held by TCP sockets, bytes (`/proc/net/sockstat` `mem` pages × page size).
    pub tcp_mem_bytes: u64,
    /// IP packets received / sent since boot (`/proc/net/snmp` `InReceives`/`OutRequests`).
    pub packets_in_total: u64,
    /// See `packets_in_total`.
    pub packets_out_total: u64,
    /// Bytes received / sent on all interfaces, loopback included (`/proc/net/dev`).
    pub bytes_in_total: u64,
    /// See `bytes_in_total`.
    pub bytes_out_total: u64,
    /// `MemTotal` and `MemAvailable` from `/proc/meminfo`, bytes.
    pub mem_total_bytes: u64,
    /// See `mem_total_bytes`.
    pub mem_available_bytes: u64,
    /// Kernel slab memory (`Slab`), bytes: where socket structures live.
    pub mem_slab_bytes: u64,
    /// Resident set size of each process of the run, by label (`server/worker-0`, `hold/worker-1`).
    pub rss_bytes: Vec<(String, u64)>,
    /// CPU time (user + system) of each process of the run, ns, cumulative, same labels.
    pub cpu_ns: Vec<(String, u64)>,
}
