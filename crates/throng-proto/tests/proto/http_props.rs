//! Property tests of the HTTP side: written heads parse back, every prefix
//! of a head is "not yet", and bodies decode the same in any pieces.

use proptest::collection::vec;
use proptest::prelude::*;
use throng_proto::http::{
    BodyDecoder, BodyKind, MAX_HEAD, parse_request, parse_response, write_chunk, write_request,
    write_response,
};

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}".prop_filter(
        "framing headers are written by the writers",
        |n| {
            !n.eq_ignore_ascii_case("content-length")
                && !n.eq_ignore_ascii_case("transfer-encoding")
        },
    )
}

fn value() -> impl Strategy<Value = String> {
    // Visible ASCII with inner spaces; outer whitespace is not part of a value.
    "[!-~]([ !-~]{0,30}[!-~])?"
}

/// Reads a whole body from `input` in pieces of `sizes` (cycled); returns the
/// data and the bytes after the body.
fn read_body(kind: BodyKind, input: &[u8], sizes: &[usize]) -> (Vec<u8>, usize) {
    let mut dec = BodyDecoder::new(kind, u64::MAX);
    let mut sizes = sizes.iter().cycle();
    let (mut start, mut end) = (0, 0);
    let mut data = Vec::new();
    loop {
        let step = dec
            .decode(&input[start..end], end == input.len())
            .expect("valid body");
        data.extend_from_slice(&input[start + step.data.0..start + step.data.1]);
        start += step.consumed;
        if step.done {
            return (data, input.len() - start);
        }
        if step.consumed == 0 || start == end {
            end = (end + sizes.next().copied().unwrap_or(input.len())).min(input.len());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn written_requests_parse_back(
        method in prop_oneof![Just("GET"), Just("POST"), Just("DELETE")],
        target in "/[a-z0-9/?=&.]{0,40}",
        headers in vec((name(), value()), 0..10),
        body in vec(any::<u8>(), 0..100),
    ) {
        let owned: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())).collect();
        let mut out = Vec::new();
        write_request(&mut out, method, &target, &owned, &body);
        let (req, n) = parse_request(&out, MAX_HEAD).unwrap().unwrap();
        prop_assert_eq!(&req.method, method);
        prop_assert_eq!(&req.target, &target);
        let got: Vec<(String, Vec<u8>)> = req.headers.iter().filter(|(n, _)| n != "Content-Length").cloned().collect();
        let want: Vec<(String, Vec<u8>)> = headers.iter().map(|(n, v)| (n.clone(), v.clone().into_bytes())).collect();
        prop_assert_eq!(got, want);
        let kind = req.body_kind().unwrap();
        prop_assert_eq!(read_body(kind, &out[n..], &[7]), (body, 0));
        // Every strict prefix of the head is incomplete, never an error.
        for k in 0..n {
            prop_assert_eq!(parse_request(&out[..k], MAX_HEAD), Ok(None), "prefix {}", k);
        }
    }

    #[test]
    fn written_responses_parse_back(
        status in prop_oneof![Just(200u16), Just(404), Just(413), Just(503)],
        headers in vec((name(), value()), 0..10),
        body in vec(any::<u8>(), 0..300),
        sizes in vec(1usize..50, 1..10),
    ) {
        let owned: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let mut out = Vec::new();
        write_response(&mut out, status, &owned, &body);
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n"); // a pipelined next response
        let (resp, n) = parse_response(&out, MAX_HEAD).unwrap().unwrap();
        prop_assert_eq!(resp.status, status);
        prop_assert_eq!(read_body(resp.body_kind("GET").unwrap(), &out[n..], &sizes), (body, 17));
    }

    #[test]
    fn chunked_bodies_decode_in_any_pieces(
        chunks in vec(vec(any::<u8>(), 1..300), 0..8),
        trailers in vec((name(), value()), 0..3),
        sizes in vec(1usize..40, 1..10),
    ) {
        let mut wire = Vec::new();
        for c in &chunks {
            write_chunk(&mut wire, c);
        }
        // The last chunk, by hand when there are trailers to send after it.
        wire.extend_from_slice(b"0\r\n");
        for (n, v) in &trailers {
            wire.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
        }
        wire.extend_from_slice(b"\r\nnext");
        let (data, rest) = read_body(BodyKind::Chunked, &wire, &sizes);
        prop_assert_eq!(data, chunks.concat());
        prop_assert_eq!(rest, 4);
        if trailers.is_empty() {
            let mut simple = Vec::new();
            chunks.iter().for_each(|c| write_chunk(&mut simple, c));
            write_chunk(&mut simple, b"");
            prop_assert_eq!(&simple[..], &wire[..wire.len() - 4]);
        }
    }
}
