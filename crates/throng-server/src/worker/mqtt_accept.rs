//! The accept step of an `--mqtt-listen` connection, beside [`super::http`]
//! for HTTP ones: per-address limits, the TLS handshake (`--mqtts-listen`),
//! CONNECT within `--handshake-timeout`, the credential, CONNACK; then the
//! socket leaves tokio for the worker's epoll, and the connection is an
//! MQTT subscriber ([`super::mqtt`]) in the worker's tables.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use throng_proto::mqtt::{
    self, Connack, Decoder, Packet, Properties, PropertiesBuf, Property, ReasonCode, Version,
};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::conn::{Conn, NONE, TlsState};
use super::gate;
use super::mqtt::{Mqtt, Persist, Will, encode};
use super::mqtt_auth::{self, Admitted};
use super::mqtt_ids;
use super::mqtt_qos::RECEIVE_MAX;
use super::mqtt_session;
use super::mqtt_ws;
use super::state::Worker;
use super::subscribers::{SessionStart, max_packet};
use crate::addresses::Source;
use crate::channel;
use crate::control::Claim;
use crate::tls::stream::{Io, TlsStream};
use crate::wheel;

thread_local! {
    // Clients given an id by this worker (5.0, empty client id), for a unique one.
    static ASSIGNED: Cell<u64> = const { Cell::new(0) };
}

/// Serves one connection from an `--mqtt-listen` listener: per-address
/// limits first (a refused connection is just closed: MQTT has no word for
/// it before CONNECT), then the handshake.
pub(crate) async fn serve(
    w: Rc<Worker>,
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let source = if w.cfg.per_address.any() {
        let source = Source::of(peer.ip());
        // Boxed, as the TLS handshake below: only some connections wait
        // here, every one would carry room for it.
        let verdict = Box::pin(w.supervisor.admit(source)).await;
        if let Some(label) = verdict.label() {
            w.counters.refused(label);
            return;
        }
        Some(source)
    } else {
        None
    };
    let ticket = Cell::new(source);
    let stream = match tls {
        None => Io::Plain(tcp),
        Some(config) => {
            // Boxed: a TLS handshake's state (rustls's connection) is most
            // of 2 KB, and every plain connection's task, while it waits
            // for CONNECT, would otherwise carry room for it: in a burst of
            // connects (devices coming back) that is the memory the
            // allocator keeps afterwards.
            let accept = TlsStream::accept(tcp, config);
            let accepted = Box::pin(tokio::time::timeout(w.cfg.handshake_timeout, accept)).await;
            let failed = match accepted {
                Ok(Ok(s)) => {
                    w.counters.tls_handshake(s.handshake_label());
                    Ok(Io::Tls(Box::new(s)))
                }
                Err(_) => Err("tls_timeout"),
                Ok(Err(e)) => Err(e.label()),
            };
            match failed {
                Ok(io) => io,
                Err(label) => {
                    w.counters.handshake_failed(label);
                    if let Some(source) = ticket.take() {
                        w.supervisor.release(source);
                    }
                    return;
                }
            }
        }
    };
    handshake(&w, stream, &ticket, None).await;
    if let Some(source) = ticket.take() {
        w.supervisor.release(source);
    }
}

/// Serves a WebSocket upgrade that offered subprotocol `mqtt` (on an HTTP
/// or TLS listener, any path): 101 with that subprotocol, then the MQTT
/// handshake over binary frames (`rest`: frames sent behind the request),
/// and the connection is an MQTT subscriber like any other.
pub(crate) async fn over_ws(
    w: &Worker,
    mut stream: Io,
    accept: &str,
    rest: &[u8],
    ticket: &Cell<Option<Source>>,
) {
    let mut out = Vec::with_capacity(160);
    throng_proto::http::write_response_head(
        &mut out,
        101,
        &[
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Accept", accept),
            ("Sec-WebSocket-Protocol", mqtt_ws::SUBPROTOCOL),
        ],
    );
    let written = tokio::time::timeout(w.cfg.handshake_timeout, stream.write_all(&out)).await;
    if !matches!(written, Ok(Ok(()))) {
        w.counters.handshake_failed("write_failed");
        return;
    }
    handshake(w, stream, ticket, Some(rest.to_vec())).await;
}

/// Why no CONNECT came.
enum NoConnect {
    /// The client left first.
    Left,
    /// It broke MQTT.
    Mqtt(mqtt::DecodeError),
    /// It broke MQTT over WebSocket.
    Ws(mqtt_ws::UnwrapError),
}

/// `packet` as it goes on the wire: in a binary frame over WebSocket.
fn framed(ws: bool, packet: Bytes) -> Bytes {
    if ws {
        Bytes::from(mqtt_ws::wrap(&packet))
    } else {
        packet
    }
}

/// What the handshake read: the CONNECT's fields the connection keeps.
struct Connected {
    version: Version,
    keep_alive: u16,
    clean_start: bool,
    /// Empty: 5.0 gets an assigned one in CONNACK.
    client_id_empty: bool,
    /// Its will's topic and payload, and its QoS if it is retained.
    will: Option<(String, Bytes, Option<u8>, Bytes)>,
    /// Its will's 5.0 Will Delay Interval, in seconds.
    will_delay: u32,
    /// Its receive maximum (5.0; 3.1.1 has none).
    receive_max: Option<u16>,
    /// Its password: a token or the publish key (read, then dropped).
    password: Option<Vec<u8>>,
    /// Its client id's hash, for takeover; none when it sent none.
    client_hash: Option<u64>,
    /// Its Maximum Packet Size (5.0).
    max_packet: Option<u32>,
    /// It asked for 5.0 enhanced authentication (an Authentication
    /// Method), which the server does not offer.
    auth_method: bool,
    /// Seconds its session outlives the connection, if it does
    /// ([`mqtt_session::expiry`]).
    session_expiry: Option<u32>,
    /// Its keep-alive was replaced by `--mqtt-max-keep-alive` (5.0):
    /// CONNACK says so.
    server_keep_alive: bool,
}

/// Reads CONNECT (within `--handshake-timeout`), answers CONNACK and hands
/// the connection to the subscribers, holding its address (`ticket`) and
/// its place under `--max-connections`. With `ws` (what was read behind
/// the upgrade request), every packet is carried in WebSocket frames.
async fn handshake(
    w: &Worker,
    mut tcp: Io,
    ticket: &Cell<Option<Source>>,
    mut ws: Option<Vec<u8>>,
) {
    let mut buf: Vec<u8> = Vec::new();
    let Some((connected, used)) = connect(w, &mut tcp, &mut buf, ws.as_mut()).await else {
        return;
    };
    // Boxed: a task waiting for CONNECT (every connection of a burst, as
    // when devices come back at once) then carries only what reading it
    // takes, not room for what follows; the allocator keeps a burst's
    // peak once it is over.
    let read = Read {
        buf,
        used,
        ws,
        connected,
    };
    Box::pin(connected_to(w, tcp, ticket, read)).await;
}

/// What [`handshake`] read: the CONNECT and the bytes behind it.
struct Read {
    buf: Vec<u8>,
    /// The bytes of `buf` the CONNECT took.
    used: usize,
    /// Over WebSocket: what was read and not yet unwrapped.
    ws: Option<Vec<u8>>,
    connected: Connected,
}

/// [`handshake`] from its CONNECT on: admission, CONNACK, and the
/// connection handed to the subscribers.
async fn connected_to(w: &Worker, mut tcp: Io, ticket: &Cell<Option<Source>>, read: Read) {
    let Read {
        buf,
        used,
        mut ws,
        mut connected,
    } = read;
    let over_ws = ws.is_some();
    let version = connected.version;
    if let Some(max) = w.cfg.mqtt_max_keep_alive
        && version == Version::V5
        && (connected.keep_alive == 0 || connected.keep_alive > max)
    {
        connected.keep_alive = max;
        connected.server_keep_alive = true;
    }
    let (admitted, will) = match admit(w, &mut connected) {
        Ok(admitted) => admitted,
        Err(code) => {
            let out = framed(over_ws, refusal(version, code));
            let _ = tokio::time::timeout(w.cfg.handshake_timeout, tcp.write_all(&out)).await;
            return;
        }
    };
    let counted = &w.subs.outside().counted;
    // Taken before the CONNACK goes out: a client's next CONNECT comes
    // after it, so claims order as the client made them.
    let claim = connected.client_hash.map(|hash| {
        let at = throng_host::process::monotonic().as_nanos();
        let claim = Claim {
            at_ns: u64::try_from(at).unwrap_or(u64::MAX),
            worker: u32::try_from(w.index).unwrap_or(u32::MAX),
        };
        (hash, claim)
    });
    // A resume's CONNACK waits for the session (session present).
    let resume = !connected.clean_start && connected.client_hash.is_some();
    let connacks = [false, true].map(|present| framed(over_ws, connack(w, &connected, present)));
    if !resume {
        let written =
            tokio::time::timeout(w.cfg.handshake_timeout, tcp.write_all(&connacks[0])).await;
        if !matches!(written, Ok(Ok(()))) {
            counted.give_place();
            w.counters.handshake_failed("write_failed");
            return;
        }
    }
    // From here on the socket lives in the worker's own epoll, not tokio's.
    let (sock, mut rest, tls) = match tcp {
        Io::Plain(tcp) => (tcp.into_std(), buf[used..].to_vec(), None),
        Io::Tls(s) => {
            let parts = s.into_parts();
            // Packets behind the CONNECT: what was read, then what was
            // decrypted but not read.
            let mut plain = buf[used..].to_vec();
            let after = match ws.as_mut() {
                Some(raw) => raw,
                None => &mut plain,
            };
            after.extend_from_slice(&parts.plain_rest);
            let tls = TlsState::new(parts.conn, &parts.cipher_rest);
            (parts.tcp.into_std(), plain, Some(tls))
        }
    };
    if let Some(raw) = &ws {
        // A packet begun behind the CONNECT, then frames not yet unwrapped.
        rest = mqtt_ws::keep(&rest, raw);
    }
    let Ok(sock) = sock else {
        counted.give_place();
        w.counters.handshake_failed("write_failed");
        return;
    };
    let mut state = session(&connected, admitted.grants, will);
    state.ws = over_ws;
    let start = connected.client_hash.map(|hash| {
        let id = w.subs.session_id();
        if let Some(expiry) = connected.session_expiry {
            state.state_mut().persist = Some(Box::new(Persist {
                hash,
                id,
                expiry,
                parked: false,
            }));
        }
        SessionStart {
            id,
            resume: resume.then_some(connacks),
            persistent: connected.session_expiry.is_some(),
        }
    });
    let tag = ticket.take().map_or(NONE, |s| counted.tag(s));
    let mut c = Conn::new(sock, w.subs.now(), &rest)
        .with_mqtt(version, state)
        .with_expiry(admitted.expires)
        .with_tag(tag);
    if let Some(tls) = tls {
        c = c.with_tls(tls);
    }
    w.subs.subject_next(admitted.subject);
    if let Err(e) = w.subs.add_mqtt(c, claim, start) {
        counted.release(&w.supervisor, tag);
        w.counters.handshake_failed("epoll");
        log!("throng: worker {}: cannot watch a subscriber: {e}", w.index);
    }
}

/// Reads CONNECT within `--handshake-timeout`: its fields and the bytes of
/// `buf` it took. `None` (counted, and a protocol error answered) when the
/// client was too slow, left, or broke the protocol.
async fn connect(
    w: &Worker,
    tcp: &mut Io,
    buf: &mut Vec<u8>,
    ws: Option<&mut Vec<u8>>,
) -> Option<(Connected, usize)> {
    let max = max_packet(w.cfg.max_message);
    let mut decoder = Decoder::server(max);
    let over_ws = ws.is_some();
    let read = tokio::time::timeout(
        w.cfg.handshake_timeout,
        read_connect(
            tcp,
            &mut decoder,
            buf,
            ws.map(|raw| (raw, max + mqtt_ws::FRAME_SLACK)),
        ),
    )
    .await;
    let out = match read {
        Err(_) => {
            w.counters.handshake_failed("mqtt_timeout");
            return None;
        }
        Ok(Err(NoConnect::Left)) => {
            if !buf.is_empty() {
                w.counters.handshake_failed("mqtt_incomplete");
            }
            return None;
        }
        Ok(Err(NoConnect::Mqtt(e))) => {
            w.counters.handshake_failed("mqtt_bad_connect");
            w.counters.mqtt_refused(e.label());
            let mut out = Vec::new();
            decoder.answer(&e).encode(&mut out);
            framed(over_ws, Bytes::from(out))
        }
        Ok(Err(NoConnect::Ws(e))) => {
            w.counters.handshake_failed("mqtt_bad_connect");
            w.counters.mqtt_refused(e.label());
            super::conn::close_frame(e.close_code(), &e.to_string())
        }
        Ok(Ok(got)) => return Some(got),
    };
    let _ = tokio::time::timeout(w.cfg.handshake_timeout, tcp.write_all(&out)).await;
    None
}

/// The CONNACK refusing a client of `version` with `code`.
fn refusal(version: Version, code: ReasonCode) -> Bytes {
    let code = match version {
        // 3.1.1 has six return codes: "server unavailable" for the rest.
        Version::V311 if code.v3_connack().is_none() => ReasonCode::SERVER_UNAVAILABLE,
        _ => code,
    };
    encode(
        version,
        &Packet::Connack(Connack {
            session_present: false,
            code,
            properties: Properties::EMPTY,
        }),
    )
}

/// Lets the client in or not (each refusal counted): not while the worker
/// drains, only with a credential where one is needed, only with a place
/// under `--max-connections` (taken here), and with a will only where it
/// may publish. What its credential grants, and its will.
fn admit(
    w: &Worker,
    connected: &mut Connected,
) -> Result<(Admitted, Option<Box<Will>>), ReasonCode> {
    if w.draining.get() {
        w.counters.handshake_failed("draining");
        return Err(ReasonCode::SERVER_UNAVAILABLE);
    }
    if connected.auth_method {
        w.counters.mqtt_refused("auth_method");
        return Err(ReasonCode::BAD_AUTHENTICATION_METHOD);
    }
    let admitted = mqtt_auth::check(
        w.cfg.auth.publish_guarded(),
        w.verifier.get().as_deref(),
        w.publish_key.get().as_deref(),
        connected.password.as_deref().unwrap_or_default(),
        gate::unix_now(),
    )
    .map_err(|refusal| {
        w.counters.refused(refusal.label());
        mqtt_auth::connack_code(refusal)
    })?;
    let counted = &w.subs.outside().counted;
    if !counted.take_place() {
        w.counters.refused("max_connections");
        return Err(ReasonCode::SERVER_BUSY);
    }
    let Some((channel, payload, retain, properties)) = connected.will.take() else {
        return Ok((admitted, None));
    };
    // A will is a publish: where an MQTT client may not publish, or on a
    // topic that is not a channel, it is refused with the CONNECT.
    let guarded = w.subs.limits().publish_guarded;
    let why = if !w.subs.limits().mqtt_publish {
        Some(("publish_not_here", ReasonCode::NOT_AUTHORIZED))
    } else if channel::validate(&channel).is_err() {
        Some(("bad_channel", ReasonCode::TOPIC_NAME_INVALID))
    } else if !mqtt_auth::may_publish(guarded, admitted.grants.as_deref(), &channel) {
        Some(("will_not_granted", ReasonCode::NOT_AUTHORIZED))
    } else {
        None
    };
    if let Some((label, code)) = why {
        w.counters.mqtt_refused(label);
        counted.give_place();
        return Err(code);
    }
    let will = Will {
        channel,
        payload,
        properties,
        retain,
        delay: connected.will_delay,
        client: connected.client_hash.unwrap_or(0),
    };
    Ok((admitted, Some(Box::new(will))))
}

/// The CONNACK that lets the client in: for 5.0, what this server offers
/// and the client id it assigned.
fn connack(w: &Worker, connected: &Connected, session_present: bool) -> Bytes {
    let version = connected.version;
    let mut props = PropertiesBuf::new();
    let assigned;
    if version == Version::V5 {
        // What this server offers, so a 5.0 client does not try the rest.
        // No Maximum QoS: 2 is served. The Receive Maximum bounds the
        // client's QoS 1 and 2 PUBLISHes awaiting their end here.
        let offer = [
            Property::ReceiveMaximum(RECEIVE_MAX),
            Property::RetainAvailable(1),
            Property::WildcardSubscriptionAvailable(u8::from(w.subs.limits().wildcards)),
            Property::SharedSubscriptionAvailable(1),
            // No Topic Alias Maximum: 0, a client may send none.
            Property::SubscriptionIdentifierAvailable(0),
        ];
        for p in offer {
            let _ = props.push(p);
        }
        if connected.server_keep_alive {
            let _ = props.push(Property::ServerKeepAlive(connected.keep_alive));
        }
        if connected.client_id_empty {
            let n = ASSIGNED.with(|a| {
                let n = a.get() + 1;
                a.set(n);
                n
            });
            assigned = format!("throng-{}-{n}", w.index);
            let _ = props.push(Property::AssignedClientIdentifier(&assigned));
        }
    }
    encode(
        version,
        &Packet::Connack(Connack {
            session_present,
            code: ReasonCode::SUCCESS,
            properties: props.properties(),
        }),
    )
}

/// The new subscriber's state: its keep-alive, receive maximum, grants
/// and will.
fn session(
    connected: &Connected,
    grants: Option<Box<mqtt_auth::MqttGrants>>,
    will: Option<Box<Will>>,
) -> Mqtt {
    // 1.5 times the keep-alive, rounded up to a tick.
    let keep_alive = match connected.keep_alive {
        0 => 0,
        s => wheel::ticks(std::time::Duration::from_millis(u64::from(s) * 1500)).max(1),
    };
    Mqtt::session(
        keep_alive,
        connected.receive_max,
        will,
        grants,
        connected.max_packet,
    )
}

/// Moves the MQTT bytes of the whole frames in `raw` to `buf`; an error
/// for a bad frame, and the client gone for a close.
fn unwrap_into(raw: &mut Vec<u8>, buf: &mut Vec<u8>, max: usize) -> Result<(), NoConnect> {
    let got = mqtt_ws::unwrap(raw, max).map_err(NoConnect::Ws)?;
    buf.extend_from_slice(&raw[..got.data]);
    raw.drain(..got.consumed);
    // A ping before CONNECT goes unanswered: the client is still connecting.
    if got
        .controls
        .iter()
        .any(|c| matches!(c, mqtt_ws::Control::Close(_)))
    {
        return Err(NoConnect::Left);
    }
    Ok(())
}

/// Reads until `decoder` gives the CONNECT; returns its fields and the
/// bytes of `buf` it used (what follows is the client's next packets).
/// With `ws` (the raw bytes and the largest frame), bytes are read into
/// the raw buffer and unwrapped into `buf`.
async fn read_connect(
    tcp: &mut Io,
    decoder: &mut Decoder,
    buf: &mut Vec<u8>,
    mut ws: Option<(&mut Vec<u8>, usize)>,
) -> Result<(Connected, usize), NoConnect> {
    if let Some((raw, max)) = ws.as_mut() {
        unwrap_into(raw, buf, *max)?;
    }
    loop {
        if let Some(d) = decoder.decode(buf).map_err(NoConnect::Mqtt)? {
            let Packet::Connect(c) = d.packet else {
                // The decoder refuses anything else first.
                return Err(NoConnect::Left);
            };
            let version = decoder.version().unwrap_or(Version::V311);
            let will_delay = c
                .will
                .as_ref()
                .and_then(|w| w.properties.will_delay_interval())
                .unwrap_or(0);
            let connected = Connected {
                version,
                keep_alive: c.keep_alive,
                clean_start: c.clean_start,
                client_id_empty: c.client_id.is_empty(),
                will: c.will.map(|w| {
                    let retain = w.retain.then_some(w.qos as u8);
                    (
                        w.topic.to_owned(),
                        Bytes::copy_from_slice(w.payload),
                        retain,
                        super::mqtt::forwarded(w.properties),
                    )
                }),
                will_delay,
                receive_max: c.properties.receive_maximum(),
                password: c.password.map(<[u8]>::to_vec),
                client_hash: (!c.client_id.is_empty()).then(|| mqtt_ids::hash(c.client_id)),
                max_packet: c.properties.maximum_packet_size(),
                auth_method: c.properties.authentication_method().is_some(),
                session_expiry: mqtt_session::expiry(
                    version == Version::V5,
                    c.clean_start,
                    c.properties.session_expiry_interval(),
                ),
                server_keep_alive: false,
            };
            return Ok((connected, d.consumed));
        }
        let into = match ws.as_mut() {
            Some((raw, _)) => &mut **raw,
            None => &mut *buf,
        };
        // Room for a usual CONNECT (a larger one takes more reads): every
        // connection waiting for its CONNECT holds this, and a burst of
        // connects leaves the allocator keeping the peak.
        into.reserve(256);
        match tcp.read_buf(into).await {
            Ok(0) | Err(_) => return Err(NoConnect::Left),
            Ok(_) => {}
        }
        if let Some((raw, max)) = ws.as_mut() {
            unwrap_into(raw, buf, *max)?;
        }
    }
}
