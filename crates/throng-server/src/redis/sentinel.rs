//! Finding the master through Redis Sentinel (`--redis-sentinel`,
//! `--redis-master`): `SENTINEL get-master-addr-by-name` asked of each
//! sentinel in turn before every connection, and a watch on a sentinel's
//! `+switch-master` channel so that a node leaves a master that was
//! demoted while it still answers. Reading the replies is sans-I/O
//! ([`addr_of`], [`switched`]); the two small async functions move bytes.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rustls::ClientConfig;
use throng_client::redis::RedisUrl;
use throng_proto::resp::{self, Push, Value};

use super::cluster::Addr;
use super::error::SessionError;

/// How long a sentinel may take to connect or answer.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Where to ask: the sentinels, the master's name, and how to connect
/// (the node's TLS choice, none of Redis's credentials: a sentinel has
/// its own, and usually none).
#[derive(Clone)]
pub(crate) struct Sentinels {
    /// The sentinels, asked in turn.
    pub(crate) addrs: Vec<Addr>,
    /// The master's name.
    pub(crate) master: String,
    /// TLS to the sentinels too (`rediss://`).
    pub(crate) tls: Option<Arc<ClientConfig>>,
}

/// The channel sentinels announce a failover on.
const SWITCH: &[u8] = b"+switch-master";

impl Sentinels {
    fn url(&self, s: &Addr) -> RedisUrl {
        RedisUrl {
            host: s.host.clone(),
            port: s.port,
            user: None,
            password: None,
            db: 0,
            tls: self.tls.is_some(),
        }
    }
}

/// The master's address, from the first sentinel (in the order given)
/// that knows it.
pub(crate) async fn resolve(q: &Sentinels) -> Result<Addr, SessionError> {
    let master = &q.master;
    let mut why = Vec::new();
    for s in &q.addrs {
        match ask(q, s).await {
            Ok(a) => return Ok(a),
            Err(e) => why.push(format!("{s}: {e}")),
        }
    }
    Err(SessionError::Sentinel(format!(
        "no sentinel named master '{master}' ({})",
        why.join("; ")
    )))
}

/// Asks sentinel `s` where the master is.
async fn ask(q: &Sentinels, s: &Addr) -> Result<Addr, String> {
    let args: [&[u8]; 3] = [b"SENTINEL", b"get-master-addr-by-name", q.master.as_bytes()];
    let v = super::oneshot::ask(&q.url(s), q.tls.as_ref(), &args, TIMEOUT).await?;
    addr_of(&v).ok_or_else(|| match v {
        Value::Error(e) => String::from_utf8_lossy(&e).into_owned(),
        _ => "it does not know that master".to_owned(),
    })
}

/// `SENTINEL get-master-addr-by-name`'s answer: `[host, port]`, or null
/// for a master it does not know.
pub(crate) fn addr_of(v: &Value) -> Option<Addr> {
    let Value::Array(Some(items)) = v else {
        return None;
    };
    let host = std::str::from_utf8(items.first()?.as_bytes()?).ok()?;
    let port = std::str::from_utf8(items.get(1)?.as_bytes()?).ok()?;
    Some(Addr {
        host: host.to_owned(),
        port: port.parse().ok()?,
    })
}

/// A `+switch-master` message: `<name> <old host> <old port> <new host>
/// <new port>`; the new address when it is about `master`.
pub(crate) fn switched(payload: &[u8], master: &str) -> Option<Addr> {
    let text = std::str::from_utf8(payload).ok()?;
    let w: Vec<&str> = text.split_ascii_whitespace().collect();
    if w.len() != 5 || w[0] != master {
        return None;
    }
    Some(Addr {
        host: w[3].to_owned(),
        port: w[4].parse().ok()?,
    })
}

/// Waits until a sentinel announces that the master moved: the new
/// address. Tries the sentinels in turn, a second apart, while none can be
/// heard; never returns without a sentinel (the future is dropped instead).
pub(crate) async fn watch(q: Option<Sentinels>) -> Addr {
    let Some(q) = q else {
        return std::future::pending().await;
    };
    loop {
        for s in &q.addrs {
            if let Some(a) = listen(&q, s).await {
                return a;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Subscribes to one sentinel's `+switch-master`: the new address, or
/// `None` when the sentinel cannot be heard.
async fn listen(q: &Sentinels, s: &Addr) -> Option<Addr> {
    let (mut stream, mut buf) = throng_client::redis::open(&q.url(s), q.tls.as_ref(), TIMEOUT)
        .await
        .ok()?;
    let mut cmd = BytesMut::new();
    resp::encode_command(&mut cmd, &[b"SUBSCRIBE", SWITCH]);
    throng_client::link::write_all(&mut stream, &cmd)
        .await
        .ok()?;
    let dec = resp::Decoder::default();
    loop {
        let v = throng_client::redis::read_value(&mut stream, &mut buf, &dec)
            .await
            .ok()?;
        if let Some(Push::Message { channel, payload }) = Push::parse(&v)
            && &channel[..] == SWITCH
            && let Some(a) = switched(&payload, &q.master)
        {
            return Some(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn sentinel_answers_read() {
        let bulk = |s: &str| Value::Bulk(Some(Bytes::copy_from_slice(s.as_bytes())));
        let v = Value::Array(Some(vec![bulk("127.0.0.1"), bulk("6380")]));
        assert_eq!(addr_of(&v), Addr::parse("127.0.0.1:6380"));
        assert_eq!(addr_of(&Value::Array(None)), None);
        assert_eq!(addr_of(&Value::Error(Bytes::from_static(b"ERR"))), None);
        assert_eq!(
            switched(b"mymaster 127.0.0.1 6380 127.0.0.1 6381", "mymaster"),
            Addr::parse("127.0.0.1:6381")
        );
        assert_eq!(
            switched(b"other 127.0.0.1 6380 127.0.0.1 6381", "mymaster"),
            None
        );
        assert_eq!(switched(b"mymaster 1 2", "mymaster"), None);
    }
}
