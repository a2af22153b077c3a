//! What a command does when whoever reads its stdout goes away
//! (`throng hold … | head -1`): it finishes its run and exits with its own
//! status, quietly, instead of panicking at its next line of output.

use std::process::Command;
use std::time::Duration;

use throng_testkit::process::{output_within, text};

use crate::serve;

/// Runs `throng <args> | true` in bash with `pipefail`: `true` has exited
/// (its read end closed) before the first line, so every write to stdout
/// fails with EPIPE. Returns throng's exit code and stderr.
fn with_stdout_closed(args: &[&str]) -> (Option<i32>, String) {
    let out = output_within(
        Command::new("bash")
            .args(["-c", "set -o pipefail; \"$0\" \"$@\" | true", crate::THRONG])
            .args(args),
        Duration::from_secs(60),
    );
    (out.status.code(), text(&out.stderr))
}

#[test]
fn a_reader_that_goes_away_ends_no_command_with_a_panic() {
    let server = serve(&["--workers", "1"]);
    let ws = format!("ws://{}/gone", server.addr);
    let publish = format!("http://{}/publish/gone", server.addr);
    let runs: [&[&str]; 4] = [
        // Start lines, the summary.
        &[
            "hold",
            &ws,
            "-c",
            "5",
            "--duration",
            "500ms",
            "--publish",
            &publish,
        ],
        &[
            "hold",
            &ws,
            "-c",
            "5",
            "--duration",
            "500ms",
            "--json",
            "-q",
        ],
        &[
            "attack",
            "--url",
            &publish,
            "--rate",
            "20/s",
            "--duration",
            "500ms",
        ],
        &["doctor", "-c", "1000"],
    ];
    for args in runs {
        let (code, stderr) = with_stdout_closed(args);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(code.is_some_and(|c| c <= 1), "{args:?}: {code:?}\n{stderr}");
    }
}
