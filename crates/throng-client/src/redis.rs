//! Redis: `redis[s]://` URLs, connecting and greeting (`AUTH`/`SELECT`/
//! `PING`), and reading whole RESP values, shared by the server's broker and
//! the harness's publisher.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rustls::ClientConfig;
use thiserror::Error;
use throng_proto::resp::{self, Value};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::net::TcpStream;

use crate::link::{LinkError, Stream, tls_handshake, write_all};

/// A parsed `redis[s]://[user:password@]HOST[:PORT][/DB]`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// Host name or IP address (IPv6 without brackets); also the TLS server name.
    pub host: String,
    /// TCP port (6379 when not given).
    pub port: u16,
    /// ACL user name, if any.
    pub user: Option<String>,
    /// Password (for `AUTH`), if any. Never printed.
    pub password: Option<String>,
    /// Database number for `SELECT` (pub/sub itself ignores it).
    pub db: u32,
    /// `rediss://`: the connection is TLS.
    pub tls: bool,
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Prints the URL with the password replaced by `***`.
impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "rediss://" } else { "redis://" })?;
        match (&self.user, &self.password) {
            (Some(u), Some(_)) => write!(f, "{u}:***@")?,
            (Some(u), None) => write!(f, "{u}@")?,
            (None, Some(_)) => f.write_str(":***@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}/{}", self.host, self.port, self.db)
        } else {
            write!(f, "{}:{}/{}", self.host, self.port, self.db)
        }
    }
}

/// Why a Redis URL does not parse: the URL (its password hidden) and what
/// is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "invalid Redis URL '{url}': {fault} (expected redis://[user:password@]HOST[:PORT][/DB], \
     or rediss:// for TLS)"
)]
pub struct RedisUrlError {
    /// The URL as given, its password replaced by `***`.
    pub url: String,
    /// What is wrong with it.
    pub fault: UrlFault,
}

/// What is wrong with a Redis URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum UrlFault {
    /// Neither `redis://` nor `rediss://`.
    #[error("it must start with redis:// or rediss://")]
    Scheme,
    /// The path is not a database number.
    #[error("the database after '/' must be a number")]
    Db,
    /// An IPv6 host without its `]`.
    #[error("unclosed '[' in host")]
    Bracket,
    /// Nothing between the scheme and the port or path.
    #[error("no host")]
    NoHost,
    /// The port is not 1-65535.
    #[error("the port must be a number 1-65535")]
    Port,
    /// The user name has a `%` not followed by two hex digits.
    #[error("bad %-escape in the user")]
    UserEscape,
    /// The password has a `%` not followed by two hex digits.
    #[error("bad %-escape in the password")]
    PasswordEscape,
    /// Another client's Sentinel URL form (`redis+sentinel://`).
    #[error(
        "for Sentinel give --redis-sentinel HOST:PORT[,HOST:PORT...] --redis-master NAME; \
         for a Redis Cluster --redis-cluster HOST:PORT[,...]"
    )]
    Sentinel,
}

impl FromStr for RedisUrl {
    type Err = RedisUrlError;
    fn from_str(url: &str) -> Result<Self, RedisUrlError> {
        let bad = |fault: UrlFault| RedisUrlError {
            url: redact(url),
            fault,
        };
        let (tls, rest) = if let Some(r) = url.strip_prefix("rediss://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("redis://") {
            (false, r)
        } else if url.starts_with("redis+sentinel://") || url.starts_with("redis-sentinel://") {
            // Another client's URL form: say what this one takes instead.
            return Err(bad(UrlFault::Sentinel));
        } else {
            return Err(bad(UrlFault::Scheme));
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (Some(a), r),
            None => (None, rest),
        };
        let (hostport, db) = match rest.split_once('/') {
            Some((h, "")) => (h, 0),
            Some((h, d)) => (h, d.parse().map_err(|_| bad(UrlFault::Db))?),
            None => (rest, 0),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, p) = v6.split_once(']').ok_or_else(|| bad(UrlFault::Bracket))?;
            (h, p.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad(UrlFault::NoHost));
        }
        let port = match port {
            Some(p) => p
                .parse()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad(UrlFault::Port))?,
            None => 6379,
        };
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => {
                let (u, p) = match a.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (a, None),
                };
                let u = percent_decode(u).ok_or_else(|| bad(UrlFault::UserEscape))?;
                let p = match p {
                    Some(p) => {
                        Some(percent_decode(p).ok_or_else(|| bad(UrlFault::PasswordEscape))?)
                    }
                    None => None,
                }
                .filter(|p| !p.is_empty());
                ((!u.is_empty()).then_some(u), p)
            }
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            user,
            password,
            db,
            tls,
        })
    }
}

impl RedisUrl {
    /// The commands sent on every new connection before anything else
    /// (`AUTH`, `SELECT`, `PING`), and how many replies they get.
    pub fn hello(&self) -> (BytesMut, usize) {
        let mut out = BytesMut::new();
        let mut n = 0;
        if let Some(p) = &self.password {
            match &self.user {
                Some(u) => resp::encode_command(&mut out, &[b"AUTH", u.as_bytes(), p.as_bytes()]),
                None => resp::encode_command(&mut out, &[b"AUTH", p.as_bytes()]),
            }
            n += 1;
        }
        if self.db != 0 {
            resp::encode_command(&mut out, &[b"SELECT", self.db.to_string().as_bytes()]);
            n += 1;
        }
        resp::encode_command(&mut out, &[b"PING"]);
        (out, n + 1)
    }
}

/// The URL with anything between `//` and `@` hidden, for error messages.
fn redact(url: &str) -> String {
    match (url.find("//"), url.rfind('@')) {
        (Some(s), Some(a)) if a > s => format!("{}***{}", &url[..s + 2], &url[a..]),
        _ => url.to_owned(),
    }
}

/// Decodes `%XX` escapes (for user names and passwords with `@`, `:` or `/`).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Connects to `url` (over TLS with `tls`, from [`crate::trust::Trust::client_config`]),
/// sends the hello and checks its replies. Each step gets `timeout`.
/// Returns the stream and any bytes read past the hello replies.
pub async fn open(
    url: &RedisUrl,
    tls: Option<&Arc<ClientConfig>>,
    timeout: Duration,
) -> Result<(Stream, BytesMut), LinkError> {
    let tcp = tokio::time::timeout(timeout, TcpStream::connect((url.host.as_str(), url.port)))
        .await
        .map_err(|_| LinkError::Timeout {
            what: "connection",
            limit: timeout,
        })?
        .map_err(LinkError::Connect)?;
    let _ = tcp.set_nodelay(true);
    let mut s = match tls {
        None => Stream::Plain(tcp),
        Some(config) => tls_handshake(tcp, &url.host, config, timeout).await?,
    };
    let (hello, replies) = url.hello();
    write_all(&mut s, &hello).await.map_err(LinkError::Io)?;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let dec = resp::Decoder::default();
    for _ in 0..replies {
        let v = tokio::time::timeout(timeout, read_value(&mut s, &mut buf, &dec))
            .await
            .map_err(|_| LinkError::Timeout {
                what: "answer",
                limit: timeout,
            })??;
        if let Value::Error(e) = v {
            return Err(LinkError::Refused(String::from_utf8_lossy(&e).into_owned()));
        }
    }
    Ok((s, buf))
}

/// Reads until `buf` holds one whole RESP value.
pub async fn read_value<R: AsyncRead + Unpin>(
    s: &mut R,
    buf: &mut BytesMut,
    dec: &resp::Decoder,
) -> Result<Value, LinkError> {
    loop {
        if let Some(v) = dec
            .decode(buf)
            .map_err(|e| LinkError::Protocol(e.to_string()))?
        {
            return Ok(v);
        }
        buf.reserve(4096);
        match s.read_buf(buf).await {
            Ok(0) => return Err(LinkError::Closed),
            Ok(_) => {}
            Err(e) => return Err(LinkError::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u: RedisUrl = "redis://127.0.0.1:6380/2".parse().unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.db, u.tls),
            ("127.0.0.1", 6380, 2, false)
        );
        assert_eq!(u.user, None);
        let u: RedisUrl = "redis://alice:s%40cret%3A1@redis.local".parse().unwrap();
        assert_eq!(u.user.as_deref(), Some("alice"));
        assert_eq!(u.password.as_deref(), Some("s@cret:1"));
        assert_eq!((u.port, u.db), (6379, 0));
        assert_eq!(u.to_string(), "redis://alice:***@redis.local:6379/0");
        let u: RedisUrl = "redis://:pw@[::1]:7000/".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 7000));
        assert_eq!((u.user, u.password.as_deref()), (None, Some("pw")));
        let u: RedisUrl = "rediss://bob:pw@cache.example:6380/1".parse().unwrap();
        assert!(u.tls);
        assert_eq!(u.to_string(), "rediss://bob:***@cache.example:6380/1");
        for bad in [
            "http://x",
            "redis://",
            "rediss://",
            "redis://h:0",
            "redis://h:99999",
            "redis://h/x",
            "redis://u:%zz@h",
        ] {
            assert!(bad.parse::<RedisUrl>().is_err(), "{bad}");
        }
        // Another client's Sentinel URL: pointed at the options instead.
        let e = "redis+sentinel://h:26379/m"
            .parse::<RedisUrl>()
            .unwrap_err();
        assert_eq!(e.fault, UrlFault::Sentinel);
        assert!(e.to_string().contains("--redis-sentinel"), "{e}");
        let e = "redis://u:topsecret@h:1/x".parse::<RedisUrl>().unwrap_err();
        assert!(!e.to_string().contains("topsecret"), "{e}");
        assert_eq!(e.fault, UrlFault::Db);
    }

    #[test]
    fn hello_authenticates_and_selects() {
        let u: RedisUrl = "redis://bob:pw@h/3".parse().unwrap();
        let (out, n) = u.hello();
        assert_eq!(n, 3);
        assert_eq!(
            &out[..],
            b"*3\r\n$4\r\nAUTH\r\n$3\r\nbob\r\n$2\r\npw\r\n*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n*1\r\n$4\r\nPING\r\n"
        );
        let u: RedisUrl = "redis://h".parse().unwrap();
        assert_eq!(u.hello().1, 1);
    }
}
