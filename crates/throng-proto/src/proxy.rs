//! The PROXY protocol header (HAProxy's, versions 1 and 2) a load balancer
//! sends before a connection's own bytes to say whose connection it is.
//! Sans-I/O: [`parse`] reads the start of what arrived and says whether the
//! header is whole, how long it is, and the client's address.
//!
//! Version 1 is one text line (`PROXY TCP4 src dst sport dport\r\n`, at
//! most 107 bytes); version 2 is binary (a 12-byte signature, version and
//! command, family, a length, the addresses, then TLVs, which are skipped).
//! `PROXY UNKNOWN` (v1) and the `LOCAL` command or an unspecified family
//! (v2: the balancer's own health check) carry no client address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Version 2's signature.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// Version 1's longest line, `\r\n` included.
pub const V1_MAX: usize = 107;

/// The longest version 2 header accepted (its TLVs included): more is
/// refused rather than buffered.
pub const V2_MAX: usize = 16 + 1024;

/// A whole header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Its length: the connection's own bytes start after it.
    pub len: usize,
    /// The client's address, and the address it connected to; `None` when
    /// the header carries none (a health check of the balancer's own).
    pub addresses: Option<(SocketAddr, SocketAddr)>,
}

/// Why the bytes are not a PROXY header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// The connection does not start with a PROXY header at all.
    #[error("no PROXY protocol header (the connection does not start with one)")]
    Missing,
    /// It starts like one but breaks the format.
    #[error("malformed PROXY protocol header: {0}")]
    Malformed(&'static str),
}

/// Reads a header from the start of `buf`: `Ok(None)` when more bytes are
/// needed to tell.
pub fn parse(buf: &[u8]) -> Result<Option<Header>, ProxyError> {
    let sig = V2_SIGNATURE.len().min(buf.len());
    if buf[..sig] == V2_SIGNATURE[..sig] && !buf.is_empty() && buf[0] == b'\r' {
        return parse_v2(buf);
    }
    let v1 = b"PROXY ";
    let n = v1.len().min(buf.len());
    if buf[..n] != v1[..n] {
        return Err(ProxyError::Missing);
    }
    parse_v1(buf)
}

fn parse_v1(buf: &[u8]) -> Result<Option<Header>, ProxyError> {
    let Some(end) = buf.windows(2).take(V1_MAX - 1).position(|w| w == b"\r\n") else {
        if buf.len() >= V1_MAX {
            return Err(ProxyError::Malformed("v1 line longer than 107 bytes"));
        }
        return Ok(None);
    };
    let line =
        std::str::from_utf8(&buf[..end]).map_err(|_| ProxyError::Malformed("v1 line not ASCII"))?;
    let mut words = line.split(' ');
    words.next(); // "PROXY"
    let len = end + 2;
    let family = words
        .next()
        .ok_or(ProxyError::Malformed("v1 without a family"))?;
    if family == "UNKNOWN" {
        return Ok(Some(Header {
            len,
            addresses: None,
        }));
    }
    let rest: Vec<&str> = words.collect();
    let [src, dst, sport, dport] = rest[..] else {
        return Err(ProxyError::Malformed(
            "v1 needs two addresses and two ports",
        ));
    };
    let ip = |s: &str| -> Result<IpAddr, ProxyError> {
        let ip: IpAddr = s.parse().map_err(|_| ProxyError::Malformed("v1 address"))?;
        match (family, ip) {
            ("TCP4", IpAddr::V4(_)) | ("TCP6", IpAddr::V6(_)) => Ok(ip),
            _ => Err(ProxyError::Malformed("v1 family and address disagree")),
        }
    };
    let port = |s: &str| -> Result<u16, ProxyError> {
        // Decimal without a leading zero or sign (the spec's form).
        if s.is_empty()
            || (s.len() > 1 && s.starts_with('0'))
            || !s.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(ProxyError::Malformed("v1 port"));
        }
        s.parse().map_err(|_| ProxyError::Malformed("v1 port"))
    };
    Ok(Some(Header {
        len,
        addresses: Some((
            SocketAddr::new(ip(src)?, port(sport)?),
            SocketAddr::new(ip(dst)?, port(dport)?),
        )),
    }))
}

fn parse_v2(buf: &[u8]) -> Result<Option<Header>, ProxyError> {
    if buf.len() < 16 {
        return Ok(None);
    }
    let (ver_cmd, family) = (buf[12], buf[13]);
    if ver_cmd >> 4 != 2 {
        return Err(ProxyError::Malformed("v2 version is not 2"));
    }
    let body = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let len = 16 + body;
    if len > V2_MAX {
        return Err(ProxyError::Malformed("v2 header longer than 1040 bytes"));
    }
    if buf.len() < len {
        return Ok(None);
    }
    let local = match ver_cmd & 0x0F {
        0 => true,
        1 => false,
        _ => {
            return Err(ProxyError::Malformed(
                "v2 command is neither LOCAL nor PROXY",
            ));
        }
    };
    let a = &buf[16..len];
    let addresses = match family >> 4 {
        _ if local => None,
        // Only TCP (1) over IPv4 and IPv6 carries a client we can count.
        1 if family & 0x0F == 1 => {
            if a.len() < 12 {
                return Err(ProxyError::Malformed("v2 IPv4 addresses cut short"));
            }
            let ip = |i: usize| IpAddr::V4(Ipv4Addr::new(a[i], a[i + 1], a[i + 2], a[i + 3]));
            let port = |i: usize| u16::from_be_bytes([a[i], a[i + 1]]);
            Some((
                SocketAddr::new(ip(0), port(8)),
                SocketAddr::new(ip(4), port(10)),
            ))
        }
        2 if family & 0x0F == 1 => {
            if a.len() < 36 {
                return Err(ProxyError::Malformed("v2 IPv6 addresses cut short"));
            }
            let ip = |i: usize| {
                let mut b = [0u8; 16];
                b.copy_from_slice(&a[i..i + 16]);
                IpAddr::V6(Ipv6Addr::from(b))
            };
            let port = |i: usize| u16::from_be_bytes([a[i], a[i + 1]]);
            Some((
                SocketAddr::new(ip(0), port(32)),
                SocketAddr::new(ip(16), port(34)),
            ))
        }
        // UNSPEC, Unix sockets, UDP: no TCP client address.
        _ => None,
    };
    Ok(Some(Header { len, addresses }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_lines_whole_cut_and_broken() {
        let line = b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 8080\r\nGET / HTTP/1.1\r\n";
        let h = parse(line).unwrap().unwrap();
        assert_eq!(h.len, 42);
        assert_eq!(
            h.addresses,
            Some((addr("192.0.2.7:56324"), addr("10.0.0.1:8080")))
        );
        for cut in 0..42 {
            assert_eq!(parse(&line[..cut]), Ok(None), "{cut} bytes");
        }
        let v6 = b"PROXY TCP6 2001:db8::1 ::1 1 2\r\n";
        assert_eq!(
            parse(v6).unwrap().unwrap().addresses.unwrap().0,
            addr("[2001:db8::1]:1")
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n").unwrap(),
            Some(Header {
                len: 15,
                addresses: None
            })
        );
        for bad in [
            &b"PROXY TCP4 ::1 ::1 1 2\r\n"[..],
            b"PROXY TCP4 1.2.3.4 1.2.3.4 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 1\r\n",
            b"PROXY TCP4 1.2.3.4 1.2.3.4 1 99999\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(ProxyError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(ProxyError::Missing));
        assert_eq!(parse(b"\x16\x03\x01"), Err(ProxyError::Missing));
        let long = [b"PROXY ".as_slice(), &[b'x'; 200]].concat();
        assert!(matches!(parse(&long), Err(ProxyError::Malformed(_))));
    }

    fn v2(cmd: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[0x20 | cmd, family]);
        h.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    #[test]
    fn v2_headers_ipv4_ipv6_local_and_tlvs() {
        let mut body = vec![192, 0, 2, 7, 10, 0, 0, 1];
        body.extend_from_slice(&56324u16.to_be_bytes());
        body.extend_from_slice(&8080u16.to_be_bytes());
        body.extend_from_slice(&[0x04, 0, 2, 0xAB, 0xCD]); // a TLV, skipped
        let mut h = v2(1, 0x11, &body);
        let len = h.len();
        h.extend_from_slice(b"GET /");
        let got = parse(&h).unwrap().unwrap();
        assert_eq!(got.len, len);
        assert_eq!(
            got.addresses,
            Some((addr("192.0.2.7:56324"), addr("10.0.0.1:8080")))
        );
        for cut in 0..len {
            assert_eq!(parse(&h[..cut]), Ok(None), "{cut} bytes");
        }
        let mut six = vec![0u8; 36];
        six[15] = 1;
        six[31] = 1;
        six[32..34].copy_from_slice(&7u16.to_be_bytes());
        let got = parse(&v2(1, 0x21, &six)).unwrap().unwrap();
        assert_eq!(got.addresses.unwrap().0, addr("[::1]:7"));
        // LOCAL (a health check): no client, whatever follows.
        assert_eq!(parse(&v2(0, 0x00, &[])).unwrap().unwrap().addresses, None);
        assert!(matches!(
            parse(&v2(1, 0x11, &[1, 2, 3])),
            Err(ProxyError::Malformed(_))
        ));
        assert!(matches!(
            parse(&v2(2, 0x11, &body)),
            Err(ProxyError::Malformed(_))
        ));
        let mut wrong_version = v2(1, 0x11, &body);
        wrong_version[12] = 0x11;
        assert!(matches!(
            parse(&wrong_version),
            Err(ProxyError::Malformed(_))
        ));
    }
}
