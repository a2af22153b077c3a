//! The data representations of MQTT (section 1.5 of both specifications):
//! big-endian integers, variable byte integers, length-prefixed strings and
//! binary data; read from a packet's body and written to a buffer.

use bytes::BufMut;

use super::DecodeError;

/// The largest variable byte integer (4 bytes of 7 bits).
pub(super) const VARINT_MAX: usize = 268_435_455;

/// Reads the fields of one packet body, front to back. Running past the end
/// is a malformed packet, named after the packet being read.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    packet: &'static str,
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8], packet: &'static str) -> Self {
        Self { buf, packet }
    }

    pub(super) fn malformed(&self, why: &'static str) -> DecodeError {
        DecodeError::Malformed {
            packet: self.packet,
            why,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Fails unless every byte was read.
    pub(super) fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.malformed("bytes left after its fields"))
        }
    }

    pub(super) fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(self.malformed("a field runs past the end of the packet"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// Everything not read yet.
    pub(super) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }

    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(super) fn varint(&mut self) -> Result<usize, DecodeError> {
        match varint(self.buf)? {
            Some((value, len)) => {
                self.buf = &self.buf[len..];
                Ok(value)
            }
            None => Err(self.malformed("a field runs past the end of the packet")),
        }
    }

    /// Two-byte length, then that many bytes.
    pub(super) fn binary(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u16()?;
        self.bytes(usize::from(n))
    }

    /// A UTF-8 encoded string: UTF-8 without U+0000 (section 1.5.4).
    pub(super) fn string(&mut self) -> Result<&'a str, DecodeError> {
        utf8(self.binary()?)
    }
}

/// Checks a string's bytes: UTF-8 (which excludes surrogates) and no U+0000.
pub(super) fn utf8(b: &[u8]) -> Result<&str, DecodeError> {
    let s = std::str::from_utf8(b).map_err(|_| DecodeError::InvalidUtf8)?;
    if s.contains('\0') {
        return Err(DecodeError::InvalidUtf8);
    }
    Ok(s)
}

/// A variable byte integer at the front of `buf`: its value and length, or
/// `None` when `buf` ends first. Over 4 bytes, or longer than needed (the
/// 5.0 specification requires the minimum), is [`DecodeError::BadLength`],
/// found as soon as the offending byte is there.
pub(super) fn varint(buf: &[u8]) -> Result<Option<(usize, usize)>, DecodeError> {
    let mut value = 0usize;
    for (i, &b) in buf.iter().enumerate() {
        value |= usize::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            if i > 0 && b == 0 {
                return Err(DecodeError::BadLength);
            }
            return Ok(Some((value, i + 1)));
        }
        if i == 3 {
            return Err(DecodeError::BadLength);
        }
    }
    Ok(None)
}

/// Bytes a variable byte integer takes; `value` is at most [`VARINT_MAX`].
pub(super) fn varint_len(value: usize) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Appends a variable byte integer; `value` is at most [`VARINT_MAX`].
pub(super) fn put_varint(out: &mut impl BufMut, mut value: usize) {
    loop {
        // The mask keeps 7 bits: the cast cannot truncate.
        let mut b = (value & 0x7F) as u8;
        value >>= 7;
        if value > 0 {
            b |= 0x80;
        }
        out.put_u8(b);
        if value == 0 {
            return;
        }
    }
}

/// Appends two-byte length and bytes; the caller checked the length fits.
pub(super) fn put_binary(out: &mut impl BufMut, b: &[u8]) {
    // Every caller measured the field with `field_len` first, which refuses
    // more than u16::MAX bytes; the clamp never changes the length.
    out.put_u16(u16::try_from(b.len()).unwrap_or(u16::MAX));
    out.put_slice(b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_byte_integers_at_each_length() {
        for (value, bytes) in [
            (0usize, &[0x00][..]),
            (127, &[0x7F]),
            (128, &[0x80, 0x01]),
            (16_383, &[0xFF, 0x7F]),
            (16_384, &[0x80, 0x80, 0x01]),
            (2_097_151, &[0xFF, 0xFF, 0x7F]),
            (2_097_152, &[0x80, 0x80, 0x80, 0x01]),
            (VARINT_MAX, &[0xFF, 0xFF, 0xFF, 0x7F]),
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(varint_len(value), bytes.len());
            assert_eq!(varint(bytes), Ok(Some((value, bytes.len()))));
            assert_eq!(varint(&bytes[..bytes.len() - 1]), Ok(None));
        }
    }

    #[test]
    fn a_fifth_byte_or_a_padded_integer_is_refused_at_once() {
        assert_eq!(
            varint(&[0xFF, 0xFF, 0xFF, 0xFF]),
            Err(DecodeError::BadLength)
        );
        assert_eq!(varint(&[0x80, 0x00]), Err(DecodeError::BadLength));
        assert_eq!(varint(&[0x81, 0x80, 0x00]), Err(DecodeError::BadLength));
    }

    #[test]
    fn strings_are_utf8_without_nul() {
        assert_eq!(utf8("a/é".as_bytes()), Ok("a/é"));
        assert_eq!(utf8(b"a\0b"), Err(DecodeError::InvalidUtf8));
        assert_eq!(utf8(&[0xC3]), Err(DecodeError::InvalidUtf8));
        assert_eq!(utf8(&[0xED, 0xA0, 0x80]), Err(DecodeError::InvalidUtf8));
    }
}
