//! Missing nothing: message ids, `--history`, `throng.v1` subscribers that
//! rejoin with `?since=`, and Server-Sent Events read by an independent
//! client (Node's `eventsource`) that is cut off mid-stream by a real TCP
//! relay and reconnects by itself with `Last-Event-ID`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdout, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use throng_testkit::http::{publish, raw};
use throng_testkit::{Peer, peers, require};

use tungstenite::Message;
use tungstenite::client::IntoClientRequest;

use crate::serve;

/// Publishes `body` and returns the id the server answered with.
fn publish_id(addr: SocketAddr, channel: &str, body: &[u8], ctype: Option<&str>) -> String {
    let (status, reply) = publish(addr, channel, body, ctype);
    assert_eq!(status, 200, "{reply}");
    let v: Value = serde_json::from_str(&reply).expect("a JSON answer");
    v["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {reply}"))
        .to_owned()
}

type Sub = tungstenite::WebSocket<TcpStream>;

/// A `throng.v1` subscriber of `channel`, after `since` when given.
pub(crate) fn subscribe_v1(addr: SocketAddr, channel: &str, since: Option<&str>) -> Sub {
    let query = since.map_or(String::new(), |s| format!("?since={s}"));
    let mut req = format!("ws://{addr}/{channel}{query}")
        .into_client_request()
        .expect("a request");
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "throng.v1".parse().expect("a header value"),
    );
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let (ws, resp) = tungstenite::client(req, s).expect("upgrade");
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .map(|v| v.as_bytes()),
        Some(&b"throng.v1"[..])
    );
    ws
}

/// The next data frame as `(first line, rest)`.
fn next(ws: &mut Sub) -> (String, Vec<u8>) {
    loop {
        let data = match ws.read().expect("a frame") {
            Message::Text(t) => t.as_bytes().to_vec(),
            Message::Binary(b) => b.to_vec(),
            _ => continue,
        };
        let nl = data.iter().position(|&b| b == b'\n').expect("id\\npayload");
        return (
            String::from_utf8(data[..nl].to_vec()).expect("UTF-8 head"),
            data[nl + 1..].to_vec(),
        );
    }
}

#[test]
fn a_v1_subscriber_rejoins_after_its_last_id_and_an_old_id_gets_the_marker() {
    let server = serve(&["--history", "3", "--workers", "2"]);
    let addr = server.addr;
    let mut ws = subscribe_v1(addr, "news", None);
    let first = publish_id(addr, "news", b"one", None);
    let second = publish_id(addr, "news", &[0, 1, 2], Some("application/octet-stream"));
    assert_eq!(next(&mut ws), (first.clone(), b"one".to_vec()));
    assert_eq!(next(&mut ws), (second.clone(), vec![0, 1, 2]));
    drop(ws);
    let third = publish_id(addr, "news", b"three", None);
    let fourth = publish_id(addr, "news", b"four", None);
    let mut ws = subscribe_v1(addr, "news", Some(&second));
    assert_eq!(next(&mut ws), (third, b"three".to_vec()));
    assert_eq!(next(&mut ws), (fourth, b"four".to_vec()));
    let fifth = publish_id(addr, "news", b"five", None);
    assert_eq!(
        next(&mut ws),
        (fifth.clone(), b"five".to_vec()),
        "then live"
    );
    // `first` was pushed out by --history 3: the marker, then what is kept.
    let mut old = subscribe_v1(addr, "news", Some(&first));
    assert_eq!(next(&mut old), ("!incomplete".into(), first.into_bytes()));
    let kept: Vec<String> = (0..3).map(|_| next(&mut old).0).collect();
    assert_eq!(kept.last(), Some(&fifth));
    // An id from the future, or from an epoch before this server: the marker.
    let (epoch, _) = fifth.split_once('-').expect("EPOCH-SEQ");
    for since in [format!("{epoch}-999999"), "1-1".to_owned()] {
        let mut ws = subscribe_v1(addr, "news", Some(&since));
        assert_eq!(next(&mut ws).0, "!incomplete", "{since}");
    }
    let metrics = throng_testkit::http::get(addr, "/metrics").1;
    for sample in [
        "throng_history_messages 3",
        "throng_history_dropped_total{reason=\"count\"} 2",
        "throng_recoveries_total{result=\"complete\"} 1",
        "throng_recoveries_total{result=\"incomplete\"} 3",
    ] {
        assert!(metrics.contains(sample), "{sample} in:\n{metrics}");
    }
}

#[test]
fn bad_ids_and_since_without_ids_on_the_wire_are_a_clear_400() {
    let server = serve(&["--history", "10"]);
    let addr = server.addr;
    let upgrade = |target: &str, extra: &str| {
        format!(
            "GET {target} HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
        )
    };
    let v1 = "Sec-WebSocket-Protocol: throng.v1\r\n";
    for (req, says) in [
        (upgrade("/news?since=yesterday", v1), "not a message id"),
        (upgrade("/news?since=1-2-3", v1), "not a message id"),
        (
            upgrade("/news?since=99999999999999999999999-1", v1),
            "not a message id",
        ),
        (upgrade("/news?since=1-2", ""), "throng.v1"),
        (
            "GET /sse/news HTTP/1.1\r\nHost: t\r\nLast-Event-ID: nope\r\n\r\n".to_owned(),
            "not a message id",
        ),
    ] {
        let (status, _, body) = raw(addr, req.as_bytes());
        assert_eq!(status, 400, "{req}: {body}");
        assert!(body.contains(says), "{req}: {body}");
    }
    server.wait_metric(
        "throng_handshake_failures_total{reason=\"bad_since\"}",
        |v| v >= 5.0,
    );
    // The server is still there.
    assert_eq!(throng_testkit::http::get(addr, "/healthz").0, 200);
}

/// A TCP relay the test can cut, as a network drop would: every
/// connection through it so far is shut down at once, both ways.
struct Relay {
    addr: SocketAddr,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    fn to(target: SocketAddr) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let open = Arc::new(Mutex::new(Vec::new()));
        let list = open.clone();
        std::thread::spawn(move || {
            for client in l.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                for s in [&client, &server] {
                    list.lock()
                        .expect("lock")
                        .push(s.try_clone().expect("clone"));
                }
                for (mut from, mut to) in [
                    (
                        client.try_clone().expect("clone"),
                        server.try_clone().expect("clone"),
                    ),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Self { addr, open }
    }

    fn cut(&self) {
        for s in self.open.lock().expect("lock").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Node's `eventsource` on `url`, until it has seen `want` messages.
fn eventsource(url: &str, want: usize) -> (Child, BufReader<ChildStdout>) {
    let mut child = peers::node("sse_sub.mjs")
        .args([url, &want.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start node");
    let out = BufReader::new(child.stdout.take().expect("piped"));
    (child, out)
}

fn line(out: &mut BufReader<ChildStdout>) -> Value {
    let mut l = String::new();
    out.read_line(&mut l).expect("read the client");
    serde_json::from_str(&l).unwrap_or_else(|e| panic!("client said {l:?}: {e}"))
}

/// The next message, skipping opens and errors (a reconnect's).
fn message(out: &mut BufReader<ChildStdout>) -> Value {
    loop {
        let v = line(out);
        if v.get("open").is_none() && v.get("error").is_none() {
            return v;
        }
    }
}

#[test]
fn an_eventsource_reads_lines_and_binary_is_cut_off_and_rejoins_with_last_event_id() {
    require!(Peer::NodeWs);
    let server = serve(&["--history", "100", "--ping-interval", "1s"]);
    let relay = Relay::to(server.addr);
    let (mut child, mut out) = eventsource(&format!("http://{}/sse/news", relay.addr), 7);
    assert_eq!(line(&mut out), serde_json::json!({"open": true}));
    let a = publish_id(server.addr, "news", b"two\nlines\r\nand\rmore", None);
    let b = publish_id(
        server.addr,
        "news",
        &[0xff, 0, 10],
        Some("application/octet-stream"),
    );
    let c = publish_id(server.addr, "news", b"", None);
    assert_eq!(
        message(&mut out),
        serde_json::json!({"id": a, "data": "two\nlines\nand\nmore"})
    );
    assert_eq!(
        message(&mut out),
        serde_json::json!({"id": b, "binary": "/wAK"})
    );
    assert_eq!(message(&mut out), serde_json::json!({"id": c, "data": ""}));
    // The network drops; three messages go by; the client comes back by itself.
    relay.cut();
    let missed: Vec<String> = (0..3)
        .map(|i| publish_id(server.addr, "news", format!("missed {i}").as_bytes(), None))
        .collect();
    for (i, id) in missed.iter().enumerate() {
        assert_eq!(
            message(&mut out),
            serde_json::json!({"id": id, "data": format!("missed {i}")}),
            "recovered in order, once"
        );
    }
    let live = publish_id(server.addr, "news", b"live", None);
    assert_eq!(
        message(&mut out),
        serde_json::json!({"id": live, "data": "live"})
    );
    assert!(child.wait().expect("node exits").success());
    assert_eq!(
        server.metric("throng_recoveries_total{result=\"complete\"}"),
        1.0
    );
}

#[test]
fn an_sse_subscriber_gets_keep_alive_comments_and_the_retry_hint() {
    let server = serve(&["--ping-interval", "300ms", "--idle-timeout", "600ms"]);
    let mut s = TcpStream::connect(server.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"GET /news HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\nOrigin: http://page.test\r\n\r\n")
        .expect("send");
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    // Past the idle timeout: an SSE client never speaks and is not closed.
    let until = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < until {
        let n = s.read(&mut chunk).expect("still open");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("Content-Type: text/event-stream"), "{text}");
    assert!(
        text.contains("Access-Control-Allow-Origin: http://page.test"),
        "{text}"
    );
    assert!(text.contains("\r\n\r\nretry: 2000\n\n"), "{text}");
    assert!(text.matches(":\n").count() >= 2, "keep-alives: {text}");
}

/// The page the browser test loads: both transports, each written as
/// docs/clients.md shows it, logging what it sees to the console.
const PAGE: &str = r#"<!doctype html><title>throng recovery</title><script>
const T = 'TARGET';
const log = (...a) => console.log(a.join(' '));
const es = new EventSource(`http://${T}/sse/b`);
es.onopen = () => log('open', 'sse');
es.onmessage = (e) => log('got', 'sse', e.lastEventId, e.data);
es.addEventListener('incomplete', (e) => log('incomplete', 'sse', e.data));
let last = null;
function connect() {
  const q = last ? `?since=${encodeURIComponent(last)}` : '';
  const ws = new WebSocket(`ws://${T}/b${q}`, ['throng.v1']);
  ws.onopen = () => log('open', 'ws');
  ws.onmessage = ({ data }) => {
    const i = data.indexOf('\n'), head = data.slice(0, i), body = data.slice(i + 1);
    if (head === '!incomplete') return log('incomplete', 'ws', body);
    last = head;
    log('got', 'ws', head, body);
  };
  ws.onclose = () => setTimeout(connect, 300);
}
connect();
</script>"#;

/// Serves `page` to every GET on a free port, from a thread.
pub(crate) fn page_server(page: String) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                page.len()
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(page.as_bytes());
        }
    });
    addr
}

/// What the page logged, one console line at a time, from Chromium's stderr.
fn console_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let err = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            // [..:INFO:CONSOLE:1] "got sse 1-2 m1", source: http://... (3)
            let Some(at) = l.find(":INFO:CONSOLE") else {
                continue;
            };
            let rest = &l[at..];
            let (Some(a), Some(b)) = (rest.find("] \""), rest.rfind("\", source:")) else {
                continue;
            };
            if tx.send(rest[a + 3..b].to_owned()).is_err() {
                return;
            }
        }
    });
    rx
}

/// What the page received per transport (SSE, then WebSocket): id and body.
type Seen = [Vec<(String, String)>; 2];

/// Kills a child when dropped (a browser left behind by a failed assertion).
struct Kill(Child);

/// A headless Chromium showing the page at `page`, and what it logs.
pub(crate) struct Browser {
    _kill: Kill,
    _profile: throng_testkit::TempDir,
    /// The page's console lines.
    pub(crate) console: std::sync::mpsc::Receiver<String>,
}

impl Browser {
    /// Opens `http://{page}/` with a scratch profile named after `name`.
    pub(crate) fn open(page: SocketAddr, name: &str) -> Self {
        let profile = throng_testkit::TempDir::new(name);
        let mut browser = peers::headless_chromium(&profile.file("profile"));
        browser
            .args(["--enable-logging=stderr", "--v=0"])
            .arg(format!("http://{page}/"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut kill = Kill(browser.spawn().expect("start chromium"));
        let console = console_lines(&mut kill.0);
        Self {
            _kill: kill,
            _profile: profile,
            console,
        }
    }
}

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_browser_cut_off_mid_stream_ends_with_every_message_once_in_order_over_sse_and_websocket() {
    require!(Peer::Chromium);
    let server = serve(&["--history", "100"]);
    let relay = Relay::to(server.addr);
    let page = page_server(PAGE.replace("TARGET", &relay.addr.to_string()));
    let browser = Browser::open(page, "history-browser");
    let console = &browser.console;
    let mut got: Seen = [Vec::new(), Vec::new()];
    let mut opens = 0;
    // Reads the console until `done` says so (30 s at most).
    let mut until = |got: &mut Seen, done: &dyn Fn(&Seen, usize) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !done(got, opens) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = console
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the page stalled: {got:?}, {opens} opens"));
            let words: Vec<&str> = line.splitn(4, ' ').collect();
            match words[..] {
                ["open", _] => opens += 1,
                ["got", t, id, body] => {
                    got[usize::from(t == "ws")].push((id.to_owned(), body.to_owned()));
                }
                _ => panic!("the page said {line:?}"),
            }
        }
    };
    until(&mut got, &|_, opens| opens >= 2);
    let mut ids = Vec::new();
    let publish_some = |range: std::ops::RangeInclusive<u32>, ids: &mut Vec<(String, String)>| {
        for i in range {
            let body = format!("m{i}");
            ids.push((publish_id(server.addr, "b", body.as_bytes(), None), body));
        }
    };
    publish_some(1..=5, &mut ids);
    until(&mut got, &|g, _| g.iter().all(|t| t.len() >= 5));
    // The network drops; five messages go by; the page comes back by itself.
    relay.cut();
    publish_some(6..=10, &mut ids);
    until(&mut got, &|_, opens| opens >= 4);
    publish_some(11..=15, &mut ids);
    until(&mut got, &|g, _| g.iter().all(|t| t.len() >= 15));
    std::thread::sleep(Duration::from_millis(300));
    if let Ok(line) = console.try_recv() {
        panic!("more than every message: {line:?}");
    }
    assert_eq!(got[0], ids, "EventSource");
    assert_eq!(got[1], ids, "WebSocket throng.v1");
    server.wait_metric("throng_recoveries_total{result=\"complete\"}", |v| v >= 2.0);
}

#[test]
fn with_redis_the_history_is_a_stream_and_a_subscriber_rejoins_on_the_other_node() {
    require!(Peer::RedisServer, Peer::RedisCli);
    for mode in ["pattern", "channels"] {
        let redis = throng_testkit::redis::Redis::start(&[], &[]);
        let url = redis.url();
        let node = |extra: &[&str]| {
            let mut args = vec!["--redis", &url, "--redis-mode", mode, "--history", "50"];
            args.extend_from_slice(extra);
            let s = serve(&args);
            s.wait_broker("up");
            s
        };
        let (a, b) = (node(&[]), node(&["--history-ttl", "1h"]));
        let mut ws = subscribe_v1(a.addr, "room", None);
        if mode == "channels" {
            throng_testkit::wait_until("node A subscribed", || redis.numsub("throng:room") == 1);
        }
        let first = publish_id(b.addr, "room", b"one", None);
        assert_eq!(next(&mut ws), (first.clone(), b"one".to_vec()), "{mode}");
        drop(ws);
        // Published on both nodes while the subscriber is away; it comes
        // back to the other node, which never delivered any of it.
        let missed = [
            publish_id(a.addr, "room", b"two", None),
            publish_id(b.addr, "room", b"three", None),
        ];
        let mut ws = subscribe_v1(b.addr, "room", Some(&first));
        assert_eq!(
            next(&mut ws),
            (missed[0].clone(), b"two".to_vec()),
            "{mode}"
        );
        assert_eq!(
            next(&mut ws),
            (missed[1].clone(), b"three".to_vec()),
            "{mode}"
        );
        let live = publish_id(a.addr, "room", b"four", None);
        assert_eq!(next(&mut ws), (live, b"four".to_vec()), "{mode}: then live");
        b.wait_metric("throng_recoveries_total{result=\"complete\"}", |v| v == 1.0);
        // The stream is under the prefix, and holds what was published.
        assert_eq!(redis.cli(&["XLEN", "throng:room"]), ["4"], "{mode}");
        assert_eq!(
            redis.cli(&["XRANGE", "throng:room", "-", "+", "COUNT", "1"])[0],
            first,
            "{mode}: ids are the stream's"
        );
        assert!(
            !redis.cli(&["PTTL", "throng:room"])[0].starts_with('-'),
            "--history-ttl gives the stream an expiry"
        );
        // An id the stream never gave: the marker, then the live stream.
        let mut ws = subscribe_v1(a.addr, "room", Some("99999999999999-0"));
        assert_eq!(next(&mut ws).0, "!incomplete", "{mode}");
        let five = publish_id(b.addr, "room", b"five", None);
        assert_eq!(next(&mut ws).0, five, "{mode}");
        // Published by someone else, without an id: delivered all the same.
        let mut plain = subscribe_v1(a.addr, "other", None);
        if mode == "channels" {
            throng_testkit::wait_until("node A subscribed", || redis.numsub("throng:other") == 1);
        }
        redis.cli(&["PUBLISH", "throng:other", "raw"]);
        assert_eq!(next(&mut plain), (String::new(), b"raw".to_vec()), "{mode}");
    }
}

/// Publishes `n` messages (payloads `0..n`) on `channel` at `rate` per
/// second, spread over `nodes`.
fn publish_paced(nodes: &[SocketAddr], channel: &str, n: usize, rate: f64) {
    let start = std::time::Instant::now();
    for i in 0..n {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        let (status, reply) = publish(
            nodes[i % nodes.len()],
            channel,
            i.to_string().as_bytes(),
            None,
        );
        assert_eq!(status, 200, "{reply}");
    }
}

/// 1,000 subscribers, 200 messages a second, a third of them cut off at
/// random moments and back with their last id (on another node, when there
/// are two): each ends with every message once, in order.
fn recovery_under_load(nodes: &[SocketAddr]) {
    const SUBS: usize = 1000;
    const MESSAGES: usize = 1000;
    const RATE: f64 = 200.0;
    let urls: Vec<String> = nodes.iter().map(|a| format!("ws://{a}")).collect();
    let seconds = (MESSAGES as f64 / RATE).to_string();
    let mut child = peers::node("rejoin_load.mjs")
        .args([
            &urls.join(","),
            "load",
            &SUBS.to_string(),
            &MESSAGES.to_string(),
            &seconds,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start node");
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    assert_eq!(line(&mut out), serde_json::json!({"ready": true}));
    publish_paced(nodes, "load", MESSAGES, RATE);
    let summary = line(&mut out);
    assert!(child.wait().expect("node exits").success());
    assert_eq!(summary["ok"], true, "{summary}");
    assert!(summary["reconnects"].as_u64() >= Some(300), "{summary}");
}

#[test]
fn recovery_under_load_with_the_embedded_relay() {
    require!(Peer::NodeWs);
    let server = serve(&["--history", "2000"]);
    recovery_under_load(&[server.addr]);
    let complete = server.metric("throng_recoveries_total{result=\"complete\"}");
    assert!(complete >= 300.0, "{complete}");
}

#[test]
fn recovery_under_load_through_redis_on_two_nodes() {
    require!(Peer::NodeWs, Peer::RedisServer);
    let redis = throng_testkit::redis::Redis::start(&[], &[]);
    let url = redis.url();
    let node = || {
        let s = serve(&["--redis", &url, "--history", "2000", "--workers", "1"]);
        s.wait_broker("up");
        s
    };
    let (a, b) = (node(), node());
    recovery_under_load(&[a.addr, b.addr]);
}
