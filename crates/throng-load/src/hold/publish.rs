//! Publishers: send one message to every subscriber of a channel, over the
//! server's HTTP endpoint (`POST /publish/<channel>`), Redis `PUBLISH`, or
//! an MQTT PUBLISH to a broker.
//!
//! Each publisher keeps one connection open and reuses it (HTTP keep-alive,
//! one Redis connection, one MQTT connection), reconnecting after an error. A call returns the
//! number of subscribers the server or broker reported, when it says, and
//! whether the request went out whole: a message whose answer is late or
//! lost was still sent, and its subscribers still get it.
//!
//! The Redis connection is made by [`throng_client::redis::open`], as the server's
//! broker makes its own: TLS for `rediss://`, then `AUTH`/`SELECT` from the
//! URL, so a password-protected or TLS-only Redis takes the publishes.
//!
//! The MQTT publisher connects with a clean session and no keep-alive (so
//! a slow publish rate never has the broker close it), publishes at the
//! QoS asked, and at QoS 1 waits for each PUBACK, whose 5.0 reason may
//! refuse the message. MQTT answers with no subscriber count.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use thiserror::Error;
use throng_client::link::{LinkError, Stream};
use throng_proto::http::{self, BodyDecoder};
use throng_proto::mqtt::{self, Packet, PacketId, QoS};
use throng_proto::resp::{self, Value};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::net::TcpStream;

use super::mqtt::{Refusal, handshake_step, publish};
use super::target::PublishTarget;

/// The largest publish response body read (the server's JSON answer).
const MAX_RESPONSE_BODY: u64 = 64 * 1024;

/// Why a publish failed; each kind is counted as `publish.error.<label>`.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PublishError {
    /// Could not connect to the publish endpoint.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The endpoint.
        addr: SocketAddr,
        /// What the OS said.
        source: io::Error,
    },
    /// The connection failed mid-call.
    #[error("publish connection failed: {0}")]
    Io(#[from] io::Error),
    /// The server answered with a non-2xx status.
    #[error("publish answered HTTP {0}")]
    Status(u16),
    /// The answer was not HTTP / RESP as expected, or Redis answered an error.
    #[error("bad publish answer: {0}")]
    Protocol(String),
    /// No answer within the timeout.
    #[error("publish got no answer within {}", throng_host::units::fmt_duration(*.0))]
    Timeout(Duration),
    /// The connection could not be set up past TCP: the TLS handshake
    /// (`https://`, `rediss://`), or Redis's `AUTH`/`SELECT` and their
    /// answers (a refused TCP connect is [`Self::Connect`]).
    #[error("setting up the publish connection: {0}")]
    Link(LinkError),
    /// TLS trust could not be set up (the CA file).
    #[error("TLS trust for the publish endpoint: {0}")]
    Trust(String),
}

impl PublishError {
    /// A short stable label for counters.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Connect { .. } => "connect",
            Self::Io(_) => "io",
            Self::Status(_) => "status",
            Self::Protocol(_) => "protocol",
            Self::Timeout(_) => "timeout",
            Self::Link(e) => match e {
                LinkError::Tls { .. } | LinkError::TlsTimeout(_) | LinkError::ServerName(_) => {
                    "tls"
                }
                LinkError::Refused(_) => "refused",
                _ => "redis",
            },
            Self::Trust(_) => "tls",
        }
    }
}

/// What one publish call did.
#[derive(Debug)]
pub struct Outcome {
    /// The request went out whole (the server or broker has the message,
    /// whatever became of the answer).
    pub sent: bool,
    /// The subscriber count answered, or why there was no good answer.
    pub answer: Result<Option<u64>, PublishError>,
}

impl Outcome {
    /// Sent, and the server or broker took it: a 2xx answer, or no answer
    /// at all (late, or the connection broke after the request went out).
    /// Not published: never sent, or refused (a non-2xx status, a Redis error).
    pub fn published(&self) -> bool {
        self.sent && !self.refused()
    }

    /// Sent, and refused by the server or broker.
    pub fn refused(&self) -> bool {
        self.sent
            && matches!(
                self.answer,
                Err(PublishError::Status(_) | PublishError::Protocol(_))
            )
    }
}

/// A publisher for one channel.
#[derive(Debug)]
pub struct Publisher {
    target: PublishTarget,
    /// The Redis channel (`<prefix><channel>`); unused for HTTP.
    redis_channel: String,
    timeout: Duration,
    /// The current call's request went out whole.
    written: bool,
    conn: Option<Stream>,
    /// `https://`, `rediss://`: the TLS configuration, made at the first connection.
    tls_config: Option<Arc<rustls::ClientConfig>>,
    out: Vec<u8>,
    inbuf: Vec<u8>,
    /// Redis replies not yet decoded.
    resp_in: BytesMut,
    /// The MQTT connection's decoder (and so its phase).
    mqtt_in: Option<mqtt::Decoder>,
    /// The packet id of the last QoS 1 PUBLISH.
    last_id: u16,
    /// This publisher's number among several to one MQTT broker, which
    /// its client id ends with (two connections with one id would take
    /// each other's session over); `None`: the only one.
    number: Option<usize>,
}

/// The largest packet read from an MQTT broker (its PUBACKs are 4 bytes;
/// anything it sends the publisher is small).
const MAX_MQTT_PACKET: usize = 64 * 1024;

impl Publisher {
    /// A publisher to `target`; `redis_channel` names the Redis channel.
    pub fn new(target: PublishTarget, redis_channel: String, timeout: Duration) -> Self {
        Self {
            target,
            redis_channel,
            timeout,
            written: false,
            conn: None,
            tls_config: None,
            out: Vec::new(),
            inbuf: Vec::new(),
            resp_in: BytesMut::new(),
            mqtt_in: None,
            last_id: 0,
            number: None,
        }
    }

    /// Publisher number `n` of several at once: over MQTT its client id is
    /// `<prefix>publisher<n>`, not the one `<prefix>publisher` they would share.
    #[must_use]
    pub fn numbered(mut self, n: usize) -> Self {
        self.number = Some(n);
        self
    }

    /// Publishes `payload`: the subscriber count the far end reported, and
    /// whether the request went out (a timeout covers connecting, sending
    /// and the answer). `on_sent` runs as soon as the request is out whole,
    /// before the answer: a message counts as sent then, not seconds later.
    pub async fn publish(&mut self, payload: &[u8], on_sent: &mut dyn FnMut()) -> Outcome {
        let timeout = self.timeout;
        self.written = false;
        let answer = match tokio::time::timeout(timeout, self.publish_inner(payload, on_sent)).await
        {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => {
                // A status error came with a whole response: the connection
                // is still good. Anything else leaves it in an unknown state.
                if !matches!(e, PublishError::Status(_)) {
                    self.conn = None;
                }
                Err(e)
            }
            Err(_) => {
                self.conn = None;
                Err(PublishError::Timeout(timeout))
            }
        };
        Outcome {
            sent: self.written,
            answer,
        }
    }

    async fn publish_inner(
        &mut self,
        payload: &[u8],
        on_sent: &mut dyn FnMut(),
    ) -> Result<Option<u64>, PublishError> {
        if self.conn.is_none() {
            self.inbuf.clear();
            self.resp_in.clear();
            self.conn = Some(self.connect().await?);
        }
        self.out.clear();
        match &self.target {
            PublishTarget::Http { host, path, .. } => {
                http::write_request(
                    &mut self.out,
                    "POST",
                    path,
                    &[("Host", host.as_bytes()), ("Content-Type", b"text/plain")],
                    payload,
                );
            }
            PublishTarget::Redis { .. } => resp::encode_command(
                &mut self.out,
                &[b"PUBLISH", self.redis_channel.as_bytes(), payload],
            ),
            PublishTarget::Mqtt { topic, options, .. } => {
                // Ids run 1..=65535 and wrap; one message is in flight at a time.
                let id = PacketId::new(self.last_id.wrapping_add(1)).unwrap_or(PacketId::MIN);
                if options.qos() != QoS::AtMostOnce {
                    self.last_id = id.get();
                }
                publish(
                    options.version(),
                    topic,
                    options.delivery(id),
                    payload,
                    &mut self.out,
                )
                .map_err(|e| PublishError::Protocol(e.to_string()))?;
            }
        }
        let Some(conn) = self.conn.as_mut() else {
            return Err(PublishError::Protocol("no connection".into()));
        };
        throng_client::link::write_all(conn, &self.out).await?;
        self.written = true;
        on_sent();
        match &self.target {
            PublishTarget::Http { .. } => {
                let (status, n, keep) = read_http(conn, &mut self.inbuf).await?;
                if !keep {
                    self.conn = None;
                }
                if !(200..300).contains(&status) {
                    return Err(PublishError::Status(status));
                }
                Ok(n)
            }
            PublishTarget::Redis { .. } => {
                read_redis_integer(conn, &mut self.resp_in).await.map(Some)
            }
            PublishTarget::Mqtt { options, .. } => {
                let (qos, version) = (options.qos(), options.version());
                self.mqtt_answer(qos, version).await
            }
        }
    }

    /// Waits for the broker's answer to the PUBLISH just written at `qos`:
    /// PUBACK at QoS 1; PUBREC, then PUBREL sent, then PUBCOMP at QoS 2.
    async fn mqtt_answer(
        &mut self,
        qos: QoS,
        version: mqtt::Version,
    ) -> Result<Option<u64>, PublishError> {
        if qos == QoS::AtMostOnce {
            return Ok(None);
        }
        let (Some(conn), Some(decoder)) = (self.conn.as_mut(), self.mqtt_in.as_mut()) else {
            return Err(PublishError::Protocol("no MQTT connection".into()));
        };
        let want = self.last_id;
        loop {
            match read_mqtt(conn, decoder, &mut self.inbuf).await? {
                Answered::Ack(kind, id, reason) if id == want => {
                    if reason.is_error() {
                        return Err(PublishError::Protocol(format!(
                            "{kind} refused the message: reason {:#04x}",
                            reason.0
                        )));
                    }
                    if kind != "PUBREC" {
                        return Ok(None);
                    }
                    let id = PacketId::new(want).unwrap_or(PacketId::MIN);
                    self.out.clear();
                    handshake_step(true, id, version, &mut self.out);
                    throng_client::link::write_all(conn, &self.out).await?;
                }
                // An older message's late answer, a PINGRESP, a PUBLISH.
                Answered::Ack(..) | Answered::Other => {}
                Answered::Connack(_) => {
                    return Err(PublishError::Protocol("a second CONNACK".into()));
                }
            }
        }
    }
}

/// What the broker sent the publisher.
enum Answered {
    /// CONNACK with its code.
    Connack(mqtt::ReasonCode),
    /// PUBACK, PUBREC or PUBCOMP (named) for this packet id, with its reason.
    Ack(&'static str, u16, mqtt::ReasonCode),
    /// Anything else.
    Other,
}

/// Reads one packet from the broker; a 5.0 DISCONNECT is an error.
async fn read_mqtt<S: AsyncRead + Unpin>(
    conn: &mut S,
    decoder: &mut mqtt::Decoder,
    buf: &mut Vec<u8>,
) -> Result<Answered, PublishError> {
    loop {
        let decoded = decoder
            .decode(buf)
            .map_err(|e| PublishError::Protocol(format!("MQTT: {e}")))?;
        if let Some(d) = decoded {
            let answer = match d.packet {
                Packet::Connack(c) => Answered::Connack(c.code),
                Packet::Puback(a) => Answered::Ack("PUBACK", a.packet_id.get(), a.reason),
                Packet::Pubrec(a) => Answered::Ack("PUBREC", a.packet_id.get(), a.reason),
                Packet::Pubcomp(a) => Answered::Ack("PUBCOMP", a.packet_id.get(), a.reason),
                Packet::Disconnect(d) => {
                    return Err(PublishError::Protocol(format!(
                        "the broker sent DISCONNECT: reason {:#04x}",
                        d.reason.0
                    )));
                }
                _ => Answered::Other,
            };
            let n = d.consumed;
            buf.drain(..n);
            return Ok(answer);
        }
        fill(conn, buf).await?;
    }
}

impl Publisher {
    /// A new connection: plain TCP for HTTP; for Redis, TCP (and TLS)
    /// greeted with `AUTH`/`SELECT`/`PING` (their answers read here; what
    /// came after them goes to `resp_in`).
    async fn connect(&mut self) -> Result<Stream, PublishError> {
        match &self.target {
            PublishTarget::Http { addr, tls, .. } => {
                plain_or_tls(*addr, tls.as_ref(), &mut self.tls_config, self.timeout).await
            }
            PublishTarget::Mqtt {
                addr, tls, options, ..
            } => {
                let mut conn =
                    plain_or_tls(*addr, tls.as_ref(), &mut self.tls_config, self.timeout).await?;
                self.out.clear();
                let id = match self.number {
                    None => format!("{}publisher", options.client_id_prefix),
                    Some(n) => format!("{}publisher{n}", options.client_id_prefix),
                };
                options.connect(&id, 0, &mut self.out);
                throng_client::link::write_all(&mut conn, &self.out).await?;
                let mut decoder = mqtt::Decoder::client(options.version(), MAX_MQTT_PACKET);
                match read_mqtt(&mut conn, &mut decoder, &mut self.inbuf).await? {
                    Answered::Connack(code) if code.is_error() => {
                        return Err(PublishError::Protocol(Refusal::Connack(code).to_string()));
                    }
                    Answered::Connack(_) => {}
                    // Invariant: a client's decoder refuses anything but CONNACK first.
                    _ => return Err(PublishError::Protocol("no CONNACK".into())),
                }
                self.mqtt_in = Some(decoder);
                self.last_id = 0;
                Ok(conn)
            }
            PublishTarget::Redis { addr, url, trust } => {
                if url.tls && self.tls_config.is_none() {
                    self.tls_config = trust
                        .client_config(url)
                        .map_err(|e| PublishError::Trust(e.to_string()))?;
                }
                let (s, rest) =
                    throng_client::redis::open(url, self.tls_config.as_ref(), self.timeout)
                        .await
                        .map_err(|e| match e {
                            LinkError::Connect(source) => PublishError::Connect {
                                addr: *addr,
                                source,
                            },
                            e => PublishError::Link(e),
                        })?;
                self.resp_in = rest;
                Ok(s)
            }
        }
    }
}

/// A TCP connection to `addr`, with TLS when `tls` names the server
/// and its trust (whose configuration is made once, into `config`).
async fn plain_or_tls(
    addr: SocketAddr,
    tls: Option<&(String, throng_client::trust::Trust)>,
    config: &mut Option<Arc<rustls::ClientConfig>>,
    timeout: Duration,
) -> Result<Stream, PublishError> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|source| PublishError::Connect { addr, source })?;
    s.set_nodelay(true)?;
    let Some((name, trust)) = tls else {
        return Ok(Stream::Plain(s));
    };
    let made = match config {
        Some(c) => c.clone(),
        None => {
            let c = trust
                .tls_config()
                .map_err(|e| PublishError::Trust(e.to_string()))?;
            *config = Some(c.clone());
            c
        }
    };
    throng_client::link::tls_handshake(s, name, &made, timeout)
        .await
        .map_err(PublishError::Link)
}

async fn fill<S: AsyncRead + Unpin>(conn: &mut S, buf: &mut Vec<u8>) -> Result<(), PublishError> {
    let old = buf.len();
    buf.resize(old + 4096, 0);
    let n = conn.read(&mut buf[old..]).await?;
    buf.truncate(old + n);
    if n == 0 {
        return Err(PublishError::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(())
}

/// Reads one HTTP response; returns its status, the `subscribers` count
/// from a JSON body, if any, and whether the connection stays open.
async fn read_http<S: AsyncRead + Unpin>(
    conn: &mut S,
    buf: &mut Vec<u8>,
) -> Result<(u16, Option<u64>, bool), PublishError> {
    let (resp, head_len) = loop {
        match http::parse_response(buf, http::MAX_HEAD) {
            Ok(Some(r)) => break r,
            Ok(None) => fill(conn, buf).await?,
            Err(e) => return Err(PublishError::Protocol(e.to_string())),
        }
    };
    buf.drain(..head_len);
    let kind = resp
        .body_kind("POST")
        .map_err(|e| PublishError::Protocol(e.to_string()))?;
    let mut decoder = BodyDecoder::new(kind, MAX_RESPONSE_BODY);
    let mut body = Vec::new();
    let mut eof = false;
    loop {
        let step = decoder
            .decode(buf, eof)
            .map_err(|e| PublishError::Protocol(e.to_string()))?;
        body.extend_from_slice(&buf[step.data.0..step.data.1]);
        buf.drain(..step.consumed);
        if step.done {
            break;
        }
        if eof {
            return Err(PublishError::Protocol("response body cut short".into()));
        }
        if step.consumed == 0 || buf.is_empty() {
            match fill(conn, buf).await {
                Ok(()) => {}
                Err(PublishError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => eof = true,
                Err(e) => return Err(e),
            }
        }
    }
    let subscribers = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("subscribers").and_then(serde_json::Value::as_u64));
    Ok((resp.status, subscribers, resp.keep_alive() && !eof))
}

/// Reads one Redis reply that should be an integer (`:N`); `-ERR` is an error.
async fn read_redis_integer<S: AsyncRead + Unpin>(
    conn: &mut S,
    buf: &mut BytesMut,
) -> Result<u64, PublishError> {
    let decoder = resp::Decoder::default();
    loop {
        match decoder.decode(buf) {
            Ok(Some(v)) => return redis_integer(&v),
            Ok(None) => {}
            Err(e) => return Err(PublishError::Protocol(format!("Redis reply: {e}"))),
        }
        buf.reserve(4096);
        if conn.read_buf(buf).await? == 0 {
            return Err(PublishError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
    }
}

fn redis_integer(v: &Value) -> Result<u64, PublishError> {
    match v {
        Value::Integer(n) => u64::try_from(*n)
            .map_err(|_| PublishError::Protocol(format!("Redis answered {n} subscribers"))),
        Value::Error(e) => Err(PublishError::Protocol(format!(
            "Redis error: {}",
            String::from_utf8_lossy(e)
        ))),
        other => Err(PublishError::Protocol(format!(
            "unexpected Redis reply {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_replies() {
        assert_eq!(redis_integer(&Value::Integer(12)).unwrap(), 12);
        assert!(matches!(
            redis_integer(&Value::Error("ERR wrong".into())),
            Err(PublishError::Protocol(_))
        ));
        assert!(redis_integer(&Value::Simple("OK".into())).is_err());
        assert!(redis_integer(&Value::Integer(-1)).is_err());
    }
}
