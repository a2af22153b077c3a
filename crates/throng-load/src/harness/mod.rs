//! The harness core: one machinery under every load role, the way hyper
//! runs its HTTP/1 client and server over one connection state machine
//! with a role each (`proto/h1/role.rs`).
//!
//! A run is a plan split over workers; every worker sends back one
//! interval record per second, and the supervisor merges them into a live
//! view, a result file and a summary. The core is everything that does not
//! depend on what the workers do:
//!
//! - supervisor side: [`supervise`] (the loop, around a [`Role`]), [`pool`]
//!   (where workers run and how they are reached: today child processes,
//!   plans on stdin, records on stdout; agents are another [`pool::Crew`]
//!   and [`pool::Feed`]), [`collect`] (merging, the result file, host
//!   samples, totals), [`progress`] (the live view) and [`metrics`] (the
//!   same figures as Prometheus text, `--metrics-listen`);
//! - worker side: [`worker`] (the plan, the supervisor's orders, interval
//!   ticks, records out);
//! - both: one [`clock`], one [`failure`]-kind machinery, one
//!   [`recorder`] interface, the [`machine`] a run is planned on, and the
//!   [`source`] addresses connections spread over.
//!
//! `hold` and `attack` are the roles today; `knee` runs a series of them,
//! an MQTT hold is one more role.

pub mod clock;
pub mod collect;
pub mod failure;
pub mod machine;
pub mod metrics;
pub mod pool;
pub mod progress;
pub mod recorder;
pub mod source;
pub mod supervise;
pub mod worker;

pub use supervise::{Role, Run, Setup};

/// Worker `index`'s share of `total` events (connections, requests) dealt
/// round-robin over `workers`: event `i` goes to worker `i % workers`.
pub fn share(total: u64, index: u32, workers: u32) -> u64 {
    let w = u64::from(workers.max(1));
    let i = u64::from(index);
    if i >= total {
        0
    } else {
        (total - i).div_ceil(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_the_whole() {
        assert_eq!(share(10, 0, 3), 4);
        assert_eq!(share(10, 2, 3), 3);
        assert_eq!(share(1, 1, 3), 0);
        for (total, workers) in [(0, 1), (7, 3), (100_001, 6), (2, 5)] {
            let sum: u64 = (0..workers).map(|i| share(total, i, workers)).sum();
            assert_eq!(sum, total, "{total} over {workers}");
        }
    }
}
