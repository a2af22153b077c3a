//! A history handed from a serve being taken over to the one taking over
//! (`serve --takeover` without Redis): the old one writes every channel's
//! kept messages with their ids and ages, its epoch and sequence; the new
//! one adopts them, and numbers its own messages after them in the same
//! epoch, so a subscriber rejoining it with an id the old one gave misses
//! nothing.
//!
//! The bytes, big-endian: `THH1`, epoch, last sequence, watermark and
//! mark (u64 each: the mark is the last sequence numbered before the new
//! process could have subscribers; what came after it the new one relays
//! to them, as they were not on the old one); the channels (u32 count; each a u16 name length, the name and
//! the sequence it dropped through, u64); the messages oldest first (u32
//! count; each its channel's index u32, sequence u64, text u8, age in ms
//! u64, payload length u32 and payload).

use std::collections::HashMap;

use bytes::Bytes;

use super::{History, MessageId};

const MAGIC: &[u8; 4] = b"THH1";

/// Why handed-over bytes are not a history.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the handed-over history is not one (at byte {at}: {what})")]
pub struct BadHandover {
    /// Where reading stopped.
    pub at: usize,
    /// What was wrong there.
    pub what: &'static str,
}

/// One handed-over message, read and checked before anything is adopted.
struct Entry {
    channel: usize,
    seq: u64,
    text: bool,
    age: u64,
    payload: Bytes,
}

/// What [`History::adopt`] took: messages kept and channels, and the
/// messages numbered after the mark (channel and message, oldest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    pub messages: usize,
    pub channels: usize,
    pub after_mark: Vec<(String, super::Kept)>,
}

impl History {
    /// This history as handover bytes, at `now_ms` (ages are kept, not
    /// clock readings: the new process's clock started elsewhere), with
    /// `mark` (a sequence of ours) for `Adopted::after_mark`.
    pub fn export(&self, now_ms: u64, mark: u64) -> Vec<u8> {
        let arrived: HashMap<u64, u64> = self.order.iter().map(|(s, _, at)| (*s, *at)).collect();
        let names: Vec<_> = self.channels.iter().collect();
        let mut all: Vec<(u64, u32, &super::Kept)> = Vec::with_capacity(self.kept);
        for (i, (_, ch)) in names.iter().enumerate() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            all.extend(ch.kept.iter().map(|(k, _)| (k.id.seq, i, k)));
        }
        all.sort_unstable_by_key(|m| m.0);
        let mut out = Vec::with_capacity(64 + self.bytes);
        out.extend_from_slice(MAGIC);
        for v in [self.epoch, self.last_seq, self.forgotten, mark] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&len32(names.len()).to_be_bytes());
        for (name, ch) in &names {
            // A channel name is bounded far below 64 KiB by the request line.
            let name = &name.as_bytes()[..name.len().min(usize::from(u16::MAX))];
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&ch.dropped_through.to_be_bytes());
        }
        out.extend_from_slice(&len32(all.len()).to_be_bytes());
        for (seq, i, k) in all {
            let age = now_ms.saturating_sub(arrived.get(&seq).copied().unwrap_or(now_ms));
            out.extend_from_slice(&i.to_be_bytes());
            out.extend_from_slice(&seq.to_be_bytes());
            out.push(u8::from(k.text));
            out.extend_from_slice(&age.to_be_bytes());
            out.extend_from_slice(&len32(k.payload.len()).to_be_bytes());
            out.extend_from_slice(&k.payload);
        }
        out
    }

    /// Replaces this history with the handed-over one in `bytes` (read
    /// whole and checked first: damaged bytes change nothing), kept within
    /// this node's own limits, at `now_ms`. From now on this node numbers
    /// its messages in the old one's epoch, after its last.
    pub fn adopt(&mut self, bytes: &[u8], now_ms: u64) -> Result<Adopted, BadHandover> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != MAGIC {
            return Err(r.bad("no THH1 header"));
        }
        let (epoch, last_seq, forgotten, mark) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let mut names = Vec::new();
        for _ in 0..r.u32()? {
            let n = usize::from(r.u16()?);
            let name = std::str::from_utf8(r.take(n)?).map_err(|_| r.bad("a channel name"))?;
            names.push((name.to_owned(), r.u64()?));
        }
        let mut entries = Vec::new();
        for _ in 0..r.u32()? {
            let channel = r.u32()? as usize;
            let seq = r.u64()?;
            let text = r.take(1)?[0] != 0;
            let age = r.u64()?;
            let n = r.u32()? as usize;
            let payload = Bytes::copy_from_slice(r.take(n)?);
            if channel >= names.len() || seq > last_seq {
                return Err(r.bad("a message of no channel, or after the last"));
            }
            entries.push(Entry {
                channel,
                seq,
                text,
                age,
                payload,
            });
        }
        if r.at != bytes.len() {
            return Err(r.bad("bytes after the last message"));
        }
        *self = Self {
            stats: self.stats,
            ..Self::new(self.limits, epoch)
        };
        self.last_seq = last_seq;
        self.forgotten = forgotten;
        let mut after_mark = Vec::new();
        for e in entries {
            let id = MessageId { epoch, seq: e.seq };
            let at = now_ms.saturating_sub(e.age);
            let name = &names[e.channel].0;
            self.keep(name, id, e.text, &e.payload, at);
            if e.seq > mark {
                let kept = super::Kept {
                    id,
                    text: e.text,
                    payload: e.payload,
                };
                after_mark.push((name.clone(), kept));
            }
        }
        for (name, through) in names {
            match self.channels.get_mut(name.as_str()) {
                Some(ch) => ch.dropped_through = ch.dropped_through.max(through),
                None => self.forgotten = self.forgotten.max(through),
            }
        }
        Ok(Adopted {
            messages: self.kept,
            channels: self.channels.len(),
            after_mark,
        })
    }
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reads handover bytes in order, failing at their end (the retained
/// messages' handover reads with it too: `retained::handover`).
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Reads `bytes` from their start.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// Whether every byte has been read.
    pub(crate) fn done(&self) -> bool {
        self.at == self.bytes.len()
    }

    pub(crate) fn bad(&self, what: &'static str) -> BadHandover {
        BadHandover { at: self.at, what }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], BadHandover> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.bad("cut short"));
        };
        let got = &self.bytes[self.at..end];
        self.at = end;
        Ok(got)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, BadHandover> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, BadHandover> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(a))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, BadHandover> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Limits;
    use super::super::tests::{limits, put};
    use super::*;

    const OLD: u64 = 1_764_000_000_000;

    fn bodies(h: &mut History, channel: &str, since: MessageId) -> (bool, Vec<String>) {
        let r = h.recover(channel, since, 0);
        let b = r.messages.iter();
        let b = b.map(|k| String::from_utf8_lossy(&k.payload).into_owned());
        (r.complete, b.collect())
    }

    #[test]
    fn the_new_node_recovers_the_old_ones_ids_and_numbers_after_them() {
        let mut old = History::new(limits(3), OLD);
        let a1 = put(&mut old, "a", "a1", 0);
        for m in ["b1", "a2", "a3", "a4", "b2"] {
            put(&mut old, &m[..1], m, 0);
        }
        let mut new = History::new(limits(10), OLD + 5000);
        let got = new.adopt(&old.export(100, 5), 200).unwrap();
        assert_eq!((got.messages, got.channels), (5, 2));
        let after: Vec<_> = got
            .after_mark
            .iter()
            .map(|(c, k)| (c.as_str(), k.id.seq))
            .collect();
        assert_eq!(
            after,
            [("b", 6)],
            "numbered after the mark: relayed by the new node"
        );
        assert_eq!(new.epoch(), OLD, "the old epoch goes on");
        let all_a = vec!["a2".into(), "a3".into(), "a4".into()];
        assert_eq!(
            bodies(&mut new, "a", a1),
            (true, all_a),
            "only a1 itself went"
        );
        let a2 = MessageId { epoch: OLD, seq: 3 };
        assert_eq!(
            bodies(&mut new, "a", a2),
            (true, vec!["a3".into(), "a4".into()])
        );
        let next = put(&mut new, "a", "a5", 300);
        assert_eq!(next, MessageId { epoch: OLD, seq: 7 });
        assert_eq!(
            bodies(&mut new, "a", a2),
            (true, vec!["a3".into(), "a4".into(), "a5".into()])
        );
        let b1 = MessageId { epoch: OLD, seq: 2 };
        assert_eq!(bodies(&mut new, "b", b1), (true, vec!["b2".into()]));
    }

    #[test]
    fn the_new_nodes_limits_apply_and_what_they_drop_makes_a_recovery_incomplete() {
        let mut old = History::new(limits(10), OLD);
        let ids: Vec<_> = (1..=6)
            .map(|i| put(&mut old, "a", &format!("a{i}"), 0))
            .collect();
        let mut new = History::new(limits(2), OLD + 1);
        assert_eq!(new.adopt(&old.export(0, 0), 0).unwrap().messages, 2);
        assert_eq!(
            bodies(&mut new, "a", ids[3]),
            (true, vec!["a5".into(), "a6".into()])
        );
        assert!(!bodies(&mut new, "a", ids[2]).0);
    }

    #[test]
    fn ages_carry_over_so_the_ttl_ends_them_on_time() {
        let mut old = History::new(
            Limits {
                ttl: Some(std::time::Duration::from_secs(10)),
                ..limits(10)
            },
            OLD,
        );
        put(&mut old, "a", "early", 1_000);
        let late = put(&mut old, "a", "late", 8_000);
        let mut new = History::new(old.limits, OLD + 1);
        // Exported at 9 s: ages 8 s and 1 s; the new clock reads 50 s.
        new.adopt(&old.export(9_000, 0), 50_000).unwrap();
        new.expire(52_500);
        assert_eq!(new.stats().messages, 1, "early was 10.5 s old");
        let r = new.recover("a", MessageId { epoch: OLD, seq: 1 }, 52_500);
        assert!(r.complete);
        assert_eq!(r.messages[0].id, late);
    }

    #[test]
    fn damaged_bytes_are_refused_and_change_nothing() {
        let mut old = History::new(limits(10), OLD);
        put(&mut old, "a", "x", 0);
        let good = old.export(0, 0);
        let mut new = History::new(limits(10), OLD + 1);
        put(&mut new, "n", "mine", 0);
        for cut in 0..good.len() {
            assert!(new.adopt(&good[..cut], 0).is_err(), "cut at {cut}");
        }
        let mut extra = good.clone();
        extra.push(0);
        assert_eq!(
            new.adopt(&extra, 0).unwrap_err().what,
            "bytes after the last message"
        );
        let mut wrong = good.clone();
        wrong[0] = b'X';
        assert!(new.adopt(&wrong, 0).is_err());
        assert_eq!(
            bodies(
                &mut new,
                "n",
                MessageId {
                    epoch: OLD + 1,
                    seq: 0
                }
            )
            .1,
            ["mine"]
        );
        assert_eq!(new.epoch(), OLD + 1);
    }
}
