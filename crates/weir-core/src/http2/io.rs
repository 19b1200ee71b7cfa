//! The client connection as the `h2` crate's I/O: the bytes `client` already read (the
//! preface, often the first frames too) are read first, then the socket.
//!
//! Every byte of the connection passes here, so this is also where Weir watches what the
//! `h2` crate does not report (`frames`): glitch frames from the client and the resets
//! its errors force go to the connection's budgets, and a write that makes no progress
//! marks the connection stalled (a client that never reads; `conn` closes it after
//! `stall_timeout`). The DATA payload bytes written and the resets either way go to the
//! connection's `outbox`. Writes go through a [`Gather`], so that the frames of many streams
//! leave in one system call (`gather`).

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::conn::Shared;
use super::frames::{forced_reset, Frame, Glitches, Scanner, RST_STREAM};
use super::gather::Gather;
use super::PREFACE;
use crate::client::ClientConn;

/// A client connection whose read buffer is drained before its socket is read again.
pub struct Prefixed {
    conn: ClientConn,
    shared: Rc<Shared>,
    inbound: Scanner,
    outbound: Scanner,
    glitches: Glitches,
    gather: Gather,
}

impl Prefixed {
    pub fn new(conn: ClientConn, shared: Rc<Shared>) -> Prefixed {
        Prefixed {
            conn,
            shared,
            inbound: Scanner::new(PREFACE.len()),
            outbound: Scanner::new(0),
            glitches: Glitches::default(),
            gather: Gather::default(),
        }
    }

    /// Notes a write of `buf`: `n` bytes of it taken (the `h2` crate counts them as
    /// written, so their frames are watched), or a wait, which marks the connection stalled.
    fn wrote(&mut self, written: &Poll<io::Result<usize>>, buf: &[u8]) {
        self.progress();
        match written {
            Poll::Ready(Ok(n)) => {
                self.conn.sent += *n as u64;
                let (shared, glitches) = (&self.shared, &mut self.glitches);
                let on_frame = |f: Frame| {
                    glitches.outbound(&f);
                    if f.kind == RST_STREAM {
                        shared.outbox.reset(f.stream);
                        if forced_reset(&f) {
                            shared.reset_written(f.word);
                        }
                    }
                };
                let on_data = |stream, n| shared.outbox.wrote(stream, n);
                self.outbound.feed_data(&buf[..*n], on_frame, on_data);
            }
            Poll::Pending => self.waits(),
            Poll::Ready(Err(_)) => {}
        }
    }

    /// Ends the stall clock when the socket took bytes (a wait after that starts it
    /// again). Bytes only held back prove nothing: a client that reads nothing must not
    /// restart its stall clock with every small frame Weir has for it.
    fn progress(&mut self) {
        if self.gather.take_moved() {
            self.shared.stalled_since.set(None);
        }
    }

    fn waits(&self) {
        if self.shared.stalled_since.get().is_none() {
            self.shared.stalled_since.set(Some(Instant::now()));
            self.shared.stalled.notify_one();
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
            // The `h2` crate drops what the stream had queued (perhaps a little later:
            // it stops decoding while a PING or SETTINGS ACK waits to be written).
            if f.kind == RST_STREAM {
                shared.outbox.reset(f.stream);
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
        let written = this.gather.poll_write(&mut this.conn.stream, cx, buf);
        this.wrote(&written, buf);
        written
    }

    /// Not vectored (the default `poll_write_vectored` writes the first buffer), so that
    /// the `h2` crate copies small payloads and writes once per batch: see `gather`.
    /// Said explicitly: forwarding the socket's answer here would undo the batching.
    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = this.gather.poll_flush(&mut this.conn.stream, cx);
        this.progress();
        match &flushed {
            Poll::Pending => this.waits(),
            // Over TLS a write is Ready once the ciphertext is buffered: the stall it left
            // pending ends only when a flush goes through.
            Poll::Ready(Ok(())) => this.shared.stalled_since.set(None),
            Poll::Ready(Err(_)) => {}
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.gather.poll_shutdown(&mut this.conn.stream, cx)
    }
}
