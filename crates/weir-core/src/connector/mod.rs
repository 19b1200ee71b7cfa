//! Upstream connections: connecting with a timeout, TLS to upstreams (`tls`), the
//! connection type (plain or TLS, `stream`), and the per-worker keep-alive pool.

pub mod h2;
mod pool;
mod stream;
pub mod tls;

pub use self::h2::H2Pool;
pub(crate) use pool::AddrHasher;
pub use pool::{IdlePool, PoolKey};
pub use stream::{ReadHalf, UpstreamStream, WriteHalf};
pub use tls::TlsUpstream;

use weir_config::{Upstream, UpstreamServer};

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::error::ProxyError;

/// Opens a new upstream connection with TCP_NODELAY (heads are written whole, so Nagle
/// would only add latency).
pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, ProxyError> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(connect_error(&e)),
        Err(_) => return Err(ProxyError::UpstreamConnectTimeout),
    };
    stream.set_nodelay(true).map_err(|e| connect_error(&e))?;
    Ok(stream)
}

/// A failed connect as the server's failure, unless Weir itself ran out of what a
/// connection needs (the server was never asked).
fn connect_error(e: &std::io::Error) -> ProxyError {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => {
            ProxyError::LocalResources("proxy out of file descriptors")
        }
        Some(libc::EADDRNOTAVAIL) => ProxyError::LocalResources("proxy out of local ports"),
        Some(libc::ENOBUFS | libc::ENOMEM) => ProxyError::LocalResources("proxy out of memory"),
        _ => ProxyError::UpstreamConnect(e.kind()),
    }
}

/// A new connection to `server` of `upstream`: TCP, then TLS when the upstream has `tls`,
/// both within `connect_timeout`.
pub async fn connect_server(
    upstream: &Upstream,
    server: &UpstreamServer,
    tls: Option<&TlsUpstream>,
) -> Result<UpstreamStream, ProxyError> {
    let Some(tls) = tls else {
        return connect(server.addr, upstream.connect_timeout)
            .await
            .map(UpstreamStream::Plain);
    };
    let deadline = tokio::time::Instant::now() + upstream.connect_timeout;
    let tcp = connect(server.addr, upstream.connect_timeout).await?;
    handshake(upstream, server, tls, tcp, deadline).await
}

/// The TLS handshake on a connection to `server`, by `deadline`; a failure is logged once
/// (upstream, server, name verified, reason).
pub async fn handshake(
    upstream: &Upstream,
    server: &UpstreamServer,
    tls: &TlsUpstream,
    tcp: TcpStream,
    deadline: tokio::time::Instant,
) -> Result<UpstreamStream, ProxyError> {
    tls.handshake(server, tcp, deadline)
        .await
        .map_err(|e| handshake_failed(upstream, server, tls, e))
}

/// The error for a failed handshake, logged once (upstream, server, name, reason).
pub(crate) fn handshake_failed(
    upstream: &Upstream,
    server: &UpstreamServer,
    tls: &TlsUpstream,
    e: tls::HandshakeError,
) -> ProxyError {
    if let tls::HandshakeError::Failed(reason) = e {
        tracing::warn!(
            upstream = %upstream.name,
            server = %server.name,
            server_name = %tls.server_name_shown(server),
            "upstream TLS handshake failed: {reason}"
        );
    }
    ProxyError::from(e)
}
