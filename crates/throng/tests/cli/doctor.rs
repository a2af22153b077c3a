//! `throng doctor` as a user runs it: against fake `/proc` trees (each limit
//! broken in turn, then `--apply`), and once against this machine.

use std::path::Path;
use std::process::Output;

use throng_testkit::fake_proc::FakeProc;
use throng_testkit::process::text;
use throng_testkit::{Peer, require};

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
            "127.0.0.2-127.0.0.5",
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
        out.contains(
            "fix: throng hold ws://127.0.0.1:8080/news --connections 186413 --source-ips 127.0.0.2-127.0.0.8  # the most that fits"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "fix: throng hold ws://127.0.0.1:8080/news --connections 300000 --source-ips 127.0.0.2-127.0.0.12  # 11 source addresses"
        ),
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
            "127.0.0.2-127.0.0.12",
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
            "127.0.0.2-127.0.0.5",
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

/// `throng doctor` with no arguments advised `serve --ports`, an option that
/// never existed, and checked one source address against one port while
/// bench spreads over its own. It now checks bench's own layout: the
/// same connections, source addresses and server ports as `bench --dry-run`.
#[test]
fn doctor_checks_the_run_bench_would_make() {
    for count in [None, Some("300000")] {
        let mut doctor_args = vec!["doctor", "--format", "json"];
        let mut bench_args = vec!["bench", "--dry-run"];
        if let Some(c) = count {
            doctor_args.extend(["--connections", c]);
            bench_args.extend(["--connections", c]);
        }
        let o = throng().args(&doctor_args).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let plan = &v["plan"];
        assert_eq!(plan["bench"], true, "{plan}");
        let o = throng().args(&bench_args).output().unwrap();
        let bench = stdout(&o);
        // What this machine's settings allow decides both verdicts (a fresh
        // machine's tcp_mem stops 300,000; a tuned one's does not): bench
        // refuses exactly the runs doctor says a limit stops, naming each.
        let stopped: Vec<&str> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["status"] == "stop")
            .map(|f| f["check"].as_str().unwrap())
            .collect();
        assert_eq!(stopped.len() as u64, v["stops"].as_u64().unwrap(), "{v:#}");
        if !stopped.is_empty() {
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{bench}{err}");
            for check in &stopped {
                assert!(
                    err.contains(&format!("will stop the run: {check}")),
                    "{check}: {err}"
                );
            }
            continue;
        }
        assert!(o.status.success(), "{bench}{}", text(&o.stderr));
        let connections = plan["connections"].as_u64().unwrap();
        assert!(
            bench.starts_with(&format!("throng bench: {connections} connections")),
            "doctor planned {connections}:\n{bench}"
        );
        let sources = plan["source_list"].as_str().unwrap();
        assert!(
            bench.contains(&format!(
                "sources {sources} ({} addresses",
                plan["source_ips"]
            )),
            "doctor planned sources {sources}:\n{bench}"
        );
        assert_eq!(plan["target_ports"], 8);
        assert!(bench.contains("on 8 free loopback ports"), "{bench}");
    }
}

/// The fixes of every finding doctor can print, on a fake machine that
/// keeps this machine's open-file limits, `nr_open` and port range (so a
/// fix that works there works here) and breaks everything else; each run
/// as printed: sysctls in scratch namespaces, shell commands with scratch
/// files mounted over the files they write, `throng` commands with
/// `--dry-run` (they must parse and fit this machine).
#[test]
fn every_fix_doctor_prints_works_as_printed() {
    require!(Peer::Namespaces);
    let p = FakeProc::new("every-fix");
    throng_host::limits::raise_nofile().unwrap();
    let nofile = throng_host::limits::nofile().unwrap();
    p.limits(nofile.soft, nofile.hard);
    for name in ["fs.nr_open", "net.ipv4.ip_local_port_range"] {
        p.set(name, &sysctl_n(name));
    }
    for (name, value) in [
        ("fs.file-max", "50000"),
        ("net.core.somaxconn", "128"),
        ("net.ipv4.tcp_max_syn_backlog", "256"),
        ("net.ipv4.tcp_syncookies", "0"),
        ("net.ipv4.tcp_mem", "10000\t20000\t30000"),
        ("net.netfilter.nf_conntrack_max", "65536"),
        ("net.netfilter.nf_conntrack_count", "1000"),
    ] {
        p.set(name, value);
    }
    p.meminfo(1 << 30);
    let runs: [&[&str]; 5] = [
        // bench's layout; past 256 worker processes at a 20,000-file limit.
        &["-c", "6000000"],
        &["-c", "300000", "--role", "client"],
        &[
            "-c",
            "300000",
            "--role",
            "client",
            "--source-ips",
            "127.0.0.2-127.0.0.3",
            "--ports",
            "10000-10001",
        ],
        &["-c", "300000", "--role", "server"],
        &["-c", "300000", "--source-ips", "127.0.0.2"],
    ];
    let mut fixes: Vec<serde_json::Value> = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    for args in runs {
        let o = doctor(p.root(), &[args, &["--format", "json"]].concat());
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let text_out = stdout(&doctor(p.root(), args));
        let printed = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["status"] != "ok");
        for f in printed {
            for fix in f["fixes"].as_array().unwrap() {
                let line = fix_line(fix);
                // What the text shows is what is run here.
                assert!(
                    text_out.contains(&format!("fix: {line}")),
                    "{line} not printed in:\n{text_out}"
                );
                kinds.insert(fix["kind"].as_str().unwrap().to_owned());
                if !fixes.contains(fix) {
                    fixes.push(fix.clone());
                }
            }
        }
    }
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["shell", "sysctl", "throng"],
        "{fixes:#?}"
    );
    for fix in &fixes {
        let line = fix_line(fix);
        match fix["kind"].as_str().unwrap() {
            "sysctl" => sysctl_works(
                fix["name"].as_str().unwrap(),
                fix["value"].as_str().unwrap(),
                &line,
            ),
            "shell" => shell_works(&line),
            _ => throng_works(&line),
        }
    }
}

/// A fix as doctor prints it (without its comment), from its JSON.
fn fix_line(fix: &serde_json::Value) -> String {
    let s = |k: &str| fix[k].as_str().unwrap().to_owned();
    match fix["kind"].as_str().unwrap() {
        "sysctl" if s("value").contains(' ') => {
            format!("sysctl -w {}=\"{}\"", s("name"), s("value"))
        }
        "sysctl" => format!("sysctl -w {}={}", s("name"), s("value")),
        "shell" => s("command"),
        "throng" => {
            let args: Vec<&str> = fix["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            format!("throng {}", args.join(" "))
        }
        other => panic!("a fix of unknown kind {other}"),
    }
}

/// `sh -c <script>` as root, in fresh namespaces given by `unshare`'s flags.
fn unshared(flags: &[&str], script: &str) -> Output {
    throng_testkit::process::command("unshare")
        .args(flags)
        .args(["sh", "-c", script])
        .output()
        .unwrap()
}

/// This machine's value of a sysctl, as `sysctl -n` prints it.
fn sysctl_n(name: &str) -> String {
    let o = std::process::Command::new("sysctl")
        .args(["-n", name])
        .output()
        .unwrap();
    assert!(o.status.success(), "sysctl -n {name}: {}", text(&o.stderr));
    text(&o.stdout).trim().to_owned()
}

/// The sysctl names a setting of this kernel (with as many numbers), the
/// line as printed writes the value (into a scratch `/proc/sys` in a
/// private mount namespace), and a kernel takes it where it can without
/// changing this machine's: in a scratch network namespace.
fn sysctl_works(name: &str, value: &str, line: &str) {
    let path = name.replace('.', "/");
    if Path::new("/proc/sys").join(&path).exists() {
        let now = sysctl_n(name);
        assert_eq!(
            now.split_whitespace().count(),
            value.split_whitespace().count(),
            "{line}: this kernel's {name} is {now:?}"
        );
    } else {
        eprintln!("{name} is not on this machine (module not loaded): only the line is run");
    }
    let scratch = throng_testkit::TempDir::new("doctor-sysctl");
    let file = scratch.path().join(&path);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "0\n").unwrap();
    let o = unshared(
        &["--mount"],
        &format!(
            "mount --bind {} /proc/sys && {line}",
            scratch.path().display()
        ),
    );
    assert!(o.status.success(), "{line}: {}", text(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap().trim(),
        value,
        "{line}"
    );

    let writable = unshared(&["--net"], &format!("test -w /proc/sys/{path}"));
    if name.starts_with("net.") && writable.status.success() {
        let before = sysctl_n(name);
        let o = unshared(&["--net"], &format!("{line} && sysctl -n {name}"));
        assert!(o.status.success(), "{line}: {}", text(&o.stderr));
        let took = text(&o.stdout);
        let took = took.lines().last().unwrap_or("");
        assert_eq!(
            took.split_whitespace().collect::<Vec<_>>(),
            value.split_whitespace().collect::<Vec<_>>(),
            "{line}: the kernel did not take it"
        );
        assert_eq!(sysctl_n(name), before, "{line} changed this machine");
    }
}

/// The shell command, run as root with a scratch copy mounted over each
/// file it writes (which must exist here: the path is right) in a private
/// mount namespace: it succeeds and writes what it says.
fn shell_works(command: &str) {
    let words: Vec<&str> = command.split_whitespace().collect();
    let targets: Vec<&str> = words
        .windows(2)
        .filter(|w| w[0] == ">" || w[0] == ">>")
        .map(|w| w[1])
        .collect();
    let scratch = throng_testkit::TempDir::new("doctor-shell");
    let mut mounts = String::new();
    let mut copies = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        if !Path::new(target).exists() && target.starts_with("/sys/module/") {
            eprintln!("{target} is not on this machine (module not loaded): {command} not run");
            return;
        }
        let before = std::fs::read_to_string(target)
            .unwrap_or_else(|e| panic!("{command}: cannot read {target}: {e}"));
        let copy = scratch.path().join(i.to_string());
        std::fs::write(&copy, &before).unwrap();
        mounts.push_str(&format!("mount --bind {} {target} && ", copy.display()));
        copies.push((copy, before));
    }
    let o = unshared(&["--mount"], &format!("{mounts}{command}"));
    assert!(o.status.success(), "{command}: {}", text(&o.stderr));
    let echoed = command
        .strip_prefix("echo ")
        .and_then(|rest| rest.split(" >").next())
        .map(|v| v.trim_matches('\''));
    for (copy, before) in copies {
        let after = std::fs::read_to_string(copy).unwrap();
        let written = after.strip_prefix(before.as_str()).unwrap_or(&after);
        assert_eq!(Some(written.trim_end()), echoed, "{command}");
    }
}

/// The `throng` command line, run by a shell as printed plus `--dry-run`:
/// its options exist, its values parse, and the run fits this machine.
fn throng_works(line: &str) {
    let bin = Path::new(crate::THRONG).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = throng_testkit::process::command("sh")
        .args(["-c", &format!("{line} --dry-run")])
        .env("PATH", path)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{line} --dry-run: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}

/// A source address that is not on this host will fail every connection:
/// doctor binds it and says STOP, naming it (exit 1).
#[test]
fn a_source_address_not_on_this_host_will_stop_the_run() {
    let out = throng()
        .args([
            "doctor",
            "--connections",
            "1000",
            "--role",
            "client",
            "--source-ips",
            "127.0.0.2,192.0.2.1",
        ])
        .output()
        .expect("run throng");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("source addresses"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("STOP") && line.contains("192.0.2.1"),
        "{line}"
    );
    assert!(!line.contains("127.0.0.2"), "{line}");
}
