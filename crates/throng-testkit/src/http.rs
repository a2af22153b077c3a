//! Plain HTTP/1.1 to a server under test, by hand on a `TcpStream` with
//! throng-proto's parser: one request per connection, so every answer is
//! read to its end.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use throng_proto::http;

/// Sends raw bytes and reads until the server closes (or 10 s pass);
/// returns the status, the head and the body (status 0 and everything read
/// as the body when no response head came).
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> (u16, String, String) {
    try_raw(addr, bytes).unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// [`raw`], with a failed connect returned rather than a panic.
pub fn try_raw(addr: SocketAddr, bytes: &[u8]) -> std::io::Result<(u16, String, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let Ok(Some((resp, used))) = http::parse_response(&out, http::MAX_HEAD) else {
        return Ok((0, String::new(), String::from_utf8_lossy(&out).into_owned()));
    };
    let head = String::from_utf8_lossy(&out[..used]).into_owned();
    Ok((
        resp.status,
        head,
        String::from_utf8_lossy(&out[used..]).into_owned(),
    ))
}

/// Whether `GET /healthz` answers 200, on one connection (a readiness probe
/// that opens a second one can be refused by `--max-connections-per-ip 1`
/// while the first is still counted).
pub fn healthy(addr: SocketAddr) -> bool {
    let req = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    try_raw(addr, req).is_ok_and(|(status, _, _)| status == 200)
}

/// `GET path`; returns the status and the body.
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, _, body) = raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    (status, body)
}

/// `POST /publish/<channel>` with an optional `Content-Type`; returns the
/// status and the body.
pub fn publish(
    addr: SocketAddr,
    channel: &str,
    body: &[u8],
    content_type: Option<&str>,
) -> (u16, String) {
    let mut req = Vec::new();
    let host = addr.to_string();
    let mut headers: Vec<(&str, &[u8])> = vec![("Host", host.as_bytes()), ("Connection", b"close")];
    if let Some(ct) = content_type {
        headers.push(("Content-Type", ct.as_bytes()));
    }
    http::write_request(
        &mut req,
        "POST",
        &format!("/publish/{channel}"),
        &headers,
        body,
    );
    let (status, _, body) = raw(addr, &req);
    (status, body)
}

/// Publishes, expects 200, and returns the JSON answer's `field`
/// (`subscribers`, or `redis_receivers` on a node routing through Redis).
fn publish_counted(
    addr: SocketAddr,
    channel: &str,
    body: &[u8],
    ctype: Option<&str>,
    field: &str,
) -> u64 {
    let (status, reply) = publish(addr, channel, body, ctype);
    assert_eq!(status, 200, "{reply}");
    let v: serde_json::Value =
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("publish answer {reply:?}: {e}"));
    assert_eq!(v["channel"], channel);
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {reply}"))
}

/// Publishes and returns the subscriber count the server answers.
pub fn publish_ok(addr: SocketAddr, channel: &str, body: &[u8], content_type: Option<&str>) -> u64 {
    publish_counted(addr, channel, body, content_type, "subscribers")
}

/// Publishes through a node routing through Redis and returns the
/// `redis_receivers` it answers.
pub fn publish_redis(addr: SocketAddr, channel: &str, body: &str) -> u64 {
    publish_counted(addr, channel, body.as_bytes(), None, "redis_receivers")
}

/// The value of one sample (`name` with its labels, as printed) in a
/// Prometheus text page.
pub fn metric_in(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(sample) && l.as_bytes().get(sample.len()) == Some(&b' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}
