//! Sans-I/O protocol code shared by the throng server and load harness.
//!
//! Nothing here touches a socket or a clock: callers hand in bytes and get
//! back parsed heads, frames and the bytes to write. The same WebSocket codec
//! serves both roles ([`ws::Role::Server`] and [`ws::Role::Client`]), the way
//! hyper shares one HTTP/1 state machine between client and server.

pub mod http;
pub mod ws;
