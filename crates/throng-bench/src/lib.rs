//! The benchmark clients of `throng serve`, kept out of the server crate:
//! each binary drives a real server process from outside, as a client would.
//!
//! - `serve_bench` (`scripts/bench-serve.sh`): idle memory per subscriber,
//!   fan-out CPU per frame against a bare write loop, upgrades per second.
//! - `tls_bench` (`scripts/bench-tls.sh`, `scripts/bench-tls-compare.sh`):
//!   idle TLS memory, handshakes and requests per second, beside HAProxy.
//! - `tls_mem` (`scripts/bench-tls.sh`): rustls's heap per idle connection,
//!   counted by allocator, and the cost of one handshake signature.
//!
//! - `rejoin_bench` (`scripts/bench-history.sh`): recovery of M messages
//!   to N subscribers reconnecting at once.
//! - `takeover_bench` (`scripts/bench-takeover.sh`): `serve --takeover`
//!   under N subscribers rejoining with `?since=` and a steady publisher.
//!
//! What they share lives here; the TLS clients trust any certificate with
//! `throng-client`'s verifier, checking no signature
//! (`AnyCertificate::unchecked`).

pub mod served;
