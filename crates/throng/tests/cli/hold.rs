//! `throng hold` end to end: real worker processes, real sockets on
//! loopback, against independent peers (Python `websockets`, Node `ws`),
//! against `throng serve`, and against listeners that misbehave on purpose.
//! Every run is bounded (a few thousand connections, seconds) and uses free
//! ports only.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use serde_json::Value;
use throng_testkit::hold_server::HoldServer;
use throng_testkit::json::count;
use throng_testkit::{Peer, TempDir, free_port, require};

use crate::{run_json, serve};

/// Runs `throng hold --json --quiet` with `args`; returns the summary, the
/// exit code and stderr.
fn hold(args: &[&str]) -> (Value, i32, String) {
    let (code, summary, stderr) = run_json("hold", args);
    (summary, code, stderr)
}

/// The acceptance case: many source addresses, two ports, two worker
/// processes, messages published over HTTP; every subscriber gets every
/// message, once, in order; the result file holds both workers' intervals.
#[test]
fn python_peer_receives_every_message_from_spread_connections() {
    require!(Peer::PythonWebsockets);
    let mut peer = HoldServer::python(&["--ports", "2"]);
    let dir = TempDir::new("hold");
    let output = dir.file("python.jsonl");
    let (s, code, stderr) = hold(&[
        &peer.ws_url(),
        "--connections",
        "1200",
        "--rate",
        "1500/s",
        "--workers",
        "2",
        "--source-ips",
        "127.0.0.2-127.0.0.4",
        "--duration",
        "3s",
        "--publish",
        &peer.publish_url(),
        "--publish-rate",
        "4/s",
        "--message-size",
        "200",
        "--output",
        output.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "hold failed: {stderr}");
    assert_eq!(count(&s, &["opened"]), 1200, "{s:#}\n{stderr}");
    assert_eq!(s["failed"], serde_json::json!({}), "{s:#}");
    assert_eq!(count(&s, &["workers"]), 2);
    let published = count(&s, &["published"]);
    assert!(published >= 4, "published {published}: {s:#}");
    assert_eq!(count(&s, &["received"]), published * 1200, "{s:#}");
    assert_eq!(count(&s, &["lost"]), 0, "{s:#}");
    assert_eq!(count(&s, &["duplicated"]), 0);
    assert_eq!(count(&s, &["out_of_order"]), 0);
    assert_eq!(count(&s, &["delivery_us", "count"]), published * 1200);
    assert!(count(&s, &["delivery_us", "p50"]) > 0);
    assert!(count(&s, &["bytes_in"]) >= published * 1200 * 200);
    assert_eq!(count(&s, &["closed", "clean"]), 1200, "{s:#}");

    // The peer saw 400 connections from each source address, 600 on each port.
    let stats = peer.stats();
    let by_ip = stats["by_ip"].as_object().unwrap();
    assert_eq!(by_ip.len(), 3, "{stats}");
    assert!(by_ip.values().all(|v| v.as_u64() == Some(400)), "{stats}");
    let by_port = stats["by_port"].as_object().unwrap();
    assert_eq!(by_port.len(), 2, "{stats}");
    assert!(by_port.values().all(|v| v.as_u64() == Some(600)), "{stats}");

    // The result file: both workers' intervals, the supervisor's host samples,
    // and counters that add up to the summary.
    let text = std::fs::read_to_string(&output).unwrap();
    let mut sources = std::collections::BTreeSet::new();
    let mut opened = 0;
    let mut hosts = 0;
    for line in text.lines().skip(1) {
        if let throng_report::format::Record::Interval(iv) =
            throng_report::format::decode_record(line).unwrap()
        {
            opened += iv.counters.get("connect.ok").copied().unwrap_or(0);
            hosts += usize::from(iv.host.as_ref().is_some_and(|h| h.rss_bytes.len() == 3));
            sources.insert(iv.source);
        }
    }
    assert_eq!(opened, 1200);
    assert_eq!(sources.len(), 3, "{sources:?}");
    assert!(hosts > 0, "no host sample with three processes' RSS");
}

/// A server that refuses some upgrades and closes some connections: each
/// shows up under its own count.
#[test]
fn refusals_and_server_closes_are_counted_by_kind() {
    require!(Peer::NodeWs);
    let peer = HoldServer::node(&[
        "--refuse-every",
        "5",
        "--close-every",
        "7",
        "--close-code",
        "4001",
    ]);
    let (s, code, stderr) = hold(&[
        &peer.ws_url(),
        "-c",
        "700",
        "--rate",
        "2000/s",
        "-w",
        "2",
        "--duration",
        "1s",
        "--max-connect-errors",
        "140",
    ]);
    // As many failures as --max-connect-errors allows: a pass.
    assert_eq!(code, 0, "{stderr}");
    // Every 5th upgrade answered 503: 140. Of the 560 upgraded, every 7th closed with 4001: 80.
    assert_eq!(count(&s, &["failed", "bad_status"]), 140, "{s:#}");
    assert_eq!(count(&s, &["opened"]), 560, "{s:#}");
    assert_eq!(count(&s, &["closed", "server.4001"]), 80, "{s:#}");
    assert_eq!(count(&s, &["closed", "clean"]), 480, "{s:#}");
    assert!(
        stderr.contains("bad_status"),
        "the first error of a kind is shown: {stderr}"
    );
}

/// Nothing listening: every connection is refused, and the exit status
/// says so (it was 0), unless --max-connect-errors allows as many.
#[test]
fn connection_refused_is_counted_and_fails_the_run() {
    let port = free_port();
    let url = format!("ws://127.0.0.1:{port}/c");
    let args = [
        url.as_str(),
        "-c",
        "50",
        "--rate",
        "1000/s",
        "--duration",
        "0s",
    ];
    let (s, code, stderr) = hold(&args);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(count(&s, &["failed", "refused"]), 50, "{s:#}");
    assert_eq!(count(&s, &["opened"]), 0);
    assert!(
        stderr.contains(
            "throng hold: FAIL: connect_errors<=0 (--max-connect-errors): connect_errors was 50 (refused 50)"
        ),
        "{stderr}"
    );
    let (_, code, stderr) = hold(&[&args[..], &["--max-connect-errors", "50"]].concat());
    assert_eq!(code, 0, "{stderr}");
    // Bad arguments: 2.
    let (_, code, _) = hold(&[url.as_str(), "--rate", "fast"]);
    assert_eq!(code, 2);
    let (_, code, _) = hold(&[url.as_str(), "--max-lost", "-1"]);
    assert_eq!(code, 2);
}

/// `--threshold` on hold's figures, and `--abort-on-fail` ending a ramp that
/// can no longer pass (every connection is refused: the first failure
/// already breaks connect_errors==0). --max-connect-errors and --max-lost
/// are thresholds too, named by their flag.
#[test]
fn thresholds_and_abort_on_fail() {
    let port = free_port();
    let url = format!("ws://127.0.0.1:{port}/c");
    let ramp = [
        url.as_str(),
        "-c",
        "6000",
        "--rate",
        "200/s",
        "--duration",
        "0s",
    ];
    let (s, code, stderr) = hold(
        &[
            &ramp[..],
            &[
                "--max-connect-errors",
                "6000",
                "--threshold",
                "connect_errors==0",
                "--threshold",
                "lost==0",
                "--abort-on-fail",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(
            "--abort-on-fail stops the run once connect_errors<=6000, lost<=0, connect_errors==0, lost==0 can no longer pass"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "FAIL: stopped early (--abort-on-fail): connect_errors==0: connect_errors is already"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("FAIL: connect_errors==0: connect_errors was"),
        "{stderr}"
    );
    assert!(!stderr.contains("lost==0:"), "{stderr}");
    assert!(s["aborted"].is_string() && s["stopped"] == true, "{s:#}");
    assert!(count(&s, &["failed", "refused"]) < 6000, "{s:#}");
    let (_, code, stderr) = hold(&[url.as_str(), "--threshold", "error_rate<1%"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not one of hold's"), "{stderr}");
}

/// A server that accepts TCP and never answers the upgrade: handshake timeouts.
#[test]
fn silent_server_times_out_the_handshake() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
            if held.len() >= 40 {
                std::thread::sleep(Duration::from_secs(5));
                return;
            }
        }
    });
    let (s, code, stderr) = hold(&[
        &format!("ws://{addr}/c"),
        "-c",
        "40",
        "--rate",
        "1000/s",
        "--handshake-timeout",
        "300ms",
        "--duration",
        "1s",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(count(&s, &["failed", "timeout"]), 40, "{s:#}");
}

/// Stages of the connection rate: every connection opened on them, and
/// stages that end at 0/s before the last connection is due are refused.
#[test]
fn connections_open_on_stages() {
    let server = serve(&["--workers", "1"]);
    let url = format!("ws://{}/c", server.addr);
    let (s, code, stderr) = hold(&[
        &url,
        "-c",
        "60",
        "--rate",
        "0/s..100/s@1s,100/s@1s",
        "--duration",
        "0s",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(count(&s, &["opened"]), 60, "{s:#}");
    assert!(
        stderr.contains("stage 1/2: 0/s..100/s for 1s (from 0s to 1s): 50 connections"),
        "{stderr}"
    );
    let (_, code, stderr) = hold(&[
        &url,
        "-c",
        "60",
        "--rate",
        "0/s..50/s@1s,50/s..0/s@1s",
        "--duration",
        "0s",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("open only 50 of the 60 connections"),
        "{stderr}"
    );
}

/// A plan that cannot fit is refused before any socket is opened, with the fix.
#[test]
fn refuses_a_plan_that_cannot_fit() {
    let (_, code, stderr) = hold(&["ws://127.0.0.1:9/c", "-c", "100000", "--workers", "2"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--workers 6"), "{stderr}");
    let (_, code, stderr) = hold(&[
        "ws://127.0.0.1:9/c",
        "-c",
        "60000",
        "--source-ips",
        "127.0.0.2",
        "--workers",
        "4",
    ]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("fix:") && stderr.contains("--source-ips"),
        "{stderr}"
    );
    let (_, code, stderr) = hold(&["http://127.0.0.1:9/c"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("ws://"), "{stderr}");
}

/// Against `throng serve` with two workers: the same guarantees.
#[test]
fn throng_serve_delivers_every_message() {
    let server = serve(&["--workers", "2"]);
    let (s, code, stderr) = hold(&[
        &format!("ws://{}/news", server.addr),
        "-c",
        "2000",
        "--rate",
        "4000/s",
        "-w",
        "2",
        "--duration",
        "3s",
        "--publish",
        &format!("http://{}/publish/news", server.addr),
        "--publish-rate",
        "5/s",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(count(&s, &["opened"]), 2000, "{s:#}\n{stderr}");
    let published = count(&s, &["published"]);
    assert!(published >= 5, "{s:#}");
    assert_eq!(count(&s, &["received"]), published * 2000, "{s:#}");
    assert_eq!(count(&s, &["lost"]), 0, "{s:#}");
    assert_eq!(count(&s, &["delivery_us", "count"]), published * 2000);
    assert_eq!(count(&s, &["closed", "clean"]), 2000, "{s:#}");
}

/// `--publish http://HOST:PORT` without `/publish/<channel>`: the start
/// lines say where throng serve takes messages, and the first refusal names
/// the HTTP status (the summary once said only "status 2").
#[test]
fn a_publish_url_without_its_route_is_named() {
    let server = serve(&[]);
    let out = crate::throng()
        .args([
            "hold",
            &format!("ws://{}/news", server.addr),
            "-c",
            "2",
            "--duration",
            "2s",
            "--publish",
            &format!("http://{}", server.addr),
            "--publish-rate",
            "2/s",
        ])
        .output()
        .expect("run throng hold");
    // The start lines go to stdout when it is not a terminal.
    let err = String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout);
    let said = format!(
        "throng serve takes them on /publish/<channel> (--publish http://{}/publish/<channel>)",
        server.addr
    );
    assert!(err.contains(&said), "{err}");
    assert!(
        err.contains("not published: publish answered HTTP 400"),
        "{err}"
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
}

/// Messages larger than the worker's 64 KiB read buffer arrive split across
/// reads and are reassembled from the connection's remainder.
#[test]
fn large_messages_are_reassembled() {
    require!(Peer::NodeWs);
    let peer = HoldServer::node(&[]);
    let (s, code, stderr) = hold(&[
        &peer.ws_url(),
        "-c",
        "40",
        "--rate",
        "400/s",
        "--duration",
        "2s",
        "--publish",
        &peer.publish_url(),
        "--publish-rate",
        "3/s",
        "--message-size",
        "150k",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let published = count(&s, &["published"]);
    assert!(published >= 3, "{s:#}");
    assert_eq!(count(&s, &["received"]), published * 40, "{s:#}");
    assert_eq!(count(&s, &["lost"]), 0, "{s:#}");
    assert!(count(&s, &["bytes_in"]) >= published * 40 * 150 * 1024);
}

/// `throng serve` pings every connection and closes those that stay silent
/// for three intervals: held connections answer with pongs and stay open.
#[test]
fn pings_are_answered_so_the_server_keeps_connections() {
    let server = serve(&["--workers", "1", "--ping-interval", "300ms"]);
    let (s, code, stderr) = hold(&[
        &format!("ws://{}/p", server.addr),
        "-c",
        "200",
        "--rate",
        "2000/s",
        "--duration",
        "2500ms",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(count(&s, &["opened"]), 200, "{s:#}");
    // Idle timeout is 3 × 300 ms; held 2.5 s: without pongs every one would be closed with 1008.
    assert_eq!(count(&s, &["closed", "clean"]), 200, "{s:#}");
}

/// A child process killed (by its pid) and reaped when the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tests/peers/push_server.py` with `args`, once it listens: the child and its port.
fn push_server(args: &[&str]) -> (Killed, u16) {
    use std::io::BufRead as _;
    let mut child = throng_testkit::process::command("python3")
        .arg(throng_testkit::peers::dir().join("push_server.py"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start push_server.py");
    let mut line = String::new();
    let out = child.stdout.as_mut().expect("piped stdout");
    std::io::BufReader::new(out)
        .read_line(&mut line)
        .expect("read");
    let port = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("push_server.py: {line}"));
    (Killed(child), port)
}

/// A server that pushes on its root path and wants a token header and a
/// subprotocol: hold takes `/`, `-H` and `--subprotocol`; without the
/// header the upgrade is refused.
#[test]
fn the_root_path_headers_and_a_subprotocol() {
    require!(Peer::PythonWebsockets);
    let (_server, port) = push_server(&[
        "--need-header",
        "X-Token: abc",
        "--subprotocol",
        "chat",
        "--timeout",
        "30",
    ]);
    let url = format!("ws://127.0.0.1:{port}/");
    let (s, code, err) = hold(&[
        &url,
        "-c",
        "3",
        "--rate",
        "100/s",
        "--duration",
        "1s",
        "-H",
        "X-Token: abc",
        "--subprotocol",
        "chat",
    ]);
    assert_eq!(code, 0, "{s} {err}");
    assert_eq!(count(&s, &["opened"]), 3, "{s}");
    assert!(count(&s, &["foreign"]) > 0, "the pushes arrive: {s}");
    let (s, code, _) = hold(&[&url, "-c", "2", "--rate", "100/s", "--duration", "1s"]);
    assert_eq!(code, 1, "{s}");
    assert_eq!(count(&s, &["opened"]), 0, "{s}");
    // A header with a line break would end the request early: refused.
    let (_, code, err) = hold(&[&url, "-c", "1", "-H", "X-Bad: a\r\nX-More: b"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid header"), "{err}");
}

/// A server that pushes its own messages, stamped in µs in a JSON field:
/// `--stamp json:t` times them; without it they are only counted.
#[test]
fn server_pushes_are_timed_by_their_own_stamp() {
    require!(Peer::PythonWebsockets);
    let (_server, port) = push_server(&["--every", "0.1", "--timeout", "30"]);
    let url = format!("ws://127.0.0.1:{port}/");
    let (s, code, err) = hold(&[
        &url,
        "-c",
        "4",
        "--rate",
        "100/s",
        "--duration",
        "1500ms",
        "--stamp",
        "json:t",
    ]);
    assert_eq!(code, 0, "{s} {err}");
    let pushed = count(&s, &["pushed"]);
    assert!(pushed >= 20, "{s}");
    assert_eq!(count(&s, &["foreign"]), 0, "{s}");
    assert_eq!(count(&s, &["pushed_delivery_us", "count"]), pushed, "{s}");
    // On loopback a push arrives within a second of its stamp.
    assert!(count(&s, &["pushed_delivery_us", "max"]) < 1_000_000, "{s}");
    // The server's own `seq` field: every push, in order, none lost.
    assert_eq!(count(&s, &["lost"]), 0, "{s}");
    assert_eq!(count(&s, &["out_of_order"]), 0, "{s}");
    let (_, code, err) = hold(&[&url, "-c", "1", "--stamp", "xml:t"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--stamp"), "{err}");
}

/// A server that sends each message to every client in turn, 100 ms
/// apart: hold tells its messages apart by the server's `seq` (or, without
/// one, by the stamp) and measures each one's fan-out spread from the
/// first subscriber to the last, across two worker processes: four
/// deliveries per message and at least 300 ms, where either worker alone
/// saw two. `throng report` of the result file says the same.
#[test]
fn the_fan_out_spread_of_server_messages_spans_every_worker() {
    require!(Peer::PythonWebsockets);
    let dir = TempDir::new("spread");
    for (extra, tag) in [(&[][..], "s"), (&["--no-seq"][..], "t")] {
        let mut args = vec!["--broadcast", "4", "--gap", "0.1", "--every", "0.2"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--timeout", "30"]);
        let (_server, port) = push_server(&args);
        let url = format!("ws://127.0.0.1:{port}/");
        let output = dir.file(&format!("spread-{tag}.jsonl"));
        let (s, code, err) = hold(&[
            &url,
            "-c",
            "4",
            "-w",
            "2",
            "--rate",
            "100/s",
            "--duration",
            "2500ms",
            "--stamp",
            "json:t",
            "--output",
            output.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{s} {err}");
        let spread = &s["server_spread"];
        let messages = count(spread, &["messages"]);
        assert!(messages >= 2, "{s:#}");
        assert_eq!(
            count(spread, &["deliveries"]),
            count(&s, &["pushed"]),
            "{s:#}"
        );
        assert_eq!(count(spread, &["widest_deliveries"]), 4, "{s:#}");
        assert!(spread["widest"].as_str().unwrap().starts_with(tag), "{s:#}");
        // Three gaps of 100 ms between the first subscriber and the last.
        assert!(count(spread, &["spread_us", "p50"]) >= 300_000, "{s:#}");

        let out = throng_testkit::process::output_within(
            crate::throng()
                .args(["report", "--format", "json"])
                .arg(&output),
            Duration::from_secs(30),
        );
        let r: Value = serde_json::from_slice(&out.stdout).expect("report json");
        assert_eq!(&r["server_spread"], spread, "{r:#}");
        let out = throng_testkit::process::output_within(
            crate::throng().arg("report").arg(&output),
            Duration::from_secs(30),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("fan-out spread (first to last subscriber)"),
            "{text}"
        );
    }
}

/// A server frozen for the whole run (SIGSTOP after the connections are
/// up) sends nothing, not even a ping: `--read-timeout` fails every held
/// connection as `read_timeout` and the run exits 1, instead of all "held".
#[test]
fn a_frozen_server_fails_the_read_timeout() {
    let server = serve(&["--workers", "1"]);
    let url = format!("ws://{}/frozen", server.addr);
    let pids = server.worker_pids();
    let run = std::thread::spawn(move || {
        hold(&[
            &url,
            "-c",
            "3",
            "--rate",
            "100/s",
            "--duration",
            "3s",
            "--read-timeout",
            "1s",
            "--close-timeout",
            "500ms",
        ])
    });
    std::thread::sleep(Duration::from_millis(600));
    for pid in &pids {
        throng_testkit::process::signal(*pid, "STOP");
    }
    let (s, code, err) = run.join().expect("hold thread");
    for pid in &pids {
        throng_testkit::process::signal(*pid, "CONT");
    }
    assert_eq!(count(&s, &["opened"]), 3, "{s} {err}");
    assert_eq!(count(&s, &["closed", "read_timeout"]), 3, "{s}");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--read-timeout"), "{err}");
}

/// hold's start lines say what `throng doctor` says of the same plan: as
/// many limits checked, and every one not OK, the same words.
#[test]
fn the_start_lines_say_what_doctor_says_of_the_plan() {
    let sources = "127.0.0.2-127.0.0.21";
    for connections in ["1000", "200000"] {
        let out = crate::throng()
            .args([
                "hold",
                "ws://127.0.0.1:9/c",
                "-c",
                connections,
                "--source-ips",
                sources,
            ])
            .arg("--dry-run")
            .output()
            .expect("run throng");
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        let out = crate::throng()
            .args([
                "doctor",
                "-c",
                connections,
                "--role",
                "client",
                "--source-ips",
                sources,
            ])
            .args(["--ports", "9", "--format", "json"])
            .output()
            .expect("run doctor");
        let doctor: Value = serde_json::from_slice(&out.stdout).expect("doctor json");
        let findings = doctor["findings"].as_array().expect("findings");
        let stops = findings.iter().filter(|f| f["status"] == "stop").count();
        if stops > 0 {
            // Refused, naming the limit.
            assert!(err.contains("will stop"), "{err}");
            continue;
        }
        let head = format!("{} checked", findings.len());
        let line = text
            .lines()
            .find(|l| l.contains("limits (the checks of 'throng doctor"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains(&head), "{line} vs {doctor:#}");
        for f in findings.iter().filter(|f| f["status"] != "ok") {
            let message = f["message"].as_str().unwrap();
            assert!(text.contains(message), "{message} in {text}");
        }
    }
}

/// A dry run tells the truth: a source address not on this host is refused
/// by binding it (hold and attack, exit 2), and `--workers` is capped by
/// the connections instead of starting processes with nothing to do.
#[test]
fn dry_runs_bind_their_sources_and_cap_their_workers() {
    let out = crate::throng()
        .args([
            "hold",
            "ws://127.0.0.1:9/c",
            "-c",
            "10",
            "--source-ips",
            "192.0.2.1",
            "--dry-run",
        ])
        .output()
        .expect("run throng");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("192.0.2.1 cannot be used here"), "{err}");
    assert_eq!(
        err.matches("cannot be used here").count(),
        1,
        "said once: {err}"
    );
    let out = crate::throng()
        .args([
            "attack",
            "--url",
            "http://127.0.0.1:9/",
            "--rate",
            "10/s",
            "--requests",
            "1",
            "--source-ips",
            "192.0.2.1",
            "-q",
        ])
        .output()
        .expect("run throng");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("192.0.2.1 cannot be used here"), "{err}");
    let out = crate::throng()
        .args([
            "hold",
            "ws://127.0.0.1:9/c",
            "-c",
            "1",
            "-w",
            "100000",
            "--dry-run",
        ])
        .output()
        .expect("run throng");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("capped at one per connection"), "{text}");
    // What doctor calls STOP, the dry run does not call fitting.
    let out = crate::throng()
        .args([
            "hold",
            "ws://127.0.0.1:9/c",
            "-c",
            "1000000000",
            "--dry-run",
        ])
        .output()
        .expect("run throng");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("will stop the run"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("fits this machine"));
}

/// A server whose own sequence skips numbers: hold counts the gaps as
/// losses on each connection, and the run fails --max-lost.
#[test]
fn gaps_in_a_servers_own_sequence_are_losses() {
    require!(Peer::PythonWebsockets);
    let (_server, port) = push_server(&["--every", "0.05", "--skip-every", "3", "--timeout", "30"]);
    let url = format!("ws://127.0.0.1:{port}/");
    let (s, code, err) = hold(&[
        &url,
        "-c",
        "2",
        "--rate",
        "100/s",
        "--duration",
        "1500ms",
        "--stamp",
        "json:t",
    ]);
    assert_eq!(code, 1, "{s} {err}");
    assert!(count(&s, &["lost"]) >= 4, "{s}");
    assert!(err.contains("lost"), "{err}");
}
