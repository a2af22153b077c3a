//! permessage-deflate (RFC 7692) for a WebSocket server that keeps no
//! compression state per connection: the offer is negotiated with
//! `server_no_context_takeover` and `client_no_context_takeover`, so every
//! message is compressed (and inflated) on its own. A server can therefore
//! compress a message once and write the same frame to every subscriber
//! that negotiated the extension, and an idle subscriber costs nothing more.
//!
//! The compressor always uses a 32 KiB window (15 bits): an offer that asks
//! for a smaller `server_max_window_bits` is declined (the client gets
//! uncompressed frames), never accepted and then broken.

use bytes::Bytes;
use flate2::{Compress, Compression, FlushCompress};

use crate::ws::{OpCode, encode_into, header_len};

/// The extension's name in `Sec-WebSocket-Extensions`.
pub const NAME: &str = "permessage-deflate";

use crate::inflate::TAIL;
pub use crate::inflate::{InflateError, inflate};

/// RSV1: the frame starts a compressed message.
pub const RSV1: u8 = 0x40;

/// An offer this server accepted: what to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// The offer named `server_max_window_bits` (at 15, the only window
    /// this server compresses with): the answer must name it back.
    window_named: bool,
}

impl Agreed {
    /// The `Sec-WebSocket-Extensions` value to answer with. Both
    /// no-context-takeover parameters are always there: a server may ask
    /// it of the client even when the offer did not (section 7.1.1.2), and
    /// it is what lets the server keep no inflate state between messages.
    pub fn response(&self) -> &'static str {
        if self.window_named {
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=15"
        } else {
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
        }
    }
}

/// Picks the first `permessage-deflate` offer in the request's
/// `Sec-WebSocket-Extensions` headers (`values`, in order) that this server
/// can honour; `None` declines them all (answer without the extension).
///
/// An offer is declined when a parameter is unknown, repeated or has an
/// invalid value (section 7.1), or when it asks for a server window of
/// fewer than 15 bits.
pub fn negotiate<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Agreed> {
    values
        .into_iter()
        .flat_map(|v| split_outside_quotes(v, b','))
        .find_map(offer)
}

/// One offer, `permessage-deflate; p; q=v`, if acceptable.
fn offer(ext: &[u8]) -> Option<Agreed> {
    let mut parts = split_outside_quotes(ext, b';').into_iter();
    let name = parts.next()?.trim_ascii();
    if !name.eq_ignore_ascii_case(NAME.as_bytes()) {
        return None;
    }
    let mut seen = [false; 4];
    let mut window_named = false;
    for p in parts {
        let (key, value) = match p.iter().position(|&b| b == b'=') {
            Some(i) => (p[..i].trim_ascii(), Some(unquote(p[i + 1..].trim_ascii())?)),
            None => (p.trim_ascii(), None),
        };
        let which = [
            "server_no_context_takeover",
            "client_no_context_takeover",
            "server_max_window_bits",
            "client_max_window_bits",
        ]
        .iter()
        .position(|k| key.eq_ignore_ascii_case(k.as_bytes()))?;
        if std::mem::replace(&mut seen[which], true) {
            return None;
        }
        match (which, value) {
            (0 | 1, None) => {}
            (2, Some(v)) => {
                // A smaller window is a promise this compressor cannot keep.
                if window_bits(v)? != 15 {
                    return None;
                }
                window_named = true;
            }
            // The client's window is its own: any is inflated here.
            (3, None) => {}
            (3, Some(v)) => {
                window_bits(v)?;
            }
            _ => return None,
        }
    }
    Some(Agreed { window_named })
}

/// A window size parameter: 8 to 15, decimal digits only.
fn window_bits(v: &[u8]) -> Option<u8> {
    match v {
        [d @ b'8'..=b'9'] => Some(d - b'0'),
        [b'1', d @ b'0'..=b'5'] => Some(10 + d - b'0'),
        _ => None,
    }
}

/// A token or a quoted string's content (no escapes in a number).
fn unquote(v: &[u8]) -> Option<&[u8]> {
    match v {
        [b'"', inner @ .., b'"'] if !inner.contains(&b'"') => Some(inner),
        _ if !v.contains(&b'"') => Some(v),
        _ => None,
    }
}

/// Splits at `sep` outside double quotes.
fn split_outside_quotes(v: &[u8], sep: u8) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, &b) in v.iter().enumerate() {
        if b == b'"' {
            quoted = !quoted;
        } else if b == sep && !quoted {
            out.push(&v[start..i]);
            start = i + 1;
        }
    }
    out.push(&v[start..]);
    out
}

/// A raw-deflate compressor reused from message to message (resetting
/// it is far cheaper than making one): each message is compressed on its
/// own, as `server_no_context_takeover` promises.
pub struct Deflater {
    c: Compress,
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deflater")
    }
}

impl Default for Deflater {
    fn default() -> Self {
        Self::new()
    }
}

impl Deflater {
    /// A compressor at a fast level: a push server compresses on its
    /// fan-out path, where a higher level costs more than it saves.
    pub fn new() -> Self {
        Self {
            c: Compress::new(Compression::fast(), false),
        }
    }

    /// The compressed form of `frame`, one complete unmasked server frame
    /// (as [`crate::ws::server_frame`] makes): the same opcode, RSV1 set,
    /// the payload deflated with the 4-byte tail removed. A frame that is
    /// not a whole unfragmented data frame, or whose payload is shorter
    /// than `min` bytes (too small to gain), is returned unchanged: RSV1
    /// is per message, so an uncompressed frame is always allowed.
    pub fn frame(&mut self, frame: &Bytes, min: usize) -> Bytes {
        let Some((opcode, payload)) = data_frame(frame).filter(|(_, p)| p.len() >= min) else {
            return frame.clone();
        };
        let body = self.compress(payload);
        let mut out = Vec::with_capacity(header_len(body.len(), false) + body.len());
        encode_into(&mut out, true, opcode, &body, None);
        out[0] |= RSV1;
        Bytes::from(out)
    }

    /// `payload` deflated on its own, sync-flushed, the tail stripped.
    pub fn compress(&mut self, payload: &[u8]) -> Vec<u8> {
        self.c.reset();
        let mut out = Vec::with_capacity(payload.len() / 2 + 64);
        loop {
            let done = self.c.total_in() as usize;
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(64));
            }
            // Cannot fail: a raw stream, sync-flushed, with room to write.
            let _ = self
                .c
                .compress_vec(&payload[done..], &mut out, FlushCompress::Sync);
            // Finished once all input is in and the flush did not fill the room.
            if self.c.total_in() as usize == payload.len() && out.len() < out.capacity() {
                break;
            }
        }
        if out.ends_with(&TAIL) {
            out.truncate(out.len() - TAIL.len());
        }
        out
    }
}

/// The opcode and payload of a complete, final, unmasked data frame.
fn data_frame(frame: &[u8]) -> Option<(OpCode, &[u8])> {
    let [b0, b1, ..] = *frame else { return None };
    let opcode = match b0 & 0x0F {
        0x1 => OpCode::Text,
        0x2 => OpCode::Binary,
        _ => return None,
    };
    if b0 & 0xF0 != 0x80 || b1 & 0x80 != 0 {
        return None;
    }
    let at = match b1 & 0x7F {
        126 => 4,
        127 => 10,
        _ => 2,
    };
    Some((opcode, frame.get(at..)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::{Decoder, Frame, ProtocolError, Role, server_frame};

    fn agree(h: &str) -> Option<&'static str> {
        negotiate([h.as_bytes()]).map(|a| a.response())
    }

    const PLAIN: &str =
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

    #[test]
    fn offers_are_accepted_or_declined_as_rfc_7692_says() {
        assert_eq!(agree("permessage-deflate"), Some(PLAIN));
        // What Python websockets and Node ws offer by default.
        assert_eq!(
            agree("permessage-deflate; client_max_window_bits"),
            Some(PLAIN)
        );
        assert_eq!(
            agree("permessage-deflate; client_max_window_bits=\"10\"; client_no_context_takeover"),
            Some(PLAIN)
        );
        assert_eq!(
            agree("permessage-deflate; server_max_window_bits=15"),
            Some(
                "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=15"
            )
        );
        // A smaller server window cannot be kept; the next offer can.
        assert_eq!(agree("permessage-deflate; server_max_window_bits=10"), None);
        assert_eq!(
            agree("permessage-deflate; server_max_window_bits=10, permessage-deflate"),
            Some(PLAIN)
        );
        for bad in [
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_max_window_bits=16",
            "permessage-deflate; client_max_window_bits=7",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; x_unknown",
            "x-webkit-deflate-frame",
            "",
        ] {
            assert_eq!(agree(bad), None, "{bad}");
        }
        // Several headers: the first acceptable offer wins.
        let a = negotiate([&b"foo; a=\"x,y\""[..], b"permessage-deflate"]);
        assert_eq!(a.map(|a| a.response()), Some(PLAIN));
    }

    #[test]
    fn a_frame_is_compressed_once_and_inflates_back() {
        let json = br#"{"user":"ada","event":"click","x":1,"y":2}"#.repeat(24);
        let frame = server_frame(OpCode::Text, &json);
        let mut z = Deflater::new();
        let c = z.frame(&frame, 0);
        assert_eq!(z.frame(&frame, json.len() + 1), frame, "under the minimum");
        assert_eq!(c[0], 0x80 | RSV1 | 0x1);
        assert!(c.len() < frame.len() / 4, "{} vs {}", c.len(), frame.len());
        let mut plain = c.to_vec();
        plain[0] &= !RSV1;
        let Some((op, body)) = data_frame(&plain) else {
            panic!("not a data frame");
        };
        assert_eq!(op, OpCode::Text);
        assert_eq!(inflate(body, 1 << 20).as_deref(), Ok(&json[..]));
        // Each message alone: the same frame twice compresses the same.
        assert_eq!(z.frame(&frame, json.len()), c);
        // Control frames and empty payloads.
        let ping = server_frame(OpCode::Ping, b"");
        assert_eq!(z.frame(&ping, 0), ping);
        let empty = z.compress(b"");
        assert_eq!(inflate(&empty, 10).as_deref(), Ok(&b""[..]));
        assert_eq!(inflate(&empty, 0).as_deref(), Ok(&b""[..]));
        let two = z.compress(b"ab");
        assert_eq!(inflate(&two, 1), Err(InflateError::TooBig));
    }

    #[test]
    fn a_bomb_is_cut_off_at_the_limit_and_garbage_is_refused() {
        let bomb = Deflater::new().compress(&vec![0u8; 10 << 20]);
        assert!(bomb.len() < 64 << 10);
        assert_eq!(inflate(&bomb, 1 << 20), Err(InflateError::TooBig));
        assert_eq!(inflate(&bomb, 10 << 20).map(|v| v.len()), Ok(10 << 20));
        assert_eq!(
            inflate(b"\xff\xff\xff\xff", 1 << 20),
            Err(InflateError::Corrupt)
        );
    }

    /// A client's frame: masked, RSV1 when `rsv1`.
    fn client_frame(op: OpCode, fin: bool, rsv1: bool, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_into(&mut out, fin, op, payload, Some([9, 8, 7, 6]));
        if rsv1 {
            out[0] |= RSV1;
        }
        out
    }

    fn decode_all(dec: &mut Decoder, mut buf: Vec<u8>) -> Result<Vec<Vec<u8>>, ProtocolError> {
        let mut got = Vec::new();
        let mut at = 0;
        while let Some(d) = dec.decode(&mut buf[at..])? {
            at += d.consumed;
            if let Some(Frame::Text(t) | Frame::Binary(t)) = d.frame {
                got.push(t.to_vec());
            }
        }
        Ok(got)
    }

    #[test]
    fn the_decoder_inflates_compressed_messages_only_when_negotiated() {
        let text = "héllo ".repeat(50);
        let z = Deflater::new().compress(text.as_bytes());
        let one = client_frame(OpCode::Text, true, true, &z);
        let mut plain = Decoder::new(Role::Server, 1 << 16);
        assert_eq!(
            decode_all(&mut plain, one.clone()),
            Err(ProtocolError::ReservedBits)
        );
        let mut dec = Decoder::new(Role::Server, 1 << 16);
        dec.set_deflate(true);
        assert_eq!(
            decode_all(&mut dec, one),
            Ok(vec![text.clone().into_bytes()])
        );
        // In fragments (RSV1 on the first only), beside an uncompressed one.
        let (a, b) = z.split_at(z.len() / 2);
        let mut two = client_frame(OpCode::Text, false, true, a);
        two.extend(client_frame(OpCode::Continuation, true, false, b));
        two.extend(client_frame(OpCode::Binary, true, false, b"raw"));
        assert_eq!(
            decode_all(&mut dec, two),
            Ok(vec![text.into_bytes(), b"raw".to_vec()])
        );
        // RSV1 on a continuation or a control frame is still refused.
        let mut bad = client_frame(OpCode::Text, false, true, a);
        bad.extend(client_frame(OpCode::Continuation, true, true, b));
        assert_eq!(decode_all(&mut dec, bad), Err(ProtocolError::ReservedBits));
        let mut dec = Decoder::new(Role::Server, 1 << 16);
        dec.set_deflate(true);
        let ping = client_frame(OpCode::Ping, true, true, b"");
        assert_eq!(decode_all(&mut dec, ping), Err(ProtocolError::ReservedBits));
        // A bomb: 16 MiB of zeros in a few KiB, cut off at the limit (1009).
        let bomb = Deflater::new().compress(&vec![0u8; 16 << 20]);
        let mut dec = Decoder::new(Role::Server, 1 << 16);
        dec.set_deflate(true);
        let e = decode_all(&mut dec, client_frame(OpCode::Binary, true, true, &bomb));
        assert_eq!(e, Err(ProtocolError::TooBig { limit: 1 << 16 }));
        assert_eq!(ProtocolError::TooBig { limit: 1 }.close_code(), 1009);
        // Not deflate data, or not UTF-8 once inflated (1007).
        let mut dec = Decoder::new(Role::Server, 1 << 16);
        dec.set_deflate(true);
        let e = decode_all(
            &mut dec,
            client_frame(OpCode::Binary, true, true, b"\xff\xff"),
        );
        assert_eq!(e.map_err(|e| e.close_code()), Err(1007));
        let latin = Deflater::new().compress(b"caf\xe9");
        let mut dec = Decoder::new(Role::Server, 1 << 16);
        dec.set_deflate(true);
        let e = decode_all(&mut dec, client_frame(OpCode::Text, true, true, &latin));
        assert_eq!(e, Err(ProtocolError::InvalidUtf8));
    }
}
