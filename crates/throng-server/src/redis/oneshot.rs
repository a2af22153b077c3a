//! One command on a fresh connection, answered and closed: how a node
//! asks a sentinel where the master is and a cluster node for its slot
//! map (neither belongs on the link's own connections).

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rustls::ClientConfig;
use throng_client::redis::RedisUrl;
use throng_proto::resp::{self, Value};

/// Connects to `url` (greeting included), sends `args`, and returns the
/// reply; `timeout` for each step. The error is the reason, as text.
pub(crate) async fn ask(
    url: &RedisUrl,
    tls: Option<&Arc<ClientConfig>>,
    args: &[&[u8]],
    timeout: Duration,
) -> Result<Value, String> {
    let (mut stream, mut buf) = throng_client::redis::open(url, tls, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let mut cmd = BytesMut::new();
    resp::encode_command(&mut cmd, args);
    throng_client::link::write_all(&mut stream, &cmd)
        .await
        .map_err(|e| e.to_string())?;
    let dec = resp::Decoder::default();
    tokio::time::timeout(
        timeout,
        throng_client::redis::read_value(&mut stream, &mut buf, &dec),
    )
    .await
    .map_err(|_| format!("no answer within {timeout:?}"))?
    .map_err(|e| e.to_string())
}
