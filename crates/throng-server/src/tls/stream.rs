//! A TLS connection's first life, as a tokio stream: the handshake (with
//! the checks that tell a plain-HTTP client or a stalled one apart), then the
//! HTTP phase (request heads, publish bodies, `/ping`), then — on a
//! WebSocket upgrade — its parts handed to the worker's own epoll.
//!
//! The buffers here live only for the handshake and the HTTP phase, which
//! already owns per-connection buffers; [`TlsStream::into_parts`] keeps
//! nothing of them but unread bytes.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustls::server::UnbufferedServerConnection;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::{Pumped, close_notify, pump, seal};

/// Largest run of received bytes held before a record completes: a 64 KiB
/// handshake message (rustls's own limit) plus a record header, or a full
/// record (16 KiB + overhead).
const MAX_INCOMING: usize = 64 * 1024 + 2048;

/// Unsent records a write adds to before it waits for the socket.
const MAX_UNSENT: usize = 16 * 1024;

/// How much to read at a time.
const READ_CHUNK: usize = 4096;

/// Spare buffers kept per worker (see [`take_buffer`]), and the largest.
const POOL_BUFFERS: usize = 256;
const POOL_MAX_BYTES: usize = 32 * 1024;

thread_local! {
    /// Buffers of this worker's TLS streams that hold nothing, for the
    /// next one that needs a buffer. A kept-alive https connection gives its
    /// buffers back while it waits for the next request, so it holds none,
    /// and takes them again when bytes arrive: without a `malloc`, a `free`
    /// and a `memset` per request. At most [`POOL_BUFFERS`] of at most
    /// [`POOL_MAX_BYTES`] each: 8 MiB per worker at worst.
    static POOL: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A spare buffer of this worker (empty, at least [`READ_CHUNK`] of
/// capacity), or a new one.
pub(crate) fn take_buffer() -> Vec<u8> {
    POOL.with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| Vec::with_capacity(READ_CHUNK))
}

/// Gives `b` back for [`take_buffer`] (or frees it, if it is too small,
/// too big or enough are spare).
pub(crate) fn give_buffer(mut b: Vec<u8>) {
    if !(READ_CHUNK..=POOL_MAX_BYTES).contains(&b.capacity()) {
        return;
    }
    b.clear();
    POOL.with_borrow_mut(|p| {
        if p.len() < POOL_BUFFERS {
            p.push(b);
        }
    });
}

/// What waking a parked connection gave ([`TlsStream::wake`]).
pub(crate) enum Woken {
    /// Bytes came: a stream again, holding them.
    Stream(Box<TlsStream>),
    /// The peer closed, or the socket failed.
    Ended,
    /// Nothing to read after all: to park again.
    NotYet(std::net::TcpStream, Box<UnbufferedServerConnection>),
}

/// The first byte of a TLS record carrying a handshake message.
const TLS_HANDSHAKE: u8 = 0x16;

/// A connection on a TLS listener, before or after its handshake.
pub(crate) struct TlsStream {
    tcp: TcpStream,
    conn: UnbufferedServerConnection,
    /// Received bytes not yet processed.
    incoming: Vec<u8>,
    /// Decrypted bytes not yet read: `plain[plain_pos..]`.
    plain: Vec<u8>,
    plain_pos: usize,
    /// Records not yet written: `out[out_pos..]`.
    out: Vec<u8>,
    out_pos: usize,
    /// The peer closed (close_notify or end of stream).
    eof: bool,
    /// Our close_notify is queued.
    closing: bool,
    /// The session failed: rustls is not called again (see [`pump`]).
    failed: Option<rustls::Error>,
}

/// Why a handshake did not complete; each is a `reason` in
/// `throng_handshake_failures_total`.
#[derive(Debug)]
pub(crate) enum AcceptError {
    /// The client spoke plain HTTP to a TLS port.
    PlainHttp,
    /// The first bytes are not a TLS handshake record.
    NotTls,
    /// The client went away during the handshake.
    Closed,
    /// rustls refused the handshake.
    Tls(rustls::Error),
    /// The socket failed.
    Io,
}

impl AcceptError {
    /// The metrics label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::PlainHttp => "tls_plain_http",
            Self::NotTls => "tls_not_tls",
            Self::Closed => "tls_closed",
            Self::Tls(e) => super::failure_label(e),
            Self::Io => "tls_io",
        }
    }
}

/// What [`TlsStream::into_parts`] gives the subscriber: the socket, the
/// connection state, and bytes received but not yet used.
pub(crate) struct Parts {
    pub(crate) tcp: TcpStream,
    pub(crate) conn: UnbufferedServerConnection,
    /// Received bytes of a record that arrived split.
    pub(crate) cipher_rest: Vec<u8>,
    /// Decrypted bytes the HTTP phase did not read.
    pub(crate) plain_rest: Vec<u8>,
}

impl TlsStream {
    /// Runs the server side of a handshake on `tcp`. The caller bounds it
    /// in time (`--handshake-timeout`).
    pub(crate) async fn accept(
        tcp: TcpStream,
        config: Arc<rustls::ServerConfig>,
    ) -> Result<Self, AcceptError> {
        let conn = UnbufferedServerConnection::new(config).map_err(AcceptError::Tls)?;
        let mut s = Self::from_parts(tcp, conn);
        let mut first = true;
        loop {
            let n = std::future::poll_fn(|cx| s.poll_fill(cx))
                .await
                .map_err(|_| AcceptError::Io)?;
            if n == 0 {
                return Err(AcceptError::Closed);
            }
            if std::mem::take(&mut first) && s.incoming[0] != TLS_HANDSHAKE {
                if s.incoming[0].is_ascii_uppercase() {
                    s.refuse_plain_http().await;
                    return Err(AcceptError::PlainHttp);
                }
                return Err(AcceptError::NotTls);
            }
            if let Err(e) = s.run() {
                // The alert for the client, if rustls had one.
                let _ = std::future::poll_fn(|cx| s.poll_flush_out(cx)).await;
                return Err(AcceptError::Tls(e));
            }
            if !s.conn.is_handshaking() {
                // What rustls queued last (a session ticket; in TLS 1.2
                // the server's Finished) stays in `out`: it goes with the
                // first response, or before the stream waits to read,
                // whichever comes first: one write instead of two.
                return Ok(s);
            }
            std::future::poll_fn(|cx| s.poll_flush_out(cx))
                .await
                .map_err(|_| AcceptError::Io)?;
            if s.eof {
                return Err(AcceptError::Closed);
            }
        }
    }

    /// A plain-HTTP request on a TLS port gets a plain answer saying so.
    async fn refuse_plain_http(&mut self) {
        let body = b"This port speaks TLS: use https:// or wss://\n";
        let mut out = Vec::with_capacity(160);
        throng_proto::http::write_response(
            &mut out,
            400,
            &[("Content-Type", "text/plain"), ("Connection", "close")],
            body,
        );
        let _ = self.tcp.write_all(&out).await;
    }

    /// A stream over `tcp` and its rustls state, holding no bytes: a new
    /// connection, or one parked between requests (`park`) back in a task.
    pub(crate) fn from_parts(tcp: TcpStream, conn: UnbufferedServerConnection) -> Self {
        Self {
            tcp,
            conn,
            incoming: Vec::new(),
            plain: Vec::new(),
            plain_pos: 0,
            out: Vec::new(),
            out_pos: 0,
            eof: false,
            closing: false,
            failed: None,
        }
    }

    /// A parked connection (`park`) its epoll found readable: reads what
    /// came at once (tokio would first wait for its own report of the
    /// same readiness, and the connection would look idle again), then it
    /// is a stream again.
    pub(crate) fn wake(
        mut tcp: std::net::TcpStream,
        conn: Box<UnbufferedServerConnection>,
    ) -> Woken {
        let mut incoming = take_buffer();
        // Zeroed: std's `read` wants an initialised buffer (a `memset` of
        // 4 KiB per wake, against the system calls of a wake).
        incoming.resize(READ_CHUNK, 0);
        let read = loop {
            match io::Read::read(&mut tcp, &mut incoming) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        let n = match read {
            Ok(n) if n > 0 => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                give_buffer(incoming);
                return Woken::NotYet(tcp, conn);
            }
            _ => {
                give_buffer(incoming);
                return Woken::Ended;
            }
        };
        incoming.truncate(n);
        let Ok(tcp) = TcpStream::from_std(tcp) else {
            give_buffer(incoming);
            return Woken::Ended;
        };
        let mut s = Self::from_parts(tcp, *conn);
        s.incoming = incoming;
        Woken::Stream(Box::new(s))
    }

    /// Whether the connection holds nothing but its socket and rustls's
    /// state (no bytes received or decrypted and not read, none unsent, not
    /// ending), so it can be parked between requests.
    pub(crate) fn parkable(&self) -> bool {
        self.incoming.is_empty()
            && self.plain_pos >= self.plain.len()
            && self.out_pos >= self.out.len()
            && !self.eof
            && !self.closing
            && self.failed.is_none()
            && !self.conn.is_handshaking()
    }

    /// The negotiated handshake, as a metrics label.
    pub(crate) fn handshake_label(&self) -> &'static str {
        super::handshake_label(&self.conn)
    }

    /// The connection's parts, once everything written has been flushed.
    pub(crate) fn into_parts(self) -> Parts {
        Parts {
            tcp: self.tcp,
            conn: self.conn,
            cipher_rest: self.incoming,
            plain_rest: self.plain[self.plain_pos..].to_vec(),
        }
    }

    /// Processes what was received; plaintext goes to `plain`, records to
    /// send to `out`. Sets `eof` on close_notify.
    fn run(&mut self) -> Result<(), rustls::Error> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.incoming.is_empty() && !self.conn.is_handshaking() {
            return Ok(());
        }
        self.rearm();
        let pumped = pump(
            &mut self.conn,
            &mut self.incoming,
            &mut self.plain,
            &mut self.out,
        );
        let (consumed, state) = pumped.inspect_err(|e| self.failed = Some(e.clone()))?;
        self.incoming.drain(..consumed);
        if state == Pumped::Closed {
            self.eof = true;
        }
        Ok(())
    }

    /// Waits until decrypted bytes can be read, or the end of the stream.
    pub(crate) fn poll_plain_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.plain_pos < self.plain.len() || self.eof {
                return Poll::Ready(Ok(()));
            }
            self.run().map_err(invalid)?;
            if self.plain_pos < self.plain.len() || self.eof {
                continue;
            }
            // Nothing to read yet: send what is pending (tickets, a key
            // update, the TLS 1.2 Finished) before waiting for the peer.
            ready!(self.poll_flush_out(cx))?;
            if ready!(self.poll_fill(cx))? == 0 {
                self.eof = true;
            }
        }
    }

    /// Frees the buffers that hold nothing: a connection waiting for its
    /// peer (a kept-alive https connection between requests, a stalled
    /// handshake) keeps none of them. Allocating again when bytes arrive
    /// costs a `malloc` per request.
    fn release_idle(&mut self) {
        if self.incoming.is_empty() {
            give_buffer(std::mem::take(&mut self.incoming));
        }
        if self.plain_pos >= self.plain.len() {
            give_buffer(std::mem::take(&mut self.plain));
            self.plain_pos = 0;
        }
        if self.out_pos >= self.out.len() {
            give_buffer(std::mem::take(&mut self.out));
            self.out_pos = 0;
        }
    }

    /// Takes spare buffers for `plain` and `out` if they were given back.
    fn rearm(&mut self) {
        for b in [&mut self.plain, &mut self.out] {
            if b.capacity() == 0 {
                *b = take_buffer();
            }
        }
    }

    /// Reads more bytes from the socket; `Ok(0)` at end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let used = self.incoming.len();
        if used >= MAX_INCOMING {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS record larger than allowed",
            )));
        }
        if self.incoming.capacity() == 0 {
            self.incoming = take_buffer();
        }
        let room = READ_CHUNK.min(MAX_INCOMING - used);
        self.incoming.reserve(room);
        // Read into the spare capacity: no zeroing first.
        let spare = &mut self.incoming.spare_capacity_mut()[..room];
        let start = spare.as_ptr().cast::<u8>();
        let mut rb = ReadBuf::uninit(spare);
        if Pin::new(&mut self.tcp).poll_read(cx, &mut rb)?.is_pending() {
            self.release_idle();
            return Poll::Pending;
        }
        let filled = rb.filled();
        if filled.as_ptr() != start {
            // An AsyncRead may not swap the buffer; tokio's does not.
            return Poll::Ready(Err(io::Error::other("read went to another buffer")));
        }
        let n = filled.len();
        // SAFETY: the first `n` bytes of the spare capacity were written by
        // the read (`ReadBuf::filled` counts only initialised bytes, and its
        // buffer is the spare capacity: checked above), and `used + n` is
        // within the capacity reserved.
        unsafe { self.incoming.set_len(used + n) };
        Poll::Ready(Ok(n))
    }

    /// Encrypts `data` into the unsent records without writing them.
    fn queue(&mut self, data: &[u8]) -> io::Result<()> {
        // Complete records in the input would stand in seal's way.
        self.run().map_err(invalid)?;
        self.rearm();
        seal(&mut self.conn, &mut self.incoming, data, &mut self.out)
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }

    /// Writes every pending record.
    fn poll_flush_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_pos < self.out.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.out[self.out_pos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_pos += n;
        }
        self.out.clear();
        self.out_pos = 0;
        Poll::Ready(Ok(()))
    }
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl AsyncRead for TlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_plain_ready(cx))?;
        if this.plain_pos < this.plain.len() {
            let n = buf.remaining().min(this.plain.len() - this.plain_pos);
            buf.put_slice(&this.plain[this.plain_pos..this.plain_pos + n]);
            this.plain_pos += n;
            if this.plain_pos == this.plain.len() {
                this.plain.clear();
                this.plain_pos = 0;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // Pending records (a ticket after the handshake) go in the same
        // write as this data, unless there is already a lot unsent.
        if this.out.len() - this.out_pos >= MAX_UNSENT {
            ready!(this.poll_flush_out(cx))?;
        }
        this.queue(data)?;
        // Accepted: what the socket does not take now goes with the next
        // write, read or flush.
        let _ = this.poll_flush_out(cx)?;
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_flush_out(cx)
    }

    /// Sends close_notify after whatever is pending. The FIN follows when
    /// the stream is dropped, as every caller does right after: a
    /// `shutdown(2)` first would cost a system call and send nothing more
    /// (and mostly fail, against clients that reset after the response).
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !std::mem::replace(&mut this.closing, true) && this.failed.is_none() {
            // Queued behind anything unsent. Best effort: a session that
            // cannot send any more just closes.
            let _ = this.run();
            let _ = close_notify(&mut this.conn, &mut this.incoming, &mut this.out);
        }
        this.poll_flush_out(cx)
    }
}

/// A connection in its HTTP phase: plain, or TLS.
pub(crate) enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

impl Io {
    /// Writes all of `bytes` and flushes. Shadows `AsyncWriteExt::write_all`
    /// on purpose: a TLS stream may hold encrypted bytes until flushed, and
    /// every write in the HTTP phase is a whole message that must go out.
    pub(crate) async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        AsyncWriteExt::write_all(self, bytes).await?;
        AsyncWriteExt::flush(self).await
    }

    /// Writes `bytes` as the last thing on this connection. On TLS they go
    /// in one write with the close_notify behind them (and a ticket still
    /// pending from the handshake), where `write_all` and a shutdown would
    /// take two or three.
    pub(crate) async fn write_last(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Self::Plain(_) => self.write_all(bytes).await,
            Self::Tls(s) => {
                s.queue(bytes)?;
                AsyncWriteExt::shutdown(&mut **s).await
            }
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, data),
            Self::Tls(s) => Pin::new(&mut **s).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use tokio::io::AsyncReadExt as _;

    use super::*;
    use crate::tls::{Material, server_config};

    /// A kept-alive https connection between requests holds no buffer: the
    /// issue's "release what it need not keep while idle".
    #[test]
    fn a_kept_alive_connection_waiting_for_a_request_holds_no_buffers() {
        let m = Material::self_signed().unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in m.certs().unwrap() {
            roots.add(c).unwrap();
        }
        let client_cfg = Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            // The client: one request, then it waits (it keeps the socket open).
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let client = std::thread::spawn(move || {
                let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
                let conn = rustls::ClientConnection::new(client_cfg, name).unwrap();
                let tcp = std::net::TcpStream::connect(addr).unwrap();
                let mut s = rustls::StreamOwned::new(conn, tcp);
                s.write_all(b"GET /a HTTP/1.1\r\n\r\n").unwrap();
                let mut got = [0u8; 5];
                s.read_exact(&mut got).unwrap();
                assert_eq!(&got, b"hello");
                let _ = done_rx.recv();
            });
            let (tcp, _) = listener.accept().await.unwrap();
            let mut s = TlsStream::accept(tcp, server_config(&m).unwrap())
                .await
                .unwrap();
            let mut head = [0u8; 19];
            s.read_exact(&mut head).await.unwrap();
            assert_eq!(&head, b"GET /a HTTP/1.1\r\n\r\n");
            AsyncWriteExt::write_all(&mut s, b"hello").await.unwrap();
            AsyncWriteExt::flush(&mut s).await.unwrap();
            // Waiting for the next request: Pending, and nothing held.
            let waited = tokio::time::timeout(
                std::time::Duration::from_millis(200),
                std::future::poll_fn(|cx| s.poll_plain_ready(cx)),
            )
            .await;
            assert!(waited.is_err(), "no second request was sent");
            assert_eq!(
                (s.incoming.capacity(), s.plain.capacity(), s.out.capacity()),
                (0, 0, 0)
            );
            done_tx.send(()).unwrap();
            client.join().unwrap();
        });
    }
}
