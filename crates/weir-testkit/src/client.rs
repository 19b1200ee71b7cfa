//! A small HTTP/1.1 test client: async ([`Client`]) and blocking
//! ([`BlockingClient`]), plus one-shot raw helpers.
//!
//! [`Client`] holds one keep-alive TCP connection and a read buffer, so
//! several requests (or pipelined raw bytes) can be sent on the same
//! connection and their responses read in order. Responses are framed per
//! RFC 9112: no body for HEAD, 1xx, 204 and 304; chunked (trailers kept);
//! Content-Length; otherwise until the server closes. Every read of a
//! response is bounded by a timeout (10 s by default, see
//! [`Client::set_timeout`]) so a broken proxy fails a test instead of hanging
//! it.

use std::borrow::Cow;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::wire::{self, Conn, Framing, MAX_HEADERS, MAX_RESPONSE_HEAD};

/// Default bound on connecting and on reading one response.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`Client::is_closed_by_peer`] waits for the peer to close. Only a bound on a
/// hang (a close or data ends the wait at once), so generous: 2 s could pass on a loaded
/// two-core machine before a close that was on its way.
pub const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// A response read by the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Reason phrase (may be empty).
    pub reason: String,
    /// Minor HTTP version: 1 for HTTP/1.1, 0 for HTTP/1.0.
    pub version: u8,
    /// Header fields in received order (values as lossy UTF-8).
    pub headers: Vec<(String, String)>,
    /// The decoded body (de-chunked if it was chunked).
    pub body: Vec<u8>,
    /// Trailer fields of a chunked body, in received order.
    pub trailers: Vec<(String, String)>,
}

impl Response {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        wire::header(&self.headers, name)
    }

    /// Every value of header `name` (case-insensitive), in order.
    pub fn headers_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// First value of trailer field `name` (case-insensitive).
    pub fn trailer(&self, name: &str) -> Option<&str> {
        wire::header(&self.trailers, name)
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn body_str(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    /// True for 1xx responses.
    pub fn is_informational(&self) -> bool {
        (100..200).contains(&self.status)
    }
}

/// An async HTTP/1.1 client over one keep-alive connection.
pub struct Client {
    conn: Conn,
    timeout: Duration,
}

impl Client {
    /// Connects to `addr` (bounded by [`DEFAULT_TIMEOUT`]).
    pub async fn connect(addr: SocketAddr) -> io::Result<Client> {
        let stream = with_timeout(DEFAULT_TIMEOUT, TcpStream::connect(addr)).await?;
        Ok(Client::over(Conn::new(stream)))
    }

    pub(crate) fn over(conn: Conn) -> Client {
        Client {
            conn,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Changes the bound on reading one response (default 10 s).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The client's local address (to correlate with server-side logs).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.conn.stream.tcp().local_addr()
    }

    /// Writes `bytes` as they are.
    pub async fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.conn.write_all(bytes).await
    }

    /// Half-closes the connection (sends FIN); responses can still be read.
    pub async fn shutdown_write(&mut self) -> io::Result<()> {
        self.conn.stream.shutdown().await
    }

    /// Reads the next response. Set `head_request` when it answers a HEAD
    /// request (no body is read then). A 1xx response is returned on its own;
    /// call again for the final response. Fails with `UnexpectedEof` if the
    /// connection closes before a complete response, `InvalidData` for a
    /// malformed one and `TimedOut` after the client's timeout.
    pub async fn read_response(&mut self, head_request: bool) -> io::Result<Response> {
        let timeout = self.timeout;
        with_timeout(timeout, self.read_response_inner(head_request)).await
    }

    /// Sends `GET <path> HTTP/1.1` with `Host: <host>` and returns the final
    /// response (interim 1xx other than 101 are skipped).
    pub async fn get(&mut self, path: &str, host: &str) -> io::Result<Response> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        self.send_raw(req.as_bytes()).await?;
        self.read_final(false).await
    }

    /// Sends an HTTP/1.1 request with the given header fields and body and
    /// returns the final response (interim 1xx other than 101 are skipped;
    /// use [`send_raw`](Self::send_raw) + [`read_response`](Self::read_response)
    /// to see them). Adds `Host: test` unless a Host field is given, and
    /// `Content-Length` if the body is non-empty and neither Content-Length
    /// nor Transfer-Encoding is given (so a pre-encoded chunked body can be
    /// sent with `Transfer-Encoding: chunked`).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        let has = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
        let mut req = format!("{method} {path} HTTP/1.1\r\n");
        if !has("host") {
            req.push_str("Host: test\r\n");
        }
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        if !body.is_empty() && !has("content-length") && !has("transfer-encoding") {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.send_raw(&bytes).await?;
        self.read_final(method.eq_ignore_ascii_case("HEAD")).await
    }

    /// Waits up to [`CLOSE_WAIT`] (10 s) for the peer to close the connection:
    /// true on EOF or a reset, false if it is still open after the wait or
    /// sends data instead (the data is kept for the next read). Returns
    /// false at once if unread response bytes are already buffered. Checking
    /// that a connection stays open costs the full wait; use
    /// [`is_closed_by_peer_within`](Self::is_closed_by_peer_within) with a
    /// short duration for that.
    pub async fn is_closed_by_peer(&mut self) -> bool {
        self.is_closed_by_peer_within(CLOSE_WAIT).await
    }

    /// Like [`is_closed_by_peer`](Self::is_closed_by_peer) with a custom wait.
    pub async fn is_closed_by_peer_within(&mut self, wait: Duration) -> bool {
        if !self.conn.buf.is_empty() {
            return false;
        }
        match tokio::time::timeout(wait, self.conn.fill()).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) | Err(_) => false,
        }
    }

    async fn read_final(&mut self, head_request: bool) -> io::Result<Response> {
        loop {
            let resp = self.read_response(head_request).await?;
            if !resp.is_informational() || resp.status == 101 {
                return Ok(resp);
            }
        }
    }

    async fn read_response_inner(&mut self, head_request: bool) -> io::Result<Response> {
        let mut resp = loop {
            if !self.conn.buf.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut parsed = httparse::Response::new(&mut headers);
                match parsed.parse(&self.conn.buf) {
                    Ok(httparse::Status::Complete(n)) => {
                        let resp = Response {
                            status: parsed.code.unwrap_or_default(),
                            reason: parsed.reason.unwrap_or_default().to_string(),
                            version: parsed.version.unwrap_or(1),
                            headers: wire::owned_headers(parsed.headers),
                            body: Vec::new(),
                            trailers: Vec::new(),
                        };
                        self.conn.buf.drain(..n);
                        break resp;
                    }
                    Ok(httparse::Status::Partial) => {
                        if self.conn.buf.len() > MAX_RESPONSE_HEAD {
                            return Err(wire::invalid("response head too large"));
                        }
                    }
                    Err(_) => return Err(wire::invalid("malformed response head")),
                }
            }
            if self.conn.fill().await? == 0 {
                return Err(wire::eof(
                    "connection closed before a complete response head",
                ));
            }
        };
        let bodiless =
            head_request || resp.is_informational() || resp.status == 204 || resp.status == 304;
        let framing = if bodiless {
            Framing::Empty
        } else {
            wire::body_framing(&resp.headers, false)?
        };
        let mut body = Vec::new();
        resp.trailers = self
            .conn
            .read_body(framing, |d| body.extend_from_slice(d))
            .await?;
        resp.body = body;
        Ok(resp)
    }
}

/// Connects to `addr`, writes `bytes`, and returns everything received until
/// the server closes. A reset after some bytes arrived returns those bytes;
/// the whole exchange is bounded by 10 s (then `TimedOut`).
pub async fn send_raw_once(addr: SocketAddr, bytes: &[u8]) -> io::Result<Vec<u8>> {
    with_timeout(DEFAULT_TIMEOUT, async {
        let mut stream = TcpStream::connect(addr).await?;
        let _ = stream.set_nodelay(true);
        stream.write_all(bytes).await?;
        let mut out = Vec::new();
        let mut buf = vec![0; wire::READ_CHUNK];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return Ok(out),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset && !out.is_empty() => {
                    return Ok(out)
                }
                Err(e) => return Err(e),
            }
        }
    })
    .await
}

/// The status code of the first response in `raw`, if its status line is there.
pub fn status_of(raw: &[u8]) -> Option<u16> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(raw) {
        Ok(_) => resp.code,
        Err(httparse::Error::TooManyHeaders) => {
            // The status line itself was fine; re-parse with room to spare.
            let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
            let line = std::str::from_utf8(&raw[..line_end]).ok()?;
            line.split(' ').nth(1)?.parse().ok()
        }
        Err(_) => None,
    }
}

async fn with_timeout<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(res) => res,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("testkit: no result within {limit:?}"),
        )),
    }
}

/// A blocking wrapper around [`Client`] for plain `#[test]` functions. It
/// drives its own current-thread runtime, so it must not be used from inside
/// an async context (tokio would panic).
pub struct BlockingClient {
    // Declared before `runtime` so the socket is dropped first.
    inner: Client,
    runtime: tokio::runtime::Runtime,
}

impl BlockingClient {
    /// See [`Client::connect`].
    pub fn connect(addr: SocketAddr) -> io::Result<BlockingClient> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let inner = runtime.block_on(Client::connect(addr))?;
        Ok(BlockingClient { inner, runtime })
    }

    /// See [`Client::set_timeout`].
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.inner.set_timeout(timeout);
    }

    /// See [`Client::send_raw`].
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.runtime.block_on(self.inner.send_raw(bytes))
    }

    /// See [`Client::read_response`].
    pub fn read_response(&mut self, head_request: bool) -> io::Result<Response> {
        self.runtime
            .block_on(self.inner.read_response(head_request))
    }

    /// See [`Client::get`].
    pub fn get(&mut self, path: &str, host: &str) -> io::Result<Response> {
        self.runtime.block_on(self.inner.get(path, host))
    }

    /// See [`Client::request`].
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        self.runtime
            .block_on(self.inner.request(method, path, headers, body))
    }

    /// See [`Client::is_closed_by_peer`].
    pub fn is_closed_by_peer(&mut self) -> bool {
        self.runtime.block_on(self.inner.is_closed_by_peer())
    }

    /// See [`Client::is_closed_by_peer_within`].
    pub fn is_closed_by_peer_within(&mut self, wait: Duration) -> bool {
        self.runtime
            .block_on(self.inner.is_closed_by_peer_within(wait))
    }
}

/// Blocking [`send_raw_once`] (must not be called from an async context).
pub fn send_raw_once_blocking(addr: SocketAddr, bytes: &[u8]) -> io::Result<Vec<u8>> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(send_raw_once(addr, bytes))
}
