//! One sample of the host, taken once a second beside the latency intervals:
//! what the seeds read off a separate monitoring system.
//!
//! [`Sampler`] reads `/proc/net/sockstat{,6}`, `/proc/net/snmp`,
//! `/proc/net/dev`, `/proc/meminfo`, the machine's CPU time (`/proc/stat`)
//! and, for each process of the run, its RSS and CPU time. It keeps one read buffer, so calling it every second costs a
//! handful of small reads and no allocation beyond the sample itself. The
//! `/proc` root is a path so tests can point it at a fake tree.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Host-wide counters and gauges at one instant. Counters (`*_total`) are
/// cumulative since boot as the kernel reports them; a report turns two
/// samples into rates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostSample {
    /// Host name, so samples from several machines stay apart when merged.
    pub host: String,
    /// Wall-clock time of the sample, ns since the Unix epoch.
    pub at_ns: u64,
    /// Established TCP sockets (IPv4 + IPv6), from `/proc/net/snmp` `CurrEstab`
    /// (the kernel keeps one TCP MIB for both).
    pub tcp_established: u64,
    /// TCP sockets in use (`/proc/net/sockstat` `TCP: inuse` + `/proc/net/sockstat6` `TCP6: inuse`).
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
    /// TCP sockets in TIME-WAIT (`/proc/net/sockstat` `tw`): they hold a local
    /// port each, so a churning run can run out of ports with few open.
    pub tcp_time_wait: u64,
    /// TCP sockets orphaned (closed by the program, not yet by the kernel).
    pub tcp_orphan: u64,
    /// CPU time of the whole machine, all cores, ns since boot (`/proc/stat`
    /// `cpu` line: every column), and the part of it that was busy (all but
    /// idle and iowait): with the per-process figures, what other programs
    /// on the machine took. 0 when `/proc/stat` cannot be read.
    pub cpu_all_ns: u64,
    /// See `cpu_all_ns`.
    pub cpu_busy_ns: u64,
}

impl HostSample {
    /// Sum of the RSS of every process in the sample, bytes.
    pub fn rss_total(&self) -> u64 {
        self.rss_bytes.iter().map(|(_, b)| *b).sum()
    }

    /// Sum of the CPU time of every process in the sample, ns.
    pub fn cpu_total_ns(&self) -> u64 {
        self.cpu_ns.iter().map(|(_, n)| *n).sum()
    }
}

/// Why a sample could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SampleError {
    /// A `/proc` file could not be read (not Linux, or `/proc` not mounted).
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// A `/proc` file did not hold what the kernel normally writes there.
    #[error("unexpected contents in {path}: {what}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was missing or malformed.
        what: &'static str,
    },
}

/// Takes [`HostSample`]s from a `/proc` tree, reusing its buffers.
#[derive(Debug)]
pub struct Sampler {
    proc_root: PathBuf,
    host: String,
    page_size: u64,
    /// Kernel clock ticks per second (`_SC_CLK_TCK`), for `/proc/<pid>/stat` times.
    ticks_per_sec: u64,
    buf: String,
    path: PathBuf,
}

impl Default for Sampler {
    fn default() -> Self {
        Self::new()
    }
}

impl Sampler {
    /// A sampler of this machine (`/proc`), named by its host name.
    pub fn new() -> Self {
        Self::with_root("/proc", hostname())
    }

    /// A sampler of the `/proc` tree at `proc_root`, labelling samples `host`.
    pub fn with_root(proc_root: impl Into<PathBuf>, host: impl Into<String>) -> Self {
        Self {
            proc_root: proc_root.into(),
            host: host.into(),
            page_size: crate::process::page_size(),
            ticks_per_sec: crate::process::clock_ticks_per_sec(),
            buf: String::with_capacity(8192),
            path: PathBuf::new(),
        }
    }

    /// The host name samples carry.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Samples the host now, with the RSS and CPU time of each `(label, pid)`.
    /// A pid that has gone away is left out of the per-process lists, not an error.
    pub fn sample<S: AsRef<str>>(&mut self, procs: &[(S, u32)]) -> Result<HostSample, SampleError> {
        self.sample_at(now_ns(), procs)
    }

    /// [`Self::sample`] with the sample time given (tests, or a caller aligning
    /// samples on its own clock).
    pub fn sample_at<S: AsRef<str>>(
        &mut self,
        at_ns: u64,
        procs: &[(S, u32)],
    ) -> Result<HostSample, SampleError> {
        let mut s = HostSample {
            host: self.host.clone(),
            at_ns,
            ..HostSample::default()
        };
        self.read_sockstat(&mut s)?;
        self.read_snmp(&mut s)?;
        self.read_dev(&mut s)?;
        self.read_meminfo(&mut s)?;
        self.read_stat(&mut s);
        s.rss_bytes.reserve(procs.len());
        s.cpu_ns.reserve(procs.len());
        for (label, pid) in procs {
            if let Some((rss, cpu)) = self.read_process(*pid) {
                s.rss_bytes.push((label.as_ref().to_owned(), rss));
                s.cpu_ns.push((label.as_ref().to_owned(), cpu));
            }
        }
        Ok(s)
    }

    /// Reads `<proc_root>/<rel>` into `self.buf`.
    fn load(&mut self, rel: &str) -> Result<(), SampleError> {
        self.path.clear();
        self.path.push(&self.proc_root);
        self.path.push(rel);
        self.buf.clear();
        read_into(&self.path, &mut self.buf).map_err(|source| SampleError::Read {
            path: self.path.clone(),
            source,
        })
    }

    fn parse_err(&self, what: &'static str) -> SampleError {
        SampleError::Parse {
            path: self.path.clone(),
            what,
        }
    }

    fn read_sockstat(&mut self, s: &mut HostSample) -> Result<(), SampleError> {
        self.load("net/sockstat")?;
        let tcp = self
            .buf
            .lines()
            .find_map(|l| l.strip_prefix("TCP:"))
            .ok_or_else(|| self.parse_err("no 'TCP:' line"))?;
        let mut pages = None;
        for (key, value) in pairs(tcp) {
            match key {
                "inuse" => s.tcp_inuse = value,
                "orphan" => s.tcp_orphan = value,
                "tw" => s.tcp_time_wait = value,
                "mem" => pages = Some(value),
                _ => {}
            }
        }
        s.tcp_mem_bytes =
            pages.ok_or_else(|| self.parse_err("no TCP 'mem' field"))? * self.page_size;
        // IPv6 may be disabled: then there is no sockstat6 and nothing to add.
        if self.load("net/sockstat6").is_ok()
            && let Some(tcp6) = self.buf.lines().find_map(|l| l.strip_prefix("TCP6:"))
        {
            for (key, value) in pairs(tcp6) {
                if key == "inuse" {
                    s.tcp_inuse += value;
                }
            }
        }
        Ok(())
    }

    fn read_snmp(&mut self, s: &mut HostSample) -> Result<(), SampleError> {
        self.load("net/snmp")?;
        // The TCP MIB is shared by IPv4 and IPv6, so `Tcp: CurrEstab` counts both.
        let estab = table_value(&self.buf, "Tcp:", "CurrEstab");
        let rx = table_value(&self.buf, "Ip:", "InReceives");
        let tx = table_value(&self.buf, "Ip:", "OutRequests");
        s.tcp_established = estab.ok_or_else(|| self.parse_err("no Tcp CurrEstab"))?;
        s.packets_in_total = rx.ok_or_else(|| self.parse_err("no Ip InReceives"))?;
        s.packets_out_total = tx.ok_or_else(|| self.parse_err("no Ip OutRequests"))?;
        Ok(())
    }

    fn read_dev(&mut self, s: &mut HostSample) -> Result<(), SampleError> {
        self.load("net/dev")?;
        let (mut rx, mut tx) = (0u64, 0u64);
        // Two header lines, then `iface: rx_bytes rx_packets ... (8 fields) tx_bytes ...`.
        for line in self.buf.lines().skip(2) {
            let Some((_, counters)) = line.split_once(':') else {
                continue;
            };
            let mut fields = counters
                .split_ascii_whitespace()
                .map(|f| f.parse::<u64>().ok());
            let r = fields.next().flatten();
            let t = fields.nth(7).flatten();
            match (r, t) {
                (Some(r), Some(t)) => {
                    rx = rx.wrapping_add(r);
                    tx = tx.wrapping_add(t);
                }
                _ => return Err(self.parse_err("interface line without byte counters")),
            }
        }
        s.bytes_in_total = rx;
        s.bytes_out_total = tx;
        Ok(())
    }

    fn read_meminfo(&mut self, s: &mut HostSample) -> Result<(), SampleError> {
        self.load("meminfo")?;
        let (mut total, mut avail, mut slab) = (None, None, None);
        for line in self.buf.lines() {
            let Some((key, rest)) = line.split_once(':') else {
                continue;
            };
            let slot = match key {
                "MemTotal" => &mut total,
                "MemAvailable" => &mut avail,
                "Slab" => &mut slab,
                _ => continue,
            };
            *slot = kib(rest);
        }
        s.mem_total_bytes = total.ok_or_else(|| self.parse_err("no MemTotal"))?;
        // MemAvailable exists since Linux 3.14; older kernels: leave it 0.
        s.mem_available_bytes = avail.unwrap_or(0);
        s.mem_slab_bytes = slab.unwrap_or(0);
        Ok(())
    }

    /// The machine's CPU time from `/proc/stat`; left at 0 if unreadable
    /// (it adds to a sample, nothing depends on it).
    fn read_stat(&mut self, s: &mut HostSample) {
        if self.load("stat").is_err() {
            return;
        }
        let Some(cpu) = self.buf.lines().next().and_then(|l| l.strip_prefix("cpu ")) else {
            return;
        };
        let ticks: Vec<u64> = cpu
            .split_ascii_whitespace()
            .map_while(|f| f.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal ...; guest time is
        // already inside user.
        let all: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        let ns = 1_000_000_000 / self.ticks_per_sec;
        s.cpu_all_ns = all * ns;
        s.cpu_busy_ns = all.saturating_sub(idle) * ns;
    }

    /// RSS bytes and CPU ns of one process, or `None` if it is gone.
    fn read_process(&mut self, pid: u32) -> Option<(u64, u64)> {
        self.load(&format!("{pid}/stat")).ok()?;
        // The command name (field 2) is in parentheses and may hold spaces or ')'.
        let after = &self.buf[self.buf.rfind(')')? + 1..];
        // Fields after the name, numbered from 3 (state).
        let fields: Vec<&str> = after.split_ascii_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        let ticks = field(14)? + field(15)?;
        let threads = field(20).unwrap_or(0);
        let rss_pages = field(24)?;
        let mut cpu = ticks * (1_000_000_000 / self.ticks_per_sec);
        // One thread: schedstat's on-CPU time is the same quantity in ns,
        // not rounded to 10 ms ticks. (It covers only the main thread, so
        // it is no use for a process with more.)
        if threads == 1
            && self.load(&format!("{pid}/schedstat")).is_ok()
            && let Some(ns) = self
                .buf
                .split_ascii_whitespace()
                .next()
                .and_then(|f| f.parse::<u64>().ok())
            && ns > 0
        {
            cpu = ns;
        }
        Some((rss_pages * self.page_size, cpu))
    }
}

/// Wall-clock time now, ns since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// This machine's host name (`/proc/sys/kernel/hostname`), or `"localhost"`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

fn read_into(path: &Path, buf: &mut String) -> io::Result<()> {
    File::open(path)?.read_to_string(buf)?;
    Ok(())
}

/// `key value key value ...` pairs with numeric values, as sockstat writes them.
fn pairs(line: &str) -> impl Iterator<Item = (&str, u64)> {
    let mut words = line.split_ascii_whitespace();
    std::iter::from_fn(move || {
        loop {
            let key = words.next()?;
            let value = words.next()?;
            if let Ok(v) = value.parse() {
                return Some((key, v));
            }
        }
    })
}

/// `/proc/net/snmp` holds pairs of lines: `Tcp: Name1 Name2 ...` then
/// `Tcp: v1 v2 ...`. Finds `column` in the table named `prefix`. Negative
/// values (`MaxConn -1`) read as absent.
fn table_value(text: &str, prefix: &str, column: &str) -> Option<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let names = lines.next()?;
    let values = lines.next()?;
    let idx = names.split_ascii_whitespace().position(|n| n == column)?;
    values.split_ascii_whitespace().nth(idx)?.parse().ok()
}

/// `   1234 kB` as bytes.
fn kib(rest: &str) -> Option<u64> {
    let mut words = rest.split_ascii_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(n * 1024),
        None => Some(n),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(name: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("throng-host-sample-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("net")).unwrap();
        std::fs::create_dir_all(root.join("4242")).unwrap();
        let w = |rel: &str, text: &str| std::fs::write(root.join(rel), text).unwrap();
        w(
            "net/sockstat",
            "sockets: used 13\nTCP: inuse 7 orphan 1 tw 5 alloc 9 mem 120\nUDP: inuse 0 mem 0\n",
        );
        w("net/sockstat6", "TCP6: inuse 3\nUDP6: inuse 0\n");
        w(
            "net/snmp",
            "Ip: Forwarding DefaultTTL InReceives InHdrErrors OutRequests\n\
             Ip: 2 64 7082 0 4463\n\
             Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens CurrEstab InSegs\n\
             Tcp: 1 200 120000 -1 23 6 7035\n",
        );
        w(
            "net/dev",
            "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
             lo:    3193      29    0    0    0     0          0         0     3193      29    0    0    0     0       0          0\n  \
             eth0: 1000    7062    0    0    0     0          0         0   2000    4448    0    0    0     0       0          0\n",
        );
        w(
            "meminfo",
            "MemTotal:       24682416 kB\nMemFree:        22727196 kB\nMemAvailable:   24298652 kB\nSlab:  117528 kB\n",
        );
        w(
            "4242/stat",
            "4242 (a (weird) name) S 1 1 1 0 -1 4194304 98 0 0 0 150 50 0 0 20 0 3 0 468597 3133440 407 18446744073709551615\n",
        );
        w("4242/schedstat", "999 0 1\n");
        w(
            "stat",
            "cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n",
        );
        root
    }

    #[test]
    fn reads_every_figure_from_a_fake_tree() {
        let root = fake_proc("all");
        let mut sampler = Sampler::with_root(&root, "box1");
        let s = sampler
            .sample_at(7, &[("hold/worker-0", 4242), ("gone", 999_999_999)])
            .unwrap();
        let page = sampler.page_size;
        assert_eq!(s.host, "box1");
        assert_eq!(s.at_ns, 7);
        assert_eq!(s.tcp_inuse, 10);
        assert_eq!(s.tcp_orphan, 1);
        assert_eq!(s.tcp_time_wait, 5);
        assert_eq!(s.tcp_mem_bytes, 120 * page);
        assert_eq!(s.tcp_established, 6);
        assert_eq!(s.packets_in_total, 7082);
        assert_eq!(s.packets_out_total, 4463);
        assert_eq!(s.bytes_in_total, 3193 + 1000);
        assert_eq!(s.bytes_out_total, 3193 + 2000);
        assert_eq!(s.mem_total_bytes, 24_682_416 * 1024);
        assert_eq!(s.mem_available_bytes, 24_298_652 * 1024);
        assert_eq!(s.mem_slab_bytes, 117_528 * 1024);
        // Three threads: stat's ticks, not the main thread's schedstat.
        let tick_ns = 1_000_000_000 / sampler.ticks_per_sec;
        assert_eq!(s.cpu_ns, vec![("hold/worker-0".to_owned(), 200 * tick_ns)]);
        assert_eq!(s.rss_bytes, vec![("hold/worker-0".to_owned(), 407 * page)]);
        // The machine: 1000 ticks in all, 160 of them busy (not idle or iowait).
        assert_eq!(
            (s.cpu_all_ns, s.cpu_busy_ns),
            (1000 * tick_ns, 160 * tick_ns)
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn no_proc_stat_leaves_the_machine_cpu_at_zero() {
        let root = fake_proc("nostat");
        std::fs::remove_file(root.join("stat")).unwrap();
        let s = Sampler::with_root(&root, "x")
            .sample_at(1, &[] as &[(&str, u32)])
            .unwrap();
        assert_eq!((s.cpu_all_ns, s.cpu_busy_ns), (0, 0));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_missing_file_names_itself() {
        let root = fake_proc("missing");
        std::fs::remove_file(root.join("net/snmp")).unwrap();
        let err = Sampler::with_root(&root, "x")
            .sample::<&str>(&[])
            .unwrap_err();
        assert!(err.to_string().contains("net/snmp"), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let root = fake_proc("garbage");
        std::fs::write(root.join("net/sockstat"), "TCP: inuse x\n").unwrap();
        let err = Sampler::with_root(&root, "x")
            .sample::<&str>(&[])
            .unwrap_err();
        assert!(matches!(err, SampleError::Parse { .. }), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn samples_this_machine() {
        let me = std::process::id();
        let mut sampler = Sampler::new();
        let a = sampler.sample(&[("me", me)]).unwrap();
        assert!(a.mem_total_bytes > 0);
        assert!(a.mem_available_bytes <= a.mem_total_bytes);
        assert_eq!(a.rss_bytes.len(), 1);
        assert!(a.rss_bytes[0].1 > 0);
        // Burn a little CPU; the cumulative time cannot go backwards.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = sampler.sample(&[("me", me)]).unwrap();
        assert!(b.cpu_ns[0].1 >= a.cpu_ns[0].1);
        assert!(a.cpu_all_ns > 0);
        assert!(b.cpu_busy_ns >= a.cpu_busy_ns);
        assert!(b.cpu_busy_ns <= b.cpu_all_ns);
        assert!(b.at_ns >= a.at_ns);
    }
}
