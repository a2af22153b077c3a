//! A Redis reply stream on arbitrary bytes: decoded at once and in pieces,
//! both must give the same values (or the same error) within the limits.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use throng_proto::resp::{Decoder, Limits, Value};

fn decode(input: &[u8], pieces: &[u8]) -> (Vec<Value>, bool) {
    let d = Decoder::new(Limits {
        max_bulk: 256,
        max_array: 16,
        max_depth: 3,
        max_line: 32,
    });
    let mut sizes = pieces.iter().map(|&p| usize::from(p) + 1);
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut out = Vec::new();
    loop {
        loop {
            match d.decode(&mut buf) {
                Ok(Some(v)) => out.push(v),
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
        if fed == input.len() {
            return (out, false);
        }
        let n = sizes.next().unwrap_or(input.len()).min(input.len() - fed);
        buf.extend_from_slice(&input[fed..fed + n]);
        fed += n;
    }
}

fuzz_target!(|data: &[u8]| {
    let [npieces, rest @ ..] = data else {
        return;
    };
    let (pieces, input) = rest.split_at(usize::from(*npieces).min(rest.len()));
    assert_eq!(decode(input, &[]), decode(input, pieces));
});
