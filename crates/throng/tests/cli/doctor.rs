//! `throng doctor` as a user runs it: against fake `/proc` trees (each limit
//! broken in turn, then `--apply`), and once against this machine.

use std::path::Path;
use std::process::Output;

use throng_testkit::fake_proc::FakeProc;

use crate::throng;

/// `throng doctor --proc-root <root>` plus `args`.
fn doctor(root: &Path, args: &[&str]) -> Output {
    throng()
        .arg("doctor")
        .arg("--proc-root")
        .arg(root)
        .args(args)
        .output()
        .expect("run throng doctor")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The output line of one check.
fn line<'a>(out: &'a str, check: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(check))
        .unwrap_or_else(|| panic!("no line for {check} in:\n{out}"))
}

#[test]
fn a_roomy_machine_passes() {
    let p = FakeProc::new("roomy");
    let o = doctor(
        p.root(),
        &[
            "--connections",
            "100000",
            "--source-ips",
            "127.0.0.2-127.0.0.3",
        ],
    );
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("Nothing here will stop a run of 100000 connections"),
        "{out}"
    );
    assert!(
        out.contains("assuming 3.5 KiB kernel + 1.0 KiB user memory per socket"),
        "{out}"
    );
    assert!(!out.contains("WARN") && !out.contains("STOP"), "{out}");
}

#[test]
fn each_limit_is_reported_with_its_fix() {
    // (sysctl, broken value, check name, status, exact fix line)
    let cases = [
        (
            "fs.file-max",
            "50000",
            "fs.file-max",
            "STOP",
            "sysctl -w fs.file-max=260000",
        ),
        (
            "net.ipv4.ip_local_port_range",
            "32768\t60999",
            "local",
            "STOP",
            "sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\"",
        ),
        (
            "net.core.somaxconn",
            "128",
            "net.core.somaxconn",
            "WARN",
            "sysctl -w net.core.somaxconn=65535",
        ),
        (
            "net.ipv4.tcp_max_syn_backlog",
            "256",
            "net.ipv4.tcp_max_syn_backlog",
            "WARN",
            "sysctl -w net.ipv4.tcp_max_syn_backlog=65535",
        ),
        (
            "net.ipv4.tcp_mem",
            "10000\t20000\t30000",
            "net.ipv4.tcp_mem",
            "STOP",
            "sysctl -w net.ipv4.tcp_mem=\"125000 250000 400000\"",
        ),
        (
            "net.netfilter.nf_conntrack_max",
            "65536",
            "conntrack",
            "STOP",
            "sysctl -w net.netfilter.nf_conntrack_max=130000",
        ),
    ];
    for (name, value, check, status, fix) in cases {
        let p = FakeProc::new(&format!("case-{check}"));
        p.set(name, value);
        let o = doctor(
            p.root(),
            &[
                "--connections",
                "100000",
                "--source-ips",
                "127.0.0.2,127.0.0.3",
            ],
        );
        let out = stdout(&o);
        let l = line(&out, check);
        assert!(l.trim_start().starts_with(status), "{name}: {l}");
        assert!(
            out.contains(&format!("fix: {fix}")),
            "{name}: no '{fix}' in:\n{out}"
        );
        let expect_code = if status == "STOP" { 1 } else { 0 };
        assert_eq!(o.status.code(), Some(expect_code), "{name}:\n{out}");
        assert!(out.contains("/etc/sysctl.d/60-throng.conf"), "{out}");
    }
}

#[test]
fn open_files_memory_and_sources() {
    let p = FakeProc::new("nofile");
    std::fs::write(
        p.root().join("self/limits"),
        "Max open files            1024                 20000                files     \n",
    )
    .unwrap();
    std::fs::write(
        p.root().join("meminfo"),
        "MemTotal: 2097152 kB\nMemAvailable: 1048576 kB\n",
    )
    .unwrap();
    let o = doctor(p.root(), &["--connections", "300000", "--role", "client"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        line(&out, "open").contains("need 16 worker process(es) of at most 19936"),
        "{out}"
    );
    let mem = line(&out, "memory");
    assert!(mem.contains("STOP") && mem.contains("OOM killer"), "{out}");
    assert!(
        out.contains("fix: hold at most ~186413 connections"),
        "{out}"
    );
    assert!(
        out.contains("fix: use 6 source addresses (--source-ips 127.0.0.2-127.0.0.7"),
        "{out}"
    );

    // The stated per-socket costs are overridable and shown.
    let o = doctor(
        p.root(),
        &[
            "--connections",
            "300000",
            "--role",
            "client",
            "--kernel-per-socket",
            "2048",
            "--user-per-socket",
            "512",
            "--source-ips",
            "127.0.0.2-127.0.0.7",
        ],
    );
    let out = stdout(&o);
    assert!(
        out.contains("assuming 2.0 KiB kernel + 0.5 KiB user"),
        "{out}"
    );
    assert!(line(&out, "memory").trim_start().starts_with("ok"), "{out}");
    assert!(line(&out, "local").trim_start().starts_with("ok"), "{out}");
    assert_eq!(o.status.code(), Some(0), "{out}");
}

#[test]
fn apply_writes_the_sysctls_and_checks_again() {
    let p = FakeProc::new("apply");
    p.set("fs.file-max", "50000");
    p.set("net.core.somaxconn", "128");
    let o = doctor(
        p.root(),
        &[
            "--connections",
            "100000",
            "--source-ips",
            "127.0.0.2-127.0.0.3",
            "--apply",
        ],
    );
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("applied  fs.file-max = 260000"), "{out}");
    assert!(out.contains("applied  net.core.somaxconn = 65535"), "{out}");
    assert_eq!(p.get("fs.file-max"), "260000");
    assert_eq!(p.get("net.core.somaxconn"), "65535");
    assert!(out.contains("Nothing here will stop"), "{out}");
}

#[test]
fn json_output() {
    let p = FakeProc::new("json");
    p.set("net.core.somaxconn", "128");
    let o = doctor(p.root(), &["--connections", "1000", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["plan"]["connections"], 1000);
    assert_eq!(v["plan"]["role"], "both");
    assert_eq!(v["machine"]["somaxconn"], 128);
    assert_eq!(v["warnings"], 1);
    assert_eq!(v["stops"], 0);
    let f = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "net.core.somaxconn")
        .unwrap();
    assert_eq!(f["status"], "warn");
    assert_eq!(
        f["fixes"][0],
        serde_json::json!({"kind": "sysctl", "name": "net.core.somaxconn", "value": "65535"})
    );
    assert_eq!(v["sysctl_d"], "net.core.somaxconn = 65535\n");
}

#[test]
fn bad_arguments_are_clear() {
    let p = FakeProc::new("args");
    let o = doctor(p.root(), &["--ports", "9-1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("runs backwards"));
    let o = doctor(p.root(), &["--source-ips", "nonsense"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nonsense"));
}

#[test]
fn this_machine_once_for_real() {
    // A small run any machine holds; read-only (no --apply).
    let o = doctor(
        Path::new("/proc"),
        &["--connections", "1000", "--format", "json"],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(v["machine"]["nr_open"], nr_open);
    assert!(v["machine"]["nofile"]["hard"].as_u64().unwrap() > 0);
    assert!(v["machine"]["mem_available"].as_u64().unwrap() > 0);
    let checks: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["check"].as_str().unwrap())
        .collect();
    for c in [
        "open files",
        "fs.file-max",
        "local ports",
        "net.core.somaxconn",
        "memory",
    ] {
        assert!(checks.contains(&c), "{checks:?}");
    }
    assert_eq!(v["stops"], 0, "{v:#}");
    assert_eq!(o.status.code(), Some(0));
    let text = throng().args(["doctor", "-c", "1000"]).output().unwrap();
    assert!(stdout(&text).contains("can this machine hold 1000 connections"));
}
