//! Writes a synthetic result file (two workers, one host, 60 s or the
//! seconds given) to the path given, for trying `throng report` and its HTML
//! page without a run, and for timing the report on long runs.

use std::collections::BTreeMap;

use throng_host::sample::HostSample;
use throng_report::format::{Event, Header, Writer};
use throng_report::interval::{Interval, new_histogram};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: synthetic OUT.throng [SECONDS]")?;
    let seconds: u64 = std::env::args().nth(2).map_or(Ok(60), |s| s.parse())?;
    let header = Header::new(
        std::env::args().collect(),
        serde_json::json!({"synthetic": true}),
    );
    let mut w = Writer::create(&path, &header)?;
    let base = throng_host::sample::now_ns() / 1_000_000_000 - seconds;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for s in 0..seconds {
        for worker in 0..2u64 {
            let mut delivery = new_histogram();
            let mut connect = new_histogram();
            let load = 1 + (s / 10) % 6;
            for _ in 0..1_000 {
                delivery.record(
                    200 + next() % (300 * load) + if next() % 500 == 0 { 20_000 } else { 0 },
                )?;
            }
            for _ in 0..(if s < 20 { 500 } else { 0 }) {
                connect.record(80 + next() % 400)?;
            }
            let mut counters = BTreeMap::from([
                ("connect.ok".to_owned(), if s < 20 { 500 } else { 0 }),
                ("messages.received".to_owned(), 1_000),
                ("messages.lost".to_owned(), 0),
            ]);
            if s == 12 {
                counters.insert("connect.error.refused".to_owned(), 7);
            }
            let open = 500 * (s + 1).min(20) as i64;
            w.write_interval(&Interval {
                start_ns: (base + s) * 1_000_000_000,
                length_ns: 1_000_000_000,
                source: format!("synthetic/hold-{worker}"),
                counters,
                gauges: BTreeMap::from([("connections.open".to_owned(), open)]),
                peaks: BTreeMap::new(),
                histograms: BTreeMap::from([
                    ("delivery".to_owned(), delivery),
                    ("connect".to_owned(), connect),
                ]),
                host: (worker == 0).then(|| HostSample {
                    host: "synthetic".to_owned(),
                    at_ns: (base + s + 1) * 1_000_000_000,
                    tcp_established: 2 * open as u64,
                    tcp_inuse: 2 * open as u64 + 2,
                    packets_in_total: 4_000 * s + next() % 500,
                    packets_out_total: 4_100 * s + next() % 500,
                    bytes_in_total: 400_000 * s,
                    bytes_out_total: 410_000 * s,
                    mem_total_bytes: 24 << 30,
                    mem_available_bytes: (22 << 30) - open as u64 * 8_000,
                    mem_slab_bytes: (100 << 20) + open as u64 * 3_000,
                    tcp_mem_bytes: open as u64 * 4096,
                    rss_bytes: vec![("hold/worker-0".to_owned(), (8 << 20) + open as u64 * 900)],
                    cpu_ns: vec![("hold/worker-0".to_owned(), s * 150_000_000)],
                    ..HostSample::default()
                }),
            })?;
        }
        if s == 30 {
            w.write_event(&Event {
                at_ns: (base + s) * 1_000_000_000,
                source: "synthetic/hold".to_owned(),
                kind: "worker.restarted".to_owned(),
                text: "worker 1 exited (signal 9); restarted".to_owned(),
            })?;
        }
    }
    Ok(())
}
