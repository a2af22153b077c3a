//! Several channels on one connection (docs/channels.md): a `throng.v1`
//! WebSocket at `/?channel=..` (tungstenite) that subscribes, unsubscribes,
//! recovers one channel and publishes in-band, an event stream of several
//! channels read off a raw socket, tokens from PyJWT that grant, refuse
//! and are refreshed in-band, and every kind of bad input answered while
//! the other subscribers go on.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{Value, json};
use throng_testkit::http::{get, publish};
use throng_testkit::jwt::Mint;
use throng_testkit::{Peer, require};
use tungstenite::Message;
use tungstenite::client::IntoClientRequest;

use crate::serve;

pub(crate) type Ws = tungstenite::WebSocket<TcpStream>;

/// A `throng.v1` connection to `target` (with `token` as a `bearer.`
/// subprotocol entry when given).
pub(crate) fn open(addr: SocketAddr, target: &str, token: Option<&str>) -> Ws {
    let mut req = format!("ws://{addr}{target}")
        .into_client_request()
        .expect("a request");
    let protocols = match token {
        Some(t) => format!("throng.v1, bearer.{t}"),
        None => "throng.v1".to_owned(),
    };
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        protocols.parse().expect("a header value"),
    );
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    tungstenite::client(req, s).expect("upgrade").0
}

/// The next text or binary frame, as text.
pub(crate) fn next(ws: &mut Ws) -> String {
    loop {
        match ws.read().expect("a frame") {
            Message::Text(t) => return t.as_str().to_owned(),
            Message::Binary(b) => return String::from_utf8_lossy(&b).into_owned(),
            _ => {}
        }
    }
}

/// The next frame, which must be an answer (JSON).
pub(crate) fn answer(ws: &mut Ws) -> Value {
    let t = next(ws);
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("not an answer: {t:?}: {e}"))
}

/// Sends request `v` and returns its answer.
pub(crate) fn ask(ws: &mut Ws, v: &Value) -> Value {
    ws.send(Message::text(v.to_string())).expect("send");
    answer(ws)
}

/// The next message as `(channel, id, payload)`.
pub(crate) fn message(ws: &mut Ws) -> (String, String, String) {
    let t = next(ws);
    let mut parts = t.splitn(3, '\n');
    let mut part = || {
        parts
            .next()
            .unwrap_or_else(|| panic!("not a message: {t:?}"))
    };
    (part().to_owned(), part().to_owned(), part().to_owned())
}

/// A server taking HS256 tokens, and tokens of `specs` from its key (the
/// mint keeps the key's file).
fn guarded(specs: &[Value]) -> (Mint, throng_testkit::Server, Vec<String>) {
    let mint = Mint::new();
    let secret = mint.key("hs256.key");
    let server = serve(&["--auth-hs256-secret-file", &secret]);
    let tokens = mint.tokens(specs);
    (mint, server, tokens)
}

/// Publishes `body` over HTTP and returns its id.
fn publish_id(addr: SocketAddr, channel: &str, body: &str) -> String {
    let (status, reply) = publish(addr, channel, body.as_bytes(), None);
    assert_eq!(status, 200, "{reply}");
    let v: Value = serde_json::from_str(&reply).expect("JSON");
    v["id"].as_str().expect("an id").to_owned()
}

/// The status line and body of a raw upgrade to `target`, with `extra` headers.
pub(crate) fn refused(addr: SocketAddr, target: &str, extra: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
    .expect("send");
    let mut all = String::new();
    let _ = std::io::Read::read_to_string(&mut s, &mut all);
    all
}

#[test]
fn one_socket_follows_several_channels_subscribes_recovers_and_publishes() {
    let server = serve(&[
        "--history",
        "10",
        "--workers",
        "2",
        "--max-channels-per-connection",
        "3",
        "--max-message",
        "1KiB",
    ]);
    let addr = server.addr;
    let mut many = open(addr, "/?channel=a&channel=b", None);
    let mut one = crate::history::subscribe_v1(addr, "a", None);
    server.wait_metric("throng_connections_open", |v| v == 2.0);
    let id = publish_id(addr, "a", "hello");
    assert_eq!(message(&mut many), ("a".into(), id.clone(), "hello".into()));
    // One channel's URL: today's framing, byte for byte.
    assert_eq!(
        one.read().expect("a frame"),
        Message::text(format!("{id}\nhello"))
    );
    let b1 = publish_id(addr, "b", "one");
    assert_eq!(message(&mut many), ("b".into(), b1.clone(), "one".into()));
    // In-band: a third channel, then past the limit, then one left.
    assert_eq!(
        ask(&mut many, &json!({"subscribe": "c"})),
        json!({"subscribed": "c"})
    );
    let over = ask(&mut many, &json!({"subscribe": "d"}));
    assert_eq!(
        (&over["op"], &over["channel"]),
        (&json!("subscribe"), &json!("d"))
    );
    assert!(
        over["error"]
            .as_str()
            .unwrap()
            .contains("--max-channels-per-connection")
    );
    assert_eq!(
        ask(&mut many, &json!({"unsubscribe": "b"})),
        json!({"unsubscribed": "b"})
    );
    // Missed on b while away: recovered after its id, once, in order.
    let missed: Vec<String> = ["two", "three"]
        .iter()
        .map(|m| publish_id(addr, "b", m))
        .collect();
    let c1 = publish_id(addr, "c", "sea");
    assert_eq!(message(&mut many), ("c".into(), c1, "sea".into()));
    let back = ask(&mut many, &json!({"subscribe": "b", "since": b1}));
    assert_eq!(back, json!({"subscribed": "b"}));
    assert_eq!(
        message(&mut many),
        ("b".into(), missed[0].clone(), "two".into())
    );
    assert_eq!(
        message(&mut many),
        ("b".into(), missed[1].clone(), "three".into())
    );
    // Publishing on the socket: acknowledged with the id the others see.
    // (The acknowledgement and the message itself race: either may come first.)
    let publish = json!({"publish": "a", "data": {"n": 1}}).to_string();
    many.send(Message::text(publish)).expect("send");
    let mut two = [next(&mut many), next(&mut many)];
    two.sort();
    let ack: Value = serde_json::from_str(&two[1]).expect("the acknowledgement");
    let pid = ack["id"].as_str().expect("an id").to_owned();
    assert_eq!(ack, json!({"published": "a", "id": pid}));
    assert_eq!(two[0], format!("a\n{pid}\n{{\"n\":1}}"));
    assert_eq!(
        one.read().expect("a frame"),
        Message::text(format!("{pid}\n{{\"n\":1}}"))
    );
    // Bad input: each answered, nothing else changes.
    let big = "x".repeat(2000);
    for (bad, says) in [
        ("{nope".to_owned(), "not JSON"),
        (r#"{"join":"a"}"#.to_owned(), "one of subscribe"),
        (r#"{"subscribe":"a b"}"#.to_owned(), "may only contain"),
        (r#"{"subscribe":"a","x":1}"#.to_owned(), "unknown field"),
        (r#"{"unsubscribe":"zz"}"#.to_owned(), "not subscribed"),
        (
            json!({"publish": "a", "data": big}).to_string(),
            "over --max-message",
        ),
        (r#"{"refresh":"x.y.z"}"#.to_owned(), "no --auth-* keys"),
    ] {
        many.send(Message::text(bad.clone())).expect("send");
        let got = answer(&mut many);
        assert!(
            got["error"].as_str().is_some_and(|e| e.contains(says)),
            "{bad}: {got}"
        );
    }
    let after = publish_id(addr, "a", "still");
    assert_eq!(
        message(&mut many),
        ("a".into(), after.clone(), "still".into())
    );
    assert_eq!(
        one.read().expect("a frame"),
        Message::text(format!("{after}\nstill"))
    );
    let (_, list) = get(addr, "/api/channels");
    let list: Value = serde_json::from_str(&list).expect("JSON");
    assert_eq!(
        list["channels"],
        json!([{"name": "a", "subscribers": 2}, {"name": "b", "subscribers": 1}, {"name": "c", "subscribers": 1}])
    );
    drop(many);
    server.wait_metric("throng_connections_open", |v| v == 1.0);
}

#[test]
fn an_event_stream_of_several_channels_says_each_events_channel() {
    let server = serve(&["--history", "10"]);
    let addr = server.addr;
    let early = publish_id(addr, "x", "before");
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        s,
        "GET /sse/?channel=x&channel=y%2Fz&since=1-0 HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    .expect("send");
    let mut r = BufReader::new(s);
    let mut event = || {
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            r.read_line(&mut line).expect("a line");
            let line = line.trim_end_matches(['\r', '\n']).to_owned();
            if line.is_empty() && lines.iter().any(|l: &String| l.starts_with("data:")) {
                return lines;
            }
            if line.starts_with("id:") || line.starts_with("data:") || line.starts_with("event:") {
                lines.push(line);
            }
        }
    };
    // since=1-0 is another epoch's: the marker for each channel, then
    // what x kept.
    let mut first = vec![event(), event(), event()];
    first.sort();
    let ev = |a: &str, b: &str, c: &str| vec![a.to_owned(), b.to_owned(), c.to_owned()];
    assert_eq!(
        first,
        [
            ev("event: incomplete", "data: x", "data: 1-0"),
            ev("event: incomplete", "data: y/z", "data: 1-0"),
            ev(&format!("id: {early}"), "data: x", "data: before"),
        ]
    );
    let live = publish_id(addr, "y/z", "deep");
    assert_eq!(
        event(),
        [
            format!("id: {live}"),
            "data: y/z".into(),
            "data: deep".into()
        ]
    );
    assert!(
        refused(addr, "/?channel=a", "").starts_with("HTTP/1.1 400"),
        "a bare WebSocket of several channels"
    );
}

#[test]
fn tokens_grant_each_channel_and_publish_and_a_refresh_replaces_them() {
    require!(Peer::PythonJwt);
    let (mint, server, tokens) = guarded(&[
        json!({"alg": "HS256", "claims": {"exp_in": 300, "channels": ["a", "b"], "publish": ["a"]}}),
        json!({"alg": "HS256", "claims": {"exp_in": 600, "channels": ["a"]}}),
        json!({"alg": "HS256-wrong", "claims": {"exp_in": 600, "channels": ["*"]}}),
    ]);
    let addr = server.addr;
    let [both, only_a, forged] = [0, 1, 2].map(|i| tokens[i].as_str());
    let no = refused(
        addr,
        "/?channel=a&channel=x",
        &format!("Sec-WebSocket-Protocol: throng.v1, bearer.{both}\r\n"),
    );
    assert!(no.starts_with("HTTP/1.1 403"), "x is not granted: {no}");
    let no = refused(addr, "/?channel=a", "Sec-WebSocket-Protocol: throng.v1\r\n");
    assert!(no.starts_with("HTTP/1.1 401"), "no token: {no}");
    let mut ws = open(addr, "/?channel=a&channel=b", Some(both));
    let mut other = open(addr, "/?channel=b", Some(both));
    let x = ask(&mut ws, &json!({"subscribe": "x"}));
    assert_eq!(x["error"], json!("not granted by the token"));
    let p = ask(&mut ws, &json!({"publish": "b", "data": "no"}));
    assert_eq!(
        p["error"],
        json!("not granted by the token's publish claim")
    );
    ws.send(Message::text(
        json!({"publish": "a", "data": "yes"}).to_string(),
    ))
    .expect("send");
    let mut two = [next(&mut ws), next(&mut ws)];
    two.sort();
    assert!(two[0].ends_with("\nyes"), "{two:?}");
    assert!(two[1].starts_with(r#"{"id":"#), "{two:?}");
    // A refresh that does not verify changes nothing.
    let bad = ask(&mut ws, &json!({"refresh": forged}));
    assert_eq!(bad["op"], json!("refresh"));
    // One that grants a only: b ends, saying why; a goes on.
    let ok = ask(&mut ws, &json!({"refresh": only_a}));
    assert_eq!(ok["refreshed"], json!(true), "{ok}");
    let ended = answer(&mut ws);
    assert_eq!(ended["unsubscribed"], json!("b"), "{ended}");
    assert!(ended["reason"].is_string());
    publish_id_with(addr, &secret_publish(&mint), "b", "after");
    assert_eq!(
        message(&mut other).2,
        "after",
        "the other connection keeps b"
    );
    let p = ask(&mut ws, &json!({"publish": "a", "data": "no more"}));
    assert_eq!(
        p["error"],
        json!("not granted by the token's publish claim")
    );
    publish_id_with(addr, &secret_publish(&mint), "a", "on a");
    assert_eq!(
        message(&mut ws).2,
        "on a",
        "a goes on, b's message never came"
    );
}

#[test]
fn a_websocket_of_one_channel_refreshes_its_token_in_band() {
    require!(Peer::PythonJwt);
    let (mint, server, tokens) = guarded(&[
        json!({"alg": "HS256", "claims": {"exp_in": 300, "channels": ["a"]}}),
        json!({"alg": "HS256", "claims": {"exp_in": 900, "channels": ["a"]}}),
        json!({"alg": "HS256", "claims": {"exp_in": 900, "channels": ["b"]}}),
        json!({"alg": "HS256-wrong", "claims": {"exp_in": 900, "channels": ["*"]}}),
    ]);
    let addr = server.addr;
    let [first, longer, only_b, forged] = [0, 1, 2, 3].map(|i| tokens[i].as_str());
    let mut one = crate::api_sub::join(addr, "a", first);
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    let bad = ask(&mut one, &json!({"refresh": forged}));
    assert_eq!(bad["op"], json!("refresh"), "{bad}");
    let ok = ask(&mut one, &json!({"refresh": longer}));
    assert_eq!(ok["refreshed"], json!(true), "{ok}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let expires = ok["expires"].as_u64().expect("an expiry");
    assert!(expires > now + 600, "the new token's exp: {ok}");
    // Any other text is ignored, as ever; messages keep their framing.
    one.send(Message::text("hello")).expect("send");
    one.send(Message::text(r#"{"subscribe":"b"}"#))
        .expect("send");
    publish_id_with(addr, &secret_publish(&mint), "a", "after");
    assert_eq!(next(&mut one), "after");
    // A token that does not grant the channel ends the connection.
    one.send(Message::text(json!({"refresh": only_b}).to_string()))
        .expect("send");
    assert_eq!(
        crate::api::close_frame_then_end(&mut one),
        (4003, "not granted by the refreshed token".to_owned())
    );
}

#[test]
fn a_publish_the_broker_cannot_take_is_refused_never_acknowledged() {
    // Redis is not there (--redis-wait serves anyway): POST /publish gets
    // 503, and a publish on the socket its reason.
    let url = format!("redis://127.0.0.1:{}", throng_testkit::free_port());
    let server = serve(&["--redis", &url, "--redis-wait"]);
    server.wait_broker("down");
    let mut ws = open(server.addr, "/?channel=a", None);
    let got = ask(&mut ws, &json!({"publish": "a", "data": "lost?"}));
    assert_eq!(
        (&got["op"], &got["channel"]),
        (&json!("publish"), &json!("a"))
    );
    let why = got["error"].as_str().expect("an error");
    assert!(why.starts_with("not published: "), "{got}");
    assert!(got.get("id").is_none() && got.get("published").is_none());
    // The connection goes on: its next request is answered.
    assert_eq!(
        ask(&mut ws, &json!({"subscribe": "b"})),
        json!({"subscribed": "b"})
    );
}

#[test]
fn python_websockets_speaks_the_same_requests_and_frames() {
    use std::io::BufRead as _;
    use std::process::Stdio;

    require!(Peer::PythonWebsockets);
    let server = serve(&["--history", "10"]);
    let addr = server.addr;
    let mut child = throng_testkit::peers::python("channels_client.py")
        .arg(format!("ws://{addr}/?channel=a&channel=b"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start channels_client.py");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = || {
        let mut l = String::new();
        out.read_line(&mut l).expect("a line");
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l:?}: {e}"));
        v
    };
    assert_eq!(line(), json!({"protocol": "throng.v1"}));
    writeln!(stdin, r#"{{"subscribe":"c"}}"#).expect("send");
    assert_eq!(line(), json!({"frame": r#"{"subscribed":"c"}"#}));
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    let id = publish_id(addr, "a", "hello");
    assert_eq!(line(), json!({"frame": format!("a\n{id}\nhello")}));
    writeln!(stdin, r#"{{"publish":"c","data":"from python"}}"#).expect("send");
    let mut two = [line(), line()];
    two.sort_by_key(|v| v["frame"].as_str().map(str::to_owned));
    let ack: Value = serde_json::from_str(two[1]["frame"].as_str().expect("text")).expect("JSON");
    let pid = ack["id"].as_str().expect("an id");
    assert_eq!(two[0]["frame"], json!(format!("c\n{pid}\nfrom python")));
    writeln!(stdin, "{{nope").expect("send");
    let bad = line();
    assert!(
        bad["frame"]
            .as_str()
            .is_some_and(|f| f.contains("not JSON")),
        "{bad}"
    );
    drop(stdin);
    assert_eq!(line(), json!({"closed": 1000}));
    assert!(child.wait().expect("exit").success());
}

/// A token that may publish anywhere.
fn secret_publish(mint: &Mint) -> String {
    mint.token(json!({"alg": "HS256", "claims": {"exp_in": 300, "publish": ["*"]}}))
}

/// Publishes `body` with `token`.
fn publish_id_with(addr: SocketAddr, token: &str, channel: &str, body: &str) {
    let req = format!(
        "POST /publish/{channel} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Authorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (status, _, reply) = throng_testkit::http::raw(addr, req.as_bytes());
    assert_eq!(status, 200, "{reply}");
}

/// The browser test's page: one socket, three channels, as
/// docs/channels.md shows it. The test steers it through channel `c`:
/// "drop b" unsubscribes from b, "back b" subscribes again after the last
/// id of b it saw.
const PAGE: &str = r#"<!doctype html><title>throng channels</title><script>
const log = (...a) => console.log(a.join(' '));
const last = {};
const ws = new WebSocket('ws://TARGET/?channel=a&channel=b&channel=c', ['throng.v1']);
ws.onopen = () => log('open');
ws.onmessage = ({ data }) => {
  if (data[0] === '{') return log('answer', data);     // an answer to a request
  const i = data.indexOf('\n'), j = data.indexOf('\n', i + 1);
  const channel = data.slice(0, i), id = data.slice(i + 1, j), body = data.slice(j + 1);
  last[channel] = id;
  log('got', channel, body);
  if (body === 'drop b') ws.send(JSON.stringify({ unsubscribe: 'b' }));
  if (body === 'back b') ws.send(JSON.stringify({ subscribe: 'b', since: last.b }));
};
</script>"#;

#[test]
fn a_browser_page_follows_three_channels_on_one_socket_leaves_one_and_recovers_it() {
    use crate::history::{Browser, page_server};

    require!(Peer::Chromium);
    let server = serve(&["--history", "100"]);
    let addr = server.addr;
    let page = page_server(PAGE.replace("TARGET", &addr.to_string()));
    let browser = Browser::open(page, "channels-browser");
    let console = &browser.console;
    let next_line = || {
        console
            .recv_timeout(Duration::from_secs(30))
            .expect("the page stalled")
    };
    assert_eq!(next_line(), "open");
    server.wait_metric("throng_connections_open", |v| v == 1.0);
    let say = |channel: &str, body: &str| {
        publish_id(addr, channel, body);
    };
    for (channel, body) in [("a", "a1"), ("b", "b1"), ("c", "c1")] {
        say(channel, body);
        assert_eq!(next_line(), format!("got {channel} {body}"));
    }
    say("c", "drop b");
    assert_eq!(next_line(), "got c drop b");
    assert_eq!(next_line(), r#"answer {"unsubscribed":"b"}"#);
    // Missed on b while away; a goes on.
    say("b", "b2");
    say("b", "b3");
    say("a", "a2");
    assert_eq!(next_line(), "got a a2");
    say("c", "back b");
    assert_eq!(next_line(), "got c back b");
    assert_eq!(next_line(), r#"answer {"subscribed":"b"}"#);
    assert_eq!(
        next_line(),
        "got b b2",
        "recovered after the last id of b seen"
    );
    assert_eq!(next_line(), "got b b3");
    say("b", "b4");
    assert_eq!(next_line(), "got b b4", "then live");
    assert_eq!(
        server.wait_metric("throng_connections_open", |v| v == 1.0),
        1.0,
        "one socket all along"
    );
}
