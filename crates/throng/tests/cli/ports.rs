//! Local ports per (source, target) pair: hold and attack pick loopback
//! sources that keep each pair under half of `ip_local_port_range`, where
//! Linux's connect() stays cheap (`throng_host::doctor::PORT_FAST`; the
//! cliff past it is measured by `scripts/bench-ports.sh`), and warn when
//! given sources go past it.

use throng_testkit::process::text;

use crate::{serve, throng};

/// The ports per pair where connects are cheap on this machine.
fn cheap_ports() -> u64 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let mut it = range.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    let (lo, hi) = (it.next().unwrap(), it.next().unwrap());
    ((hi - lo + 1) as f64 * throng_host::doctor::PORT_FAST) as u64
}

#[test]
fn hold_plans_sources_for_cheap_connects() {
    let n = cheap_ports() * 5 + 1;
    let o = throng()
        .args(["hold", "ws://127.0.0.1:9/c", "--dry-run", "-c"])
        .arg(n.to_string())
        .output()
        .unwrap();
    let out = text(&o.stdout) + &text(&o.stderr);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("(6 addresses; loopback"), "{out}");
    assert!(!out.contains("slow connects"), "{out}");
    // Given one source, the same run fits (under 90%) but is slow: it says so.
    let o = throng()
        .args([
            "hold",
            "ws://127.0.0.1:9/c",
            "--dry-run",
            "--source-ips",
            "127.0.0.2",
            "-c",
        ])
        .arg((cheap_ports() + 100).to_string())
        .output()
        .unwrap();
    let out = text(&o.stdout) + &text(&o.stderr);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("slow connects ahead"), "{out}");
}

#[test]
fn attack_plans_sources_for_cheap_connects() {
    let server = serve(&["--workers", "1"]);
    let url = format!("http://{}/ping", server.addr);
    let attack = |extra: &[&str], max: u64| {
        let o = throng()
            .args([
                "attack",
                "-u",
                &url,
                "-n",
                "1",
                "-r",
                "10/s",
                "--max-connections",
            ])
            .arg(max.to_string())
            .args(extra)
            .output()
            .unwrap();
        // The start lines go to stdout with a terminal-less run's summary.
        let out = text(&o.stdout) + &text(&o.stderr);
        assert!(o.status.success(), "{out}");
        out
    };
    let err = attack(&[], cheap_ports() * 3 + 1);
    assert!(err.contains("(4 addresses; loopback"), "{err}");
    assert!(!err.contains("slow connects"), "{err}");
    let err = attack(&["--source-ips", "127.0.0.2"], cheap_ports() + 100);
    assert!(err.contains("slow connects ahead"), "{err}");
}
