//! The frame decoder in both roles on arbitrary bytes: decoding the bytes at
//! once and fed in pieces (split where the input says) must give the same
//! frames and the same error, and never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use throng_proto::ws::{Decoder, Frame, ProtocolError, Role};

#[derive(Debug, PartialEq, Eq)]
enum Msg {
    Text(Vec<u8>),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>, String),
}

fn own(frame: Frame<'_>) -> Msg {
    match frame {
        Frame::Text(p) => {
            assert!(std::str::from_utf8(p).is_ok());
            Msg::Text(p.to_vec())
        }
        Frame::Binary(p) => Msg::Binary(p.to_vec()),
        Frame::Ping(p) => Msg::Ping(p.to_vec()),
        Frame::Pong(p) => Msg::Pong(p.to_vec()),
        Frame::Close { code, reason } => Msg::Close(code, reason.to_owned()),
    }
}

/// Feeds `input` to a decoder in pieces of the given sizes (then the rest),
/// the way a connection's read loop does; returns the frames, the error that
/// stopped it if any, and how many bytes were left undecoded.
fn run(
    role: Role,
    limit: usize,
    input: &[u8],
    pieces: &[u8],
) -> (Vec<Msg>, Option<ProtocolError>, usize) {
    let mut dec = Decoder::new(role, limit);
    let mut pending = Vec::new();
    let mut frames = Vec::new();
    let mut fed = 0;
    let mut sizes = pieces.iter().map(|&p| usize::from(p) + 1);
    while fed < input.len() {
        let size = sizes
            .next()
            .unwrap_or(input.len() - fed)
            .min(input.len() - fed);
        pending.extend_from_slice(&input[fed..fed + size]);
        fed += size;
        let mut at = 0;
        loop {
            let available = pending.len() - at;
            match dec.decode(&mut pending[at..]) {
                Ok(Some(d)) => {
                    assert!(d.consumed > 0 && d.consumed <= available);
                    at += d.consumed;
                    frames.extend(d.frame.map(own));
                }
                Ok(None) => break,
                Err(e) => return (frames, Some(e), 0),
            }
        }
        pending.drain(..at);
        assert!(
            pending.len() <= 14 + limit.max(125),
            "kept more than one frame's worth"
        );
    }
    (frames, None, pending.len())
}

fuzz_target!(|data: &[u8]| {
    // Layout: [limit byte, number of piece sizes, piece sizes..., frames...].
    let [limit, npieces, rest @ ..] = data else {
        return;
    };
    let split = usize::from(*npieces).min(rest.len());
    let (pieces, input) = rest.split_at(split);
    let limit = usize::from(*limit) * 64;
    for role in [Role::Server, Role::Client] {
        let whole = run(role, limit, input, &[]);
        let split = run(role, limit, input, pieces);
        assert_eq!(whole, split, "{role:?}");
        if let Some(e) = &whole.1 {
            assert!(matches!(e.close_code(), 1002 | 1007 | 1009));
            assert!(!e.label().is_empty());
        }
    }
});
