//! What a newcomer trips on (issue 19), each pinned by the command that
//! showed it: errors said once and in the user's terms, start-up output that
//! is either for people or for scripts, `--help` examples that paste whole.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Output, Stdio};
use std::time::Duration;

use throng_testkit::process::text;

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
    assert_eq!(ok, "{\"channel\":\"news\",\"subscribers\":0}\n");
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
