//! The publishers against real peers: a real `redis-server` (PUBLISH seen by
//! a RESP subscriber), and a plain HTTP server on a socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use throng_load::hold::message;
use throng_load::hold::publish::{PublishError, Publisher};
use throng_load::hold::target::PublishTarget;
use throng_testkit::redis::Redis;
use throng_testkit::{Peer, free_port, require};

/// Reads one RESP line.
fn line(r: &mut BufReader<TcpStream>) -> String {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    l.trim_end().to_owned()
}

#[tokio::test(flavor = "current_thread")]
async fn redis_publish_reaches_a_subscriber() {
    require!(Peer::RedisServer, Peer::RedisCli);
    let redis = Redis::start(&[], &[]);
    let mut sub = TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sub.write_all(b"*2\r\n$9\r\nSUBSCRIBE\r\n$8\r\nthrong:c\r\n")
        .unwrap();
    let mut r = BufReader::new(sub.try_clone().unwrap());
    // *3 $9 subscribe $8 throng:c :1
    let confirm: Vec<String> = (0..6).map(|_| line(&mut r)).collect();
    assert_eq!(confirm[5], ":1", "{confirm:?}");

    let target: PublishTarget = format!("redis://127.0.0.1:{}", redis.port).parse().unwrap();
    let mut publisher = Publisher::new(target, "throng:c".into(), Duration::from_secs(5));
    let mut msg = Vec::new();
    message::encode(&mut msg, 7, 1_234_567, 100);
    let first = publisher.publish(&msg, &mut || {}).await;
    assert!(first.sent && first.published());
    assert_eq!(first.answer.unwrap(), Some(1));
    // A second publish reuses the connection.
    assert_eq!(
        publisher.publish(&msg, &mut || {}).await.answer.unwrap(),
        Some(1)
    );

    // *3 $7 message $8 throng:c $100 <payload>
    let head: Vec<String> = (0..6).map(|_| line(&mut r)).collect();
    assert_eq!(head[2], "message");
    assert_eq!(head[5], "$100");
    let mut payload = vec![0u8; 102];
    r.read_exact(&mut payload).unwrap();
    assert_eq!(message::decode(&payload[..100]), Some((7, 1_234_567)));
}

#[tokio::test(flavor = "current_thread")]
async fn redis_down_is_a_connect_error() {
    let target: PublishTarget = format!("redis://127.0.0.1:{}", free_port())
        .parse()
        .unwrap();
    let mut publisher = Publisher::new(target, "throng:c".into(), Duration::from_secs(5));
    let outcome = publisher.publish(b"x", &mut || {}).await;
    assert!(!outcome.sent && !outcome.published(), "never sent");
    let err = outcome.answer.unwrap_err();
    assert!(matches!(err, PublishError::Connect { .. }), "{err}");
    assert_eq!(err.label(), "connect");
}

/// An HTTP endpoint that answers 503 then 200 with a JSON body, on one
/// keep-alive connection.
#[tokio::test(flavor = "current_thread")]
async fn http_status_and_subscriber_count() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        for answer in [
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy".to_owned(),
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"subscribers\":3}".to_owned(),
        ] {
            let mut len = 0;
            loop {
                let mut l = String::new();
                r.read_line(&mut l).unwrap();
                if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if l == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0u8; len];
            r.read_exact(&mut body).unwrap();
            w.write_all(answer.as_bytes()).unwrap();
        }
    });
    let target: PublishTarget = format!("http://{addr}/publish/c").parse().unwrap();
    let mut publisher = Publisher::new(target, String::new(), Duration::from_secs(5));
    let refused = publisher.publish(b"hello", &mut || {}).await;
    assert!(refused.sent && !refused.published(), "sent, and refused");
    let err = refused.answer.unwrap_err();
    assert!(matches!(err, PublishError::Status(503)), "{err}");
    // The 503 was read whole: the same connection carries the next publish.
    assert_eq!(
        publisher
            .publish(b"hello", &mut || {})
            .await
            .answer
            .unwrap(),
        Some(3)
    );
    server.join().unwrap();
}

/// An endpoint that takes the whole request and answers after the
/// publisher's timeout: the message was sent (and published), only its
/// answer is missing.
#[tokio::test(flavor = "current_thread")]
async fn a_late_answer_is_a_timeout_of_a_message_that_was_sent() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut got = Vec::new();
        while !got.ends_with(b"hello") {
            let mut byte = [0u8; 1];
            r.read_exact(&mut byte).unwrap();
            got.push(byte[0]);
        }
        std::thread::sleep(Duration::from_millis(600));
        let mut w = s;
        let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n{\"subscribers\":3}");
    });
    let target: PublishTarget = format!("http://{addr}/publish/c").parse().unwrap();
    let mut publisher = Publisher::new(target, String::new(), Duration::from_millis(200));
    let mut sent_at = None;
    let began = std::time::Instant::now();
    let late = publisher
        .publish(b"hello", &mut || sent_at = Some(began.elapsed()))
        .await;
    assert!(late.sent && late.published(), "{late:?}");
    assert!(
        sent_at.is_some_and(|t| t < Duration::from_millis(200)),
        "counted as sent when it went out, not when the wait ended: {sent_at:?}"
    );
    let err = late.answer.unwrap_err();
    assert!(matches!(err, PublishError::Timeout(_)), "{err}");
    assert_eq!(err.to_string(), "publish got no answer within 200ms");
    server.join().unwrap();
}
