//! The embedded history and retained messages across `serve --takeover`:
//! the old supervisor hands both over when told `go` and numbers nothing
//! after it; the new one holds every publish, recovery and retained read
//! its workers send until they are its own, so ids go on from the old
//! serve's last, a subscriber rejoining with one of them misses nothing,
//! and a new MQTT subscription gets the retained messages set before.

use tokio::sync::mpsc;

use super::{Event, Supervisor};
use crate::control::{Message, Record};
use crate::history::Kept;
use crate::takeover::{Handed, Handover};

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
    /// Keeps `rec` for later when it is a publish, a recovery or a
    /// retained read and the old serve's history and retained messages
    /// have not come yet; gives it back otherwise.
    pub(super) fn hold(&mut self, i: usize, generation: u64, rec: Record) -> Option<Record> {
        match (&mut self.held, &rec) {
            (
                Some(held),
                Record::Publish(_)
                | Record::PublishRetained { .. }
                | Record::Recover { .. }
                | Record::RetainedAsk { .. },
            ) => {
                held.push((i, generation, rec));
                None
            }
            _ => Some(rec),
        }
    }

    /// The old serve (`pid`) answered `go`: adopt its history and its
    /// retained messages (with Redis there is nothing to adopt), then
    /// handle what was held, in the order it came: a retained message set
    /// here meanwhile replaces the old serve's of its channel.
    pub(super) fn history_arrived(&mut self, pid: i32, got: Result<Handed, String>) {
        let Some(held) = self.held.take() else {
            if let Err(e) = got {
                log!("throng: --takeover: the old server is gone already ({e})");
            }
            return;
        };
        match got {
            Ok(handed) => {
                if self.config.history > 0 {
                    self.adopt_history(pid, &handed.history);
                }
                self.adopt_retained(pid, &handed.retained);
            }
            Err(e) => log!(
                "throng: --takeover: ERROR: nothing handed over by pid {pid} ({e}); our history \
                 and retained messages start empty, and a subscriber rejoining with its ids is \
                 told !incomplete"
            ),
        }
        for (i, generation, rec) in held {
            if self.slots[i].generation == generation {
                self.on_record(i, generation, rec);
            }
        }
    }

    fn adopt_history(&mut self, pid: i32, bytes: &[u8]) {
        if bytes.is_empty() {
            log!(
                "throng: --takeover: pid {pid} handed over no history (it kept none); ours \
                 starts empty"
            );
            return;
        }
        let now = self.now_ms();
        match self.history.adopt(bytes, now) {
            Ok(a) => {
                log!(
                    "throng: --takeover: adopted the history of pid {pid}: {} messages in {} \
                     channels; ids go on in its epoch {}; {} published there meanwhile relayed \
                     here",
                    a.messages,
                    a.channels,
                    self.history.epoch(),
                    a.after_mark.len()
                );
                self.relay_after_mark(a.after_mark);
            }
            Err(e) => log!("throng: --takeover: ERROR: {e}; ours starts empty"),
        }
    }

    /// Sets the old serve's retained messages here, before any retained
    /// read is answered (those wait in `held`).
    fn adopt_retained(&mut self, pid: i32, bytes: &[u8]) {
        if bytes.is_empty() {
            log!(
                "throng: --takeover: pid {pid} handed over no retained messages (it keeps them \
                 in Redis, or predates their handover); ours start empty"
            );
            return;
        }
        match self.retained.adopt(bytes) {
            Ok(n) => log!(
                "throng: --takeover: adopted the retained messages of pid {pid}: {n} channels \
                 hold one"
            ),
            Err(e) => log!("throng: --takeover: ERROR: retained messages: {e}; ours start empty"),
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
            self.deliver(None, m, None, None);
        }
    }

    /// Told `go`: our embedded history and retained messages for the
    /// new serve (each empty when Redis keeps it for both); from now on a
    /// publish here is refused, so nothing is numbered twice and no
    /// retained message is set that the new serve would never know.
    pub(super) fn hand_over(&mut self) -> Handed {
        Handed {
            history: self.hand_history_over(),
            retained: self.hand_retained_over(),
        }
    }

    fn hand_retained_over(&mut self) -> Vec<u8> {
        if self.broker.keeps_retained() {
            return Vec::new();
        }
        self.handed_over = true;
        let bytes = self.retained.export();
        log!(
            "throng: taken over: handed the retained messages over ({} channels, {} bytes); \
             publishes here are refused from now on",
            self.retained.stats().topics,
            bytes.len()
        );
        bytes
    }

    /// Our embedded history for the new serve (empty with Redis, which
    /// keeps it for both, or without history).
    fn hand_history_over(&mut self) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};

    use super::super::WorkerCommand;
    use super::super::pair::message;
    use super::*;
    use crate::config::Config;

    /// A supervisor without Redis with one worker, whose records arrive
    /// on the receiver.
    fn supervisor() -> (Supervisor, mpsc::UnboundedReceiver<Bytes>) {
        let config = Config {
            workers: 1,
            history: 0,
            ..Config::default()
        };
        let (events, _) = mpsc::unbounded_channel();
        let command = WorkerCommand {
            program: "/bin/false".into(),
            args: Vec::new(),
        };
        let mut sup = Supervisor::new(&config, command, events).unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let slot = &mut sup.slots[0];
        (slot.generation, slot.alive, slot.tx) = (1, true, Some(tx));
        (sup, rx)
    }

    fn set(sup: &mut Supervisor, id: u64, channel: &str, payload: &str) {
        let message = message(id, channel, payload);
        sup.on_record(0, 1, Record::PublishRetained { qos: 1, message });
    }

    fn ask(sup: &mut Supervisor, id: u64) {
        let filters = vec!["a".into(), "b".into()];
        sup.on_record(0, 1, Record::RetainedAsk { id, filters });
    }

    /// What the worker got: retained answers as `channel=payload` lists
    /// (sorted), refusals as `refused`, deliveries as `live:payload`.
    fn got(rx: &mut mpsc::UnboundedReceiver<Bytes>) -> Vec<String> {
        let mut buf = BytesMut::new();
        while let Ok(b) = rx.try_recv() {
            buf.extend_from_slice(&b);
        }
        let mut out = Vec::new();
        while let Some(rec) = Record::decode(&mut buf).unwrap() {
            match rec {
                Record::Retained { messages, .. } => {
                    let mut v: Vec<String> = messages
                        .iter()
                        .map(|r| {
                            format!("{}={}", r.channel, String::from_utf8_lossy(&r.kept.payload))
                        })
                        .collect();
                    v.sort();
                    out.push(v.join(","));
                }
                Record::PublishFailed { .. } => out.push("refused".into()),
                Record::Deliver(m) => {
                    out.push(format!("live:{}", String::from_utf8_lossy(&m.payload)))
                }
                _ => {}
            }
        }
        out
    }

    #[test]
    fn retained_reads_wait_for_the_old_ones_and_a_retained_publish_meanwhile_wins() {
        let (mut old, mut old_rx) = supervisor();
        set(&mut old, 1, "a", "old-a");
        set(&mut old, 2, "b", "old-b");
        got(&mut old_rx);
        let (mut new, mut new_rx) = supervisor();
        new.held = Some(Vec::new());
        // Before the old serve's retained messages are here: both wait.
        ask(&mut new, 1);
        set(&mut new, 2, "a", "new-a");
        assert!(got(&mut new_rx).is_empty(), "nothing answered yet");
        let handed = old.hand_over();
        assert!(handed.history.is_empty(), "no --history: none to hand over");
        // After handing over the old serve refuses a retained publish.
        set(&mut old, 3, "b", "too-late");
        assert_eq!(got(&mut old_rx), ["refused"]);
        new.history_arrived(1, Ok(handed));
        assert_eq!(
            got(&mut new_rx),
            ["a=old-a,b=old-b", "live:new-a"],
            "the held read got the old ones, then the held publish went out"
        );
        ask(&mut new, 3);
        assert_eq!(got(&mut new_rx), ["a=new-a,b=old-b"], "the newer one won");
    }
}
