//! The PROXY protocol header parser on arbitrary bytes: never a panic; a
//! whole header is never longer than its input or its version's bound,
//! and every prefix of the bytes it read is either "more needed" or the
//! same error (a header is decided only once it is whole).
#![no_main]

use libfuzzer_sys::fuzz_target;
use throng_proto::proxy::{V1_MAX, V2_MAX, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(Some(h)) = parse(data) else {
        return;
    };
    assert!(h.len <= data.len() && h.len <= V1_MAX.max(V2_MAX));
    for cut in 0..h.len {
        assert!(matches!(parse(&data[..cut]), Ok(None)), "{cut}");
    }
    assert_eq!(parse(&data[..h.len]), Ok(Some(h)));
});
