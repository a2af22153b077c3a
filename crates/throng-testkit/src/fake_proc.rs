//! Fake `/proc` trees for `throng doctor` and `throng_host::doctor`: the
//! sysctls, open-file limits and memory of a machine the test makes up.

use std::path::{Path, PathBuf};

use crate::TempDir;

/// A `/proc` tree in a scratch directory, removed when dropped. It starts as
/// a roomy machine: nothing in it stops 100,000 connections from two source
/// addresses.
#[derive(Debug)]
pub struct FakeProc(TempDir);

impl FakeProc {
    pub fn new(name: &str) -> Self {
        let p = Self(TempDir::new(&format!("proc-{name}")));
        for (k, v) in [
            ("fs.nr_open", "1048576"),
            ("fs.file-max", "9223372036854775807"),
            ("fs.file-nr", "800\t0\t9223372036854775807"),
            ("net.ipv4.ip_local_port_range", "1024\t65535"),
            ("net.core.somaxconn", "4096"),
            ("net.ipv4.tcp_max_syn_backlog", "4096"),
            ("net.ipv4.tcp_mem", "1000000\t2000000\t3000000"),
        ] {
            p.set(k, v);
        }
        p.limits(1024, 1_048_576);
        p.meminfo(64 << 30);
        p
    }

    /// The tree's root, for `--proc-root` or `HostLimits::read`.
    pub fn root(&self) -> &Path {
        self.0.path()
    }

    fn sysctl(&self, name: &str) -> PathBuf {
        self.root().join("sys").join(name.replace('.', "/"))
    }

    /// Writes sysctl `name` (dotted, as `sysctl` names it).
    pub fn set(&self, name: &str, value: &str) {
        let path = self.sysctl(name);
        std::fs::create_dir_all(path.parent().expect("a sysctl has a directory"))
            .expect("create the sysctl's directory");
        std::fs::write(path, format!("{value}\n")).expect("write the sysctl");
    }

    /// Reads sysctl `name`, trimmed.
    pub fn get(&self, name: &str) -> String {
        std::fs::read_to_string(self.sysctl(name))
            .unwrap_or_else(|e| panic!("read {name}: {e}"))
            .trim()
            .to_owned()
    }

    /// This process's open-file limits, as `self/limits` shows them.
    pub fn limits(&self, soft: u64, hard: u64) {
        std::fs::create_dir_all(self.root().join("self")).expect("create self/");
        std::fs::write(
            self.root().join("self/limits"),
            format!(
                "Limit                     Soft Limit           Hard Limit           Units     \n\
                 Max open files            {soft:<20} {hard:<20} files     \n"
            ),
        )
        .expect("write self/limits");
    }

    /// `meminfo` of a 128 GiB machine with `available` bytes available.
    pub fn meminfo(&self, available: u64) {
        std::fs::write(
            self.root().join("meminfo"),
            format!(
                "MemTotal: {} kB\nMemAvailable: {} kB\n",
                (128u64 << 30) / 1024,
                available / 1024
            ),
        )
        .expect("write meminfo");
    }
}
