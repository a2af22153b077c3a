//! The client connection against frames written by hand, as a server would.

use super::*;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame_head(&mut out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
    out
}

fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
    let mut p = Vec::new();
    for (id, v) in pairs {
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&v.to_be_bytes());
    }
    frame(SETTINGS, 0, 0, &p)
}

/// The frames in `out` as (type, flags, stream, payload).
fn frames(mut out: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    if out.starts_with(PREFACE) {
        out = &out[PREFACE.len()..];
    }
    let mut v = Vec::new();
    while out.len() >= 9 {
        let len = (usize::from(out[0]) << 16) | (usize::from(out[1]) << 8) | usize::from(out[2]);
        v.push((out[3], out[4], be32(&out[5..9]), out[9..9 + len].to_vec()));
        out = &out[9 + len..];
    }
    assert!(out.is_empty());
    v
}

/// Takes everything the client wrote, as frames.
fn sent<T>(c: &mut Connection<T>) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let f = frames(c.output());
    let n = c.output().len();
    c.written(n);
    f
}

fn events<T>(c: &mut Connection<T>) -> Vec<Event<T>> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// A connection past the server's SETTINGS (`pairs`), its output taken.
fn ready(pairs: &[(u16, u32)]) -> Connection<u32> {
    let mut c = Connection::new(Config::default());
    let first = sent(&mut c);
    assert_eq!(first[0].0, SETTINGS);
    assert_eq!(first[1].0, WINDOW_UPDATE);
    c.recv(&settings(pairs)).unwrap();
    let acked = sent(&mut c);
    assert_eq!(acked, vec![(SETTINGS, ACK, 0, vec![])]);
    c
}

const OK_200: u8 = 0x88;

#[test]
fn streams_are_capped_by_the_servers_setting_and_answered() {
    let mut c = ready(&[(0x3, 2)]);
    assert_eq!(c.stream_limit(), 2);
    assert_eq!(c.start(&[0x82], None, 10), Ok(1));
    assert_eq!(c.start(&[0x82], None, 11), Ok(3));
    assert!(!c.can_start());
    assert_eq!(c.start(&[0x82], None, 12), Err(12));
    let out = sent(&mut c);
    assert_eq!(out[0], (HEADERS, END_STREAM | END_HEADERS, 1, vec![0x82]));
    // The second answer first, its head and body split across reads.
    let mut wire = frame(HEADERS, END_HEADERS, 3, &[OK_200]);
    wire.extend(frame(DATA, END_STREAM, 3, b"pong"));
    wire.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &[0x8d]));
    for b in wire.chunks(5) {
        c.recv(b).unwrap();
    }
    assert_eq!(
        events(&mut c),
        vec![
            Event::Answered {
                token: 11,
                status: 200,
                bytes_in: 5
            },
            Event::Answered {
                token: 10,
                status: 404,
                bytes_in: 1
            }
        ]
    );
    assert!(c.can_start());
}

#[test]
fn informational_continuation_and_trailers() {
    let mut c = ready(&[]);
    c.start(&[0x82], None, 1).unwrap();
    sent(&mut c);
    // 100 Continue, then a head in two pieces, a padded body, then trailers.
    let mut wire = frame(HEADERS, END_HEADERS, 1, &[0x08, 3, b'1', b'0', b'0']);
    wire.extend(frame(HEADERS, 0, 1, &[0x08, 3, b'2']));
    wire.extend(frame(CONTINUATION, END_HEADERS, 1, b"01"));
    wire.extend(frame(DATA, PADDED, 1, &[2, b'x', 0, 0]));
    wire.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &[0x0f, 0x10, 1, b'x'],
    ));
    c.recv(&wire).unwrap();
    assert_eq!(
        events(&mut c),
        vec![Event::Answered {
            token: 1,
            status: 201,
            bytes_in: 18
        }]
    );
}

#[test]
fn a_large_body_waits_for_window_updates_on_both_levels() {
    let mut c = ready(&[(0x4, 1000)]);
    let body: Rc<[u8]> = vec![7u8; 70_000].into();
    let id = c.start(&[0x83], Some(body), 1).unwrap();
    let out = sent(&mut c);
    assert_eq!(out[0].0, HEADERS);
    assert_eq!(out[0].1 & END_STREAM, 0);
    let data: usize = out.iter().filter(|f| f.0 == DATA).map(|f| f.3.len()).sum();
    assert_eq!(data, 1000, "the stream window");
    // The stream may take more; the connection window (65,535) then binds.
    let mut inc = Vec::new();
    inc.extend(frame(WINDOW_UPDATE, 0, id, &100_000u32.to_be_bytes()));
    c.recv(&inc).unwrap();
    let out = sent(&mut c);
    let data: usize = out.iter().filter(|f| f.0 == DATA).map(|f| f.3.len()).sum();
    assert_eq!(data, 65_535 - 1000);
    assert!(out.iter().all(|f| f.3.len() <= MAX_FRAME));
    c.recv(&frame(WINDOW_UPDATE, 0, 0, &10_000u32.to_be_bytes()))
        .unwrap();
    let out = sent(&mut c);
    let data: usize = out.iter().filter(|f| f.0 == DATA).map(|f| f.3.len()).sum();
    assert_eq!(data, 70_000 - 65_535);
    assert_eq!(out.last().unwrap().1, END_STREAM);
    // Window updates past 2^31-1 break the connection.
    let mut c = ready(&[]);
    let err = c
        .recv(&frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()))
        .unwrap_err();
    assert!(matches!(err, H2Error::FlowControl(_)));
    assert_eq!(sent(&mut c)[0].0, GOAWAY);
}

#[test]
fn receive_windows_are_handed_back_and_enforced() {
    let mut c = ready(&[]);
    let id = c.start(&[0x82], None, 1).unwrap();
    sent(&mut c);
    c.recv(&frame(HEADERS, END_HEADERS, id, &[OK_200])).unwrap();
    // 1 MiB stream window: after half of it, a WINDOW_UPDATE for the stream.
    let chunk = vec![0u8; MAX_FRAME];
    let mut updates = Vec::new();
    for _ in 0..40 {
        c.recv(&frame(DATA, 0, id, &chunk)).unwrap();
        updates.extend(sent(&mut c));
    }
    let stream_inc: u32 = updates
        .iter()
        .filter(|f| f.0 == WINDOW_UPDATE && f.2 == id)
        .map(|f| be32(&f.3))
        .sum();
    assert!(stream_inc >= 512 * 1024, "{stream_inc}");
    c.recv(&frame(DATA, END_STREAM, id, b"")).unwrap();
    assert!(matches!(
        events(&mut c)[..],
        [Event::Answered { status: 200, .. }]
    ));
    // A server that ignores the stream window gets the stream reset.
    let mut small = Connection::new(Config {
        max_streams: 10,
        stream_window: 100,
    });
    small.recv(&settings(&[])).unwrap();
    let id = small.start(&[0x82], None, 9).unwrap();
    sent(&mut small);
    small
        .recv(&frame(HEADERS, END_HEADERS, id, &[OK_200]))
        .unwrap();
    small.recv(&frame(DATA, 0, id, &[0u8; 101])).unwrap();
    assert!(matches!(
        events(&mut small)[..],
        [Event::Malformed {
            token: 9,
            why: H2Error::FlowControl(_)
        }]
    ));
    assert_eq!(sent(&mut small)[0].0, RST_STREAM);
}

#[test]
fn goaway_refuses_the_streams_above_its_last_and_rst_ends_one() {
    let mut c = ready(&[]);
    for t in 0..4 {
        c.start(&[0x82], None, t).unwrap();
    }
    sent(&mut c);
    // Stream 7 refused, stream 5 reset, then GOAWAY after stream 1.
    let mut wire = frame(RST_STREAM, 0, 7, &code::REFUSED_STREAM.to_be_bytes());
    wire.extend(frame(RST_STREAM, 0, 5, &code::CANCEL.to_be_bytes()));
    wire.extend(frame(GOAWAY, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]));
    c.recv(&wire).unwrap();
    assert_eq!(
        events(&mut c),
        vec![
            Event::Refused { token: 3 },
            Event::Reset {
                token: 2,
                code: code::CANCEL
            },
            Event::Refused { token: 1 },
            Event::GoAway {
                last_stream: 1,
                code: 0
            }
        ]
    );
    assert!(!c.can_start());
    assert!(!c.is_done());
    c.recv(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &[OK_200]))
        .unwrap();
    assert!(matches!(
        events(&mut c)[..],
        [Event::Answered { token: 0, .. }]
    ));
    assert!(c.is_done());
}

#[test]
fn ping_is_answered_cancel_resets_and_close_loses_the_rest() {
    let mut c = ready(&[]);
    c.recv(&frame(PING, 0, 0, b"12345678")).unwrap();
    assert_eq!(sent(&mut c), vec![(PING, ACK, 0, b"12345678".to_vec())]);
    let a = c.start(&[0x82], None, 1).unwrap();
    c.start(&[0x82], None, 2).unwrap();
    sent(&mut c);
    assert_eq!(c.cancel(a), Some(1));
    assert_eq!(c.cancel(a), None);
    assert_eq!(
        sent(&mut c),
        vec![(RST_STREAM, 0, a, code::CANCEL.to_be_bytes().to_vec())]
    );
    // The server still answers the canceled stream: ignored.
    c.recv(&frame(HEADERS, END_HEADERS, a, &[OK_200])).unwrap();
    c.recv(&frame(DATA, END_STREAM, a, b"late")).unwrap();
    c.closed();
    assert_eq!(events(&mut c), vec![Event::Lost { token: 2 }]);
    assert!(c.is_done());
}

#[test]
fn bad_frames_are_connection_errors_with_a_goaway() {
    let after_settings = |wire: Vec<u8>| {
        let mut c = ready(&[]);
        c.start(&[0x82], None, 0).unwrap();
        sent(&mut c);
        let e = c.recv(&wire).unwrap_err();
        let out = sent(&mut c);
        assert_eq!(out.last().unwrap().0, GOAWAY);
        assert_eq!(be32(&out.last().unwrap().3[4..]), e.code());
        e
    };
    let cases: Vec<(Vec<u8>, u32)> = vec![
        (
            frame(PUSH_PROMISE, END_HEADERS, 1, &[0, 0, 0, 2]),
            code::PROTOCOL_ERROR,
        ),
        (
            frame(HEADERS, END_HEADERS, 3, &[OK_200]),
            code::PROTOCOL_ERROR,
        ),
        (
            frame(HEADERS, END_HEADERS, 1, &[0xbe]),
            code::COMPRESSION_ERROR,
        ),
        (frame(DATA, 0, 2, b"x"), code::PROTOCOL_ERROR),
        (frame(SETTINGS, 0, 0, &[0, 3, 0]), code::FRAME_SIZE_ERROR),
        (settings(&[(0x5, 100)]), code::PROTOCOL_ERROR),
        (settings(&[(0x4, 1 << 31)]), code::FLOW_CONTROL_ERROR),
        (frame(PING, 0, 0, b"short"), code::FRAME_SIZE_ERROR),
        (
            frame(CONTINUATION, END_HEADERS, 1, &[OK_200]),
            code::PROTOCOL_ERROR,
        ),
        (
            frame(WINDOW_UPDATE, 0, 0, &[0, 0, 0, 0]),
            code::PROTOCOL_ERROR,
        ),
        (frame(GOAWAY, 0, 0, &[0]), code::FRAME_SIZE_ERROR),
        (frame(RST_STREAM, 0, 9, &[0, 0, 0, 8]), code::PROTOCOL_ERROR),
        (frame(DATA, PADDED, 1, &[5, 0]), code::PROTOCOL_ERROR),
    ];
    for (wire, code) in cases {
        assert_eq!(after_settings(wire.clone()).code(), code, "{wire:?}");
    }
    // Too large a frame, from its header alone.
    let mut big = vec![0x00, 0x40, 0x01, DATA, 0, 0, 0, 0, 1];
    big.extend([0u8; 10]);
    assert!(matches!(after_settings(big), H2Error::FrameSize(_)));
    // The first frame must be SETTINGS.
    let mut c: Connection<u8> = Connection::new(Config::default());
    assert!(c.recv(&frame(PING, 0, 0, b"12345678")).is_err());
    // After a connection error nothing more is read.
    assert_eq!(c.recv(b"anything"), Ok(()));
    // An HTTP/1.1 server answering the preface is named as such.
    let mut c: Connection<u8> = Connection::new(Config::default());
    let e = c.recv(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap_err();
    assert!(e.to_string().contains("HTTP/1.x"), "{e}");
}

#[test]
fn random_bytes_never_panic_or_grow() {
    // A small xorshift: the same bytes every run.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..2000 {
        let mut c: Connection<u32> = ready(&[]);
        for t in 0..3 {
            let _ = c.start(&[0x82], Some(vec![1u8; 100].into()), t);
        }
        let len = (next() % 200) as usize;
        let mut wire: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Often a plausible frame header, so the frame code runs too.
        if next() % 2 == 0 && wire.len() >= 9 {
            wire[0] = 0;
            wire[1] = 0;
            wire[2] = (len - 9).min(255) as u8;
            wire[3] = (next() % 11) as u8;
            wire[5..9].copy_from_slice(&((next() % 8) as u32).to_be_bytes());
        }
        for piece in wire.chunks(1 + (next() % 16) as usize) {
            let _ = c.recv(piece);
        }
        assert!(c.partial.len() <= MAX_FRAME + 9);
        c.closed();
        events(&mut c);
    }
}

#[test]
fn a_large_header_block_goes_out_as_headers_and_continuations() {
    let mut c = ready(&[]);
    let head = vec![0x82u8; 40_000];
    let id = c.start(&head, None, 1).unwrap();
    let out = sent(&mut c);
    let kinds: Vec<(u8, u8)> = out.iter().map(|f| (f.0, f.1)).collect();
    assert_eq!(
        kinds,
        vec![
            (HEADERS, END_STREAM),
            (CONTINUATION, 0),
            (CONTINUATION, END_HEADERS)
        ]
    );
    assert!(out.iter().all(|f| f.2 == id && f.3.len() <= MAX_FRAME));
    assert_eq!(out.iter().map(|f| f.3.len()).sum::<usize>(), 40_000);
}

#[test]
fn a_new_initial_window_applies_to_open_streams() {
    let mut c = ready(&[(0x4, 10)]);
    let body: Rc<[u8]> = vec![1u8; 100].into();
    c.start(&[0x83], Some(body), 1).unwrap();
    let data = |out: &[(u8, u8, u32, Vec<u8>)]| -> usize {
        out.iter().filter(|f| f.0 == DATA).map(|f| f.3.len()).sum()
    };
    assert_eq!(data(&sent(&mut c)), 10);
    // The server raises the initial window by 50: the open stream may send 50 more.
    c.recv(&settings(&[(0x4, 60)])).unwrap();
    let out = sent(&mut c);
    assert_eq!(out[0], (SETTINGS, ACK, 0, vec![]));
    assert_eq!(data(&out), 50);
    // Lowered below what was sent: the window goes negative and nothing more goes.
    c.recv(&settings(&[(0x4, 0)])).unwrap();
    assert_eq!(data(&sent(&mut c)), 0);
    c.recv(&frame(WINDOW_UPDATE, 0, 1, &100u32.to_be_bytes()))
        .unwrap();
    let out = sent(&mut c);
    assert_eq!(data(&out), 40);
    assert_eq!(out.last().unwrap().1, END_STREAM);
}
