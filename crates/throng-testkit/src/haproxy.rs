//! A real HAProxy (Debian's) on a free loopback port, in TCP mode: in front
//! of several `throng serve` nodes as docs/deploy.md sets it up, or
//! terminating TLS in front of one plain server; or in HTTP mode, limiting
//! the requests a back end gets at once (a target with a hard capacity); or
//! as an HTTP/2 front end (h2c, or ALPN h2 over TLS).

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};

use crate::peers::{Peer, expect};
use crate::process::command;
use crate::{TempDir, free_port, wait_until};

/// A running HAProxy, killed on drop.
#[derive(Debug)]
pub struct Haproxy {
    child: Child,
    /// Where it listens on 127.0.0.1.
    pub addr: SocketAddr,
    /// Holds its configuration file.
    _dir: TempDir,
}

impl Haproxy {
    /// Round robin over `backends`, with the health check and timeouts
    /// docs/deploy.md recommends.
    pub fn balance(backends: &[SocketAddr]) -> Self {
        Self::launch(|port| {
            let mut cfg = format!(
                "global\n  maxconn 2000\n\
                 defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  \
                 timeout server 1h\n  timeout tunnel 1h\n  timeout client-fin 30s\n\
                 frontend ws\n  bind 127.0.0.1:{port}\n  default_backend nodes\n\
                 backend nodes\n  balance roundrobin\n  option httpchk\n  \
                 http-check send meth GET uri /healthz\n  http-check expect status 200\n"
            );
            for (i, b) in backends.iter().enumerate() {
                cfg.push_str(&format!("  server node{i} {b} check inter 1s\n"));
            }
            cfg
        })
    }

    /// TCP mode in front of one `backend`, telling it each client's address
    /// in a PROXY protocol header: `send` is the server option,
    /// `send-proxy` (v1) or `send-proxy-v2`.
    pub fn proxy_protocol(backend: SocketAddr, send: &str) -> Self {
        Self::launch(|port| {
            format!(
                "global\n  maxconn 2000\n\
                 defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  \
                 timeout server 1h\n  timeout tunnel 1h\n\
                 frontend ws\n  bind 127.0.0.1:{port}\n  default_backend node\n\
                 backend node\n  server node0 {backend} {send}\n"
            )
        })
    }

    /// HTTP mode in front of one `backend` with `option forwardfor`: each
    /// request (a WebSocket upgrade too) carries the client's address in
    /// `X-Forwarded-For`.
    pub fn forwardfor(backend: SocketAddr) -> Self {
        Self::launch(|port| {
            format!(
                "global\n  maxconn 2000\n\
                 defaults\n  mode http\n  option forwardfor\n  timeout connect 5s\n  \
                 timeout client 1h\n  timeout server 1h\n  timeout tunnel 1h\n\
                 frontend web\n  bind 127.0.0.1:{port}\n  default_backend node\n\
                 backend node\n  server node0 {backend}\n"
            )
        })
    }

    /// Terminates TLS with `cert_and_key` (a PEM certificate chain followed
    /// by its key) on 127.0.0.1 and 127.0.0.2 at the same port, and forwards
    /// the plain bytes to `backend`. `bind_options` go on both `bind` lines
    /// (`ssl-max-ver TLSv1.2`, `ciphersuites ...`).
    pub fn tls(backend: SocketAddr, cert_and_key: &str, bind_options: &str) -> Self {
        Self::launch(|port| {
            let bind = format!("ssl crt {cert_and_key} {bind_options}");
            format!(
                "global\n  maxconn 3000\n\
                 defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  \
                 timeout server 30s\n\
                 frontend tls\n  bind 127.0.0.1:{port} {bind}\n  bind 127.0.0.2:{port} {bind}\n  \
                 default_backend app\n\
                 backend app\n  server s1 {backend}\n"
            )
        })
    }

    /// HTTP in front of `backend` with at most `maxconn` requests at the
    /// back end at once; the rest wait in HAProxy's queue. With a back end
    /// that takes a set time per request, a target with a hard capacity:
    /// `maxconn` / the mean service time, less the overheads.
    pub fn limited(backend: SocketAddr, maxconn: u32) -> Self {
        Self::launch(|port| {
            format!(
                "global\n  maxconn 4000\n\
                 defaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  \
                 timeout server 60s\n  timeout queue 60s\n\
                 frontend web\n  bind 127.0.0.1:{port}\n  default_backend app\n\
                 backend app\n  server s1 {backend} maxconn {maxconn}\n"
            )
        })
    }

    /// An HTTP/2 front end in front of one `backend` (HTTP/1.1): prior
    /// knowledge h2c on a plain bind (`tls: None`), or TLS with
    /// `cert_and_key` offering `alpn` (`h2`; `http/1.1` for a front end that
    /// does not speak HTTP/2 over TLS). `timeouts` replaces the defaults'
    /// timeout lines (e.g. a short `timeout client`, after which HAProxy
    /// sends GOAWAY on an idle connection and closes it).
    pub fn h2(backend: SocketAddr, tls: Option<(&str, &str)>, timeouts: Option<&str>) -> Self {
        let timeouts = timeouts.unwrap_or("timeout client 60s\n  timeout server 60s");
        Self::launch(|port| {
            let bind = match tls {
                None => "proto h2".to_owned(),
                Some((cert, alpn)) => format!("ssl crt {cert} alpn {alpn}"),
            };
            format!(
                "global\n  maxconn 4000\n\
                 defaults\n  mode http\n  timeout connect 5s\n  {timeouts}\n\
                 frontend web\n  bind 127.0.0.1:{port} {bind}\n  default_backend app\n\
                 backend app\n  server s1 {backend}\n"
            )
        })
    }

    /// Writes the configuration `config(port)` makes for a free port, checks
    /// it with `haproxy -c`, starts HAProxy and waits until it listens. The
    /// port is free on 127.0.0.1 when picked, but another program's outgoing
    /// connection may take it (on 127.0.0.1, or on 127.0.0.2 for
    /// [`Self::tls`]) before HAProxy binds it, on a machine where other
    /// loads run: HAProxy then exits, and another port is tried.
    fn launch(config: impl Fn(u16) -> String) -> Self {
        expect(Peer::Haproxy);
        for _ in 0..3 {
            if let Some(h) = Self::try_launch(&config) {
                return h;
            }
        }
        panic!("haproxy exited before listening on three free ports in turn");
    }

    /// One try of [`Self::launch`]: `None` when HAProxy exited before it
    /// listened.
    fn try_launch(config: &impl Fn(u16) -> String) -> Option<Self> {
        let port = free_port();
        let dir = TempDir::new("haproxy");
        let path = dir.file("haproxy.cfg");
        std::fs::write(&path, config(port)).expect("write haproxy.cfg");
        let check = command("haproxy")
            .args(["-c", "-q", "-f"])
            .arg(&path)
            .output()
            .expect("run haproxy -c");
        assert!(check.status.success(), "haproxy config: {check:?}");
        let child = command("haproxy")
            .args(["-db", "-f"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut h = Self {
            child,
            addr,
            _dir: dir,
        };
        let mut exited = false;
        wait_until("haproxy to listen", || {
            exited = matches!(h.child.try_wait(), Ok(Some(_)));
            exited || TcpStream::connect(addr).is_ok()
        });
        (!exited).then_some(h)
    }

    /// Its port (on 127.0.0.1, and 127.0.0.2 for [`Self::tls`]).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
