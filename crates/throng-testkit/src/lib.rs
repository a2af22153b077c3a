//! What throng's integration tests share: real processes started on free
//! loopback ports and stopped on drop (`throng serve`, `redis-server`,
//! HAProxy, the independent peers in `tests/peers`; a Redis Cluster and a
//! Sentinel set-up in `redis_cluster`), JWT keys and tokens
//! from an independent library (`jwt`), certificates made with
//! the `openssl` CLI, fake `/proc` trees, and the small HTTP and WebSocket
//! clients the tests talk with. A dev-dependency only: nothing here ships.
//!
//! A test that needs a program this machine may lack names it first with
//! [`require!`]: the test is skipped, saying why, when the program is
//! missing, and fails instead when `THRONG_TEST_REQUIRE_PEERS` is set (as
//! `scripts/test.sh` does, after installing them).
//!
//! Every child process is started through [`process::command`], which first
//! raises this process's open-file limit to its hard limit, so the tests and
//! the peers they start (which inherit it) are not held to a shell's
//! default of 1024.

use std::time::{Duration, Instant};

pub mod certs;
pub mod fake_proc;
pub mod haproxy;
pub mod hold_server;
pub mod http;
pub mod json;
pub mod jwt;
pub mod mosquitto;
pub mod peers;
pub mod process;
pub mod redis;
pub mod redis_cluster;
pub mod serve;
pub mod temp;
pub mod ws;

pub use peers::Peer;
pub use serve::Server;
pub use temp::TempDir;

/// Polls `f` every 20 ms until it holds; fails the test after 30 s (a CI
/// machine running the whole suite at once is slow, and a wait that holds
/// costs nothing more for being allowed longer).
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A loopback port nothing listens on (as of now: the listener is closed
/// before it returns, so a test binds it right away or expects refusals).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}
