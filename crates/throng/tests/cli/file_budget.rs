//! The file budget counts listening sockets: 1,001 ports under a limit of
//! 1,300 open files leave a worker 235 subscribers, and the next upgrade
//! gets 503 where it used to meet `EMFILE` at accept.

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};

use throng_testkit::process::command;

use crate::THRONG;

/// `throng serve` on 1,001 ports from `base` under `prlimit --nofile=1300`,
/// or why it did not start (a port of the range taken, most likely).
fn start(base: u16, args: &[&str]) -> Result<(Child, serde_json::Value), String> {
    let range = format!("127.0.0.1:{base}-{}", base + 1000);
    let mut child = command("prlimit")
        .args([
            "--nofile=1300:1300",
            THRONG,
            "serve",
            "--json",
            "--listen",
            &range,
        ])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start prlimit throng serve");
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    match serde_json::from_str(&line) {
        Ok(start) => Ok((child, start)),
        Err(_) => {
            let _ = child.kill();
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            let _ = child.wait();
            Err(format!("{range}: {err}"))
        }
    }
}

/// Upgrades to `news` on `addr`: the status.
fn subscribe(addr: SocketAddr) -> (u16, Option<throng_testkit::ws::Sub>) {
    throng_testkit::ws::upgrade_status(
        TcpStream::connect(addr).unwrap(),
        &format!("ws://{addr}/news"),
    )
}

#[test]
fn a_thousand_and_one_ports_answer_503_before_emfile() {
    // Ranges below Linux's default ephemeral ports (32768 on), where no
    // outgoing connection of another test takes one.
    let mut why = Vec::new();
    let Some((mut child, start)) = (10_000..=30_000).step_by(2_000).find_map(|base| {
        start(base, &["--workers", "1"])
            .map_err(|e| why.push(e))
            .ok()
    }) else {
        panic!("no free range of 1,001 ports:\n{}", why.join("\n"));
    };
    let per_worker = start["connections_per_worker"].as_u64().unwrap();
    assert_eq!(per_worker, 1300 - 64 - 1001, "{start}");
    let ports: Vec<SocketAddr> = start["listen"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().parse().unwrap())
        .collect();
    throng_testkit::wait_until("the worker listens", || {
        throng_testkit::http::healthy(ports[0])
    });
    let mut held = Vec::new();
    let mut refused = 0;
    for (i, addr) in ports
        .iter()
        .cycle()
        .take(per_worker as usize + 10)
        .enumerate()
    {
        match subscribe(*addr) {
            (101, ws) => held.extend(ws),
            (503, _) => refused += 1,
            (other, _) => panic!("subscriber {i}: {other}"),
        }
    }
    assert_eq!(held.len() as u64, per_worker);
    assert_eq!(refused, 10);
    let metrics = throng_testkit::http::get(ports[1], "/metrics").1;
    assert!(!metrics.contains("reason=\"accept_error\""), "{metrics}");
    drop(held);
    let _ = child.kill();
    let _ = child.wait();
}
