//! What goes wrong between a node and Redis, as types: a reply that does
//! not read ([`ReplyError`]), a session that is lost ([`SessionError`]), a
//! publish that is not confirmed ([`PublishError`]). Their texts are what
//! the logs, `/healthz` and the publisher's 503 body say.

use std::fmt;
use std::time::Duration;

use throng_proto::resp::{RespError, Value};

/// One of the node's two connections to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conn {
    /// The connection that (p)subscribes and receives the messages.
    Subscriber,
    /// The connection that publishes, recovers and reads the retained store.
    Publisher,
}

impl fmt::Display for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Subscriber => "subscriber",
            Self::Publisher => "publisher",
        })
    }
}

/// A reply that does not read as the answer to the command it follows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// Redis answered with an error reply (`-ERR ...`).
    #[error("Redis refused: {0}")]
    Refused(String),
    /// A reply of another shape than the command's (its RESP, as debug text).
    #[error("unexpected Redis reply {0}")]
    Unexpected(String),
    /// The publish script's stream id is not `<ms>-<seq>`.
    #[error("the stream id Redis gave does not read")]
    StreamId,
    /// The publish script answered without PUBLISH's receiver count.
    #[error("Redis answered the publish without a receiver count")]
    NoReceivers,
    /// An `XRANGE` entry that is not `[id, [field, value, ...]]`.
    #[error("a stream entry is not [id, fields]")]
    StreamEntry,
    /// The retained store's script answered without `[channels, dropped]`.
    #[error("the retained store answered without its figures")]
    StoreFigures,
}

impl ReplyError {
    /// The error for reply `v` where another was expected: Redis's own
    /// refusal when it is one.
    pub fn of(v: Value) -> Self {
        match v {
            Value::Error(e) => Self::Refused(String::from_utf8_lossy(&e).into_owned()),
            other => Self::Unexpected(format!("{other:?}")),
        }
    }
}

/// Why a session with Redis ended (the reason `/healthz` and the log give).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Connecting, TLS or the greeting (`AUTH`/`SELECT`/`PING`) failed.
    #[error(transparent)]
    Open(#[from] throng_client::link::LinkError),
    /// Redis closed one of the connections.
    #[error("Redis closed the {0} connection")]
    Closed(Conn),
    /// Reading a connection failed.
    #[error("{0} connection: {1}")]
    Read(Conn, std::io::Error),
    /// A connection carried bytes that are not RESP.
    #[error("{0} connection: {1}")]
    Decode(Conn, RespError),
    /// Writing to Redis failed.
    #[error("writing to Redis: {0}")]
    Write(std::io::Error),
    /// Redis took none of our bytes for this long.
    #[error("Redis took no bytes for {0:?} (not reading?)")]
    WriteStalled(Duration),
    /// Redis left a command or a ping unanswered for this long.
    #[error("Redis did not answer within {0:?}")]
    Silent(Duration),
    /// The subscriber connection carried an error reply.
    #[error("Redis refused: {0}")]
    Refused(String),
    /// The subscriber connection carried something that is no push.
    #[error("unexpected push from Redis: {0}")]
    UnexpectedPush(String),
    /// The publisher connection carried a reply to nothing we sent.
    #[error("Redis sent a reply nobody asked for: {0}")]
    Unasked(String),
    /// A recovery's three replies did not come as three.
    #[error("a recovery's replies came apart")]
    RecoveryApart,
    /// The supervisor stopped the link.
    #[error("the server is stopping")]
    Stopping,
    /// No sentinel named the master.
    #[error("{0}")]
    Sentinel(String),
    /// A sentinel announced that the master moved (a failover): the node
    /// leaves the old one, whose answers no longer count.
    #[error("Sentinel switched the master to {0}")]
    Switched(super::cluster::Addr),
    /// The cluster's map could not be read from any of its nodes.
    #[error("{0}")]
    NoMap(String),
}

/// Why a publish got no receiver count (the text of the publisher's 503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The publish arrived while the link was down.
    #[error("not connected to Redis (reconnecting)")]
    NotConnected,
    /// The link broke between the publish and its reply (the reason).
    #[error(
        "the connection to Redis broke before it confirmed the publish ({0}); it may or may not have been delivered"
    )]
    Unconfirmed(String),
    /// Redis answered, but not with a receiver count.
    #[error(transparent)]
    Reply(#[from] ReplyError),
    /// The master of the channel's slot is unreachable (a cluster; the
    /// other shards still publish).
    #[error(
        "the Redis Cluster shard {shard} that serves this channel is unreachable ({why}); not published"
    )]
    ShardDown {
        /// The master's address.
        shard: String,
        /// Why it is down.
        why: String,
    },
    /// The channel's slot is moving to another master and this node's
    /// subscription there is not confirmed yet (its own subscribers would
    /// miss the message).
    #[error(
        "the channel's Redis Cluster slot is moving to another shard; not published, try again"
    )]
    Moving,
    /// Redirected too many times (a cluster in the middle of changing).
    #[error("Redis Cluster redirected the publish {0} times; not published")]
    Redirects(u8),
}

/// Why `throng serve` could not check Redis before it started.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No runtime to connect with.
    #[error("cannot start a runtime to check Redis: {0}")]
    Runtime(std::io::Error),
    /// The connection or its greeting failed.
    #[error(transparent)]
    Open(#[from] throng_client::link::LinkError),
    /// No sentinel named the master.
    #[error("{0}")]
    Sentinel(String),
}

/// A `--redis-mode` that is neither `pattern` nor `channels`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown Redis mode '{0}' (expected 'pattern' or 'channels')")]
pub struct UnknownMode(pub String);

/// A `--redis-cluster` or `--redis-sentinel` entry that is not `HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not HOST:PORT (give HOST:PORT[,HOST:PORT...])")]
pub struct BadAddr(pub String);
