//! The embedded history across `serve --takeover`: the old supervisor
//! hands its history over when told `go` and numbers nothing after it;
//! the new one holds every publish and recovery its workers send until
//! that history is its own, so ids go on from the old serve's last and a
//! subscriber rejoining with one of them misses nothing.

use tokio::sync::mpsc;

use super::{Event, Supervisor};
use crate::control::{Message, Record};
use crate::history::Kept;
use crate::takeover::Handover;

/// Says `go` to the old serve on a thread of its own (the exchange
/// blocks); what it hands over arrives as [`Event::History`].
pub(super) fn go(h: Handover, events: mpsc::UnboundedSender<Event>) {
    let pid = h.pid();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(h.go().map_err(|e| e.to_string()));
    });
    tokio::task::spawn_local(async move {
        let got = rx
            .await
            .unwrap_or_else(|_| Err("the handover thread ended".into()));
        let _ = events.send(Event::History(pid, got));
    });
}

impl Supervisor {
    /// Keeps `rec` for later when it is a publish or a recovery and the
    /// old serve's history has not come yet; gives it back otherwise.
    pub(super) fn hold(&mut self, i: usize, generation: u64, rec: Record) -> Option<Record> {
        match (&mut self.held, &rec) {
            (
                Some(held),
                Record::Publish(_) | Record::PublishRetained { .. } | Record::Recover { .. },
            ) => {
                held.push((i, generation, rec));
                None
            }
            _ => Some(rec),
        }
    }

    /// The old serve (`pid`) answered `go`: adopt its history (with
    /// Redis, or when it had none, there is nothing to adopt), then handle
    /// what was held, in the order it came.
    pub(super) fn history_arrived(&mut self, pid: i32, got: Result<Vec<u8>, String>) {
        let Some(held) = self.held.take() else {
            if let Err(e) = got {
                log!("throng: --takeover: the old server is gone already ({e})");
            }
            return;
        };
        let now = self.now_ms();
        match got {
            Ok(bytes) if bytes.is_empty() => log!(
                "throng: --takeover: pid {pid} handed over no history (it kept none); \
                 ours starts empty"
            ),
            Ok(bytes) => match self.history.adopt(&bytes, now) {
                Ok(a) => {
                    log!(
                        "throng: --takeover: adopted the history of pid {pid}: {} messages in {} \
                         channels; ids go on in its epoch {}; {} published there meanwhile \
                         relayed here",
                        a.messages,
                        a.channels,
                        self.history.epoch(),
                        a.after_mark.len()
                    );
                    self.relay_after_mark(a.after_mark);
                }
                Err(e) => log!("throng: --takeover: ERROR: {e}; ours starts empty"),
            },
            Err(e) => log!(
                "throng: --takeover: ERROR: no history from pid {pid} ({e}); ours starts empty, \
                 and a subscriber rejoining with its ids is told !incomplete"
            ),
        }
        for (i, generation, rec) in held {
            if self.slots[i].generation == generation {
                self.on_record(i, generation, rec);
            }
        }
    }

    /// The messages the old serve numbered once our workers could have
    /// subscribers: they were delivered only to its own, so ours get them
    /// now (a subscriber rejoining meanwhile has its recovery held, and
    /// takes each id once).
    fn relay_after_mark(&mut self, messages: Vec<(String, Kept)>) {
        for (channel, k) in messages {
            let m = Message {
                id: 0,
                message: k.id,
                text: k.text,
                at_most_once: false,
                exactly_once: false,
                properties: bytes::Bytes::new(),
                retained: false,
                origin: 0,
                channel,
                payload: k.payload,
            };
            self.deliver(None, m, None);
        }
    }

    /// Told `go`: our embedded history for the new serve (empty with
    /// Redis, which keeps it for both, or without history); from now on
    /// a publish here is refused, so nothing is numbered twice.
    pub(super) fn hand_history_over(&mut self) -> Vec<u8> {
        if self.broker.keeps_history() || self.config.history == 0 {
            return Vec::new();
        }
        self.handed_over = true;
        let now = self.now_ms();
        self.history.expire(now);
        let bytes = self.history.export(now, self.handover_mark);
        let s = self.history.stats();
        log!(
            "throng: taken over: handed the history over ({} messages in {} channels, {} bytes); \
             publishes here are refused from now on",
            s.messages,
            s.channels,
            bytes.len()
        );
        bytes
    }
}
