//! What rustls holds per idle server connection, measured by counting live
//! heap bytes (issue 7): N connections of each kind complete a handshake in
//! memory with a rustls client, receive one small request and send one
//! small answer, and then sit idle while the live heap is counted.
//!
//! - `buffered`: `rustls::ServerConnection`, which owns its buffers;
//! - `unbuffered`: `UnbufferedServerConnection` as `throng serve` keeps it
//!   (boxed, the caller owning every byte buffer).
//!
//! The client side is freed before counting, so only the server side is left.
//!
//! ```text
//! cargo run --release -p throng-bench --bin tls_mem -- [--conns 2000]
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError};
use rustls::{ClientConnection, ServerConnection, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Counts live heap bytes.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);
static BLOCKS: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        BLOCKS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        BLOCKS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The bench's client trusts any certificate and checks no signature: only
/// the server is measured.
use throng_client::trust::AnyCertificate;

fn client_config(tls12: bool) -> Arc<rustls::ClientConfig> {
    let versions: &[&rustls::SupportedProtocolVersion] = if tls12 {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13]
    };
    let provider = rustls::crypto::ring::default_provider();
    let trust_all = AnyCertificate::unchecked(provider.signature_verification_algorithms);
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(trust_all))
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(c)
}

fn server_config() -> Arc<rustls::ServerConfig> {
    // ECDSA P-256, as --tls-self-signed makes (the key type does not change
    // what an idle connection holds).
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
    let (cert, key) = (c.cert.pem(), c.signing_key.serialize_pem());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .expect("cert pem");
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key pem");
    let mut s = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    s.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(s)
}

/// Moves what `c` has to send into `wire`.
fn client_out(c: &mut ClientConnection, wire: &mut Vec<u8>) {
    while c.wants_write() {
        c.write_tls(wire).expect("client write_tls");
    }
}

/// Feeds `wire` to `c`.
fn client_in(c: &mut ClientConnection, wire: &mut Vec<u8>) {
    let mut rd = &wire[..];
    while !rd.is_empty() {
        c.read_tls(&mut rd).expect("client read_tls");
        c.process_new_packets().expect("client process");
    }
    wire.clear();
}

/// Runs the unbuffered server over `incoming`, appending what it sends to
/// `out` and what it received to `plain` (as `throng serve` does).
fn pump(
    s: &mut UnbufferedServerConnection,
    incoming: &mut Vec<u8>,
    out: &mut Vec<u8>,
    plain: &mut Vec<u8>,
) {
    let mut start = 0;
    loop {
        let st = s.process_tls_records(&mut incoming[start..]);
        let discard = st.discard;
        let mut stop = false;
        match st.state.expect("server state") {
            ConnectionState::ReadTraffic(mut r) => {
                while let Some(rec) = r.next_record() {
                    plain.extend_from_slice(rec.expect("record").payload);
                }
            }
            ConnectionState::EncodeTlsData(mut e) => {
                let len = out.len();
                out.resize(len + 16_384, 0);
                match e.encode(&mut out[len..]) {
                    Ok(n) => out.truncate(len + n),
                    Err(EncodeError::InsufficientSize(_)) => panic!("record over 16 KiB"),
                    Err(e) => panic!("{e}"),
                }
            }
            ConnectionState::TransmitTlsData(t) => t.done(),
            _ => stop = true,
        }
        start += discard;
        if stop {
            break;
        }
    }
    incoming.drain(..start);
}

fn unbuffered_write(s: &mut UnbufferedServerConnection, data: &[u8], out: &mut Vec<u8>) {
    let st = s.process_tls_records(&mut []);
    let Ok(ConnectionState::WriteTraffic(mut w)) = st.state else {
        panic!("not ready to write");
    };
    let len = out.len();
    out.resize(len + data.len() + 256, 0);
    match w.encrypt(data, &mut out[len..]) {
        Ok(n) => out.truncate(len + n),
        Err(EncryptError::InsufficientSize(_)) => panic!("too small"),
        Err(e) => panic!("{e}"),
    }
}

const REQUEST: &[u8] = b"GET /bench HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n";
const ANSWER: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\n\r\n";

fn buffered(
    server: &Arc<rustls::ServerConfig>,
    client: &Arc<rustls::ClientConfig>,
) -> ServerConnection {
    let mut s = ServerConnection::new(server.clone()).expect("server");
    let mut c = ClientConnection::new(
        client.clone(),
        ServerName::try_from("localhost").expect("name"),
    )
    .expect("client");
    let mut wire = Vec::new();
    while c.is_handshaking() || s.is_handshaking() {
        client_out(&mut c, &mut wire);
        let mut rd = &wire[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).expect("server read_tls");
            s.process_new_packets().expect("server process");
        }
        wire.clear();
        while s.wants_write() {
            s.write_tls(&mut wire).expect("server write_tls");
        }
        client_in(&mut c, &mut wire);
    }
    c.writer().write_all(REQUEST).expect("request");
    client_out(&mut c, &mut wire);
    let mut rd = &wire[..];
    while !rd.is_empty() {
        s.read_tls(&mut rd).expect("read_tls");
        s.process_new_packets().expect("process");
    }
    wire.clear();
    let mut got = vec![0u8; REQUEST.len()];
    s.reader().read_exact(&mut got).expect("read request");
    s.writer().write_all(ANSWER).expect("answer");
    while s.wants_write() {
        s.write_tls(&mut wire).expect("write_tls");
    }
    client_in(&mut c, &mut wire);
    s
}

fn unbuffered(
    server: &Arc<rustls::ServerConfig>,
    client: &Arc<rustls::ClientConfig>,
) -> Box<UnbufferedServerConnection> {
    let mut s = Box::new(UnbufferedServerConnection::new(server.clone()).expect("server"));
    let mut c = ClientConnection::new(
        client.clone(),
        ServerName::try_from("localhost").expect("name"),
    )
    .expect("client");
    let (mut wire, mut out, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    while c.is_handshaking() || s.is_handshaking() {
        client_out(&mut c, &mut wire);
        pump(&mut s, &mut wire, &mut out, &mut plain);
        client_in(&mut c, &mut out);
    }
    c.writer().write_all(REQUEST).expect("request");
    client_out(&mut c, &mut wire);
    pump(&mut s, &mut wire, &mut out, &mut plain);
    assert_eq!(plain, REQUEST);
    unbuffered_write(&mut s, ANSWER, &mut out);
    client_in(&mut c, &mut out);
    s
}

/// Makes `conns` connections with `make` and reports the live heap bytes and
/// blocks they hold per connection, as `<name>_heap_bytes_per_conn` and
/// `<name>_heap_blocks_per_conn`. Returns them, so they are counted alive.
fn count_heap<T>(
    report: &mut serde_json::Map<String, serde_json::Value>,
    name: &str,
    conns: usize,
    make: impl Fn() -> T,
) -> Vec<T> {
    let (live0, blocks0) = (LIVE.load(Ordering::Relaxed), BLOCKS.load(Ordering::Relaxed));
    let held: Vec<T> = (0..conns).map(|_| make()).collect();
    let live = LIVE.load(Ordering::Relaxed) - live0;
    let blocks = BLOCKS.load(Ordering::Relaxed) - blocks0;
    report.insert(
        format!("{name}_heap_bytes_per_conn"),
        (live as f64 / conns as f64).round().into(),
    );
    report.insert(
        format!("{name}_heap_blocks_per_conn"),
        (blocks as f64 / conns as f64).into(),
    );
    held
}

fn main() {
    let mut conns = 2000usize;
    let mut sign_keys = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--conns" => conns = args.next().and_then(|v| v.parse().ok()).expect("--conns N"),
            "--sign-key" => sign_keys.push(args.next().expect("--sign-key FILE")),
            _ => panic!("unknown argument {a} (--conns N --sign-key FILE...)"),
        }
    }
    let server = server_config();
    let mut report = serde_json::Map::new();
    report.insert("conns".into(), conns.into());
    for tls12 in [false, true] {
        let client = client_config(tls12);
        let v = if tls12 { "tls1.2" } else { "tls1.3" };
        let cs = {
            let s = unbuffered(&server, &client);
            format!("{:?}", s.negotiated_cipher_suite().map(|c| c.suite()))
        };
        report.insert(format!("{v}_cipher_suite"), cs.into());

        let held = count_heap(&mut report, &format!("{v}_buffered"), conns, || {
            buffered(&server, &client)
        });
        drop(held);
        let held = count_heap(&mut report, &format!("{v}_unbuffered"), conns, || {
            unbuffered(&server, &client)
        });
        drop(held);
    }
    // What one handshake's signature costs with ring, per key given.
    for path in &sign_keys {
        let (name, us) = sign_micros(path);
        report.insert(format!("ring_sign_us_{name}"), us.into());
    }
    report.insert(
        "size_of_unbuffered_server_connection".into(),
        size_of::<UnbufferedServerConnection>().into(),
    );
    report.insert(
        "size_of_server_connection".into(),
        size_of::<ServerConnection>().into(),
    );
    println!("{}", serde_json::Value::Object(report));
}

/// Median time of one handshake signature (RSA-PSS-SHA256 or ECDSA P-256
/// SHA-256, as TLS 1.3 uses them) with ring, in microseconds.
fn sign_micros(path: &str) -> (String, f64) {
    let key = PrivateKeyDer::from_pem_file(path).expect("--sign-key: a PEM private key");
    let provider = rustls::crypto::ring::default_provider();
    let key = provider
        .key_provider
        .load_private_key(key)
        .expect("key ring can use");
    let signer = key
        .choose_scheme(&[
            SignatureScheme::RSA_PSS_SHA256,
            SignatureScheme::ECDSA_NISTP256_SHA256,
        ])
        .expect("an RSA or P-256 key");
    let name = format!("{:?}", signer.scheme()).to_lowercase();
    let msg = [7u8; 130];
    let mut times: Vec<f64> = (0..300)
        .map(|_| {
            let t = std::time::Instant::now();
            signer.sign(&msg).expect("sign");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (name, (times[times.len() / 2] * 10.0).round() / 10.0)
}
