//! `throng attack` end to end: the real binary against real servers on
//! loopback (its own `throng serve` /ping, and small std servers written
//! here that stall on cue). Every run is bounded (seconds, a few thousand
//! requests) and uses free ports.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use throng_testkit::process::{output_within, text};
use throng_testkit::{Server, TempDir};

use crate::{run_json, serve, throng};

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// `throng serve` with one worker and `extra`.
fn serve_one(extra: &[&str]) -> Server {
    serve(&[&["--workers", "1"], extra].concat())
}

/// A URL on a loopback port nobody listens on (its listener is gone).
fn dead_url() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}/")
}

/// The server's `/ping` URL.
fn ping_url(server: &Server) -> String {
    format!("http://{}/ping", server.addr)
}

/// When a stall server saw its first request (monotonic and unix ns).
type FirstRequest = Arc<Mutex<Option<(Instant, u64)>>>;

/// A keep-alive HTTP server (a thread per connection) that answers every
/// request with `ok`, except that from `stall_after` after its first request
/// it holds every answer until `stall_for` later. Returns its port and the
/// stall's start (unix ns, set at the first request).
fn stall_server(stall_after: Duration, stall_for: Duration) -> (u16, FirstRequest) {
    let first: FirstRequest = Arc::new(Mutex::new(None));
    let f = first.clone();
    let port = ok_server(move |_head| {
        let (t0, _) = *f
            .lock()
            .unwrap()
            .get_or_insert_with(|| (Instant::now(), unix_ns()));
        let (from, until) = (t0 + stall_after, t0 + stall_after + stall_for);
        let now = Instant::now();
        if now >= from && now < until {
            std::thread::sleep(until - now);
        }
    });
    (port, first)
}

/// A keep-alive HTTP server (a thread per connection) that answers every
/// request with `ok` once `before` returns (given the request's head).
/// Returns its port.
fn ok_server(before: impl Fn(&str) + Clone + Send + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let before = before.clone();
            std::thread::spawn(move || {
                let _ = conn.set_nodelay(true);
                let mut buf = Vec::new();
                let mut chunk = [0u8; 16384];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        before(&String::from_utf8_lossy(&buf[..end]));
                        buf.drain(..end + 4);
                        if conn
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .is_err()
                        {
                            return;
                        }
                    }
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    port
}

/// Runs `throng attack ARGS --format json -q`; returns the exit code, the
/// JSON summary (Null if none) and stderr.
fn attack(args: &[&str]) -> (i32, Value, String) {
    run_json("attack", args)
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn rows(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("per-request file");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("row is JSON"))
        .collect()
}

#[test]
fn rate_is_held_and_every_planned_request_is_sent() {
    let (port, _) = stall_server(Duration::from_secs(3600), Duration::ZERO);
    let url = format!("http://127.0.0.1:{port}/");
    let (code, s, err) = attack(&[
        "--url",
        &url,
        "--rate",
        "1000/s",
        "--duration",
        "3s",
        "--workers",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(n(&s, "planned"), 3000);
    assert_eq!(n(&s, "requests"), 3000, "{s}");
    assert_eq!(s["status"]["200"].as_u64(), Some(3000), "{s}");
    let rate = s["rate"].as_f64().unwrap();
    assert!(
        (rate - 1000.0).abs() / 1000.0 < 0.01,
        "achieved {rate}/s of 1000/s"
    );
    // Keep-alive: far fewer connections than requests.
    assert!(n(&s, "connections_opened") < 300, "{s}");
}

#[test]
fn results_are_read_back_by_report() {
    let (port, _) = stall_server(Duration::from_secs(3600), Duration::ZERO);
    let url = format!("http://127.0.0.1:{port}/");
    let dir = TempDir::new("attack");
    let out = dir.file("results.jsonl");
    let (code, _, err) = attack(&[
        "--url",
        &url,
        "--rate",
        "100/s",
        "--requests",
        "100",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let report = throng()
        .args(["report", "--format", "json"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let r: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(
        r["counters"]["requests.sent"]["total"].as_u64(),
        Some(100),
        "{r}"
    );
    assert_eq!(
        r["counters"]["status.200"]["total"].as_u64(),
        Some(100),
        "{r}"
    );
    assert_eq!(
        r["latency_us"]["latency"]["count"].as_u64(),
        Some(100),
        "{r}"
    );
}

#[test]
fn a_stall_shows_in_latency_not_in_service_time() {
    // One connection (--max-connections 1): the coordinated-omission trap of
    // closed-loop tools. The server stalls 1 s, one second in.
    let stall = Duration::from_secs(1);
    let (port, first) = stall_server(Duration::from_secs(1), stall);
    let url = format!("http://127.0.0.1:{port}/");
    let dir = TempDir::new("attack");
    let rows_path = dir.file("co.jsonl");
    let p = rows_path.to_str().unwrap();
    let (code, s, err) = attack(&[
        "--url",
        &url,
        "--rate",
        "200/s",
        "--duration",
        "3s",
        "--workers",
        "1",
        "--max-connections",
        "1",
        "--per-request",
        p,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(n(&s, "requests"), 600, "{s}");
    assert_eq!(s["status"]["200"].as_u64(), Some(600), "{s}");
    let (_, t0_ns) = first.lock().unwrap().expect("the server saw requests");
    let stall_from = t0_ns + 1_000_000_000;
    let stall_ns = stall.as_nanos() as u64;
    let rows = rows(&rows_path);
    assert_eq!(rows.len(), 600);
    // Requests due in the first half of the stall waited for its end: their
    // latency (from the intended start) is at least the rest of the stall.
    let due: Vec<&Value> = rows
        .iter()
        .filter(|r| {
            let at = n(r, "intended_ns");
            at >= stall_from + 50_000_000 && at <= stall_from + stall_ns / 2
        })
        .collect();
    assert!(due.len() >= 80, "{} requests due in the stall", due.len());
    let waited = due
        .iter()
        .filter(|r| {
            n(r, "latency_us") * 1000 + 100_000_000 >= stall_from + stall_ns - n(r, "intended_ns")
        })
        .count();
    assert!(
        waited * 10 >= due.len() * 9,
        "{waited} of {} show the stall",
        due.len()
    );
    // Service times (from the actual send) don't: only the request that was
    // on the wire when the stall began took long.
    let slow_service = rows
        .iter()
        .filter(|r| n(r, "service_us") >= 500_000)
        .count();
    assert!(
        slow_service <= 2,
        "{slow_service} requests with service >= 500 ms"
    );
    assert!(n(&s["latency_us"], "p99") >= 500_000, "{s}");
    assert!(n(&s["service_us"], "p50") < 100_000, "{s}");
    // The generator says it could not keep the schedule (its one connection was busy).
    assert!(n(&s, "late") >= 80, "{s}");
}

#[test]
fn ping_sleep_and_times() {
    let serve = serve_one(&[]);
    // Reads a response to its end: the last chunk of a chunked one, else
    // the close (requests without `times` ask for one).
    let exchange = |req: &str| -> (Vec<u8>, Duration) {
        let mut c = TcpStream::connect(("127.0.0.1", serve.addr.port())).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let began = Instant::now();
        c.write_all(req.as_bytes()).unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while !got.ends_with(b"\r\n0\r\n\r\n") {
            match c.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(k) => got.extend_from_slice(&chunk[..k]),
            }
        }
        (got, began.elapsed())
    };
    let count = |hay: &[u8]| hay.windows(4).filter(|w| *w == b"pong").count();

    let (plain, _) = exchange(
        "POST /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert!(
        plain.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&plain)
    );
    assert_eq!(count(&plain), 1);

    let (many, took) = exchange("GET /ping HTTP/1.1\r\nHost: t\r\nsleep: 100\r\ntimes: 3\r\n\r\n");
    let text = String::from_utf8_lossy(&many);
    assert!(text.contains("Transfer-Encoding: chunked"), "{text}");
    assert_eq!(count(&many), 4, "{text}");
    assert!(took < Duration::from_millis(4 * 100 + 3000), "{took:?}");

    for bad in ["sleep: soon", "times: -1", "times: 1000000"] {
        let (resp, _) = exchange(&format!("GET /ping HTTP/1.1\r\nHost: t\r\n{bad}\r\n\r\n"));
        let text = String::from_utf8_lossy(&resp);
        assert!(text.starts_with("HTTP/1.1 400"), "{bad}: {text}");
        assert!(
            text.contains(bad.split(':').next().unwrap()),
            "{bad}: {text}"
        );
    }

    // Through attack: counts exact, timing loose; every response identical in size.
    let (code, s, err) = attack(&[
        "--url",
        &ping_url(&serve),
        "-H",
        "sleep: 200",
        "-H",
        "times: 2",
        "--rate",
        "50/s",
        "--requests",
        "100",
        "--workers",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(n(&s, "requests"), 100);
    assert_eq!(s["status"]["200"].as_u64(), Some(100), "{s}");
    assert!(s["errors"].as_object().unwrap().is_empty(), "{s}");
    let (one, _) =
        exchange("GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nsleep: 0\r\ntimes: 2\r\n\r\n");
    assert_eq!(count(&one), 3);
    assert_eq!(n(&s, "bytes_in"), 100 * one.len() as u64, "{s}");
    assert!(n(&s["latency_us"], "max") < 3 * 200_000 + 2_000_000, "{s}");
    // Three waits of 0..200 ms each: about 300 ms on average.
    let mean = s["service_us"]["mean"].as_f64().unwrap();
    assert!((150_000.0..600_000.0).contains(&mean), "{s}");
}

#[test]
fn a_ramp_follows_its_schedule() {
    let (port, _) = stall_server(Duration::from_secs(3600), Duration::ZERO);
    let url = format!("http://127.0.0.1:{port}/");
    let dir = TempDir::new("attack");
    let rows_path = dir.file("ramp.csv");
    let (code, s, err) = attack(&[
        "--url",
        &url,
        "--rate",
        "100/s..300/s",
        "--duration",
        "3s",
        "--workers",
        "2",
        "--per-request",
        rows_path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    // (100 + 300) / 2 × 3 s.
    assert_eq!(n(&s, "planned"), 600);
    assert_eq!(n(&s, "requests"), 600, "{s}");
    let text = std::fs::read_to_string(&rows_path).unwrap();
    let mut lines = text.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("seq,worker,target,intended_ns")
    );
    let intended: Vec<u64> = lines
        .map(|l| l.split(',').nth(3).unwrap().parse().unwrap())
        .collect();
    assert_eq!(intended.len(), 600);
    let start = *intended.iter().min().unwrap();
    let in_second = |k: u64| {
        intended
            .iter()
            .filter(|&&t| t - start >= k * 1_000_000_000 && t - start < (k + 1) * 1_000_000_000)
            .count()
    };
    // The rate integral: 100 + 200/3 · t²/2 events by t seconds.
    let (first, last) = (in_second(0), in_second(2));
    assert!((132..=135).contains(&first), "first second {first}");
    assert!((265..=268).contains(&last), "last second {last}");
}

#[test]
fn thresholds_set_the_exit_status() {
    let serve = serve_one(&[]);
    let url = ping_url(&serve);
    let slow = [
        "--url",
        &url,
        "-H",
        "sleep: 400",
        "--rate",
        "50/s",
        "--requests",
        "50",
        "--workers",
        "1",
    ];
    let (code, s, err) = attack(&[&slow[..], &["--max-p99", "50ms"]].concat());
    assert_eq!(code, 1, "{s} {err}");
    assert!(err.contains("--max-p99"), "{err}");
    let (code, _, err) = attack(
        &[
            &slow[..],
            &[
                "--max-p99",
                "10s",
                "--max-error-rate",
                "0",
                "--max-lag",
                "10s",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(
            "error_rate<=0 (--max-error-rate), p99<=10s (--max-p99), lag_max<=10s (--max-lag)"
        ),
        "{err}"
    );
    // No request goes on the wire at its exact intended microsecond: a
    // 1 us lag threshold is always passed, and says by how much.
    let (code, s, err) = attack(&[&slow[..], &["--max-lag", "1us"]].concat());
    assert_eq!(code, 1, "{s} {err}");
    assert!(
        err.contains("lag_max<=1us (--max-lag): lag_max was "),
        "{err}"
    );

    // Nobody listens: every request fails as refused, the run still ends on time.
    let dead = dead_url();
    let began = Instant::now();
    let (code, s, err) = attack(&[
        "--url",
        &dead,
        "--rate",
        "100/s",
        "--duration",
        "1s",
        "--max-error-rate",
        "0.5",
    ]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(s["errors"]["refused"].as_u64(), Some(100), "{s}");
    assert!(began.elapsed() < Duration::from_secs(20));
}

#[test]
fn thresholds_on_any_figure_name_every_failure() {
    let serve = serve_one(&[]);
    let url = ping_url(&serve);
    let base = ["--url", &url, "--rate", "100/s", "--requests", "100"];
    let (code, s, err) = attack(
        &[
            &base[..],
            &[
                "--threshold",
                "p99 < 10s",
                "--threshold",
                "error_rate<0.1%",
                "--threshold",
                "requests==100",
                "--threshold",
                "connect_p99<10s",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{s} {err}");
    // Two that cannot hold on loopback /ping: both named, exit 1.
    let (code, _, err) = attack(
        &[
            &base[..],
            &[
                "--threshold",
                "p50<1ns",
                "--threshold",
                "rate>=1000000/s",
                "--threshold",
                "errors==0",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("threshold failed: p50<1ns: p50 was"), "{err}");
    assert!(
        err.contains("threshold failed: rate>=1000000/s: rate was"),
        "{err}"
    );
    assert!(!err.contains("errors==0:"), "{err}");
    for (bad, says) in [
        ("p99", "has no comparison"),
        ("p42<1s", "the percentiles are"),
        ("lost==0", "not one of attack's"),
        ("error_rate<2", "at most 1"),
    ] {
        let (code, _, err) = attack(&[&base[..], &["--threshold", bad]].concat());
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn abort_on_fail_stops_a_run_that_cannot_pass() {
    // Nobody listens: the first refused request dooms errors==0, and the
    // 1% budget of a planned 6000 requests goes after 61 failures.
    let dead = dead_url();
    for threshold in ["errors==0", "error_rate<=1%"] {
        let (code, s, err) = attack(&[
            "--url",
            &dead,
            "--rate",
            "200/s",
            "--duration",
            "30s",
            "--threshold",
            threshold,
            "--abort-on-fail",
        ]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("stopped early (--abort-on-fail)"), "{err}");
        assert!(
            s["aborted"]
                .as_str()
                .is_some_and(|a| a.starts_with(threshold)),
            "{s}"
        );
        assert!(s["stopped"].as_bool().unwrap(), "{s}");
        assert!(n(&s, "requests") < 6000, "{s}");
    }
    // A threshold known only at the end: the run goes on, and says so at start.
    let (_, _, err) = attack(&[
        "--url",
        &dead,
        "--rate",
        "100/s",
        "--requests",
        "20",
        "--threshold",
        "mean<1s",
        "--abort-on-fail",
    ]);
    assert!(
        err.contains("none of them can be known to fail before the end"),
        "{err}"
    );
}

/// Stages: 0 → 200/s over 1 s (100 requests), 200/s for 1 s (200), 200 →
/// 0/s over 1 s (100); every request at its stage's intended time, the plan
/// and the progress name the stages, the result file holds what each second
/// planned.
#[test]
fn stages_follow_their_schedule() {
    let serve = serve_one(&[]);
    let url = ping_url(&serve);
    let dir = TempDir::new("attack-stages");
    let rows_file = dir.file("rows.jsonl");
    let results = dir.file("run.throng");
    let (code, s, err) = attack(&[
        "--url",
        &url,
        "--rate",
        "0/s..200/s@1s,200/s@1s,200/s..0/s@1s",
        "--per-request",
        rows_file.to_str().unwrap(),
        "--output",
        results.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(n(&s, "planned"), 400, "{s}");
    assert_eq!(n(&s, "requests"), 400, "{s}");
    assert!(
        err.contains("  stage 1/3: 0/s..200/s for 1s (from 0s to 1s): 100 requests"),
        "{err}"
    );
    assert!(
        err.contains("  stage 3/3: 200/s..0/s for 1s (from 2s to 3s): 100 requests"),
        "{err}"
    );
    let mut rows = rows(&rows_file);
    rows.sort_by_key(|r| r["seq"].as_u64());
    let at = |seq: usize| {
        rows[seq]["intended_ns"].as_u64().unwrap() - rows[0]["intended_ns"].as_u64().unwrap()
    };
    // Up ramp: 100·t² events by t; event 25 at 0.5 s. Plateau: 5 ms apart.
    let close = |got: u64, want: u64| got.abs_diff(want) <= 1_000;
    assert!(close(at(25), 500_000_000), "{}", at(25));
    assert!(close(at(100), 1_000_000_000), "{}", at(100));
    assert!(close(at(101), 1_005_000_000), "{}", at(101));
    assert!(close(at(300), 2_000_000_000), "{}", at(300));
    // Down ramp: 200·τ - 100·τ² after 2 s; event 375 at τ = 0.5.
    assert!(close(at(375), 2_500_000_000), "{}", at(375));
    assert!(at(399) < 3_000_000_000);
    let out = output_within(
        throng().args(["report", "--format", "json"]).arg(&results),
        Duration::from_secs(30),
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        r["counters"]["requests.planned"]["total"].as_u64(),
        Some(400),
        "{r}"
    );
    // A ramp through three rates without times is refused, with the fix.
    let (code, _, err) = attack(&[
        "--url",
        &url,
        "--rate",
        "100/s..1000/s..100/s",
        "--duration",
        "1s",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("give stages with their times"), "{err}");
}

/// Vegeta's JSON targets (`-format=json`): read line by line, sent in turn.
#[test]
fn json_targets_are_sent_in_turn() {
    let serve = serve_one(&[]);
    let url = ping_url(&serve);
    let dir = TempDir::new("attack-json-targets");
    let file = dir.file("targets.json");
    std::fs::write(
        &file,
        format!(
            "{{\"method\":\"GET\",\"url\":\"{url}\",\"header\":{{\"sleep\":[\"1\"]}}}}\n\n{{\"method\":\"GET\",\"url\":\"{url}?b\"}}\n"
        ),
    )
    .unwrap();
    let rows_file = dir.file("rows.jsonl");
    let (code, s, err) = attack(&[
        "--targets",
        file.to_str().unwrap(),
        "--rate",
        "100/s",
        "--requests",
        "20",
        "--per-request",
        rows_file.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["status"]["200"].as_u64(), Some(20), "{s}");
    let rows = rows(&rows_file);
    assert_eq!(rows.iter().filter(|r| r["target"] == 1).count(), 10);
    // Told it is the text format, the same file is refused by its line.
    let (code, _, err) = attack(&[
        "--targets",
        file.to_str().unwrap(),
        "--targets-format",
        "http",
        "--rate",
        "1/s",
        "--requests",
        "1",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("targets.json line 1"), "{err}");
}

/// A JSON targets file of `lines` targets, each a distinct query on `url`.
fn json_targets(dir: &TempDir, url: &str, lines: usize) -> std::path::PathBuf {
    let file = dir.file(&format!("targets-{lines}.json"));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    for i in 0..lines {
        writeln!(
            out,
            "{{\"method\":\"GET\",\"url\":\"{url}?target={i:07}\"}}"
        )
        .unwrap();
    }
    out.flush().unwrap();
    file
}

/// A plan slow to send and parse (400,000 targets from stdin, every one
/// held since `--max` cycles them) makes the worker ready after the run's start: it
/// says so (stderr, the summary, the result file), and still sends for the
/// whole duration from when it was ready, instead of silently losing that
/// time from its window (or, late by more than the duration, sending nothing
/// and exiting 0).
#[test]
fn a_worker_ready_late_says_so_and_still_sends_for_the_whole_duration() {
    let serve = serve_one(&[]);
    let url = ping_url(&serve);
    let dir = TempDir::new("attack-late-start");
    let file = json_targets(&dir, &url, 400_000);
    let out = dir.file("late.jsonl");
    // From stdin, which cannot be read twice, the targets are held (a file
    // this large would be read as the run goes, and the plan be small).
    let run = throng()
        .args(["attack", "--targets", "-", "--max", "--connections", "2"])
        .args([
            "--duration",
            "2s",
            "--workers",
            "1",
            "--format",
            "json",
            "-q",
        ])
        .args(["--output", out.to_str().unwrap()])
        .stdin(std::fs::File::open(&file).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let (code, s, err) = (
        run.status.code().unwrap_or(-1),
        serde_json::from_slice::<Value>(&run.stdout).unwrap_or(Value::Null),
        text(&run.stderr),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(n(&s, "late_workers"), 1, "{s}");
    assert!(s["late_start_s"].as_f64().unwrap() > 0.0, "{s}");
    assert!(err.contains("worker.late"), "{err}");
    // The window is the duration, counted from when the worker was ready.
    let window = s["attack_s"].as_f64().unwrap();
    assert!(window > 1.5 && window < 2.5, "{window} s: {s}");
    assert!(
        n(&s, "requests") > 0 && n(&s, "success") == n(&s, "requests"),
        "{s}"
    );
    let kinds: Vec<&str> = s["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"worker.late"), "{s}");
    let results = std::fs::read_to_string(&out).unwrap();
    assert!(
        results.contains("worker.late"),
        "result file has no worker.late event"
    );
}

/// Runs one worker over `lines` JSON targets on `url` (the file then
/// removed) with `run`; its summary, the run checked ok.
fn attack_rss(dir: &TempDir, url: &str, lines: usize, run: &[&str]) -> Value {
    let file = json_targets(dir, url, lines);
    let args = [
        &["--targets", file.to_str().unwrap(), "--workers", "1"],
        run,
    ]
    .concat();
    let (code, s, err) = attack(&args);
    assert_eq!(code, 0, "{err}");
    let _ = std::fs::remove_file(&file);
    s
}

/// The supervisor's and the worker's RSS in `big` are within `slack` of `small`'s.
fn costs_no_more(small: (u64, u64), big: (u64, u64), slack: u64) {
    assert!(
        big.0 < small.0 + slack,
        "supervisor {} B vs {} B",
        big.0,
        small.0
    );
    assert!(
        big.1 < small.1 + slack,
        "worker {} B vs {} B",
        big.1,
        small.1
    );
}

/// The peak RSS of the supervisor and of the one worker.
fn peak_rss(s: &Value) -> (u64, u64) {
    let peak = &s["peak_rss_bytes"];
    let of = |suffix: &str| {
        peak.as_object()
            .and_then(|m| m.iter().find(|(k, _)| k.ends_with(suffix)))
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or_else(|| panic!("no {suffix} in {peak}"))
    };
    (of("supervisor"), of("attack-0"))
}

/// A huge targets file costs only the targets the run uses: the memory of
/// a 50-request run over 400,000 targets is that of the same run over 100
/// (read whole, the large file's targets alone would be tens of MiB in the
/// supervisor and in every worker).
#[test]
fn a_huge_targets_file_costs_only_what_the_run_uses() {
    let serve = serve_one(&[]);
    let url = ping_url(&serve);
    let dir = TempDir::new("attack-huge-targets");
    let rss = |lines: usize| {
        let s = attack_rss(&dir, &url, lines, &["--rate", "100/s", "--requests", "250"]);
        assert_eq!(s["status"]["200"].as_u64(), Some(250), "{s}");
        peak_rss(&s)
    };
    costs_no_more(rss(100), rss(400_000), 8 << 20);
}

/// A huge targets file that the run cycles through (`--max` without
/// `--requests`) is read as the run takes its targets: the supervisor and
/// the worker cost what they cost over 100 targets, not the 200,000.
#[test]
fn a_huge_targets_file_cycled_is_read_as_the_run_goes() {
    let serve = serve_one(&[]);
    let url = ping_url(&serve);
    let dir = TempDir::new("attack-lazy-targets");
    let rss = |lines: usize| {
        // Past the supervisor's first RSS sample (once a second).
        let run = ["--max", "--connections", "4", "--duration", "2500ms"];
        let s = attack_rss(&dir, &url, lines, &run);
        assert!(
            n(&s, "success") > 0 && n(&s, "success") == n(&s, "requests"),
            "{s}"
        );
        peak_rss(&s)
    };
    // Held, the 200,000 targets were over 60 MiB in each process.
    costs_no_more(rss(100), rss(200_000), 12 << 20);
}

/// A keep-alive HTTP server answering `ok` to every request, counting the
/// requests per path.
fn counting_server() -> (u16, Arc<Mutex<std::collections::HashMap<String, u64>>>) {
    let seen = Arc::new(Mutex::new(std::collections::HashMap::new()));
    let counts = seen.clone();
    let port = ok_server(move |head| {
        let path = head.split(' ').nth(1).unwrap_or("").to_owned();
        *counts.lock().unwrap().entry(path).or_insert(0) += 1;
    });
    (port, seen)
}

/// Targets read as the run goes keep today's order exactly: request `seq`
/// takes target `seq % targets`, every worker passing over the others'
/// targets and going round the file (12,001 targets, past what is held,
/// 30,000 requests over 3 workers); and `--lazy` sends each target once.
#[test]
fn targets_read_as_the_run_goes_are_taken_in_turn() {
    let (port, seen) = counting_server();
    let dir = TempDir::new("attack-lazy-order");
    let file = dir.file("targets.json");
    let targets = 12_001u64;
    let mut out = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    for i in 0..targets {
        writeln!(
            out,
            "{{\"method\":\"GET\",\"url\":\"http://127.0.0.1:{port}/t{i}\"}}"
        )
        .unwrap();
    }
    out.flush().unwrap();
    drop(out);
    let requests = 30_000u64;
    let run = output_within(
        throng()
            .args(["attack", "--targets", file.to_str().unwrap(), "--max"])
            .args(["--connections", "6", "--workers", "3", "--format", "vegeta"])
            .args(["--requests", &requests.to_string()]),
        Duration::from_secs(120),
    );
    let err = text(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(err.contains("as the run goes"), "{err}");
    let mut seqs = Vec::new();
    for line in text(&run.stdout).lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let seq = n(&r, "seq");
        assert_eq!(
            r["url"].as_str(),
            Some(format!("http://127.0.0.1:{port}/t{}", seq % targets).as_str()),
            "{r}"
        );
        assert_eq!(n(&r, "code"), 200, "{r}");
        seqs.push(seq);
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (0..requests).collect::<Vec<_>>());
    // What the server got: each target in turn, going round.
    let counts = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(counts.len() as u64, targets);
    for i in 0..targets {
        let want = requests / targets + u64::from(i < requests % targets);
        assert_eq!(counts.get(&format!("/t{i}")), Some(&want), "/t{i}");
    }
    // --lazy: each target once, and the run ends with the last.
    let (code, s, err) = attack(&[
        "--targets",
        file.to_str().unwrap(),
        "--lazy",
        "--rate",
        "20k/s",
        "--workers",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(n(&s, "requests"), targets, "{s}");
    let counts = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(counts.len() as u64, targets);
    assert!(counts.values().all(|&c| c == 1));
    // One --url target cannot be sent "each once" lazily: said, not run.
    let url = format!("http://127.0.0.1:{port}/t0");
    let (code, _, err) = attack(&["--url", &url, "--lazy", "--rate", "1/s"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--lazy"), "{err}");
}

#[test]
fn timeouts_are_their_own_error_kind() {
    // The server holds every answer for 10 s; the timeout is 300 ms.
    let (port, _) = stall_server(Duration::ZERO, Duration::from_secs(10));
    let url = format!("http://127.0.0.1:{port}/");
    let (code, s, err) = attack(&[
        "--url",
        &url,
        "--rate",
        "20/s",
        "--requests",
        "10",
        "--timeout",
        "300ms",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["errors"]["timeout"].as_u64(), Some(10), "{s}");
    assert!(s["status"].as_object().unwrap().is_empty(), "{s}");
    // The closed pool's loops reuse one timer across requests: still exact.
    let (code, s, err) = attack(&[
        "--url",
        &url,
        "--max",
        "--connections",
        "2",
        "--requests",
        "4",
        "--timeout",
        "300ms",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["errors"]["timeout"].as_u64(), Some(4), "{s}");
}

#[test]
fn closed_pool_and_no_keepalive() {
    let (port, _) = stall_server(Duration::from_secs(3600), Duration::ZERO);
    let url = format!("http://127.0.0.1:{port}/");
    let (code, s, err) = attack(&[
        "--url",
        &url,
        "--max",
        "--connections",
        "4",
        "--duration",
        "1s",
        "--workers",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(n(&s, "requests") > 100, "{s}");
    assert_eq!(s["status"]["200"].as_u64(), Some(n(&s, "requests")), "{s}");
    assert_eq!(n(&s, "connections_opened"), 4, "{s}");

    let (code, s, err) = attack(&[
        "--url",
        &url,
        "--rate",
        "200/s",
        "--requests",
        "100",
        "--no-keepalive",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["status"]["200"].as_u64(), Some(100), "{s}");
    assert_eq!(n(&s, "connections_opened"), 100, "{s}");
}

#[test]
fn bad_targets_are_refused_with_the_line() {
    let dir = TempDir::new("attack");
    let path = dir.file("targets.txt");
    std::fs::write(
        &path,
        "GET http://127.0.0.1:9/a\nsleep: 1\n\nGET http://127.0.0.1:9/b\nthis is not a header\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let (code, _, err) = attack(&["--targets", p, "--rate", "10/s", "--duration", "1s"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 5"), "{err}");
    let _ = std::fs::remove_file(&path);

    let (code, _, err) = attack(&["--targets", p, "--rate", "10/s", "--duration", "1s"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read"), "{err}");
    let (code, _, err) = attack(&[
        "--url",
        "https://127.0.0.1:9/",
        "--tls-ca",
        "/nonexistent/ca.pem",
        "--rate",
        "10/s",
        "--duration",
        "1s",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--tls-ca /nonexistent/ca.pem"), "{err}");
    let (code, _, err) = attack(&[
        "--url",
        "http://127.0.0.1:9/",
        "--rate",
        "fast",
        "--duration",
        "1s",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("rate"), "{err}");
}

#[test]
fn targets_from_stdin_rotate() {
    let (port, first) = stall_server(Duration::from_secs(3600), Duration::ZERO);
    let targets =
        format!("GET http://127.0.0.1:{port}/a\n\nPOST http://127.0.0.1:{port}/b\nX-Test: 1\n");
    let dir = TempDir::new("attack");
    let rows_path = dir.file("rotate.jsonl");
    let mut child = throng()
        .args([
            "attack",
            "--targets",
            "-",
            "--rate",
            "100/s",
            "--requests",
            "10",
            "-q",
            "--format",
            "json",
        ])
        .args(["--per-request", rows_path.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(targets.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(first.lock().unwrap().is_some());
    let rows = rows(&rows_path);
    assert_eq!(rows.len(), 10);
    for r in &rows {
        assert_eq!(n(r, "target"), n(r, "seq") % 2);
        assert_eq!(n(r, "status"), 200);
    }
}

#[test]
fn ping_is_cut_off_at_the_request_timeout() {
    let serve = serve_one(&["--request-timeout", "300ms"]);
    let mut c = TcpStream::connect(("127.0.0.1", serve.addr.port())).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let began = Instant::now();
    // 51 waits of 0..1000 ms: far longer than 300 ms.
    c.write_all(b"GET /ping HTTP/1.1\r\nHost: t\r\nsleep: 1000\r\ntimes: 50\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    let took = began.elapsed();
    assert!(
        !got.ends_with(b"0\r\n\r\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(10),
        "{took:?}"
    );
}

/// Half the requests answered at once, half held past `--timeout`: every
/// request is in the latency (a timeout at its timeout), so the p99 is the
/// timeout's and `--max-p99` fails; the report says how many are timeouts.
#[test]
fn timed_out_requests_count_at_their_timeout() {
    // Answers for 250 ms from the first request, then holds every answer.
    let (port, _) = stall_server(Duration::from_millis(250), Duration::from_secs(30));
    let url = format!("http://127.0.0.1:{port}/");
    let dir = TempDir::new("attack-timeouts");
    let file = dir.path().join("run.jsonl");
    let (code, s, err) = attack(&[
        "--url",
        &url,
        "--rate",
        "20/s",
        "--requests",
        "10",
        "--timeout",
        "400ms",
        "--max-p99",
        "100ms",
        "--output",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "--max-p99 fails on the timeouts: {err}");
    let timeouts = s["errors"]["timeout"].as_u64().unwrap_or(0);
    assert!(timeouts >= 3, "{s}");
    assert_eq!(n(&s, "latency_timeouts"), timeouts, "{s}");
    assert_eq!(s["latency_us"]["count"].as_u64(), Some(10), "{s}");
    assert!(s["latency_us"]["p99"].as_u64().unwrap() >= 400_000, "{s}");
    assert!(
        s["answered_latency_us"]["p99"].as_u64().unwrap() < 100_000,
        "{s}"
    );
    assert!(err.contains("p99<=100ms (--max-p99): p99 was"), "{err}");

    let out = output_within(throng().arg("report").arg(&file), Duration::from_secs(30));
    let text = text(&out.stdout);
    assert!(
        text.contains(&format!("{timeouts} of 10 are timeouts")),
        "{text}"
    );
    assert!(text.contains("latency.answered"), "{text}");
    let out = output_within(
        throng().args(["report", "--format", "json"]).arg(&file),
        Duration::from_secs(30),
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert_eq!(
        r["latency_us"]["latency"]["count"].as_u64(),
        Some(10),
        "{r}"
    );
    assert_eq!(
        r["latency_us"]["latency.timeout"]["count"].as_u64(),
        Some(timeouts)
    );
}

/// A frozen server (SIGSTOP: connections accepted by the kernel, nothing
/// answered): the latencies are the timeouts, the answered figures say
/// "no answers" instead of 0 µs.
#[test]
fn a_frozen_server_shows_its_timeouts_not_zero() {
    let server = serve_one(&[]);
    let pids = server.worker_pids();
    for pid in &pids {
        throng_testkit::process::signal(*pid, "STOP");
    }
    let dir = TempDir::new("attack-frozen");
    let file = dir.path().join("run.jsonl");
    let out = output_within(
        throng()
            .args([
                "attack",
                "--url",
                &ping_url(&server),
                "--rate",
                "20/s",
                "--requests",
                "5",
                "--timeout",
                "300ms",
                "--output",
            ])
            .arg(&file),
        Duration::from_secs(30),
    );
    for pid in &pids {
        throng_testkit::process::signal(*pid, "CONT");
    }
    let stdout = text(&out.stdout);
    let latencies = stdout
        .lines()
        .find(|l| l.starts_with("Latencies"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(!latencies.contains(" 0µs"), "{stdout}");
    assert!(latencies.contains("ms"), "{stdout}");
    assert!(stdout.contains("5 of 5 timed out"), "{stdout}");
    let service = stdout.lines().find(|l| l.starts_with("Service")).unwrap();
    assert!(service.contains("no answers"), "{stdout}");
    // The report too: no 0 µs row for what nothing measured.
    let report =
        text(&output_within(throng().arg("report").arg(&file), Duration::from_secs(30)).stdout);
    let answered = report
        .lines()
        .find(|l| l.trim_start().starts_with("latency.answered "))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        answered.contains("no answers") && !answered.contains("µs"),
        "{answered}"
    );
}

/// Peaks are tracked at every change: short requests on new connections
/// rise and fall between interval ends, and still show as a peak.
#[test]
fn peaks_are_seen_between_interval_ends() {
    let server = serve_one(&[]);
    let dir = TempDir::new("attack-peaks");
    let file = dir.path().join("run.jsonl");
    let (code, s, err) = attack(&[
        "--url",
        &ping_url(&server),
        "--rate",
        "300/s",
        "--duration",
        "2s",
        "--no-keepalive",
        "--output",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(n(&s, "requests") >= 590, "{s}");
    assert!(s["peak_in_flight"].as_i64().unwrap() >= 1, "{s}");
    assert!(s["peak_connections"].as_i64().unwrap() >= 1, "{s}");
    let out = output_within(
        throng().args(["report", "--format", "json"]).arg(&file),
        Duration::from_secs(30),
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("json report");
    let g = &r["gauges"]["requests.in_flight"];
    assert!(g["peak"].as_i64().unwrap() >= 1, "{r}");
    assert!(g["peak"].as_i64() >= g["max"].as_i64(), "{r}");
}

/// Sockets in CLOSE-WAIT on local port `port` (IPv4), from /proc/net/tcp.
fn close_wait(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&local) && f[3] == "08"
        })
        .count()
}

/// A client that gives up on a sleeping `/ping` and closes frees its socket
/// at once (no CLOSE-WAIT until the sleep ends), counted in /metrics.
#[test]
fn a_sleeping_ping_is_let_go_when_its_client_closes() {
    let server = serve_one(&[]);
    let port = server.addr.port();
    let clients: Vec<TcpStream> = (0..5)
        .map(|_| {
            let mut c = TcpStream::connect(server.addr).unwrap();
            c.write_all(b"GET /ping HTTP/1.1\r\nHost: t\r\nsleep: 30000\r\n\r\n")
                .unwrap();
            c
        })
        .collect();
    // Long enough for the answers to go to sleep (on a busy machine a
    // request may still be in its task when its client closes: that one is
    // let go there, and not counted as a sleeper).
    std::thread::sleep(Duration::from_millis(1000));
    drop(clients);
    let sample = "throng_handshake_failures_total{reason=\"ping_client_closed\"}";
    let freed = server.wait_metric(sample, |v| v >= 1.0);
    let began = Instant::now();
    while close_wait(port) > 0 && began.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The symptom itself: none waits in CLOSE-WAIT for its 30 s sleep.
    assert_eq!(close_wait(port), 0, "sockets left in CLOSE-WAIT");
    // An attack that gives up at its timeout frees the server's sockets too.
    let (_, s, err) = attack(&[
        "--url",
        &ping_url(&server),
        "-H",
        "sleep: 30000",
        "--rate",
        "20/s",
        "--requests",
        "10",
        "--timeout",
        "500ms",
    ]);
    // About one run in six, one of the ten gets a 200 long before its 30 s
    // sleep, on the server as it was before the sleepers watched their
    // sockets too (seen in a CI rehearsal; not yet explained): the rest
    // time out, and what this test is about is that their sockets are freed.
    let timeouts = s["latency_timeouts"].as_u64().unwrap_or(0);
    assert!(timeouts >= 9, "{s} {err}");
    server.wait_metric(sample, |v| v > freed);
    let began = Instant::now();
    while close_wait(port) > 0 && began.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(close_wait(port), 0);
}
