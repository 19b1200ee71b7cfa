//! HTTP/1.1 client connections of the load generators ([`crate::loadgen`] and
//! [`crate::instructions`]): how a connection is opened ([`Dial`]: plain TCP or a TLS 1.3
//! session), the request they send and one Content-Length framed exchange.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// A GET as wrk sends it: the request line and `Host`.
pub fn request(path: &str, host: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes()
}

/// How a connection is opened: plain TCP ([`Plain`]) or TLS over it ([`Tls`]).
pub trait Dial: Clone + Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn dial(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

#[derive(Clone)]
pub struct Plain(pub SocketAddr);

impl Dial for Plain {
    type Stream = TcpStream;
    async fn dial(&self) -> io::Result<TcpStream> {
        connect(self.0).await
    }
}

/// A TLS 1.3 session per connection offering what `profile` says (wrk's is
/// [`Profile::Openssl`](crate::handshakes::Profile)), ALPN `http/1.1`, no resumption.
#[derive(Clone)]
pub struct Tls {
    addr: SocketAddr,
    pub connector: TlsConnector,
    name: ServerName<'static>,
}

impl Tls {
    pub fn new(addr: SocketAddr, sni: &str, profile: crate::handshakes::Profile) -> Result<Tls> {
        let mut config = crate::handshakes::client_config(13, false, profile)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            addr,
            connector: TlsConnector::from(Arc::new(config)),
            name: ServerName::try_from(sni.to_string()).context("--sni")?,
        })
    }
}

impl Dial for Tls {
    type Stream = TlsStream<TcpStream>;
    async fn dial(&self) -> io::Result<TlsStream<TcpStream>> {
        let tcp = connect(self.addr).await?;
        self.connector.connect(self.name.clone(), tcp).await
    }
}

pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Sends one request and reads one Content-Length framed response. Returns the status and
/// whether the connection may be reused.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    req: &[u8],
    buf: &mut Vec<u8>,
) -> io::Result<(u16, bool)> {
    s.write_all(req).await?;
    // A no-op for TCP; tokio-rustls has already sent the record in `write_all`.
    s.flush().await?;
    buf.clear();
    loop {
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        match parse_head(buf)? {
            None => continue,
            Some(head) => {
                while buf.len() < head.len + head.body {
                    let n = s.read(&mut chunk).await?;
                    if n == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                return Ok((head.status, head.keep_alive));
            }
        }
    }
}

/// A parsed response head: its length, the body length and the status.
#[derive(Debug, PartialEq)]
struct Head {
    len: usize,
    body: usize,
    status: u16,
    keep_alive: bool,
}

/// `None` while the head is incomplete; an error for a response this generator cannot frame
/// (chunked or close-delimited bodies).
fn parse_head(buf: &[u8]) -> io::Result<Option<Head>> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let len = match resp.parse(buf).map_err(|e| bad(&e.to_string()))? {
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete(n) => n,
    };
    let status = resp.code.unwrap_or(0);
    let mut body = None;
    let mut keep_alive = resp.version == Some(1);
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value).map_err(|_| bad("content-length"))?;
            body = Some(v.trim().parse().map_err(|_| bad("content-length"))?);
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            keep_alive = v.contains("keep-alive") || (keep_alive && !v.contains("close"));
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(bad("chunked responses are not supported by the generator"));
        }
    }
    let body = match (body, status) {
        (Some(b), _) => b,
        (None, 100..=199 | 204 | 304) => 0,
        (None, _) => return Err(bad("response without Content-Length")),
    };
    Ok(Some(Head {
        len,
        body,
        status,
        keep_alive,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_response_heads() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        let h = parse_head(r).unwrap().unwrap();
        assert_eq!((h.len, h.body, h.status, h.keep_alive), (38, 5, 200, true));
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
        let close = b"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        let h = parse_head(close).unwrap().unwrap();
        assert_eq!((h.status, h.keep_alive), (404, false));
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        let h = parse_head(b"HTTP/1.0 204 No Content\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.body, h.keep_alive), (0, false));
    }
}
