//! The MQTT decoder in both roles and versions on arbitrary bytes: decoding
//! them at once and in pieces must give the same packets and the same
//! refusal, never keep more than the packet limit, and every packet it
//! returns must encode back to bytes that decode to the same packets.
//! With the mode byte's high bit set, the input is instead filters and
//! topics, one per line, and the trie must find what the matcher finds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use throng_proto::mqtt::topic::{self, FilterTrie};
use throng_proto::mqtt::{DecodeError, Decoder, Version};

fn decoder(mode: u8, limit: usize) -> Decoder {
    let version = if mode & 2 == 0 {
        Version::V311
    } else {
        Version::V5
    };
    if mode & 1 == 0 {
        Decoder::server(limit)
    } else {
        Decoder::client(version, limit)
    }
}

/// The packets (as `Debug` text) and their re-encoding, the refusal with
/// the bytes of its answer, and what was left undecoded.
type Outcome = (Vec<String>, Vec<u8>, Option<(DecodeError, Vec<u8>)>, usize);

fn run(mut dec: Decoder, input: &[u8], pieces: &[u8]) -> Outcome {
    let limit = dec.max_packet();
    let mut sizes = pieces.iter().map(|&p| usize::from(p) + 1);
    let mut pending = Vec::new();
    let mut packets = Vec::new();
    let mut again = Vec::new();
    let mut fed = 0;
    while fed < input.len() {
        let n = sizes
            .next()
            .unwrap_or(input.len())
            .min(input.len() - fed);
        pending.extend_from_slice(&input[fed..fed + n]);
        fed += n;
        let mut at = 0;
        loop {
            match dec.decode(&pending[at..]) {
                Ok(Some(d)) => {
                    assert!(d.consumed > 0 && d.consumed <= limit);
                    at += d.consumed;
                    let version = dec.version().expect("known once a packet decoded");
                    d.packet
                        .encode(version, &mut again)
                        .expect("a decoded packet encodes");
                    packets.push(format!("{:?}", d.packet));
                }
                Ok(None) => break,
                Err(e) => {
                    let mut answer = Vec::new();
                    dec.answer(&e).encode(&mut answer);
                    return (packets, again, Some((e, answer)), 0);
                }
            }
        }
        pending.drain(..at);
        assert!(pending.len() < limit.max(5), "kept more than a packet");
    }
    (packets, again, None, pending.len())
}

fn trie_agrees(text: &str) {
    let (filters, topics) = text.split_once("\n\n").unwrap_or((text, ""));
    let filters: Vec<&str> = filters
        .lines()
        .filter(|f| topic::check_filter(f).is_ok())
        .collect();
    let mut trie = FilterTrie::new();
    let mut kept = Vec::new();
    for f in &filters {
        if trie.get_or_insert_with(f, || f.to_string()).is_ok() && !kept.contains(f) {
            kept.push(f);
        }
    }
    for t in topics.lines().filter(|t| topic::check_name(t).is_ok()) {
        let mut got = Vec::new();
        trie.for_each_match(t, |f| got.push(f.clone()));
        got.sort();
        let mut want: Vec<String> = kept
            .iter()
            .filter(|f| topic::matches(f, t))
            .map(|f| f.to_string())
            .collect();
        want.sort();
        assert_eq!(got, want, "topic {t:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    // Layout: [mode, limit, number of piece sizes, piece sizes..., stream...].
    let [mode, limit, npieces, rest @ ..] = data else {
        return;
    };
    if mode & 0x80 != 0 {
        if let Ok(text) = std::str::from_utf8(rest) {
            trie_agrees(text);
        }
        return;
    }
    let limit = 2 + usize::from(*limit) * 16;
    let split = usize::from(*npieces).min(rest.len());
    let (pieces, input) = rest.split_at(split);
    let whole = run(decoder(*mode, limit), input, &[]);
    assert_eq!(whole, run(decoder(*mode, limit), input, pieces));
    // What it decoded, encoded again, decodes to the same packets under the
    // same limit: re-encoding can shorten a packet, never lengthen it.
    let (packets, again, _, _) = &whole;
    let (repeat, _, err, left) = run(decoder(*mode, limit), again, &[]);
    assert_eq!((&repeat, err, left), (packets, None, 0));
});
