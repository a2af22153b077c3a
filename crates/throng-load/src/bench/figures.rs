//! The figures a `bench` threshold may name (`--threshold 'p99<50ms'`,
//! `'server_bytes_per_connection<4096'`): `hold`'s, read from the bench's
//! hold, and the bench's own costs (memory per connection, CPU per
//! delivery and per connection opened), read from its report at the end.

use super::report::Report;
use crate::hold::figures::COUNTS as HOLD;
use crate::threshold::{Catalogue, Figure, Figures};

/// `bench`'s figures: a bare `p99` is the delivery latency.
pub const FIGURES: Catalogue = Catalogue {
    command: "bench",
    latencies: &["delivery", "connect", "publish"],
    ratios: &["loss_rate"],
    rates: &["connect_rate"],
    counts: &COUNTS,
};

/// The bench's own costs, beside hold's counts.
const OWN: [&str; 10] = [
    "held",
    "server_bytes_per_connection",
    "harness_bytes_per_connection",
    "kernel_bytes_per_connection",
    "server_ns_per_delivery",
    "harness_ns_per_delivery",
    "server_fanout_ns_per_delivery",
    "harness_fanout_ns_per_delivery",
    "server_ns_per_connect",
    "harness_ns_per_connect",
];

/// hold's counts, then [`OWN`].
const COUNTS: [&str; HOLD.len() + OWN.len()] = {
    let mut out = [""; HOLD.len() + OWN.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = if i < HOLD.len() {
            HOLD[i]
        } else {
            OWN[i - HOLD.len()]
        };
        i += 1;
    }
    out
};

impl Figures for Report {
    fn value(&self, figure: &Figure) -> Option<f64> {
        let memory = |v: f64| {
            (self.memory.connections >= throng_report::bench::MIN_MEASURED_CONNECTIONS).then_some(v)
        };
        let cpu = |v: f64| (self.delivery_cpu.deliveries > 0).then_some(v);
        let connect = |v: f64| (self.connect_cpu.opened > 0).then_some(v);
        match figure {
            Figure::Count(c) => match *c {
                "held" => Some(self.held.max(0) as f64),
                "server_bytes_per_connection" => memory(self.memory.server_per_connection),
                "harness_bytes_per_connection" => memory(self.memory.harness_per_connection),
                "kernel_bytes_per_connection" => memory(self.memory.kernel_per_connection),
                "server_ns_per_delivery" => cpu(self.delivery_cpu.server_ns),
                "harness_ns_per_delivery" => cpu(self.delivery_cpu.harness_ns),
                "server_fanout_ns_per_delivery" => self.delivery_cpu.server_fanout_ns,
                "harness_fanout_ns_per_delivery" => self.delivery_cpu.harness_fanout_ns,
                "server_ns_per_connect" => connect(self.connect_cpu.server_ns),
                "harness_ns_per_connect" => connect(self.connect_cpu.harness_ns),
                _ => self.hold.value(figure),
            },
            _ => self.hold.value(figure),
        }
    }
}
