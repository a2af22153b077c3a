//! `throng bench` as a user runs it: 20,000 real connections to a real
//! `throng serve` (two processes on each side under the 20,000-file limit),
//! a short series of messages, and the result file and HTML report it writes.

use std::process::Output;
use std::time::Duration;

use throng_testkit::TempDir;
use throng_testkit::process::{alone, output_within, text};

use crate::throng;

/// Runs `throng <args>`; a bench that has not ended in 5 minutes has hung.
fn run(args: &[&str]) -> Output {
    output_within(throng().args(args), Duration::from_secs(300))
}

/// A bench's `--format json` report.
fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)))
}

#[test]
fn bench_20000_connections_delivers_every_message_and_writes_its_reports() {
    // The kernel's socket count below is the whole host's: no other test of
    // this binary may open or close sockets meanwhile.
    alone();
    let dir = TempDir::new("bench-20k");
    let out_dir = dir.path().to_str().unwrap();
    let out = run(&[
        "bench",
        "--connections",
        "20000",
        "--rate",
        "10000/s",
        "--messages",
        "3",
        // Known and above 0, or the verdict fails.
        "--threshold",
        "server_ns_per_connect>0",
        "--threshold",
        "harness_ns_per_connect>0",
        "--out-dir",
        out_dir,
        "--format",
        "json",
        "--quiet",
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let r = json(&out);

    assert_eq!(r["connections"], 20_000);
    assert_eq!(r["opened"], 20_000, "{r:#}");
    assert_eq!(r["held"], 20_000, "{r:#}");
    assert_eq!(r["failed"], 0, "{r:#}");
    assert_eq!(r["published"], 3);
    assert_eq!(r["publish_errors"], 0);
    assert_eq!(r["lost"], 0, "{r:#}");
    assert_eq!(r["duplicated"], 0);
    assert_eq!(r["received"], 60_000);
    assert_eq!(r["expected"], 60_000);
    assert_eq!(r["verdict"], "PASS", "{r:#}");
    assert_eq!(r["failures"], serde_json::json!([]));
    // Two processes per side: one process cannot hold 20,000 sockets here.
    assert!(r["settings"]["server"]["workers"].as_u64().unwrap() >= 2);
    assert!(r["settings"]["harness"]["workers"].as_u64().unwrap() >= 2);

    let messages = r["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{r:#}");
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m["seq"], i as u64 + 1);
        assert_eq!(m["delivered"], 20_000, "message {m}");
        let last = m["last_subscriber_us"].as_u64().unwrap();
        assert!(m["mean_us"].as_u64().unwrap() <= last, "message {m}");
        let l = &m["latency_us"];
        assert!(l["p50"].as_u64().unwrap() <= l["p99"].as_u64().unwrap());
        assert!(l["p99"].as_u64().unwrap() <= l["max"].as_u64().unwrap());
    }

    // Measured: both sides grew with the connections, and so did the kernel.
    let mem = &r["memory"];
    assert_eq!(mem["connections"], 20_000);
    assert!(mem["server_loaded"].as_u64().unwrap() > mem["server_before"].as_u64().unwrap());
    assert!(mem["harness_loaded"].as_u64().unwrap() > mem["harness_before"].as_u64().unwrap());
    // sockstat counts the whole host: sockets other processes were closing
    // when the run began (an earlier test's, or another program's) leave the
    // count meanwhile, so allow a tenth of the 40,000 sockets this run added
    // to be offset by them.
    assert!(
        mem["tcp_inuse_loaded"].as_u64().unwrap()
            >= mem["tcp_inuse_before"].as_u64().unwrap() + 36_000,
        "{mem:#}"
    );
    assert!(r["cpu"]["server_s"].as_f64().unwrap() > 0.0);
    assert!(r["cpu"]["harness_s"].as_f64().unwrap() > 0.0);
    // The ramp's CPU over the connections it opened (every one opened in
    // it), and the rate the machine's cores allow at that cost.
    let cc = &r["connect_cpu"];
    assert_eq!(cc["opened"], 20_000, "{cc:#}");
    let per = cc["server_ns"].as_f64().unwrap() + cc["harness_ns"].as_f64().unwrap();
    assert!(per > 0.0, "{cc:#}");
    let cores = r["settings"]["machine"]["cores"].as_f64().unwrap();
    let ceiling = cc["ceiling_per_s"].as_f64().unwrap();
    assert!(
        (ceiling - cores * 1e9 / per).abs() < 1e-6 * ceiling,
        "{cc:#}"
    );

    // The files it names exist and read back.
    let results = r["result_file"].as_str().unwrap();
    let html = std::fs::read_to_string(r["html_report"].as_str().unwrap()).unwrap();
    assert!(
        html.contains("<svg") || html.contains("<canvas"),
        "no plot in the page"
    );
    let report = run(&["report", results, "--format", "json"]);
    assert!(report.status.success(), "{}", text(&report.stderr));
    let rep: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(rep["benches"][0]["connections"]["held"], 20_000, "{rep:#}");
    // The server's processes are in the host samples beside the harness's.
    let raw = std::fs::read_to_string(results).unwrap();
    assert!(raw.contains("/serve-0"), "no server RSS in the samples");
    // Nothing left behind but the two files.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

#[test]
fn bad_settings_are_refused_before_anything_starts() {
    let out = run(&["bench", "--message-every", "0s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--message-every"));
    let out = run(&["bench", "--rate", "fast"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bench_tls_holds_wss_connections_with_a_checked_certificate_and_delivers_every_message() {
    let dir = TempDir::new("bench-tls");
    let out = run(&[
        "bench",
        "--tls",
        "--connections",
        "3000",
        "--messages",
        "2",
        "--out-dir",
        dir.path().to_str().unwrap(),
        "--format",
        "json",
        "--quiet",
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "bench --tls failed: {stderr}");
    let r = json(&out);
    assert_eq!(r["settings"]["tls"], true);
    // The default rate for TLS.
    assert_eq!(r["settings"]["rate"], "2500/s", "{:#}", r["settings"]);
    let serve_args = r["settings"]["server"]["args"].to_string();
    assert!(serve_args.contains("--tls-self-signed"), "{serve_args}");
    assert_eq!(r["opened"], 3000, "{r:#}");
    assert_eq!(r["failed"], 0, "{r:#}");
    assert_eq!(r["received"], 6000, "{r:#}");
    assert_eq!(r["lost"], 0);
    // Every connection made its own checked, full TLS handshake.
    assert_eq!(r["hold"]["tls_full"], 3000, "{:#}", r["hold"]);
    assert_eq!(r["hold"]["tls_resumed"], 0);
    assert_eq!(r["hold"]["connect_tls_us"]["count"], 3000);
    // The certificate file it trusted is gone with the run.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

/// A tmpfs mounted for one test (as root), unmounted when it ends.
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A full disk: bench says so in one line and leaves no file behind, not
/// its hidden hold file nor a partial result or page. Needs root (mount).
#[test]
fn a_full_disk_is_one_error_line_and_no_partial_file() {
    let dir = TempDir::new("bench-full");
    for size in ["8k", "40k"] {
        let mnt = dir.path().join(format!("full-{size}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        let _umount = Tmpfs(mnt.clone());
        let out = run(&[
            "bench",
            "-c",
            "200",
            "--messages",
            "2",
            "--out-dir",
            mnt.to_str().unwrap(),
            "-q",
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        let errors: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("No space left"))
            .collect();
        assert_eq!(errors.len(), 1, "{err}");
        assert_eq!(errors[0].matches("No space left").count(), 1, "{err}");
        let left: Vec<_> = std::fs::read_dir(&mnt)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{size}: left {left:?}");
    }
}

/// `--threshold` on the figures bench prints: each failed one makes the
/// verdict FAIL (exit 1) and is named; one that holds changes nothing; a
/// cost not measured (memory per connection under 1,000 connections) is
/// unknown, so its threshold fails; a figure bench does not print is
/// refused before anything starts.
#[test]
fn bench_thresholds_on_its_figures_fail_the_verdict_and_name_themselves() {
    let dir = TempDir::new("bench-threshold");
    let out = run(&[
        "bench",
        "--connections",
        "300",
        "--messages",
        "2",
        "--message-every",
        "300ms",
        "--threshold",
        "held>=300",
        "--threshold",
        "received<1",
        "--threshold",
        "server_bytes_per_connection<1000000",
        "--out-dir",
        dir.path().to_str().unwrap(),
        "--format",
        "json",
        "--quiet",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let r = json(&out);
    assert_eq!(r["verdict"], "FAIL", "{r:#}");
    assert_eq!(r["received"], 600, "{r:#}");
    assert_eq!(
        r["failures"],
        serde_json::json!([
            "received<1: received was 600",
            "server_bytes_per_connection<1000000: server_bytes_per_connection is unknown (nothing measured)"
        ]),
        "{r:#}"
    );
    let out = run(&["bench", "--threshold", "error_rate<1%"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not one of bench's"),
        "{}",
        text(&out.stderr)
    );
}
