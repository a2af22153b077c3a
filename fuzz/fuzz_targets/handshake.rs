//! The server's side of the opening handshake on arbitrary bytes: parse the
//! head, check it as an upgrade, write the answer, and check that the answer
//! parses back and (for an accepted upgrade) satisfies a client.
#![no_main]

use libfuzzer_sys::fuzz_target;
use throng_proto::{http, ws};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the head limit, so TooLarge is reached both ways.
    let Some((&pick, data)) = data.split_first() else {
        return;
    };
    let limit = if pick & 1 == 0 {
        http::MAX_HEAD
    } else {
        usize::from(pick)
    };
    let (req, n) = match http::parse_request(data, limit) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => {
            assert!(data.len() < limit, "incomplete head at or over the limit");
            return;
        }
        Err(_) => return,
    };
    assert!(n <= data.len() && n <= limit);
    let _ = req.body_kind();
    let _ = req.keep_alive();
    let mut out = Vec::new();
    match ws::server_accept(&req) {
        Ok(accept) => {
            ws::write_accept(&mut out, &accept);
            let (resp, m) = http::parse_response(&out, http::MAX_HEAD).unwrap().unwrap();
            assert_eq!(m, out.len());
            let key = req.header("Sec-WebSocket-Key").unwrap().trim_ascii();
            let key = std::str::from_utf8(key).unwrap();
            ws::client_verify(&resp, key).unwrap();
        }
        Err(err) => {
            ws::write_refusal(&mut out, &err);
            let (resp, m) = http::parse_response(&out, http::MAX_HEAD).unwrap().unwrap();
            assert_eq!(resp.status, err.status());
            assert_eq!(
                resp.body_kind("GET"),
                Ok(http::BodyKind::Length((out.len() - m) as u64))
            );
            assert!(!err.label().is_empty());
        }
    }
});
