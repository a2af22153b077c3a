//! The Redis broker: many `throng serve` nodes share routing through Redis
//! pub/sub. The supervisor keeps one subscriber connection (what arrives is
//! relayed to its workers, exactly like the embedded relay) and one
//! publisher connection (`POST /publish` becomes `PUBLISH <prefix><channel>`).
//!
//! - [`settings`]: where Redis is and how a node uses it ([`RedisSettings`]).
//! - `session`: the link as a state machine without sockets or a clock
//!   (`Session`): what to write, what the replies mean, what the
//!   supervisor is told.
//! - `driver`: the task that runs it over sockets (`run`): both
//!   connections in one task, so "up" means both work and the
//!   subscriptions are confirmed. When either breaks, both are dropped and
//!   reconnected with backoff; subscribers stay connected meanwhile,
//!   publishing is refused with the reason, and the subscriptions (one
//!   pattern, or the set of channels with local subscribers) are made again
//!   before the broker says it is up.
//! - `envelope`: an MQTT publish's QoS, flags and properties beside its
//!   payload, for the other nodes.
//! - [`cluster`]: Redis Cluster's slots, slot map and redirects (sans-I/O);
//!   `router`: one link per master behind one router (`--redis-cluster`).
//! - `sentinel`: the master found through Sentinel and followed on
//!   failover (`--redis-sentinel`).
//! - `counts`: subscriber counts summed over the nodes (the server API),
//!   on a request-and-reply connection of its own.
//! - `mqtt_sessions`: MQTT persistent sessions away, kept in Redis and
//!   queued for by every publishing node (pattern mode, one Redis).
//! - [`error`]: what goes wrong, as types.
//!
//! Connections are made by [`throng_client::redis::open`]: plain TCP for
//! `redis://`, TLS for `rediss://` (the certificate checked against
//! [`RedisSettings::tls`]), then `AUTH`/`SELECT`/`PING`. Everything after that
//! is the same code over either kind of stream.

pub mod cluster;
pub(crate) mod counts;
pub(crate) mod driver;
pub(crate) mod envelope;
pub mod error;
pub(crate) mod mqtt_sessions;
pub(crate) mod oneshot;
pub(crate) mod router;
pub(crate) mod sentinel;
pub(crate) mod session;
pub mod settings;

pub(crate) use driver::run;
pub use error::{Conn, PublishError, ReplyError, SessionError};
pub(crate) use session::{Command, Event};
pub use settings::{Addr, RedisMode, RedisSettings, RedisUrl, Topology, Trust};

#[cfg(test)]
pub(crate) mod fake;
