//! A client reading an HTTP response on arbitrary bytes: parse the head, work
//! out the body framing and read the body, at once and in pieces; both must
//! agree and stay within the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use throng_proto::http::{self, BodyDecoder, BodyError};

/// Reads the body from `input` in pieces of the given sizes; returns the data,
/// the bytes left after the body (None when it never ended) or the error.
fn read_body(
    dec: &mut BodyDecoder,
    input: &[u8],
    pieces: &[u8],
    limit: u64,
) -> Result<(Vec<u8>, Option<usize>), BodyError> {
    let mut sizes = pieces.iter().map(|&p| usize::from(p) + 1);
    let mut data = Vec::new();
    let (mut start, mut end) = (0, 0);
    // Every call consumes a byte, returns data, or asks for more input, so
    // this bound is never reached by a correct decoder.
    for _ in 0..4 * input.len() + 16 {
        let eof = end == input.len();
        let step = dec.decode(&input[start..end], eof)?;
        assert!(
            step.data.0 <= step.data.1
                && step.data.1 <= step.consumed
                && step.consumed <= end - start
        );
        data.extend_from_slice(&input[start + step.data.0..start + step.data.1]);
        assert!(data.len() as u64 <= limit);
        start += step.consumed;
        if step.done {
            return Ok((data, Some(input.len() - start)));
        }
        if step.consumed == 0 || start == end {
            if eof && step.consumed == 0 {
                panic!("decoder neither finished nor failed at EOF");
            }
            let size = sizes.next().unwrap_or(input.len());
            end = (end + size).min(input.len());
        }
    }
    panic!("body decoder made no progress");
}

fuzz_target!(|data: &[u8]| {
    let [pick, npieces, rest @ ..] = data else {
        return;
    };
    let split = usize::from(*npieces).min(rest.len());
    let (pieces, input) = rest.split_at(split);
    let limit = u64::from(*pick >> 1) * 8;
    let method = if pick & 1 == 0 { "GET" } else { "HEAD" };
    let Ok(Some((resp, n))) = http::parse_response(input, http::MAX_HEAD) else {
        return;
    };
    let _ = resp.keep_alive();
    let Ok(kind) = resp.body_kind(method) else {
        return;
    };
    let whole = read_body(&mut BodyDecoder::new(kind, limit), &input[n..], &[], limit);
    let split = read_body(
        &mut BodyDecoder::new(kind, limit),
        &input[n..],
        pieces,
        limit,
    );
    assert_eq!(whole, split);
});
