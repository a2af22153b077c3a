//! A client connection that is plain TCP or TLS (rustls through
//! tokio-rustls: there are only a few of these per process, so nothing here
//! is tuned for memory), and why one could not be made.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;

/// Why a connection to Redis could not be made or greeted.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LinkError {
    /// TCP connect failed (or the name did not resolve).
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    /// A step took longer than allowed.
    #[error("no {what} within {limit:?}")]
    Timeout {
        /// The step: "connection", "answer".
        what: &'static str,
        /// The limit.
        limit: Duration,
    },
    /// The server did not complete the TLS handshake in time: typically a
    /// plain Redis behind a `rediss://` URL (it waits for a command line).
    #[error(
        "no TLS handshake within {0:?} (is it a TLS port? a plain Redis or HTTP port waits \
         silently; use redis:// or http:// for it)"
    )]
    TlsTimeout(Duration),
    /// The TLS handshake failed: a certificate not signed by the trusted
    /// CA, a name mismatch, or a server that does not speak TLS there.
    #[error("TLS handshake failed: {error} ({hint})")]
    Tls {
        /// What rustls (or the socket) said.
        error: io::Error,
        /// What to check.
        hint: &'static str,
    },
    /// The URL host is not a valid TLS server name.
    #[error("'{0}' is not a valid TLS server name")]
    ServerName(String),
    /// Redis answered an error (wrong password, unknown database).
    #[error("Redis refused: {0}")]
    Refused(String),
    /// Redis closed the connection.
    #[error("Redis closed the connection")]
    Closed,
    /// Reading or writing failed.
    #[error("{0}")]
    Io(io::Error),
    /// Not RESP.
    #[error("bad answer from Redis: {0}")]
    Protocol(String),
}

impl LinkError {
    /// A short stable label for counters.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Timeout { .. } => "timeout",
            Self::Tls { .. } | Self::TlsTimeout(_) | Self::ServerName(_) => "tls",
            Self::Refused(_) => "refused",
            Self::Closed | Self::Io(_) => "io",
            Self::Protocol(_) => "protocol",
        }
    }
}

/// A connection to Redis, plain or TLS.
#[derive(Debug)]
pub enum Stream {
    /// `redis://`.
    Plain(TcpStream),
    /// `rediss://`.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The TLS handshake on `tcp` as a client of `host` (its name for SNI and
/// the certificate check; an IP address sends no SNI and must be named by the
/// certificate), within `timeout`.
pub async fn tls_handshake(
    tcp: TcpStream,
    host: &str,
    config: &Arc<ClientConfig>,
    timeout: Duration,
) -> Result<Stream, LinkError> {
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| LinkError::ServerName(host.to_owned()))?;
    let tls = tokio::time::timeout(
        timeout,
        tokio_rustls::TlsConnector::from(config.clone()).connect(name, tcp),
    )
    .await
    .map_err(|_| LinkError::TlsTimeout(timeout))?
    .map_err(|error| {
        let hint = match error
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
        {
            Some(rustls::Error::InvalidCertificate(_)) => {
                "the certificate the server presented is not signed by a trusted CA, or does \
                 not name the URL's host: check the CA file given"
            }
            _ => "is it a TLS port, with TLS 1.2 or 1.3?",
        };
        LinkError::Tls { error, hint }
    })?;
    Ok(Stream::Tls(Box::new(tls)))
}

/// Writes all of `bytes` and flushes (TLS keeps records in rustls until
/// flushed; plain TCP's flush does nothing).
pub async fn write_all<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}
