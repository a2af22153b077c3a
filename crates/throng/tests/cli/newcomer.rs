//! What a newcomer trips on (issue 19), each pinned by the command that
//! showed it: errors said once and in the user's terms, start-up output that
//! is either for people or for scripts, `--help` examples that paste whole.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Output, Stdio};
use std::time::Duration;

use throng_report::format::{Event, Header, Writer};
use throng_report::interval::{Interval, new_histogram};
use throng_testkit::process::{output_within, text};
use throng_testkit::{Peer, TempDir, peers, require};

use crate::{serve, throng};

/// Runs `throng <args>` to its end.
fn cli(args: &[&str]) -> Output {
    throng()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run throng")
}

/// `throng report missing.jsonl` said "No such file or directory (os error
/// 2)" twice: the error carried its cause in the message and as a source.
#[test]
fn a_missing_result_file_is_one_clear_line() {
    let out = cli(&["report", "no-such-run.jsonl"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    assert_eq!(err.matches("no-such-run.jsonl").count(), 1, "{err}");
    assert!(err.contains("cannot read no-such-run.jsonl"), "{err}");
}

/// `throng attack` alone said `--url`, `--rate` and `--duration` were all
/// required, though `--targets`, `--max` and `--requests` do as well.
#[test]
fn attack_without_arguments_says_what_it_needs_in_the_users_terms() {
    let out = cli(&["attack"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for alternative in [
        "--url",
        "--targets",
        "--rate",
        "--max",
        "--duration",
        "--requests",
    ] {
        assert!(err.contains(alternative), "no {alternative} in: {err}");
    }
    assert!(
        !err.contains("required arguments were not provided"),
        "{err}"
    );
    assert!(err.contains("for example: throng attack --url"), "{err}");

    // Only what is missing is named: a target and a rate, but no length.
    let out = cli(&["attack", "--url", "http://127.0.0.1:1/", "--rate", "10/s"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("how long: --duration"), "{err}");
    assert!(
        !err.contains("what to request") && !err.contains("how hard"),
        "{err}"
    );
}

/// `throng serve` printed its readable settings and also a raw JSON line
/// of internals (`"bench_floor":false`, `{"nanos":0,"secs":10}`).
#[test]
fn serve_prints_settings_for_people_or_json_for_scripts_not_both() {
    let out = cli(&["serve", "--listen", "127.0.0.1:0", "--dry-run"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "", "JSON without --json");
    assert!(stderr.contains("effective settings"), "{stderr}");
    assert!(stderr.contains("ping-interval    30s"), "{stderr}");

    let out = cli(&["serve", "--listen", "127.0.0.1:0", "--json", "--dry-run"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr, "", "readable settings with --json");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let start: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let config = &start["config"];
    assert_eq!(config["ping_interval"], "30s", "{config}");
    assert_eq!(config["idle_timeout"], "1m30s", "{config}");
    assert_eq!(config["request_timeout"], "1h", "{config}");
    assert!(
        !stdout.contains("nanos") && !stdout.contains("bench_floor"),
        "{stdout}"
    );
}

/// The answer to `POST /publish` (and to a refused one) ends its line, so
/// `curl` leaves the prompt on a line of its own.
#[test]
fn publish_answers_end_with_a_newline() {
    let server = serve(&[]);
    let body = |request: &str| {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let (_, body) = answer.split_once("\r\n\r\n").expect("a whole answer");
        body.to_owned()
    };
    let ok = body(
        "POST /publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert!(
        ok.starts_with("{\"channel\":\"news\",\"counted\":\"at relay, before delivery\",\"id\":")
            && ok.ends_with(",\"subscribers\":0}\n"),
        "{ok:?}"
    );
    let refused = body("GET /publish/news HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(refused.ends_with('\n') && refused.len() > 1, "{refused:?}");
}

/// The examples section of `throng <sub> --help` on a terminal `columns` wide.
fn examples(sub: &str, columns: u32) -> Vec<String> {
    let out = throng()
        .args([sub, "--help"])
        .env("COLUMNS", columns.to_string())
        .output()
        .unwrap();
    assert!(out.status.success());
    BufReader::new(out.stdout.as_slice())
        .lines()
        .map_while(Result::ok)
        .skip_while(|l| l != "Examples:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

/// `hold --help` wrapped its examples in the middle of a command at 80
/// columns, so a pasted one ran half a command. Every example of every
/// subcommand fits 80 columns as written (clap leaves it alone), and a
/// command that goes on is continued with a trailing backslash.
#[test]
fn every_help_example_pastes_whole_at_80_columns() {
    for sub in ["serve", "hold", "attack", "report", "bench", "doctor"] {
        let wide = examples(sub, 1000);
        assert!(!wide.is_empty(), "throng {sub} --help has no examples");
        assert_eq!(
            examples(sub, 80),
            wide,
            "throng {sub} --help rewraps its examples at 80 columns"
        );
        let mut continued = false;
        for line in &wide {
            assert!(line.chars().count() <= 80, "{sub}: {line}");
            let starts = line.starts_with("  throng ")
                || (line.starts_with("  ") && line.contains("| throng "))
                || line.starts_with("  sudo throng ");
            assert!(
                starts != continued,
                "{sub}: a line that {} a command: {line:?}",
                if continued {
                    "should continue"
                } else {
                    "should start"
                }
            );
            continued = line.ends_with(" \\");
        }
        assert!(!continued, "{sub}: the last example ends with a backslash");
    }
}

/// A real bench (small), its result file's `"bench"` record, and the page
/// it wrote as a browser builds it: the headline box comes before the
/// first plot and holds the record's figures.
#[test]
fn a_bench_page_leads_with_the_bench_figures_in_a_browser() {
    require!(Peer::Chromium);
    let dir = TempDir::new("newcomer-bench-page");
    let out = output_within(
        throng().args([
            "bench",
            "--connections",
            "300",
            "--messages",
            "3",
            "--out-dir",
            dir.path().to_str().unwrap(),
            "--format",
            "json",
            "--quiet",
        ]),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = r["result_file"].as_str().unwrap();
    let html = r["html_report"].as_str().unwrap();
    let last = std::fs::read_to_string(results).unwrap();
    let record: serde_json::Value = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    assert_eq!(
        record["type"], "bench",
        "the result file ends with its summary"
    );
    assert_eq!(record["connections"]["held"], r["held"]);
    assert_eq!(record["verdict"], "PASS", "the record carries the verdict");
    assert_eq!(record["verdict"], r["verdict"]);

    let dom = output_within(
        peers::headless_chromium(&dir.file("profile"))
            .arg("--dump-dom")
            .arg(format!("file://{html}")),
        Duration::from_secs(120),
    );
    assert!(dom.status.success(), "{}", text(&dom.stderr));
    let dom = text(&dom.stdout);
    let figure = |name: &str| -> String {
        let at = dom
            .find(&format!("data-figure=\"{name}\">"))
            .unwrap_or_else(|| panic!("no {name} in the page"));
        let rest = &dom[at..];
        let start = rest.find('>').unwrap() + 1;
        rest[start..start + rest[start..].find('<').unwrap()].to_owned()
    };
    assert_eq!(figure("held"), record["connections"]["held"].to_string());
    assert_eq!(
        figure("failed"),
        record["connections"]["failed"].to_string()
    );
    assert_eq!(figure("lost"), record["messages"]["lost"].to_string());
    assert_eq!(figure("verdict"), "PASS");
    let kernel = record["memory"]["kernel_bytes"].as_f64().unwrap();
    assert_eq!(figure("memory-kernel"), throng_report::text::bytes(kernel));
    assert_eq!(
        figure("cpu-server"),
        format!("{:.2} s", record["cpu"]["server_s"].as_f64().unwrap())
    );
    for m in record["messages"]["each"].as_array().unwrap() {
        let row = format!("<tr><td>{}</td><td>{}</td>", m["seq"], m["delivered"]);
        assert!(dom.contains(&row), "no row {row} in the delivery table");
    }
    let headline = dom.find("id=\"bench-summary\"").unwrap();
    let first_plot = dom.find("<svg").unwrap();
    assert!(headline < first_plot, "the plots come before the headline");
    assert!(dom.contains("<title>throng bench: 300 connections"));

    // The text report leads with the same figures, and no line of it is a
    // record's raw JSON.
    let report = cli(&["report", results]);
    let t = text(&report.stdout);
    assert!(report.status.success(), "{}", text(&report.stderr));
    assert!(t.contains("bench: 300 connections"), "{t}");
    assert!(t.contains("verdict      PASS"), "{t}");
    assert!(t.contains(&format!("{} held of 300", r["held"])), "{t}");
    assert!(!t.contains("{\""), "raw JSON in:\n{t}");
}

/// `throng report --every 1s` of that kind of run printed a table 544
/// columns wide and raw 4 KB event lines; "per second" said over what
/// only by implication.
#[test]
fn the_text_report_fits_a_terminal_and_says_what_a_rate_is_over() {
    let dir = TempDir::new("newcomer-text-report");
    let file = dir.file("run.jsonl");
    let mut w = Writer::create(&file, &Header::new(vec![], serde_json::json!({}))).unwrap();
    let base = 1_795_320_000u64;
    for s in 0..10u64 {
        let mut h = new_histogram();
        h.record(1_000 + s).unwrap();
        let names = [
            "connect",
            "connect.lag",
            "connect.service",
            "connect.tcp",
            "connect.upgrade",
            "delivery",
            "publish",
            "publish.lag",
        ];
        w.write_interval(&Interval {
            start_ns: (base + s) * 1_000_000_000,
            length_ns: 1_000_000_000,
            source: "box1/hold-0".into(),
            counters: BTreeMap::from([
                (
                    "messages.received".to_owned(),
                    if s % 2 == 1 { 20_000 } else { 0 },
                ),
                ("connect.ok".to_owned(), 100),
                ("bytes.in".to_owned(), 1 << 20),
            ]),
            gauges: BTreeMap::from([("connections.open".to_owned(), 100 * s as i64)]),
            peaks: BTreeMap::new(),
            histograms: names.iter().map(|n| ((*n).to_owned(), h.clone())).collect(),
            host: None,
        })
        .unwrap();
    }
    w.write_event(&Event {
        at_ns: (base + 9) * 1_000_000_000,
        source: "box1/bench".into(),
        kind: "bench.summary".into(),
        text: format!("{{\"hold\":\"{}\"}}", "x".repeat(4000)),
    })
    .unwrap();
    drop(w);
    let out = cli(&["report", "--every", "1s", file.to_str().unwrap()]);
    let t = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for line in t.lines().filter(|l| !l.contains(file.to_str().unwrap())) {
        assert!(
            line.chars().count() <= 120,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    assert!(t.contains("bench.summary: {\"hold\":\"xxx"), "{t}");
    assert!(!t.contains(&"x".repeat(200)), "the event's whole text");
    // The mean over the run, and the busiest interval beside it.
    assert!(t.contains("mean/s") && t.contains("busiest/s"), "{t}");
    assert!(t.contains("over the run's 10.0 s"), "{t}");
    let row = t
        .lines()
        .find(|l| l.trim_start().starts_with("messages.received"))
        .unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..], ["100.0k", "10.0k", "20.0k"], "{row}");
    // What connect.lag and friends measure, said once.
    for name in ["connect.lag:", "connect.service:", "publish.lag:"] {
        assert!(t.contains(name), "no {name} in:\n{t}");
    }
}
