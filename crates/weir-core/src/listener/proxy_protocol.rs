//! Accepting the PROXY protocol on a client connection (TCP and HTTP listeners with
//! `proxy_protocol.accept = true`): the source must be in `trusted`, and the connection must
//! start with a valid v1 or v2 header, read within the timeout. Anything else closes the
//! connection (counted in `weir_proxy_protocol_rejected`): a header from anywhere else could
//! forge any client address.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use weir_config::ProxyProtocol;

use crate::buffer::Buffer;
use crate::codec::proxy_protocol::{parse, Addresses, Parsed, ProxyHeaderError};
use crate::tcp::io::read_some;
use crate::worker::Worker;

/// Why a connection was closed before its first byte was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("PROXY header from an untrusted source")]
    Untrusted,
    #[error("{0}")]
    Header(#[from] ProxyHeaderError),
    #[error("PROXY header longer than the connection's buffer")]
    TooLong,
    #[error("no complete PROXY header in time")]
    Timeout,
    #[error("connection closed before a complete PROXY header")]
    Closed,
}

/// Reads and consumes the PROXY header at the start of `stream` into `buf` (bytes after it
/// stay in `buf`). `Ok(None)`: a valid header that carries no addresses (LOCAL, UNKNOWN).
pub async fn read_header(
    stream: &TcpStream,
    peer: SocketAddr,
    settings: &ProxyProtocol,
    buf: &mut Buffer,
    timeout: Duration,
) -> Result<Option<Addresses>, Rejected> {
    if !settings.trusted.iter().any(|c| c.contains(peer.ip())) {
        return Err(Rejected::Untrusted);
    }
    let deadline = Instant::now() + timeout;
    loop {
        match parse(buf.filled())? {
            Parsed::Header { len, addresses } => {
                buf.consume(len);
                return Ok(addresses);
            }
            Parsed::Incomplete if buf.spare_mut().is_empty() => return Err(Rejected::TooLong),
            Parsed::Incomplete => {}
        }
        match timeout_at(deadline, read_some(stream, buf)).await {
            Err(_) => return Err(Rejected::Timeout),
            Ok(Ok(0) | Err(_)) => return Err(Rejected::Closed),
            Ok(Ok(_)) => {}
        }
    }
}

/// The PROXY header step of a new connection (`stream`, from `peer`) of listener `at`: nothing unless the
/// listener accepts PROXY headers; else the header's addresses (`None` if it carried none)
/// or, when the connection must close, why (already counted and logged).
pub async fn accept_step(
    worker: &Worker,
    at: crate::listener::Slot<'_>,
    stream: &TcpStream,
    peer: SocketAddr,
    buf: &mut Buffer,
    timeout: Duration,
) -> Result<Option<Addresses>, Rejected> {
    let crate::listener::Slot { slot, listener } = at;
    if !listener.proxy_protocol.accept {
        return Ok(None);
    }
    let read = read_header(stream, peer, &listener.proxy_protocol, buf, timeout).await;
    if let Err(why) = read {
        record_rejection(worker, slot, peer, why);
    }
    read
}

/// Counts and logs a rejected connection (at debug level: clients can cause it at will).
fn record_rejection(worker: &Worker, slot: usize, peer: SocketAddr, why: Rejected) {
    if let Some(m) = worker.metrics.listener(slot) {
        m.proxy_rejected.inc();
    }
    tracing::debug!(%peer, reason = %why, "closing connection: PROXY protocol");
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn trusting(range: &str) -> ProxyProtocol {
        let (ip, prefix) = range.split_once('/').unwrap();
        ProxyProtocol {
            accept: true,
            trusted: vec![weir_config::Cidr {
                addr: ip.parse().unwrap(),
                prefix: prefix.parse().unwrap(),
            }],
            send: weir_config::ProxyVersion::Off,
        }
    }

    async fn pair() -> (TcpStream, TcpStream, SocketAddr) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, peer) = l.accept().await.unwrap();
        (c, s, peer)
    }

    #[tokio::test]
    async fn reads_a_header_sent_byte_by_byte_and_keeps_the_rest() {
        let (mut c, s, peer) = pair().await;
        let sent = b"PROXY TCP4 10.1.2.3 10.0.0.1 4000 80\r\nhello";
        let writer = tokio::spawn(async move {
            for b in sent {
                c.write_all(&[*b]).await.unwrap();
                tokio::task::yield_now().await;
            }
            c
        });
        let mut buf = Buffer::new(1024);
        let got = read_header(
            &s,
            peer,
            &trusting("127.0.0.0/8"),
            &mut buf,
            Duration::from_secs(10),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(got.source, "10.1.2.3:4000".parse().unwrap());
        let _c = writer.await.unwrap();
        while buf.len() < 5 {
            read_some(&s, &mut buf).await.unwrap();
        }
        assert_eq!(buf.filled(), b"hello");
    }

    #[tokio::test]
    async fn rejects_untrusted_and_malformed() {
        let (mut c, s, peer) = pair().await;
        let mut buf = Buffer::new(1024);
        let (other, local) = (trusting("10.0.0.0/8"), trusting("127.0.0.0/8"));
        let wait = Duration::from_secs(10);
        let r = read_header(&s, peer, &other, &mut buf, wait).await;
        assert_eq!(r, Err(Rejected::Untrusted));
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let r = read_header(&s, peer, &local, &mut buf, wait).await;
        assert_eq!(r, Err(Rejected::Header(ProxyHeaderError::Missing)));
    }
}
