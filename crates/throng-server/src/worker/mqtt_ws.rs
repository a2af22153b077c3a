//! MQTT over WebSocket (subprotocol `mqtt`, what MQTT.js in a browser and
//! paho's websockets transport use), sans I/O: the client's frames
//! unwrapped into the MQTT byte stream, and the frame header the server
//! puts in front of each packet it sends. MQTT gives frame boundaries no
//! meaning (a packet may span frames, a frame may hold several packets),
//! so only the bytes count: binary frames and their continuations are
//! joined, a text frame ends the connection (MQTT-6.0.0-1).
//!
//! A connection keeps one remainder ([`super::conn::Conn`]'s `rest`), so a
//! split MQTT packet is kept as a frame of its own in front of the split
//! frame's bytes ([`keep`]): the next read unwraps both again.

use throng_proto::ws::{self, close_code};

/// The subprotocol a client offers for MQTT over WebSocket.
pub(crate) const SUBPROTOCOL: &str = "mqtt";

/// Room over the largest MQTT packet for a client's frame: a frame may
/// carry a packet and the head of the next.
pub(crate) const FRAME_SLACK: usize = 64;

/// A client's frame that breaks MQTT over WebSocket or RFC 6455.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum UnwrapError {
    #[error("a text frame: MQTT over WebSocket is binary")]
    Text,
    #[error("an unmasked frame from a client")]
    Unmasked,
    #[error("reserved bits or opcode")]
    Reserved,
    #[error("a frame over the largest MQTT packet")]
    TooLarge,
    #[error("a fragmented or oversized control frame")]
    BadControl,
}

impl UnwrapError {
    /// The WebSocket close code that answers it.
    pub(crate) fn close_code(&self) -> u16 {
        match self {
            // 1003: a kind of data the endpoint does not accept.
            Self::Text => 1003,
            Self::TooLarge => close_code::TOO_BIG,
            _ => close_code::PROTOCOL,
        }
    }

    /// Its label in /metrics.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Text => "ws_text_frame",
            Self::Unmasked => "ws_unmasked",
            Self::Reserved => "ws_reserved",
            Self::TooLarge => "ws_frame_too_large",
            Self::BadControl => "ws_bad_control",
        }
    }
}

/// A control frame met among the data.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Control {
    /// Answer with a pong of this payload.
    Ping(Vec<u8>),
    /// The client closes, with its code if it gave one.
    Close(Option<u16>),
}

/// What [`unwrap`] found in a buffer.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Unwrapped {
    /// Bytes of whole frames taken from the front; the rest is a split frame.
    pub(crate) consumed: usize,
    /// MQTT bytes now at the front of the buffer.
    pub(crate) data: usize,
    /// Control frames, in order (after a close nothing more is read).
    pub(crate) controls: Vec<Control>,
}

/// One frame's header: opcode, mask, where its payload is.
struct Head {
    opcode: u8,
    mask: [u8; 4],
    header: usize,
    len: usize,
}

/// Parses the header at the front of `buf`; `None` until the whole frame is there.
fn head(buf: &[u8], max_frame: usize) -> Result<Option<Head>, UnwrapError> {
    let [b0, b1, ..] = *buf else {
        return Ok(None);
    };
    let opcode = b0 & 0x0f;
    if b0 & 0x70 != 0 || !matches!(opcode, 0 | 1 | 2 | 8 | 9 | 10) {
        return Err(UnwrapError::Reserved);
    }
    if b1 & 0x80 == 0 {
        return Err(UnwrapError::Unmasked);
    }
    let (ext, len) = match b1 & 0x7f {
        126 => (
            2,
            buf.get(2..4)
                .map(|b| u64::from(u16::from_be_bytes([b[0], b[1]]))),
        ),
        127 => (
            8,
            buf.get(2..10)
                .map(|b| u64::from_be_bytes(b.try_into().unwrap_or_default())),
        ),
        n => (0, Some(u64::from(n))),
    };
    let Some(len) = len else {
        return Ok(None);
    };
    if opcode >= 8 && (b0 & 0x80 == 0 || len > 125) {
        return Err(UnwrapError::BadControl);
    }
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > max_frame {
        return Err(UnwrapError::TooLarge);
    }
    let header = 2 + ext + 4;
    let Some(mask) = buf.get(header - 4..header) else {
        return Ok(None);
    };
    if buf.len() < header + len {
        return Ok(None);
    }
    Ok(Some(Head {
        opcode,
        mask: [mask[0], mask[1], mask[2], mask[3]],
        header,
        len,
    }))
}

/// Unwraps the whole frames at the front of `buf` in place: their MQTT
/// bytes moved to the front (a payload is never longer than its frame, so
/// nothing is overwritten before it is moved), their control frames
/// collected. Stops after a close.
pub(crate) fn unwrap(buf: &mut [u8], max_frame: usize) -> Result<Unwrapped, UnwrapError> {
    let mut got = Unwrapped::default();
    while let Some(h) = head(&buf[got.consumed..], max_frame)? {
        let start = got.consumed + h.header;
        let end = start + h.len;
        ws::apply_mask(&mut buf[start..end], h.mask);
        got.consumed = end;
        match h.opcode {
            0 | 2 => {
                buf.copy_within(start..end, got.data);
                got.data += h.len;
            }
            1 => return Err(UnwrapError::Text),
            8 => {
                let code = buf.get(start..end.min(start + 2));
                let code = code
                    .filter(|c| c.len() == 2)
                    .map(|c| u16::from_be_bytes([c[0], c[1]]));
                got.controls.push(Control::Close(code));
                break;
            }
            9 => got.controls.push(Control::Ping(buf[start..end].to_vec())),
            // A pong is a sign of life only.
            _ => {}
        }
    }
    Ok(got)
}

/// What a connection keeps between reads: `mqtt`, the head of a split
/// packet, as an unmasked frame (mask 0) of its own, then `raw`, the bytes
/// of a split frame. Empty when both are.
pub(crate) fn keep(mqtt: &[u8], raw: &[u8]) -> Vec<u8> {
    if mqtt.is_empty() {
        return raw.to_vec();
    }
    let (h, n) = header(mqtt.len());
    let mut out = Vec::with_capacity(n + 4 + mqtt.len() + raw.len());
    out.extend_from_slice(&h[..n]);
    // The mask bit and a zero mask: the frame reads as a client's.
    out[1] |= 0x80;
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(mqtt);
    out.extend_from_slice(raw);
    out
}

/// The header of a final binary frame of `len` bytes from the server: the
/// first `n` bytes of the array.
pub(crate) fn header(len: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    h[0] = 0x82;
    let n = match len {
        0..=125 => {
            h[1] = len as u8;
            2
        }
        126..=0xFFFF => {
            h[1] = 126;
            h[2..4].copy_from_slice(&(len as u16).to_be_bytes());
            4
        }
        _ => {
            h[1] = 127;
            h[2..10].copy_from_slice(&(len as u64).to_be_bytes());
            10
        }
    };
    (h, n)
}

/// `packet` in one binary frame.
pub(crate) fn wrap(packet: &[u8]) -> Vec<u8> {
    let (h, n) = header(packet.len());
    let mut out = Vec::with_capacity(n + packet.len());
    out.extend_from_slice(&h[..n]);
    out.extend_from_slice(packet);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let op = match opcode {
            0 => ws::OpCode::Continuation,
            1 => ws::OpCode::Text,
            2 => ws::OpCode::Binary,
            8 => ws::OpCode::Close,
            9 => ws::OpCode::Ping,
            _ => ws::OpCode::Pong,
        };
        ws::encode_into(&mut out, fin, op, payload, Some([1, 2, 3, 4]));
        out
    }

    #[test]
    fn fragments_and_frames_join_into_one_stream_and_a_split_frame_is_kept() {
        let mut buf = frame(2, false, b"abc");
        buf.extend(frame(0, true, b"de"));
        buf.extend(frame(9, true, b"hi"));
        buf.extend(frame(2, true, b"fgh"));
        let whole = buf.len();
        buf.extend(&frame(2, true, b"later")[..4]);
        let got = unwrap(&mut buf, 100).unwrap();
        assert_eq!(got.consumed, whole);
        assert_eq!(&buf[..got.data], b"abcdefgh");
        assert_eq!(got.controls, vec![Control::Ping(b"hi".to_vec())]);
    }

    #[test]
    fn a_kept_packet_head_reads_again_before_the_split_frame() {
        let mut next = frame(2, true, b"tail");
        let mut kept = keep(b"head", &next[..3]);
        kept.extend_from_slice(&next.split_off(3));
        let got = unwrap(&mut kept, 100).unwrap();
        assert_eq!(&kept[..got.data], b"headtail");
        assert_eq!(keep(b"", b"xy"), b"xy");
    }

    #[test]
    fn text_unmasked_oversized_and_bad_control_frames_are_refused() {
        assert_eq!(
            unwrap(&mut frame(1, true, b"x"), 100),
            Err(UnwrapError::Text)
        );
        let mut unmasked = wrap(b"x");
        assert_eq!(unwrap(&mut unmasked, 100), Err(UnwrapError::Unmasked));
        assert_eq!(
            unwrap(&mut frame(2, true, &[0; 200]), 100),
            Err(UnwrapError::TooLarge)
        );
        assert_eq!(
            unwrap(&mut frame(9, false, b""), 100),
            Err(UnwrapError::BadControl)
        );
        assert_eq!(UnwrapError::Text.close_code(), 1003);
    }

    #[test]
    fn a_close_ends_the_unwrapping_and_headers_fit_every_length() {
        let mut buf = frame(8, true, &1000u16.to_be_bytes());
        buf.extend(frame(2, true, b"after"));
        let got = unwrap(&mut buf, 100).unwrap();
        assert_eq!(got.controls, vec![Control::Close(Some(1000))]);
        assert_eq!(got.data, 0);
        assert_eq!(header(5).1, 2);
        assert_eq!(header(300).1, 4);
        assert_eq!(header(70_000).1, 10);
        assert_eq!(&wrap(b"ab")[..], &[0x82, 2, b'a', b'b']);
    }
}
