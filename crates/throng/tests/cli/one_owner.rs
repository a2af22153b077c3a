//! One owner per port: a second `throng serve` on a port a running one
//! holds is refused (exit 2) naming the holder's pid, `--dry-run` too; a
//! killed holder (even `kill -9`) leaves nothing stale; one address given
//! to two listener options of one command is refused.

use std::time::Duration;

use throng_testkit::process::{output_within, text};

use crate::{serve, throng};

/// `throng serve <args> --dry-run`: exit code and stderr.
fn dry_run(args: &[&str]) -> (i32, String) {
    let out = output_within(
        throng().arg("serve").args(args).arg("--dry-run"),
        Duration::from_secs(20),
    );
    (out.status.code().unwrap_or(-1), text(&out.stderr))
}

#[test]
fn a_port_held_by_a_running_serve_is_refused_naming_its_pid() {
    let mut first = serve(&["--workers", "1"]);
    let addr = first.addr.to_string();
    let pid = first.child.id();
    let (code, err) = dry_run(&["--listen", &addr]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("port {}:", first.addr.port()))
            && err.contains(&format!("pid {pid}")),
        "{err}"
    );
    assert!(
        err.contains(&format!("kill {pid}")),
        "how to replace it: {err}"
    );
    // Not only the dry run: a real start is refused the same way, at once.
    let out = output_within(
        throng().args(["serve", "--workers", "1", "--mqtt-listen", &addr]),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // A range that overlaps the held port is refused too.
    let p = first.addr.port();
    let range = format!("127.0.0.1:{}-{}", p.saturating_sub(1), p);
    let (code, err) = dry_run(&["--listen", &range]);
    assert_eq!(code, 2, "{err}");
    // kill -9 leaves no stale claim: the port is free for the next one.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    throng_testkit::wait_until("the killed server's workers to go", || {
        dry_run(&["--listen", &addr]).0 == 0
    });
}

#[test]
fn one_address_given_twice_in_one_command_is_refused() {
    let port = throng_testkit::free_port();
    let a = format!("127.0.0.1:{port}");
    for (first, second) in [
        ("--listen", "--mqtt-listen"),
        ("--listen", "--listen"),
        ("--mqtt-listen", "--mqtts-listen"),
        ("--publish-listen", "--publish-listen"),
    ] {
        let (code, err) = dry_run(&[first, &a, second, &a]);
        assert_eq!(code, 2, "{first} {second}: {err}");
        assert!(err.contains(&format!("{a} is given twice")), "{err}");
    }
    // A public address given as an internal one has its own reason.
    let (code, err) = dry_run(&["--mqtt-listen", &a, "--publish-listen", &a]);
    assert_eq!(code, 2, "{err}");
    // A wildcard and a loopback address on one port overlap too.
    let (code, err) = dry_run(&["--listen", &format!("0.0.0.0:{port}"), "--mqtt-listen", &a]);
    assert_eq!(code, 2, "{err}");
    // One listener may serve both internal roles (documented).
    let (code, err) = dry_run(&["--publish-listen", &a, "--metrics-listen", &a]);
    assert_eq!(code, 0, "{err}");
}
