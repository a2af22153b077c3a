//! The part of HPACK (RFC 7541) a load generator needs: request header
//! blocks written once per target, and the `:status` read out of a
//! response's block.
//!
//! The client announces `SETTINGS_HEADER_TABLE_SIZE = 0`, so the server's
//! encoder keeps no dynamic table: nothing a response says has to be
//! remembered for the next one, a connection holds no table, and only the
//! `:status` field has to be decoded, its name and value Huffman coded or
//! not (other fields are skipped by length).
//! Requests are written as literals without indexing, names from the static
//! table where it has them, no Huffman coding.

use super::H2Error;

/// Static table (RFC 7541 Appendix A) entries used here.
const AUTHORITY: u8 = 1;
const METHOD_GET: u8 = 2;
const METHOD_POST: u8 = 3;
const PATH: u8 = 4;
const PATH_ROOT: u8 = 4;
const SCHEME_HTTP: u8 = 6;
const SCHEME_HTTPS: u8 = 7;
const METHOD: u8 = 2;

/// The static table's `:status` entries (indexes 8..=14).
const STATUS: [(u64, u16); 7] = [
    (8, 200),
    (9, 204),
    (10, 206),
    (11, 304),
    (12, 400),
    (13, 404),
    (14, 500),
];

/// Header names HTTP/2 forbids in requests (connection-specific, RFC 9113
/// §8.2.2); `host` becomes `:authority`.
const DROPPED: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "host",
];

/// A request's header block: pseudo-headers first, then `headers` with
/// lower-case names (connection-specific ones dropped; a `Host` header
/// replaces `authority`), and `content-length` when `body_len` is non-zero.
pub fn encode_request(
    method: &str,
    https: bool,
    authority: &str,
    path: &str,
    headers: &[(String, String)],
    body_len: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + authority.len() + path.len());
    match method {
        "GET" => out.push(0x80 | METHOD_GET),
        "POST" => out.push(0x80 | METHOD_POST),
        m => literal_indexed_name(&mut out, METHOD, m.as_bytes()),
    }
    out.push(0x80 | if https { SCHEME_HTTPS } else { SCHEME_HTTP });
    if path == "/" {
        out.push(0x80 | PATH_ROOT);
    } else {
        literal_indexed_name(&mut out, PATH, path.as_bytes());
    }
    let host = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("host"))
        .map_or(authority, |(_, v)| v.as_str());
    literal_indexed_name(&mut out, AUTHORITY, host.as_bytes());
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if DROPPED.contains(&lower.as_str()) || lower == "content-length" {
            continue;
        }
        out.push(0x00);
        string(&mut out, lower.as_bytes());
        string(&mut out, value.as_bytes());
    }
    if body_len > 0 {
        out.push(0x00);
        string(&mut out, b"content-length");
        string(&mut out, body_len.to_string().as_bytes());
    }
    out
}

/// A literal field without indexing whose name is static entry `index`.
fn literal_indexed_name(out: &mut Vec<u8>, index: u8, value: &[u8]) {
    integer(out, 0x00, 4, u64::from(index));
    string(out, value);
}

/// A string literal, not Huffman coded.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, 0x00, 7, s.len() as u64);
    out.extend_from_slice(s);
}

/// An integer with an `n`-bit prefix, the first byte's high bits `flags`.
fn integer(out: &mut Vec<u8>, flags: u8, n: u32, mut v: u64) {
    let max = (1u64 << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// Reads an integer with an `n`-bit prefix at `buf[*at..]`.
fn read_integer(buf: &[u8], at: &mut usize, n: u32) -> Result<u64, H2Error> {
    let max = (1u64 << n) - 1;
    let first = *buf
        .get(*at)
        .ok_or(H2Error::Compression("truncated integer"))?;
    *at += 1;
    let mut v = u64::from(first) & max;
    if v < max {
        return Ok(v);
    }
    let mut shift = 0u32;
    loop {
        let b = *buf
            .get(*at)
            .ok_or(H2Error::Compression("truncated integer"))?;
        *at += 1;
        if shift > 56 {
            return Err(H2Error::Compression("integer too large"));
        }
        v += u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
}

/// Reads a string literal: whether it is Huffman coded, and its bytes.
fn read_string<'a>(buf: &'a [u8], at: &mut usize) -> Result<(bool, &'a [u8]), H2Error> {
    let huffman = buf.get(*at).is_some_and(|b| b & 0x80 != 0);
    let len = read_integer(buf, at, 7)?;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| at.checked_add(l))
        .filter(|&e| e <= buf.len())
        .ok_or(H2Error::Compression("string runs past the block"))?;
    let s = &buf[*at..end];
    *at = end;
    Ok((huffman, s))
}

/// `:status` Huffman coded (RFC 7541 Appendix B: `:` 1011100, `s` 01000,
/// `t` 01001, `a` 00011, `u` 101101, then two padding bits). The padding
/// must be the EOS code's first bits (all ones), so a name has one coding
/// and comparing the bytes is decoding it.
const STATUS_NAME_HUFFMAN: [u8; 5] = [0xb8, 0x84, 0x8d, 0x36, 0xa3];

/// The Huffman codes of the ten digits (RFC 7541 Appendix B): code, bits.
const DIGITS: [(u32, u32); 10] = [
    (0b00000, 5),
    (0b00001, 5),
    (0b00010, 5),
    (0b011001, 6),
    (0b011010, 6),
    (0b011011, 6),
    (0b011100, 6),
    (0b011101, 6),
    (0b011110, 6),
    (0b011111, 6),
];

/// A Huffman-coded status code: digits only, then at most 7 bits of
/// padding (all ones).
fn huffman_digits(s: &[u8]) -> Result<u16, H2Error> {
    let bad = H2Error::Compression(":status is not three digits");
    let mut acc = 0u32;
    let mut bits = 0u32;
    let mut value = 0u16;
    let mut digits = 0;
    for &byte in s {
        acc = (acc << 8) | u32::from(byte);
        bits += 8;
        'next: while bits >= 5 {
            for (d, &(code, len)) in DIGITS.iter().enumerate() {
                if bits >= len && (acc >> (bits - len)) & ((1 << len) - 1) == code {
                    if digits == 3 {
                        return Err(bad);
                    }
                    bits -= len;
                    acc &= (1 << bits) - 1;
                    value = value * 10 + d as u16;
                    digits += 1;
                    continue 'next;
                }
            }
            break;
        }
        // Eight bits that start no digit: not a status code.
        if bits >= 8 {
            return Err(bad);
        }
    }
    // What is left must be the EOS prefix: fewer than 8 one-bits.
    if digits != 3 || bits >= 8 || acc != (1 << bits) - 1 {
        return Err(bad);
    }
    Ok(value)
}

/// Three ASCII digits as a status code.
fn ascii_status(s: &[u8]) -> Result<u16, H2Error> {
    match s {
        [a, b, c] if s.iter().all(u8::is_ascii_digit) => {
            Ok(u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0'))
        }
        _ => Err(H2Error::Compression(":status is not three digits")),
    }
}

/// The `:status` of a response header block (`None`: it has none, as
/// trailers do). The block must not use the dynamic table, which the
/// client set to size 0.
pub fn decode_status(block: &[u8]) -> Result<Option<u16>, H2Error> {
    let mut at = 0;
    let mut status = None;
    while at < block.len() {
        let b = block[at];
        if b & 0x80 != 0 {
            let index = read_integer(block, &mut at, 7)?;
            match STATUS.iter().find(|(i, _)| *i == index) {
                Some(&(_, s)) => status = status.or(Some(s)),
                None if (1..=61).contains(&index) => {}
                None => return Err(H2Error::Compression("index outside the static table")),
            }
            continue;
        }
        if b & 0xe0 == 0x20 {
            // A dynamic table size update: only down to what we allowed (0).
            if read_integer(block, &mut at, 5)? != 0 {
                return Err(H2Error::Compression("dynamic table size above 0"));
            }
            continue;
        }
        // A literal, with incremental indexing (6-bit prefix) or without /
        // never indexed (4-bit). With a table of size 0 indexing keeps nothing.
        let prefix = if b & 0xc0 == 0x40 { 6 } else { 4 };
        let index = read_integer(block, &mut at, prefix)?;
        let is_status = match index {
            0 => {
                let (huffman, name) = read_string(block, &mut at)?;
                if huffman {
                    name == STATUS_NAME_HUFFMAN
                } else {
                    name == b":status"
                }
            }
            8..=14 => true,
            1..=61 => false,
            _ => return Err(H2Error::Compression("index outside the static table")),
        };
        let (huffman, value) = read_string(block, &mut at)?;
        if is_status && status.is_none() {
            status = Some(if huffman {
                huffman_digits(value)?
            } else {
                ascii_status(value)?
            });
        }
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_round_trip_across_prefixes() {
        for n in [4u32, 5, 6, 7] {
            for v in [
                0u64,
                1,
                14,
                15,
                30,
                31,
                62,
                63,
                126,
                127,
                128,
                1337,
                1 << 40,
            ] {
                let mut out = Vec::new();
                integer(&mut out, 0, n, v);
                let mut at = 0;
                assert_eq!(read_integer(&out, &mut at, n).unwrap(), v);
                assert_eq!(at, out.len());
            }
        }
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        integer(&mut out, 0, 5, 1337);
        assert_eq!(out, [31, 154, 10]);
    }

    #[test]
    fn status_from_static_literal_and_huffman() {
        assert_eq!(decode_status(&[0x88]).unwrap(), Some(200));
        assert_eq!(decode_status(&[0x8d]).unwrap(), Some(404));
        // Literal without indexing, name :status (8), value "302".
        assert_eq!(
            decode_status(&[0x08, 3, b'3', b'0', b'2']).unwrap(),
            Some(302)
        );
        // RFC 7541 C.6.1: "302" Huffman coded is 64 02.
        assert_eq!(decode_status(&[0x48, 0x82, 0x64, 0x02]).unwrap(), Some(302));
        // A literal name, and no status at all (trailers).
        let mut block = vec![0x00, 7];
        block.extend_from_slice(b":status");
        block.extend_from_slice(&[3, b'5', b'0', b'3']);
        assert_eq!(decode_status(&block).unwrap(), Some(503));
        assert_eq!(decode_status(&[0x0f, 0x10, 1, b'x']).unwrap(), None);
        assert_eq!(decode_status(&[0x20, 0x88]).unwrap(), Some(200));
        // The name itself Huffman coded (python-hyper's hpack codes
        // ":status" as b8 84 8d 36 a3), the value too; other names so coded
        // are skipped by length.
        let mut block = vec![0x00, 0x85, 0xb8, 0x84, 0x8d, 0x36, 0xa3, 0x82, 0x64, 0x02];
        assert_eq!(decode_status(&block).unwrap(), Some(302));
        block[6] = 0xa1;
        assert_eq!(decode_status(&block).unwrap(), None);
    }

    #[test]
    fn bad_blocks_are_errors() {
        for bad in [
            &[0xbe][..],            // dynamic index 62
            &[0x3f, 0xe1, 0x1f],    // table size 4096
            &[0x08, 5, b'2'],       // string past the end
            &[0x08, 2, b'2', b'0'], // two digits
            &[0x08, 3, b'2', b'x', b'0'],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            &[0x48, 0x82, 0x64, 0x03], // not a digit
        ] {
            assert!(decode_status(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn requests_use_the_static_table_and_drop_connection_headers() {
        let headers = vec![
            ("Connection".to_owned(), "keep-alive".to_owned()),
            ("X-A".to_owned(), "b".to_owned()),
        ];
        let block = encode_request("GET", false, "h:1", "/", &headers, 0);
        let mut want = vec![0x82, 0x86, 0x84, 0x01, 3];
        want.extend_from_slice(b"h:1");
        want.extend_from_slice(&[0x00, 3]);
        want.extend_from_slice(b"x-a");
        want.extend_from_slice(&[1, b'b']);
        assert_eq!(block, want);
        let block = encode_request("PUT", true, "h", "/p", &[], 2);
        assert!(block.starts_with(&[0x02, 3, b'P', b'U', b'T', 0x87, 0x04, 2, b'/', b'p']));
        assert!(block.ends_with(b"content-length\x012"));
    }
}
