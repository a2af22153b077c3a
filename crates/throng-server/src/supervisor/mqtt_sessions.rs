//! The supervisor's side of MQTT sessions kept in Redis
//! ([`crate::sessions`]' `shared`, the scripts in
//! [`crate::redis::mqtt_sessions`]): what the sessions ask goes to Redis,
//! and the marks and replies that come back go to them, answering the
//! worker of a resume once both are in.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use throng_proto::resp::Value;
use tokio::sync::mpsc;

use super::{Event, Supervisor};
use crate::control::Record;
use crate::redis::mqtt_sessions::{self, Taken};
use crate::sessions::{Ask, Reply, TakeAnswer};

/// How long a stopping node waits for its sessions' parks to reach Redis.
const SETTLE: Duration = Duration::from_secs(3);

impl Supervisor {
    /// Once the workers are gone: waits (up to [`SETTLE`]) until the
    /// sessions their connections parked are in Redis, ready.
    pub(super) async fn settle_sessions(&mut self, rx: &mut mpsc::UnboundedReceiver<Event>) {
        let until = tokio::time::Instant::now() + SETTLE;
        while self.sessions.settling() {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(ev)) => {
                    self.on_event(ev);
                }
                _ => {
                    log!("throng: MQTT sessions may not all have reached Redis before the stop");
                    break;
                }
            }
        }
    }

    /// Sends what the sessions ask of Redis, in order.
    pub(super) fn session_asks(&mut self) {
        let Some((prefix, limit)) = self.broker.sessions_in_redis() else {
            return;
        };
        let prefix = prefix.to_owned();
        for ask in self.sessions.take_asks() {
            let mut out = BytesMut::new();
            let nonce = match ask {
                Ask::Park {
                    hash,
                    nonce,
                    ttl_ms,
                    owner,
                    record,
                    indexed,
                } => {
                    let park = mqtt_sessions::Park {
                        hash,
                        nonce,
                        ttl_ms,
                        owner,
                        record: &record,
                        indexed: &indexed,
                    };
                    mqtt_sessions::park(&mut out, &prefix, &park);
                    nonce
                }
                Ask::Front {
                    hash,
                    nonce,
                    entries,
                } => {
                    let entries: Vec<Bytes> = entries
                        .iter()
                        .map(|(m, qos, id)| {
                            mqtt_sessions::entry(*qos, *id, &m.channel, &self.broker.sealed(m))
                        })
                        .collect();
                    mqtt_sessions::front(&mut out, &prefix, hash, nonce, limit, &entries);
                    nonce
                }
                Ask::Take {
                    hash,
                    nonce,
                    force,
                    ttl_ms,
                } => {
                    mqtt_sessions::take(&mut out, &prefix, hash, nonce, force, ttl_ms);
                    nonce
                }
                Ask::Drop {
                    hash,
                    token,
                    clean,
                    ttl_ms,
                } => {
                    mqtt_sessions::drop_session(&mut out, &prefix, hash, token, clean, ttl_ms);
                    0
                }
            };
            self.broker.session_command(nonce, out.freeze());
        }
    }

    /// A park or take mark came, in its place among the relayed messages.
    pub(super) fn on_session_mark(&mut self, kind: u8, nonce: u64) {
        let now = self.now_ms();
        let reply = self.sessions.on_mark(kind, nonce, now);
        self.session_reply(reply);
        self.session_asks();
    }

    /// Redis answered a script of the sessions.
    pub(super) fn on_session_reply(&mut self, nonce: u64, reply: Result<Value, String>) {
        let ok = matches!(&reply, Ok(v) if !matches!(v, Value::Error(_)));
        self.sessions.answered(ok);
        if !self.sessions.is_take(nonce) {
            match reply {
                Ok(Value::Error(e)) => log!(
                    "throng: an MQTT session's write to Redis failed: {}",
                    String::from_utf8_lossy(&e)
                ),
                Err(e) => log!("throng: an MQTT session's write to Redis failed: {e}"),
                Ok(_) => {}
            }
            return;
        }
        let taken = reply.and_then(|v| mqtt_sessions::taken(v).map_err(|e| e.to_string()));
        let answer = match taken {
            Ok(Some(Taken::Nothing)) => TakeAnswer::Nothing,
            Ok(Some(Taken::NotReady)) => TakeAnswer::NotReady,
            Ok(Some(Taken::Session(record, entries))) => {
                let queue = entries
                    .iter()
                    .filter_map(|e| self.broker.unqueue(e))
                    .collect();
                TakeAnswer::Session(record, queue)
            }
            Ok(None) => TakeAnswer::Failed,
            Err(e) => {
                log!(
                    "throng: an MQTT session could not be read from Redis: {e}; the client starts afresh"
                );
                TakeAnswer::Failed
            }
        };
        let now = self.now_ms();
        let reply = self.sessions.on_taken(nonce, answer, now);
        self.session_reply(reply);
    }

    /// Answers a resume's worker.
    pub(super) fn session_reply(&mut self, reply: Option<Reply>) {
        if let Some(r) = reply {
            self.send(r.worker, Record::SessionResumed(r.resumed).encode());
        }
    }
}
