//! Buffered connection I/O and HTTP/1.1 body framing shared by the test
//! backends and the test client (crate-internal).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

use crate::chunked::ChunkedDecoder;

/// How much is read from the socket at a time.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

/// Largest request head a backend accepts before dropping the connection.
pub(crate) const MAX_REQUEST_HEAD: usize = 64 * 1024;

/// Largest response head the client accepts.
pub(crate) const MAX_RESPONSE_HEAD: usize = 1024 * 1024;

/// Maximum number of header fields parsed in one head.
pub(crate) const MAX_HEADERS: usize = 128;

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes (never zero; zero is [`Framing::Empty`]).
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Everything until the peer closes (responses only).
    UntilClose,
}

/// A plain TCP connection or TLS over one (either side), so that backends and clients
/// speak HTTP the same way over both.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    /// The TCP connection underneath.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection with a read buffer holding bytes received but not yet consumed.
pub(crate) struct Conn {
    pub(crate) stream: Stream,
    pub(crate) buf: Vec<u8>,
}

impl Conn {
    pub(crate) fn new(stream: TcpStream) -> Conn {
        let _ = stream.set_nodelay(true);
        Conn::over(Stream::Plain(stream))
    }

    pub(crate) fn over(stream: Stream) -> Conn {
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Reads once from the socket, appending to the buffer. `Ok(0)` is EOF.
    /// Cancel-safe: if the future is dropped, no bytes are lost or invented.
    pub(crate) async fn fill(&mut self) -> io::Result<usize> {
        self.buf.reserve(READ_CHUNK);
        self.stream.read_buf(&mut self.buf).await
    }

    /// Writes all of `data` and flushes it: over TLS, `write_all` alone may leave the tail
    /// in rustls when the socket was full, and nothing else would send it.
    pub(crate) async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.stream.write_all(data).await?;
        self.stream.flush().await
    }

    /// Reads a body framed by `framing`, streaming the decoded data to
    /// `on_data`, and returns the trailer fields (chunked bodies only). Bytes
    /// after the body stay in the buffer.
    pub(crate) async fn read_body(
        &mut self,
        framing: Framing,
        mut on_data: impl FnMut(&[u8]),
    ) -> io::Result<Vec<(String, String)>> {
        match framing {
            Framing::Empty => Ok(Vec::new()),
            Framing::Length(mut left) => loop {
                let take = left.min(self.buf.len() as u64) as usize;
                if take > 0 {
                    on_data(&self.buf[..take]);
                    self.buf.drain(..take);
                    left -= take as u64;
                }
                if left == 0 {
                    return Ok(Vec::new());
                }
                if self.fill().await? == 0 {
                    return Err(eof("connection closed inside a Content-Length body"));
                }
            },
            Framing::Chunked => {
                let mut dec = ChunkedDecoder::new();
                loop {
                    let used = dec.decode(&self.buf, &mut on_data)?;
                    self.buf.drain(..used);
                    if dec.is_done() {
                        return Ok(dec.into_trailers());
                    }
                    if self.fill().await? == 0 {
                        return Err(eof("connection closed inside a chunked body"));
                    }
                }
            }
            Framing::UntilClose => loop {
                if !self.buf.is_empty() {
                    on_data(&self.buf);
                    self.buf.clear();
                }
                if self.fill().await? == 0 {
                    return Ok(Vec::new());
                }
            },
        }
    }
}

/// Determines body framing from header fields (RFC 9112 §6.3): a
/// Transfer-Encoding whose last coding is `chunked` wins; any other
/// Transfer-Encoding is an error for a request and read-until-close for a
/// response; then Content-Length (all values must agree); otherwise no body
/// for a request and read-until-close for a response.
pub(crate) fn body_framing(headers: &[(String, String)], is_request: bool) -> io::Result<Framing> {
    let mut te_seen = false;
    let mut last_coding = None;
    for (_, value) in headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))
    {
        te_seen = true;
        for coding in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            last_coding = Some(coding);
        }
    }
    if te_seen {
        return match last_coding {
            Some(c) if c.eq_ignore_ascii_case("chunked") => Ok(Framing::Chunked),
            _ if is_request => Err(invalid("request Transfer-Encoding is not chunked")),
            _ => Ok(Framing::UntilClose),
        };
    }
    let mut len: Option<u64> = None;
    for (_, value) in headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
    {
        for part in value.split(',').map(str::trim) {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid("invalid Content-Length"));
            }
            let n: u64 = part
                .parse()
                .map_err(|_| invalid("Content-Length too large"))?;
            if len.is_some_and(|l| l != n) {
                return Err(invalid("conflicting Content-Length values"));
            }
            len = Some(n);
        }
    }
    Ok(match len {
        Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
        None if is_request => Framing::Empty,
        None => Framing::UntilClose,
    })
}

/// First value of header `name` (case-insensitive).
pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// True if any `name` field lists `token` (comma-separated, case-insensitive).
pub(crate) fn has_token(headers: &[(String, String)], name: &str, token: &str) -> bool {
    headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .flat_map(|(_, v)| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Converts httparse header fields into owned (name, lossy UTF-8 value) pairs.
pub(crate) fn owned_headers(headers: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect()
}

pub(crate) fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

pub(crate) fn eof(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn framing_rules() {
        assert_eq!(body_framing(&h(&[]), true).unwrap(), Framing::Empty);
        assert_eq!(body_framing(&h(&[]), false).unwrap(), Framing::UntilClose);
        assert_eq!(
            body_framing(&h(&[("content-length", "12")]), true).unwrap(),
            Framing::Length(12)
        );
        assert_eq!(
            body_framing(&h(&[("Content-Length", "0")]), false).unwrap(),
            Framing::Empty
        );
        assert_eq!(
            body_framing(&h(&[("Content-Length", "5, 5")]), true).unwrap(),
            Framing::Length(5)
        );
        assert!(body_framing(
            &h(&[("Content-Length", "5"), ("content-length", "6")]),
            true
        )
        .is_err());
        assert!(body_framing(&h(&[("Content-Length", "+5")]), true).is_err());
        assert_eq!(
            body_framing(
                &h(&[
                    ("Transfer-Encoding", "gzip, Chunked"),
                    ("Content-Length", "3")
                ]),
                true
            )
            .unwrap(),
            Framing::Chunked
        );
        assert!(body_framing(&h(&[("Transfer-Encoding", "gzip")]), true).is_err());
        assert_eq!(
            body_framing(&h(&[("Transfer-Encoding", "gzip")]), false).unwrap(),
            Framing::UntilClose
        );
        assert!(has_token(
            &h(&[("Connection", "Upgrade, Close")]),
            "connection",
            "close"
        ));
        assert!(!has_token(
            &h(&[("Connection", "closed")]),
            "connection",
            "close"
        ));
    }
}
