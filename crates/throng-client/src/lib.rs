//! Client connections both halves of throng make: TLS trust for every TLS
//! client ([`trust`]: the Redis link, `https://` publishing, `hold`/`attack`),
//! a plain-or-TLS stream ([`link`]), and Redis ([`redis`]: URLs, connect and
//! greet), so the server's broker and the harness read the same URLs, trust
//! certificates the same way and greet Redis with the same commands.
//!
//! TLS is rustls on the `ring` provider (no aws-lc: build time).

pub mod link;
pub mod redis;
pub mod trust;
