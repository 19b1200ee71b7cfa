//! The client connection as the `h2` crate's I/O: the bytes `client` already read (the
//! preface, often the first frames too) are read first, then the socket.
//!
//! Every byte of the connection passes here, so this is also where Weir watches what the
//! `h2` crate does not report (`frames`): glitch frames from the client and the resets
//! its errors force go to the connection's budgets, and a write that makes no progress
//! marks the connection stalled (a client that never reads; `conn` closes it after
//! `stall_timeout`).

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::conn::Shared;
use super::frames::{forced_reset, Glitches, Scanner};
use super::PREFACE;
use crate::client::ClientConn;

/// A client connection whose read buffer is drained before its socket is read again.
pub struct Prefixed {
    conn: ClientConn,
    shared: Rc<Shared>,
    inbound: Scanner,
    outbound: Scanner,
    glitches: Glitches,
}

impl Prefixed {
    pub fn new(conn: ClientConn, shared: Rc<Shared>) -> Prefixed {
        Prefixed {
            conn,
            shared,
            inbound: Scanner::new(PREFACE.len()),
            outbound: Scanner::new(0),
            glitches: Glitches::default(),
        }
    }

    /// Notes `n` bytes (or none) written from `bufs`, or a write that must wait.
    fn wrote<'b>(
        &mut self,
        written: &Poll<io::Result<usize>>,
        bufs: impl IntoIterator<Item = &'b [u8]>,
    ) {
        match written {
            Poll::Ready(Ok(n)) => {
                self.conn.sent += *n as u64;
                self.shared.stalled_since.set(None);
                let (mut left, shared, glitches) = (*n, &self.shared, &mut self.glitches);
                for buf in bufs {
                    if left == 0 {
                        break;
                    }
                    let part = &buf[..left.min(buf.len())];
                    left -= part.len();
                    self.outbound.feed(part, |f| {
                        glitches.outbound(&f);
                        if forced_reset(&f) {
                            shared.reset_written(f.word);
                        }
                    });
                }
            }
            Poll::Pending if self.shared.stalled_since.get().is_none() => {
                self.shared.stalled_since.set(Some(Instant::now()));
                self.shared.stalled.notify_one();
            }
            _ => {}
        }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = out.filled().len();
        let conn = &mut this.conn;
        let read = if conn.buf.is_empty() {
            Pin::new(&mut conn.stream).poll_read(cx, out)
        } else {
            let n = conn.buf.len().min(out.remaining());
            out.put_slice(&conn.buf.filled()[..n]);
            conn.buf.consume(n);
            Poll::Ready(Ok(()))
        };
        let (shared, glitches) = (&this.shared, &mut this.glitches);
        this.inbound.feed(&out.filled()[before..], |f| {
            if glitches.inbound(&f) {
                shared.glitch();
            }
        });
        read
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.conn.stream).poll_write(cx, buf);
        this.wrote(&written, [buf]);
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.conn.stream).poll_write_vectored(cx, bufs);
        this.wrote(&written, bufs.iter().map(|b| &**b));
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.conn.stream).poll_flush(cx);
        match &flushed {
            Poll::Pending => this.wrote(&Poll::Pending, []),
            // Over TLS a write is Ready once the ciphertext is buffered: the stall it left
            // pending ends only when a flush goes through.
            Poll::Ready(Ok(())) => this.shared.stalled_since.set(None),
            Poll::Ready(Err(_)) => {}
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn.stream).poll_shutdown(cx)
    }
}
