//! `doctor` against fake `/proc` trees: one machine that is fine, then each
//! limit broken in turn, checked for the verdict and the exact fix, and
//! `apply` writing the sysctl fixes into the tree.

use std::path::Path;

use throng_host::doctor::{
    Finding, Fix, HostLimits, Plan, Role, Status, apply, check_machine, sysctl_d, warning_lines,
    warnings,
};
use throng_testkit::fake_proc::FakeProc;

/// What doctor finds on a fake machine for `plan`.
trait Check {
    fn check(&self, plan: &Plan) -> Vec<Finding>;
}

impl Check for FakeProc {
    fn check(&self, plan: &Plan) -> Vec<Finding> {
        check_machine(plan, &HostLimits::read(self.root()))
    }
}

fn finding<'a>(all: &'a [Finding], check: &str) -> &'a Finding {
    all.iter()
        .find(|f| f.check == check)
        .unwrap_or_else(|| panic!("no finding {check:?} in {all:#?}"))
}

fn sysctl_fix(f: &Finding) -> (String, String) {
    f.fixes
        .iter()
        .find_map(|x| match x {
            Fix::Sysctl { name, value } => Some((name.clone(), value.clone())),
            Fix::Throng { .. } | Fix::Shell { .. } => None,
        })
        .unwrap_or_else(|| panic!("no sysctl fix in {f:#?}"))
}

#[test]
fn a_roomy_machine_is_ok_everywhere() {
    let p = FakeProc::new("roomy");
    let mut plan = Plan::new(100_000, Role::Both);
    // 25,000 per (source, target) pair: under 45% of the 64,512 ports, where
    // connect() stays cheap (two sources would be a warning).
    plan.source_ips = 4;
    let all = p.check(&plan);
    for f in &all {
        assert_eq!(f.status, Status::Ok, "{f:#?}");
        assert!(f.fixes.is_empty() || f.check == "fs.nr_open", "{f:#?}");
    }
    let checks: Vec<&str> = all.iter().map(|f| f.check.as_str()).collect();
    assert_eq!(
        checks,
        [
            "open files",
            "fs.nr_open",
            "fs.file-max",
            "local ports",
            "net.core.somaxconn",
            "net.ipv4.tcp_max_syn_backlog",
            "net.ipv4.tcp_mem",
            "memory"
        ]
    );
    // Conntrack not loaded: no finding, not an error.
    assert!(all.iter().all(|f| f.check != "conntrack"));
    assert_eq!(sysctl_d(&all), "");
}

#[test]
fn open_files() {
    let p = FakeProc::new("nofile");
    p.limits(1024, 20_000);
    let f = finding(&p.check(&Plan::new(100_000, Role::Client)), "open files").clone();
    assert_eq!(f.status, Status::Ok);
    assert!(
        f.message.contains("need 6 worker process(es)"),
        "{}",
        f.message
    );
    assert!(
        f.message.contains("raises the soft limit 1024"),
        "{}",
        f.message
    );

    // Ten million connections at 20,000 per process: works, but too many processes.
    let f = finding(&p.check(&Plan::new(10_000_000, Role::Client)), "open files").clone();
    assert_eq!(f.status, Status::Warn);
    assert_eq!(
        f.fixes[0].line(),
        "echo '* hard nofile 1048576' >> /etc/security/limits.conf",
        "{:?}",
        f.fixes
    );
    assert!(
        f.notes.iter().any(|n| n.contains("LimitNOFILE=1048576")),
        "{:?}",
        f.notes
    );

    p.limits(64, 64);
    let f = finding(&p.check(&Plan::new(10, Role::Client)), "open files").clone();
    assert_eq!(f.status, Status::Stop);
    assert!(f.fixes[0].line().contains("nofile 74"), "{:?}", f.fixes);
}

#[test]
fn nr_open() {
    let p = FakeProc::new("nr-open");
    p.set("fs.nr_open", "20000");
    let f = finding(&p.check(&Plan::new(100_000, Role::Client)), "fs.nr_open").clone();
    assert_eq!(f.status, Status::Ok);
    assert!(f.message.starts_with("20000"), "{}", f.message);
    assert_eq!(
        sysctl_fix(&f),
        ("fs.nr_open".to_owned(), "110000".to_owned())
    );
}

#[test]
fn file_max() {
    let p = FakeProc::new("file-max");
    p.set("fs.file-max", "150000");
    p.set("fs.file-nr", "5000\t0\t150000");
    let plan = Plan::new(100_000, Role::Both);
    let all = p.check(&plan);
    let f = finding(&all, "fs.file-max");
    assert_eq!(f.status, Status::Stop);
    assert!(f.message.contains("5000 open already"), "{}", f.message);
    assert_eq!(
        sysctl_fix(f),
        ("fs.file-max".to_owned(), "260000".to_owned())
    );
    assert_eq!(sysctl_d(&all), "fs.file-max = 260000\n");

    // One side only: fits.
    assert_eq!(
        finding(&p.check(&Plan::new(100_000, Role::Server)), "fs.file-max").status,
        Status::Ok
    );

    let applied = apply(&all, p.root());
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].error, None);
    assert_eq!(p.get("fs.file-max"), "260000");
    assert_eq!(finding(&p.check(&plan), "fs.file-max").status, Status::Ok);
}

#[test]
fn local_ports_against_sources_and_target_ports() {
    let p = FakeProc::new("ports");
    p.set("net.ipv4.ip_local_port_range", "32768\t60999");
    let mut plan = Plan::new(100_000, Role::Client);
    let f = finding(&p.check(&plan), "local ports").clone();
    assert_eq!(f.status, Status::Stop);
    assert!(
        f.message
            .contains("28232 ephemeral ports (32768-60999) × 1 source"),
        "{}",
        f.message
    );
    // 90% of 28232 (25408) per source fits; the fix aims at 45% (12704),
    // where connect() stays cheap: 100,000 take 8.
    assert_eq!(
        f.fixes[0].line(),
        "throng hold ws://127.0.0.1:8080/news --connections 100000 --source-ips 127.0.0.2-127.0.0.9",
        "{:?}",
        f.fixes
    );
    assert!(f.fixes.contains(&Fix::Sysctl {
        name: "net.ipv4.ip_local_port_range".into(),
        value: "1024 65535".into()
    }));
    let lines: Vec<String> = f.fixes.iter().map(Fix::line).collect();
    assert!(
        lines.contains(&"throng serve --listen 127.0.0.1:8080-8087".to_owned())
            && lines.contains(
                &"throng hold ws://127.0.0.1:8080-8087/news --connections 100000".to_owned()
            ),
        "{lines:?}"
    );

    // 4 pairs fit (25,000 each, under 90%) but connect past half the range:
    // a warning with the cheap layout; 8 pairs are fine.
    plan.source_ips = 4;
    let f = finding(&p.check(&plan), "local ports").clone();
    assert_eq!(f.status, Status::Warn, "{f:#?}");
    assert_eq!(
        f.fixes[0].line(),
        "throng hold ws://127.0.0.1:8080/news --connections 100000 --source-ips 127.0.0.2-127.0.0.9"
    );
    assert!(f.notes[0].contains("over 45% of the range"), "{f:#?}");
    plan.source_ips = 8;
    assert_eq!(finding(&p.check(&plan), "local ports").status, Status::Ok);
    plan.source_ips = 4;
    plan.target_ports = 2;
    assert_eq!(finding(&p.check(&plan), "local ports").status, Status::Ok);

    // A server does not use local ports.
    assert!(
        p.check(&Plan::new(100_000, Role::Server))
            .iter()
            .all(|f| f.check != "local ports")
    );

    let all = p.check(&Plan::new(100_000, Role::Client));
    apply(&all, p.root());
    assert_eq!(p.get("net.ipv4.ip_local_port_range"), "1024 65535");
    // 64,512 ports: 50,000 fit on one pair but past half of them; 29,000 not.
    assert_eq!(
        finding(&p.check(&Plan::new(50_000, Role::Client)), "local ports").status,
        Status::Warn
    );
    assert_eq!(
        finding(&p.check(&Plan::new(29_000, Role::Client)), "local ports").status,
        Status::Ok
    );
}

#[test]
fn listen_backlogs() {
    let p = FakeProc::new("backlog");
    p.set("net.core.somaxconn", "128");
    p.set("net.ipv4.tcp_max_syn_backlog", "512");
    p.set("net.ipv4.tcp_syncookies", "0");
    let all = p.check(&Plan::new(1_000, Role::Server));
    for name in ["net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog"] {
        let f = finding(&all, name);
        assert_eq!(f.status, Status::Warn, "{f:#?}");
        assert_eq!(sysctl_fix(f), (name.to_owned(), "65535".to_owned()));
    }
    // With syncookies on, a short SYN queue does not stall anyone.
    p.set("net.ipv4.tcp_syncookies", "1");
    let f = finding(
        &p.check(&Plan::new(1_000, Role::Server)),
        "net.ipv4.tcp_max_syn_backlog",
    )
    .clone();
    assert_eq!(f.status, Status::Ok, "{f:#?}");
    assert!(f.message.contains("syncookies"));
    p.set("net.ipv4.tcp_syncookies", "0");
    assert!(
        p.check(&Plan::new(1_000, Role::Client))
            .iter()
            .all(|f| !f.check.contains("backlog") && !f.check.contains("somaxconn"))
    );
    apply(&all, p.root());
    assert_eq!(p.get("net.core.somaxconn"), "65535");
    assert_eq!(p.get("net.ipv4.tcp_max_syn_backlog"), "65535");
}

#[test]
fn tcp_mem() {
    let p = FakeProc::new("tcp-mem");
    p.set("net.ipv4.tcp_mem", "100000\t150000\t200000");
    let f = finding(&p.check(&Plan::new(90_000, Role::Both)), "net.ipv4.tcp_mem").clone();
    assert_eq!(f.status, Status::Warn, "{f:#?}");
    let f = finding(
        &p.check(&Plan::new(500_000, Role::Both)),
        "net.ipv4.tcp_mem",
    )
    .clone();
    assert_eq!(f.status, Status::Stop, "{f:#?}");
    assert!(f.message.contains("TCP: out of memory"));
    assert_eq!(
        sysctl_fix(&f),
        (
            "net.ipv4.tcp_mem".to_owned(),
            "650000 1300000 2000000".to_owned()
        )
    );
    assert_eq!(
        finding(&p.check(&Plan::new(50_000, Role::Both)), "net.ipv4.tcp_mem").status,
        Status::Ok
    );
}

#[test]
fn tcp_connection_table() {
    let p = FakeProc::new("tcp-table");
    // A namespace sharing the host's table says so with a negative size.
    p.set("net.ipv4.tcp_ehash_entries", "-262144");
    let ok = finding(
        &p.check(&Plan::new(100_000, Role::Both)),
        "TCP connection table",
    )
    .clone();
    assert_eq!(ok.status, Status::Ok, "{ok:#?}");
    assert!(ok.message.contains("262144 buckets"), "{ok:#?}");
    // Two million sockets: chains of 7.6. Before Linux 6.1 only the boot
    // parameter can help.
    let old = finding(
        &p.check(&Plan::new(1_000_000, Role::Both)),
        "TCP connection table",
    )
    .clone();
    assert_eq!(old.status, Status::Warn, "{old:#?}");
    assert!(old.message.contains("chains of 7.6"), "{old:#?}");
    assert!(old.fixes.is_empty(), "{old:#?}");
    assert!(
        old.notes
            .iter()
            .any(|n| n.contains("thash_entries=2097152"))
    );
    p.set("net.ipv4.tcp_child_ehash_entries", "0");
    let f = finding(
        &p.check(&Plan::new(1_000_000, Role::Both)),
        "TCP connection table",
    )
    .clone();
    assert_eq!(
        sysctl_fix(&f),
        (
            "net.ipv4.tcp_child_ehash_entries".to_owned(),
            "2097152".to_owned()
        )
    );
    assert!(
        f.fixes.iter().any(|x| x.line().contains("ip netns add")),
        "{f:#?}"
    );
    // One side only (a server): half the sockets, chains of 3.8, still past 2.
    let server = finding(
        &p.check(&Plan::new(1_000_000, Role::Server)),
        "TCP connection table",
    )
    .clone();
    assert_eq!(server.status, Status::Warn, "{server:#?}");
    assert_eq!(
        finding(
            &p.check(&Plan::new(500_000, Role::Server)),
            "TCP connection table"
        )
        .status,
        Status::Ok
    );
}

#[test]
fn conntrack_when_loaded() {
    let p = FakeProc::new("conntrack");
    p.set("net.netfilter.nf_conntrack_max", "65536");
    p.set("net.netfilter.nf_conntrack_count", "1000");
    let all = p.check(&Plan::new(100_000, Role::Both));
    let f = finding(&all, "conntrack");
    assert_eq!(f.status, Status::Stop);
    assert!(f.message.contains("table full"));
    assert_eq!(
        sysctl_fix(f),
        (
            "net.netfilter.nf_conntrack_max".to_owned(),
            "130000".to_owned()
        )
    );
    assert!(f.fixes.iter().any(|x| x.line().contains("hashsize")));
    assert_eq!(
        finding(&p.check(&Plan::new(60_000, Role::Both)), "conntrack").status,
        Status::Ok
    );
}

#[test]
fn memory_and_the_oom_killer() {
    let p = FakeProc::new("memory");
    p.meminfo(1 << 30);
    // 4.5 KiB per socket × 2 sides: 1 GiB holds ~116k connections.
    let f = finding(&p.check(&Plan::new(200_000, Role::Both)), "memory").clone();
    assert_eq!(f.status, Status::Stop);
    assert!(f.message.contains("OOM killer"), "{}", f.message);
    // Both sides here, one source address given: the hold that fits
    // spreads over enough of them for the local ports.
    assert_eq!(
        f.fixes[0].line(),
        "throng hold ws://127.0.0.1:8080/news --connections 93206 --source-ips 127.0.0.2-127.0.0.5",
        "{:?}",
        f.fixes
    );
    // On bench's plan, the fix is a smaller bench.
    let bench = Plan {
        bench: true,
        ..Plan::new(200_000, Role::Both)
    };
    assert_eq!(
        finding(&p.check(&bench), "memory").fixes[0].line(),
        "throng bench --connections 93206"
    );
    let f = finding(&p.check(&Plan::new(100_000, Role::Both)), "memory").clone();
    assert_eq!(f.status, Status::Warn, "{f:#?}");
    assert_eq!(
        finding(&p.check(&Plan::new(50_000, Role::Both)), "memory").status,
        Status::Ok
    );
    // The per-socket cost is the plan's, not fixed.
    let mut lean = Plan::new(200_000, Role::Both);
    lean.kernel_bytes_per_socket = 1024;
    lean.user_bytes_per_socket = 512;
    assert_eq!(finding(&p.check(&lean), "memory").status, Status::Ok);
}

#[test]
fn apply_reports_what_it_could_not_write() {
    let p = FakeProc::new("apply-fail");
    p.set("fs.file-max", "10");
    let all = p.check(&Plan::new(100, Role::Client));
    // Make the setting unwritable: a directory where the file should be.
    std::fs::remove_file(p.root().join("sys/fs/file-max")).unwrap();
    std::fs::create_dir(p.root().join("sys/fs/file-max")).unwrap();
    let applied = apply(&all, p.root());
    assert_eq!(applied.len(), 1);
    assert!(
        applied[0].error.as_deref().unwrap().contains("fs.file-max"),
        "{applied:?}"
    );
}

#[test]
fn start_up_warnings_are_one_line_each_worst_first() {
    let p = FakeProc::new("warnings");
    p.set("net.core.somaxconn", "128");
    p.set("net.ipv4.ip_local_port_range", "32768\t60999");
    let lines = warning_lines(&p.check(&Plan::new(100_000, Role::Both)));
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].starts_with("will stop the run: local ports: "),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("(fix: throng hold ws://127.0.0.1:8080/news --connections 100000 --source-ips 127.0.0.2-127.0.0.9;"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("warning: net.core.somaxconn: 128"),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].ends_with("(fix: sysctl -w net.core.somaxconn=65535; see 'throng doctor')"),
        "{}",
        lines[1]
    );
    assert!(lines.iter().all(|l| !l.contains('\n')));
    // This machine: the same lines as checking it by hand.
    let plan = Plan::new(10, Role::Server);
    let by_hand = warning_lines(&check_machine(&plan, &HostLimits::read(Path::new("/proc"))));
    assert_eq!(warnings(&plan), by_hand);
}
