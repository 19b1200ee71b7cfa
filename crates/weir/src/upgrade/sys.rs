//! Passing file descriptors over a unix socket (`SCM_RIGHTS`) and `kill(2)`: the only
//! `unsafe` in the binary, kept to these three calls. std's ancillary-data API is still unstable.
//!
//! Safety: the `msghdr` points at buffers that outlive the call; the control buffer is
//! `u64`-aligned and sized with `CMSG_SPACE`; received descriptors are taken into
//! `OwnedFd` exactly once each, and only those the kernel reported.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The kernel's limit on descriptors in one message (`SCM_MAX_FD`).
pub const MAX_FDS: usize = 253;

/// Sends `data` with `fds` attached, in one message.
pub fn send_with_fds(stream: &UnixStream, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS || data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors or no data",
        ));
    }
    let fd_bytes = std::mem::size_of_val(fds);
    let mut control = vec![0u64; cmsg_space(fd_bytes).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: see the module doc; every pointer is into a live local buffer.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_space(fd_bytes) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr(),
            libc::CMSG_DATA(cmsg).cast::<RawFd>(),
            fds.len(),
        );
        let sent = libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        if (sent as usize) < data.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "message cut short",
            ));
        }
    }
    Ok(())
}

/// Receives one message into `buf`; returns its length and the descriptors it carried.
pub fn recv_with_fds(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let fd_bytes = MAX_FDS * std::mem::size_of::<RawFd>();
    let mut control = vec![0u64; cmsg_space(fd_bytes).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut fds = Vec::new();
    // SAFETY: see the module doc.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = (control.len() * 8) as _;
        let n = libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let len = ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "descriptors were cut off",
            ));
        }
        Ok((n as usize, fds))
    }
}

/// Sends `signal` to process `pid` (`weir upgrade` sends SIGUSR2).
pub fn kill(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) takes plain integers.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cmsg_space(bytes: usize) -> usize {
    // SAFETY: a pure size computation.
    unsafe { libc::CMSG_SPACE(bytes as u32) as usize }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn descriptors_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut p, q) = UnixStream::pair().unwrap();
        send_with_fds(&a, b"hello", &[q.as_raw_fd()]).unwrap();
        drop(q);
        let mut buf = [0u8; 64];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        let mut q = UnixStream::from(fds.into_iter().next().unwrap());
        q.write_all(b"x").unwrap();
        let mut got = [0u8; 1];
        p.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");
    }
}
