//! Socket options the standard library and `socket2` do not set.

use std::io;
use std::os::fd::{AsFd, AsRawFd as _};

/// `IP_BIND_ADDRESS_NO_PORT` on an IPv4 socket about to `bind` to a source
/// address with port 0: the port is then chosen at `connect`, per
/// destination, so one source address can open far more than the ~28,000
/// connections of `ip_local_port_range` to different destinations.
pub fn bind_address_no_port(socket: &impl AsFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: the fd is open for the call (borrowed); the option value is a
    // c_int that outlives the call, and its size is passed exactly.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn option(socket: &impl AsFd) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads the option into a c_int of the size given.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_fd().as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&raw mut value).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        value
    }

    #[test]
    fn sets_the_option_and_refuses_what_is_not_a_socket() {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        assert_eq!(option(&s), 0);
        bind_address_no_port(&s).unwrap();
        assert_eq!(option(&s), 1);
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(bind_address_no_port(&file).is_err());
    }
}
