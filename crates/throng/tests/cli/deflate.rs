//! permessage-deflate (`--ws-deflate`) end to end: real peers that
//! negotiate it (Python `websockets`, Node `ws`), a raw client that checks
//! RSV1 on the wire, a plain subscriber of the same fan-out, and bad input.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::time::Duration;

use throng_proto::deflate::{Deflater, RSV1};
use throng_proto::ws::{self, OpCode};
use throng_testkit::http::publish_ok;
use throng_testkit::ws::{Got, next_frame};
use throng_testkit::{Peer, peers, require};

use crate::serve;

/// A raw WebSocket upgrade to `target`, offering `ext` when given; the
/// socket, the answer's head and what came behind it.
fn upgrade(addr: SocketAddr, target: &str, ext: Option<&str>) -> (TcpStream, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("read timeout");
    let key = ws::client_key([3; 16]);
    let mut req = format!(
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    );
    if let Some(e) = ext {
        req.push_str(&format!("Sec-WebSocket-Extensions: {e}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("send the upgrade");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).expect("read the answer");
        assert!(n > 0, "closed during upgrade");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).into_owned();
            assert!(head.starts_with("HTTP/1.1 101"), "{head}");
            return (s, head, buf[i + 4..].to_vec());
        }
    }
}

/// The next whole frame's raw bytes (header unmasked: a server's).
fn raw_frame(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<u8> {
    let mut chunk = [0u8; 8192];
    loop {
        if buf.len() >= 2 {
            let (at, len) = match buf[1] & 0x7F {
                126 if buf.len() >= 4 => (4, usize::from(u16::from_be_bytes([buf[2], buf[3]]))),
                127 if buf.len() >= 10 => {
                    let mut be = [0u8; 8];
                    be.copy_from_slice(&buf[2..10]);
                    (10, u64::from_be_bytes(be) as usize)
                }
                126 | 127 => (usize::MAX, 0),
                n => (2, usize::from(n)),
            };
            if at != usize::MAX && buf.len() >= at + len {
                return buf.drain(..at + len).collect();
            }
        }
        let n = s.read(&mut chunk).expect("read a frame");
        assert!(n > 0, "closed before a whole frame");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A compressible JSON message of about 1 KB.
fn json_1k() -> Vec<u8> {
    let items: Vec<String> = (0..14)
        .map(|i| format!(r#"{{"id":{i},"user":"ada","event":"click","page":"/home"}}"#))
        .collect();
    format!(r#"{{"items":[{}]}}"#, items.join(",")).into_bytes()
}

#[test]
fn peers_that_negotiate_get_one_compressed_frame_others_get_todays() {
    require!(Peer::PythonWebsockets, Peer::NodeWs);
    let server = serve(&["--workers", "1", "--ws-deflate", "--ws-deflate-min", "64"]);
    let body = json_1k();
    let mut py = peers::python("deflate_sub.py")
        .arg(format!("ws://{}", server.addr))
        .arg("2")
        .arg("dz")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start deflate_sub.py");
    let mut py_out = BufReader::new(py.stdout.take().expect("stdout"));
    let mut line = String::new();
    py_out.read_line(&mut line).expect("read");
    let ext: serde_json::Value = serde_json::from_str(&line).expect("json");
    assert_eq!(
        ext["extensions"],
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
    );
    line.clear();
    py_out.read_line(&mut line).expect("read");
    assert_eq!(
        line.trim(),
        "ready",
        "the compressed subscribe was answered"
    );
    let mut node: Child = peers::node("serve_sub.mjs")
        .arg(format!("ws://{}/dz", server.addr))
        .arg("2")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start serve_sub.mjs");
    let mut node_out = BufReader::new(node.stdout.take().expect("stdout"));
    line.clear();
    node_out.read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "ready");
    let offer = "permessage-deflate; client_max_window_bits";
    let (mut z, head, mut zbuf) = upgrade(server.addr, "/dz", Some(offer));
    assert!(head.contains("Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover"), "{head}");
    let (mut plain, head, mut pbuf) = upgrade(server.addr, "/dz", None);
    assert!(!head.contains("Sec-WebSocket-Extensions"), "{head}");
    // A server window under 15 bits cannot be kept: declined, not broken.
    let (_small, head, _) = upgrade(
        server.addr,
        "/dz",
        Some("permessage-deflate; server_max_window_bits=10"),
    );
    assert!(!head.contains("Sec-WebSocket-Extensions"), "{head}");
    server.wait_metric("throng_connections_open", |v| v == 5.0);

    assert_eq!(publish_ok(server.addr, "dz", &body, None), 5);
    assert_eq!(publish_ok(server.addr, "dz", b"short", None), 5);

    // On the wire: compressed (RSV1) for the 1 KB message, not for the short one.
    let f = raw_frame(&mut z, &mut zbuf);
    assert_eq!(f[0], 0x80 | RSV1 | 0x1, "a compressed text frame");
    assert!(
        f.len() < body.len() / 2,
        "{} bytes for {}",
        f.len(),
        body.len()
    );
    let mut dec = ws::Decoder::new(ws::Role::Client, 1 << 20);
    dec.set_deflate(true);
    let mut again = f;
    match dec.decode(&mut again).expect("valid") {
        Some(ws::Decoded {
            frame: Some(ws::Frame::Text(t)),
            ..
        }) => assert_eq!(t, &body[..]),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        raw_frame(&mut z, &mut zbuf),
        ws::server_frame(OpCode::Text, b"short")
    );
    // Counted: the 1 KB message to the three that negotiated, not the short one.
    server.wait_metric("throng_frames_deflated_total", |v| v == 3.0);
    assert_eq!(
        raw_frame(&mut plain, &mut pbuf),
        ws::server_frame(OpCode::Text, &body)
    );

    // The peers inflated the same: bare on `/dz` (node), with the channel
    // and id on a connection of several (python).
    for (name, out, child) in [
        ("python", &mut py_out, &mut py),
        ("node", &mut node_out, &mut node),
    ] {
        let lines: Vec<String> = out.lines().map(Result::unwrap).collect();
        assert!(child.wait().expect("wait").success(), "{name}: {lines:?}");
        assert_eq!(lines.len(), 3, "{name}: {lines:?}");
        for (line, want) in lines.iter().zip([&body[..], b"short"]) {
            let v: serde_json::Value = serde_json::from_str(line).expect("json");
            let got = unhex(v["hex"].as_str().expect("hex"));
            if name == "node" {
                assert_eq!(got, want, "{name}");
            } else {
                assert!(
                    got.starts_with(b"dz\n") && got.ends_with(want),
                    "{name}: {line}"
                );
            }
        }
        assert!(lines[2].contains("1000"), "{name}: {lines:?}");
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn rsv1_without_negotiation_is_1002_and_a_bomb_is_1009() {
    let server = serve(&["--workers", "1", "--ws-deflate"]);
    // Not negotiated: RSV1 is a protocol error.
    let (mut s, _, mut buf) = upgrade(server.addr, "/c", None);
    let mut f = Vec::new();
    ws::encode_into(&mut f, true, OpCode::Text, b"hi", Some([1, 2, 3, 4]));
    f[0] |= RSV1;
    s.write_all(&f).expect("send");
    let mut dec = ws::Decoder::new(ws::Role::Client, 1 << 20);
    assert_eq!(
        next_frame(&mut s, &mut buf, &mut dec),
        Got::Close(Some(1002))
    );
    // Negotiated: 256 KiB of zeros in about a kilobyte, past the 4 KiB a
    // subscriber may send: cut off at the limit, 1009.
    let (mut s, _, mut buf) = upgrade(server.addr, "/c", Some("permessage-deflate"));
    let bomb = Deflater::new().compress(&vec![0u8; 256 << 10]);
    assert!(bomb.len() < 4096, "{}", bomb.len());
    let mut f = Vec::new();
    ws::encode_into(&mut f, true, OpCode::Binary, &bomb, Some([1, 2, 3, 4]));
    f[0] |= RSV1;
    s.write_all(&f).expect("send");
    let mut dec = ws::Decoder::new(ws::Role::Client, 1 << 20);
    dec.set_deflate(true);
    assert_eq!(
        next_frame(&mut s, &mut buf, &mut dec),
        Got::Close(Some(1009))
    );
    // A compressed ping-sized message within the limit is fine: the
    // connection stays and still gets what is published.
    let (mut s, _, mut buf) = upgrade(server.addr, "/c", Some("permessage-deflate"));
    let mut f = Vec::new();
    let small = Deflater::new().compress(b"hello");
    ws::encode_into(&mut f, true, OpCode::Text, &small, Some([1, 2, 3, 4]));
    f[0] |= RSV1;
    s.write_all(&f).expect("send");
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    assert_eq!(publish_ok(server.addr, "c", b"after", None), 1);
    let mut dec = ws::Decoder::new(ws::Role::Client, 1 << 20);
    dec.set_deflate(true);
    assert_eq!(
        next_frame(&mut s, &mut buf, &mut dec),
        Got::Text(b"after".to_vec())
    );
}
