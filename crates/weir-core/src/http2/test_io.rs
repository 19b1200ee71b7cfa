//! Test helpers for the HTTP/2 request paths: a real h2 request body (over an in-memory
//! pipe) and an upstream writer that, like tokio-rustls over a full socket, keeps what it
//! is given until it is flushed.

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::RecvStream;

/// Bytes a [`Holding`] writer keeps (`held`) and has let through on a flush (`sent`).
#[derive(Clone, Default)]
pub struct Counts {
    pub held: Rc<Cell<usize>>,
    pub sent: Rc<Cell<usize>>,
}

/// Keeps what it is given until flushed, as tokio-rustls keeps the records that did not
/// fit in a full socket: only a flush sends them.
#[derive(Default)]
pub struct Holding(pub Counts);

impl tokio::io::AsyncWrite for Holding {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0.held.set(self.0.held.get() + buf.len());
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.0.sent.set(self.0.sent.get() + self.0.held.take());
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_flush(cx)
    }
}

/// The body of an h2 request whose client sends `frames` as DATA, the last with
/// END_STREAM when `end`. Both connections are driven by spawned tasks.
pub async fn request_body(frames: &[&'static [u8]], end: bool) -> RecvStream {
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let (mut client, conn) = h2::client::handshake(client_io).await.expect("client");
    tokio::spawn(conn);
    let request = http::Request::post("http://x/").body(()).expect("request");
    let (response, mut send) = client.send_request(request, false).expect("send");
    for (i, frame) in frames.iter().enumerate() {
        let last = end && i + 1 == frames.len();
        send.send_data(Bytes::from_static(frame), last)
            .expect("data");
    }
    // The client's handles live as long as its connection task: the stream stays open.
    tokio::spawn(async move {
        let _keep = (client, send);
        let _ = response.await;
    });
    let mut conn = h2::server::handshake(server_io).await.expect("server");
    let (request, respond) = conn.accept().await.expect("a stream").expect("ok");
    tokio::spawn(async move {
        let _keep = respond;
        while conn.accept().await.is_some() {}
    });
    request.into_body()
}
