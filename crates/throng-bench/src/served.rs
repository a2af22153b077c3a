//! A `throng serve` a benchmark starts and drives from outside: started on
//! a free loopback port (its address read from the JSON start line), its
//! worker's pid (from `/metrics`), a process's CPU time, and one HTTP
//! request on a new connection.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use throng_proto::http;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Starts `<throng> serve --listen 127.0.0.1:0 --json` plus `args`; the
/// process and the address it listens on.
pub fn start(throng: &str, args: &[&str]) -> (Child, SocketAddr) {
    let mut server = Command::new(throng)
        .args(["serve", "--listen", "127.0.0.1:0", "--json"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start throng serve (build it with: cargo build --release -p throng)");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("start line");
    let start: serde_json::Value = serde_json::from_str(&line).expect("start line is JSON");
    let addr = start["listen"][0]
        .as_str()
        .expect("listen")
        .parse()
        .expect("addr");
    (server, addr)
}

/// The pid of the (first) worker of the server at `addr`.
pub async fn worker_pid(addr: SocketAddr) -> u32 {
    let (_, metrics) = request(addr, "GET", "/metrics", b"").await;
    String::from_utf8_lossy(&metrics)
        .lines()
        .find(|l| l.starts_with("throng_worker_rss_bytes{"))
        .and_then(|l| l.split("pid=\"").nth(1))
        .and_then(|r| r.split('"').next())
        .and_then(|p| p.parse().ok())
        .expect("worker pid in /metrics")
}

/// (utime + stime) of a process in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// One request on a new connection: the status and the body.
pub async fn request(addr: SocketAddr, method: &str, target: &str, body: &[u8]) -> (u16, Vec<u8>) {
    request_as(addr, method, target, body, None).await
}

/// A request with `Authorization: Bearer <token>` when a token is given.
pub async fn request_as(
    addr: SocketAddr,
    method: &str,
    target: &str,
    body: &[u8],
    token: Option<&str>,
) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.expect("connect for request");
    let mut out = Vec::new();
    let host = addr.to_string();
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &[u8])> = vec![("Host", host.as_bytes()), ("Connection", b"close")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_bytes()));
    }
    http::write_request(&mut out, method, target, &headers, body);
    s.write_all(&out).await.expect("write request");
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await.expect("read response");
    let (head, used) = http::parse_response(&resp, http::MAX_HEAD)
        .expect("response head")
        .expect("whole head");
    (head.status, resp[used..].to_vec())
}
