//! An HTTP/3 client for the integration tests (quinn + h3, the crates Weir serves HTTP/3
//! with, used from the other side): a QUIC connection to an address under a server name,
//! and requests with bodies and trailers both ways.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use http::{HeaderMap, Request};

/// A QUIC connection, and HTTP/3's error codes (for tests that write their own streams).
pub use h3::error::Code as H3Code;
pub use quinn::Connection as QuicConnection;
/// Why a connection closed (`H3Client::connection.closed()`).
pub use quinn::ConnectionError;
/// A client's QUIC transport settings ([`quic_connect_with`]).
pub use quinn::TransportConfig;
/// Why a write to a stream failed (a raw stream of `H3Client::connection`).
pub use quinn::WriteError;

/// The request-sending handle of one HTTP/3 connection (cloneable: requests may run
/// concurrently on it).
pub type H3Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// One HTTP/3 connection.
pub struct H3Client {
    pub send: H3Sender,
    /// The QUIC connection (its stats, its close).
    pub connection: quinn::Connection,
    _endpoint: quinn::Endpoint,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for H3Client {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A response read in full.
#[derive(Debug)]
pub struct H3Response {
    /// The 1xx heads before the final one (status, fields).
    pub interims: Vec<(u16, HeaderMap)>,
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: Option<HeaderMap>,
}

impl H3Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// `tls` with ALPN `h3`, as QUIC needs it.
pub fn h3_tls(tls: &rustls::ClientConfig) -> Arc<rustls::ClientConfig> {
    let mut tls = tls.clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    Arc::new(tls)
}

/// Connects to `addr` (UDP) as `server_name` (SNI), trusting what `tls` trusts.
pub async fn connect(
    addr: SocketAddr,
    server_name: &str,
    tls: &rustls::ClientConfig,
) -> Result<H3Client, String> {
    let (endpoint, connection) = quic_connect(addr, server_name, tls).await?;
    over(connection, endpoint).await
}

/// What a client of [`connect_limited`] takes (`None`: the crates' defaults).
#[derive(Default, Clone, Copy)]
pub struct ClientLimits {
    /// Its `SETTINGS_MAX_FIELD_SECTION_SIZE`: the largest head it takes.
    pub max_field_section_size: Option<u64>,
    /// The flow-control window it gives each stream (what Weir may send ahead of its
    /// reading).
    pub stream_window: Option<u32>,
}

/// [`connect_to`] with the client's `limits`.
pub async fn connect_limited(
    ca: &crate::certs::TestCa,
    addr: SocketAddr,
    server_name: &str,
    limits: ClientLimits,
) -> H3Client {
    let mut transport = quinn::TransportConfig::default();
    if let Some(window) = limits.stream_window {
        transport.stream_receive_window(window.into());
    }
    let tls = ca.client_config();
    let connected = quic_connect_with(addr, server_name, &tls, transport).await;
    let (endpoint, connection) = connected.expect("QUIC connection");
    let h3_conn = h3_quinn::Connection::new(connection.clone());
    let mut builder = h3::client::builder();
    if let Some(max) = limits.max_field_section_size {
        builder.max_field_section_size(max);
    }
    let (driver, send) = builder.build(h3_conn).await.expect("HTTP/3 connection");
    driven(driver, send, connection, endpoint)
}

/// [`connect`] trusting `ca`; panics when it cannot (for tests).
pub async fn connect_to(
    ca: &crate::certs::TestCa,
    addr: SocketAddr,
    server_name: &str,
) -> H3Client {
    let connected = connect(addr, server_name, &ca.client_config()).await;
    connected.expect("HTTP/3 connection")
}

/// A QUIC connection with ALPN `h3` and nothing on it yet (an attacker writes its own
/// streams); keep the endpoint while the connection is used.
pub async fn quic_connect(
    addr: SocketAddr,
    server_name: &str,
    tls: &rustls::ClientConfig,
) -> Result<(quinn::Endpoint, quinn::Connection), String> {
    quic_connect_with(addr, server_name, tls, quinn::TransportConfig::default()).await
}

/// [`quic_connect`] with the client's `transport` settings (e.g. the streams it lets the
/// server open).
pub async fn quic_connect_with(
    addr: SocketAddr,
    server_name: &str,
    tls: &rustls::ClientConfig,
    transport: quinn::TransportConfig,
) -> Result<(quinn::Endpoint, quinn::Connection), String> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(h3_tls(tls))
        .map_err(|e| e.to_string())?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    let local: SocketAddr = match addr {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("address"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("address"),
    };
    let mut endpoint = quinn::Endpoint::client(local).map_err(|e| e.to_string())?;
    endpoint.set_default_client_config(config);
    let connecting = endpoint
        .connect(addr, server_name)
        .map_err(|e| e.to_string())?;
    let connection = connecting.await.map_err(|e| e.to_string())?;
    Ok((endpoint, connection))
}

/// An HTTP/3 client on the QUIC `connection` (of `endpoint`).
async fn over(
    connection: quinn::Connection,
    endpoint: quinn::Endpoint,
) -> Result<H3Client, String> {
    let h3_conn = h3_quinn::Connection::new(connection.clone());
    let (driver, send) = h3::client::new(h3_conn).await.map_err(|e| e.to_string())?;
    Ok(driven(driver, send, connection, endpoint))
}

/// The client whose connection `driver` runs in a task of its own.
fn driven(
    mut driver: h3::client::Connection<h3_quinn::Connection, Bytes>,
    send: H3Sender,
    connection: quinn::Connection,
    endpoint: quinn::Endpoint,
) -> H3Client {
    let driver = tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    H3Client {
        send,
        connection,
        _endpoint: endpoint,
        driver,
    }
}

/// A client that keeps the TLS sessions its connections get and resumes them with 0-RTT
/// (early data): its connections share one endpoint and one session store.
pub struct Resuming {
    endpoint: quinn::Endpoint,
}

impl Resuming {
    /// A client (IPv4) trusting what `tls` trusts, with early data on.
    pub fn new(tls: &rustls::ClientConfig) -> Result<Resuming, String> {
        let mut tls = (*h3_tls(tls)).clone();
        tls.enable_early_data = true;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls))
            .map_err(|e| e.to_string())?;
        let local = "127.0.0.1:0".parse().expect("address");
        let mut endpoint = quinn::Endpoint::client(local).map_err(|e| e.to_string())?;
        endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        Ok(Resuming { endpoint })
    }

    /// A connection with a full handshake (or a resumed one without early data); the
    /// session it gets is kept for the next.
    pub async fn connect(&self, addr: SocketAddr, server_name: &str) -> Result<H3Client, String> {
        let connecting = self.endpoint.connect(addr, server_name);
        let connection = connecting.map_err(|e| e.to_string())?.await;
        over(
            connection.map_err(|e| e.to_string())?,
            self.endpoint.clone(),
        )
        .await
    }

    /// A connection whose first requests go in 0-RTT, before its handshake completes.
    /// `Err` when the client has no session that allows early data.
    pub async fn connect_early(
        &self,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<H3Client, String> {
        let connecting = self.endpoint.connect(addr, server_name);
        let early = connecting.map_err(|e| e.to_string())?.into_0rtt();
        let (connection, _accepted) = early.map_err(|_| "no session for 0-RTT".to_string())?;
        over(connection, self.endpoint.clone()).await
    }
}

/// Starts a handshake with Weir at `addr` that never goes on, as from a spoofed source
/// address: a QUIC client's first Initial datagram (to `server_name`) is sent to `addr`
/// from a socket that reads nothing back. Returns that socket (the handshake's address;
/// keep it to keep the address taken).
pub async fn stalled_initial(
    addr: SocketAddr,
    server_name: &str,
    tls: &rustls::ClientConfig,
) -> Result<tokio::net::UdpSocket, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .map_err(|e| err(&e))?;
    let crypto =
        quinn::crypto::rustls::QuicClientConfig::try_from(h3_tls(tls)).map_err(|e| err(&e))?;
    let mut endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().expect("address")).map_err(|e| err(&e))?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    // The client's Initial goes to the silent socket, which passes its first datagram on.
    let local = silent.local_addr().map_err(|e| err(&e))?;
    let connecting = endpoint.connect(local, server_name).map_err(|e| err(&e))?;
    let mut datagram = vec![0; 65536];
    let wait = std::time::Duration::from_secs(10);
    let received = tokio::time::timeout(wait, silent.recv_from(&mut datagram)).await;
    let (n, _) = received.map_err(|e| err(&e))?.map_err(|e| err(&e))?;
    silent
        .send_to(&datagram[..n], addr)
        .await
        .map_err(|e| err(&e))?;
    drop(connecting);
    Ok(silent)
}

/// Sends `request` with `body` (none when empty) and `trailers`, and reads the response
/// in full.
pub async fn request(
    send: &mut H3Sender,
    request: Request<()>,
    body: &[u8],
    trailers: Option<HeaderMap>,
) -> Result<H3Response, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut stream = send.send_request(request).await.map_err(|e| err(&e))?;
    // Sent in pieces: a large body crosses several QUIC frames and window updates.
    for piece in body.chunks(64 * 1024) {
        let piece = Bytes::copy_from_slice(piece);
        stream.send_data(piece).await.map_err(|e| err(&e))?;
    }
    if let Some(trailers) = trailers {
        stream.send_trailers(trailers).await.map_err(|e| err(&e))?;
    }
    // The stream ends after the trailers too (RFC 9114 4.1): h3 does not end it there.
    stream.finish().await.map_err(|e| err(&e))?;
    let mut interims = Vec::new();
    let response = loop {
        let head = stream.recv_response().await.map_err(|e| err(&e))?;
        if !head.status().is_informational() {
            break head;
        }
        interims.push((head.status().as_u16(), head.headers().clone()));
    };
    let mut out = Vec::new();
    while let Some(mut data) = stream.recv_data().await.map_err(|e| err(&e))? {
        while data.has_remaining() {
            let chunk = data.chunk();
            out.extend_from_slice(chunk);
            let n = chunk.len();
            data.advance(n);
        }
    }
    let trailers = stream.recv_trailers().await.map_err(|e| err(&e))?;
    Ok(H3Response {
        interims,
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: out,
        trailers,
    })
}

/// A GET of `https://{authority}{path}`.
pub async fn get(send: &mut H3Sender, authority: &str, path: &str) -> Result<H3Response, String> {
    let req = Request::get(format!("https://{authority}{path}"))
        .body(())
        .map_err(|e| e.to_string())?;
    request(send, req, &[], None).await
}
