//! Sans-I/O protocol code shared by the throng server and load harness:
//! WebSocket ([`ws`]), HTTP/1.1 heads and bodies ([`http`]), an HTTP/2
//! client connection ([`h2`]), the Redis
//! protocol RESP2 ([`resp`]), Server-Sent Events ([`sse`]) and MQTT 3.1.1
//! and 5.0 ([`mqtt`]), with the topic-filter index ([`mqtt::topic`]), and
//! the PROXY protocol header a load balancer sends first ([`proxy`]).
//!
//! Nothing here touches a socket or a clock: callers hand in bytes and get
//! back parsed heads, frames and the bytes to write. The same WebSocket codec
//! serves both roles ([`ws::Role::Server`] and [`ws::Role::Client`]), the way
//! hyper shares one HTTP/1 state machine between client and server.
//!
//! Bad input is always an error value, never a panic, a hang or memory that
//! grows with what the peer sends: heads are bounded by a caller's limit,
//! messages by the [`ws::Decoder`]'s limit (checked from frame headers,
//! before payloads arrive), bodies by the [`http::BodyDecoder`]'s, MQTT
//! packets by the [`mqtt::Decoder`]'s (checked from the fixed header).
//!
//! How it is checked: table tests beside the code; property tests and
//! interop with tungstenite (handshakes and frames, both directions) in
//! `tests/proto/`; and cargo-fuzz targets in the repository's `fuzz/`
//! directory for the handshake, the frame decoder and HTTP responses.

pub mod deflate;
pub mod h2;
pub mod http;
mod inflate;
pub mod mqtt;
pub mod proxy;
pub mod resp;
pub mod sse;
pub mod ws;
