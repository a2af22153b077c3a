//! Helpers shared by the property and interop tests: an owned frame, a read
//! loop that feeds a decoder the way a connection does, and an encoder for
//! whole messages split into fragments.

use throng_proto::ws::{self, Decoder, Frame, OpCode, ProtocolError, Role};

/// An owned copy of a [`Frame`], so a test can collect several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>, String),
}

pub(crate) fn own(frame: Frame<'_>) -> Msg {
    match frame {
        Frame::Text(p) => Msg::Text(String::from_utf8(p.to_vec()).expect("decoder checked UTF-8")),
        Frame::Binary(p) => Msg::Binary(p.to_vec()),
        Frame::Ping(p) => Msg::Ping(p.to_vec()),
        Frame::Pong(p) => Msg::Pong(p.to_vec()),
        Frame::Close { code, reason } => Msg::Close(code, reason.to_owned()),
    }
}

/// The role that reads what `role` writes.
pub(crate) fn peer(role: Role) -> Role {
    match role {
        Role::Server => Role::Client,
        Role::Client => Role::Server,
    }
}

/// Feeds `pieces` in order to a fresh decoder for `role`, decoding after each
/// as a connection's read loop does, keeping only the undecoded remainder.
/// Returns every frame and the bytes left over at the end.
pub(crate) fn feed<'p>(
    role: Role,
    limit: usize,
    pieces: impl IntoIterator<Item = &'p [u8]>,
) -> Result<(Vec<Msg>, usize), ProtocolError> {
    let mut dec = Decoder::new(role, limit);
    let mut pending = Vec::new();
    let mut out = Vec::new();
    for piece in pieces {
        pending.extend_from_slice(piece);
        let mut at = 0;
        while let Some(d) = dec.decode(&mut pending[at..])? {
            assert!(d.consumed > 0);
            at += d.consumed;
            out.extend(d.frame.map(own));
        }
        pending.drain(..at);
    }
    Ok((out, pending.len()))
}

/// One item of a test conversation: a message, and how it goes on the wire.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub(crate) msg: Msg,
    /// Cut points (byte offsets into the payload) where a data message is
    /// split into fragments; unused for control frames.
    pub(crate) cuts: Vec<usize>,
    /// A control frame sent between the first and second fragment.
    pub(crate) between: Option<Msg>,
    /// Mask seed for the sending client (varied per frame).
    pub(crate) mask: [u8; 4],
}

/// Encodes `items` as `role` sends them.
pub(crate) fn encode(role: Role, items: &[Item]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        let mut mask = item.mask;
        let mut next_mask = || {
            mask = mask.map(|b| b.wrapping_mul(31).wrapping_add(7));
            (role == Role::Client).then_some(mask)
        };
        match &item.msg {
            Msg::Text(s) => encode_data(&mut out, OpCode::Text, s.as_bytes(), item, &mut next_mask),
            Msg::Binary(b) => encode_data(&mut out, OpCode::Binary, b, item, &mut next_mask),
            control => encode_control(&mut out, control, next_mask()),
        }
    }
    out
}

fn encode_control(out: &mut Vec<u8>, msg: &Msg, mask: Option<[u8; 4]>) {
    match msg {
        Msg::Ping(p) => ws::encode_into(out, true, OpCode::Ping, p, mask),
        Msg::Pong(p) => ws::encode_into(out, true, OpCode::Pong, p, mask),
        Msg::Close(None, _) => ws::encode_into(out, true, OpCode::Close, b"", mask),
        Msg::Close(Some(code), reason) => ws::encode_close(out, *code, reason, mask),
        Msg::Text(_) | Msg::Binary(_) => unreachable!("not a control frame"),
    }
}

fn encode_data(
    out: &mut Vec<u8>,
    opcode: OpCode,
    payload: &[u8],
    item: &Item,
    next_mask: &mut impl FnMut() -> Option<[u8; 4]>,
) {
    let mut cuts: Vec<usize> = item.cuts.iter().map(|c| c % (payload.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.push(payload.len());
    let mut start = 0;
    let last = cuts.len() - 1;
    for (i, &end) in cuts.iter().enumerate() {
        let op = if i == 0 { opcode } else { OpCode::Continuation };
        ws::encode_into(out, i == last, op, &payload[start..end], next_mask());
        if i == 0 && i != last {
            if let Some(between) = &item.between {
                encode_control(out, between, next_mask());
            }
        }
        start = end;
    }
}

/// What the reader should see for `items`: a control frame sent between
/// fragments arrives before the message it interrupted.
pub(crate) fn expected(items: &[Item]) -> Vec<Msg> {
    let mut out = Vec::new();
    for item in items {
        let data = matches!(item.msg, Msg::Text(_) | Msg::Binary(_));
        if data && !item.cuts.is_empty() {
            out.extend(item.between.clone());
        }
        out.push(item.msg.clone());
    }
    out
}
