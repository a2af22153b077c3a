//! The listen sockets: one `SO_REUSEPORT` group per listen address. The
//! supervisor binds a member that never listens, to hold the port (and to
//! turn port 0 into a real one) while workers start and restart; each
//! worker binds and listens on its own member, and the kernel spreads new
//! connections over the workers.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

/// A socket bound to `addr` in its `SO_REUSEPORT` group, not listening.
pub(crate) fn member(addr: SocketAddr) -> io::Result<Socket> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    Ok(s)
}

/// A non-blocking listener in `addr`'s group.
pub(crate) fn listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let s = member(addr)?;
    s.set_nonblocking(true)?;
    // The kernel caps this at net.core.somaxconn.
    s.listen(65_535)?;
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_share_a_port_and_only_listeners_take_connections() {
        let held = member("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = held.local_addr().unwrap().as_socket().unwrap();
        assert_ne!(addr.port(), 0, "port 0 became a real port");
        let l = listener(addr).unwrap();
        let c = std::net::TcpStream::connect(addr).unwrap();
        l.set_nonblocking(false).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
        // Without SO_REUSEPORT the port is taken.
        let plain = std::net::TcpListener::bind(addr);
        assert!(plain.is_err());
    }
}
