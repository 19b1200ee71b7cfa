//! The load of an instruction count: a fixed number of requests, one at a time, each sent
//! once Weir's worker is idle ([`Idle`]), so that every request is served the same way; the
//! counters are zeroed after the warm-up requests ([`Steps`]). Any error or non-2xx answer
//! fails the count: a run that served something else than asked measures something else.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;
use weir_testkit::h2_raw::{flag, frame, kind, Block, RawFrame, RawH2};

use super::idle::Idle;
use crate::handshakes::Profile;
use crate::http1_client::{exchange, request, Dial, Plain, Tls};

/// How the requests reach Weir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// HTTP/1.1 keep-alive over plain TCP.
    Http1,
    /// HTTP/1.1 keep-alive over TLS 1.3 (one session).
    Tls(Profile),
    /// HTTP/2 with prior knowledge, one stream after the other on one connection.
    H2c,
    /// A new TLS 1.3 connection per request (`Connection: close`), as `tls-handshake`.
    Handshake(Profile),
}

/// Before each request: wait until the worker is idle, and after the warm-up zero the
/// counters.
pub struct Steps<'a> {
    pub idle: &'a Idle,
    pub warmup: u64,
    pub zero: &'a dyn Fn() -> Result<()>,
    sent: u64,
}

impl<'a> Steps<'a> {
    pub fn new(idle: &'a Idle, warmup: u64, zero: &'a dyn Fn() -> Result<()>) -> Steps<'a> {
        Steps {
            idle,
            warmup,
            zero,
            sent: 0,
        }
    }

    fn before_request(&mut self) -> Result<()> {
        self.idle.wait()?;
        if self.sent == self.warmup {
            (self.zero)()?;
        }
        self.sent += 1;
        Ok(())
    }
}

/// Sends `requests` requests to `addr` (the warm-up included) as `steps` says, checks every
/// answer is a 2xx, and returns once Weir is idle again.
pub fn run(client: Client, addr: SocketAddr, steps: &mut Steps, requests: u64) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async {
        match client {
            Client::Http1 => keep_alive(Plain(addr), "127.0.0.1", steps, requests).await,
            Client::Tls(profile) => {
                let dial = Tls::new(addr, "localhost", profile)?;
                keep_alive(dial, "localhost", steps, requests).await
            }
            Client::H2c => h2c(addr, steps, requests).await,
            Client::Handshake(profile) => handshakes(addr, profile, steps, requests).await,
        }
    })?;
    steps.idle.wait()
}

/// One keep-alive connection, one request at a time; a connection Weir closes is opened
/// again.
async fn keep_alive<D: Dial>(
    dial: D,
    host: &str,
    steps: &mut Steps<'_>,
    requests: u64,
) -> Result<()> {
    let req = request("/", host);
    let mut buf = Vec::with_capacity(16 * 1024);
    let mut stream = None;
    for _ in 0..requests {
        let s = match &mut stream {
            Some(s) => s,
            None => stream.insert(dial.dial().await.context("connect")?),
        };
        steps.before_request()?;
        let (status, keep) = exchange(s, &req, &mut buf).await?;
        ensure!((200..300).contains(&status), "answered {status}");
        if !keep {
            stream = None;
        }
    }
    Ok(())
}

/// One h2c connection, one stream after the other: `GET /`, its answer read to the end of
/// the stream. The connection window is given back with the next request (in the same
/// write), so every request arrives as one read.
async fn h2c(addr: SocketAddr, steps: &mut Steps<'_>, requests: u64) -> Result<()> {
    let mut h2 = RawH2::connect(addr, &[]).await?;
    h2.tcp.set_nodelay(true)?;
    // Weir's SETTINGS come first; acknowledged before any request.
    let settings =
        |f: &RawFrame| (f.kind == kind::SETTINGS && f.flags & flag::ACK == 0).then_some(());
    h2.until(Duration::from_secs(60), settings)
        .await
        .context("no SETTINGS from Weir")?;
    h2.send_frame(kind::SETTINGS, flag::ACK, 0, &[]).await?;
    let mut consumed = 0u32;
    let mut out = Vec::new();
    for i in 0..requests {
        let stream = u32::try_from(2 * i + 1).context("too many streams for one connection")?;
        out.clear();
        if consumed > 0 {
            frame(&mut out, kind::WINDOW_UPDATE, 0, 0, &consumed.to_be_bytes());
            consumed = 0;
        }
        let headers = Block::get("/");
        frame(
            &mut out,
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            stream,
            &headers.0,
        );
        steps.before_request()?;
        h2.send(&out).await?;
        consumed += h2_answer(&mut h2, stream).await?;
    }
    Ok(())
}

/// Reads frames up to the end of `stream`; returns the DATA bytes it took from the
/// connection window. SETTINGS are acknowledged; a reset or GOAWAY fails.
async fn h2_answer(h2: &mut RawH2, stream: u32) -> Result<u32> {
    let mut data = 0u32;
    let mut status_ok = false;
    loop {
        let f = h2.read_frame().await.context("connection closed")?;
        match f.kind {
            kind::SETTINGS if f.flags & flag::ACK == 0 => {
                h2.send_frame(kind::SETTINGS, flag::ACK, 0, &[]).await?;
            }
            kind::GOAWAY | kind::RST_STREAM => bail!("stream {stream} failed: {f:?}"),
            kind::HEADERS if f.stream == stream => {
                // The response's first field: `:status` 200 is the static entry 8.
                status_ok |= f.payload.first() == Some(&0x88);
            }
            kind::DATA if f.stream == stream => data += f.payload.len() as u32,
            _ => {}
        }
        if f.stream == stream && f.flags & flag::END_STREAM != 0 {
            ensure!(status_ok, "stream {stream} was not answered 200");
            return Ok(data);
        }
    }
}

/// A new TLS connection per request: handshake (full), then the request once Weir has
/// handled the client's Finished, then the answer up to Weir's close.
async fn handshakes(
    addr: SocketAddr,
    profile: Profile,
    steps: &mut Steps<'_>,
    requests: u64,
) -> Result<()> {
    let config = crate::handshakes::client_config(13, false, profile)?;
    let connector = TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from("localhost")?;
    let req = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    for _ in 0..requests {
        steps.before_request()?;
        let tcp = crate::http1_client::connect(addr).await?;
        let mut tls = connector.connect(name.clone(), tcp).await?;
        steps.idle.wait()?;
        let status = crate::handshakes::request_to_close(&mut tls, req).await?;
        ensure!((200..300).contains(&status), "answered {status}");
    }
    Ok(())
}
