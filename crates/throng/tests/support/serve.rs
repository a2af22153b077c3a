//! Helpers for the `throng serve` tests: a real server process on a free
//! port, raw HTTP, /metrics polling, and WebSocket subscribers.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use throng_proto::{http, ws};

/// A running `throng serve` (supervisor and workers); SIGKILLed on drop
/// unless it was stopped.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    pub(crate) log: Arc<Mutex<String>>,
    /// The JSON start line (`tls_listen`, `config.tls.cert_pem`, ...).
    pub(crate) start: serde_json::Value,
}

impl Server {
    /// Starts `throng serve --listen 127.0.0.1:0 --json` plus `args`.
    pub(crate) fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_throng"))
            .args(["serve", "--listen", "127.0.0.1:0", "--json"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start throng serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let start: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("start line {line:?}: {e}"));
        let addr = start["listen"][0].as_str().unwrap().parse().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (err, sink) = (child.stderr.take().unwrap(), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let s = Self {
            child,
            addr,
            log,
            start,
        };
        // Workers bind after the supervisor reserved the port: wait until one answers.
        wait_until("a worker answers /healthz", || {
            TcpStream::connect(s.addr).is_ok() && get(s.addr, "/healthz").0 == 200
        });
        s
    }

    /// Sends a signal to the supervisor.
    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args(["-s", sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// The value of one /metrics sample (`name` with its labels, as printed).
    pub(crate) fn metric(&self, sample: &str) -> f64 {
        metric_in(&get(self.addr, "/metrics").1, sample)
            .unwrap_or_else(|| panic!("no sample {sample}"))
    }

    /// Waits until the sample satisfies `ok` (metrics are up to 0.5 s old).
    pub(crate) fn wait_metric(&self, sample: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let start = Instant::now();
        loop {
            // A request can meet a worker that was just killed (its
            // SO_REUSEPORT listener goes with it): no sample is "not yet".
            let last = metric_in(&get(self.addr, "/metrics").1, sample);
            if let Some(v) = last.filter(|&v| ok(v)) {
                return v;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "timed out waiting on {sample} (last value {last:?})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Worker pids from /metrics.
    pub(crate) fn worker_pids(&self) -> Vec<u32> {
        get(self.addr, "/metrics")
            .1
            .lines()
            .filter(|l| l.starts_with("throng_worker_rss_bytes{"))
            .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect()
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until /healthz says `broker: <state>` (a node routing through Redis).
    pub(crate) fn wait_broker(&self, state: &str) {
        let want = format!("broker: {state}");
        wait_until(&format!("{} to report '{want}'", self.addr), || {
            get(self.addr, "/healthz").1.contains(&want)
        });
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 20 ms for up to 15 s.
pub(crate) fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn metric_in(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(sample) && l.as_bytes().get(sample.len()) == Some(&b' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Sends raw bytes, reads until the server closes (or 10 s); returns status, head and body.
pub(crate) fn raw(addr: SocketAddr, bytes: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let Ok(Some((resp, used))) = http::parse_response(&out, http::MAX_HEAD) else {
        return (0, String::new(), String::from_utf8_lossy(&out).into_owned());
    };
    let head = String::from_utf8_lossy(&out[..used]).into_owned();
    (
        resp.status,
        head,
        String::from_utf8_lossy(&out[used..]).into_owned(),
    )
}

pub(crate) fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, _, body) = raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    (status, body)
}

/// `POST /publish/<channel>`; returns status and body.
pub(crate) fn publish(
    addr: SocketAddr,
    channel: &str,
    body: &[u8],
    ctype: Option<&str>,
) -> (u16, String) {
    let mut req = Vec::new();
    let host = addr.to_string();
    let mut headers: Vec<(&str, &[u8])> = vec![("Host", host.as_bytes()), ("Connection", b"close")];
    if let Some(ct) = ctype {
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

/// Publishes and returns the subscriber count from the JSON reply.
pub(crate) fn publish_ok(addr: SocketAddr, channel: &str, body: &[u8], ctype: Option<&str>) -> u64 {
    let (status, reply) = publish(addr, channel, body, ctype);
    assert_eq!(status, 200, "{reply}");
    let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(v["channel"], channel);
    v["subscribers"].as_u64().unwrap()
}

pub(crate) type Sub = tungstenite::WebSocket<TcpStream>;

/// A tungstenite subscriber on `/<channel>`.
pub(crate) fn subscribe(addr: SocketAddr, channel: &str) -> Sub {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let (ws, resp) = tungstenite::client(format!("ws://{addr}/{channel}"), s).expect("upgrade");
    assert_eq!(resp.status(), 101);
    ws
}

/// A raw upgraded socket (no client library), for sending broken frames.
pub(crate) fn raw_subscribe(addr: SocketAddr, channel: &str) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let key = ws::client_key([7; 16]);
    let mut req = Vec::new();
    ws::write_upgrade_request(&mut req, &addr.to_string(), &format!("/{channel}"), &key);
    s.write_all(&req).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed during upgrade");
        buf.extend_from_slice(&chunk[..n]);
        if let Some((resp, used)) = http::parse_response(&buf, http::MAX_HEAD).unwrap() {
            ws::client_verify(&resp, &key).unwrap();
            buf.drain(..used);
            return (s, buf);
        }
    }
}

/// One frame from the server as seen by a client.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Got {
    Text(Vec<u8>),
    Binary(Vec<u8>),
    Ping,
    Pong,
    Close(Option<u16>),
    Eof,
}

/// Reads the next frame from a raw socket (`buf` holds bytes already read).
pub(crate) fn next_frame(s: &mut TcpStream, buf: &mut Vec<u8>, dec: &mut ws::Decoder) -> Got {
    loop {
        if let Some(d) = dec.decode(&mut buf[..]).expect("server frames are valid") {
            let consumed = d.consumed;
            let got = match d.frame {
                Some(ws::Frame::Text(p)) => Some(Got::Text(p.to_vec())),
                Some(ws::Frame::Binary(p)) => Some(Got::Binary(p.to_vec())),
                Some(ws::Frame::Ping(_)) => Some(Got::Ping),
                Some(ws::Frame::Pong(_)) => Some(Got::Pong),
                Some(ws::Frame::Close { code, .. }) => Some(Got::Close(code)),
                None => None,
            };
            buf.drain(..consumed);
            if let Some(g) = got {
                return g;
            }
            continue;
        }
        let mut chunk = [0u8; 16 * 1024];
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return Got::Eof,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Masks and encodes a client frame.
pub(crate) fn client_frame(fin: bool, op: ws::OpCode, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ws::encode_into(&mut out, fin, op, payload, Some([1, 2, 3, 4]));
    out
}

/// The next data frame's text (pings are answered by tungstenite); a binary
/// frame comes back as `binary:<bytes>`, so a test expecting text fails on it.
pub(crate) fn next_text(s: &mut Sub) -> String {
    loop {
        match s.read().expect("subscriber stays connected") {
            tungstenite::Message::Text(t) => return t.to_string(),
            tungstenite::Message::Binary(b) => return format!("binary:{b:?}"),
            tungstenite::Message::Close(c) => panic!("subscriber closed: {c:?}"),
            _ => {}
        }
    }
}

/// Publishes through a node routing through Redis; the `redis_receivers`
/// its answer reports.
pub(crate) fn publish_redis(addr: SocketAddr, channel: &str, body: &str) -> u64 {
    let (status, reply) = publish(addr, channel, body.as_bytes(), None);
    assert_eq!(status, 200, "{reply}");
    let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(v["channel"], channel);
    v["redis_receivers"].as_u64().unwrap()
}

/// Reads up to the server's close frame and returns its code, then reads
/// until the connection ends cleanly (tungstenite answers the close; over
/// TLS an end without close_notify would be an error here, not
/// `ConnectionClosed`).
pub(crate) fn close_code_then_end<S: Read + Write>(
    s: &mut tungstenite::WebSocket<S>,
) -> Option<u16> {
    let code = loop {
        match s.read() {
            Ok(tungstenite::Message::Close(f)) => break f.map(|f| u16::from(f.code)),
            Ok(_) => {}
            Err(e) => panic!("expected a close frame: {e}"),
        }
    };
    loop {
        match s.read() {
            Err(tungstenite::Error::ConnectionClosed) => return code,
            Err(e) => panic!("after close: {e}"),
            Ok(_) => {}
        }
    }
}
