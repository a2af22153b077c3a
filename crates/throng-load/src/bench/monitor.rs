//! The bench's monitor: a thread that samples the host with the server's
//! processes, the harness's workers and the bench itself labelled, and
//! stops the harness if the server dies.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use throng_host::sample::{HostSample, Sampler, hostname};

/// The children of `pid` (from `/proc/<pid>/task/*/children`).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` has exited (gone, or a zombie not yet reaped).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Label prefixes of the monitor's processes.
pub mod label {
    /// The server's supervisor (`<host>/serve`) and workers (`<host>/serve-<i>`).
    pub const SERVE: &str = "/serve";
    /// The harness's workers (`<host>/hold-pid<pid>`).
    pub const HOLD: &str = "/hold-pid";
    /// The bench process itself (the harness's supervisor and publisher).
    pub const BENCH: &str = "/bench";
}

/// A thread that samples the host every `every`, with the server's
/// processes, the harness's worker processes and this process labelled.
#[derive(Debug)]
pub struct Monitor {
    stop: Arc<AtomicBool>,
    armed: Arc<AtomicBool>,
    server_died: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<HostSample>>>,
}

/// Most samples a monitor keeps (a bench is bounded in time; this bounds memory too).
pub const MAX_SAMPLES: usize = 20_000;

impl Monitor {
    /// Starts sampling. While [`Self::arm`]ed, a server that dies makes the
    /// monitor send SIGINT to this process: `hold` then stops as on Ctrl-C.
    pub fn start(server_pid: u32, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let armed = Arc::new(AtomicBool::new(false));
        let server_died = Arc::new(AtomicBool::new(false));
        let (s, a, d) = (stop.clone(), armed.clone(), server_died.clone());
        let handle = std::thread::spawn(move || {
            let host = hostname();
            let me = std::process::id();
            let mut sampler = Sampler::new();
            let mut samples = Vec::new();
            while !s.load(Ordering::Relaxed) {
                let mut procs: Vec<(String, u32)> = vec![(format!("{host}{}", label::BENCH), me)];
                if !d.load(Ordering::Relaxed) && dead(server_pid) {
                    d.store(true, Ordering::Relaxed);
                    if a.load(Ordering::Relaxed) {
                        eprintln!("\nthrong bench: the server exited; stopping the harness");
                        // hold's Ctrl-C handler is installed while armed.
                        let _ = throng_host::process::signal(me, throng_host::process::Signal::Int);
                    }
                }
                procs.push((format!("{host}{}", label::SERVE), server_pid));
                for pid in children(server_pid) {
                    let args = cmdline(pid);
                    let index = args
                        .iter()
                        .position(|a| a == "--worker-index")
                        .and_then(|i| args.get(i + 1));
                    if let Some(i) = index {
                        procs.push((format!("{host}{}-{i}", label::SERVE), pid));
                    }
                }
                for pid in children(me) {
                    // Only once it runs the worker code: before exec a fork
                    // shows this process's memory.
                    let args = cmdline(pid);
                    if pid != server_pid
                        && args.iter().any(|a| a == "hold")
                        && args.iter().any(|a| a == "--worker")
                    {
                        procs.push((format!("{host}{}{pid}", label::HOLD), pid));
                    }
                }
                if let Ok(sample) = sampler.sample(&procs) {
                    if samples.len() < MAX_SAMPLES {
                        samples.push(sample);
                    }
                }
                std::thread::sleep(every);
            }
            samples
        });
        Self {
            stop,
            armed,
            server_died,
            handle: Some(handle),
        }
    }

    /// Sets whether a dead server interrupts the harness.
    pub fn arm(&self, on: bool) {
        self.armed.store(on, Ordering::Relaxed);
    }

    /// Whether the server was seen dead.
    pub fn server_died(&self) -> bool {
        self.server_died.load(Ordering::Relaxed)
    }

    /// Stops the thread; every sample taken.
    pub fn finish(mut self) -> Vec<HostSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn children_of_a_child_are_found() {
        let mut c = Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep starts");
        assert!(children(std::process::id()).contains(&c.id()));
        c.kill().expect("kill");
        c.wait().expect("wait");
        assert!(dead(c.id()));
    }
}
