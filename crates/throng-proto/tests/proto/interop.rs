//! Interop with tungstenite, an independent RFC 6455 implementation: its
//! handshakes against ours in both roles, its frames through our decoder and
//! ours through its reader, over an in-memory stream.

use std::collections::VecDeque;
use std::io::{self, Read, Write};

use proptest::prelude::*;
use throng_proto::http::{parse_request, parse_response};
use throng_proto::ws::{self, OpCode, Role};
use tungstenite::handshake::HandshakeError as TgHandshakeError;
use tungstenite::protocol::WebSocket;
use tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode as TgOpCode};
use tungstenite::protocol::frame::{CloseFrame, Frame as TgFrame};
use tungstenite::{Bytes, Message};

use crate::support::{Msg, feed};

/// An in-memory connection end: reads what the test pushed in (or
/// `WouldBlock` when there is nothing), collects what is written.
#[derive(Default)]
struct Pipe {
    input: VecDeque<u8>,
    output: Vec<u8>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.input.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.input.read(buf)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads every message tungstenite can make of what is in its input.
fn read_all(ws: &mut WebSocket<Pipe>) -> Vec<Message> {
    let mut out = Vec::new();
    loop {
        match ws.read() {
            Ok(m) => out.push(m),
            Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return out,
            Err(tungstenite::Error::ConnectionClosed) => return out,
            Err(e) => panic!("tungstenite refused our frames: {e}"),
        }
    }
}

fn take_output(ws: &mut WebSocket<Pipe>) -> Vec<u8> {
    // A server that completed the close handshake has already written its
    // close and refuses to flush again.
    match ws.flush() {
        Ok(()) | Err(tungstenite::Error::ConnectionClosed) => {}
        Err(e) => panic!("flush: {e}"),
    }
    std::mem::take(&mut ws.get_mut().output)
}

/// A tungstenite client whose upgrade our server side accepts.
fn tungstenite_client() -> WebSocket<Pipe> {
    let mid = match tungstenite::client("ws://localhost/news", Pipe::default()) {
        Err(TgHandshakeError::Interrupted(mid)) => mid,
        Err(e) => panic!("handshake failed: {e}"),
        Ok(_) => panic!("handshake completed without an answer"),
    };
    let mut mid = mid;
    let pipe = mid.get_mut().get_mut();
    let request = std::mem::take(&mut pipe.output);
    let (req, n) = parse_request(&request, 8192).unwrap().unwrap();
    assert_eq!(n, request.len());
    assert_eq!(req.target, "/news");
    let accept = ws::server_accept(&req).expect("we accept tungstenite's upgrade");
    let mut answer = Vec::new();
    ws::write_accept(&mut answer, &accept);
    pipe.input.extend(answer);
    let (ws, resp) = mid.handshake().expect("tungstenite accepts our 101");
    assert_eq!(resp.status(), 101);
    ws
}

/// A tungstenite server that accepted our client's upgrade.
fn tungstenite_server() -> WebSocket<Pipe> {
    let key = ws::client_key(*b"throng-interop!!");
    let mut pipe = Pipe::default();
    let mut request = Vec::new();
    ws::write_upgrade_request(&mut request, "localhost:1", "/news", &key);
    pipe.input.extend(request);
    let mut ws = tungstenite::accept(pipe).expect("tungstenite accepts our upgrade");
    let answer = take_output(&mut ws);
    let (resp, n) = parse_response(&answer, 8192).unwrap().unwrap();
    assert_eq!(n, answer.len());
    ws::client_verify(&resp, &key).expect("we accept tungstenite's 101");
    ws
}

fn messages() -> Vec<Message> {
    vec![
        Message::text("hello"),
        Message::text("ünïcödé ✓ 🦀".repeat(20)),
        Message::binary(vec![7u8; 125]),
        Message::binary(vec![8u8; 126]),
        Message::binary((0..70_000u32).map(|i| i as u8).collect::<Vec<_>>()),
        Message::Ping(Bytes::from_static(b"are you there")),
        Message::Pong(Bytes::new()),
        Message::binary(Vec::new()),
    ]
}

fn as_msg(m: &Message) -> Msg {
    match m {
        Message::Text(t) => Msg::Text(t.as_str().to_owned()),
        Message::Binary(b) => Msg::Binary(b.to_vec()),
        Message::Ping(p) => Msg::Ping(p.to_vec()),
        Message::Pong(p) => Msg::Pong(p.to_vec()),
        Message::Close(None) => Msg::Close(None, String::new()),
        Message::Close(Some(c)) => Msg::Close(Some(c.code.into()), c.reason.as_str().to_owned()),
        Message::Frame(_) => unreachable!("not read"),
    }
}

/// Writes `messages` with tungstenite in `role` and decodes them with ours.
fn tungstenite_to_ours(mut ws: WebSocket<Pipe>, our_role: Role) {
    for m in messages() {
        ws.write(m).unwrap();
    }
    // A fragmented text message with a ping in between.
    let frames = [
        TgFrame::message("frag", TgOpCode::Data(Data::Text), false),
        TgFrame::ping(&b"mid"[..]),
        TgFrame::message("mented ✓", TgOpCode::Data(Data::Continue), true),
    ];
    for f in frames {
        ws.write(Message::Frame(f)).unwrap();
    }
    ws.close(Some(CloseFrame {
        code: CloseCode::Away,
        reason: "bye".into(),
    }))
    .unwrap();
    let bytes = take_output(&mut ws);
    let mut want: Vec<Msg> = messages().iter().map(as_msg).collect();
    want.push(Msg::Ping(b"mid".to_vec()));
    want.push(Msg::Text("fragmented ✓".into()));
    want.push(Msg::Close(Some(1001), "bye".into()));
    assert_eq!(feed(our_role, 1 << 20, [&bytes[..]]), Ok((want.clone(), 0)));
    // And byte by byte.
    assert_eq!(feed(our_role, 1 << 20, bytes.chunks(1)), Ok((want, 0)));
}

/// Encodes messages with ours in `our_role` and reads them with tungstenite.
fn ours_to_tungstenite(mut ws: WebSocket<Pipe>, our_role: Role) {
    let mask = |i: u8| (our_role == Role::Client).then_some([i, 0x5a, i ^ 0xff, 3]);
    let mut bytes = Vec::new();
    for (i, m) in messages().iter().enumerate() {
        let (op, payload): (OpCode, &[u8]) = match m {
            Message::Text(t) => (OpCode::Text, t.as_bytes()),
            Message::Binary(b) => (OpCode::Binary, b),
            Message::Ping(p) => (OpCode::Ping, p),
            Message::Pong(p) => (OpCode::Pong, p),
            _ => unreachable!(),
        };
        ws::encode_into(&mut bytes, true, op, payload, mask(i as u8));
    }
    ws::encode_into(&mut bytes, false, OpCode::Binary, b"ab", mask(100));
    ws::encode_into(&mut bytes, true, OpCode::Ping, b"", mask(101));
    ws::encode_into(&mut bytes, false, OpCode::Continuation, b"", mask(102));
    ws::encode_into(&mut bytes, true, OpCode::Continuation, b"c", mask(103));
    ws::encode_close(&mut bytes, 1000, "done", mask(104));
    ws.get_mut().input.extend(bytes);
    let got: Vec<Msg> = read_all(&mut ws).iter().map(as_msg).collect();
    let mut want: Vec<Msg> = messages().iter().map(as_msg).collect();
    want.push(Msg::Ping(Vec::new()));
    want.push(Msg::Binary(b"abc".to_vec()));
    want.push(Msg::Close(Some(1000), "done".into()));
    assert_eq!(got, want);
    // tungstenite answers pings and the close; we read its answers.
    let answers = take_output(&mut ws);
    let (frames, rest) = feed(our_role, 1 << 20, [&answers[..]]).unwrap();
    assert_eq!(rest, 0);
    assert_eq!(frames.last(), Some(&Msg::Close(Some(1000), "done".into())));
    assert!(frames.contains(&Msg::Pong(b"are you there".to_vec())));
}

#[test]
fn tungstenite_client_to_our_server() {
    tungstenite_to_ours(tungstenite_client(), Role::Server);
}

#[test]
fn tungstenite_server_to_our_client() {
    tungstenite_to_ours(tungstenite_server(), Role::Client);
}

#[test]
fn our_server_to_tungstenite_client() {
    ours_to_tungstenite(tungstenite_client(), Role::Server);
}

#[test]
fn our_client_to_tungstenite_server() {
    ours_to_tungstenite(tungstenite_server(), Role::Client);
}

#[test]
fn tungstenite_refuses_what_we_refuse_in_a_handshake() {
    // Our refusal for a wrong version is a 426 tungstenite reports as such.
    let Err(TgHandshakeError::Interrupted(mut mid)) =
        tungstenite::client("ws://localhost/news", Pipe::default())
    else {
        panic!("expected the handshake to wait for an answer");
    };
    let pipe = mid.get_mut().get_mut();
    let mut answer = Vec::new();
    ws::write_refusal(&mut answer, &ws::HandshakeError::UnsupportedVersion);
    pipe.input.extend(answer);
    match mid.handshake() {
        Err(TgHandshakeError::Failure(tungstenite::Error::Http(resp))) => {
            assert_eq!(resp.status(), 426);
            assert_eq!(resp.headers()["Sec-WebSocket-Version"], "13");
        }
        other => panic!("expected an HTTP error, got {:?}", other.map(|_| ())),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Our encoder writes exactly the bytes tungstenite's does (both use the
    /// shortest length encoding), and tungstenite parses our header back.
    #[test]
    fn frames_are_byte_identical_to_tungstenite(
        fin in any::<bool>(),
        op in prop_oneof![Just(OpCode::Continuation), Just(OpCode::Text), Just(OpCode::Binary)],
        len in prop_oneof![0usize..130, 65_530usize..65_540, 70_000usize..70_001],
        mask in proptest::option::of(any::<[u8; 4]>()),
    ) {
        let payload: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
        let mut ours = Vec::new();
        ws::encode_into(&mut ours, fin, op, &payload, mask);
        let tg_op = match op {
            OpCode::Continuation => TgOpCode::Data(Data::Continue),
            OpCode::Text => TgOpCode::Data(Data::Text),
            _ => TgOpCode::Data(Data::Binary),
        };
        let mut frame = TgFrame::message(payload.clone(), tg_op, fin);
        frame.header_mut().mask = mask;
        let mut theirs = Vec::new();
        frame.format(&mut theirs).unwrap();
        prop_assert_eq!(&ours, &theirs);
        let mut cursor = io::Cursor::new(&ours);
        let (header, length) = tungstenite::protocol::frame::FrameHeader::parse(&mut cursor).unwrap().unwrap();
        prop_assert_eq!(length, len as u64);
        prop_assert_eq!(header.is_final, fin);
        prop_assert_eq!(header.mask, mask);
        prop_assert_eq!(cursor.position() as usize, ws::header_len(len, mask.is_some()));
    }
}
