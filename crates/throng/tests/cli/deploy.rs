//! The deploy files in `deploy/` hold what throng reads: the example
//! settings file and the Kubernetes ConfigMap's parse as `serve --config`
//! files, and the systemd unit passes `systemd-analyze verify` (where
//! systemd is installed).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use throng_testkit::TempDir;
use throng_testkit::process::{output_within, text};

use crate::{THRONG, throng};

fn deploy(file: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy")).join(file)
}

/// `serve --config <file>` on free loopback ports: it must plan and stop.
fn plans(config: &PathBuf) {
    let out = output_within(
        throng().arg("serve").arg("--config").arg(config).args([
            "--listen",
            "127.0.0.1:0",
            "--publish-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--max-connections",
            "1000",
            "--dry-run",
        ]),
        Duration::from_secs(20),
    );
    assert!(
        out.status.success(),
        "{}: {}",
        config.display(),
        text(&out.stderr)
    );
}

#[test]
fn the_example_settings_and_the_config_map_are_serve_config_files() {
    plans(&deploy("serve.toml"));
    // The ConfigMap's serve.toml: the indented block after `serve.toml: |`.
    let yaml = std::fs::read_to_string(deploy("kubernetes/serve.yaml")).unwrap();
    let block: Vec<&str> = yaml
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("serve.toml: |"))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .map(str::trim_start)
        .collect();
    assert!(block.len() > 3, "no serve.toml block in the ConfigMap");
    let dir = TempDir::new("configmap");
    std::fs::write(dir.file("serve.toml"), block.join("\n")).unwrap();
    // It names redis-wait, which needs --redis: the Secret's THRONG_REDIS.
    let out = output_within(
        throng()
            .args([
                "serve",
                "--config",
                &dir.arg("serve.toml"),
                "--print-config",
            ])
            .env("THRONG_REDIS", "redis://127.0.0.1:9/0"),
        Duration::from_secs(20),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("metrics-listen = [\"0.0.0.0:9090\"]"));
}

#[test]
fn the_systemd_unit_verifies() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no systemd-analyze");
        return;
    }
    let unit = std::fs::read_to_string(deploy("throng.service")).unwrap();
    assert!(
        unit.contains("ExecReload=/bin/kill -HUP $MAINPID"),
        "{unit}"
    );
    assert!(unit.contains("LimitNOFILE="), "{unit}");
    let dir = TempDir::new("unit");
    let path = dir.file("throng.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/throng", THRONG)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
