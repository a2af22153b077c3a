//! Connecting from a chosen source address: how `hold` and `attack` spread
//! their connections over many local addresses (`127.0.0.2`, ...), each
//! with a full range of local ports to every target.

use std::io;
use std::net::{IpAddr, SocketAddr};

use tokio::net::TcpSocket;

/// Binds a socket to each of `sources` (port 0, with no port held), as
/// every connection from it will: the first address that is not on this
/// host (`EADDRNOTAVAIL`) and the error. A dry run that does not try
/// would pass a plan whose every connection then fails.
pub fn check_bindable(sources: &[IpAddr]) -> Result<(), (IpAddr, io::Error)> {
    use socket2::{Domain, Socket, Type};
    for ip in sources {
        let domain = if ip.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let bound = Socket::new(domain, Type::STREAM.cloexec(), None).and_then(|s| {
            if ip.is_ipv4() {
                throng_host::socket::bind_address_no_port(&s)?;
            }
            s.bind(&SocketAddr::new(*ip, 0).into())
        });
        bound.map_err(|e| (*ip, e))?;
    }
    Ok(())
}

/// A non-blocking TCP socket to `dst`, bound to `source` (if any) with
/// `IP_BIND_ADDRESS_NO_PORT`, so the local port is chosen at connect time
/// per destination and one source address carries a full port range to
/// every target port; Nagle off.
pub fn socket(source: Option<IpAddr>, dst: SocketAddr) -> io::Result<TcpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if dst.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let socket = Socket::new(
        domain,
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    if let Some(src) = source {
        if src.is_ipv4() {
            throng_host::socket::bind_address_no_port(&socket)?;
        }
        socket.bind(&SocketAddr::new(src, 0).into())?;
    }
    socket.set_nodelay(true)?;
    Ok(TcpSocket::from_std_stream(socket.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn connects_from_the_source_asked_for() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dst = l.local_addr().unwrap();
        let src: IpAddr = "127.0.0.3".parse().unwrap();
        let s = socket(Some(src), dst).unwrap().connect(dst).await.unwrap();
        assert_eq!(s.local_addr().unwrap().ip(), src);
        let (_, peer) = l.accept().await.unwrap();
        assert_eq!(peer.ip(), src);
        let any = socket(None, dst).unwrap().connect(dst).await.unwrap();
        assert_eq!(any.local_addr().unwrap().ip().to_string(), "127.0.0.1");
    }

    #[test]
    fn only_addresses_of_this_host_bind() {
        let here: IpAddr = "127.0.0.3".parse().unwrap();
        assert!(check_bindable(&[here]).is_ok());
        // TEST-NET-1: on no host's interface.
        let elsewhere: IpAddr = "192.0.2.1".parse().unwrap();
        let (ip, e) = check_bindable(&[here, elsewhere]).unwrap_err();
        assert_eq!(ip, elsewhere);
        assert_eq!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL));
    }
}
