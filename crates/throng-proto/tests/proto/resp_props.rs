//! Property tests of the RESP2 codec: encoded values decode back whole from
//! any split of the stream, and no input makes the decoder panic or take
//! more than its limits.

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use throng_proto::resp::{Decoder, Limits, Value, encode_command};

fn value() -> impl Strategy<Value = Value> {
    let line = "[ -~]{0,20}".prop_map(|s| Bytes::from(s.into_bytes()));
    let leaf = prop_oneof![
        line.clone().prop_map(Value::Simple),
        line.prop_map(Value::Error),
        any::<i64>().prop_map(Value::Integer),
        Just(Value::Bulk(None)),
        vec(any::<u8>(), 0..64).prop_map(|b| Value::Bulk(Some(Bytes::from(b)))),
        Just(Value::Array(None)),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        vec(inner, 0..6).prop_map(|v| Value::Array(Some(v)))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn values_round_trip_in_any_pieces(values in vec(value(), 1..6), sizes in vec(1usize..40, 1..8)) {
        let mut stream = BytesMut::new();
        for v in &values {
            v.encode(&mut stream);
        }
        let d = Decoder::default();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut fed = 0;
        let mut sizes = sizes.iter().cycle();
        while fed < stream.len() {
            let n = (*sizes.next().unwrap()).min(stream.len() - fed);
            buf.extend_from_slice(&stream[fed..fed + n]);
            fed += n;
            while let Some(v) = d.decode(&mut buf).unwrap() {
                got.push(v);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, values);
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings(args in vec(vec(any::<u8>(), 0..50), 1..6)) {
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let mut out = BytesMut::new();
        encode_command(&mut out, &refs);
        let v = Decoder::default().decode(&mut out).unwrap().unwrap();
        let want = Value::Array(Some(args.into_iter().map(|a| Value::Bulk(Some(Bytes::from(a)))).collect()));
        prop_assert_eq!(v, want);
        prop_assert!(out.is_empty());
    }

    #[test]
    fn any_bytes_decode_or_fail_without_panic(input in vec(any::<u8>(), 0..200)) {
        let d = Decoder::new(Limits { max_bulk: 16, max_array: 4, max_depth: 2, max_line: 16 });
        let mut buf = BytesMut::from(&input[..]);
        while let Ok(Some(_)) = d.decode(&mut buf) {}
    }

    #[test]
    fn resp_like_bytes_never_panic(parts in vec(prop_oneof![
        Just(&b"*"[..]), Just(&b"$"[..]), Just(&b":"[..]), Just(&b"+"[..]), Just(&b"-"[..]),
        Just(&b"\r\n"[..]), Just(&b"1"[..]), Just(&b"-1"[..]), Just(&b"3"[..]), Just(&b"x"[..]),
    ], 0..60)) {
        let input: Vec<u8> = parts.concat();
        let d = Decoder::new(Limits { max_bulk: 8, max_array: 3, max_depth: 2, max_line: 8 });
        let mut buf = BytesMut::from(&input[..]);
        while let Ok(Some(_)) = d.decode(&mut buf) {}
    }
}
