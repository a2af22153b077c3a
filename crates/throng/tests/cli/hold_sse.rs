//! `throng hold sse://…`: Server-Sent Events subscribers held like WebSocket
//! ones, against `throng serve` (plain and TLS) and against a listener of
//! this test that writes an event stream in every form the spec allows, or
//! answers what an event stream must not be.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use throng_testkit::TempDir;
use throng_testkit::json::count;

use crate::{run_json, serve};

/// Runs `throng hold --json --quiet` with `args`; returns the summary, the
/// exit code and stderr.
fn hold(args: &[&str]) -> (Value, i32, String) {
    let (code, summary, stderr) = run_json("hold", args);
    (summary, code, stderr)
}

/// Against `throng serve` with two workers, keep-alive comments every
/// 200 ms: every subscriber gets every message once and in order, and
/// stays open to the end.
#[test]
fn throng_serve_delivers_every_message_over_sse() {
    let server = serve(&["--workers", "2", "--ping-interval", "200ms"]);
    let (s, code, stderr) = hold(&[
        &format!("sse://{}/news", server.addr),
        "-c",
        "1000",
        "--rate",
        "4000/s",
        "-w",
        "2",
        "--duration",
        "2s",
        "--publish",
        &format!("http://{}/publish/news", server.addr),
        "--publish-rate",
        "5/s",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(count(&s, &["opened"]), 1000, "{s:#}\n{stderr}");
    let published = count(&s, &["published"]);
    assert!(published >= 5, "{s:#}");
    assert_eq!(count(&s, &["received"]), published * 1000, "{s:#}");
    for none in ["lost", "duplicated", "out_of_order", "foreign"] {
        assert_eq!(count(&s, &[none]), 0, "{none}: {s:#}");
    }
    assert_eq!(count(&s, &["delivery_us", "count"]), published * 1000);
    assert_eq!(count(&s, &["closed", "clean"]), 1000, "{s:#}");
}

/// `sses://` to `throng serve`'s TLS listener, its certificate trusted with
/// `--tls-ca`.
#[test]
fn sses_reads_the_stream_through_tls() {
    let (server, tls, pem) = crate::serve_tls::start(&["--workers", "1"]);
    let dir = TempDir::new("hold-sses");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pem).unwrap();
    let (s, code, stderr) = hold(&[
        &format!("sses://localhost:{}/news", tls.port()),
        "-c",
        "100",
        "--rate",
        "1000/s",
        "--tls-ca",
        ca.to_str().unwrap(),
        "--duration",
        "1500ms",
        "--publish",
        &format!("http://{}/publish/news", server.addr),
        "--publish-rate",
        "5/s",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(count(&s, &["opened"]), 100, "{s:#}\n{stderr}");
    assert_eq!(count(&s, &["tls_full"]), 100, "{s:#}");
    let published = count(&s, &["published"]);
    assert!(published >= 5, "{s:#}");
    assert_eq!(count(&s, &["received"]), published * 100, "{s:#}");
    assert_eq!(count(&s, &["lost"]), 0, "{s:#}");
    assert_eq!(count(&s, &["closed", "clean"]), 100, "{s:#}");
}

/// Standard base64 (padded), written here so the test does not lean on the
/// encoder of the code it checks.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `hold`'s message number `seq`, sent now.
fn message(seq: u64) -> String {
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("t1 {seq} {ns} ....")
}

/// A listener that answers each connection with `respond` on a thread of
/// its own, then reads until the client closes.
fn listener(respond: fn(&mut TcpStream, usize)) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for (i, conn) in l.incoming().enumerate() {
            let Ok(mut conn) = conn else { return };
            thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                if head.starts_with("get /feed ") && head.contains("accept: text/event-stream") {
                    respond(&mut conn, i);
                } else {
                    let _ =
                        conn.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
                }
                let mut sink = [0u8; 256];
                while conn.read(&mut sink).unwrap_or(0) > 0 {}
            });
        }
    });
    addr
}

/// The stream in pieces: CRLF and CR line ends, comments, `retry:`, a
/// field without a space, an event split across writes, a binary event in
/// base64, an event of another type, one not ours; and messages 1, 2, 2
/// again, 4, then 3 (one gap, one duplicate, one out of order).
fn every_form(conn: &mut TcpStream, _: usize) {
    let pieces = [
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\r\n".to_owned(),
        "retry: 2000\r\n\r\n: keep-alive\r\n".to_owned(),
        format!("id: 1\r\ndata:{}\r\n\r\n", message(1)),
        format!("id: 2\revent: message\rdata: {}", message(2)),
        "\r".to_owned(),
        "\r".to_owned(),
        format!(
            ":\nevent: binary\ndata: {}\n\n",
            base64(message(2).as_bytes())
        ),
        format!("event: tick\ndata: {}\n\n", message(4)),
        "data: not a message of hold's\n\n".to_owned(),
        format!("data: {}\n\n", message(3)),
    ];
    for piece in pieces {
        if conn.write_all(piece.as_bytes()).is_err() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Every event is read however the stream is cut and written, and counted
/// exactly as a WebSocket message would be.
#[test]
fn every_form_of_the_stream_is_read_and_counted() {
    let addr = listener(every_form);
    let (s, code, stderr) = hold(&[
        &format!("sse://{addr}/feed"),
        "-c",
        "10",
        "--rate",
        "100/s",
        "--duration",
        "1s",
        "--max-lost",
        "10",
    ]);
    assert_eq!(code, 0, "{stderr}\n{s:#}");
    assert_eq!(count(&s, &["opened"]), 10, "{s:#}\n{stderr}");
    assert_eq!(count(&s, &["received"]), 50, "{s:#}");
    assert_eq!(count(&s, &["foreign"]), 10, "{s:#}");
    assert_eq!(count(&s, &["duplicated"]), 10, "{s:#}");
    assert_eq!(count(&s, &["out_of_order"]), 10, "{s:#}");
    assert_eq!(count(&s, &["lost"]), 10, "{s:#}");
    assert_eq!(count(&s, &["closed", "clean"]), 10, "{s:#}");
}

/// What is not an event stream fails the connection, each under its kind.
fn not_a_stream(conn: &mut TcpStream, i: usize) {
    let answer = match i % 4 {
        0 => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_owned(),
        1 => "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nhello".to_owned(),
        2 => "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
              transfer-encoding: chunked\r\n\r\n"
            .to_owned(),
        _ => format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {}\n\n",
            message(1)
        ),
    };
    let _ = conn.write_all(answer.as_bytes());
}

#[test]
fn answers_that_are_not_an_event_stream_are_counted_by_kind() {
    let addr = listener(not_a_stream);
    let (s, code, stderr) = hold(&[
        &format!("sse://{addr}/feed"),
        "-c",
        "40",
        "--rate",
        "400/s",
        "--duration",
        "500ms",
        "--max-connect-errors",
        "30",
    ]);
    assert_eq!(code, 0, "{stderr}\n{s:#}");
    assert_eq!(count(&s, &["failed", "bad_status"]), 10, "{s:#}");
    assert_eq!(count(&s, &["failed", "bad_handshake"]), 20, "{s:#}");
    assert_eq!(count(&s, &["opened"]), 10, "{s:#}");
    assert_eq!(count(&s, &["received"]), 10, "{s:#}");
    assert!(
        stderr.contains("text/plain") || stderr.contains("chunked"),
        "the first error says what was wrong: {stderr}"
    );
}

/// `http://` is refused as a subscriber URL with the schemes that are.
#[test]
fn an_http_subscriber_url_names_the_sse_scheme() {
    let (s, code, stderr) = hold(&["http://127.0.0.1:9/news", "-c", "1"]);
    assert_ne!(code, 0, "{s:#}");
    assert!(stderr.contains("sse://"), "{stderr}");
}
