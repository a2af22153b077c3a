//! Passing open sockets between processes over a Unix socket
//! (`SCM_RIGHTS`): how a `throng serve --takeover` receives the running
//! server's sockets, so the ports stay held across the handover.

use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The most descriptors one message carries (the kernel's own limit is
/// 253, `SCM_MAX_FD`).
pub const MAX_FDS: usize = 250;

/// Sends `data` (not empty) with duplicates of `fds` attached.
pub fn send(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if data.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let bytes = size_of_val(raw.as_slice());
    let room = space(bytes);
    let mut control = vec![0u8; room];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid value of it.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = room as _;
        // SAFETY: msg_control points at `room` bytes, enough for one header
        // with `bytes` of data (CMSG_SPACE), so CMSG_FIRSTHDR is not null
        // and CMSG_DATA has `bytes` bytes behind it; the fds are open (borrowed).
        unsafe {
            let h = libc::CMSG_FIRSTHDR(&msg);
            (*h).cmsg_level = libc::SOL_SOCKET;
            (*h).cmsg_type = libc::SCM_RIGHTS;
            (*h).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
            std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(h), bytes);
        }
    }
    // SAFETY: msg points at live buffers (iov, control) for the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(io::Error::from(io::ErrorKind::WriteZero));
    }
    Ok(())
}

/// Receives one message into `buf`: its length and the descriptors that
/// came with it (owned, close-on-exec).
pub fn recv(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let room = space(MAX_FDS * size_of::<RawFd>());
    let mut control = vec![0u8; room];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid value of it.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = room as _;
    // SAFETY: msg points at live buffers (buf, control) for the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control with msg_controllen bytes of
    // well-formed headers; CMSG_FIRSTHDR/NXTHDR stay inside them and return
    // null at the end; an SCM_RIGHTS header's data is an array of fds now
    // owned by this process (read unaligned: CMSG_DATA need not be aligned).
    unsafe {
        let mut h = libc::CMSG_FIRSTHDR(&msg);
        while !h.is_null() {
            if (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(h);
                let len = (*h).cmsg_len as usize - (data as usize - h as usize);
                for k in 0..len / size_of::<RawFd>() {
                    let fd = data.cast::<RawFd>().add(k).read_unaligned();
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            h = libc::CMSG_NXTHDR(&msg, h);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("too many descriptors in one message"));
    }
    Ok((n as usize, fds))
}

/// CMSG_SPACE for `bytes` of descriptor data.
fn space(bytes: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    unsafe { libc::CMSG_SPACE(bytes as u32) as usize }
}

/// The process at the other end of a Unix socket, as the kernel saw it
/// (`SO_PEERCRED`: for a connected client, the listener's creator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
}

/// Who is at the other end of `sock`.
pub fn peer(sock: &impl std::os::fd::AsRawFd) -> io::Result<Peer> {
    // SAFETY: ucred is plain data; all-zero is a valid value of it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred is a live ucred and len its size, as SO_PEERCRED expects.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Peer {
        pid: cred.pid,
        uid: cred.uid,
    })
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::os::fd::AsFd as _;

    #[test]
    fn a_socket_sent_arrives_as_a_working_descriptor() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut x, y) = UnixStream::pair().unwrap();
        send(&a, b"one", &[y.as_fd()]).unwrap();
        drop(y);
        let mut buf = [0u8; 16];
        let (n, fds) = recv(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"one");
        assert_eq!(fds.len(), 1);
        let mut y = UnixStream::from(fds.into_iter().next().unwrap());
        x.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        y.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        // A message without descriptors.
        send(&a, b"none", &[]).unwrap();
        let (n, fds) = recv(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"none"[..], 0));
    }

    #[test]
    fn the_peer_of_a_pair_is_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let p = peer(&a).unwrap();
        assert_eq!(p.pid, std::process::id() as i32);
        assert_eq!(p.uid, euid());
    }
}
