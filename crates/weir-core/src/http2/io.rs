//! The client connection as the `h2` crate's I/O: the bytes `client` already read (the
//! preface, often the first frames too) are read first, then the socket.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::client::ClientConn;

/// A client connection whose read buffer is drained before its socket is read again.
pub struct Prefixed {
    pub conn: ClientConn,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let conn = &mut self.get_mut().conn;
        if conn.buf.is_empty() {
            return Pin::new(&mut conn.stream).poll_read(cx, out);
        }
        let n = conn.buf.len().min(out.remaining());
        out.put_slice(&conn.buf.filled()[..n]);
        conn.buf.consume(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let conn = &mut self.get_mut().conn;
        let written = Pin::new(&mut conn.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            conn.sent += n as u64;
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let conn = &mut self.get_mut().conn;
        let written = Pin::new(&mut conn.stream).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            conn.sent += n as u64;
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn.stream).poll_shutdown(cx)
    }
}
