//! The embedded retained messages handed from a serve being taken over to
//! the one taking over (`serve --takeover` without Redis): the old one
//! writes each channel's retained message with its QoS, id, framing,
//! payload and MQTT 5.0 properties, longest-set first; the new one sets
//! them in that order (so its `--max-retained` drops the same ones first)
//! before it answers a subscription's retained read.
//!
//! The bytes, big-endian: `THR1`; the count (u32); each message its
//! channel (u16 length and name), QoS u8, id (epoch and sequence, u64
//! each), text u8, payload (u32 length and bytes) and properties (u32
//! length and bytes).

use bytes::Bytes;

use super::Retained;
use crate::history::{BadHandover, HandoverReader, Kept, MessageId};

const MAGIC: &[u8; 4] = b"THR1";

/// One handed-over retained message, read and checked before any is set.
struct Entry {
    channel: String,
    qos: u8,
    kept: Kept,
    properties: Bytes,
}

impl Retained {
    /// Every retained message as handover bytes, longest-set first.
    pub fn export(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.bytes);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&len32(self.order.len()).to_be_bytes());
        for name in self.order.values() {
            let Some(e) = self.by_channel.get(name) else {
                continue;
            };
            // A channel name is bounded far below 64 KiB by the request line.
            let channel = &name.as_bytes()[..name.len().min(usize::from(u16::MAX))];
            out.extend_from_slice(&(channel.len() as u16).to_be_bytes());
            out.extend_from_slice(channel);
            out.push(e.qos);
            out.extend_from_slice(&e.kept.id.epoch.to_be_bytes());
            out.extend_from_slice(&e.kept.id.seq.to_be_bytes());
            out.push(u8::from(e.kept.text));
            for b in [&e.kept.payload, &e.properties] {
                out.extend_from_slice(&len32(b.len()).to_be_bytes());
                out.extend_from_slice(b);
            }
        }
        out
    }

    /// Sets the handed-over retained messages in `bytes` (read whole and
    /// checked first: damaged bytes change nothing), in the order they were
    /// set, within this node's own limits; answers how many it holds now.
    pub fn adopt(&mut self, bytes: &[u8]) -> Result<usize, BadHandover> {
        let mut r = HandoverReader::new(bytes);
        if r.take(4)? != MAGIC {
            return Err(r.bad("no THR1 header"));
        }
        let mut entries = Vec::new();
        for _ in 0..r.u32()? {
            let n = usize::from(r.u16()?);
            let channel = std::str::from_utf8(r.take(n)?).map_err(|_| r.bad("a channel name"))?;
            let channel = channel.to_owned();
            let qos = r.take(1)?[0];
            if qos > 2 {
                return Err(r.bad("a QoS above 2"));
            }
            let id = MessageId {
                epoch: r.u64()?,
                seq: r.u64()?,
            };
            let text = r.take(1)?[0] != 0;
            let n = r.u32()? as usize;
            let payload = Bytes::copy_from_slice(r.take(n)?);
            let n = r.u32()? as usize;
            let properties = Bytes::copy_from_slice(r.take(n)?);
            entries.push(Entry {
                channel,
                qos,
                kept: Kept { id, text, payload },
                properties,
            });
        }
        if !r.done() {
            return Err(r.bad("bytes after the last retained message"));
        }
        for e in entries {
            self.set(&e.channel, e.qos, e.kept, e.properties);
        }
        Ok(self.by_channel.len())
    }
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::super::{Limits, RetainedMessage};
    use super::*;

    fn store(max_topics: usize) -> Retained {
        Retained::new(Limits {
            max_topics,
            max_bytes: 1 << 30,
        })
    }

    fn set(s: &mut Retained, channel: &str, qos: u8, seq: u64, body: &[u8], props: &[u8]) {
        let kept = Kept {
            id: MessageId { epoch: 7, seq },
            text: std::str::from_utf8(body).is_ok(),
            payload: Bytes::copy_from_slice(body),
        };
        s.set(channel, qos, kept, Bytes::copy_from_slice(props));
    }

    fn all(s: &mut Retained) -> Vec<RetainedMessage> {
        let mut v = s.matching(&["#".to_owned()]);
        v.sort_by(|a, b| a.channel.cmp(&b.channel));
        v
    }

    #[test]
    fn every_retained_message_goes_over_whole_and_in_the_order_it_was_set() {
        let mut old = store(10);
        set(&mut old, "a", 1, 1, b"one", b"\x26\x00\x01k\x00\x01v");
        set(&mut old, "b/c", 2, 2, &[0xff, 0], b"");
        set(&mut old, "d", 0, 3, b"three", b"");
        set(&mut old, "a", 0, 4, b"uno", b""); // a is now the newest
        set(&mut old, "d", 0, 5, b"", b""); // cleared
        let mut new = store(10);
        assert_eq!(new.adopt(&old.export()), Ok(2));
        assert_eq!(all(&mut new), all(&mut old), "qos, id, framing, properties");
        // The order went over too: at a cap of 1 the newest (a) stays.
        let mut one = store(1);
        one.adopt(&old.export()).unwrap();
        assert_eq!(all(&mut one)[0].channel, "a");
        assert_eq!(one.stats().dropped_count, 1, "counted as dropped");
        // An empty store hands over an empty one.
        let mut none = store(10);
        assert_eq!(none.adopt(&store(10).export()), Ok(0));
    }

    #[test]
    fn damaged_bytes_are_refused_and_change_nothing() {
        let mut old = store(10);
        set(&mut old, "a", 1, 1, b"x", b"p");
        let good = old.export();
        let mut new = store(10);
        set(&mut new, "mine", 0, 9, b"kept", b"");
        for cut in 0..good.len() {
            assert!(new.adopt(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = good.clone();
        extra.push(0);
        assert_eq!(
            new.adopt(&extra).unwrap_err().what,
            "bytes after the last retained message"
        );
        let mut qos = good.clone();
        qos[4 + 4 + 2 + 1] = 3;
        assert_eq!(new.adopt(&qos).unwrap_err().what, "a QoS above 2");
        let mut wrong = good;
        wrong[0] = b'X';
        assert!(new.adopt(&wrong).is_err());
        let got = all(&mut new);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].channel, "mine");
    }
}
