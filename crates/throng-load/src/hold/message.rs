//! The timestamped message `hold` publishes and every subscriber checks.
//!
//! A message is ASCII text, so it passes through any server, broker or
//! proxy unchanged and is valid as a WebSocket text frame:
//!
//! ```text
//! t1 <seq> <sent_unix_ns> ........
//! ```
//!
//! `seq` counts from 1 for the run; `sent_unix_ns` is the wall-clock time
//! taken just before the publish call started, so the whole fan-out is inside
//! the measured delivery latency. Dots pad the message to the requested size
//! (a message never gets shorter than its header).

/// Prefix of every message; the `1` is the format version.
pub const PREFIX: &[u8] = b"t1 ";

/// The shortest message: prefix, the longest `u64` twice, two separators.
pub const MAX_HEADER: usize = PREFIX.len() + 20 + 1 + 20 + 1;

/// Appends the message for `seq` sent at `sent_unix_ns`, padded to `size` bytes.
pub fn encode(out: &mut Vec<u8>, seq: u64, sent_unix_ns: u64, size: usize) {
    let start = out.len();
    out.extend_from_slice(PREFIX);
    push_u64(out, seq);
    out.push(b' ');
    push_u64(out, sent_unix_ns);
    out.push(b' ');
    let len = out.len() - start;
    if len < size {
        out.resize(start + size, b'.');
    }
}

fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// `(seq, sent_unix_ns)` from a message, or `None` when it is not one of ours.
pub fn decode(msg: &[u8]) -> Option<(u64, u64)> {
    let rest = msg.strip_prefix(PREFIX)?;
    let (seq, rest) = take_u64(rest)?;
    let (sent, _) = take_u64(rest)?;
    Some((seq, sent))
}

/// A decimal number followed by a space.
fn take_u64(s: &[u8]) -> Option<(u64, &[u8])> {
    let end = s.iter().position(|&b| b == b' ')?;
    if end == 0 || end > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in &s[..end] {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some((v, &s[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_pads() {
        let mut out = Vec::new();
        encode(&mut out, 42, 1_700_000_000_123_456_789, 100);
        assert_eq!(out.len(), 100);
        assert!(out.ends_with(b"..."));
        assert_eq!(decode(&out), Some((42, 1_700_000_000_123_456_789)));
        out.clear();
        encode(&mut out, u64::MAX, 0, 0);
        assert_eq!(out.len(), PREFIX.len() + 20 + 1 + 1 + 1);
        assert!(out.len() <= MAX_HEADER);
        assert_eq!(decode(&out), Some((u64::MAX, 0)));
    }

    #[test]
    fn rejects_foreign_messages() {
        for bad in [
            &b""[..],
            b"hello",
            b"t1 ",
            b"t1 12",
            b"t1 12 ",
            b"t1 x 5 ",
            b"t1  5 ",
            b"t2 1 2 ",
            b"t1 99999999999999999999 1 ",
        ] {
            assert_eq!(decode(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
