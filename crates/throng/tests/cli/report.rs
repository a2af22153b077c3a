//! `throng report` as a user runs it: on result files written through the
//! library's Writer, checking text, JSON and HTML output and the errors.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use throng_host::sample::HostSample;
use throng_report::format::{Event, Header, Writer};
use throng_report::interval::{Interval, new_histogram};
use throng_testkit::process::{command, output_within, text};
use throng_testkit::{Peer, TempDir, peers, require};

/// Runs `throng <args>` to its end.
fn cli(args: &[&str]) -> Output {
    crate::throng().args(args).output().expect("run throng")
}

/// 30 s of two workers on one host, with a host sample from one of them.
fn run() -> Vec<Interval> {
    let base = 1_795_320_000;
    let mut all = vec![];
    for s in 0..30u64 {
        for w in 0..2u64 {
            let mut delivery = new_histogram();
            let mut connect = new_histogram();
            for i in 0..200 {
                delivery
                    .record(100 + (i * 13 + s * 7 + w) % 900 + s * 10)
                    .unwrap();
                connect.record(50 + (i * 3 + w) % 200).unwrap();
            }
            let mut counters = BTreeMap::from([
                ("connect.ok".to_owned(), 100),
                ("messages.received".to_owned(), 200),
                ("messages.lost".to_owned(), 0),
            ]);
            if s % 10 == 3 {
                counters.insert("connect.error.refused".to_owned(), 2 + w);
            }
            all.push(Interval {
                start_ns: (base + s) * 1_000_000_000,
                length_ns: 1_000_000_000,
                source: format!("box1/hold-{w}"),
                counters,
                gauges: BTreeMap::from([("connections.open".to_owned(), 100 * (s as i64 + 1))]),
                peaks: BTreeMap::new(),
                histograms: BTreeMap::from([
                    ("delivery".to_owned(), delivery),
                    ("connect".to_owned(), connect),
                ]),
                host: (w == 0).then(|| HostSample {
                    host: "box1".to_owned(),
                    at_ns: (base + s + 1) * 1_000_000_000,
                    tcp_established: 200 * (s + 1),
                    tcp_inuse: 200 * (s + 1) + 3,
                    packets_in_total: 1_000_000 + 5_000 * s,
                    packets_out_total: 2_000_000 + 4_000 * s,
                    bytes_in_total: 10_000_000 + 1_000_000 * s,
                    bytes_out_total: 20_000_000 + 900_000 * s,
                    mem_total_bytes: 24 << 30,
                    mem_available_bytes: (20 << 30) - s * (1 << 20),
                    mem_slab_bytes: 100 << 20,
                    rss_bytes: vec![
                        ("hold/worker-0".to_owned(), 10 << 20),
                        ("hold/worker-1".to_owned(), 11 << 20),
                    ],
                    cpu_ns: vec![("hold/worker-0".to_owned(), s * 200_000_000)],
                    ..HostSample::default()
                }),
            });
        }
    }
    all
}

fn write(path: &Path, intervals: &[Interval]) {
    let header = Header::new(
        vec!["throng".into(), "hold".into(), "ws://127.0.0.1:1/c".into()],
        serde_json::json!({}),
    );
    let mut w = Writer::create(path, &header).unwrap();
    for iv in intervals {
        w.write_interval(iv).unwrap();
    }
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = cli(args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn two_files_report_exactly_as_one() {
    let dir = TempDir::new("report-two");
    let all = run();
    let one = dir.file("one.throng");
    write(&one, &all);
    let (a, b) = (dir.file("a.throng"), dir.file("b.throng"));
    let (first, second): (Vec<_>, Vec<_>) = all
        .iter()
        .cloned()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    write(&a, &first.into_iter().map(|(_, iv)| iv).collect::<Vec<_>>());
    write(
        &b,
        &second.into_iter().map(|(_, iv)| iv).collect::<Vec<_>>(),
    );

    for every in ["1s", "10s"] {
        let mut single = json(&[
            "report",
            "--format",
            "json",
            "--every",
            every,
            one.to_str().unwrap(),
        ]);
        let mut split = json(&[
            "report",
            "--format",
            "json",
            "--every",
            every,
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ]);
        // Everything but the list of files read is the same.
        single.as_object_mut().unwrap().remove("files");
        split.as_object_mut().unwrap().remove("files");
        assert_eq!(single, split);
    }

    let r = json(&["report", "--format", "json", one.to_str().unwrap()]);
    assert_eq!(r["intervals"], 60);
    assert_eq!(r["counters"]["messages.received"]["total"], 60 * 200);
    assert_eq!(r["counters"]["messages.received"]["per_second"], 400.0);
    assert_eq!(r["errors_total"], 3 * (2 + 3));
    assert_eq!(r["errors"]["connect.error.refused"], 15);
    assert_eq!(r["losses"]["messages.lost"], 0);
    assert_eq!(r["gauges"]["connections.open"]["last"], 2 * 3000);
    assert_eq!(r["latency_us"]["delivery"]["count"], 60 * 200);
    assert!(
        r["latency_us"]["delivery"]["p99"].as_u64().unwrap()
            > r["latency_us"]["delivery"]["p50"].as_u64().unwrap()
    );
    assert_eq!(r["host"]["tcp_established_max"], 6000);
    assert_eq!(r["host"]["packets_in_per_s"], 5000.0);
    assert!(r.get("series").is_none());
    let series = json(&[
        "report",
        "--format",
        "json",
        "--every",
        "10s",
        one.to_str().unwrap(),
    ]);
    assert_eq!(series["series"].as_array().unwrap().len(), 3);
}

#[test]
fn text_report_shows_every_section() {
    let dir = TempDir::new("report-text");
    let one = dir.file("one.throng");
    write(&one, &run());
    let out = cli(&["report", "--every", "10s", one.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    for needle in [
        "latency",
        "p99.9",
        "delivery",
        "connect.ok",
        "errors: 15",
        "connect.error.refused",
        "losses: messages.lost 0",
        "connections.open",
        "tcp established",
        "packets per second",
        "memory",
        "time series, every 10 s",
    ] {
        assert!(t.contains(needle), "missing {needle:?} in:\n{t}");
    }
}

#[test]
fn a_truncated_file_reports_its_prefix_with_a_warning() {
    let dir = TempDir::new("report-cut");
    let path = dir.file("cut.throng");
    let all = run();
    write(&path, &all);
    let bytes = std::fs::read(&path).unwrap();
    let last = bytes[..bytes.len() - 1]
        .iter()
        .rposition(|b| *b == b'\n')
        .unwrap()
        + 1;
    std::fs::write(&path, &bytes[..last + 10]).unwrap();

    let out = cli(&["report", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(t.contains("59 interval(s)"), "{t}");
    assert!(
        t.contains(&format!(
            "warning: {}: damaged at byte {last}",
            path.display()
        )),
        "{t}"
    );

    let out = cli(&["report", "--format", "json", path.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(text(&out.stderr).contains(&format!("damaged at byte {last}")));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["intervals"], 59);
}

#[test]
fn a_file_that_is_not_a_result_file_is_an_error() {
    let dir = TempDir::new("report-foreign");
    let path = dir.file("notes.txt");
    std::fs::write(&path, "just some notes\n").unwrap();
    let out = cli(&["report", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("notes.txt") && err.contains("not a throng result file"),
        "{err}"
    );
    assert!(out.stdout.is_empty());

    let out = cli(&["report", dir.file("missing").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("missing"));

    let out = cli(&["report", "--every", "soon", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("not a duration"));
}

#[test]
fn help_teaches() {
    let out = cli(&["report", "--help"]);
    assert!(out.status.success());
    let t = text(&out.stdout);
    assert!(
        t.contains("Examples:") && t.contains("--every") && t.contains("results-format.md"),
        "{t}"
    );
}

#[test]
fn html_report_is_well_formed_and_has_the_plots() {
    require!(Peer::Python);
    let dir = TempDir::new("report-html");
    let one = dir.file("one.throng");
    write(&one, &run());
    {
        // An event with characters that need escaping.
        let mut w = Writer::create(
            dir.file("ev.throng"),
            &Header::new(vec![], serde_json::json!({})),
        )
        .unwrap();
        w.write_event(&Event {
            at_ns: 1_795_320_005_000_000_000,
            source: "box1/hold".into(),
            kind: "worker.restarted".into(),
            text: "exit <signal 9> & \"restarted\"".into(),
        })
        .unwrap();
    }
    let html = dir.file("out.html");
    let out = cli(&[
        "report",
        "--html",
        html.to_str().unwrap(),
        one.to_str().unwrap(),
        dir.file("ev.throng").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    for fetch in ["src=", "href=", "<link", "url("] {
        assert!(
            !page.contains(fetch),
            "the page must fetch nothing, found {fetch}"
        );
    }
    assert!(!page.contains("<script"), "no scripts needed");
    assert!(page.contains("exit &lt;signal 9&gt; &amp; &quot;restarted&quot;"));

    // Well-formed: parse it as XML with Python's parser, and list the plots with their point counts.
    let py = r#"
import sys, xml.etree.ElementTree as ET
ns = {'s': 'http://www.w3.org/2000/svg'}
root = ET.parse(sys.argv[1]).getroot()
for svg in root.iter('{http://www.w3.org/2000/svg}svg'):
    pts = [int(p.get('data-points')) for p in svg.findall('s:path', ns)]
    print(svg.get('id'), min(pts), max(pts))
"#;
    let out = command("python3")
        .args(["-c", py, html.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "not well-formed: {}",
        text(&out.stderr)
    );
    let plots: BTreeMap<String, (u64, u64)> = text(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].to_owned(),
                (f[1].parse().unwrap(), f[2].parse().unwrap()),
            )
        })
        .collect();
    for id in [
        "latency-delivery",
        "latency-connect",
        "gauges",
        "throughput",
        "errors",
        "host-sockets",
        "host-packets",
        "host-bytes",
        "host-memory",
    ] {
        let (min, max) = plots
            .get(id)
            .unwrap_or_else(|| panic!("no plot {id}: {plots:?}"));
        assert!(
            *min > 0 && *max >= 29,
            "plot {id} has lines of {min}..{max} points"
        );
    }
}

/// The page in a real browser (Debian's chromium, headless): every plot is
/// in the rendered DOM, the console is silent (no errors, no failed fetches),
/// and the screenshot holds more than a blank page's.
#[test]
fn html_report_renders_in_a_browser() {
    require!(Peer::Chromium);
    let dir = TempDir::new("report-browser");
    let one = dir.file("one.throng");
    write(&one, &run());
    let html = dir.file("out.html");
    let out = cli(&[
        "report",
        "--html",
        html.to_str().unwrap(),
        one.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let blank = dir.file("blank.html");
    std::fs::write(&blank, "<!DOCTYPE html><html><body></body></html>").unwrap();

    let headless = |extra: &[String], page: &Path| {
        let mut cmd = peers::headless_chromium(&dir.file("profile"));
        cmd.args([
            // Console messages are logged at INFO: they show as "INFO:CONSOLE".
            "--enable-logging=stderr",
            "--log-level=0",
            "--window-size=1100,2400",
        ])
        .args(extra)
        .arg(format!("file://{}", page.display()));
        output_within(&mut cmd, Duration::from_secs(120))
    };

    let dom = headless(&["--dump-dom".to_owned()], &html);
    assert!(dom.status.success(), "{}", text(&dom.stderr));
    let dom_text = text(&dom.stdout);
    for id in [
        "latency-delivery",
        "latency-connect",
        "gauges",
        "throughput",
        "host-sockets",
        "host-memory",
    ] {
        assert!(
            dom_text.contains(&format!("id=\"{id}\"")),
            "plot {id} not in the rendered DOM"
        );
    }
    assert!(dom_text.matches("class=\"series\"").count() >= 20);
    let console = |o: &Output| -> Vec<String> {
        text(&o.stderr)
            .lines()
            .filter(|l| l.contains("CONSOLE"))
            .map(str::to_owned)
            .collect()
    };
    // The console check itself works: a page that logs an error is caught.
    let control = dir.file("control.html");
    std::fs::write(
        &control,
        "<!DOCTYPE html><html><body><script>console.error('control')</script></body></html>",
    )
    .unwrap();
    let seen = console(&headless(&["--dump-dom".to_owned()], &control));
    assert!(
        seen.iter().any(|l| l.contains("control")),
        "console messages not captured"
    );
    let console = console(&dom);
    assert!(console.is_empty(), "console output: {console:?}");

    let shot = |page: &Path, name: &str| {
        let png = dir.file(name);
        let o = headless(&[format!("--screenshot={}", png.display())], page);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let bytes = std::fs::read(&png).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        bytes.len()
    };
    let page = shot(&html, "page.png");
    let empty = shot(&blank, "blank.png");
    assert!(
        page > 4 * empty,
        "the screenshot looks blank: {page} bytes against {empty} for an empty page"
    );
}

/// Two attacks at once on one host name their workers alike
/// (`<host>/attack-0`); each run has its own id, so both files merge as two
/// runs and every request counts.
#[test]
fn two_overlapping_runs_on_one_host_merge_as_two() {
    let server = crate::serve(&["--workers", "1"]);
    let url = format!("http://{}/ping", server.addr);
    let dir = TempDir::new("report-two-runs");
    let (m1, m2) = (dir.path().join("m1.jsonl"), dir.path().join("m2.jsonl"));
    // Both at once, each bounded.
    let runs: Vec<_> = [m1.clone(), m2.clone()]
        .into_iter()
        .map(|file| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut c = crate::throng();
                c.args([
                    "attack",
                    "--url",
                    &url,
                    "--rate",
                    "250/s",
                    "--requests",
                    "500",
                    "-q",
                ])
                .arg("--output")
                .arg(&file);
                output_within(&mut c, Duration::from_secs(60))
            })
        })
        .collect();
    for run in runs {
        let out = run.join().expect("attack thread");
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let r = json(&[
        "report",
        "--format",
        "json",
        m1.to_str().unwrap(),
        m2.to_str().unwrap(),
    ]);
    assert_eq!(
        r["counters"]["requests.sent"]["total"].as_u64(),
        Some(1000),
        "{r}"
    );
    assert_eq!(r["duplicates"].as_u64(), Some(0), "{r}");
    let sources: Vec<&str> = r["sources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    assert!(
        sources.iter().any(|s| s.ends_with("(run 2)")),
        "{sources:?}"
    );
    // The same file twice is still one run, counted once.
    let r = json(&[
        "report",
        "--format",
        "json",
        m1.to_str().unwrap(),
        m1.to_str().unwrap(),
    ]);
    assert_eq!(
        r["counters"]["requests.sent"]["total"].as_u64(),
        Some(500),
        "{r}"
    );
}

/// A hold's file and an attack's do not add up: refused with exit 2 and
/// both kinds named; `--mixed` shows each as a report of its own.
#[test]
fn different_kinds_of_run_are_refused_or_shown_apart() {
    let dir = TempDir::new("report-kinds");
    let hold = dir.path().join("hold.jsonl");
    write(&hold, &run());
    let attack = dir.path().join("attack.jsonl");
    let header = Header::new(
        vec!["throng".into(), "attack".into()],
        serde_json::json!({"subcommand": "attack"}),
    );
    let mut w = Writer::create(&attack, &header).unwrap();
    let mut iv = Interval::empty(
        1_795_320_000_000_000_000,
        1_000_000_000,
        "h/attack-0".into(),
    );
    iv.counters.insert("requests.sent".into(), 7);
    w.write_interval(&iv).unwrap();
    drop(w);
    let (h, a) = (hold.to_str().unwrap(), attack.to_str().unwrap());
    let out = cli(&["report", h, a]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("hold (") && err.contains("attack ("), "{err}");
    assert!(err.contains("--mixed"), "{err}");
    assert!(out.stdout.is_empty());

    let out = cli(&["report", "--mixed", h, a]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(
        t.contains("=== hold ===") && t.contains("=== attack ==="),
        "{t}"
    );
    let r = json(&["report", "--mixed", "--format", "json", h, a]);
    let runs = r["mixed"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["kind"], "attack");
    assert_eq!(
        runs[1]["report"]["counters"]["requests.sent"]["total"].as_u64(),
        Some(7)
    );
    assert!(runs[0]["report"]["counters"].get("requests.sent").is_none());
}
