//! Who a connection is from when a load balancer stands in between: the
//! proxies whose word is believed (`--trusted-proxies`, CIDR blocks) and
//! the client address they give, in a PROXY protocol header
//! (`--proxy-protocol`, parsed by `throng_proto::proxy`) or an HTTP
//! request's `X-Forwarded-For`. Sans-I/O: the worker reads the bytes.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An address block: `10.0.0.0/8`, `2001:db8::/32`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

/// A `--trusted-proxies` entry that is not an address block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "'{0}' is not an address block (give ADDRESS/BITS or an address: 10.0.0.0/8, 192.0.2.7, 2001:db8::/32)"
)]
pub struct BadCidr(String);

impl FromStr for Cidr {
    type Err = BadCidr;

    fn from_str(s: &str) -> Result<Self, BadCidr> {
        let bad = || BadCidr(s.to_owned());
        let (ip, bits) = match s.split_once('/') {
            Some((ip, bits)) => (ip, Some(bits)),
            None => (s, None),
        };
        let net: IpAddr = ip.trim().parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match bits {
            Some(b) => b
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(bad)?,
            None => max,
        };
        Ok(Self { net, prefix })
    }
}

impl TryFrom<String> for Cidr {
    type Error = BadCidr;

    fn try_from(s: String) -> Result<Self, BadCidr> {
        s.parse()
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> Self {
        c.to_string()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl Cidr {
    /// Whether `ip` is in the block (an IPv4-mapped IPv6 address counts as
    /// its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => same_prefix(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => same_prefix(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

fn same_prefix(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = (usize::from(bits / 8), bits % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

/// Whether any block of `trusted` holds `ip`.
pub fn trusted(trusted: &[Cidr], ip: IpAddr) -> bool {
    trusted.iter().any(|c| c.contains(ip))
}

/// The client an `X-Forwarded-For` header names, believed only as far as
/// the proxies are trusted: read from the right (each proxy appends the
/// address it heard from), the first address that is not a trusted proxy.
/// `None` when the header is absent, unreadable or names only proxies.
pub fn forwarded_for(trusted_blocks: &[Cidr], headers: &[&[u8]]) -> Option<IpAddr> {
    let mut hops: Vec<IpAddr> = Vec::new();
    for value in headers {
        let text = std::str::from_utf8(value).ok()?;
        for hop in text.split(',') {
            hops.push(hop.trim().parse().ok()?);
        }
    }
    hops.into_iter()
        .rev()
        .find(|ip| !trusted(trusted_blocks, *ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_hold_what_they_should() {
        let c: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(c.contains(ip("10.1.200.3")) && !c.contains(ip("10.2.0.1")));
        assert!(c.contains(ip("::ffff:10.1.0.9")));
        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert_eq!(one.to_string(), "192.0.2.7/32");
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let odd: Cidr = "192.0.2.0/25".parse().unwrap();
        assert!(odd.contains(ip("192.0.2.127")) && !odd.contains(ip("192.0.2.128")));
        let six: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(six.contains(ip("2001:db8:1::1")) && !six.contains(ip("10.0.0.1")));
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains(ip("8.8.8.8")));
        for bad in ["10.0.0.0/33", "host/8", "", "10.0.0.0/x"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn forwarded_for_skips_trusted_hops_from_the_right() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let h = |s: &'static str| s.as_bytes();
        assert_eq!(
            forwarded_for(&trusted, &[h("203.0.113.9, 198.51.100.2, 10.0.0.3")]),
            Some(ip("198.51.100.2")),
            "the client may write anything left of what our proxy heard"
        );
        assert_eq!(
            forwarded_for(&trusted, &[h("10.0.0.2"), h("10.0.0.3")]),
            None
        );
        assert_eq!(forwarded_for(&trusted, &[h("not an address")]), None);
        assert_eq!(forwarded_for(&trusted, &[]), None);
    }
}
