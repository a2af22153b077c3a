//! `--metrics-listen` on the load commands: a real HTTP client (Python's
//! urllib) scrapes `/metrics` during a run and Prometheus's own parser
//! (`prometheus-client`) reads it; the figures agree with the run's
//! summary, and every expression of the Grafana dashboard
//! `deploy/grafana/load.json` reads families a real run exposes.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use throng_testkit::{Peer, free_port, require};

use crate::grafana::{board_exprs, metric_names};
use crate::serve;

/// A run in progress: the child, and its stdout and stderr as read so far
/// (drained all along, so a full pipe never stalls it).
struct Running {
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
}

/// `throng <args> --metrics-listen 127.0.0.1:<port>`, running (its summary
/// on stdout), and the endpoint's URL.
fn start(args: &[&str]) -> (Running, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = crate::throng()
        .args(args)
        .args(["--metrics-listen", &addr, "-q"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start throng");
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    (
        Running { child, out, err },
        format!("http://{addr}/metrics"),
    )
}

/// Scrapes `url` with `tests/peers/scrape_metrics.py` until each of
/// `at_least` (sample, minimum) holds: the samples and the families' types.
pub(crate) fn scrape(url: &str, at_least: &[(&str, u64)]) -> Value {
    let mut cmd = throng_testkit::process::command("python3");
    cmd.arg(throng_testkit::peers::dir().join("scrape_metrics.py"))
        .arg(url);
    for (sample, min) in at_least {
        cmd.arg("--at-least").arg(sample).arg(min.to_string());
    }
    let out = throng_testkit::process::output_within(&mut cmd, Duration::from_secs(90));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scrape_metrics.py: {err}");
    serde_json::from_slice(&out.stdout).expect("scrape_metrics.py json")
}

/// Stops a run with Ctrl-C (SIGINT) and returns its JSON summary.
fn stop(run: Running) -> Value {
    let (out, err) = interrupt(run);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"))
}

/// Stops a run with Ctrl-C (SIGINT): its stdout and stderr.
fn interrupt(mut run: Running) -> (String, String) {
    throng_testkit::process::signal(run.child.id(), "INT");
    let deadline = Instant::now() + Duration::from_secs(60);
    while run.child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = run.child.kill();
            let _ = run.child.wait();
            panic!("the run did not end after Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (
        run.out.join().unwrap_or_default(),
        run.err.join().unwrap_or_default(),
    )
}

fn sample(scraped: &Value, name: &str) -> f64 {
    scraped["samples"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("no {name} in {scraped:#}"))
}

/// The families a scrape holds, with the names their samples go by
/// (`_total`, `_bucket`, `_sum`, `_count`).
fn names(scraped: &Value) -> BTreeSet<String> {
    scraped["samples"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.split('{').next().unwrap().to_owned())
        .chain(
            scraped["types"]
                .as_object()
                .unwrap()
                .iter()
                .flat_map(|(family, kind)| {
                    // The parser names a counter's family without its `_total`.
                    let total = (kind == "counter").then(|| format!("{family}_total"));
                    std::iter::once(family.clone()).chain(total)
                }),
        )
        .collect()
}

/// A hold and an attack each serve their live figures; the dashboard reads
/// only what they serve.
#[test]
fn hold_and_attack_serve_live_metrics_that_the_dashboard_reads() {
    require!(Peer::PythonPrometheus);
    let server = serve(&["--workers", "1"]);

    let url = format!("ws://{}/live", server.addr);
    let publish = format!("http://{}/publish/live", server.addr);
    let (child, metrics) = start(&[
        "hold",
        &url,
        "-c",
        "20",
        "--rate",
        "200/s",
        "-w",
        "2",
        "--json",
        "--publish",
        &publish,
        "--publish-rate",
        "10/s",
    ]);
    let hold = scrape(
        &metrics,
        &[
            ("throng_load_connections_open{role=\"hold\"}", 20),
            ("throng_load_connect_ok_total{role=\"hold\"}", 20),
            ("throng_load_delivery_seconds_count{role=\"hold\"}", 40),
        ],
    );
    assert_eq!(
        sample(&hold, "throng_load_messages_lost_total{role=\"hold\"}"),
        0.0,
        "shown before any loss: {hold:#}"
    );
    assert_eq!(
        hold["types"]["throng_load_connect_seconds"], "histogram",
        "{hold:#}"
    );
    assert_eq!(
        hold["types"]["throng_load_connect_ok"], "counter",
        "{hold:#}"
    );
    assert_eq!(
        hold["types"]["throng_load_connections_open"], "gauge",
        "{hold:#}"
    );
    assert!(
        hold["content_type"]
            .as_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "{hold:#}"
    );
    // Both workers' connections, merged: the histogram holds every connect.
    assert_eq!(
        sample(&hold, "throng_load_connect_seconds_count{role=\"hold\"}"),
        20.0
    );
    assert_eq!(
        sample(
            &hold,
            "throng_load_connect_seconds_bucket{role=\"hold\",le=\"+Inf\"}"
        ),
        20.0
    );
    let summary = stop(child);
    assert_eq!(summary["opened"], 20, "{summary:#}");
    // doctor's findings on the plan, as the start lines said them.
    let limits = summary["limits"][0].as_str().unwrap_or_default();
    assert!(
        limits.starts_with("limits (the checks of 'throng doctor"),
        "{summary:#}"
    );

    let ping = format!("http://{}/ping", server.addr);
    let (child, metrics) = start(&[
        "attack",
        "--url",
        &ping,
        "--rate",
        "50/s",
        "--duration",
        "5m",
        "--format",
        "json",
    ]);
    let sent = "throng_load_requests_sent_total{role=\"attack\"}";
    let attack = scrape(
        &metrics,
        &[
            (sent, 20),
            ("throng_load_latency_seconds_count{role=\"attack\"}", 20),
        ],
    );
    assert_eq!(attack["types"]["throng_load_latency_seconds"], "histogram");
    assert!(
        sample(
            &attack,
            "throng_load_responses_total{role=\"attack\",code=\"200\"}"
        ) >= 20.0
    );
    let summary = stop(child);
    assert!(summary["requests"].as_u64().unwrap() >= 20, "{summary:#}");
    let limits = summary["limits"][0].as_str().unwrap_or_default();
    assert!(
        limits.starts_with("limits (the checks of 'throng doctor"),
        "{summary:#}"
    );

    let exposed: BTreeSet<String> = names(&hold).union(&names(&attack)).cloned().collect();
    let exprs = board_exprs("load.json");
    assert!(exprs.len() >= 8, "{exprs:?}");
    for expr in &exprs {
        let read = metric_names(expr);
        assert!(!read.is_empty(), "{expr} reads no throng metric");
        for name in read {
            assert!(exposed.contains(name), "{expr}: no {name} in {exposed:?}");
        }
    }
}

/// A knee search serves each level's figures as it runs it.
#[test]
fn a_knee_search_serves_its_levels_live() {
    require!(Peer::PythonPrometheus);
    let server = serve(&["--workers", "1"]);
    let dir = throng_testkit::TempDir::new("knee-metrics");
    let url = format!("http://{}/ping", server.addr);
    let (run, metrics) = start(&[
        "knee",
        "attack",
        "--url",
        &url,
        "--from",
        "50/s",
        "--to",
        "400/s",
        "--step-duration",
        "5m",
        "--warmup",
        "1s",
        "--out-dir",
        dir.path().to_str().unwrap(),
        "--format",
        "json",
    ]);
    let knee = scrape(
        &metrics,
        &[
            ("throng_load_requests_sent_total{role=\"knee\"}", 20),
            ("throng_load_latency_seconds_count{role=\"knee\"}", 20),
        ],
    );
    assert_eq!(knee["types"]["throng_load_latency_seconds"], "histogram");
    // The level it runs: the first, 50 requests a second.
    assert_eq!(sample(&knee, "throng_load_knee_level{role=\"knee\"}"), 50.0);
    let (out, err) = interrupt(run);
    let k: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_eq!(k["outcome"]["kind"], "interrupted", "{out}");
}

/// On agents the controller serves the figures of every agent's workers,
/// merged: the connections of both agents are one level.
#[test]
fn a_hold_on_agents_serves_both_agents_figures_merged() {
    let _one = crate::agents::one_at_a_time();
    require!(Peer::PythonPrometheus, Peer::RedisServer, Peer::RedisCli);
    let t = crate::agents::two_agents();
    let url = format!("ws://{}/news", t.server.addr);
    let (run, metrics) = start(&[
        "hold", &url, "-c", "40", "--rate", "400/s", "--agents", &t.url, "--json",
    ]);
    let open = "throng_load_connections_open{role=\"hold\"}";
    let hold = scrape(
        &metrics,
        &[
            (open, 40),
            ("throng_load_connect_seconds_count{role=\"hold\"}", 40),
        ],
    );
    assert_eq!(sample(&hold, open), 40.0, "{hold:#}");
    let summary = stop(run);
    assert_eq!(summary["opened"], 40, "{summary:#}");
    let agents = summary["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 2, "{summary:#}");
    assert!(
        agents.iter().all(|a| a["opened"].as_u64() > Some(0)),
        "{summary:#}"
    );
}
