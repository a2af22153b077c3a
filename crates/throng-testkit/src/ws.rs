//! WebSocket subscribers for tests: tungstenite as an independent client,
//! and a raw upgraded socket for frames no client library would send.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use throng_proto::{http, ws};

/// A tungstenite subscriber on a plain socket.
pub type Sub = tungstenite::WebSocket<TcpStream>;

/// A tungstenite subscriber on `/<channel>` (reads time out after 15 s).
pub fn subscribe(addr: SocketAddr, channel: &str) -> Sub {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("set a read timeout");
    let (ws, resp) = tungstenite::client(format!("ws://{addr}/{channel}"), s).expect("upgrade");
    assert_eq!(resp.status(), 101);
    ws
}

/// Upgrades `s` to `url`: the answer's status, and the subscription when
/// it was 101 (a refusal such as 429 or 503 is a status, not a panic).
pub fn upgrade_status(s: TcpStream, url: &str) -> (u16, Option<Sub>) {
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("set a read timeout");
    match tungstenite::client(url, s) {
        Ok((ws, r)) => (r.status().as_u16(), Some(ws)),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => {
            (r.status().as_u16(), None)
        }
        Err(e) => panic!("upgrade to {url}: {e}"),
    }
}

/// An upgraded socket with no client library on it, for sending broken
/// frames; returns it with the bytes read past the upgrade's answer.
pub fn raw_subscribe(addr: SocketAddr, channel: &str) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("set a read timeout");
    let key = ws::client_key([7; 16]);
    let mut req = Vec::new();
    ws::write_upgrade_request(&mut req, &addr.to_string(), &format!("/{channel}"), &key);
    s.write_all(&req).expect("send the upgrade");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).expect("read the upgrade's answer");
        assert!(n > 0, "closed during upgrade");
        buf.extend_from_slice(&chunk[..n]);
        if let Some((resp, used)) =
            http::parse_response(&buf, http::MAX_HEAD).expect("an HTTP answer")
        {
            ws::client_verify(&resp, &key).expect("a valid 101");
            buf.drain(..used);
            return (s, buf);
        }
    }
}

/// One frame from the server as a client sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Got {
    Text(Vec<u8>),
    Binary(Vec<u8>),
    Ping,
    Pong,
    Close(Option<u16>),
    /// The connection ended (or a read failed) before a whole frame.
    Eof,
}

/// Reads the next frame from a raw socket (`buf` holds bytes already read).
pub fn next_frame(s: &mut TcpStream, buf: &mut Vec<u8>, dec: &mut ws::Decoder) -> Got {
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

/// A client frame, masked and encoded.
pub fn client_frame(fin: bool, op: ws::OpCode, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ws::encode_into(&mut out, fin, op, payload, Some([1, 2, 3, 4]));
    out
}

/// The next data frame's text (tungstenite answers pings itself); a binary
/// frame comes back as `binary:<bytes>`, so a test expecting text fails on it.
pub fn next_text(s: &mut Sub) -> String {
    loop {
        match s.read().expect("subscriber stays connected") {
            tungstenite::Message::Text(t) => return t.to_string(),
            tungstenite::Message::Binary(b) => return format!("binary:{b:?}"),
            tungstenite::Message::Close(c) => panic!("subscriber closed: {c:?}"),
            _ => {}
        }
    }
}

/// Reads up to the server's close frame and returns its code, then reads
/// until the connection ends cleanly (tungstenite answers the close; over
/// TLS an end without close_notify would be an error here, not
/// `ConnectionClosed`).
pub fn close_code_then_end<S: Read + Write>(s: &mut tungstenite::WebSocket<S>) -> Option<u16> {
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

/// Starts a close handshake from the client and reads until the connection
/// ends, checking that the server echoed the close with 1000.
pub fn close_expecting_echo<S: Read + Write>(s: &mut tungstenite::WebSocket<S>) {
    s.close(None).expect("send a close frame");
    loop {
        match s.read() {
            Ok(tungstenite::Message::Close(Some(f))) => assert_eq!(u16::from(f.code), 1000),
            Ok(_) => {}
            Err(tungstenite::Error::ConnectionClosed) => return,
            Err(e) => panic!("close handshake: {e}"),
        }
    }
}
