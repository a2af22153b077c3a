//! Property tests of the frame codec: whatever is encoded decodes to the same
//! messages, in either role, however the bytes are split on arrival.

use proptest::collection::vec;
use proptest::prelude::*;
use throng_proto::ws::{self, Decoder, OpCode, ProtocolError, Role};

use crate::support::{Item, Msg, encode, expected, feed, peer};

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Server), Just(Role::Client)]
}

/// Payload lengths that reach every length encoding, mostly short.
fn payload(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => vec(any::<u8>(), 0..=130.min(max)),
        2 => vec(any::<u8>(), 120.min(max)..=300.min(max)),
        1 => vec(any::<u8>(), 65_530.min(max)..=65_600.min(max)),
    ]
}

fn text(max_chars: usize) -> impl Strategy<Value = String> {
    // Any chars, including 2-, 3- and 4-byte ones, so fragment cuts fall
    // inside code points.
    vec(any::<char>(), 0..=max_chars).prop_map(|c| c.into_iter().collect())
}

fn control() -> impl Strategy<Value = Msg> {
    let code = prop_oneof![1000u16..=1003, 1007u16..=1014, 3000u16..=4999];
    prop_oneof![
        vec(any::<u8>(), 0..=125).prop_map(Msg::Ping),
        vec(any::<u8>(), 0..=125).prop_map(Msg::Pong),
        Just(Msg::Close(None, String::new())),
        // 30 chars of at most 4 bytes fit the 123-byte reason.
        (code, text(30)).prop_map(|(c, r)| Msg::Close(Some(c), r)),
    ]
}

fn item(max_payload: usize) -> impl Strategy<Value = Item> {
    let data = prop_oneof![
        payload(max_payload).prop_map(Msg::Binary),
        text(max_payload / 4).prop_map(Msg::Text),
    ];
    let msg = prop_oneof![4 => data, 1 => control()];
    (
        msg,
        vec(any::<usize>(), 0..4),
        proptest::option::of(control()),
        any::<[u8; 4]>(),
    )
        .prop_map(|(msg, cuts, between, mask)| {
            let data = matches!(msg, Msg::Text(_) | Msg::Binary(_));
            Item {
                msg,
                cuts: if data { cuts } else { Vec::new() },
                between,
                mask,
            }
        })
}

const LIMIT: usize = 1 << 20;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn encoded_messages_decode_back(role in role(), items in vec(item(70_000), 0..6)) {
        let bytes = encode(role, &items);
        prop_assert_eq!(feed(peer(role), LIMIT, [&bytes[..]]), Ok((expected(&items), 0)));
    }

    #[test]
    fn any_single_split_decodes_the_same(role in role(), items in vec(item(200), 1..4)) {
        let bytes = encode(role, &items);
        let want = Ok((expected(&items), 0));
        for at in 0..=bytes.len() {
            let (a, b) = bytes.split_at(at);
            prop_assert_eq!(&feed(peer(role), LIMIT, [a, b]), &want, "split at {}", at);
        }
    }

    #[test]
    fn random_pieces_decode_the_same(
        role in role(),
        items in vec(item(70_000), 1..6),
        sizes in vec(1usize..2000, 1..50),
    ) {
        let bytes = encode(role, &items);
        let mut pieces = Vec::new();
        let mut rest = &bytes[..];
        for size in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (a, b) = rest.split_at((*size).min(rest.len()));
            pieces.push(a);
            rest = b;
        }
        prop_assert_eq!(feed(peer(role), LIMIT, pieces), Ok((expected(&items), 0)));
    }

    #[test]
    fn the_wrong_role_is_refused_at_the_first_frame(role in role(), items in vec(item(200), 1..3)) {
        let bytes = encode(role, &items);
        let want = match role {
            Role::Server => ProtocolError::Unmasked,
            Role::Client => ProtocolError::Masked,
        };
        prop_assert_eq!(feed(role, LIMIT, [&bytes[..2]]), Err(want));
    }

    #[test]
    fn a_message_over_the_limit_is_refused_before_its_payload(
        role in role(),
        len in 1usize..5000,
        cut in any::<usize>(),
        limit_below in 1usize..100,
    ) {
        let limit = len.saturating_sub(limit_below);
        let payload = vec![b'x'; len];
        let item = Item { msg: Msg::Binary(payload), cuts: vec![cut], between: None, mask: [1, 2, 3, 4] };
        let bytes = encode(role, &[item]);
        // Whatever the fragments, some header pushes the total over; the
        // error comes when that header is in, not after its payload.
        let mut dec = Decoder::new(peer(role), limit);
        let mut buf = bytes.clone();
        let mut at = 0;
        let err = loop {
            match dec.decode(&mut buf[at..]) {
                Ok(Some(d)) => at += d.consumed,
                Ok(None) => prop_assert!(false, "ran out of input without an error"),
                Err(e) => break e,
            }
        };
        prop_assert_eq!(err, ProtocolError::TooBig { limit });
        // Refused at a header: nothing after it was needed.
        prop_assert!(at < bytes.len());
    }

    #[test]
    fn every_length_encoding_round_trips(
        role in role(),
        payload in payload(70_000),
        opcode in prop_oneof![Just(OpCode::Binary), Just(OpCode::Ping)],
        mask in any::<[u8; 4]>(),
    ) {
        let opcode = if payload.len() > 125 { OpCode::Binary } else { opcode };
        let mut out = Vec::new();
        let mask = (role == Role::Client).then_some(mask);
        ws::encode_into(&mut out, true, opcode, &payload, mask);
        prop_assert_eq!(out.len(), ws::header_len(payload.len(), mask.is_some()) + payload.len());
        let want = if opcode == OpCode::Ping { Msg::Ping(payload) } else { Msg::Binary(payload) };
        prop_assert_eq!(feed(peer(role), LIMIT, [&out[..]]), Ok((vec![want], 0)));
    }

    #[test]
    fn masking_is_an_involution(data in vec(any::<u8>(), 0..300), mask in any::<[u8; 4]>()) {
        let mut buf = data.clone();
        ws::apply_mask(&mut buf, mask);
        let bytewise: Vec<u8> = data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]).collect();
        prop_assert_eq!(&buf, &bytewise);
        ws::apply_mask(&mut buf, mask);
        prop_assert_eq!(buf, data);
    }
}
