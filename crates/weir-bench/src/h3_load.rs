//! The loads `h3-cost` drives from this process: requests kept in flight over HTTP/3
//! (quinn + h3) or over HTTP/2 on TLS (h2 + tokio-rustls) with the same shape (connections
//! x streams), and new QUIC connections, each carrying one request, for handshakes.
//!
//! Each load returns how many requests (or connections) were answered 200 in its time;
//! any other answer or error fails the run, so a figure never counts failures as work.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use weir_testkit::h3_client::{self, H3Client};

/// What one run sends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Requests on kept HTTP/3 connections.
    H3,
    /// The same requests on kept HTTP/2-over-TLS connections.
    H2,
    /// A new QUIC connection (a full handshake: no resumption) per request.
    H3Handshakes,
}

impl Load {
    pub fn label(self) -> &'static str {
        match self {
            Load::H3 => "HTTP/3",
            Load::H2 => "HTTP/2 over TLS",
            Load::H3Handshakes => "HTTP/3, a new connection per request",
        }
    }
}

/// Connections made before the proxy's CPU is read (none for handshakes: they are the
/// work being measured).
pub enum Clients {
    H3(Vec<Arc<H3Client>>),
    H2(Vec<h2::client::SendRequest<Bytes>>),
    None,
}

/// Sets up `conns` connections for `load` to `addr`.
pub async fn connect(
    load: Load,
    addr: SocketAddr,
    tls: &rustls::ClientConfig,
    conns: u32,
) -> Result<Clients> {
    let mut h3 = Vec::new();
    let mut h2 = Vec::new();
    for _ in 0..conns {
        match load {
            Load::H3 => h3.push(Arc::new(
                h3_client::connect(addr, "localhost", tls)
                    .await
                    .map_err(anyhow::Error::msg)?,
            )),
            Load::H2 => h2.push(connect_h2(addr, tls).await?),
            Load::H3Handshakes => {}
        }
    }
    Ok(match load {
        Load::H3 => Clients::H3(h3),
        Load::H2 => Clients::H2(h2),
        Load::H3Handshakes => Clients::None,
    })
}

/// An HTTP/2 connection over TLS (ALPN `h2`) to `addr` as `localhost`.
async fn connect_h2(
    addr: SocketAddr,
    tls: &rustls::ClientConfig,
) -> Result<h2::client::SendRequest<Bytes>> {
    let mut tls = tls.clone();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    let (send, conn) = h2::client::handshake(stream).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send.ready().await?)
}

/// Keeps `streams` requests in flight on each of `clients` (or, for handshakes, `conns`
/// connections being made) for `length`; the requests answered 200.
pub async fn run(
    clients: &Clients,
    addr: SocketAddr,
    tls: &rustls::ClientConfig,
    conns: u32,
    streams: u32,
    length: Duration,
) -> Result<u64> {
    let until = Instant::now() + length;
    let mut tasks = tokio::task::JoinSet::new();
    match clients {
        Clients::H3(clients) => {
            for client in clients.iter().flat_map(|c| (0..streams).map(move |_| c)) {
                tasks.spawn(h3_loop(client.clone(), until));
            }
        }
        Clients::H2(clients) => {
            for send in clients.iter().flat_map(|c| (0..streams).map(move |_| c)) {
                tasks.spawn(h2_loop(send.clone(), until));
            }
        }
        Clients::None => {
            // A full handshake each time: the cloned config would share its session store.
            let mut tls = tls.clone();
            tls.resumption = rustls::client::Resumption::disabled();
            let tls = Arc::new(tls);
            for _ in 0..conns {
                tasks.spawn(handshake_loop(addr, tls.clone(), until));
            }
        }
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done??;
    }
    Ok(total)
}

async fn h3_loop(client: Arc<H3Client>, until: Instant) -> Result<u64> {
    let mut send = client.send.clone();
    let mut n = 0;
    while Instant::now() < until {
        let r = h3_client::get(&mut send, "localhost", "/")
            .await
            .map_err(anyhow::Error::msg)?;
        expect_ok(r.status, r.body.len())?;
        n += 1;
    }
    Ok(n)
}

async fn h2_loop(mut send: h2::client::SendRequest<Bytes>, until: Instant) -> Result<u64> {
    let mut n = 0;
    while Instant::now() < until {
        let request = http::Request::get("https://localhost/").body(())?;
        send = send.ready().await?;
        let (response, _) = send.send_request(request, true)?;
        let response = response.await?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let mut len = 0;
        while let Some(data) = body.data().await {
            let data = data?;
            len += data.len();
            let _ = body.flow_control().release_capacity(data.len());
        }
        expect_ok(status, len)?;
        n += 1;
    }
    Ok(n)
}

/// New connections one after another, one GET each, closed at once.
async fn handshake_loop(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    until: Instant,
) -> Result<u64> {
    let mut n = 0;
    while Instant::now() < until {
        let mut client = h3_client::connect(addr, "localhost", &tls)
            .await
            .map_err(anyhow::Error::msg)?;
        let r = h3_client::get(&mut client.send, "localhost", "/")
            .await
            .map_err(anyhow::Error::msg)?;
        expect_ok(r.status, r.body.len())?;
        client.connection.close(0u32.into(), b"done");
        n += 1;
    }
    Ok(n)
}

/// The backend's answer: 200 with 615 bytes.
fn expect_ok(status: u16, len: usize) -> Result<()> {
    if status != 200 || len != 615 {
        bail!("{status} with {len} bytes");
    }
    Ok(())
}
