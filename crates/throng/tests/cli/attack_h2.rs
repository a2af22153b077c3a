//! `throng attack --http2` against a real HTTP/2 front end: HAProxy
//! (Debian's) with `proto h2` on a plain bind (h2c, prior knowledge) and
//! `alpn h2` on a TLS bind, in front of `throng serve`'s /ping; and
//! python-hyper's `h2` (`tests/peers/h2_server.py`) for what HAProxy does
//! only now and then: RST_STREAM, REFUSED_STREAM, a GOAWAY above which
//! streams were not processed, a large response body. Every run is
//! bounded (seconds, hundreds of requests) on free loopback ports.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;
use throng_testkit::certs::Certs;
use throng_testkit::haproxy::Haproxy;

use throng_testkit::peers;
use throng_testkit::process::{command, output_within, text};
use throng_testkit::{Peer, TempDir, require};

use crate::{run_json, serve, throng};

/// Runs `throng ARGS`: exit code and stderr.
fn refused(args: &[&str]) -> (i32, String) {
    let out = output_within(throng().args(args), Duration::from_secs(30));
    (out.status.code().unwrap_or(-1), text(&out.stderr))
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn attack(args: &[&str]) -> (i32, Value, String) {
    run_json("attack", args)
}

/// Streams share connections; at the connection cap with every stream busy
/// a due request waits for one, and that wait is in its latency (it counts
/// as late), not hidden; every request is answered and written as a row.
#[test]
fn h2c_streams_share_connections_and_a_request_waits_for_a_free_one() {
    require!(Peer::Haproxy);
    let server = serve(&["--workers", "1"]);
    let proxy = Haproxy::h2(server.addr, None, None);
    let dir = TempDir::new("attack-h2");
    let rows = dir.file("rows.jsonl");
    // 2 connections x 5 streams, each request up to 500 ms (250 ms on
    // average: /ping's sleep is a longest wait): about 40/s, and 100/s are
    // asked for, so a queue forms.
    let (code, s, err) = attack(&[
        "--url",
        &format!("http://{}/ping", proxy.addr),
        "-H",
        "sleep: 500",
        "--http2",
        "--max-streams",
        "5",
        "--max-connections",
        "2",
        "--rate",
        "100/s",
        "--duration",
        "2s",
        "--workers",
        "1",
        "--per-request",
        rows.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["status"]["200"].as_u64(), Some(200), "{s}\n{err}");
    assert!(s["errors"].as_object().unwrap().is_empty(), "{s}");
    assert_eq!(n(&s, "connections_opened"), 2, "{s}");
    assert!(s["peak_in_flight"].as_i64().unwrap() > 10, "{s}");
    assert!(n(&s, "late") > 0, "queued requests start late: {s}");
    // Latency counts from the intended time, so the wait for a stream is in it.
    assert!(
        n(&s["latency_us"], "max") > n(&s["service_us"], "max"),
        "{s}"
    );
    let rows = std::fs::read_to_string(&rows).unwrap();
    let rows: Vec<Value> = rows
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 200);
    assert!(rows.iter().all(|r| r["status"] == 200), "{rows:?}");
    assert!(
        rows.iter().all(|r| r["bytes_in"].as_u64() > Some(0)),
        "{rows:?}"
    );
    assert!(err.contains("protocol HTTP/2"), "{err}");
}

/// Over TLS the front end is asked for h2 in ALPN; one that only speaks
/// HTTP/1.1 there fails every connection with words that say so.
#[test]
fn alpn_h2_over_tls_and_a_front_end_without_it() {
    require!(Peer::Haproxy, Peer::Openssl);
    let certs = Certs::generate("attack-h2");
    let server = serve(&["--workers", "1"]);
    for (alpn, ok) in [("h2", true), ("http/1.1", false)] {
        let proxy = Haproxy::h2(server.addr, Some((certs.cert_and_key(), alpn)), None);
        let (code, s, err) = attack(&[
            "--url",
            &format!("https://localhost:{}/ping", proxy.port()),
            "--tls-ca",
            certs.ca(),
            "--http2",
            "--rate",
            "200/s",
            "--requests",
            "100",
            "--workers",
            "1",
            "--max-error-rate",
            "0",
        ]);
        if ok {
            assert_eq!(code, 0, "{err}");
            assert_eq!(s["status"]["200"].as_u64(), Some(100), "{s}");
            assert!(err.contains("ALPN h2"), "{err}");
        } else {
            assert_eq!(code, 1, "{err}");
            assert_eq!(s["errors"]["bad_response"].as_u64(), Some(100), "{s}");
            assert!(err.contains("did not choose h2 in ALPN"), "{err}");
        }
    }
}

/// Request bodies far larger than HAProxy's windows (64 KiB at the start)
/// go through: the client waits for WINDOW_UPDATEs on the stream and the
/// connection.
#[test]
fn large_bodies_pass_the_flow_control() {
    require!(Peer::Haproxy);
    let server = serve(&["--workers", "1", "--max-message", "1MiB"]);
    let proxy = Haproxy::h2(server.addr, None, None);
    let dir = TempDir::new("attack-h2");
    let body = dir.file("body.bin");
    std::fs::write(&body, vec![b'x'; 300_000]).unwrap();
    let (code, s, err) = attack(&[
        "--url",
        &format!("http://{}/ping", proxy.addr),
        "--body-file",
        body.to_str().unwrap(),
        "--http2",
        "--rate",
        "50/s",
        "--requests",
        "20",
        "--workers",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["status"]["200"].as_u64(), Some(20), "{s}");
    assert!(n(&s, "bytes_out") >= 20 * 300_000, "{s}");
}

/// HAProxy sends GOAWAY on a connection idle past `timeout client` and
/// closes it; the next requests go on new connections, none is lost.
#[test]
fn goaway_on_idle_connections_moves_requests_to_new_ones() {
    require!(Peer::Haproxy);
    let server = serve(&["--workers", "1"]);
    let timeouts = "timeout client 100ms\n  timeout http-keep-alive 100ms\n  timeout server 60s";
    let proxy = Haproxy::h2(server.addr, None, Some(timeouts));
    let (code, s, err) = attack(&[
        "--url",
        &format!("http://{}/ping", proxy.addr),
        "--http2",
        "--rate",
        "2/s",
        "--requests",
        "4",
        "--workers",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["status"]["200"].as_u64(), Some(4), "{s}\n{err}");
    assert!(n(&s, "connections_opened") >= 2, "{s}");
    assert!(err.contains("GOAWAY"), "{err}");
}

/// `--max`: each connection keeps `--max-streams` requests in flight.
#[test]
fn a_closed_pool_keeps_its_streams_busy() {
    require!(Peer::Haproxy);
    let server = serve(&["--workers", "1"]);
    let proxy = Haproxy::h2(server.addr, None, None);
    let (code, s, err) = attack(&[
        "--url",
        &format!("http://{}/ping", proxy.addr),
        "--http2",
        "--max",
        "--connections",
        "2",
        "--max-streams",
        "8",
        "--requests",
        "1000",
        "--workers",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["status"]["200"].as_u64(), Some(1000), "{s}");
    assert_eq!(n(&s, "connections_opened"), 2, "{s}");
    let peak = s["peak_in_flight"].as_i64().unwrap();
    assert!((2..=16).contains(&peak), "{s}");
}

#[test]
fn http2_flags_that_do_not_go_together_are_refused() {
    let (code, err) = refused(&[
        "attack",
        "--url",
        "http://127.0.0.1:9/",
        "--http2",
        "--no-keepalive",
        "--rate",
        "1/s",
        "-n",
        "1",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--no-keepalive does not go with --http2"),
        "{err}"
    );
    let (code, err) = refused(&[
        "attack",
        "--url",
        "http://127.0.0.1:9/",
        "--max-streams",
        "10",
        "--rate",
        "1/s",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--http2"), "{err}");
}

/// `knee attack --http2`: every level runs over HTTP/2 (HAProxy's `proto
/// h2` bind speaks nothing else, so a level that passes went through it).
#[test]
fn knee_attack_searches_over_http2() {
    require!(Peer::Haproxy);
    let server = serve(&["--workers", "1"]);
    let proxy = Haproxy::h2(server.addr, None, None);
    let dir = TempDir::new("knee-h2");
    let url = format!("http://{}/ping", proxy.addr);
    let s = crate::knee::knee(
        &dir,
        &[
            &["attack", "--url", &url, "--http2", "--max-streams", "20"][..],
            &["--from", "100/s", "--to", "200/s", "--step-duration", "1s"],
            &["--slo-p99", "1s"],
            &crate::knee::QUICK,
        ]
        .concat(),
    );
    assert_eq!(s.code, 1, "{}\n{}", s.stdout, s.stderr);
    assert_eq!(s.knee["outcome"]["kind"], "no_knee", "{}", s.stdout);
    let runs = s.knee["runs"].as_array().cloned().unwrap_or_default();
    assert!(!runs.is_empty(), "{}", s.stdout);
    assert!(runs.iter().all(|r| r["verdict"] == "pass"), "{}", s.stdout);
}

/// h2c to a server that speaks only HTTP/1.1 (`throng serve` itself): every
/// request fails, and the first failure says why.
#[test]
fn h2c_to_an_http1_server_says_it_does_not_speak_h2c() {
    let server = serve(&["--workers", "1"]);
    let (code, s, err) = attack(&[
        "--url",
        &format!("http://{}/ping", server.addr),
        "--http2",
        "--rate",
        "100/s",
        "--requests",
        "20",
        "--workers",
        "1",
        "--max-error-rate",
        "0",
    ]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(s["errors"]["bad_response"].as_u64(), Some(20), "{s}");
    assert!(
        err.contains("does not speak HTTP/2 with prior knowledge"),
        "{err}"
    );
}

/// `tests/peers/h2_server.py`, killed on drop.
struct H2Peer {
    child: Child,
    port: u16,
}

impl H2Peer {
    fn start() -> Self {
        let mut child = command("python3")
            .arg(peers::dir().join("h2_server.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start h2_server.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("its READY line");
        let port = line
            .strip_prefix("READY ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("h2_server.py said {line:?}"));
        Self { child, port }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for H2Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs 3 requests due at once (so on one connection) at `url`.
fn three(url: &str) -> (i32, Value, String) {
    attack(&[
        "--url",
        url,
        "--http2",
        "--rate",
        "1000/s",
        "--requests",
        "3",
        "--workers",
        "1",
    ])
}

/// Against python-hyper's h2: RST_STREAM counts as `stream_reset` (its code
/// logged); a refused stream goes once more, on another connection when
/// there is one, then counts as `stream_reset`;
/// streams above a GOAWAY's last stream go again on a new connection and
/// are answered there; a 1 MiB response passes the receive windows.
#[test]
fn resets_refusals_goaway_and_large_responses_from_python_h2() {
    require!(Peer::PythonH2);
    let peer = H2Peer::start();

    let (code, s, err) = three(&peer.url("/reset"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["errors"]["stream_reset"].as_u64(), Some(3), "{s}");
    assert!(err.contains("RST_STREAM, error code 2"), "{err}");

    let (code, s, err) = three(&peer.url("/refuse"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["errors"]["stream_reset"].as_u64(), Some(3), "{s}");
    assert_eq!(n(&s, "retried"), 3, "{s}");

    // Refused by one connection, a request goes on another: answered there.
    let (code, s, err) = three(&peer.url("/refuse-one-conn"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["status"]["200"].as_u64(), Some(3), "{s}\n{err}");
    // Those sent before the second connection opened were refused and sent
    // again; a later one may go on the second connection at once.
    assert!((1..=3).contains(&n(&s, "retried")), "{s}");
    assert_eq!(n(&s, "connections_opened"), 2, "{s}");

    let (code, s, err) = three(&peer.url("/goaway3"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["status"]["200"].as_u64(), Some(3), "{s}\n{err}");
    assert_eq!(n(&s, "retried"), 2, "{s}");
    assert_eq!(n(&s, "connections_opened"), 2, "{s}");

    let (code, s, err) = three(&peer.url("/big"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(s["status"]["200"].as_u64(), Some(3), "{s}");
    assert!(n(&s, "bytes_in") >= 3 << 20, "{s}");
}

/// `--http2` on agents: each agent's workers speak h2c to HAProxy's
/// `proto h2` bind (which answers nothing else), and the merged run adds up.
#[test]
fn an_http2_attack_on_agents_adds_up() {
    let _one = crate::agents::one_at_a_time();
    require!(Peer::RedisServer, Peer::RedisCli, Peer::Haproxy);
    let t = crate::agents::two_agents();
    let proxy = Haproxy::h2(t.server.addr, None, None);
    let url = format!("http://{}/ping", proxy.addr);
    let s = crate::agents_json::attack_on_agents(&t, &url, &["--http2"]);
    assert_eq!(n(&s, "requests"), 200, "{s:#}");
    assert_eq!(s["status"]["200"].as_u64(), Some(200), "{s:#}");
    let agents = s["agents"].as_array().unwrap_or_else(|| panic!("{s:#}"));
    assert_eq!(agents.len(), 2, "{s:#}");
    for a in agents {
        assert!(a["requests"].as_u64().unwrap_or(0) > 0, "{a}");
        assert_eq!(a["errors"], 0, "{a}");
    }
}
