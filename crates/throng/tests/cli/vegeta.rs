//! Vegeta both ways, against the real `vegeta` binary: `throng attack
//! --format vegeta` read by `vegeta report`, `plot` and `encode`; Vegeta's
//! own JSON and CSV results read (and merged with throng's) by `throng
//! report`, with `--hist` buckets checked against `vegeta report -type=hist`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use throng_testkit::peers::Peer;
use throng_testkit::process::{command, output_within, text};
use throng_testkit::{TempDir, require};

use crate::{serve, throng};

/// Runs `cmd` (at most 90 s) and returns its stdout; fails the test on a
/// non-zero exit, with its stderr.
fn ok(cmd: &mut Command) -> Vec<u8> {
    let out = output_within(cmd, Duration::from_secs(90));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    out.stdout
}

fn vegeta(args: &[&str]) -> Vec<u8> {
    ok(command("vegeta").args(args))
}

fn report_json(files: &[&Path], extra: &[&str]) -> Value {
    let out = ok(throng()
        .arg("report")
        .args(files)
        .args(["--format", "json"])
        .args(extra));
    serde_json::from_slice(&out).expect("report JSON")
}

fn total(report: &Value, counter: &str) -> u64 {
    report["counters"][counter]["total"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {counter} in {}", report["counters"]))
}

#[test]
fn attack_results_are_read_by_vegeta() {
    require!(Peer::Vegeta);
    let server = serve(&["--workers", "1"]);
    let url = format!("http://{}/ping", server.addr);
    let dir = TempDir::new("vegeta-out");
    let run = dir.file("run.throng");
    // stdout is a pipe here, as in `throng attack ... | vegeta report`.
    let stdout = ok(throng().args([
        "attack",
        "--url",
        &url,
        "--rate",
        "200/s",
        "--requests",
        "400",
        "--workers",
        "2",
        "-q",
        "--format",
        "vegeta",
        "--output",
        run.to_str().unwrap(),
    ]));
    let results = dir.file("results.json");
    std::fs::write(&results, &stdout).unwrap();
    let lines: Vec<Value> = text(&stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 400);
    // One result per request of the schedule, each at its intended time.
    let mut by_seq: Vec<(u64, String)> = lines
        .iter()
        .map(|l| {
            (
                l["seq"].as_u64().unwrap(),
                l["timestamp"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    by_seq.sort();
    assert!(by_seq.iter().enumerate().all(|(i, (s, _))| *s == i as u64));

    let r: Value = serde_json::from_slice(&vegeta(&[
        "report",
        "-type=json",
        results.to_str().unwrap(),
    ]))
    .expect("vegeta report JSON");
    assert_eq!(r["requests"].as_u64(), Some(400), "{r}");
    assert_eq!(r["success"].as_f64(), Some(1.0), "{r}");
    assert_eq!(r["status_codes"]["200"].as_u64(), Some(400), "{r}");
    // Vegeta's rate is requests over first to last timestamp: the
    // intended times, exactly 5 ms apart (399 gaps).
    let rate = r["rate"].as_f64().unwrap();
    let exact = 400.0 / (399.0 * 0.005);
    assert!(
        (rate - exact).abs() < exact * 1e-6,
        "vegeta saw {rate}/s, the schedule {exact}/s"
    );
    // The same latencies as throng's own result file says (its µs
    // histogram keeps 3 significant digits).
    let own = report_json(&[&run], &[]);
    let max_us = own["latency_us"]["latency"]["max"].as_f64().unwrap();
    let vegeta_max_us = r["latencies"]["max"].as_f64().unwrap() / 1000.0;
    assert!(
        (max_us - vegeta_max_us).abs() <= max_us * 0.001 + 1.0,
        "throng {max_us} µs, vegeta {vegeta_max_us} µs"
    );
    assert!(r["latencies"]["min"].as_u64().unwrap() > 0, "{r}");

    // Each response's body (base64) and headers, as Vegeta writes them:
    // Vegeta reads them and writes them back unchanged.
    let first = &lines[0];
    let b64 = first["body"].as_str().unwrap_or_else(|| panic!("{first}"));
    let decoded_len = b64.len() / 4 * 3 - b64.matches('=').count();
    let (_, pong) = throng_testkit::http::get(server.addr, "/ping");
    assert_eq!(decoded_len, pong.len(), "{first}");
    assert_eq!(
        first["headers"]["Content-Length"][0].as_str(),
        Some(pong.len().to_string().as_str()),
        "{first}"
    );
    let again = text(&vegeta(&[
        "encode",
        "-to",
        "json",
        results.to_str().unwrap(),
    ]));
    let back: Value = again
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["seq"] == first["seq"])
        .unwrap();
    assert_eq!(
        (&back["body"], &back["headers"]),
        (&first["body"], &first["headers"])
    );

    let csv = vegeta(&["encode", "-to", "csv", results.to_str().unwrap()]);
    assert_eq!(text(&csv).lines().count(), 400);
    let plot = text(&vegeta(&["plot", results.to_str().unwrap()]));
    assert!(plot.contains("throng"), "the plot names the attack");
}

/// Latencies (ns) of a Vegeta JSON results file.
fn latencies(path: &Path) -> Vec<u64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["latency"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn report_reads_vegeta_results_and_merges_them() {
    require!(Peer::Vegeta);
    let server = serve(&["--workers", "1"]);
    let url = format!("http://{}/ping", server.addr);
    let dir = TempDir::new("vegeta-in");
    let bin = dir.file("v.bin");
    let targets = dir.file("targets.txt");
    std::fs::write(&targets, format!("GET {url}\n")).unwrap();
    let results = vegeta(&[
        "attack",
        "-rate=100/s",
        "-duration=2s",
        "-name=vg",
        &format!("-targets={}", targets.display()),
    ]);
    std::fs::write(&bin, &results).unwrap();
    let json = dir.file("v.json");
    let csv = dir.file("v.csv");
    std::fs::write(
        &json,
        vegeta(&["encode", "-to", "json", bin.to_str().unwrap()]),
    )
    .unwrap();
    std::fs::write(
        &csv,
        vegeta(&["encode", "-to", "csv", bin.to_str().unwrap()]),
    )
    .unwrap();
    let v: Value =
        serde_json::from_slice(&vegeta(&["report", "-type=json", bin.to_str().unwrap()])).unwrap();
    let n = v["requests"].as_u64().unwrap();
    assert!(n > 0);

    for file in [&json, &csv] {
        let r = report_json(&[file], &[]);
        assert_eq!(total(&r, "requests.sent"), n, "{}", file.display());
        assert_eq!(
            total(&r, "status.200"),
            v["status_codes"]["200"].as_u64().unwrap()
        );
        let max_us = r["latency_us"]["latency"]["max"].as_f64().unwrap();
        let vmax = v["latencies"]["max"].as_f64().unwrap() / 1000.0;
        assert!(
            (max_us - vmax).abs() <= vmax * 0.001 + 1.0,
            "{max_us} vs {vmax}"
        );
    }
    // The same results twice (as JSON and as CSV) are one run, counted once.
    let both = report_json(&[&json, &csv], &[]);
    assert_eq!(total(&both, "requests.sent"), n);
    assert!(both["duplicates"].as_u64().unwrap() > 0, "{both}");

    // With a throng attack: one kind of run, the counts add up.
    let own = dir.file("own.throng");
    ok(throng().args([
        "attack",
        "--url",
        &url,
        "--rate",
        "100/s",
        "--requests",
        "50",
        "-q",
        "--output",
        own.to_str().unwrap(),
    ]));
    let merged = report_json(&[&json, &own], &[]);
    assert_eq!(total(&merged, "requests.sent"), n + 50);

    // --hist: Vegeta's buckets over the same latencies.
    let bounds = "0,300us,1ms,5ms";
    let ns = latencies(&json);
    let edges = [0u64, 300_000, 1_000_000, 5_000_000];
    let exact: Vec<u64> = (0..edges.len())
        .map(|i| {
            ns.iter()
                .filter(|&&l| l >= edges[i] && edges.get(i + 1).is_none_or(|&e| l < e))
                .count() as u64
        })
        .collect();
    // Latencies within 0.1% of a bound may count on either side (3 significant digits).
    let near = |i: usize| {
        ns.iter()
            .filter(|&&l| {
                [edges[i], edges.get(i + 1).copied().unwrap_or(0)]
                    .iter()
                    .any(|&e| e > 0 && l.abs_diff(e) * 1000 <= e)
            })
            .count() as u64
    };
    let h = report_json(&[&json], &["--hist", bounds]);
    let buckets = h["hist"]["buckets"].as_array().expect("hist buckets");
    assert_eq!(buckets.len(), 4);
    for (i, b) in buckets.iter().enumerate() {
        let got = b["count"].as_u64().unwrap();
        assert!(
            got.abs_diff(exact[i]) <= near(i),
            "bucket {i}: {got} vs {exact:?}"
        );
    }
    // Vegeta's own hist report counts the same buckets.
    let vh = text(&vegeta(&[
        "report",
        &format!("-type=hist[{bounds}]"),
        json.to_str().unwrap(),
    ]));
    let vcounts: Vec<u64> = vh
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
        .collect();
    assert_eq!(vcounts, exact, "{vh}");
    let shown = text(&ok(throng().args([
        "report",
        json.to_str().unwrap(),
        "--hist",
        bounds,
    ])));
    assert!(shown.contains("[0µs,"), "{shown}");
    assert!(shown.contains("+Inf]"), "{shown}");

    // A damaged line: the results before it are read, with a warning.
    let damaged = dir.file("damaged.json");
    let mut body = std::fs::read(&json).unwrap();
    body.extend_from_slice(b"{\"code\": oops\n");
    std::fs::write(&damaged, body).unwrap();
    let r = report_json(&[&damaged], &[]);
    assert_eq!(total(&r, "requests.sent"), n);
    assert!(
        r["files"][0]["damage"].as_str().unwrap().contains("line"),
        "{}",
        r["files"][0]
    );
}
