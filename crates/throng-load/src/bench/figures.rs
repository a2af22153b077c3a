//! The figures a `bench` threshold may name (`--threshold 'p99<50ms'`,
//! `'server_bytes_per_connection<4096'`): `hold`'s, read from the bench's
//! hold, and the bench's own costs (memory per connection, CPU per
//! delivery), read from its report at the end.

use super::report::Report;
use crate::threshold::{Catalogue, Figure, Figures};

/// `bench`'s figures: a bare `p99` is the delivery latency.
pub const FIGURES: Catalogue = Catalogue {
    command: "bench",
    latencies: &["delivery", "connect", "publish"],
    ratios: &["loss_rate"],
    rates: &["connect_rate"],
    counts: &[
        "lost",
        "connect_errors",
        "duplicated",
        "out_of_order",
        "received",
        "opened",
        "publish_errors",
        "held",
        "server_bytes_per_connection",
        "harness_bytes_per_connection",
        "kernel_bytes_per_connection",
        "server_ns_per_delivery",
        "harness_ns_per_delivery",
    ],
};

impl Figures for Report {
    fn value(&self, figure: &Figure) -> Option<f64> {
        let memory = |v: f64| {
            (self.memory.connections >= throng_report::bench::MIN_MEASURED_CONNECTIONS).then_some(v)
        };
        let cpu = |v: f64| (self.delivery_cpu.deliveries > 0).then_some(v);
        match figure {
            Figure::Count(c) => match *c {
                "held" => Some(self.held.max(0) as f64),
                "server_bytes_per_connection" => memory(self.memory.server_per_connection),
                "harness_bytes_per_connection" => memory(self.memory.harness_per_connection),
                "kernel_bytes_per_connection" => memory(self.memory.kernel_per_connection),
                "server_ns_per_delivery" => cpu(self.delivery_cpu.server_ns),
                "harness_ns_per_delivery" => cpu(self.delivery_cpu.harness_ns),
                _ => self.hold.value(figure),
            },
            _ => self.hold.value(figure),
        }
    }
}
