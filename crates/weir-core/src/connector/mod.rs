//! Upstream connections: connecting with a timeout, and the per-worker keep-alive pool.

mod pool;

pub use pool::IdlePool;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::error::ProxyError;

/// Opens a new upstream connection with TCP_NODELAY (heads are written whole, so Nagle
/// would only add latency).
pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, ProxyError> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(ProxyError::UpstreamConnect(e.kind())),
        Err(_) => return Err(ProxyError::UpstreamConnectTimeout),
    };
    stream
        .set_nodelay(true)
        .map_err(|e| ProxyError::UpstreamConnect(e.kind()))?;
    Ok(stream)
}
