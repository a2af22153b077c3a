//! What one host sample costs: takes 1000 samples of this machine with this
//! process listed `N` times (default 4, like a supervisor and its workers)
//! and prints the mean time per sample. A sampler runs once a second, so
//! anything well under a millisecond is noise.

use std::time::Instant;

use throng_host::sample::Sampler;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map_or(Ok(4), |s| s.parse())?;
    let me = std::process::id();
    let procs: Vec<(String, u32)> = (0..n).map(|i| (format!("worker-{i}"), me)).collect();
    let mut sampler = Sampler::new();
    sampler.sample(&procs)?;
    let rounds = 1000;
    let start = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(sampler.sample(&procs)?);
    }
    let per = start.elapsed() / rounds;
    println!("{rounds} samples with {n} processes: {per:?} per sample");
    Ok(())
}
