//! Binding listening sockets. Every worker gets its own socket on the same address
//! (SO_REUSEPORT), so the kernel spreads connections across workers without a shared
//! accept queue or lock.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use socket2::{Domain, Protocol, Socket, Type};

/// How long the kernel holds a connection that has sent nothing before handing it over
/// anyway (HAProxy's `defer-accept` uses the same second). It then gets `header_timeout`.
const DEFER_ACCEPT_SECONDS: u32 = 1;

/// Binds a non-blocking listening socket with SO_REUSEADDR and SO_REUSEPORT, and
/// TCP_DEFER_ACCEPT when `defer_accept`.
///
/// TCP_NODELAY is set on the listening socket: Linux copies it into every accepted socket,
/// which saves a `setsockopt` per connection (one of nine syscalls for a short connection).
pub fn bind_reuseport(
    addr: SocketAddr,
    backlog: u32,
    defer_accept: bool,
) -> io::Result<std::net::TcpListener> {
    let socket = bind_unlistened(addr, defer_accept)?;
    listen(&socket, backlog)?;
    Ok(socket)
}

/// [`bind_reuseport`] without the `listen`: the kernel queues no connection on the socket
/// yet. A reload binds every new socket this way and listens only once all are bound, so
/// that a bind failure closes no socket a connection was queued on (a reset).
pub fn bind_unlistened(addr: SocketAddr, defer_accept: bool) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.set_nodelay(true)?;
    socket.bind(&addr.into())?;
    if defer_accept {
        crate::sys::set_defer_accept(socket.as_fd(), DEFER_ACCEPT_SECONDS)?;
    }
    Ok(socket.into())
}

/// Starts (or, on a socket that listens already, resizes) the accept queue of `socket`:
/// on Linux a second `listen` changes the backlog in place, keeping the queued connections.
pub fn listen(socket: &std::net::TcpListener, backlog: u32) -> io::Result<()> {
    let socket = socket2::SockRef::from(socket);
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))
}

/// Sets or clears TCP_DEFER_ACCEPT on a socket bound earlier (one handed over by the
/// process being upgraded carries the old process's setting).
pub fn set_defer_accept(socket: &std::net::TcpListener, on: bool) -> io::Result<()> {
    let seconds = if on { DEFER_ACCEPT_SECONDS } else { 0 };
    crate::sys::set_defer_accept(socket.as_fd(), seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_can_share_a_port() {
        let first = bind_reuseport("127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
        let addr = first.local_addr().unwrap();
        let second = bind_reuseport(addr, 16, false).unwrap();
        assert_eq!(second.local_addr().unwrap(), addr);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn defer_accept_is_set_only_when_asked() {
        let any = || "127.0.0.1:0".parse().unwrap();
        let deferred = bind_reuseport(any(), 16, true).unwrap();
        let plain = bind_reuseport(any(), 16, false).unwrap();
        assert!(crate::sys::defer_accept(deferred.as_fd()).unwrap() > 0);
        assert_eq!(crate::sys::defer_accept(plain.as_fd()).unwrap(), 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn defer_accept_can_be_changed_on_a_bound_socket() {
        let socket = bind_reuseport("127.0.0.1:0".parse().unwrap(), 16, true).unwrap();
        set_defer_accept(&socket, false).unwrap();
        assert_eq!(crate::sys::defer_accept(socket.as_fd()).unwrap(), 0);
        set_defer_accept(&socket, true).unwrap();
        assert!(crate::sys::defer_accept(socket.as_fd()).unwrap() > 0);
    }

    #[test]
    fn a_second_listen_keeps_the_queued_connections() {
        let listener = bind_reuseport("127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        listen(&listener, 64).unwrap();
        listener.set_nonblocking(false).unwrap();
        assert!(listener.accept().is_ok());
    }

    #[test]
    fn accepted_sockets_inherit_nodelay() {
        let listener = bind_reuseport("127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
        listener.set_nonblocking(false).unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(accepted.nodelay().unwrap());
    }
}
