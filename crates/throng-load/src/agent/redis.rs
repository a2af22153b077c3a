//! One Redis connection of an agent or a controller: `throng-client`'s
//! connect and greeting (TLS for `rediss://`, `AUTH`, `SELECT`), then
//! commands one at a time, or, once subscribed, the pushes that arrive.
//! There are two per process (one to command, one subscribed), so nothing
//! here is pipelined or pooled.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rustls::ClientConfig;
use throng_client::link::{LinkError, Stream, write_all};
use throng_client::redis::{RedisUrl, open, read_value};
use throng_proto::resp::{self, Push, Value};

use crate::harness::clock::now_unix_ns;

/// How long a connect, a greeting or an answer may take.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Where Redis is and how to reach it.
#[derive(Debug, Clone)]
pub struct Redis {
    /// The URL.
    pub url: RedisUrl,
    /// TLS for `rediss://`.
    pub tls: Option<Arc<ClientConfig>>,
}

/// A greeted connection.
#[derive(Debug)]
pub struct Conn {
    stream: Stream,
    buf: BytesMut,
    dec: resp::Decoder,
    out: BytesMut,
}

impl Conn {
    /// Connects and greets (`AUTH`, `SELECT`, `PING`).
    pub async fn open(redis: &Redis) -> Result<Self, LinkError> {
        let (stream, buf) = open(&redis.url, redis.tls.as_ref(), TIMEOUT).await?;
        Ok(Self {
            stream,
            buf,
            dec: resp::Decoder::default(),
            out: BytesMut::new(),
        })
    }

    /// Sends one command and reads its answer; an error answer is
    /// [`LinkError::Refused`].
    pub async fn call(&mut self, args: &[&[u8]]) -> Result<Value, LinkError> {
        self.send(args).await?;
        let v = tokio::time::timeout(
            TIMEOUT,
            read_value(&mut self.stream, &mut self.buf, &self.dec),
        )
        .await
        .map_err(|_| LinkError::Timeout {
            what: "answer",
            limit: TIMEOUT,
        })??;
        match v {
            Value::Error(e) => Err(LinkError::Refused(String::from_utf8_lossy(&e).into_owned())),
            v => Ok(v),
        }
    }

    async fn send(&mut self, args: &[&[u8]]) -> Result<(), LinkError> {
        self.out.clear();
        resp::encode_command(&mut self.out, args);
        tokio::time::timeout(TIMEOUT, write_all(&mut self.stream, &self.out))
            .await
            .map_err(|_| LinkError::Timeout {
                what: "write",
                limit: TIMEOUT,
            })?
            .map_err(LinkError::Io)
    }

    /// `PUBLISH channel message`: how many subscribers got it.
    pub async fn publish(&mut self, channel: &str, message: &[u8]) -> Result<i64, LinkError> {
        match self
            .call(&[b"PUBLISH", channel.as_bytes(), message])
            .await?
        {
            Value::Integer(n) => Ok(n),
            v => Err(unexpected("PUBLISH", &v)),
        }
    }

    /// `SUBSCRIBE channel`, once its confirmation came: from then on the
    /// connection only carries pushes ([`Self::message`]).
    pub async fn subscribe(&mut self, channel: &str) -> Result<(), LinkError> {
        self.send(&[b"SUBSCRIBE", channel.as_bytes()]).await?;
        loop {
            let v = tokio::time::timeout(TIMEOUT, self.value())
                .await
                .map_err(|_| LinkError::Timeout {
                    what: "subscription",
                    limit: TIMEOUT,
                })??;
            match Push::parse(&v) {
                Some(Push::Subscription { .. }) => return Ok(()),
                _ => {
                    if let Value::Error(e) = v {
                        return Err(LinkError::Refused(String::from_utf8_lossy(&e).into_owned()));
                    }
                }
            }
        }
    }

    /// The next value Redis sends (no time limit: a subscribed connection
    /// waits for pushes). Cancel-safe: bytes read stay in the buffer.
    pub async fn value(&mut self) -> Result<Value, LinkError> {
        read_value(&mut self.stream, &mut self.buf, &self.dec).await
    }

    /// The next message published on a subscribed channel: its payload.
    pub async fn message(&mut self) -> Result<bytes::Bytes, LinkError> {
        loop {
            let v = self.value().await?;
            match Push::parse(&v) {
                Some(Push::Message { payload, .. }) => return Ok(payload),
                Some(_) => {}
                None => return Err(unexpected("a subscribed connection", &v)),
            }
        }
    }

    /// This clock less Redis's (`TIME`, read halfway through the round
    /// trip), and the round trip, ns.
    pub async fn clock_offset(&mut self) -> Result<(i64, u64), LinkError> {
        let sent = now_unix_ns();
        let v = self.call(&[b"TIME"]).await?;
        let back = now_unix_ns();
        let redis_ns = match &v {
            Value::Array(Some(items)) if items.len() == 2 => {
                let num = |i: usize| {
                    items[i]
                        .as_bytes()
                        .and_then(|b| std::str::from_utf8(b).ok())
                        .and_then(|s| s.parse::<u64>().ok())
                };
                match (num(0), num(1)) {
                    (Some(s), Some(us)) => s * 1_000_000_000 + us * 1_000,
                    _ => return Err(unexpected("TIME", &v)),
                }
            }
            _ => return Err(unexpected("TIME", &v)),
        };
        let mid = sent + back.saturating_sub(sent) / 2;
        let offset = i64::try_from(i128::from(mid) - i128::from(redis_ns)).unwrap_or(i64::MAX);
        Ok((offset, back.saturating_sub(sent)))
    }

    /// Every key matching `pattern` (`SCAN`, never `KEYS`: a shared Redis
    /// is not blocked).
    pub async fn scan(&mut self, pattern: &str) -> Result<Vec<String>, LinkError> {
        let mut cursor = "0".to_owned();
        let mut keys = Vec::new();
        loop {
            let v = self
                .call(&[
                    b"SCAN",
                    cursor.as_bytes(),
                    b"MATCH",
                    pattern.as_bytes(),
                    b"COUNT",
                    b"1000",
                ])
                .await?;
            let Value::Array(Some(items)) = &v else {
                return Err(unexpected("SCAN", &v));
            };
            let (Some(next), Some(Value::Array(Some(found)))) =
                (items.first().and_then(Value::as_bytes), items.get(1))
            else {
                return Err(unexpected("SCAN", &v));
            };
            keys.extend(
                found
                    .iter()
                    .filter_map(Value::as_bytes)
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
            );
            cursor = String::from_utf8_lossy(next).into_owned();
            if cursor == "0" {
                break;
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// `GET key`: `None` if there is none.
    pub async fn get(&mut self, key: &str) -> Result<Option<bytes::Bytes>, LinkError> {
        match self.call(&[b"GET", key.as_bytes()]).await? {
            Value::Bulk(b) => Ok(b),
            v => Err(unexpected("GET", &v)),
        }
    }
}

fn unexpected(what: &str, v: &Value) -> LinkError {
    LinkError::Protocol(format!("unexpected answer to {what}: {v:?}"))
}
