//! Binding listening sockets. Every worker gets its own socket on the same address
//! (SO_REUSEPORT), so the kernel spreads connections across workers without a shared
//! accept queue or lock.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

/// Binds a non-blocking listening socket with SO_REUSEADDR and SO_REUSEPORT.
///
/// TCP_NODELAY is set on the listening socket: Linux copies it into every accepted socket,
/// which saves a `setsockopt` per connection (one of nine syscalls for a short connection).
pub fn bind_reuseport(addr: SocketAddr, backlog: u32) -> io::Result<std::net::TcpListener> {
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
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_can_share_a_port() {
        let first = bind_reuseport("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let addr = first.local_addr().unwrap();
        let second = bind_reuseport(addr, 16).unwrap();
        assert_eq!(second.local_addr().unwrap(), addr);
    }

    #[test]
    fn accepted_sockets_inherit_nodelay() {
        let listener = bind_reuseport("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        listener.set_nonblocking(false).unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(accepted.nodelay().unwrap());
    }
}
