//! The throng push server: a supervisor process and single-threaded worker
//! processes holding WebSocket subscribers per channel, fed by `POST
//! /publish/<channel>`.
//!
//! - [`supervisor`]: plans the workers, starts and restarts them, relays
//!   published messages through the broker (the local relay, or [`redis`]
//!   shared by many nodes), counts what each worker delivered (`relay`),
//!   renders `/metrics`.
//! - [`worker`]: listeners, HTTP and WebSocket handshakes, subscribers, the
//!   fan-out hot path, heartbeats ([`wheel`]) and draining.
//! - [`control`]: the records on the Unix socket between the two.
//! - [`auth`]: tokens (JWT), channel grants and the publish key: who may
//!   subscribe and publish.
//! - [`tls`]: `--tls-listen` listeners: certificates, rustls settings, and
//!   the unbuffered TLS sessions of handshakes and subscribers.

/// `eprintln!` in one `write(2)`: the supervisor and every worker share one
/// stderr, and `eprintln!` writes a line in pieces, so two processes'
/// lines came out interleaved mid-line.
macro_rules! log {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }};
}

pub mod addresses;
pub mod api;
pub mod auth;
mod broker;
pub mod channel;
pub mod config;
pub mod control;
pub mod history;
pub mod jwks;
pub mod metrics;
mod presence;
pub mod proxied;
pub mod redis;
mod relay;
pub mod reload;
pub mod retained;
mod reuseport;
pub mod sessions;
pub mod shares;
pub mod stream;
pub mod supervisor;
pub mod takeover;
pub mod tls;
pub mod wheel;
pub mod worker;

pub use config::Config;
pub use supervisor::{Plan, ServeError, WorkerCommand};
