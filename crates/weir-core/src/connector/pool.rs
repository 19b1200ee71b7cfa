//! The per-worker pool of idle upstream connections, keyed by server address.
//!
//! Worker-local (no lock): each worker owns its pool. Connections are reused newest first
//! (warm, least likely to have been closed by the upstream's idle timer). A connection
//! is checked before reuse: one that the upstream closed, or sent unexpected bytes on, while
//! idle is dropped here instead of failing a request. The check costs no syscall when the
//! socket has had no readiness event since it was pooled.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

struct Idle {
    stream: TcpStream,
    since: Instant,
}

#[derive(Default)]
pub struct IdlePool {
    idle: HashMap<SocketAddr, Vec<Idle>>,
}

impl IdlePool {
    /// A live idle connection to `addr` that has been idle less than `max_idle_time`.
    pub fn take(&mut self, addr: SocketAddr, max_idle_time: Duration) -> Option<TcpStream> {
        let list = self.idle.get_mut(&addr)?;
        while let Some(idle) = list.pop() {
            if idle.since.elapsed() < max_idle_time && still_open(&idle.stream) {
                return Some(idle.stream);
            }
        }
        None
    }

    /// Returns a connection to the pool; beyond `max_idle` the oldest is closed.
    pub fn put(&mut self, addr: SocketAddr, stream: TcpStream, max_idle: usize) {
        if max_idle == 0 {
            return;
        }
        let list = self.idle.entry(addr).or_default();
        if list.len() >= max_idle {
            list.remove(0);
        }
        list.push(Idle {
            stream,
            since: Instant::now(),
        });
    }

    /// Idle connections held for `addr`.
    pub fn idle_count(&self, addr: SocketAddr) -> usize {
        self.idle.get(&addr).map_or(0, Vec::len)
    }

    /// Closes every idle connection (on drain).
    pub fn clear(&mut self) {
        self.idle.clear();
    }
}

/// An idle connection must have nothing to read: EOF means the upstream closed it, data
/// means it broke protocol. `try_read` only reaches the kernel if readiness was signalled.
fn still_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}
