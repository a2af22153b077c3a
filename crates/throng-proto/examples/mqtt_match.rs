//! What finding a publish's subscriptions costs: `FilterTrie` against a
//! scan of every filter, at 100, 1,000 and 10,000 distinct filters (and
//! whatever counts are given), with 1 and 100 subscribers behind each.
//!
//! ```sh
//! cargo run --release -p throng-proto --example mqtt_match [-- 100 1000 10000 100000]
//! ```
//!
//! Filters are drawn from a sensor fleet's topics, `site/S/device/D/METRIC`:
//! 60% exact topics, 25% with one `+` level, 15% ending in `#`. Each round
//! matches the same 200,000 topics (a third of them matched by no filter);
//! the figure is the median over 7 rounds of nanoseconds per topic, with
//! the matches found per topic beside it, so the two indexes can be seen to
//! agree.

use std::hint::black_box;
use std::time::Instant;

use throng_proto::mqtt::topic::{self, FilterTrie};

const METRICS: [&str; 4] = ["temp", "humidity", "battery", "status"];
const ROUNDS: usize = 7;
const TOPICS: usize = 200_000;

/// xorshift64*: repeatable input without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }
}

/// `count` distinct filters over a fleet of `sites` sites of 100 devices.
fn filters(count: usize, rng: &mut Rng) -> Vec<String> {
    let sites = (count / 100).max(1);
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let (s, d, m) = (
            rng.below(sites),
            rng.below(100),
            METRICS[rng.below(METRICS.len())],
        );
        let f = match rng.below(20) {
            0..12 => format!("site/{s}/device/{d}/{m}"),
            12..17 => format!("site/{s}/device/+/{m}"),
            _ => format!("site/{s}/device/{d}/#"),
        };
        if seen.insert(f.clone()) {
            out.push(f);
        }
    }
    out
}

/// Topics published to: two thirds within the filters' sites, one third on
/// sites no filter names.
fn topics(sites: usize, rng: &mut Rng) -> Vec<String> {
    (0..TOPICS)
        .map(|i| {
            let s = if i % 3 == 2 {
                sites + rng.below(1000)
            } else {
                rng.below(sites)
            };
            let (d, m) = (rng.below(100), METRICS[rng.below(METRICS.len())]);
            format!("site/{s}/device/{d}/{m}")
        })
        .collect()
}

/// Median nanoseconds per topic of `ROUNDS` rounds of `each` over `topics`,
/// and the matches found per topic.
fn measure(topics: &[String], mut each: impl FnMut(&str) -> usize) -> (f64, f64) {
    let mut times = Vec::with_capacity(ROUNDS);
    let mut found = 0;
    for _ in 0..ROUNDS {
        found = 0;
        let start = Instant::now();
        for t in topics {
            found += each(black_box(t));
        }
        times.push(start.elapsed().as_nanos() as f64 / topics.len() as f64);
    }
    times.sort_by(f64::total_cmp);
    (times[ROUNDS / 2], found as f64 / topics.len() as f64)
}

/// Filters in `trie` matching `topic`; their subscribers are handed to
/// `black_box`, as a server would hand them to its fan-out.
fn matched(trie: &FilterTrie<Vec<u32>>, topic: &str) -> usize {
    let mut n = 0;
    trie.for_each_match(topic, |subs| {
        black_box(subs);
        n += 1;
    });
    n
}

fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model}, {cores} cores")
}

fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .unwrap_or_else(|_| panic!("{a:?} is not a count of filters"))
        })
        .collect();
    let counts = if counts.is_empty() {
        vec![100, 1_000, 10_000]
    } else {
        counts
    };
    println!("machine: {}", machine());
    println!(
        "median of {ROUNDS} rounds of {TOPICS} publishes; ns per publish (matches found per publish)"
    );
    println!(
        "{:>9}  {:>22}  {:>22}  {:>22}",
        "filters", "trie, 1 sub each", "trie, 100 subs each", "scan of every filter"
    );
    for count in counts {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ count as u64);
        let filters = filters(count, &mut rng);
        let topics = topics((count / 100).max(1), &mut rng);
        // The values a server would keep: the subscribers of each filter.
        let mut one: FilterTrie<Vec<u32>> = FilterTrie::new();
        let mut hundred: FilterTrie<Vec<u32>> = FilterTrie::new();
        for (i, f) in filters.iter().enumerate() {
            let i = i as u32;
            one.get_or_insert_with(f, || vec![i]).expect("shallow");
            hundred
                .get_or_insert_with(f, || (i * 100..i * 100 + 100).collect())
                .expect("shallow");
        }
        let (t1, m1) = measure(&topics, |topic| matched(&one, topic));
        let (t100, m100) = measure(&topics, |topic| matched(&hundred, topic));
        // The scan is slow at 10,000 filters: a tenth of the topics suffice.
        let few = &topics[..TOPICS / 10];
        let (ts, ms) = measure(few, |topic| {
            filters.iter().filter(|f| topic::matches(f, topic)).count()
        });
        println!(
            "{count:>9}  {:>14.0} ({m1:>5.2})  {:>14.0} ({m100:>5.2})  {:>14.0} ({ms:>5.2})",
            t1, t100, ts
        );
    }
}
