//! `serve --config FILE` and `THRONG_<OPTION>`: flags override the
//! environment, which overrides the file; `--print-config` says where each
//! value came from; a key that names no option is refused.

use std::time::Duration;

use throng_testkit::TempDir;
use throng_testkit::process::{output_within, text};

use crate::throng;

#[test]
fn flags_override_the_environment_which_overrides_the_file() {
    let dir = TempDir::new("config-file");
    std::fs::write(
        dir.file("serve.toml"),
        "listen = [\"127.0.0.1:0\", \"[::1]:0\"]\nmax-connections = 5000\nping-interval = \"20s\"\n\
         history = 10\nredis = \"redis://throng:s3cret@127.0.0.1:9/0\"\nredis-wait = true\n",
    )
    .unwrap();
    let out = output_within(
        throng()
            .args([
                "serve",
                "--config",
                &dir.arg("serve.toml"),
                "--history",
                "3",
                "--print-config",
            ])
            .env("THRONG_MAX_CONNECTIONS", "7000")
            .env("THRONG_HISTORY", "5"),
        Duration::from_secs(20),
    );
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}{}", text(&out.stderr));
    let file = format!("# file {}", dir.arg("serve.toml"));
    for line in [
        format!("listen = [\"127.0.0.1:0\", \"[::1]:0\"]  {file}"),
        "max-connections = 7000  # environment THRONG_MAX_CONNECTIONS".to_owned(),
        "history = 3  # flag --history".to_owned(),
        format!("ping-interval = \"20s\"  {file}"),
        "max-message = \"64KiB\"  # default".to_owned(),
        format!("redis = \"redis://throng:***@127.0.0.1:9/0\"  {file}"),
        format!("redis-wait = true  {file}"),
    ] {
        assert!(shown.contains(&line), "{line}\nin\n{shown}");
    }
    assert!(!shown.contains("s3cret"), "{shown}");
}

#[test]
fn the_environment_and_a_file_start_a_real_server_and_bad_keys_are_refused() {
    let out = output_within(
        throng()
            .args(["serve", "--dry-run", "--json"])
            .env("THRONG_LISTEN", "127.0.0.1:0")
            .env("THRONG_MAX_MESSAGE", "1KiB"),
        Duration::from_secs(20),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let start: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listen = start["listen"][0].as_str().unwrap();
    assert!(
        listen.starts_with("127.0.0.1:") && !listen.ends_with(":8080"),
        "{start}"
    );
    assert_eq!(start["config"]["max_message"], 1024, "{start}");

    let dir = TempDir::new("config-bad");
    for (name, body, why) in [
        (
            "unknown.toml",
            "max-conections = 5\n",
            "'max-conections' is not an option",
        ),
        (
            "nested.toml",
            "[listen]\nx = 1\n",
            "must be a string, number, boolean",
        ),
        ("broken.toml", "listen = [\n", "is not TOML"),
    ] {
        std::fs::write(dir.file(name), body).unwrap();
        let out = output_within(
            throng().args(["serve", "--dry-run", "--config", &dir.arg(name)]),
            Duration::from_secs(20),
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(why), "{name}: {err}");
    }
    // THRONG_CONFIG names the file too.
    let out = output_within(
        throng()
            .args(["serve", "--dry-run"])
            .env("THRONG_CONFIG", dir.arg("unknown.toml")),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
}
